#include "kernels/cpu/sparse.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <limits>

#include "kernels/cpu/bf16.h"
#include "kernels/cpu/bf16_bits.h"
#include "kernels/cpu/parallel.h"
#include "lopper/error.h"

namespace lopper::kernels::cpu {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

const SparseIsaOps& ops_of(Isa isa) { return for_isa(isa, kAvx512Ops, kAvx2Ops, kScalarOps); }

// Row boundaries [0, ..., rows] splitting rows into `parts` (at most one per row) of near-equal
// cost, `cost(r)` being the cost of rows [0, r) (nondecreasing).
template <class Cost>
std::vector<int64_t> split_by_cost(int64_t rows, int64_t parts, Cost&& cost) {
  parts = std::max<int64_t>(1, std::min(parts, rows));
  std::vector<int64_t> bounds{0};
  for (int64_t q = 1; q < parts; ++q) {
    const int64_t target = cost(rows) * q / parts;
    int64_t lo = bounds.back(), hi = rows;
    while (lo < hi) {
      const int64_t mid = (lo + hi) / 2;
      if (cost(mid) < target)
        lo = mid + 1;
      else
        hi = mid;
    }
    bounds.push_back(lo);
  }
  bounds.push_back(rows);
  return bounds;
}

// A row length rounded up to whole 64-byte lines.
int64_t padded(int64_t floats) { return (floats + 15) / 16 * 16; }

// Calls f(block) for every block of w [n, k] in blocks of b that holds a nonzero, in order, with
// the first input of the block. A last partial block column starts at k - c instead (its columns
// before the aligned start read as zeros), so that no kernel reads past the k inputs.
template <class F>
void for_each_block(const float* w, int64_t n, int64_t k, BlockShape b, F&& f) {
  for (int64_t br = 0; br * b.r < n; ++br) {
    const int64_t r1 = std::min<int64_t>(n, (br + 1) * b.r);
    for (int64_t k0 = 0; k0 < k; k0 += b.c) {
      const int64_t k1 = std::min<int64_t>(k, k0 + b.c);
      bool any = false;
      for (int64_t i = br * b.r; i < r1 && !any; ++i)
        for (int64_t j = k0; j < k1; ++j) any |= w[i * k + j] != 0.f;
      if (any) f(br, k0, k1 - b.c < k0 ? k1 - b.c : k0);
    }
    f(br, -1, -1);  // end of the block row
  }
}

// A dense row-major [n, k] weight of 32-bit (float32) or 16-bit (bf16) words as masked panels of
// 16 rows: per panel and step of two inputs, one 32-bit mask and the kept values in the order the
// kernel expands them: input by input (bit 16j + i) when input_major, else row by row (bit 2i + j).
// Zero is either sign's; values gets 32 readable words past the last (the kernels load a vector's
// worth at every step).
template <class T, class V>
void pack_mask_steps(const T* w, int64_t n, int64_t k, bool input_major,
                     std::vector<uint32_t>& pmask, std::vector<int64_t>& off,
                     std::vector<V>& values, int64_t nonzeros) {
  static_assert(sizeof(T) == sizeof(V));
  constexpr int64_t W = 16;
  constexpr T kMagnitude = std::numeric_limits<T>::max() >> 1;
  const int64_t steps = (k + 1) / 2, tiles = ceil_div(n, W);
  pmask.assign(size_t(tiles * steps), 0);
  off.assign(size_t(tiles + 1), 0);
  values.assign(size_t(nonzeros) + 32, V{});
  int64_t at = 0;
  for (int64_t t = 0; t < tiles; ++t) {
    for (int64_t s = 0; s < steps; ++s) {
      uint32_t m = 0;
      auto take = [&](int64_t i, int64_t j) {
        if (t * W + i >= n || 2 * s + j >= k) return;
        const T v = w[(t * W + i) * k + 2 * s + j];
        if ((v & kMagnitude) != 0) {
          m |= 1u << (input_major ? 16 * j + i : 2 * i + j);
          std::memcpy(&values[size_t(at++)], &v, sizeof(v));
        }
      };
      if (input_major) {
        for (int64_t j = 0; j < 2; ++j)
          for (int64_t i = 0; i < W; ++i) take(i, j);
      } else {
        for (int64_t i = 0; i < W; ++i)
          for (int64_t j = 0; j < 2; ++j) take(i, j);
      }
      pmask[size_t(t * steps + s)] = m;
    }
    off[size_t(t + 1)] = at;
  }
}

}  // namespace

bool isa_supported(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return true;
    case Isa::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case Isa::kAvx512:
      return isa_supported(Isa::kAvx2) && __builtin_cpu_supports("avx512f") &&
             __builtin_cpu_supports("avx512vl");
  }
  return false;
}

const char* isa_name(Isa isa) { return ops_of(isa).name; }

Epilogue to_epilogue(const Activation& a, const float* bias) {
  Epilogue e;
  e.bias = bias;
  // Activation::Kind in order.
  constexpr int kAct[] = {Epilogue::kNone,    Epilogue::kRelu,      Epilogue::kClip,
                          Epilogue::kLeaky,   Epilogue::kHardSwish, Epilogue::kHardSigmoid,
                          Epilogue::kSigmoid, Epilogue::kSilu,      Epilogue::kGelu};
  static_assert(std::size(kAct) == Activation::kGelu + 1);
  e.act = kAct[a.kind];
  e.lo = a.lo, e.hi = a.hi, e.alpha = a.alpha, e.beta = a.beta;
  return e;
}

