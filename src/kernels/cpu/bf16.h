// bfloat16 <-> float32 on the CPU (internal): the element conversions (bf16_bits.h), and
// whole-tensor ones for a bf16 layer that runs a float32 kernel of lopper's own.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "kernels/cpu/bf16_bits.h"

namespace lopper::kernels::cpu {

/// y[i] = from_bf16(x[i]) / y[i] = to_bf16(x[i]) for i < n: the row conversions of kernels that
/// read and write bfloat16 tensors and compute in float32 (vectorised per ISA).
void widen_span(const uint16_t* x, float* y, int64_t n);
void narrow_span(const float* x, uint16_t* y, int64_t n);

/// x (bfloat16, CPU) as float32 in the same layout (channels-last stays channels-last); any other
/// tensor as it is. One pass at memory speed over a dense tensor (ATen's conversion took 10-20 us
/// on a 14x14x576 map, as long as the depthwise convolution it fed).
at::Tensor widen_bf16(const at::Tensor& x);
/// y (float32, CPU) rounded to bfloat16 in the same layout.
at::Tensor narrow_to_bf16(const at::Tensor& y);

/// x [n, c, h, w] (float32 or bfloat16, CPU, contiguous) in channels-last layout where c is at
/// most kFewChannels (an image's planes: a first layer's input); undefined otherwise (the caller
/// copies as it would). A bf16 3x224x224 image: 14 us, ATen's strided copy 37 (AMD EPYC Zen 4, 2
/// threads, BM_FewChannelsLast).
at::Tensor few_channels_last(const at::Tensor& x);
constexpr int64_t kFewChannels = 4;

/// In place on a dense bfloat16 CPU tensor, NaN kept (as ATen's ops): y = max(y, 0) on the bits
/// (a negative number becomes +0), and y = min(max(y, lo), hi) computed in float32 and rounded
/// as ATen's clamp. 2.5-3x faster than ATen's bf16 relu_, which widens and rounds every element
/// (116 us on a 56x56x256 map, AMD EPYC Zen 4). Returns false, touching nothing, for a tensor
/// that is not that (the caller runs ATen's op).
bool relu_bf16_(const at::Tensor& y);
bool clamp_bf16_(const at::Tensor& y, float lo, float hi);

}  // namespace lopper::kernels::cpu
