// The masks: which weights of a tensor (or of all tensors) go.
#include <ATen/ATen.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>

#include "lopper/error.h"
#include "lopper/prune.h"
#include "prune/masks.h"
#include "util/pattern.h"

namespace lopper {

PruneAmount PruneAmount::parse(const std::string& s) {
  PruneAmount a;
  static const Pattern count_re("[0-9]+", "amount");
  static const Pattern number_re("[-+]?([0-9]+\\.?[0-9]*|\\.[0-9]+)([eE][-+]?[0-9]+)?", "amount");
  if (count_re.full_match(s)) {
    a.value = std::stod(s);
    a.is_count = true;
    return a;
  }
  LOPPER_CHECK(number_re.full_match(s),
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
  std::string s = os.str();
  // A fraction always shows as one ("1.0", not "1"): "1" would read as a count of one weight.
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
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

template <typename T>
T kth_smallest(at::Tensor& v, int64_t k) {
  T* p = v.data_ptr<T>();
  std::nth_element(p, p + k, p + v.numel());
  return p[k];
}

// A float32's bits mapped to an unsigned key with the same order as the values (NaN last, as
// torch.topk ranks it). `absolute` drops the sign first: the order of |x|.
inline uint32_t order_key(uint32_t bits, bool absolute) {
  if (absolute) bits &= 0x7fffffffu;
  if ((bits & 0x7fffffffu) > 0x7f800000u) return 0xffffffffu;  // NaN
  return (bits & 0x80000000u) ? ~bits : bits | 0x80000000u;
}

// A float32 that is not +0 or -0 (an alive weight when no alive mask is given).
inline bool nonzero_bits(uint32_t bits) { return (bits & 0x7fffffffu) != 0; }

// Counts, over the alive entries of all tensors, the keys in each of 65536 bins: bin = key >> 16
// (level 0), or key & 0xffff among the keys whose high half is `high` (level 1).
std::vector<int64_t> key_histogram(const std::vector<at::Tensor>& scores,
                                   const std::vector<at::Tensor>& alive, bool absolute, int level,
                                   uint32_t high) {
  std::vector<int64_t> hist(65536, 0);
  std::mutex mu;
  for (size_t i = 0; i < scores.size(); ++i) {
    const auto* w = static_cast<const uint32_t*>(scores[i].const_data_ptr());
    const bool* a = alive[i].defined() ? alive[i].const_data_ptr<bool>() : nullptr;
    at::parallel_for(0, scores[i].numel(), 1 << 20, [&](int64_t b, int64_t e) {
      std::vector<int64_t> local(65536, 0);
      for (int64_t j = b; j < e; ++j) {
        if (!(a ? a[j] : nonzero_bits(w[j]))) continue;
        uint32_t key = order_key(w[j], absolute);
        if (level == 0)
          ++local[key >> 16];
        else if ((key >> 16) == high)
          ++local[key & 0xffffu];
      }
      std::lock_guard<std::mutex> lock(mu);
      for (size_t h = 0; h < local.size(); ++h) hist[h] += local[h];
    });
  }
  return hist;
}

// The bin holding the k-th smallest (0-based) and how many keys lie in the bins before it.
std::pair<uint32_t, int64_t> bin_of(const std::vector<int64_t>& hist, int64_t k) {
  int64_t before = 0;
  for (uint32_t b = 0; b < hist.size(); ++b) {
    if (before + hist[b] > k) return {b, before};
    before += hist[b];
  }
  LOPPER_ASSERT(false, "k ", k, " beyond the histogram's ", before);
  return {0, 0};
}

// The value whose order key is `key`.
float value_of_key(uint32_t key) {
  uint32_t bits = (key & 0x80000000u) ? key & 0x7fffffffu : ~key;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// Flags the alive entries of one float32 tensor whose key is below `cut`, and those equal to it:
// all of them (take < 0), or only the first `take` in order.
at::Tensor flag_below(const at::Tensor& s, const at::Tensor& alive, bool absolute, uint32_t cut,
                      int64_t take) {
  at::Tensor out = at::empty(s.sizes(), at::kBool);
  const auto* w = static_cast<const uint32_t*>(s.const_data_ptr());
  const bool* a = alive.defined() ? alive.const_data_ptr<bool>() : nullptr;
  bool* o = out.data_ptr<bool>();
  auto flag = [&](int64_t j, bool with_ties) {
    if (!(a ? a[j] : nonzero_bits(w[j]))) return false;
    uint32_t key = order_key(w[j], absolute);
    return key < cut || (with_ties && key == cut);
  };
  if (take <= 0) {
    at::parallel_for(0, s.numel(), 1 << 20, [&](int64_t b, int64_t e) {
      for (int64_t j = b; j < e; ++j) o[j] = flag(j, take < 0);
    });
    return out;
  }
  for (int64_t j = 0, n = s.numel(); j < n; ++j) {
    o[j] = flag(j, take > 0);
    if (o[j] && order_key(w[j], absolute) == cut) --take;
  }
  return out;
}

// Up to this many alive scores, ties at the threshold are broken exactly as torch.topk breaks them
// (by calling it on the same values); beyond, the first tied entries in order go.
constexpr int64_t kExactTieLimit = int64_t(1) << 24;

}  // namespace

// NOTE: selection, not sorting, and no copy of the scores. For float32 scores (every weight type
// lopper prunes in practice) the k-th smallest alive score t is found by a two-level radix select
// on the float's bits mapped to an order-preserving unsigned key: one pass counts the high 16 bits
// into 65536 bins, a second pass counts the low 16 bits inside the bin that holds the k-th — two
// streaming passes, no sort, memory independent of the model's size. Other types take one copy of
// the alive scores and std::nth_element. Everything below t goes; when the scores equal to t are
// exactly the ones still needed to reach k, they all go too and the result is the only possible
// one, so it is torch's. Only when the values tied at t straddle the cut does the choice among them
// matter: then, up to kExactTieLimit alive scores, lopper calls at::topk(largest=False) on the same
// concatenated alive scores that torch.nn.utils.prune hands to torch.topk, so it removes the very
// same tied weights (same libtorch kernel, same input); above that size torch's choice among exact
// ties costs a full top-k over the whole model (torch itself needs a minute and 15x the weights'
// memory for 1 GB of weights), so lopper removes the first tied weights in layer order instead.
std::vector<at::Tensor> smallest_k(const std::vector<at::Tensor>& scores_in,
                                   const std::vector<at::Tensor>& alive_in, int64_t k,
                                   bool absolute) {
  LOPPER_ASSERT(scores_in.size() == alive_in.size());
  std::vector<at::Tensor> scores, alive;
  bool f32 = true;
  for (size_t i = 0; i < scores_in.size(); ++i) {
    scores.push_back(scores_in[i].contiguous());
    alive.push_back(alive_in[i].defined() ? alive_in[i].to(at::kBool).contiguous() : at::Tensor());
    f32 = f32 && scores.back().scalar_type() == at::kFloat && scores.back().is_cpu();
  }
  auto alive_of = [&](size_t i) {
    if (alive[i].defined()) return alive[i];
    return scores[i].ne(0);
  };
  auto score_of = [&](size_t i) { return absolute ? scores[i].abs() : scores[i]; };
  std::vector<at::Tensor> out;
  if (k == 0) {
    for (const auto& s : scores) out.push_back(at::zeros(s.sizes(), at::kBool));
    return out;
  }

  int64_t total = 0, below = 0, tied = 0;
  double t = 0;
  uint32_t cut = 0;  // f32: the order key of t
  if (f32) {
    std::vector<int64_t> h0 = key_histogram(scores, alive, absolute, 0, 0);
    for (int64_t c : h0) total += c;
    LOPPER_ASSERT(k >= 0 && k <= total, "k ", k, " of ", total);
    auto [high, before_high] = bin_of(h0, k - 1);
    std::vector<int64_t> h1 = key_histogram(scores, alive, absolute, 1, high);
    auto [low, before_low] = bin_of(h1, k - 1 - before_high);
    below = before_high + before_low;
    tied = h1[low];
    cut = high << 16 | low;
    t = value_of_key(cut);
  } else {
    std::vector<at::Tensor> parts;
    for (size_t i = 0; i < scores.size(); ++i)
      parts.push_back(score_of(i).reshape(-1).masked_select(alive_of(i).reshape(-1)));
    at::Tensor v = at::cat(parts).to(at::kDouble).contiguous();
    total = v.numel();
    LOPPER_ASSERT(k >= 0 && k <= total, "k ", k, " of ", total);
    t = kth_smallest<double>(v, k - 1);
    v.reset();
    for (size_t i = 0; i < scores.size(); ++i) {
      at::Tensor s = score_of(i), a = alive_of(i);
      below += (s.lt(t) & a).sum().item<int64_t>();
      tied += (s.eq(t) & a).sum().item<int64_t>();
    }
  }
  bool nan_cut = std::isnan(t);
  if (below + tied == k) {
    for (size_t i = 0; i < scores.size(); ++i)
      out.push_back(f32 ? flag_below(scores[i], alive[i], absolute, cut, -1)
                        : (nan_cut ? at::ones_like(scores[i], at::kBool) : score_of(i).le(t)) &
                              alive_of(i));
    return out;
  }
  if (total <= kExactTieLimit) {
    std::vector<at::Tensor> parts, alives;
    for (size_t i = 0; i < scores.size(); ++i) {
      alives.push_back(alive_of(i));
      parts.push_back(score_of(i).reshape(-1).masked_select(alives.back().reshape(-1)));
    }
    at::Tensor all = at::cat(parts);
    at::Tensor idx = std::get<1>(at::topk(all, k, 0, /*largest=*/false, /*sorted=*/true));
    at::Tensor removed = at::zeros({all.numel()}, at::kBool);
    removed.index_fill_(0, idx, true);
    return scatter_alive(alives, removed);
  }
  int64_t need = k - below;  // tied entries still to remove, the first ones in order
  for (size_t i = 0; i < scores.size(); ++i) {
    if (f32) {
      std::vector<int64_t> h = key_histogram({scores[i]}, {alive[i]}, absolute, 1, cut >> 16);
      int64_t here = h[cut & 0xffffu];
      out.push_back(flag_below(scores[i], alive[i], absolute, cut, need >= here ? -1 : need));
      need -= std::min(need, here);
      continue;
    }
    at::Tensor s = score_of(i), a = alive_of(i);
    at::Tensor tie = (nan_cut ? s.isnan() : s.eq(t)) & a;
    at::Tensor rank = tie.reshape(-1).cumsum(0, at::kLong).reshape(s.sizes());
    out.push_back(((nan_cut ? s.isnan().logical_not() : s.lt(t)) & a) | (tie & rank.le(need)));
    need -= std::min<int64_t>(need, tie.sum().item<int64_t>());
  }
  return out;
}

at::Tensor l1_mask(const at::Tensor& w, const PruneAmount& amount) {
  at::Tensor alive = w.ne(0);
  int64_t k = amount.count_of(alive.sum().item<int64_t>());
  return alive & smallest_k({w}, {at::Tensor()}, k, /*absolute=*/true)[0].logical_not();
}

at::Tensor random_mask(const at::Tensor& w, const PruneAmount& amount, at::Generator& gen) {
  at::Tensor alive = w.ne(0);
  int64_t r = alive.sum().item<int64_t>();
  int64_t k = amount.count_of(r);
  at::Tensor removed = at::zeros({r}, at::kBool);
  removed.index_fill_(0, at::randperm(r, gen, at::kLong).slice(0, 0, k), true);
  return alive & scatter_alive({alive}, removed)[0].logical_not();
}

at::Tensor nm_mask(const at::Tensor& w, int64_t n, int64_t m, const at::Tensor& score) {
  LOPPER_CHECK(n >= 1 && m >= 1 && n < m, "[prune] N:M needs 1 <= N < M, got ", n, ":", m);
  LOPPER_CHECK(w.dim() >= 1 && w.size(-1) % m == 0, "[prune] N:M: the reduction dimension (",
               w.dim() ? w.size(-1) : 0, ") is not divisible by M=", m);
  at::Tensor groups = (score.defined() ? score : w.abs()).reshape({-1, m});
  at::Tensor idx = std::get<1>(at::topk(groups, n, 1, /*largest=*/true, /*sorted=*/false));
  at::Tensor keep = at::zeros(groups.sizes(), at::kBool).scatter_(1, idx, true);
  return keep.reshape(w.sizes()) & w.ne(0);
}

// torch's ln_structured / random_structured inside a PruningContainer: only the slices along `dim`
// that still hold a nonzero weight are ranked, and the amount counts from them.
at::Tensor channel_mask(const at::Tensor& w, int64_t dim, const PruneAmount& amount, int norm,
                        at::Generator* gen, const at::Tensor& score) {
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
      at::Tensor sub = (score.defined() ? score : w).index_select(dim, alive_idx);
      at::Tensor norms = others.empty()    ? sub.abs()
                         : score.defined() ? sub.sum(others)
                                           : at::linalg_vector_norm(sub, norm, others);
      kept = std::get<1>(at::topk(norms, r - k, 0, /*largest=*/true, /*sorted=*/true));
    }
    keep_ch.index_fill_(0, alive_idx.index_select(0, kept), true);
  }
  std::vector<int64_t> shape(w.dim(), 1);
  shape[dim] = w.size(dim);
  return keep_ch.reshape(shape).expand(w.sizes()) & w.ne(0);
}

namespace {

// A weight as kBlock sees it: [O, K] (outputs; the other axes flattened, the input axis first),
// padded with zeros to multiples of r and c and tiled as [O/r, r, K/c, c].
struct BlockGrid {
  std::vector<int64_t> perm, inverse, permuted;  // weight axes -> [out, in, the rest]
  int64_t o, k, r, c, rows, cols;

