// Which kernel runs a convolution (internal): the Conv op (src/ops/conv.cpp) says what it
// computes; these choose, per layer and once, what runs it on its device. On the CPU: oneDNN's
// convolution with the weight reordered once, lopper's direct, grouped and Winograd kernels,
// oneDNN's GEMM for 1x1 layers and lopper's sparse kernels for a sparse weight, timed on the
// layer's real input (exec/kernel_choice.h); on a GPU, cuDNN in three forms.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <optional>
#include <vector>

#include "exec/onednn.h"
#include "ops/conv_geometry.h"
#include "ops/op.h"

namespace lopper::ops {

/// A 2-D convolution as its op read it: `x` the input, `in` the same padded when the pads are
/// asymmetric (`padding` then zero), the weight, the bias and the residual (undefined when
/// absent), and the activation to fuse.
struct Conv2dLayer {
  const at::Tensor& x;
  const at::Tensor& in;
  const at::Tensor& w;
  const at::Tensor& b;
  const at::Tensor& other;
  const std::vector<int64_t>& padding;
  const ConvGeometry& g;
  const onednn::PostOp& post;
};

/// The layer's output by the kernel chosen for it (timed at its first run, then kept): for a 4-D
/// input with a constant weight (and bias) and prepacking on, on the CPU where oneDNN takes the
/// types and on a GPU; nothing otherwise (the op runs ATen's convolution).
std::optional<at::Tensor> conv2d_by_kernel(OpContext& c, const Conv2dLayer& l);

/// ai.lopper.ConvChain's output: on the CPU in float32, lopper's one pass over the rows or the
/// body layer by layer (`layers`), whichever was faster on the first input; elsewhere `layers`.
at::Tensor conv_chain_by_kernel(OpContext& c, const ir::Graph& body,
                                const std::function<at::Tensor()>& layers);

}  // namespace lopper::ops
