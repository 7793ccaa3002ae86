// The masks: which weights of a tensor (or of all tensors) go.
#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <regex>

#include "lopper/error.h"
#include "lopper/prune.h"

namespace lopper {

PruneAmount PruneAmount::parse(const std::string& s) {
  PruneAmount a;
  static const std::regex count_re("[0-9]+");
  static const std::regex number_re("[-+]?([0-9]+\\.?[0-9]*|\\.[0-9]+)([eE][-+]?[0-9]+)?");
  if (std::regex_match(s, count_re)) {
    a.value = std::stod(s);
    a.is_count = true;
    return a;
  }
  LOPPER_CHECK(std::regex_match(s, number_re),
               "[prune] amount must be a fraction in [0, 1] or a count of weights, got '", s, "'");
  a.value = std::stod(s);
  LOPPER_CHECK(a.value >= 0 && a.value <= 1, "[prune] amount must be in [0, 1], got ", s);
  return a;
}

int64_t PruneAmount::count_of(int64_t n, const std::string& where) const {
  std::string in = where.empty() ? "" : " in " + where;
  if (is_count) {
    LOPPER_CHECK(value >= 0, "[prune] amount must be a count >= 0, got ", int64_t(value));
    LOPPER_CHECK(int64_t(value) <= n, "[prune] amount ", int64_t(value), " is more than the ", n,
                 " left to prune", in);
    return int64_t(value);
  }
  LOPPER_CHECK(value >= 0 && value <= 1, "[prune] amount must be in [0, 1], got ", value);
  // NOTE: torch computes round(amount * n) with Python's round, which rounds half to even;
  // nearbyint does the same in the default rounding mode.
  return std::min<int64_t>(n, int64_t(std::nearbyint(value * double(n))));
}

std::string PruneAmount::str() const {
  if (is_count) return std::to_string(int64_t(value));
  std::ostringstream os;
  os << value;
  return os.str();
}

const char* method_name(PruneMethod m) {
  switch (m) {
    case PruneMethod::kAbs:
      return "abs";
    case PruneMethod::kL1:
      return "l1";
    case PruneMethod::kRandom:
      return "random";
  }
  return "?";
}

namespace {

// Spreads `removed` (one flag per alive entry, the alive entries of all tensors concatenated in
// order) back onto the tensors' own shapes.
std::vector<at::Tensor> scatter_alive(const std::vector<at::Tensor>& alive,
                                      const at::Tensor& removed) {
  std::vector<at::Tensor> out;
  int64_t off = 0;
  for (const auto& a : alive) {
    at::Tensor flat = a.reshape(-1);
    at::Tensor pos = at::nonzero(flat).squeeze(1);
    int64_t r = pos.numel();
    at::Tensor m = at::zeros({flat.numel()}, at::kBool);
    m.index_put_({pos}, removed.slice(0, off, off + r));
    off += r;
    out.push_back(m.reshape(a.sizes()));
  }
  return out;
}

at::Tensor alive_values(const std::vector<at::Tensor>& scores,
                        const std::vector<at::Tensor>& alive) {
  std::vector<at::Tensor> parts;
  for (size_t i = 0; i < scores.size(); ++i)
    parts.push_back(scores[i].reshape(-1).masked_select(alive[i].reshape(-1)));
  return at::cat(parts);
}

template <typename T>
T kth_smallest(at::Tensor& v, int64_t k) {
  T* p = v.data_ptr<T>();
  std::nth_element(p, p + k, p + v.numel());
  return p[k];
}

}  // namespace

// NOTE: selection, not sorting. The k-th smallest alive score t is found with std::nth_element
// (linear time, on one copy of the alive scores). Everything below t goes; when the scores equal
// to t are exactly the ones still needed to reach k, they all go too and the result is the only
// possible one, so it is torch's. Only when the values tied at t straddle the cut does the choice
// among them matter: then lopper calls at::topk(largest=False) on the same concatenated alive
// scores that torch.nn.utils.prune hands to torch.topk, so it removes the very same tied weights
// (same libtorch kernel, same input).
std::vector<at::Tensor> smallest_k(const std::vector<at::Tensor>& scores,
                                   const std::vector<at::Tensor>& alive, int64_t k) {
  LOPPER_ASSERT(scores.size() == alive.size());
  int64_t total = 0;
  for (const auto& a : alive) total += a.sum().item<int64_t>();
  LOPPER_ASSERT(k >= 0 && k <= total, "k ", k, " of ", total);
  std::vector<at::Tensor> out;
  if (k == 0) {
    for (const auto& a : alive) out.push_back(at::zeros(a.sizes(), at::kBool));
    return out;
  }
  at::Tensor v = alive_values(scores, alive);
  if (v.scalar_type() != at::kFloat) v = v.to(at::kDouble);
  v = v.contiguous();
  double t = v.scalar_type() == at::kFloat ? double(kth_smallest<float>(v, k - 1))
                                           : kth_smallest<double>(v, k - 1);
  v.reset();
  int64_t below = 0, tied = 0;
  for (size_t i = 0; i < scores.size(); ++i) {
    below += (scores[i].lt(t) & alive[i]).sum().item<int64_t>();
    tied += (scores[i].eq(t) & alive[i]).sum().item<int64_t>();
  }
  if (below + tied == k) {
    for (size_t i = 0; i < scores.size(); ++i) out.push_back(scores[i].le(t) & alive[i]);
    return out;
  }
  at::Tensor all = alive_values(scores, alive);
  at::Tensor idx = std::get<1>(at::topk(all, k, 0, /*largest=*/false, /*sorted=*/true));
  at::Tensor removed = at::zeros({all.numel()}, at::kBool);
  removed.index_fill_(0, idx, true);
  return scatter_alive(alive, removed);
}

at::Tensor l1_mask(const at::Tensor& w, const PruneAmount& amount) {
  at::Tensor alive = w.ne(0);
  int64_t k = amount.count_of(alive.sum().item<int64_t>());
  return alive & smallest_k({w.abs()}, {alive}, k)[0].logical_not();
}

at::Tensor random_mask(const at::Tensor& w, const PruneAmount& amount, at::Generator& gen) {
  at::Tensor alive = w.ne(0);
  int64_t r = alive.sum().item<int64_t>();
  int64_t k = amount.count_of(r);
  at::Tensor removed = at::zeros({r}, at::kBool);
  removed.index_fill_(0, at::randperm(r, gen, at::kLong).slice(0, 0, k), true);
  return alive & scatter_alive({alive}, removed)[0].logical_not();
}

at::Tensor nm_mask(const at::Tensor& w, int64_t n, int64_t m) {
  LOPPER_CHECK(n >= 1 && m >= 1 && n < m, "[prune] N:M needs 1 <= N < M, got ", n, ":", m);
  LOPPER_CHECK(w.dim() >= 1 && w.size(-1) % m == 0, "[prune] N:M: the reduction dimension (",
               w.dim() ? w.size(-1) : 0, ") is not divisible by M=", m);
  at::Tensor groups = w.abs().reshape({-1, m});
  at::Tensor idx = std::get<1>(at::topk(groups, n, 1, /*largest=*/true, /*sorted=*/false));
  at::Tensor keep = at::zeros(groups.sizes(), at::kBool).scatter_(1, idx, true);
  return keep.reshape(w.sizes()) & w.ne(0);
}

// torch's ln_structured / random_structured inside a PruningContainer: only the slices along `dim`
// that still hold a nonzero weight are ranked, and the amount counts from them.
at::Tensor channel_mask(const at::Tensor& w, int64_t dim, const PruneAmount& amount, int norm,
                        at::Generator* gen) {
  dim = at::maybe_wrap_dim(dim, w.dim());
  std::vector<int64_t> others;
  for (int64_t d = 0; d < w.dim(); ++d)
    if (d != dim) others.push_back(d);
  at::Tensor alive_ch = others.empty() ? w.ne(0) : w.ne(0).any(others[0], true);
  for (size_t i = 1; i < others.size(); ++i) alive_ch = alive_ch.any(others[i], true);
  alive_ch = alive_ch.reshape(-1);
  at::Tensor alive_idx = at::nonzero(alive_ch).squeeze(1);
  int64_t r = alive_idx.numel();
  int64_t k = amount.count_of(r);
  at::Tensor keep_ch = at::zeros({w.size(dim)}, at::kBool);
  if (r - k > 0) {
    at::Tensor kept;
    if (norm == 0) {
      LOPPER_ASSERT(gen != nullptr);
      kept = at::randperm(r, *gen, at::kLong).slice(0, 0, r - k);
    } else {
      at::Tensor sub = w.index_select(dim, alive_idx);
      at::Tensor norms = others.empty() ? sub.abs() : at::linalg_vector_norm(sub, norm, others);
      kept = std::get<1>(at::topk(norms, r - k, 0, /*largest=*/true, /*sorted=*/true));
    }
    keep_ch.index_fill_(0, alive_idx.index_select(0, kept), true);
  }
  std::vector<int64_t> shape(w.dim(), 1);
  shape[dim] = w.size(dim);
  return keep_ch.reshape(shape).expand(w.sizes()) & w.ne(0);
}

}  // namespace lopper