bool bf16_dot_supported(Isa isa) {
  static const bool cpu = __builtin_cpu_supports("avx512bf16") &&
                          __builtin_cpu_supports("avx512vbmi2") &&
                          __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq");
  return isa == Isa::kAvx512 && cpu && ops_of(isa).masked_bf16 != nullptr;
}

Isa active_isa() {
  static const Isa isa = [] {
    const char* env = std::getenv("LOPPER_ISA");
    if (!env || !*env) {
      for (Isa i : {Isa::kAvx512, Isa::kAvx2})
        if (isa_supported(i)) return i;
      return Isa::kScalar;
    }
    for (Isa i : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
      if (std::strcmp(env, isa_name(i)) != 0) continue;
      LOPPER_CHECK(isa_supported(i), "[kernels] LOPPER_ISA=", env, ", but this CPU lacks ", env);
      return i;
    }
    throw Error(detail::concat("[kernels] LOPPER_ISA='", env,
                               "' is not an ISA (expected scalar, avx2 or avx512)"));
  }();
  return isa;
}

const std::vector<BlockShape>& kernel_block_shapes() {
  static const std::vector<BlockShape> shapes = {{1, 1}, {1, 4}, {4, 1}, {8, 1}};
  return shapes;
}

const char* algo_name(Algo a) {
  switch (a) {
    case Algo::kCols:
      return "cols";
    case Algo::kRows:
      return "rows";
    case Algo::kGather:
      return "gather";
    case Algo::kDot:
      return "dot";
  }
  return "?";
}

int64_t count_nonzero(const at::Tensor& w) {
  const bool f32 = w.scalar_type() == at::kFloat, bf16 = w.scalar_type() == at::kBFloat16;
  if (!w.device().is_cpu() || !w.is_contiguous() || (!f32 && !bf16))
    return w.count_nonzero().item<int64_t>();
  std::atomic<int64_t> total{0};
  at::parallel_for(0, w.numel(), 1 << 16, [&](int64_t begin, int64_t end) {
    int64_t n = 0;
    if (f32) {
      const auto* p = static_cast<const uint32_t*>(w.data_ptr());
      for (int64_t i = begin; i < end; ++i) n += (p[i] & 0x7fffffffu) != 0;
    } else {
      const auto* p = static_cast<const uint16_t*>(w.data_ptr());
      for (int64_t i = begin; i < end; ++i) n += (p[i] & 0x7fffu) != 0;
    }
    total += n;
  });
  return total.load();
}

int64_t stored_values(const at::Tensor& w2, BlockShape b) {
  at::Tensor w = w2.to(at::kFloat).contiguous();
  if (w.size(1) < b.c) return std::numeric_limits<int64_t>::max();
  int64_t blocks = 0;
  for_each_block(w.data_ptr<float>(), w.size(0), w.size(1), b,
                 [&](int64_t, int64_t k0, int64_t) { blocks += k0 >= 0; });
  return blocks * b.r * b.c;
}

SparseWeight::SparseWeight(const at::Tensor& w_in, BlockShape b, const at::Tensor& bias,
                           bool bf16_pairs)
    : block_(b) {
  LOPPER_CHECK(w_in.dim() == 2 && w_in.device().is_cpu() && w_in.scalar_type() == at::kFloat,
               "[kernels] a sparse weight must be a 2-D float32 CPU tensor");
  bool known = false;
  for (const auto& s : kernel_block_shapes()) known |= s.r == b.r && s.c == b.c;
  LOPPER_CHECK(known, "[kernels] no kernel takes blocks of ", b.str());
  at::Tensor w = w_in.contiguous();
  n_ = w.size(0), k_ = w.size(1);
  LOPPER_CHECK(k_ >= b.c, "[kernels] blocks of ", b.str(), " need at least ", b.c, " inputs");
  const float* p = w.data_ptr<float>();
  nonzeros_ = cpu::count_nonzero(w);
  ptr_.push_back(0);
  for_each_block(p, n_, k_, b, [&](int64_t br, int64_t k0, int64_t start) {
    if (k0 < 0) {
      LOPPER_CHECK(col_.size() < size_t(std::numeric_limits<int32_t>::max()),
                   "[kernels] too many blocks for 32-bit offsets");
      ptr_.push_back(static_cast<int32_t>(col_.size()));
      return;
    }
    col_.push_back(static_cast<int32_t>(start));
    for (int c = 0; c < b.c; ++c)
      for (int r = 0; r < b.r; ++r) {
        const int64_t i = br * b.r + r, j = start + c;
        val_.push_back(i < n_ && j >= k0 ? p[i * k_ + j] : 0.f);
      }
  });
  if (bias.defined()) {
    LOPPER_CHECK(bias.numel() == n_, "[kernels] bias has ", bias.numel(), " values for ", n_,
                 " outputs");
    at::Tensor bc = bias.to(at::kFloat).contiguous().view({-1});
    bias_.assign(bc.data_ptr<float>(), bc.data_ptr<float>() + n_);
    bias_.resize(ceil_div(n_, 8) * 8, 0.f);
  }
  if (bf16_pairs) pack_pairs();
}

