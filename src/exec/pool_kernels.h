// Which kernel runs a pooling layer (internal): the pooling ops (src/ops/pool.cpp, reduce.cpp)
// say what they compute; where one of lopper's kernels takes the layer, it runs here: the
// channels-last float32 MaxPool and global average of CPU inference, and MaxPool on a GPU.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "ops/op.h"

namespace lopper::ops {

/// A 2-D max-pooling window as ONNX gives it (the padding explicit, the output's size).
struct MaxPool2dWindow {
  const std::vector<int64_t>& kernel;
  const std::vector<int64_t>& strides;
  const std::vector<int64_t>& pad_begin;
  const std::vector<int64_t>& dilations;
  const std::vector<int64_t>& out;
};

/// The max pool of the 4-D `x` by a kernel of lopper's own where one takes it (no indices asked
/// for): channels-last float32 on the CPU for inference, NCHW or NHWC fp32/fp16/bf16 on a GPU
/// outside autograd; nothing otherwise (the op runs ATen's).
std::optional<at::Tensor> max_pool2d_by_kernel(OpContext& c, const at::Tensor& x,
                                               const MaxPool2dWindow& w);

/// The mean over the pixels of the 4-D `x` ([N, C, 1, 1]) by lopper's kernel where it takes it
/// (channels-last float32 on the CPU, inference); nothing otherwise.
std::optional<at::Tensor> mean_over_pixels_by_kernel(OpContext& c, const at::Tensor& x);

}  // namespace lopper::ops
