#include "kernels/cpu/rows.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cpu/bf16.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/rows_isa.h"
#include "kernels/cpu/sparse.h"
#include "lopper/error.h"

namespace lopper::kernels::cpu {
namespace {
const RowsIsaOps& rows_ops(Isa isa) {
  return for_isa(isa, kRowsAvx512Ops, kRowsAvx2Ops, kRowsScalarOps);
}

// f(row) on each of `rows` bf16 rows of n values: the row widened into the thread's scratch
// (in L1), run there in float32 and rounded once into y.
template <class F>
void for_each_bf16_row(const at::Tensor& x, at::Tensor& y, int64_t rows, int64_t n, int64_t grain,
                       F&& f) {
  const auto* xp = reinterpret_cast<const uint16_t*>(x.data_ptr());
  auto* yp = reinterpret_cast<uint16_t*>(y.data_ptr());
  at::parallel_for(0, rows, grain, [&](int64_t r0, int64_t r1) {
    float* row = thread_scratch(0, size_t(n));
    for (int64_t r = r0; r < r1; ++r) {
      widen_span(xp + r * n, row, n);
      f(row);
      narrow_span(row, yp + r * n, n);
    }
  });
}
}  // namespace

at::Tensor softmax_last_axis(const at::Tensor& x_in, float scale, Isa isa) {
  const at::ScalarType type = x_in.scalar_type();
  LOPPER_CHECK(
      x_in.dim() >= 1 && (type == at::kFloat || type == at::kBFloat16) && x_in.device().is_cpu(),
      "[kernels] softmax wants a float32 or bfloat16 CPU tensor, got ", type, " ", x_in.sizes(),
      " on ", x_in.device());
  const at::Tensor x = x_in.contiguous();
  at::Tensor y = at::empty_like(x);
  const int64_t n = x.dim() == 0 ? 1 : x.size(-1);
  if (x.numel() == 0 || n == 0) return y;
  const int64_t rows = x.numel() / n;
  const RowsIsaOps& ops = rows_ops(isa);
  // About 16K values a piece of work: small tensors stay on one thread.
  const int64_t grain = std::max<int64_t>(1, (16 << 10) / n);
  if (type == at::kFloat) {
    const float* xp = x.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    at::parallel_for(0, rows, grain,
                     [&](int64_t r0, int64_t r1) { ops.softmax(xp, yp, r0, r1, n, scale); });
    return y;
  }
  // A bf16 row softmaxed in float32, rounded once into y.
  for_each_bf16_row(x, y, rows, n, grain,
                    [&](float* row) { ops.softmax(row, row, 0, 1, n, scale); });
  return y;
}

void softmax_rows(float* s, int64_t rows, int64_t n, float scale, uint16_t* bf16, Isa isa) {
  if (rows <= 0 || n <= 0) return;
  const RowsIsaOps& ops = rows_ops(isa);
  const int64_t grain = std::max<int64_t>(1, (16 << 10) / n);  // as softmax_last_axis
  at::parallel_for(0, rows, grain, [&](int64_t r0, int64_t r1) {
    if (!bf16) return ops.softmax(s, s, r0, r1, n, scale);
    for (int64_t r = r0; r < r1; ++r) {  // each row rounded while it is in L1
      ops.softmax(s, s, r, r + 1, n, scale);
      narrow_span(s + r * n, bf16 + r * n, n);
    }
  });
}

// A layer norm's checks of x, its scale and its bias; the scale and bias as float32 (a bf16
// model's widened exactly).
std::pair<at::Tensor, at::Tensor> checked_norm_params(const at::Tensor& x, const at::Tensor& gamma,
                                                      const at::Tensor& beta) {
  const at::ScalarType type = x.scalar_type();
  LOPPER_CHECK(x.dim() >= 1 && (type == at::kFloat || type == at::kBFloat16) &&
                   x.device().is_cpu() && x.is_contiguous(),
               "[kernels] layer norm wants a contiguous float32 or bfloat16 CPU tensor, got ", type,
               " ", x.sizes());
  const int64_t n = x.size(-1);
  LOPPER_CHECK(gamma.dim() == 1 && gamma.size(0) == n &&
                   (!beta.defined() || (beta.dim() == 1 && beta.size(0) == n)),
               "[kernels] layer norm's scale and bias must be [", n, "]");
  return {gamma.to(at::kFloat).contiguous(),
          beta.defined() ? beta.to(at::kFloat).contiguous() : at::Tensor()};
}

at::Tensor layer_norm_last_axis(const at::Tensor& x, const at::Tensor& gamma,
                                const at::Tensor& beta, float eps, Isa isa) {
  const at::ScalarType type = x.scalar_type();
  const auto [g, b] = checked_norm_params(x, gamma, beta);
  const int64_t n = x.size(-1);
  at::Tensor y = at::empty_like(x);
  if (x.numel() == 0 || n == 0) return y;
  const float* gp = g.data_ptr<float>();
  const float* bp = b.defined() ? b.data_ptr<float>() : nullptr;
  const RowsIsaOps& ops = rows_ops(isa);
  const int64_t rows = x.numel() / n;
  const int64_t grain = std::max<int64_t>(1, (16 << 10) / n);  // about 16K values a piece
  if (type == at::kFloat) {
    const float* xp = x.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    at::parallel_for(0, rows, grain, [&](int64_t r0, int64_t r1) {
      ops.layer_norm(xp, yp, r0, r1, n, gp, bp, eps);
    });
    return y;
  }
  // NOTE: a bf16 row normalised in float32: the arithmetic as in float32, one rounding.
  for_each_bf16_row(x, y, rows, n, grain,
                    [&](float* row) { ops.layer_norm(row, row, 0, 1, n, gp, bp, eps); });
  return y;
}

at::Tensor add_layer_norm_last_axis(const at::Tensor& x, const at::Tensor& r,
                                    const at::Tensor& gamma, const at::Tensor& beta, float eps,
                                    at::Tensor* sum, Isa isa) {
  const at::ScalarType type = x.scalar_type();
  LOPPER_CHECK(
      r.sizes() == x.sizes() && r.scalar_type() == type && r.device().is_cpu() && r.is_contiguous(),
      "[kernels] the residual of a layer norm must be a contiguous CPU tensor of x's "
      "shape and type, got ",
      r.scalar_type(), " ", r.sizes(), " for ", type, " ", x.sizes());
  const auto [g, b] = checked_norm_params(x, gamma, beta);
  const int64_t n = x.size(-1);
  at::Tensor y = at::empty_like(x);
  if (sum) *sum = at::empty_like(x);
  if (x.numel() == 0 || n == 0) return y;
  const float* gp = g.data_ptr<float>();
  const float* bp = b.defined() ? b.data_ptr<float>() : nullptr;
  const RowsIsaOps& ops = rows_ops(isa);
  const int64_t rows = x.numel() / n;
  const int64_t grain = std::max<int64_t>(1, (16 << 10) / n);  // as layer_norm_last_axis
  const bool bf16 = type == at::kBFloat16;
  const void *xp = x.data_ptr(), *rp = r.data_ptr();
  void* yp = y.data_ptr();
  void* sp = sum ? sum->data_ptr() : nullptr;
  at::parallel_for(0, rows, grain, [&](int64_t r0, int64_t r1) {
    ops.add_layer_norm(xp, rp, yp, sp, r0, r1, n, gp, bp, eps, bf16, thread_scratch(0, size_t(n)));
  });
  return y;
}

at::Tensor scaled_attention(const at::Tensor& q, const at::Tensor& kt, const at::Tensor& v,
                            float scale, Isa isa) {
  const at::ScalarType type = q.scalar_type();
  for (const at::Tensor* t : {&q, &kt, &v})
    LOPPER_CHECK(t->dim() == 3 && (type == at::kFloat || type == at::kBFloat16) &&
                     t->scalar_type() == type && t->device().is_cpu() && t->numel() > 0,
                 "[kernels] attention wants non-empty float32 or bfloat16 CPU [b, rows, cols] "
                 "tensors of one type, got ",
                 t->scalar_type(), " ", t->sizes(), " on ", t->device());
  const int64_t b = q.size(0), sq = q.size(1), sk = kt.size(2), dv = v.size(2);
  LOPPER_CHECK(kt.size(0) == b && v.size(0) == b && kt.size(1) == q.size(2) && v.size(1) == sk,
               "[kernels] attention of q ", q.sizes(), ", kt ", kt.sizes(), " and v ", v.sizes());
  // NOTE: y is written as [sq, b, dv], the heads of a query row side by side: what the Transpose
  // and Reshape after an attention read (MultiheadAttention's, transformers', torchvision's
  // exports), which then copy nothing (the copy took 55 us of each BERT layer).
  const RowsIsaOps& ops = rows_ops(isa);
  // bf16 on the CPU's bfloat16 dot product where it has one (AVX512_BF16), y rounded as it is
  // stored; else widened, y in float32 rounded after.
  const bool dot = type == at::kBFloat16 && ops.attention_dot != nullptr && bf16_dot_supported(isa);
  at::Tensor y = at::empty({sq, b, dv}, q.options().dtype(dot ? at::kBFloat16 : at::kFloat))
                     .permute({1, 0, 2});
  AttnView a;
  a.q = q.data_ptr(), a.kt = kt.data_ptr(), a.v = v.data_ptr();
  if (dot)
    a.y16 = reinterpret_cast<uint16_t*>(y.data_ptr());
  else
    a.y = y.data_ptr<float>();
  a.bf16 = type == at::kBFloat16;
  a.sq = sq, a.sk = sk, a.d = q.size(2), a.dv = dv, a.scale = scale;
  a.q_hs = q.stride(0), a.q_rs = q.stride(1), a.q_cs = q.stride(2);
  a.kt_hs = kt.stride(0), a.kt_rs = kt.stride(1), a.kt_cs = kt.stride(2);
  a.v_hs = v.stride(0), a.v_rs = v.stride(1), a.v_cs = v.stride(2);
  a.y_hs = y.stride(0), a.y_rs = y.stride(1);
  // A block's scores: 128 KB at most; the threads take (head, block) items.
  const int64_t rows = std::clamp<int64_t>((32 << 10) / attn_round(sk), 1, sq);
  const int64_t blocks = (sq + rows - 1) / rows;
  const auto block = dot ? ops.attention_dot : ops.attention;
  const size_t need = size_t(attention_scratch(a, rows));
  parallel_steal(b * blocks, 1, [&](int64_t t0, int64_t t1) {
    float* scratch = thread_scratch(0, need);
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t i = t / blocks, r0 = t % blocks * rows;
      block(a, i, r0, std::min(rows, sq - r0), scratch);
    }
  });
  return a.bf16 && !dot ? narrow_to_bf16(y) : y;
}

