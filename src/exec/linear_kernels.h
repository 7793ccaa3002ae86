// Which kernel runs a linear layer (internal): Gemm, MatMul and FusedMatMul (src/ops/gemm.cpp) say
// what they compute; a product by a constant weight runs on the kernel chosen here, per layer and
// once, on its real input (exec/kernel_choice.h). On the CPU: ATen's BLAS, oneDNN with the weight
// reordered, lopper's dense GEMV for a few rows and its dense kernel (the 1x1 convolution's) for
// more, and its sparse kernels for a sparse weight, chosen apart for a few rows (a decoded token)
// and for more; on a GPU: cuBLAS, the 2:4 sparse tensor cores, and lopper's sparse kernel for a
// skinny batch.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>

#include "exec/onednn.h"
#include "ops/op.h"

namespace lopper::ops {

/// y = activation(x @ w^T + bias) for x of rank >= 2 (inference): `weight` gives the layer's
/// [N, K] weight, contiguous, at its first run (kept with the node's state).
at::Tensor linear_by_kernel(OpContext& c, const at::Tensor& x,
                            const std::function<at::Tensor()>& weight, const at::Tensor& bias,
                            const onednn::PostOp& post = {});

}  // namespace lopper::ops
