// Row-wise CPU kernels (internal): softmax along the last axis, with a scale folded in (the
// attention scores' 1/sqrt(d), which exporters write as Muls on Q and K or on the product).
#pragma once

#include <ATen/core/Tensor.h>

#include "kernels/cpu/sparse.h"

namespace lopper::kernels::cpu {

/// softmax(scale * x) along x's last axis for a float32 or bfloat16 CPU tensor x (any rank >= 1);
/// the rows are split between ATen's threads. Computed in float32 with lopper's vector exp
/// (relative error below 2e-7), a bf16 row widened and its result rounded once; see rows_impl.h
/// for NaN and -inf.
at::Tensor softmax_last_axis(const at::Tensor& x, float scale, Isa isa = active_isa());

/// s[r] = softmax(scale * s[r]) in place for `rows` contiguous float32 rows of n values, as
/// softmax_last_axis computes it; where `bf16` is given, each result row is also rounded once
/// into bf16's rows there (an attention's probabilities for a bf16 product). The rows are split
/// between ATen's threads.
void softmax_rows(float* s, int64_t rows, int64_t n, float scale, uint16_t* bf16,
                  Isa isa = active_isa());

/// Layer norm along x's last axis, y = (x - mean) / sqrt(var + eps) * gamma + beta, for a
/// contiguous float32 or bfloat16 CPU tensor x (rank >= 1, last axis n) and gamma, beta [n] of x's
/// type (beta may be undefined): y of x's type, computed in float32 (bf16 rows widened on the way
/// in, the result rounded once, as ATen's mixed kernel), the rows split between ATen's threads.
at::Tensor layer_norm_last_axis(const at::Tensor& x, const at::Tensor& gamma,
                                const at::Tensor& beta, float eps, Isa isa = active_isa());

/// layer_norm_last_axis of x + r, for r of x's shape and type, contiguous (a transformer's
/// residual and the norm after it in one pass over each row): the sum rounded to x's type first,
/// as the Add it replaces rounds it, and written to `*sum` (a new tensor like x) where `sum` is
/// given.
at::Tensor add_layer_norm_last_axis(const at::Tensor& x, const at::Tensor& r,
                                    const at::Tensor& gamma, const at::Tensor& beta, float eps,
                                    at::Tensor* sum, Isa isa = active_isa());

/// Attention, y[i] = softmax(scale * q[i] kt[i]) v[i] for each i of q [b, sq, d], kt [b, d, sk] and
/// v [b, sk, dv] (CPU, none empty, all float32 or all bfloat16; rows and columns may be strided, as
/// the head views of a fused QKV projection are): y [b, sq, dv] of their type, laid out as [sq, b,
/// dv] (a view whose heads of one query row are side by side, as attention layers read it next).
/// The threads split the heads and blocks of query rows; per block the head's keys and values are
/// packed once as float32 (bfloat16 widened exactly), and the block's scores (128 KB at most) stay
/// in the caches from the product through the softmax to the product with v, in float32.
/// bfloat16's output is rounded once.
at::Tensor scaled_attention(const at::Tensor& q, const at::Tensor& kt, const at::Tensor& v,
                            float scale, Isa isa = active_isa());

/// The most rows of `a` few_rows_product takes.
inline constexpr int64_t kFewRowsProduct = 16;
/// y[i] = a[i] b[i] for a [h, m, k] and b [h, k, n] (CPU, none empty, both float32 or both
/// bfloat16, rows and columns at any strides; m at most kFewRowsProduct): y [h, m, n] of their
/// type, sums in float32 (bf16 widened exactly, the result rounded once). For a decoded token's
/// attention products (a few query rows a key/value head): each head's b packed once as float32,
/// the product run on lopper's own tile kernel from L1/L2; the heads split between the threads
/// where there is work enough for two.
at::Tensor few_rows_product(const at::Tensor& a, const at::Tensor& b, Isa isa = active_isa());

}  // namespace lopper::kernels::cpu