at::Tensor few_rows_product(const at::Tensor& a_in, const at::Tensor& b, Isa isa) {
  const at::ScalarType type = a_in.scalar_type();
  for (const at::Tensor* t : {&a_in, &b})
    LOPPER_CHECK(t->dim() == 3 && (type == at::kFloat || type == at::kBFloat16) &&
                     t->scalar_type() == type && t->device().is_cpu() && t->numel() > 0,
                 "[kernels] few-rows product wants non-empty float32 or bfloat16 CPU [h, rows, "
                 "cols] tensors of one type, got ",
                 t->scalar_type(), " ", t->sizes(), " on ", t->device());
  LOPPER_CHECK(
      b.size(0) == a_in.size(0) && b.size(1) == a_in.size(2) && a_in.size(1) <= kFewRowsProduct,
      "[kernels] few-rows product of a ", a_in.sizes(), " and b ", b.sizes(), " (at most ",
      kFewRowsProduct, " rows of a)");
  const at::Tensor& a = a_in;
  const int64_t h = a.size(0), m = a.size(1), n = b.size(2);
  at::Tensor y = at::empty({h, m, n}, a.options().dtype(at::kFloat));
  AttnView v;
  v.q = a.data_ptr(), v.kt = b.data_ptr(), v.y = y.data_ptr<float>();
  v.bf16 = type == at::kBFloat16;
  v.sq = m, v.d = a.size(2), v.sk = n;
  v.q_hs = a.stride(0), v.q_rs = a.stride(1), v.q_cs = a.stride(2);
  v.kt_hs = b.stride(0), v.kt_rs = b.stride(1), v.kt_cs = b.stride(2);
  v.y_hs = y.stride(0), v.y_rs = y.stride(1);
  const RowsIsaOps& ops = rows_ops(isa);
  const size_t need = size_t(product_scratch(v));
  // NOTE: a decoded token's products are a few microseconds a head: a second thread only for
  // heads of 256K multiply-adds or more between them.
  const int64_t grain = std::max<int64_t>(1, (256 << 10) / std::max<int64_t>(1, m * v.d * n));
  at::parallel_for(0, h, grain, [&](int64_t h0, int64_t h1) {
    float* scratch = thread_scratch(0, need);
    for (int64_t i = h0; i < h1; ++i) ops.product(v, i, scratch);
  });
  return v.bf16 ? narrow_to_bf16(y) : y;
}

}  // namespace lopper::kernels::cpu
