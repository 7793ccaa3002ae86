#include "kernels/cpu/sparse.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "lopper/error.h"

namespace lopper::kernels::cpu {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

const SparseIsaOps& ops_of(Isa isa) {
  switch (isa) {
    case Isa::kAvx512:
      return kAvx512Ops;
    case Isa::kAvx2:
      return kAvx2Ops;
    default:
      return kScalarOps;
  }
}

Epilogue epilogue(const Activation& a, const std::vector<float>& bias) {
  Epilogue e;
  e.bias = bias.empty() ? nullptr : bias.data();
  e.act = a.kind == Activation::kRelu    ? Epilogue::kRelu
          : a.kind == Activation::kClip  ? Epilogue::kClip
          : a.kind == Activation::kLeaky ? Epilogue::kLeaky
                                         : Epilogue::kNone;
  e.lo = a.lo, e.hi = a.hi, e.alpha = a.alpha;
  return e;
}

// A scratch buffer per thread that only grows: large per-call allocations would be returned to
// the system and page-faulted back in on every run.
// NOTE: aligned to 64 bytes, with rows of whole cache lines (see padded()): a vector load that
// straddles two lines costs two.
float* scratch(int slot, size_t floats) {
  thread_local std::vector<float> bufs[2];
  auto& b = bufs[slot];
  if (b.size() < floats + 16) b.resize(floats + 16);
  auto addr = reinterpret_cast<uintptr_t>(b.data());
  return b.data() + ((64 - addr % 64) % 64) / sizeof(float);
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

int64_t stored_values(const at::Tensor& w2, BlockShape b) {
  at::Tensor w = w2.to(at::kFloat).contiguous();
  if (w.size(1) < b.c) return std::numeric_limits<int64_t>::max();
  int64_t blocks = 0;
  for_each_block(w.data_ptr<float>(), w.size(0), w.size(1), b,
                 [&](int64_t, int64_t k0, int64_t) { blocks += k0 >= 0; });
  return blocks * b.r * b.c;
}

SparseWeight::SparseWeight(const at::Tensor& w_in, BlockShape b, const at::Tensor& bias)
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
  nonzeros_ = w.count_nonzero().item<int64_t>();
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

std::vector<int64_t> SparseWeight::split_rows(int64_t parts) const {
  const int64_t rows = static_cast<int64_t>(ptr_.size()) - 1;
  parts = std::max<int64_t>(1, std::min(parts, rows));
  // NOTE: a block row costs its blocks plus a fixed epilogue, counted as two blocks.
  auto cost = [&](int64_t br) { return int64_t(ptr_[br]) * block_.c + 2 * br; };
  std::vector<int64_t> bounds{0};
  for (int64_t q = 1; q < parts; ++q) {
    const int64_t target = cost(rows) * q / parts;
    int64_t lo = bounds.back(), hi = rows;
    while (lo < hi) {
      int64_t mid = (lo + hi) / 2;
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
  const Epilogue e = epilogue(act, bias_);
  const int64_t threads = at::get_num_threads();
  const int64_t tile = algo == Algo::kCols ? 64 : 32;
  const int64_t tiles = ceil_div(m, tile);
  // NOTE: few row tiles (small batches) are split across threads by outputs instead; each share
  // of outputs holds about the same number of stored blocks.
  const auto bounds =
      split_rows(algo == Algo::kCols ? ceil_div(threads, tiles) : ceil_div(4 * threads, tiles));
  const int64_t chunks = static_cast<int64_t>(bounds.size()) - 1;
  at::parallel_for(0, tiles * chunks, 1, [&](int64_t begin, int64_t end) {
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
        float* xt = scratch(0, size_t(k_ * ld));
        float* yt = scratch(1, size_t(group * block_.r * ld));
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
  const Epilogue e = epilogue(act, bias_);
  constexpr int64_t kCols = 256;
  const int64_t ctiles = ceil_div(l, kCols), items = batch * ctiles;
  const auto bounds = split_rows(ceil_div(2 * at::get_num_threads(), items));
  const int64_t chunks = static_cast<int64_t>(bounds.size()) - 1;
  at::parallel_for(0, items * chunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t it = begin; it < end; ++it) {
      const int64_t q = it % chunks, b = it / chunks / ctiles, c0 = (it / chunks % ctiles) * kCols;
      ops.cols(s, bounds[q], bounds[q + 1], xp + b * k_ * l + c0, l, std::min(kCols, l - c0),
               yp + b * n_ * l + c0, l, 0, e);
    }
  });
  return y;
}

}  // namespace lopper::kernels::cpu