  BlockGrid(const at::Tensor& w, int64_t out_axis, int64_t in_axis, int64_t r_, int64_t c_)
      : r(r_), c(c_) {
    out_axis = at::maybe_wrap_dim(out_axis, w.dim());
    in_axis = at::maybe_wrap_dim(in_axis, w.dim());
    LOPPER_ASSERT(out_axis != in_axis, "block: output and input axis both ", out_axis);
    perm = {out_axis, in_axis};
    for (int64_t d = 0; d < w.dim(); ++d)
      if (d != out_axis && d != in_axis) perm.push_back(d);
    inverse.resize(perm.size());
    for (size_t i = 0; i < perm.size(); ++i) {
      inverse[perm[i]] = int64_t(i);
      permuted.push_back(w.size(perm[i]));
    }
    o = w.size(out_axis);
    k = o ? w.numel() / o : 0;
    rows = (o + r - 1) / r;
    cols = (k + c - 1) / c;
  }

  at::Tensor tile(const at::Tensor& x) const {
    at::Tensor m = x.permute(perm).reshape({o, k});
    if (rows * r != o || cols * c != k)
      m = at::constant_pad_nd(m, {0, cols * c - k, 0, rows * r - o});
    return m.reshape({rows, r, cols, c});
  }

  // One flag per block -> one per weight, on the weight's own shape.
  at::Tensor untile(const at::Tensor& blocks) const {
    return blocks.reshape({rows, 1, cols, 1})
        .expand({rows, r, cols, c})
        .reshape({rows * r, cols * c})
        .slice(0, 0, o)
        .slice(1, 0, k)
        .reshape(permuted)
        .permute(inverse);
  }