void SparseWeight::pack_pairs() {
  const int R = block_.r, C = block_.c;
  const int64_t rows = static_cast<int64_t>(ptr_.size()) - 1;
  pair_ptr_.assign(1, 0);
  std::vector<uint16_t> first(size_t(R), 0);
  for (int64_t br = 0; br < rows; ++br) {
    int32_t pending = -1;  // an input waiting for its partner, its weights in `first`
    auto slot = [&](int32_t input, const float* w) {  // w[i]: the weight of output i
      uint16_t v[8];
      bool any = false;
      for (int i = 0; i < R; ++i) any |= (v[i] = to_bf16(w[i])) & 0x7fffu;
      if (!any) return;  // a column of a block with nothing in it (or only values below bf16's)
      if (pending < 0) {
        pending = input;
        std::copy(v, v + R, first.begin());
        return;
      }
      pair_idx_.push_back(pending), pair_idx_.push_back(input);
      for (int i = 0; i < R; ++i)
        pair_val_.push_back(uint32_t(first[size_t(i)]) | uint32_t(v[i]) << 16);
      pending = -1;
    };
    for (int32_t j = ptr_[br]; j < ptr_[br + 1]; ++j)
      for (int c = 0; c < C; ++c) slot(col_[j] + c, val_.data() + int64_t(j) * R * C + c * R);
    if (pending >= 0) {  // its partner: xt's row of zeros (not an input: 0 x Inf is NaN)
      pair_idx_.push_back(pending), pair_idx_.push_back(static_cast<int32_t>(k_));
      for (int i = 0; i < R; ++i) pair_val_.push_back(first[size_t(i)]);
    }
    LOPPER_CHECK(pair_idx_.size() / 2 < size_t(std::numeric_limits<int32_t>::max()),
                 "[kernels] too many pairs for 32-bit offsets");
    pair_ptr_.push_back(static_cast<int32_t>(pair_idx_.size() / 2));
  }
}

bool SparseWeight::supports(Algo a) const {
  switch (a) {
    case Algo::kCols:
      return true;
    case Algo::kRows:
      return block_.c == 1 && (block_.r == 4 || block_.r == 8);
    case Algo::kGather:
    case Algo::kDot:
      return block_.r == 1 && block_.c == 1;
  }
  return false;
}

SpView SparseWeight::view() const {
  SpView s;
  s.r = block_.r, s.c = block_.c, s.n = n_, s.k = k_;
  s.ptr = ptr_.data(), s.col = col_.data(), s.val = val_.data();
  return s;
}

PairView SparseWeight::pair_view() const {
  PairView s;
  s.r = block_.r, s.n = n_, s.k = k_;
  s.ptr = pair_ptr_.data(), s.idx = pair_idx_.data(), s.val = pair_val_.data();
  return s;
}

bool SparseWeight::runs_bf16(Isa isa) const {
  return !pair_ptr_.empty() && bf16_dot_supported(isa) && ops_of(isa).cols_bf16 != nullptr;
}

std::vector<int64_t> SparseWeight::split_rows(int64_t parts) const {
  const int64_t rows = static_cast<int64_t>(ptr_.size()) - 1;
  // NOTE: a block row costs its blocks plus a fixed epilogue, counted as two blocks.
  return split_by_cost(rows, parts,
                       [&](int64_t br) { return int64_t(ptr_[br]) * block_.c + 2 * br; });
}

at::Tensor SparseWeight::linear(const at::Tensor& x, Algo algo, Activation act, Isa isa) const {
  at::Tensor y = at::empty({x.size(0), n_}, x.options());
  linear_into(x, y, algo, act, isa);
  return y;
}

void SparseWeight::linear_into(const at::Tensor& x_in, at::Tensor& y, Algo algo, Activation act,
                               Isa isa) const {
  LOPPER_CHECK(x_in.dim() == 2 && x_in.size(1) == k_ && x_in.scalar_type() == at::kFloat,
               "[kernels] sparse linear: x must be [m, ", k_, "] float32");
  LOPPER_CHECK(supports(algo), "[kernels] no ", algo_name(algo), " kernel for blocks of ",
               block_.str());
  at::Tensor x = x_in.stride(1) == 1 ? x_in : x_in.contiguous();
  const int64_t m = x.size(0), ldx = x.stride(0), ldy = y.stride(0);
  if (m == 0 || n_ == 0) return;
  const float* xp = x.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const SparseIsaOps& ops = ops_of(isa);
  const SpView s = view();
  const Epilogue e = to_epilogue(act, bias_.empty() ? nullptr : bias_.data());
  const int64_t threads = at::get_num_threads();
  const int64_t tile = algo == Algo::kCols ? 64 : 32;
  const int64_t tiles = ceil_div(m, tile);
  // NOTE: few row tiles (small batches) are split across threads by outputs instead; each share
  // of outputs holds about the same number of stored blocks.
  const auto bounds =
      split_rows(algo == Algo::kCols ? ceil_div(threads, tiles) : ceil_div(4 * threads, tiles));
  const int64_t chunks = static_cast<int64_t>(bounds.size()) - 1;
  parallel_steal(tiles * chunks, steal_grain(tiles * chunks), [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t m0 = (item / chunks) * tile, mt = std::min(tile, m - m0);
      const int64_t br0 = bounds[item % chunks], br1 = bounds[item % chunks + 1];
      if (algo == Algo::kRows) {
        ops.rows(s, br0, br1, xp + m0 * ldx, ldx, mt, yp + m0 * ldy, ldy, e);
      } else if (algo == Algo::kGather) {
        ops.gather(s, br0, br1, xp + m0 * ldx, ldx, mt, yp + m0 * ldy, ldy, e);
      } else if (algo == Algo::kDot) {
        ops.dot(s, br0, br1, xp + m0 * ldx, ldx, mt, yp + m0 * ldy, ldy, e);
      } else {
        // NOTE: outputs in groups of 64 rows, each transposed into y while its 16 KB of results
        // are still in L1; one transpose of all rows would go through L2 twice.
        const int64_t group = std::max<int64_t>(1, 64 / block_.r), ld = padded(mt);
        float* xt = thread_scratch(0, size_t(k_ * ld));
        float* yt = thread_scratch(1, size_t(group * block_.r * ld));
        ops.transpose(xp + m0 * ldx, mt, k_, ldx, xt, ld);
        for (int64_t g0 = br0; g0 < br1; g0 += group) {
          const int64_t g1 = std::min(br1, g0 + group);
          const int64_t n0 = g0 * block_.r, n1 = std::min(n_, g1 * block_.r);
          ops.cols(s, g0, g1, xt, ld, mt, yt, ld, n0, e);
          ops.transpose(yt, n1 - n0, mt, ld, yp + m0 * ldy + n0, ldy);
        }
      }
    }
  });
}

