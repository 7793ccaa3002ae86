// SparseGPT's column-block solver (sparsegpt.h).
#include "prune/sparsegpt.h"

#include <ATen/ATen.h>

#include <cmath>
#include <vector>

#include "lopper/error.h"

namespace lopper {

namespace {

// The upper Cholesky factor of H^-1 for H + damp * mean(diag H) * I, or undefined when H + damp
// is not positive definite. H's diagonal is changed and put back; each step frees the one before
// (a K x K float64 matrix is 254 MB for a 5632-wide input: at most three live at once).
at::Tensor inverse_factor(at::Tensor& h, double damp) {
  const at::Tensor diag = h.diagonal().clone();
  h.diagonal().add_(damp * diag.mean().item<double>());
  auto [l, info] = at::linalg_cholesky_ex(h);
  h.diagonal().copy_(diag);
  if (info.item<int64_t>() != 0) return {};
  at::Tensor inv = at::cholesky_inverse(l);
  l.reset();
  auto [u, info2] = at::linalg_cholesky_ex(inv, /*upper=*/true);
  if (info2.item<int64_t>() != 0) return {};
  return u;
}

}  // namespace

// Python's round (half to even), as PruneAmount counts.
int64_t sparsegpt_block_count(double amount, int64_t alive) {
  return int64_t(std::nearbyint(amount * double(alive)));
}

SparseGptResult sparsegpt(const at::Tensor& w, at::Tensor gram, const SparseGptOptions& o,
                          const std::string& where) {
  LOPPER_ASSERT(
      w.dim() == 2 && gram.dim() == 2 && gram.size(0) == w.size(1) && gram.size(1) == w.size(1),
      "sparsegpt: weight ", w.sizes(), " and Hessian ", gram.sizes());
  LOPPER_CHECK(o.block_size >= 1, "[prune] sparsegpt: block size must be >= 1, got ", o.block_size);
  LOPPER_CHECK(o.dampening > 0 && std::isfinite(o.dampening),
               "[prune] sparsegpt: dampening must be > 0, got ", o.dampening);
  LOPPER_CHECK(at::isfinite(gram).all().item<bool>(), "[prune] sparsegpt: the inputs of layer '",
               where, "' hold NaN or Inf on the calibration data");
  const int64_t cols = w.size(1);
  at::Tensor W = w.to(at::kCPU, at::kFloat).clone();
  const at::Tensor dead_w = W.eq(0);  // zero already: stays zero, not counted by the amount
  // In place when the caller handed its Gram matrix over (std::move): no second copy.
  at::Tensor H = gram.to(at::kCPU, at::kDouble);
  if (H.use_count() > 1 || !H.is_contiguous()) H = H.clone(at::MemoryFormat::Contiguous);
  gram.reset();
  const at::Tensor dead = H.diagonal().eq(0);
  H.diagonal().masked_fill_(dead, 1);
  W.masked_fill_(dead.unsqueeze(0), 0);

  SparseGptResult r;
  at::Tensor hinv;
  for (double damp = o.dampening; damp <= o.dampening * 100 * (1 + 1e-9); damp *= 10) {
    hinv = inverse_factor(H, damp);
    if (hinv.defined()) {
      r.dampening = damp;
      break;
    }
  }
  LOPPER_CHECK(hinv.defined(), "[prune] sparsegpt: the Hessian of layer '", where,
               "' is not positive definite even with dampening ", o.dampening * 100,
               " (100x the dampening asked): give more calibration data, or a larger dampening");
  H.reset();
  hinv = hinv.to(at::kFloat);

  const bool nm = o.n > 0;
  // NOTE: each block is worked on transposed, [columns, rows], so that the column the loop prunes
  // and the columns it updates are contiguous rows of memory.
  for (int64_t i1 = 0; i1 < cols; i1 += o.block_size) {
    const int64_t i2 = std::min(i1 + o.block_size, cols), count = i2 - i1;
    const at::Tensor Hinv1 = hinv.slice(0, i1, i2).slice(1, i1, i2);
    const at::Tensor d1 = Hinv1.diagonal().contiguous();
    const at::Tensor dead1 = dead_w.slice(1, i1, i2);
    at::Tensor mask1 = dead1.clone(at::MemoryFormat::Contiguous);
    if (!nm) {
      // The block's k weights of least (w / [H^-1]_ii)^2, among those not zero already.
      const at::Tensor W1 = W.slice(1, i1, i2);
      const int64_t alive = W1.numel() - dead1.sum().item<int64_t>();
      const int64_t k = sparsegpt_block_count(o.amount, alive);
      if (k > 0) {
        at::Tensor tmp = (W1.square() / d1.square().unsqueeze(0)).masked_fill(dead1, -1);
        const int64_t take = W1.numel() - alive + k;  // the dead ones come first (-1)
        at::Tensor idx = std::get<1>(tmp.flatten().topk(take, 0, /*largest=*/false));
        mask1.view({-1}).index_fill_(0, idx, true);
      }
    }
    at::Tensor W1t = W.slice(1, i1, i2).t().contiguous();  // [count, rows]
    at::Tensor mask1t = mask1.t().contiguous();
    const at::Tensor dead1t = dead1.t().contiguous();
    at::Tensor Q1t = at::empty_like(W1t), Err1t = at::empty_like(W1t);
    const std::vector<float> d(d1.data_ptr<float>(), d1.data_ptr<float>() + count);
    for (int64_t i = 0; i < count; ++i) {
      if (nm && i % o.m == 0) {
        // Of the group's m columns, the m - n of least (w / [H^-1]_ii)^2 go (dead ones first).
        const int64_t g = std::min(o.m, count - i);
        const int64_t drop = std::max<int64_t>(0, g - o.n);
        if (drop > 0) {
          at::Tensor tmp =
              (W1t.slice(0, i, i + g).square() / d1.slice(0, i, i + g).square().unsqueeze(1))
                  .masked_fill(dead1t.slice(0, i, i + g), -1);
          at::Tensor idx = std::get<1>(tmp.topk(drop, 0, /*largest=*/false));
          mask1t.slice(0, i, i + g).scatter_(0, idx, true);
        }
      }
      const at::Tensor col = W1t[i];
      at::Tensor q = Q1t[i];
      q.copy_(col).masked_fill_(mask1t[i], 0);
      at::Tensor err = Err1t[i];
      at::sub_out(err, col, q).div_(d[size_t(i)]);
      if (i + 1 < count) W1t.slice(0, i + 1).addr_(Hinv1[i].slice(0, i + 1), err, 1, -1);
    }
    r.error += Err1t.square().sum().item<double>() / 2;
    W.slice(1, i1, i2).copy_(Q1t.t());
    if (i2 < cols) W.slice(1, i2).addmm_(Err1t.t(), hinv.slice(0, i1, i2).slice(1, i2), 1, -1);
  }
  r.weight = W;
  return r;
}

}  // namespace lopper