  // How many weights each block holds (edge blocks fewer).
  at::Tensor counts() const {
    at::Tensor in_rows = at::arange(rows, at::kFloat).mul(-r).add(o).clamp_max(r);
    at::Tensor in_cols = at::arange(cols, at::kFloat).mul(-c).add(k).clamp_max(c);
    return in_rows.unsqueeze(1) * in_cols.unsqueeze(0);
  }
};

}  // namespace

// NOTE: a block is scored by its mean (norm 1) or root mean square (norm 2), not its sum, so that
// a partial edge block competes on equal terms; the selection is smallest_k on one score per block,
// which also ranks the blocks of several layers together.
std::vector<at::Tensor> block_masks(const std::vector<BlockWeight>& ws, int64_t r, int64_t c,
                                    const PruneAmount& amount, int norm, at::Generator* gen,
                                    const std::string& where) {
  LOPPER_CHECK(r >= 1 && r <= 256 && c >= 1 && c <= 256, "[prune] block needs R, C in 1..256, got ",
               r, "x", c);
  std::vector<BlockGrid> grids;
  std::vector<at::Tensor> scores, alive;
  int64_t total = 0;
  for (const auto& b : ws) {
    const BlockGrid& g = grids.emplace_back(b.w, b.out_axis, b.in_axis, r, c);
    alive.push_back(g.tile(b.w.ne(0)).any(3).any(1));
    total += alive.back().sum().item<int64_t>();
    if (b.score.defined()) {
      scores.push_back(g.tile(b.score.to(at::kFloat)).sum({1, 3}) / g.counts());
    } else if (norm == 0) {
      LOPPER_ASSERT(gen != nullptr);
      scores.push_back(at::rand({g.rows, g.cols}, *gen));  // a uniformly random k-subset
    } else {
      at::Tensor n = at::linalg_vector_norm(g.tile(b.w.to(at::kFloat)), norm, {1, 3});
      scores.push_back(norm == 1 ? n / g.counts() : n / g.counts().sqrt());
    }
  }
  int64_t k = amount.count_of(total, where);
  std::vector<at::Tensor> drop = smallest_k(scores, alive, k);
  std::vector<at::Tensor> keep;
  for (size_t i = 0; i < ws.size(); ++i)
    keep.push_back(grids[i].untile(drop[i]).logical_not() & ws[i].w.ne(0));
  return keep;
}

at::Tensor smallest_per_row(const at::Tensor& scores, const at::Tensor& alive,
                            const PruneAmount& amount) {
  LOPPER_ASSERT(!amount.is_count && scores.dim() == 2 && alive.sizes() == scores.sizes(),
                "smallest_per_row: scores ", scores.sizes(), ", alive ", alive.sizes());
  // The dead entries sort first (-1 < every score), then the alive ones, stably.
  const at::Tensor s = scores.to(at::kFloat).masked_fill(alive.logical_not(), -1);
  const at::Tensor order = std::get<1>(s.sort(/*stable=*/true, /*dim=*/1, /*descending=*/false));
  const at::Tensor n_alive = alive.sum(1).to(at::kDouble);
  // torch.round rounds half to even, as PruneAmount::count_of.
  const at::Tensor take = (double(scores.size(1)) - n_alive) + (n_alive * amount.value).round();
  const at::Tensor drop_sorted =
      at::arange(scores.size(1), n_alive.options()).unsqueeze(0) < take.unsqueeze(1);
  return at::zeros_like(alive, at::kBool).scatter_(1, order, drop_sorted);
}

}  // namespace lopper