at::Tensor SparseWeight::linear_bf16(const at::Tensor& x_in, Activation act, Isa isa) const {
  LOPPER_CHECK(x_in.dim() == 2 && x_in.size(1) == k_ && x_in.scalar_type() == at::kBFloat16,
               "[kernels] sparse bf16 linear: x must be [m, ", k_, "] bfloat16, got ",
               x_in.scalar_type(), " ", x_in.sizes());
  LOPPER_CHECK(runs_bf16(isa), "[kernels] sparse bf16 linear: ",
               pair_ptr_.empty() ? "the weight was packed without bf16 pairs"
                                 : "the CPU has no bfloat16 dot product");
  const at::Tensor x = x_in.stride(1) == 1 ? x_in : x_in.contiguous();
  const int64_t m = x.size(0), ldx = x.stride(0);
  at::Tensor y = at::empty({m, n_}, x.options());
  if (m == 0 || n_ == 0) return y;
  const auto* xp = reinterpret_cast<const uint16_t*>(x.data_ptr());
  auto* yp = reinterpret_cast<uint16_t*>(y.data_ptr());
  const SparseIsaOps& ops = ops_of(isa);
  const PairView s = pair_view();
  const Epilogue e = to_epilogue(act, bias_.empty() ? nullptr : bias_.data());
  // As linear_into's cols: tiles of 64 rows, split by outputs when there are fewer than threads.
  constexpr int64_t kTile = 64;
  const int64_t tiles = ceil_div(m, kTile);
  const int64_t rows = static_cast<int64_t>(pair_ptr_.size()) - 1;
  const auto bounds = split_by_cost(rows, ceil_div(at::get_num_threads(), tiles),
                                    [&](int64_t br) { return int64_t(pair_ptr_[br]) + 2 * br; });
  const int64_t chunks = static_cast<int64_t>(bounds.size()) - 1;
  parallel_steal(tiles * chunks, steal_grain(tiles * chunks), [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t m0 = (item / chunks) * kTile, mt = std::min(kTile, m - m0);
      const int64_t br0 = bounds[item % chunks], br1 = bounds[item % chunks + 1];
      // xt: a row of ld 16-bit values per input, columns past mt zero (the kernel reads whole
      // vectors of 32), and row k all zero (PairView); yt as in linear_into, in bf16.
      const int64_t ld = ceil_div(mt, 32) * 32, group = std::max<int64_t>(1, 64 / block_.r);
      auto* xt = reinterpret_cast<uint16_t*>(thread_scratch(0, size_t((k_ + 1) * ld / 2)));
      auto* yt = reinterpret_cast<uint16_t*>(thread_scratch(1, size_t(group * block_.r * ld / 2)));
      ops.transpose16(xp + m0 * ldx, mt, k_, ldx, xt, ld);
      if (mt < ld)
        for (int64_t i = 0; i < k_; ++i)
          std::fill(xt + i * ld + mt, xt + (i + 1) * ld, uint16_t(0));
      std::fill(xt + k_ * ld, xt + (k_ + 1) * ld, uint16_t(0));
      for (int64_t g0 = br0; g0 < br1; g0 += group) {
        const int64_t g1 = std::min(br1, g0 + group);
        const int64_t n0 = g0 * block_.r, n1 = std::min(n_, g1 * block_.r);
        ops.cols_bf16(s, g0, g1, xt, ld, ld, yt, ld, n0, e);
        ops.transpose16(yt, n1 - n0, mt, ld, yp + m0 * n_ + n0, n_);
      }
    }
  });
  return y;
}

at::Tensor SparseWeight::cols_batched(const at::Tensor& x_in, Activation act, Isa isa) const {
  LOPPER_CHECK(x_in.dim() == 3 && x_in.size(1) == k_ && x_in.scalar_type() == at::kFloat,
               "[kernels] sparse columns: x must be [b, ", k_, ", l] float32");
  at::Tensor x = x_in.contiguous();
  const int64_t batch = x.size(0), l = x.size(2);
  at::Tensor y = at::empty({batch, n_, l}, x.options());
  if (batch == 0 || l == 0 || n_ == 0) return y;
  const float* xp = x.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const SparseIsaOps& ops = ops_of(isa);
  const SpView s = view();
  const Epilogue e = to_epilogue(act, bias_.empty() ? nullptr : bias_.data());
  constexpr int64_t kCols = 256;
  const int64_t ctiles = ceil_div(l, kCols), items = batch * ctiles;
  const auto bounds = split_rows(ceil_div(2 * at::get_num_threads(), items));
  const int64_t chunks = static_cast<int64_t>(bounds.size()) - 1;
  parallel_steal(items * chunks, steal_grain(items * chunks), [&](int64_t begin, int64_t end) {
    for (int64_t it = begin; it < end; ++it) {
      const int64_t q = it % chunks, b = it / chunks / ctiles, c0 = (it / chunks % ctiles) * kCols;
      ops.cols(s, bounds[q], bounds[q + 1], xp + b * k_ * l + c0, l, std::min(kCols, l - c0),
               yp + b * n_ * l + c0, l, 0, e);
    }
  });
  return y;
}

