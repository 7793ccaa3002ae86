// lopper's own CUDA pooling, ATen-facing (internal): the argument checks are here, the kernel in
// pool.cu.
#pragma once

#include <ATen/core/Tensor.h>

namespace lopper::kernels::cuda {

/// True when max_pool2d takes x: a 4-D fp32/fp16/bf16 CUDA tensor, NCHW- or NHWC-contiguous,
/// and lopper was built with nvcc.
bool max_pool2d_fits(const at::Tensor& x);

/// 2-D max pooling of x into `out_size` pixels, values only: window (oy, ox) starts at
/// (oy * stride - pad_begin, ...); taps outside x are skipped, so any padding, symmetric or not,
/// and a ceil-mode overhang are taken as they are. The result has x's memory format.
at::Tensor max_pool2d(const at::Tensor& x, at::IntArrayRef kernel, at::IntArrayRef stride,
                      at::IntArrayRef pad_begin, at::IntArrayRef dilation,
                      at::IntArrayRef out_size);

}  // namespace lopper::kernels::cuda
