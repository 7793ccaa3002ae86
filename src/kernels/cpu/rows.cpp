#include "kernels/cpu/rows.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>

#include "kernels/cpu/parallel.h"
#include "kernels/cpu/rows_isa.h"
#include "lopper/error.h"

namespace lopper::kernels::cpu {
namespace {
const RowsIsaOps& rows_ops(Isa isa) {
  return for_isa(isa, kRowsAvx512Ops, kRowsAvx2Ops, kRowsScalarOps);
}
}  // namespace

at::Tensor softmax_last_axis(const at::Tensor& x_in, float scale, Isa isa) {
  LOPPER_CHECK(x_in.dim() >= 1 && x_in.scalar_type() == at::kFloat && x_in.device().is_cpu(),
               "[kernels] softmax wants a float32 CPU tensor, got ", x_in.scalar_type(), " ",
               x_in.sizes(), " on ", x_in.device());
  const at::Tensor x = x_in.contiguous();
  at::Tensor y = at::empty_like(x);
  const int64_t n = x.dim() == 0 ? 1 : x.size(-1);
  if (x.numel() == 0 || n == 0) return y;
  const int64_t rows = x.numel() / n;
  const RowsIsaOps& ops = rows_ops(isa);
  const float* xp = x.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  // About 16K floats a piece of work: small tensors stay on one thread.
  const int64_t grain = std::max<int64_t>(1, (16 << 10) / n);
  at::parallel_for(0, rows, grain,
                   [&](int64_t r0, int64_t r1) { ops.softmax(xp, yp, r0, r1, n, scale); });
  return y;
}

at::Tensor scaled_attention(const at::Tensor& q, const at::Tensor& kt, const at::Tensor& v,
                            float scale, Isa isa) {
  for (const at::Tensor* t : {&q, &kt, &v})
    LOPPER_CHECK(
        t->dim() == 3 && t->scalar_type() == at::kFloat && t->device().is_cpu() && t->numel() > 0,
        "[kernels] attention wants non-empty float32 CPU [b, rows, cols] tensors, got ",
        t->scalar_type(), " ", t->sizes(), " on ", t->device());
  const int64_t b = q.size(0), sq = q.size(1), sk = kt.size(2), dv = v.size(2);
  LOPPER_CHECK(kt.size(0) == b && v.size(0) == b && kt.size(1) == q.size(2) && v.size(1) == sk,
               "[kernels] attention of q ", q.sizes(), ", kt ", kt.sizes(), " and v ", v.sizes());
  at::Tensor y = at::empty({b, sq, dv}, q.options());
  const int64_t rows = std::clamp<int64_t>((32 << 10) / sk, 1, sq);  // a block's scores: 128 KB
  const int64_t blocks = (sq + rows - 1) / rows;
  const RowsIsaOps& ops = rows_ops(isa);
  // NOTE: inside the threads' parallel region ATen's products run on the calling thread; the
  // workers take the caller's inference mode (thread-local), or writing into y, made in it, fails.
  const bool inference = c10::InferenceMode::is_enabled();
  parallel_steal(b * blocks, 1, [&](int64_t t0, int64_t t1) {
    c10::InferenceMode mode(inference);
    at::Tensor scores = at::empty({rows, sk}, q.options());
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t i = t / blocks, r0 = t % blocks * rows, r = std::min(rows, sq - r0);
      at::Tensor s = scores.narrow(0, 0, r);
      at::mm_out(s, q[i].narrow(0, r0, r), kt[i]);
      float* sp = s.data_ptr<float>();
      ops.softmax(sp, sp, 0, r, sk, scale);  // in place: each row read before it is written
      at::Tensor yi = y[i].narrow(0, r0, r);
      at::mm_out(yi, s, v[i]);
    }
  });
  return y;
}

}  // namespace lopper::kernels::cpu