MaskedWeight::MaskedWeight(const at::Tensor& w_in, const at::Tensor& bias, int tile, Isa isa) {
  LOPPER_CHECK(
      w_in.dim() == 2 && (w_in.scalar_type() == at::kFloat || w_in.scalar_type() == at::kBFloat16),
      "[kernels] masked weight: w must be 2-D float32 or bfloat16, got ", w_in.scalar_type(), " ",
      w_in.sizes());
  const bool bf16 = w_in.scalar_type() == at::kBFloat16;
  // NOTE: 0 where panels may win is decided once the pattern is known (2:4: panels).
  const bool panels_if_pairs = tile == 0 && bf16 && takes_panels(isa, true);
  if (tile == 0) tile = isa == Isa::kAvx512 ? 1 : 4;
  LOPPER_CHECK(tile == 1 || tile == 4 || tile == 16,
               "[kernels] masked weight: tiles of 1 or 4 rows (16: panels), not ", tile);
  const at::Tensor w = w_in.to(at::kCPU).contiguous();
  const int64_t n = w.size(0), k = w.size(1), chunks = ceil_div(k, 16), tiles = ceil_div(n, tile);
  view_.n = n, view_.k = k, view_.chunks = chunks, view_.tile = tile;
  view_.bf16 = bf16;
  // The raw bits: float32, or bfloat16's 16.
  const uint32_t* w32 = view_.bf16 ? nullptr : reinterpret_cast<const uint32_t*>(w.data_ptr());
  const uint16_t* w16 = view_.bf16 ? reinterpret_cast<const uint16_t*>(w.data_ptr()) : nullptr;
  auto nonzero = [&](int64_t i) {  // not +0 nor -0
    return view_.bf16 ? (w16[i] & 0x7fffu) != 0 : (w32[i] & 0x7fffffffu) != 0;
  };
  // Masks in tile order; rows past n (the last tile's padding) keep none.
  mask_.assign(size_t(tiles * chunks * tile), 0);
  auto mask_of = [&](int64_t r, int64_t c) -> uint16_t& {
    return mask_[size_t(((r / tile) * chunks + c) * tile + r % tile)];
  };
  bool eight = true;        // every full chunk holds 4 + 4 values
  bool pairs = k % 4 == 0;  // every 4 inputs hold 2 values (2:4)
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t c = 0; c < chunks; ++c) {
      uint32_t m = 0;
      for (int64_t j = c * 16; j < std::min(k, c * 16 + 16); ++j)
        if (nonzero(r * k + j)) m |= 1u << (j - c * 16);
      mask_of(r, c) = static_cast<uint16_t>(m);
      nonzeros_ += __builtin_popcount(m);
      if (c * 16 + 16 <= k)
        eight &= __builtin_popcount(m & 0xffu) == 4 && __builtin_popcount(m >> 8) == 4;
      for (int64_t q = 0; q < 4 && c * 16 + q * 4 < k; ++q)
        pairs &= __builtin_popcount((m >> (4 * q)) & 15u) == 2;
    }
  }
  view_.fixed = eight && k >= 16 ? 8 : 0;
  view_.pairs = pairs && k > 0;
  // NOTE: 2:4 in panels needs no expand and no count: 1.6-2.5x the speed of the rows (AMD EPYC
  // Zen 4, docs/kernels.md).
  if (panels_if_pairs && view_.pairs) tile = view_.tile = 16;
  if (tile == 16) {
    mask_.clear();
    pack_panels(w32, w16);
  } else {
    // The last tile's padding rows of a weight addressed without counting hold as many values as
    // its rows (the last row's pattern, zeros).
    int64_t padding = 0;
    if (view_.fixed || view_.pairs) {
      for (int64_t r = n; r < tiles * tile; ++r)
        for (int64_t c = 0; c < chunks; ++c) {
          mask_of(r, c) = mask_of(n - 1, c);
          padding += __builtin_popcount(mask_of(r, c));
        }
    }
    // The kernels load whole vectors: 16 float32 or 32 bfloat16 values.
    const size_t stored = size_t(nonzeros_ + padding) + 32;
    if (view_.bf16)
      val16_.assign(stored, 0);
    else
      val_.assign(stored, 0.f);
    // Values tile by tile, chunk by chunk, row by row.
    off_.assign(size_t(tiles + 1), 0);
    int64_t at = 0;
    for (int64_t t = 0; t < tiles; ++t) {
      for (int64_t c = 0; c < chunks; ++c) {
        for (int64_t r = t * tile; r < t * tile + tile; ++r) {
          for (uint32_t m = mask_of(r, c); m != 0; m &= m - 1) {
            const int64_t i = r * k + c * 16 + __builtin_ctz(m);
            if (r >= n)
              ++at;  // padding: zero
            else if (view_.bf16)
              val16_[size_t(at++)] = w16[i];
            else
              std::memcpy(&val_[size_t(at++)], &w32[i], sizeof(float));
          }
        }
      }
      off_[size_t(t + 1)] = at;
    }
  }
  if (bias.defined()) {
    const at::Tensor b = bias.to(at::kCPU, at::kFloat).contiguous();
    LOPPER_CHECK(b.numel() == n, "[kernels] masked weight: bias has ", b.numel(), " values for ", n,
                 " outputs");
    bias_.assign(b.data_ptr<float>(), b.data_ptr<float>() + n);
  }
  view_.mask = mask_.empty() ? nullptr : mask_.data();
  view_.pmask = pmask_.empty() ? nullptr : pmask_.data();
  view_.off = off_.data();
  view_.val = view_.bf16 ? static_cast<const void*>(val16_.data()) : val_.data();
}

