// SparseGPT's column-block solver (sparsegpt.h).
#include "prune/sparsegpt.h"

#include <ATen/ATen.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "lopper/error.h"

namespace lopper {

namespace {

// Overwrites lower triangular `l` (a square view) with its inverse, by halves: [A 0; C D]^-1 =
// [A^-1 0; -D^-1 C A^-1 D^-1], so that nearly all the work is matrix products.
void invert_lower(at::Tensor l) {
  const int64_t n = l.size(0);
  if (n <= 256) {
    l.copy_(at::linalg_solve_triangular(l, at::eye(n, l.options()), /*upper=*/false));
    return;
  }
  const int64_t h = n / 2;
  at::Tensor a = l.slice(0, 0, h).slice(1, 0, h);
  at::Tensor c = l.slice(0, h).slice(1, 0, h);
  at::Tensor d = l.slice(0, h).slice(1, h);
  invert_lower(a);
  invert_lower(d);
  c.copy_(at::mm(at::mm(d, c), a).neg_());
}

// The upper triangular U (float32) of U^T U = (H + damp * mean(diag H) * I)^-1, from `flipped` =
// J H J (H with its rows and columns in reverse order), or undefined when H + damp is not positive
// definite. flipped's diagonal is left damped.
// NOTE: J H J = M M^T (M lower: its Cholesky factor); then H = R R^T with R = J M J upper, and U =
// R^-1 = J M^-1 J, since U^T U = R^-T R^-1 = (R R^T)^-1. One Cholesky factorisation and one
// triangular inverse, both in float64: a third of the work of the explicit inverse and second
// factorisation of the reference (K^3 against 3 K^3 flops for a K-wide input), to float64's
// rounding of the same factor.
at::Tensor inverse_factor(at::Tensor& flipped, const at::Tensor& diag, double damp) {
  flipped.diagonal().copy_(diag).add_(damp * diag.mean().item<double>());
  auto [m, info] = at::linalg_cholesky_ex(flipped);
  if (info.item<int64_t>() != 0) return {};
  flipped.reset();
  invert_lower(m);
  return m.to(at::kFloat).flip({0, 1});
}

// A mask of the `take` smallest entries of `flat` (0 < take <= size): those below the take-th
// smallest value, then as many of the ties at it as make `take`, first in order. (A selection in
// linear time: topk sorts, 5x slower at the half of a block's 720k weights it takes.)
at::Tensor smallest(const at::Tensor& flat, int64_t take) {
  const at::Tensor v = std::get<0>(flat.kthvalue(take));
  at::Tensor mask = flat.lt(v);
  const int64_t below = mask.sum().item<int64_t>();
  if (below < take)
    mask.index_fill_(0, flat.eq(v).nonzero().flatten().slice(0, 0, take - below), true);
  return mask;
}

// One column block of SparseGPT, row by row: `w` [rows, count] becomes its pruned values, `err`
// the scaled errors (w - q) / [H^-1]_ii the columns after the block are updated by, `mask` the
// weights pruned (with n > 0, m - n of every m columns of a row are added to it, by least
// (w / [H^-1]_ii)^2 at the time, dead ones first, ties to the first). Returns the sum of err^2.
// NOTE: the rows are independent (each column's error updates only its own row's later columns),
// so the threads split the rows once per block. Column by column over the whole block (one
// parallel ATen op per column, 5632 columns a layer) cost a thread wake-up per column, and a
// wait of a whole time slice each where another process held a core: 15x slower on a busy
// machine.
double solve_block(at::Tensor& w, at::Tensor& mask, at::Tensor& err, const at::Tensor& hinv,
                   int64_t n, int64_t m) {
  const int64_t rows = w.size(0), count = w.size(1);
  float* W = w.data_ptr<float>();
  bool* M = mask.data_ptr<bool>();
  float* E = err.data_ptr<float>();
  const float* H = hinv.data_ptr<float>();
  std::vector<float> d2(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) d2[size_t(i)] = H[i * count + i] * H[i * count + i];
  const int64_t grain = std::max<int64_t>(1, 4096 / std::max<int64_t>(count, 1));
  std::vector<double> partial(size_t(at::get_num_threads()) + 1, 0.0);
  at::parallel_for(0, rows, grain, [&](int64_t r0, int64_t r1) {
    double sum = 0;
    std::vector<std::pair<float, int64_t>> group;
    for (int64_t r = r0; r < r1; ++r) {
      float* wr = W + r * count;
      bool* mr = M + r * count;
      float* er = E + r * count;
      for (int64_t i = 0; i < count; ++i) {
        if (n > 0 && i % m == 0) {
          const int64_t g = std::min(m, count - i), drop = g - n;
          if (drop > 0) {
            group.clear();
            for (int64_t j = i; j < i + g; ++j)
              group.emplace_back(mr[j] ? -1.f : wr[j] * wr[j] / d2[size_t(j)], j);
            std::stable_sort(group.begin(), group.end(),
                             [](const auto& a, const auto& b) { return a.first < b.first; });
            for (int64_t j = 0; j < drop; ++j) mr[group[size_t(j)].second] = true;
          }
        }
        er[i] = 0;
        if (!mr[i]) continue;  // kept: no error to spread
        const float e = wr[i] / H[i * count + i];
        wr[i] = 0;
        er[i] = e;
        sum += double(e) * double(e);
        const float* hi = H + i * count;
        for (int64_t j = i + 1; j < count; ++j) wr[j] -= hi[j] * e;
      }
    }
    partial[size_t(at::get_thread_num())] += sum;
  });
  double total = 0;
  for (double p : partial) total += p;
  return total;
}
}  // namespace

// Python's round (half to even), as PruneAmount counts.
int64_t sparsegpt_block_count(double amount, int64_t alive) {
  return int64_t(std::nearbyint(amount * double(alive)));
}

SparseGptFactor sparsegpt_factor(at::Tensor gram, double dampening, const std::string& where) {
  LOPPER_ASSERT(gram.dim() == 2 && gram.size(0) == gram.size(1), "sparsegpt: Hessian ",
                gram.sizes());
  LOPPER_CHECK(dampening > 0 && std::isfinite(dampening),
               "[prune] sparsegpt: dampening must be > 0, got ", dampening);
  LOPPER_CHECK(at::isfinite(gram).all().item<bool>(), "[prune] sparsegpt: the inputs of layer '",
               where, "' hold NaN or Inf on the calibration data");
  // In place when the caller handed its Gram matrix over (std::move): no second copy.
  at::Tensor H = gram.to(at::kCPU, at::kDouble);
  if (H.use_count() > 1 || !H.is_contiguous()) H = H.clone(at::MemoryFormat::Contiguous);
  gram.reset();
  SparseGptFactor f;
  f.dead = H.diagonal().eq(0);
  // NOTE: H is not needed once flipped: at most two K x K float64 matrices live at once (254 MB
  // each for a 5632-wide input), the flipped H and its factor.
  at::Tensor flipped = H.flip({0, 1});
  H.reset();
  const at::Tensor diag = flipped.diagonal().masked_fill(f.dead.flip({0}), 1);
  for (double damp = dampening; damp <= dampening * 100 * (1 + 1e-9); damp *= 10) {
    f.hinv = inverse_factor(flipped, diag, damp);
    if (f.hinv.defined()) {
      f.dampening = damp;
      break;
    }
  }
  LOPPER_CHECK(f.hinv.defined(), "[prune] sparsegpt: the Hessian of layer '", where,
               "' is not positive definite even with dampening ", dampening * 100,
               " (100x the dampening asked): give more calibration data, or a larger dampening");
  return f;
}

SparseGptResult sparsegpt(const at::Tensor& w, at::Tensor gram, const SparseGptOptions& o,
                          const std::string& where) {
  LOPPER_ASSERT(w.dim() == 2 && gram.dim() == 2 && gram.size(0) == w.size(1), "sparsegpt: weight ",
                w.sizes(), " and Hessian ", gram.sizes());
  LOPPER_CHECK(o.block_size >= 1, "[prune] sparsegpt: block size must be >= 1, got ", o.block_size);
  return sparsegpt(w, sparsegpt_factor(std::move(gram), o.dampening, where), o);
}

SparseGptResult sparsegpt(const at::Tensor& w, const SparseGptFactor& f,
                          const SparseGptOptions& o) {
  LOPPER_ASSERT(w.dim() == 2 && f.hinv.dim() == 2 && f.hinv.size(0) == w.size(1),
                "sparsegpt: weight ", w.sizes(), " and inverse factor ", f.hinv.sizes());
  LOPPER_CHECK(o.block_size >= 1, "[prune] sparsegpt: block size must be >= 1, got ", o.block_size);
  const int64_t cols = w.size(1);
  at::Tensor W = w.to(at::kCPU, at::kFloat).clone();
  const at::Tensor dead_w = W.eq(0);  // zero already: stays zero, not counted by the amount
  W.masked_fill_(f.dead.unsqueeze(0), 0);
  const at::Tensor& hinv = f.hinv;
  SparseGptResult r;
  r.dampening = f.dampening;

  const bool nm = o.n > 0;
  for (int64_t i1 = 0; i1 < cols; i1 += o.block_size) {
    const int64_t i2 = std::min(i1 + o.block_size, cols), count = i2 - i1;
    const at::Tensor Hinv1 = hinv.slice(0, i1, i2).slice(1, i1, i2).contiguous();
    const at::Tensor dead1 = dead_w.slice(1, i1, i2);
    at::Tensor W1 = W.slice(1, i1, i2).contiguous();  // [rows, count]
    at::Tensor mask1 = dead1.clone(at::MemoryFormat::Contiguous);
    if (!nm) {
      // The block's k weights of least (w / [H^-1]_ii)^2, among those not zero already.
      const at::Tensor d1 = Hinv1.diagonal();
      const int64_t alive = W1.numel() - dead1.sum().item<int64_t>();
      const int64_t k = sparsegpt_block_count(o.amount, alive);
      if (k > 0) {
        at::Tensor tmp = (W1.square() / d1.square().unsqueeze(0)).masked_fill(dead1, -1);
        const int64_t take = W1.numel() - alive + k;  // the dead ones come first (-1)
        mask1.view({-1}).logical_or_(smallest(tmp.flatten(), take));
      }
    }
    at::Tensor Err1 = at::empty_like(W1);
    r.error += solve_block(W1, mask1, Err1, Hinv1, o.n, o.m) / 2;
    W.slice(1, i1, i2).copy_(W1);
    if (i2 < cols) W.slice(1, i2).addmm_(Err1, hinv.slice(0, i1, i2).slice(1, i2), 1, -1);
  }
  r.weight = W;
  return r;
}

}  // namespace lopper
