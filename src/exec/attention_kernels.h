// Which kernel runs an unmasked attention (internal): ai.lopper.ScaledAttention (src/ops/
// attention.cpp) says what it computes; on the CPU it runs lopper's one-pass kernel
// (kernels/cpu/rows.h) or oneDNN's matrix-product primitives with lopper's softmax between
// (dnnl/primitives.h: AMX tiles where the CPU has them), chosen per layer on its real input
// (exec/kernel_choice.h).
#pragma once

#include <ATen/core/Tensor.h>

#include "ops/op.h"

namespace lopper::ops {

/// y[i] = softmax(scale * q[i] kt[i]) v[i] for q [b, sq, d], kt [b, d, sk], v [b, sk, dv]:
/// non-empty CPU tensors, all float32 or all bfloat16, at any strides (inference). y [b, sq, dv] of
/// their type, laid out as [sq, b, dv] (kernels::cpu::scaled_attention's layout).
at::Tensor attention_by_kernel(OpContext& c, const at::Tensor& q, const at::Tensor& kt,
                               const at::Tensor& v, float scale);

}  // namespace lopper::ops