void MaskedWeight::pack_panels(const uint32_t* w32, const uint16_t* w16) {
  constexpr int64_t W = 16;
  const int64_t n = view_.n, k = view_.k, tiles = ceil_div(n, W);
  if (!w16) {
    // float32: per pair of inputs, each input's 16 rows (bit 16j + i), values input by input.
    pack_mask_steps(w32, n, k, true, pmask_, off_, val_, nonzeros_);
    return;
  }
  if (view_.pairs) {
    // 2:4: per 4 inputs each row's pattern and its two values (padding rows: pattern 0, zeros).
    const int64_t groups = k / 4;
    pmask_.assign(size_t(tiles * groups * 2), 0);
    off_.assign(size_t(tiles + 1), 0);
    val16_.assign(size_t(tiles * groups * 32) + 32, 0);
    for (int64_t t = 0; t < tiles; ++t) {
      off_[size_t(t)] = t * groups * 32;
      for (int64_t g = 0; g < groups; ++g) {
        uint64_t ids = 0;
        uint16_t* v = &val16_[size_t(off_[size_t(t)] + 32 * g)];
        for (int64_t i = 0; i < W && t * W + i < n; ++i) {
          const uint16_t* wr = w16 + (t * W + i) * k + 4 * g;
          int kept[2], q = 0;
          for (int j = 0; j < 4; ++j)
            if ((wr[j] & 0x7fffu) != 0) kept[q++] = j;
          int id = 0;
          while (kPairOf[id][0] != kept[0] || kPairOf[id][1] != kept[1]) ++id;
          ids |= uint64_t(id) << (32 * (i % 2) + 4 * (i / 2));
          v[2 * i] = wr[kept[0]], v[2 * i + 1] = wr[kept[1]];
        }
        pmask_[size_t(2 * (t * groups + g))] = static_cast<uint32_t>(ids);
        pmask_[size_t(2 * (t * groups + g) + 1)] = static_cast<uint32_t>(ids >> 32);
      }
    }
    off_[size_t(tiles)] = tiles * groups * 32;
    return;
  }
  // bf16: per pair of inputs, the 16 rows' two (bit 2i + j), values row by row.
  pack_mask_steps(w16, n, k, false, pmask_, off_, val16_, nonzeros_);
}

namespace {

// The bitmask kernels' outputs in this many parts per thread, taken by the threads as they go: a
// product of a few rows of x is short (0.1-2 ms), and a thread that starts late or runs slower (a
// busy or shared CPU: seen up to 3x on a 2-core VM) leaves its parts to the others instead of
// holding them all at the end.
constexpr int64_t kPartsPerThread = 8;

// fn(q) for q in [0, parts), on ATen's threads, each taking the next part when it finishes one.
template <class F>
void run_parts(int64_t parts, F&& fn) {
  std::atomic<int64_t> next{0};
  at::parallel_for(0, std::min<int64_t>(parts, at::get_num_threads()), 1, [&](int64_t, int64_t) {
    for (int64_t q = next++; q < parts; q = next++) fn(q);
  });
}

}  // namespace

std::vector<int64_t> MaskedWeight::split_rows(int64_t parts) const {
  // A tile costs its values plus a fixed part per row (its masks, the reduction and the epilogue).
  const int64_t tile = view_.tile, tiles = static_cast<int64_t>(off_.size()) - 1;
  std::vector<int64_t> bounds = split_by_cost(tiles, parts, [&](int64_t t) {
    return off_[size_t(t)] + (view_.chunks / 4 + 16) * t * tile;
  });
  for (int64_t& b : bounds) b = std::min(view_.n, b * tile);
  return bounds;
}

int64_t MaskedWeight::bytes() const {
  const int64_t values = off_.back();  // the padding rows' too
  return int64_t(mask_.size() * sizeof(uint16_t) + pmask_.size() * sizeof(uint32_t) +
                 off_.size() * sizeof(int64_t)) +
         values * (view_.bf16 ? 2 : 4);
}

bool MaskedWeight::takes_panels(Isa isa, bool bf16) {
  if (!bf16) return ops_of(isa).masked_panels_f32 != nullptr;
  return bf16_dot_supported(isa) && ops_of(isa).masked_panels_bf16 != nullptr;
}

