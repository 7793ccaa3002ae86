// Own CPU pooling kernels (internal).
#pragma once

#include <ATen/core/Tensor.h>

#include "kernels/cpu/sparse.h"

namespace lopper::kernels::cpu {

/// 2-D max pooling of a float32 or bfloat16 channels-last [N, C, H, W] tensor into `out_size`
/// pixels: window (oy, ox) starts at (oy * stride - pad_begin, ...); taps outside the input are
/// skipped (padding never wins, and any padding, symmetric or not, or a ceil-mode overhang is
/// taken). The result is channels-last too. NaN propagates as in ONNX's reference. NOTE: ATen's CPU
/// max_pool2d always computes the argmax indices as well, which costs it 4-5x on the large early
/// layers of CNNs; inference needs only the values.
/// `isa`: the kernels' instruction set (tests run every one the CPU has).
at::Tensor max_pool2d_nhwc(const at::Tensor& x, at::IntArrayRef kernel, at::IntArrayRef stride,
                           at::IntArrayRef pad_begin, at::IntArrayRef dilation,
                           at::IntArrayRef out_size, Isa isa = active_isa());

/// The per-channel mean over the pixels of a float32 or bfloat16 channels-last [N, C, H, W] CPU
/// tensor, [N, C, 1, 1], in one pass with the channels innermost (ATen's mean over H and W of this
/// layout took 10x ONNX Runtime's time on ResNet's last 7x7 map). Each image row is summed in
/// float, the rows in double; a bfloat16 mean is rounded once, at the end.
at::Tensor mean_over_pixels_nhwc(const at::Tensor& x);

}  // namespace lopper::kernels::cpu
