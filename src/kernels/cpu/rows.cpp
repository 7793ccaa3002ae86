#include "kernels/cpu/rows.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>

#include "kernels/cpu/rows_isa.h"
#include "lopper/error.h"

namespace lopper::kernels::cpu {
namespace {
const RowsIsaOps& rows_ops(Isa isa) {
  switch (isa) {
    case Isa::kAvx512:
      return kRowsAvx512Ops;
    case Isa::kAvx2:
      return kRowsAvx2Ops;
    default:
      return kRowsScalarOps;
  }
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

}  // namespace lopper::kernels::cpu