at::Tensor MaskedWeight::linear_panels(const at::Tensor& x_in, Activation act, Isa isa) const {
  constexpr int64_t W = 16;
  const int64_t m = x_in.size(0), n = view_.n;
  const SparseIsaOps& ops = ops_of(isa);
  const Epilogue e = to_epilogue(act, bias_.empty() ? nullptr : bias_.data());
  // NOTE: split per call: the thread count may change after packing.
  const std::vector<int64_t> bounds = split_rows(kPartsPerThread * at::get_num_threads());
  const int64_t parts = static_cast<int64_t>(bounds.size()) - 1;
  auto tiles = [&](int64_t q) {
    return std::pair<int64_t, int64_t>{bounds[size_t(q)] / W, ceil_div(bounds[size_t(q + 1)], W)};
  };
  if (view_.bf16 && x_in.scalar_type() == at::kBFloat16 && bf16_dot_supported(isa) &&
      ops.masked_panels_bf16) {
    const at::Tensor x = x_in.contiguous();
    at::Tensor y = at::empty({m, n}, x.options());
    if (m == 0 || n == 0) return y;
    const auto* xp = reinterpret_cast<const uint16_t*>(x.data_ptr());
    auto* yp = reinterpret_cast<uint16_t*>(y.data_ptr());
    run_parts(parts, [&](int64_t q) {
      const auto [t0, t1] = tiles(q);
      ops.masked_panels_bf16(view_, t0, t1, xp, view_.k, m, yp, n, e);
    });
    return y;
  }
  const at::Tensor x = x_in.to(at::kFloat).contiguous();
  at::Tensor y = at::empty({m, n}, x.options());
  if (m > 0 && n > 0) {
    const float* xp = x.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    // float32 on its vectorised kernel where the ISA has one, else the plain loop.
    const auto kernel =
        !view_.bf16 && ops.masked_panels_f32 ? ops.masked_panels_f32 : ops.masked_panels;
    run_parts(parts, [&](int64_t q) {
      const auto [t0, t1] = tiles(q);
      kernel(view_, t0, t1, xp, view_.k, m, yp, n, e);
    });
  }
  return x_in.scalar_type() == at::kFloat ? y : y.to(x_in.scalar_type());
}

at::Tensor MaskedWeight::linear(const at::Tensor& x_in, Activation act, Isa isa) const {
  LOPPER_CHECK(x_in.dim() == 2 && x_in.size(1) == view_.k &&
                   (x_in.scalar_type() == at::kFloat || x_in.scalar_type() == at::kBFloat16),
               "[kernels] masked linear: x must be [m, ", view_.k, "] float32 or bfloat16, got ",
               x_in.scalar_type(), " ", x_in.sizes());
  LOPPER_CHECK(runs_on(isa), "[kernels] masked linear: ", isa_name(isa),
               " takes a row per tile, this weight is packed in tiles of ", view_.tile);
  if (view_.tile == 16) return linear_panels(x_in, act, isa);
  const int64_t m = x_in.size(0);
  at::Tensor y = at::empty({m, view_.n}, x_in.options().dtype(at::kFloat));
  if (m > 0 && view_.n > 0 && view_.bf16 && x_in.scalar_type() == at::kBFloat16 &&
      bf16_dot_supported(isa)) {
    const at::Tensor x = x_in.contiguous();
    const SparseIsaOps& ops = ops_of(isa);
    const Epilogue e = to_epilogue(act, bias_.empty() ? nullptr : bias_.data());
    const auto* xp = reinterpret_cast<const uint16_t*>(x.data_ptr());
    float* yp = y.data_ptr<float>();
    // NOTE: split per call: the thread count may change after packing.
    const std::vector<int64_t> bounds = split_rows(kPartsPerThread * at::get_num_threads());
    run_parts(static_cast<int64_t>(bounds.size()) - 1, [&](int64_t q) {
      ops.masked_bf16(view_, bounds[size_t(q)], bounds[size_t(q + 1)], xp, view_.k, m, yp, view_.n,
                      e);
    });
    return y.to(at::kBFloat16);
  }
  const at::Tensor x = x_in.to(at::kFloat).contiguous();
  if (m > 0 && view_.n > 0) {
    const SparseIsaOps& ops = ops_of(isa);
    const Epilogue e = to_epilogue(act, bias_.empty() ? nullptr : bias_.data());
    const float* xp = x.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    // NOTE: split per call: the thread count may change after packing.
    const std::vector<int64_t> bounds = split_rows(kPartsPerThread * at::get_num_threads());
    run_parts(static_cast<int64_t>(bounds.size()) - 1, [&](int64_t q) {
      ops.masked(view_, bounds[size_t(q)], bounds[size_t(q + 1)], xp, view_.k, m, yp, view_.n, e);
    });
  }
  return x_in.scalar_type() == at::kFloat ? y : y.to(x_in.scalar_type());
}

DenseGemv::DenseGemv(const at::Tensor& w_in, Isa isa) : isa_(isa) {
  LOPPER_CHECK(w_in.dim() == 2 && w_in.device().is_cpu() &&
                   (w_in.scalar_type() == at::kFloat ||
                    (w_in.scalar_type() == at::kBFloat16 && takes_bf16(isa))),
               "[kernels] DenseGemv: w must be a 2-D float32 CPU tensor (bfloat16 where the CPU "
               "has the bfloat16 dot product), got ",
               w_in.scalar_type(), " ", w_in.sizes());
  const at::Tensor w = w_in.contiguous();
  n_ = w.size(0), k_ = w.size(1);
  bf16_ = w.scalar_type() == at::kBFloat16;
  if (bf16_) {
    // [n, k] -> [panels][ceil(k / 2)][16] words of two bf16: inputs 2j and 2j + 1 of an output.
    constexpr int64_t width = 16;
    const int64_t panels = (n_ + width - 1) / width, pairs = (k_ + 1) / 2;
    panels_ = at::constant_pad_nd(w, {0, 2 * pairs - k_, 0, panels * width - n_})
                  .contiguous()
                  .view(at::kInt)
                  .view({panels, width, pairs})
                  .transpose(1, 2)
                  .contiguous();
    return;
  }
  const int64_t width = ops_of(isa).panel_width, panels = (n_ + width - 1) / width;
  // [n, k] -> [panels][k][W], the rows past n zero.
  panels_ = at::constant_pad_nd(w, {0, 0, 0, panels * width - n_})
                .view({panels, width, k_})
                .transpose(1, 2)
                .contiguous();
}

