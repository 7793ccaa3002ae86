// Row-wise CPU kernels (internal): softmax along the last axis, with a scale folded in (the
// attention scores' 1/sqrt(d), which exporters write as Muls on Q and K or on the product).
#pragma once

#include <ATen/core/Tensor.h>

#include "kernels/cpu/sparse.h"

namespace lopper::kernels::cpu {

/// softmax(scale * x) along x's last axis for a float32 CPU tensor x (any rank >= 1); the rows are
/// split between ATen's threads. Computed in float32 with lopper's vector exp (relative error below
/// 2e-7); see rows_impl.h for NaN and -inf.
at::Tensor softmax_last_axis(const at::Tensor& x, float scale, Isa isa = active_isa());

}  // namespace lopper::kernels::cpu