bool DenseGemv::takes_bf16(Isa isa) {
  return bf16_dot_supported(isa) && ops_of(isa).dense_panels_bf16 != nullptr;
}

at::Tensor DenseGemv::linear(const at::Tensor& x_in, const at::Tensor& bias, Activation act) const {
  const at::ScalarType type = bf16_ ? at::kBFloat16 : at::kFloat;
  LOPPER_CHECK(x_in.dim() == 2 && x_in.size(1) == k_ && x_in.scalar_type() == type,
               "[kernels] DenseGemv: x must be [m, ", k_, "] ", type, ", got ", x_in.scalar_type(),
               " ", x_in.sizes());
  LOPPER_CHECK(!bias.defined() || (bias.numel() == n_ && (bias.scalar_type() == at::kFloat ||
                                                          bias.scalar_type() == type)),
               "[kernels] DenseGemv: bias must be [", n_, "] float32 or ", type);
  const at::Tensor x = x_in.contiguous();
  const at::Tensor b = bias.defined() ? bias.to(at::kFloat).contiguous() : bias;
  const int64_t m = x.size(0);
  at::Tensor y = at::empty({m, n_}, x.options());
  if (m == 0 || n_ == 0) return y;
  const SparseIsaOps& ops = ops_of(isa_);
  const Epilogue e = to_epilogue(act, b.defined() ? b.data_ptr<float>() : nullptr);
  // Runs of whole panels, as many per thread as keep the last ones short.
  const int64_t panels = panels_.size(0);
  const int64_t parts = std::min<int64_t>(panels, kPartsPerThread * at::get_num_threads());
  if (bf16_) {
    const auto* pp = reinterpret_cast<const uint32_t*>(panels_.data_ptr<int32_t>());
    const auto* xp = reinterpret_cast<const uint16_t*>(x.data_ptr());
    auto* yp = reinterpret_cast<uint16_t*>(y.data_ptr());
    run_parts(parts, [&](int64_t q) {
      const int64_t q0 = panels * q / parts, q1 = panels * (q + 1) / parts;
      if (q1 > q0) ops.dense_panels_bf16(pp, k_, q0, q1, xp, k_, m, yp, n_, n_, e);
    });
    return y;
  }
  const float* pp = panels_.data_ptr<float>();
  const float* xp = x.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  run_parts(parts, [&](int64_t q) {
    const int64_t q0 = panels * q / parts, q1 = panels * (q + 1) / parts;
    if (q1 > q0) ops.dense_panels(pp, k_, q0, q1, xp, k_, m, yp, n_, n_, e);
  });
  return y;
}

namespace {

// dst = src with each of its n images' [a][b] matrix transposed to [b][a], in tiles of 64 x 64
// split between the threads: NHWC -> NCHW with a = pixels and b = channels, and back with
// a = channels and b = pixels. A tile reads and writes runs of up to 256 bytes.
void transpose_images(const float* src, float* dst, int64_t n, int64_t a, int64_t b, Isa isa) {
  constexpr int64_t kTile = 64;
  const int64_t ta = ceil_div(a, kTile), tb = ceil_div(b, kTile);
  const SparseIsaOps& ops = ops_of(isa);
  parallel_steal(n * ta * tb, steal_grain(n * ta * tb), [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t img = t / (ta * tb), a0 = t / tb % ta * kTile, b0 = t % tb * kTile;
      const int64_t at_img = img * a * b;
      ops.transpose(src + at_img + a0 * b + b0, std::min(kTile, a - a0), std::min(kTile, b - b0), b,
                    dst + at_img + b0 * a + a0, a);
    }
  });
}

bool float_cpu_4d(const at::Tensor& x) {
  return x.dim() == 4 && x.device().is_cpu() && x.scalar_type() == at::kFloat;
}

}  // namespace

at::Tensor standard_layout(const at::Tensor& x, Isa isa) {
  if (x.is_contiguous()) return x;
  if (!float_cpu_4d(x) || !x.is_contiguous(at::MemoryFormat::ChannelsLast)) return x.contiguous();
  at::Tensor y = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  transpose_images(x.data_ptr<float>(), y.data_ptr<float>(), x.size(0), x.size(2) * x.size(3),
                   x.size(1), isa);
  return y;
}

at::Tensor residual_for(const at::Tensor& residual, const at::Tensor& y) {
  if (!residual.defined()) return {};
  LOPPER_CHECK(residual.sizes() == y.sizes(), "[kernels] the residual is ", residual.sizes(),
               ", the output ", y.sizes());
  return channels_last_layout(residual.to(y.scalar_type()));
}

at::Tensor channels_last_layout(const at::Tensor& x, Isa isa) {
  constexpr auto kCl = at::MemoryFormat::ChannelsLast;
  if (x.is_contiguous(kCl)) return x;
  if (const at::Tensor few = few_channels_last(x); few.defined()) return few;
  if (!float_cpu_4d(x) || !x.is_contiguous()) return x.contiguous(kCl);
  at::Tensor y = at::empty(x.sizes(), x.options().memory_format(kCl));
  transpose_images(x.data_ptr<float>(), y.data_ptr<float>(), x.size(0), x.size(1),
                   x.size(2) * x.size(3), isa);
  return y;
}

}  // namespace lopper::kernels::cpu

namespace lopper {
std::string cpu_isa() { return kernels::cpu::isa_name(kernels::cpu::active_isa()); }
}  // namespace lopper
