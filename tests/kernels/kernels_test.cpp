// One consistency test for every own kernel. CPU: each ISA this CPU has x each packed format x
// each kernel that takes it, against ATen's dense result (float64) on random shapes, odd sizes,
// empty rows and columns, 0% and 100% sparsity, batches 1 to 256, strided rows, fused bias and
// activations; the dense direct and depthwise convolutions against ATen's convolution. CUDA
// (skipped without a GPU): each dtype against cuBLAS.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/cuda/CUDAContext.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <limits>
#include <mutex>
#include <numeric>
#include <random>
#include <stdexcept>
#include <thread>

#include "kernels/cpu/bf16.h"
#include "kernels/cpu/chain.h"
#include "kernels/cpu/conv.h"
#include "kernels/cpu/conv_isa.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/pool.h"
#include "kernels/cpu/rows.h"
#include "kernels/cpu/sparse.h"
#include "kernels/cpu/winograd.h"
#include "kernels/cuda/pool_cuda.h"
#include "kernels/cuda/semi_structured.h"
#include "kernels/cuda/sparse_cuda.h"
#include "lopper/error.h"
#include "lopper/executor.h"

namespace kc = lopper::kernels::cpu;

namespace {

struct Case {
  int64_t n, k, m;
  double sparsity;
  bool block_pruned;  // zeros in whole blocks of the format (as `prune --pattern block:RxC` makes)
  bool empty_lines;   // some rows and columns all zero
  bool bias;
  kc::Activation act;
  int64_t pad;  // x rows are k + pad floats apart
};

std::string describe(const Case& c, kc::Isa isa, kc::BlockShape b, kc::Algo a) {
  return std::string(kc::isa_name(isa)) + " " + b.str() + " " + kc::algo_name(a) +
         " n=" + std::to_string(c.n) + " k=" + std::to_string(c.k) + " m=" + std::to_string(c.m) +
         " sparsity=" + std::to_string(c.sparsity) + (c.block_pruned ? " blocks" : "") +
         (c.empty_lines ? " empty-lines" : "") + (c.bias ? " bias" : "") +
         " act=" + std::to_string(int(c.act.kind)) + " pad=" + std::to_string(c.pad);
}

at::Tensor make_weight(const Case& c, kc::BlockShape b, at::Generator& gen) {
  at::Tensor w = at::randn({c.n, c.k}, gen);
  if (c.block_pruned) {
    const int64_t rb = (c.n + b.r - 1) / b.r, cb = (c.k + b.c - 1) / b.c;
    at::Tensor keep = at::rand({rb, cb}, gen) >= c.sparsity;
    keep = keep.repeat_interleave(b.r, 0).repeat_interleave(b.c, 1).narrow(0, 0, c.n).narrow(1, 0,
                                                                                             c.k);
    w = w * keep;
  } else {
    w = w * (at::rand({c.n, c.k}, gen) >= c.sparsity);
  }
  if (c.empty_lines) {
    w.narrow(0, 0, (c.n + 2) / 3).zero_();        // leading output rows
    w.narrow(1, c.k / 2, (c.k + 3) / 4).zero_();  // a band of inputs
  }
  return w;
}

// The kernels' fused activation by ATen (in the input's type).
at::Tensor activation_reference(const at::Tensor& y, const kc::Activation& act) {
  switch (act.kind) {
    case kc::Activation::kRelu:
      return at::relu(y);
    case kc::Activation::kClip:
      return at::clamp(y, act.lo, act.hi);
    case kc::Activation::kLeaky:
      return at::leaky_relu(y, act.alpha);
    case kc::Activation::kHardSwish:
      return at::hardswish(y);
    case kc::Activation::kHardSigmoid:
      return at::clamp(y * act.alpha + act.beta, 0, 1);
    case kc::Activation::kSigmoid:
      return at::sigmoid(y);
    case kc::Activation::kSilu:
      return at::silu(y);
    case kc::Activation::kGelu:
      return at::gelu(y);
    case kc::Activation::kNone:
      return y;
  }
  return y;
}

// Any of the activations, with parameters that make each one's every piece matter.
kc::Activation random_activation(std::mt19937& rng) {
  kc::Activation act;
  act.kind = static_cast<kc::Activation::Kind>(rng() % (kc::Activation::kGelu + 1));
  act.lo = -0.5f, act.hi = 0.75f, act.alpha = 0.1f, act.beta = 0.4f;
  if (act.kind == kc::Activation::kHardSigmoid) act.alpha = 0.3f;
  return act;
}

at::Tensor reference(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias,
                     kc::Activation act) {
  at::Tensor y = at::linear(x.to(at::kDouble), w.to(at::kDouble),
                            bias.defined() ? bias.to(at::kDouble) : at::Tensor());
  return activation_reference(y, act);
}

// Normalised mean squared error, as ggml's test-backend-ops measures kernels.
double nmse(const at::Tensor& y, const at::Tensor& ref) {
  at::Tensor d = y.to(at::kDouble) - ref;
  double denom = ref.pow(2).sum().item<double>();
  double num = d.pow(2).sum().item<double>();
  return denom == 0 ? num : num / denom;
}

std::vector<kc::Isa> isas() {
  std::vector<kc::Isa> out;
  for (kc::Isa i : {kc::Isa::kScalar, kc::Isa::kAvx2, kc::Isa::kAvx512})
    if (kc::isa_supported(i))
      out.push_back(i);
    else
      std::cout << "[ SKIP ] " << kc::isa_name(i) << ": this CPU lacks it\n";
  return out;
}

// Whether the CPU has the bfloat16 dot product the AVX-512 kernels use (AVX512_BF16); a SKIP line
// where it has not.
bool has_bf16_dot() {
  const bool has = kc::isa_supported(kc::Isa::kAvx512) && kc::bf16_dot_supported(kc::Isa::kAvx512);
  if (!has) std::cout << "[ SKIP ] this CPU has no AVX512_BF16\n";
  return has;
}

Case random_case(std::mt19937& rng, kc::BlockShape b) {
  auto pick = [&](std::initializer_list<int64_t> v) { return *(v.begin() + rng() % v.size()); };
  Case c;
  c.n = pick({1, 3, 7, 8, 9, 17, 64, 130});
  c.k = std::max<int64_t>(b.c, pick({1, 4, 5, 13, 64, 97, 768}));
  c.m = pick({1, 2, 3, 7, 8, 16, 17, 33, 64, 65, 128, 256});
  c.sparsity = std::vector<double>{0.0, 0.5, 0.8, 0.9, 0.95, 1.0}[rng() % 6];
  c.block_pruned = rng() % 2;
  c.empty_lines = rng() % 3 == 0;
  c.bias = rng() % 2;
  c.act = random_activation(rng);
  c.pad = rng() % 3 == 0 ? 3 : 0;
  return c;
}

}  // namespace

// Each fused activation over its whole range, through an identity weight (y = act(x)): the
// vectorised e^x of Sigmoid and SiLU against ATen's, the ends where it saturates, -0, NaN and
// +-Inf. NaN comes out where ATen's unfused op gives NaN, for every activation (a fused ReLU that
// turned NaN into 0 hid broken inputs), and an infinity where ATen gives that infinity.
TEST(SparseKernels, EveryActivationMatchesAtenOverItsRange) {
  const int64_t k = 16;
  at::Tensor x =
      at::cat({at::linspace(-100, 100, 20001, at::kFloat),
               at::tensor({0.f, -0.f, 1e-30f, -1e-30f, 87.3f, -87.3f, 88.f, -88.f, 89.f, -89.f, 3.f,
                           -3.f, 1e30f, -1e30f, NAN, -NAN, INFINITY, -INFINITY},
                          at::kFloat)});
  x = at::cat({x, at::zeros({(k - x.numel() % k) % k})}).reshape({-1, k});
  const kc::SparseWeight eye(at::eye(k), kc::BlockShape{1, 1});
  int checked = 0;
  for (kc::Isa isa : isas())
    for (int kind = 0; kind <= kc::Activation::kGelu; ++kind) {
      kc::Activation act;
      act.kind = static_cast<kc::Activation::Kind>(kind);
      act.lo = -0.5f, act.hi = 0.75f,
      act.alpha = kind == kc::Activation::kHardSigmoid ? 0.3f : 0.1f;
      act.beta = 0.4f;
      const at::Tensor y = eye.linear(x, kc::Algo::kCols, act, isa).flatten();
      const at::Tensor ref = activation_reference(x.to(at::kDouble), act).flatten();
      const std::string what = std::string(kc::isa_name(isa)) + " kind " + std::to_string(kind);
      const at::Tensor nan = at::isnan(ref);
      EXPECT_TRUE(at::equal(at::isnan(y), nan)) << what << ": NaN where ATen has none, or not";
      const at::Tensor inf = at::isinf(ref);
      EXPECT_TRUE(at::equal(y.masked_select(inf).to(at::kDouble), ref.masked_select(inf)))
          << what << ": an infinity ATen keeps";
      const at::Tensor skip = nan | inf;
      const at::Tensor err = (y.to(at::kDouble) - ref).abs().masked_fill(skip, 0);
      // 1e-7 absolute: float rounding where x / 6 + 1/2 cancels (HardSwish near -3).
      const at::Tensor excess = (err - ref.abs().masked_fill(skip, 0) * 1e-6 - 1e-7);
      const int64_t worst = excess.argmax().item<int64_t>();
      EXPECT_LE(excess[worst].item<double>(), 0)
          << what << ": at x = " << x.flatten()[worst].item<float>() << " got "
          << y[worst].item<float>() << ", want " << ref[worst].item<double>();
      ++checked;
    }
  EXPECT_GE(checked, kc::Activation::kGelu + 1);
}

// lopper's dense GEMV: every ISA, products of 1 to 9 rows (whole and partial groups of 4), output
// counts around the 4-row blocks, inputs around the vector widths, with and without a bias, every
// activation; threads 1 and 2 (the parts split the outputs).
TEST(DenseGemv, EveryIsaAndShapeMatchesAten) {
  std::mt19937 rng(77);
  at::Generator gen = at::detail::createCPUGenerator(7);
  int checked = 0;
  const int threads = at::get_num_threads();
  for (kc::Isa isa : isas())
    for (int64_t m : {1, 2, 3, 4, 5, 9})
      for (int64_t n : {1, 3, 4, 5, 17, 130})
        for (int64_t k : {1, 7, 8, 15, 16, 17, 100}) {
          at::set_num_threads(1 + (checked % 2));
          const at::Tensor w = at::randn({n, k}, gen);
          const at::Tensor x = at::randn({m, k}, gen);
          const at::Tensor bias = rng() % 2 ? at::randn({n}, gen) : at::Tensor();
          const kc::Activation act = random_activation(rng);
          const at::Tensor y = kc::DenseGemv(w, isa).linear(x, bias, act);
          const at::Tensor ref = reference(x, w, bias, act);
          ASSERT_EQ(y.sizes(), ref.sizes());
          EXPECT_LT(nmse(y, ref), 1e-10)
              << kc::isa_name(isa) << " m " << m << " n " << n << " k " << k << " act " << act.kind;
          ++checked;
        }
  at::set_num_threads(threads);
  EXPECT_GE(checked, 6 * 6 * 7);
  // A strided x (rows of a wider tensor) is read as its values.
  const at::Tensor wide = at::randn({3, 40}, gen), w = at::randn({6, 32}, gen);
  const at::Tensor x = wide.narrow(1, 4, 32);
  EXPECT_LT(nmse(kc::DenseGemv(w, kc::active_isa()).linear(x, {}, {}), reference(x, w, {}, {})),
            1e-10);
}

// lopper's dense GEMV on bfloat16 weights and x (pairs of inputs on vdpbf16ps) against ATen's
// result on the same bfloat16 values in float64: rows 1 to 9, outputs around the 16-wide panels,
// odd and even input counts (the last pair's partner zero), a strided x, bias float32 or bf16,
// every activation, threads 1 and 2; NaN and infinities where ATen has them; subnormal sums kept
// as ATen rounds them; an empty batch; refusals. Skipped on a CPU without the dot product.
TEST(DenseGemv, Bf16MatchesAten) {
  const kc::Isa isa = kc::Isa::kAvx512;
  if (!has_bf16_dot()) GTEST_SKIP();
  ASSERT_TRUE(kc::DenseGemv::takes_bf16(isa));
  std::mt19937 rng(91);
  at::Generator gen = at::detail::createCPUGenerator(17);
  int checked = 0;
  const int threads = at::get_num_threads();
  for (int64_t m : {1, 2, 3, 4, 5, 9})
    for (int64_t n : {1, 15, 16, 17, 130})
      for (int64_t k : {1, 2, 7, 8, 9, 33, 100}) {
        at::set_num_threads(1 + (checked % 2));
        const at::Tensor w = at::randn({n, k}, gen).to(at::kBFloat16);
        const at::Tensor xs = at::randn({m, k + 3}, gen).to(at::kBFloat16);
        const at::Tensor x = checked % 3 ? xs.narrow(1, 0, k) : xs.narrow(1, 0, k).contiguous();
        at::Tensor bias = rng() % 2 ? at::randn({n}, gen) : at::Tensor();
        if (bias.defined() && rng() % 2) bias = bias.to(at::kBFloat16);
        const kc::Activation act = random_activation(rng);
        const at::Tensor y = kc::DenseGemv(w, isa).linear(x, bias, act);
        const at::Tensor ref = reference(x, w, bias, act);
        SCOPED_TRACE("m " + std::to_string(m) + " n " + std::to_string(n) + " k " +
                     std::to_string(k) + " act " + std::to_string(act.kind));
        ASSERT_EQ(y.scalar_type(), at::kBFloat16);
        ASSERT_EQ(y.sizes(), ref.sizes());
        // float32 sums of exact products, rounded once to bfloat16
        ASSERT_LT(nmse(y, ref), 1e-5);
        ++checked;
      }
  at::set_num_threads(threads);
  EXPECT_GE(checked, 6 * 5 * 7);
  // Non-finite inputs: NaN and infinities exactly where ATen's are.
  for (int64_t k : {23, 24}) {
    const at::Tensor w = at::randn({20, k}, gen).to(at::kBFloat16);
    at::Tensor x = at::randn({4, k}, gen);
    x[0][3] = NAN, x[1][5] = INFINITY, x[2][0] = -INFINITY, x[3][k - 1] = INFINITY;
    x = x.to(at::kBFloat16);
    const at::Tensor y = kc::DenseGemv(w, isa).linear(x, {}, {}).to(at::kDouble);
    const at::Tensor ref = reference(x, w, {}, {});
    EXPECT_TRUE(at::equal(at::isnan(y), at::isnan(ref))) << "k=" << k;
    EXPECT_TRUE(at::equal(at::isinf(y), at::isinf(ref))) << "k=" << k;
    EXPECT_TRUE(at::equal(y.masked_select(at::isinf(ref)), ref.masked_select(at::isinf(ref))));
  }
  // A subnormal result rounded as ATen rounds it (zero weight rows give the bias).
  {
    at::Tensor w = at::randn({24, 16}, gen);
    w.narrow(0, 0, 8).zero_();
    const at::Tensor bias = at::rand({24}, gen) * 1e-39;
    const at::Tensor y = kc::DenseGemv(w.to(at::kBFloat16), isa)
                             .linear(at::randn({2, 16}, gen).to(at::kBFloat16), bias, {});
    const at::Tensor want = bias.narrow(0, 0, 8).to(at::kBFloat16).expand({2, 8});
    EXPECT_TRUE(at::equal(y.narrow(1, 0, 8), want));
    EXPECT_GT(at::count_nonzero(want).item<int64_t>(), 0);
  }
  const kc::DenseGemv g(at::randn({8, 16}).to(at::kBFloat16), isa);
  EXPECT_EQ(g.linear(at::randn({0, 16}).to(at::kBFloat16), {}, {}).sizes(),
            (std::vector<int64_t>{0, 8}));
  // Refusals: float32 x for a bf16 weight, the wrong k, a bias of the wrong size; a bf16 weight
  // on an ISA without the dot product.
  EXPECT_THROW(g.linear(at::randn({1, 16}), {}, {}), lopper::Error);
  EXPECT_THROW(g.linear(at::randn({1, 15}).to(at::kBFloat16), {}, {}), lopper::Error);
  EXPECT_THROW(g.linear(at::randn({1, 16}).to(at::kBFloat16), at::randn({7}), {}), lopper::Error);
  EXPECT_FALSE(kc::DenseGemv::takes_bf16(kc::Isa::kAvx2));
  EXPECT_THROW(kc::DenseGemv(at::randn({8, 16}).to(at::kBFloat16), kc::Isa::kAvx2), lopper::Error);
}

TEST(ParallelSteal, EveryItemOnceAndAStalledThreadsShareTaken) {
  const int threads = at::get_num_threads();
  for (int t : {1, 2, 3})
    for (int64_t n : {0, 1, 2, 7, 100, 1001})
      for (int64_t grain : {1, 3, 64, 5000}) {
        at::set_num_threads(t);
        std::vector<std::atomic<int>> seen(static_cast<size_t>(n));
        std::atomic<bool> empty{false};
        kc::parallel_steal(n, grain, [&](int64_t b, int64_t e) {
          if (b >= e) empty = true;
          for (int64_t i = b; i < e; ++i) ++seen[static_cast<size_t>(i)];
        });
        const std::string what = std::to_string(t) + " threads, n " + std::to_string(n) +
                                 ", grain " + std::to_string(grain);
        EXPECT_FALSE(empty) << what;
        for (int64_t i = 0; i < n; ++i)
          ASSERT_EQ(seen[static_cast<size_t>(i)], 1) << what << " item " << i;
      }
  // The second thread stalls on its first chunk (as on a core another process took): the first
  // does its own half, then takes what is left of the second's (a fixed split: exactly half).
  at::set_num_threads(2);
  constexpr int64_t kItems = 64;
  std::atomic<int64_t> by_first{0};
  std::atomic<bool> stalled{false};
  kc::parallel_steal(kItems, 1, [&](int64_t b, int64_t e) {
    if (at::get_thread_num() == 0) {
      by_first += e - b;
    } else if (!stalled.exchange(true)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  EXPECT_GT(by_first.load(), kItems / 2 + kItems / 4);
  // Chunks of at most `grain`, shrinking as a share empties (half of what is left, down to an
  // eighth of it) so that the threads finish together: 1000 items in chunks of 64 end in chunks
  // of under 32, none under 8 but the one that empties a share (one a thread).
  {
    std::mutex m;
    std::vector<int64_t> sizes;
    kc::parallel_steal(1000, 64, [&](int64_t b, int64_t e) {
      const std::lock_guard<std::mutex> lock(m);
      sizes.push_back(e - b);
    });
    EXPECT_EQ(std::accumulate(sizes.begin(), sizes.end(), int64_t{0}), 1000);
    EXPECT_LE(*std::max_element(sizes.begin(), sizes.end()), 64);
    EXPECT_LT(*std::min_element(sizes.begin(), sizes.end()), 32);
    EXPECT_LE(std::count_if(sizes.begin(), sizes.end(), [](int64_t z) { return z < 8; }), 2);
  }
  // A SerialScope keeps the work on the calling thread, in one call; nested, the outer one holds.
  {
    const kc::SerialScope serial(true);
    const kc::SerialScope inner(false);
    std::atomic<int> calls{0}, off_caller{0};
    kc::parallel_steal(kItems, 1, [&](int64_t b, int64_t e) {
      ++calls;
      if (at::get_thread_num() != 0 || b != 0 || e != kItems) ++off_caller;
    });
    EXPECT_EQ(calls.load(), 1);
    EXPECT_EQ(off_caller.load(), 0);
  }
  std::atomic<int> calls_after{0};
  kc::parallel_steal(kItems, 1, [&](int64_t, int64_t) { ++calls_after; });
  EXPECT_GT(calls_after.load(), 1);  // the scope is gone
  // An exception from a chunk reaches the caller.
  EXPECT_THROW(kc::parallel_steal(100, 1,
                                  [](int64_t b, int64_t) {
                                    if (b == 57) throw std::runtime_error("item 57");
                                  }),
               std::runtime_error);
  at::set_num_threads(threads);
}

TEST(LayoutKernels, BothWaysEveryIsaEqualAten) {
  constexpr auto kCl = at::MemoryFormat::ChannelsLast;
  at::Generator gen = at::detail::createCPUGenerator(11);
  const int threads = at::get_num_threads();
  int checked = 0;
  for (kc::Isa isa : isas())
    for (int64_t n : {1, 3})
      for (int64_t c : {1, 3, 8, 17, 24, 130})
        for (std::pair<int64_t, int64_t> hw :
             {std::pair<int64_t, int64_t>{1, 1}, {7, 9}, {8, 8}, {13, 5}, {112, 112}}) {
          at::set_num_threads(1 + (checked % 2));
          const at::Tensor x = at::randn({n, c, hw.first, hw.second}, gen);
          const std::string what = std::string(kc::isa_name(isa)) + " " + std::to_string(n) + "x" +
                                   std::to_string(c) + "x" + std::to_string(hw.first) + "x" +
                                   std::to_string(hw.second);
          const at::Tensor last = kc::channels_last_layout(x, isa);
          ASSERT_TRUE(last.is_contiguous(kCl)) << what;
          EXPECT_TRUE(at::equal(last, x)) << what;
          const at::Tensor back = kc::standard_layout(last, isa);
          ASSERT_TRUE(back.is_contiguous()) << what;
          EXPECT_TRUE(at::equal(back, x)) << what;
          ++checked;
        }
  at::set_num_threads(threads);
  EXPECT_GE(checked, 2 * 6 * 5);
  // Other layouts and types: their values in the layout asked for.
  const at::Tensor t = at::randn({4, 6}, gen).t();
  EXPECT_TRUE(at::equal(kc::standard_layout(t), t));
  EXPECT_TRUE(kc::standard_layout(t).is_contiguous());
  const at::Tensor d = at::randn({2, 3, 4, 5}, gen).to(at::kDouble);
  EXPECT_TRUE(at::equal(kc::standard_layout(d.contiguous(kCl)), d));
  EXPECT_TRUE(kc::channels_last_layout(d).is_contiguous(kCl));
  EXPECT_TRUE(at::equal(kc::channels_last_layout(d), d));
  const at::Tensor strided = at::randn({2, 8, 6, 6}, gen).narrow(1, 2, 4);  // neither layout
  EXPECT_TRUE(kc::channels_last_layout(strided).is_contiguous(kCl));
  EXPECT_TRUE(at::equal(kc::channels_last_layout(strided), strided));
}

TEST(SparseKernels, EveryIsaFormatAndKernelMatchesDenseAten) {
  std::mt19937 rng(1234);
  at::Generator gen = at::detail::createCPUGenerator(99);
  int checked = 0;
  for (kc::Isa isa : isas()) {
    for (const kc::BlockShape& b : kc::kernel_block_shapes()) {
      for (kc::Algo algo : {kc::Algo::kCols, kc::Algo::kRows, kc::Algo::kGather, kc::Algo::kDot}) {
        std::vector<Case> cases;
        for (int i = 0; i < 40; ++i) cases.push_back(random_case(rng, b));
        // The edges every format must get right, whatever the draw.
        for (double s : {0.0, 1.0})
          for (int64_t m : {1, 256})
            cases.push_back({33,
                             std::max<int64_t>(b.c, 19),
                             m,
                             s,
                             false,
                             false,
                             true,
                             {kc::Activation::kRelu},
                             0});
        cases.push_back({130, 97, 65, 0.9, true, true, true, {kc::Activation::kNone}, 5});
        for (const Case& c : cases) {
          at::Tensor w = make_weight(c, b, gen);
          at::Tensor bias = c.bias ? at::randn({c.n}, gen) : at::Tensor();
          kc::SparseWeight sw(w, b, bias);
          ASSERT_EQ(sw.nonzeros(), w.count_nonzero().item<int64_t>());
          if (!sw.supports(algo)) continue;
          at::Tensor xs = at::randn({c.m, c.k + c.pad}, gen);
          at::Tensor x = xs.narrow(1, 0, c.k);  // rows c.k + c.pad apart
          at::Tensor y = sw.linear(x, algo, c.act, isa);
          at::Tensor ref = reference(x, w, bias, c.act);
          SCOPED_TRACE(describe(c, isa, b, algo));
          ASSERT_EQ(y.sizes(), ref.sizes());
          ASSERT_LT(nmse(y, ref), 1e-10);
          // Nothing to add: exactly act(bias) (for the activations that are exact in float).
          if (c.sparsity == 1.0 && !c.empty_lines && c.act.kind <= kc::Activation::kLeaky) {
            ASSERT_TRUE(at::equal(y, reference(at::zeros_like(x), w, bias, c.act).to(at::kFloat)));
          }
          ++checked;
        }
      }
      // Columns of an NCHW activation or of im2col: y[b] = W . x[b].
      for (int64_t l : {1, 15, 16, 17, 64, 300}) {
        Case c = random_case(rng, b);
        at::Tensor w = make_weight(c, b, gen);
        at::Tensor bias = c.bias ? at::randn({c.n}, gen) : at::Tensor();
        kc::SparseWeight sw(w, b, bias);
        at::Tensor x = at::randn({2, c.k, l}, gen);
        at::Tensor y = sw.cols_batched(x, c.act, isa);
        at::Tensor ref = reference(x.transpose(1, 2), w, bias, c.act).transpose(1, 2);
        SCOPED_TRACE(describe(c, isa, b, kc::Algo::kCols) + " batched l=" + std::to_string(l));
        ASSERT_LT(nmse(y, ref), 1e-10);
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 300);
}

// The bfloat16 cols kernel (SparseWeight::linear_bf16, weights in pairs of inputs, AVX512_BF16)
// against ATen's dense result on the same bfloat16 values in float64: every block shape, odd
// counts of inputs per block row (the last one's partner is the zero row), tiles of 1 to 64 rows
// and more (column counts around the kernel's 32), x rows with a stride, bias and activations;
// NaN and infinities as ATen's; an empty batch; refusals. Skipped on a CPU without it.
TEST(SparseKernels, Bf16ColsMatchesDenseAten) {
  const kc::Isa isa = kc::Isa::kAvx512;
  if (!has_bf16_dot()) GTEST_SKIP();
  std::mt19937 rng(2468);
  at::Generator gen = at::detail::createCPUGenerator(13);
  int checked = 0;
  for (const kc::BlockShape& b : kc::kernel_block_shapes()) {
    std::vector<Case> cases;
    for (int i = 0; i < 40; ++i) {
      Case c = random_case(rng, b);
      c.m = *(std::initializer_list<int64_t>{1, 5, 31, 32, 33, 63, 64, 65, 100, 130, 256}.begin() +
              rng() % 11);
      cases.push_back(c);
    }
    cases.push_back({130, 97, 65, 0.9, true, true, true, {kc::Activation::kNone}, 5});
    cases.push_back({33, std::max<int64_t>(b.c, 19), 40, 1.0, false, false, true, {}, 0});
    for (const Case& c : cases) {
      const at::Tensor w = make_weight(c, b, gen).to(at::kBFloat16);
      const at::Tensor bias = c.bias ? at::randn({c.n}, gen) : at::Tensor();
      const kc::SparseWeight sw(w.to(at::kFloat), b, bias, true);
      ASSERT_TRUE(sw.runs_bf16(isa));
      const at::Tensor xs = at::randn({c.m, c.k + c.pad}, gen).to(at::kBFloat16);
      const at::Tensor x = xs.narrow(1, 0, c.k);
      const at::Tensor y = sw.linear_bf16(x, c.act, isa);
      const at::Tensor ref = reference(x, w, bias, c.act);
      SCOPED_TRACE(describe(c, isa, b, kc::Algo::kCols) + " bf16");
      ASSERT_EQ(y.scalar_type(), at::kBFloat16);
      ASSERT_EQ(y.sizes(), ref.sizes());
      // float32 sums of exact products, y rounded once to bfloat16
      ASSERT_LT(nmse(y, ref), 1e-5);
      ++checked;
    }
    // Non-finite inputs through a weight with no zero: NaN exactly where ATen's, and infinities.
    for (int64_t k : {23, 24}) {  // an odd count per row, and an even one
      const at::Tensor w = at::randn({20, k}, gen).to(at::kBFloat16);
      const at::Tensor bias = at::randn({20}, gen);
      const kc::SparseWeight sw(w.to(at::kFloat), b.c <= k ? b : kc::BlockShape{}, bias, true);
      at::Tensor x = at::randn({40, k}, gen);
      x[0][3] = NAN, x[1][5] = INFINITY, x[2][0] = -INFINITY, x[3][k - 1] = INFINITY;
      x = x.to(at::kBFloat16);
      const at::Tensor y = sw.linear_bf16(x, {}, isa).to(at::kDouble);
      const at::Tensor ref = reference(x, w, bias, {});
      EXPECT_TRUE(at::equal(at::isnan(y), at::isnan(ref))) << b.str() << " k=" << k;
      EXPECT_TRUE(at::equal(at::isinf(y), at::isinf(ref))) << b.str() << " k=" << k;
      EXPECT_TRUE(at::equal(y.masked_select(at::isinf(ref)), ref.masked_select(at::isinf(ref))));
      const at::Tensor finite = at::isfinite(ref);
      EXPECT_LT(nmse(y.masked_select(finite), ref.masked_select(finite)), 1e-5);
      EXPECT_EQ(sw.linear_bf16(x.narrow(0, 0, 0), {}, isa).sizes(), (std::vector<int64_t>{0, 20}));
      ++checked;
    }
  }
  EXPECT_GT(checked, 150);
  // Subnormal results rounded as ATen rounds them (vcvtneps2bf16 would make them zeros): outputs
  // whose weight rows are all zero give the bias, here subnormal.
  {
    at::Tensor w = at::randn({24, 16}, gen);
    w.narrow(0, 0, 8).zero_();
    const at::Tensor bias = at::rand({24}, gen) * 1e-39;
    const kc::SparseWeight sw(w, {1, 1}, bias, true);
    const at::Tensor y = sw.linear_bf16(at::randn({32, 16}, gen).to(at::kBFloat16), {}, isa);
    const at::Tensor want = bias.narrow(0, 0, 8).to(at::kBFloat16).expand({32, 8});
    EXPECT_TRUE(at::equal(y.narrow(1, 0, 8), want));
    EXPECT_GT(at::count_nonzero(want).item<int64_t>(), 0);
  }
  // Refusals: float32 x, the wrong k, a weight packed without pairs.
  const kc::SparseWeight sw(at::randn({8, 16}), {1, 1}, {}, true);
  EXPECT_THROW(sw.linear_bf16(at::randn({4, 16}), {}, isa), lopper::Error);
  EXPECT_THROW(sw.linear_bf16(at::randn({4, 15}).to(at::kBFloat16), {}, isa), lopper::Error);
  const kc::SparseWeight plain(at::randn({8, 16}), {1, 1});
  EXPECT_FALSE(plain.runs_bf16(isa));
  EXPECT_THROW(plain.linear_bf16(at::randn({4, 16}).to(at::kBFloat16), {}, isa), lopper::Error);
}

// The bitmask format (MaskedWeight) for the decode regime: every ISA x float32 and bfloat16
// weights x float32 and bfloat16 activations against ATen's dense result, odd sizes (k not a
// multiple of 16 or 8), 0% and 100%, empty rows and inputs, 2:4 weights (addressed without
// counting), batches 1 to 33, rows in tiles of 1 and 4 (AVX-512: 1 only, 4 refused), panels of
// 16 rows (every ISA: AVX-512 or the bfloat16 dot product where the CPU has it, else a plain loop).
TEST(SparseKernels, MaskedEveryIsaAndDtypeMatchesDenseAten) {
  std::mt19937 rng(4321);
  at::Generator gen = at::detail::createCPUGenerator(7);
  auto pick = [&](std::initializer_list<int64_t> v) { return *(v.begin() + rng() % v.size()); };
  int checked = 0, fixed = 0, pairs = 0;
  for (kc::Isa isa : isas()) {
    std::vector<Case> cases;
    for (int i = 0; i < 60; ++i) {
      Case c = random_case(rng, kc::BlockShape{});
      c.k = pick({1, 5, 8, 13, 16, 17, 24, 64, 97, 768});
      c.m = pick({1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 33});
      c.block_pruned = false;
      c.pad = 0;
      cases.push_back(c);
    }
    for (double s : {0.0, 1.0})
      cases.push_back({33, 19, 1, s, false, false, true, {kc::Activation::kRelu}, 0});
    cases.push_back({130, 97, 16, 0.5, false, true, true, {kc::Activation::kNone}, 0});
    // 2:4 (sparsity -1; k = 100, 104, 108: a last chunk of 4, 8, 12 inputs) and 4:8 (-2: 8 of
    // every 16 inputs, but not 2 of every 4).
    for (int64_t k : {16, 64, 80, 100, 104, 108})
      cases.push_back({9, k, 3, -1, false, false, true, {}, 0});
    for (int64_t k : {16, 64, 80}) cases.push_back({9, k, 1, -2, false, false, true, {}, 0});
    for (const Case& c : cases) {
      for (at::ScalarType wt : {at::kFloat, at::kBFloat16}) {
        for (at::ScalarType xt : {at::kFloat, at::kBFloat16}) {
          at::Tensor w;
          if (c.sparsity < 0) {  // N:M: the N largest |w| of every M inputs
            const int64_t n_of = c.sparsity == -1 ? 2 : 4, m_of = c.sparsity == -1 ? 4 : 8;
            w = at::randn({c.n, c.k}, gen);
            const at::Tensor g = w.abs().reshape({c.n, -1, m_of});
            const at::Tensor keep = g >= std::get<0>(g.topk(n_of, -1)).narrow(-1, n_of - 1, 1);
            w = w * keep.reshape({c.n, c.k});
          } else {
            w = make_weight(c, kc::BlockShape{}, gen);
          }
          w = w.to(wt);
          at::Tensor bias = c.bias ? at::randn({c.n}, gen) : at::Tensor();
          at::Tensor x = at::randn({c.m, c.k}, gen).to(xt);
          at::Tensor ref = reference(x, w, bias, c.act);
          // Rows in tiles of 1 and of 4 (the last tile padded when 4 does not divide n), and
          // panels of 16 rows.
          for (int tile : {1, 4, 16}) {
            kc::MaskedWeight mw(w, bias, tile);
            SCOPED_TRACE(describe(c, isa, kc::BlockShape{}, kc::Algo::kRows) +
                         " masked tile=" + std::to_string(tile) + " w=" + c10::toString(wt) +
                         " x=" + c10::toString(xt));
            ASSERT_EQ(mw.tile(), tile);
            ASSERT_EQ(mw.nonzeros(), w.count_nonzero().item<int64_t>());
            ASSERT_EQ(mw.bf16(), wt == at::kBFloat16);
            if (c.sparsity < 0 && c.k % 16 == 0) ASSERT_TRUE(mw.fixed());
            if (c.sparsity < 0) ASSERT_EQ(mw.pairs(), c.sparsity == -1);
            if (!mw.runs_on(isa)) {
              ASSERT_THROW(mw.linear(x, c.act, isa), lopper::Error);
              continue;
            }
            fixed += mw.fixed();
            pairs += mw.pairs();
            at::Tensor y = mw.linear(x, c.act, isa);
            ASSERT_EQ(y.scalar_type(), xt);
            ASSERT_EQ(y.sizes(), ref.sizes());
            // float32 sums; bfloat16 activations come back rounded to bfloat16
            ASSERT_LT(nmse(y, ref), xt == at::kFloat ? 1e-10 : 1e-4);
            ++checked;
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 200);
  EXPECT_GT(fixed, 0);
  EXPECT_GT(pairs, 0);
}

// A network's first layer read from its NCHW planes (1 to 4 channels), wide enough for the kernel
// vectorised over output pixels: every output-channel count's passes (8 to 64, partial ones), both
// strides, padding, dilation, batches, bias, activations; against ATen in float64.
TEST(DenseConvKernels, FirstLayersFromPlanesMatchAten) {
  std::mt19937 rng(11);
  at::Generator gen = at::detail::createCPUGenerator(11);
  int cases = 0;
  for (kc::Isa isa : isas()) {
    for (int it = 0; it < 60; ++it) {
      const int64_t c = 1 + rng() % 4, n = 1 + rng() % 2;
      const int64_t k = std::vector<int64_t>{8, 12, 16, 24, 29, 32, 40, 48, 64}[it % 9];
      const int64_t kh = std::vector<int64_t>{3, 3, 5, 7, 1}[rng() % 5], kw = kh;
      kc::DirectConv::Geometry g;
      g.sh = g.sw = 1 + rng() % 2;
      g.ph = g.pw = kh / 2;
      if (it % 7 == 3) g.dh = g.dw = 2, g.ph = g.pw = kh - 1;
      const int64_t h = 9 + rng() % 20, w = 32 + rng() % 60;
      const at::Tensor weight = at::randn({k, c, kh, kw}, gen);
      const at::Tensor bias = rng() % 2 ? at::randn({k}, gen) : at::Tensor();
      const at::Tensor x = at::randn({n, c, h, w}, gen);  // NCHW: read from its planes
      const kc::Activation act = random_activation(rng);
      const kc::DirectConv conv(weight, bias, 1, g, isa);
      const at::Tensor y = conv.run(x, at::Tensor(), act);
      const at::Tensor ref = activation_reference(
          at::convolution(x.to(at::kDouble), weight.to(at::kDouble),
                          bias.defined() ? bias.to(at::kDouble) : at::Tensor(), {g.sh, g.sw},
                          {g.ph, g.pw}, {g.dh, g.dw}, false, {0, 0}, 1),
          act);
      const std::string what = std::string(kc::isa_name(isa)) + " " + std::to_string(n) + "x" +
                               std::to_string(c) + "x" + std::to_string(h) + "x" +
                               std::to_string(w) + " k " + std::to_string(k) + " kernel " +
                               std::to_string(kh) + " stride " + std::to_string(g.sh) +
                               " dilation " + std::to_string(g.dh);
      ASSERT_EQ(y.sizes(), ref.sizes()) << what;
      ASSERT_TRUE(y.is_contiguous(at::MemoryFormat::ChannelsLast)) << what;
      const double err = (y.to(at::kDouble) - ref).abs().max().item<double>();
      EXPECT_LE(err, 1e-4 * (1 + ref.abs().max().item<double>())) << what;
      ++cases;
    }
  }
  EXPECT_GE(cases, 60);
}

// Random geometries (strides, padding, dilation, odd and single channel counts, images smaller
// than the kernel's reach, batches of 1 and 2), with and without bias and residual, every fused
// activation, inputs in either layout: each ISA's direct, grouped and depthwise kernels against
// ATen's convolution in float64.
TEST(DenseConvKernels, EveryIsaAndGeometryMatchesAtenConvolution) {
  std::mt19937 rng(7);
  at::Generator gen = at::detail::createCPUGenerator(7);
  int cases = 0, in_place = 0;
  for (kc::Isa isa : isas()) {
    for (int it = 0; it < 400; ++it) {
      const bool dw = it % 4 == 0, grouped = it % 4 == 1;
      const int64_t n = 1 + rng() % 2, h = 1 + rng() % 14;
      int64_t w = 1 + rng() % 17;
      // grouped: 2 to 5 groups of 1 to 24 input and 1 to 24 output channels each (one input
      // channel per group and more outputs: depthwise with a multiplier, the grouped kernel's)
      const int64_t group = dw ? 0 : grouped ? 2 + rng() % 4 : 1;
      int64_t c = dw ? 1 + rng() % 70 : std::vector<int64_t>{1, 3, 5, 16, 24, 37}[rng() % 6];
      int64_t k = dw ? c : std::vector<int64_t>{1, 7, 8, 16, 17, 40, 96}[rng() % 7];
      if (grouped) {
        c = group * std::vector<int64_t>{1, 3, 8, 16, 24}[rng() % 5];
        k = group * std::vector<int64_t>{1, 2, 5, 16, 24}[rng() % 5];
      }
      // narrow groups (2, 4 or 8 channels in and out, whole groups to a vector): up to 41 groups,
      // so that the last vector of channels is partial (3 groups of 2: 6 of 8 or 16 lanes)
      const bool narrow = grouped && it % 8 == 5;
      int64_t narrow_groups = 0;
      if (narrow) {
        narrow_groups = 2 + rng() % 40;
        c = k = narrow_groups * std::vector<int64_t>{2, 4, 8}[rng() % 3];
      }
      int64_t kh = 1 + rng() % 5, kw = 1 + rng() % 5;
      kc::DirectConv::Geometry g;
      g.sh = 1 + rng() % 2, g.sw = 1 + rng() % 2, g.ph = rng() % 3, g.pw = rng() % 3;
      g.dh = 1 + rng() % 2, g.dw = 1 + rng() % 2;
      if (dw && it % 2 == 0) {  // the common 3x3 depthwise layer, wide enough for its fast path
        kh = kw = 3, g.dh = g.dw = 1, w += 16;
      }
      const int64_t spare_h = h + 2 * g.ph - g.dh * (kh - 1) - 1;
      const int64_t spare_w = w + 2 * g.pw - g.dw * (kw - 1) - 1;
      if (spare_h < 0 || spare_w < 0) continue;  // the kernel reaches past the padded input
      const int64_t oh = spare_h / g.sh + 1, ow = spare_w / g.sw + 1;
      const int64_t groups = dw ? c : narrow ? narrow_groups : group;
      const at::Tensor weight = at::randn({k, c / groups, kh, kw}, gen);
      const at::Tensor bias = rng() % 2 ? at::randn({k}, gen) : at::Tensor();
      at::Tensor x = at::randn({n, c, h, w}, gen);
      if (rng() % 2) x = x.contiguous(at::MemoryFormat::ChannelsLast);
      const at::Tensor res = rng() % 2 ? at::randn({n, k, oh, ow}, gen) : at::Tensor();
      const kc::Activation act = random_activation(rng);
      ASSERT_TRUE(kc::DirectConv::takes(weight, groups, c));
      const kc::DirectConv conv(weight, bias, groups, g, isa);
      // one channel: the direct kernel; one channel in and out per group: depthwise
      ASSERT_EQ(conv.depthwise(), groups > 1 && c == groups && k == groups);
      ASSERT_EQ(conv.groups(), conv.depthwise() ? 1 : groups);
      const at::Tensor y = conv.run(x, res, act);
      at::Tensor ref =
          at::convolution(x.to(at::kDouble), weight.to(at::kDouble),
                          bias.defined() ? bias.to(at::kDouble) : at::Tensor(), {g.sh, g.sw},
                          {g.ph, g.pw}, {g.dh, g.dw}, false, {0, 0}, groups);
      if (res.defined()) ref = ref + res.to(at::kDouble);
      ref = activation_reference(ref, act);
      const std::string what =
          std::string(kc::isa_name(isa)) + " " + conv.name() + " groups " + std::to_string(groups) +
          " x " + std::to_string(n) + "x" + std::to_string(c) + "x" + std::to_string(h) + "x" +
          std::to_string(w) + " k " + std::to_string(k) + " kernel " + std::to_string(kh) + "x" +
          std::to_string(kw) + " case " + std::to_string(it);
      ASSERT_EQ(y.sizes(), ref.sizes()) << what;
      ASSERT_TRUE(y.is_contiguous(at::MemoryFormat::ChannelsLast)) << what;
      const double err = (y.to(at::kDouble) - ref).abs().max().item<double>();
      EXPECT_LE(err, 1e-4 * (1 + ref.abs().max().item<double>())) << what;
      if (conv.gathers()) {  // the groups read in place: the executor's other candidate
        const at::Tensor yi = conv.run(x, res, act, true);
        ASSERT_TRUE(yi.is_contiguous(at::MemoryFormat::ChannelsLast)) << what;
        EXPECT_LE((yi.to(at::kDouble) - ref).abs().max().item<double>(),
                  1e-4 * (1 + ref.abs().max().item<double>()))
            << what << " in place";
        ++in_place;
      }
      ++cases;
    }
  }
  EXPECT_GT(cases, 300);
  EXPECT_GT(in_place, 30);
  // The depthwise kernel on small maps (5x5: a padded plane per vector of channels; 3x3: rows),
  // strides 1 and 2, 7x7 and 14x14 maps, odd channel counts, batch 2, bias, residual, ReLU.
  for (kc::Isa isa : isas())
    for (int64_t kernel : {3, 5})
      for (int64_t stride : {1, 2})
        for (int64_t side : {7, 14})
          for (int64_t c : {5, 37, 200}) {
            kc::DirectConv::Geometry g;
            g.sh = g.sw = stride, g.ph = g.pw = kernel / 2;
            const at::Tensor weight = at::randn({c, 1, kernel, kernel}, gen);
            const at::Tensor bias = at::randn({c}, gen);
            const at::Tensor x = at::randn({2, c, side, side}, gen);
            const int64_t o = (side + 2 * g.ph - kernel) / stride + 1;
            const at::Tensor res = at::randn({2, c, o, o}, gen);
            kc::Activation relu;
            relu.kind = kc::Activation::kRelu;
            const kc::DirectConv conv(weight, bias, c, g, isa);
            const at::Tensor y = conv.run(x, res, relu);
            const at::Tensor ref = at::relu(
                at::convolution(x.to(at::kDouble), weight.to(at::kDouble), bias.to(at::kDouble),
                                {stride, stride}, {g.ph, g.pw}, {1, 1}, false, {0, 0}, c) +
                res.to(at::kDouble));
            ASSERT_EQ(y.sizes(), ref.sizes());
            EXPECT_LE((y.to(at::kDouble) - ref).abs().max().item<double>(),
                      1e-4 * (1 + ref.abs().max().item<double>()))
                << kc::isa_name(isa) << " " << kernel << "x" << kernel << " stride " << stride
                << " side " << side << " channels " << c;
          }
  // Maps wide enough for tiles inside the input beside tiles that touch the padding (the dense
  // kernel reads the input unpadded): RegNet's 112x112 stride-2 grouped layer, the 3-channel first
  // layers read from NCHW planes (3x3 stride 2, 7x7 stride 2 pad 3), a 5x5 kernel padded 2 of
  // odd channels, a 3x3 of dilation 2 padded 2, batch 2.
  struct Layer {
    int64_t n, c, k, side, kernel, stride, pad, dilation, group;
    bool nchw;
  };
  const Layer layers[] = {
      {1, 64, 64, 112, 3, 2, 1, 1, 4, false},
      {2, 3, 32, 64, 3, 2, 1, 1, 1, true},
      {1, 3, 64, 60, 7, 2, 3, 1, 1, true},
      {2, 13, 29, 31, 5, 1, 2, 1, 1, false},
      {1, 32, 48, 40, 3, 1, 2, 2, 2, false},
      // narrow groups: a ResNeXt pruned to half (32 groups of 2, 4 and 8 at
      // 56, 28 and 14, 3x3 stride 1 and 2), and 5 groups of 4 (a partial vector)
      {2, 64, 64, 56, 3, 1, 1, 1, 32, false},
      {1, 128, 128, 28, 3, 1, 1, 1, 32, true},
      {1, 128, 128, 57, 3, 2, 1, 1, 32, false},
      {2, 256, 256, 14, 3, 1, 1, 1, 32, false},
      {1, 20, 20, 17, 3, 1, 1, 1, 5, false},
      {1, 20, 20, 9, 3, 1, 0, 1, 5, false}};
  for (kc::Isa isa : isas())
    for (const Layer& l : layers) {
      kc::DirectConv::Geometry g;
      g.sh = g.sw = l.stride, g.ph = g.pw = l.pad, g.dh = g.dw = l.dilation;
      const at::Tensor weight = at::randn({l.k, l.c / l.group, l.kernel, l.kernel}, gen);
      const at::Tensor bias = at::randn({l.k}, gen);
      at::Tensor x = at::randn({l.n, l.c, l.side, l.side}, gen);
      if (!l.nchw) x = x.contiguous(at::MemoryFormat::ChannelsLast);
      kc::Activation relu;
      relu.kind = kc::Activation::kRelu;
      const kc::DirectConv conv(weight, bias, l.group, g, isa);
      const at::Tensor ref = at::relu(at::convolution(
          x.to(at::kDouble), weight.to(at::kDouble), bias.to(at::kDouble), {l.stride, l.stride},
          {l.pad, l.pad}, {l.dilation, l.dilation}, false, {0, 0}, l.group));
      for (bool in_place : {false, true}) {
        if (in_place && !conv.gathers()) continue;
        const at::Tensor y = conv.run(x, {}, relu, in_place);
        ASSERT_EQ(y.sizes(), ref.sizes());
        EXPECT_LE((y.to(at::kDouble) - ref).abs().max().item<double>(),
                  1e-4 * (1 + ref.abs().max().item<double>()))
            << kc::isa_name(isa) << " " << l.c << " -> " << l.k << " side " << l.side << " kernel "
            << l.kernel << " stride " << l.stride << " pad " << l.pad
            << (in_place ? " in place" : "");
      }
    }
  // Groups that do not divide the channels, and a non-float weight, are not taken.
  EXPECT_FALSE(kc::DirectConv::takes(at::randn({8, 3, 3, 3}), 4, 8));
  EXPECT_FALSE(kc::DirectConv::takes(at::randn({6, 2, 3, 3}), 4, 8));
  EXPECT_FALSE(kc::DirectConv::takes(at::randn({8, 2, 3, 3}), 3, 6));
  EXPECT_FALSE(kc::DirectConv::takes(at::randn({8, 8, 3, 3}).to(at::kDouble), 1, 8));
}

// A bf16 dense or grouped layer on the bfloat16 dot product (DirectConv::takes_bf16: bf16 in,
// residual and out) against ATen's convolution in float64 on the same bf16 values (the weight exact
// in bf16, as a bf16 model's) rounded to bf16: 1x1, 3x3, 5x5 and 7x1 kernels, strides 1 and 2,
// padding (tiles that touch it and tiles that do not), dilation; channel counts around the
// 48-channel blocks and vector tails, maps of a few pixels to many (tiles of 7 and 8 pixels, a
// partial last one), batches, bias, residual and every activation; NaN and infinities as ATen's; an
// empty batch. Layers it does not take keep float32 only.
TEST(DenseConvKernels, DenseBf16MatchesAten) {
  const kc::Isa isa = kc::Isa::kAvx512;
  if (!has_bf16_dot()) GTEST_SKIP();
  std::mt19937 rng(71);
  at::Generator gen = at::detail::createCPUGenerator(71);
  struct Window {
    int64_t kh, kw, stride, pad, dil;
  };
  const std::vector<Window> windows = {{1, 1, 1, 0, 1}, {1, 1, 2, 0, 1}, {3, 3, 1, 1, 1},
                                       {3, 3, 2, 1, 1}, {3, 3, 1, 0, 1}, {5, 5, 1, 2, 1},
                                       {3, 3, 1, 2, 2}, {7, 1, 1, 3, 1}, {1, 1, 1, 1, 1}};
  int checked = 0;
  for (int it = 0; it < 90; ++it) {
    const Window win = windows[it % windows.size()];
    // Every third case grouped: 2 to 4 groups of an even channel count in (not the narrow
    // kernel's 2, 4 or 8 in and out), each group on its slice of the channels in place.
    const int64_t groups = it % 3 == 2 ? 2 + rng() % 3 : 1;
    int64_t c = std::vector<int64_t>{2, 8, 16, 24, 64, 130}[rng() % 6];
    int64_t k = std::vector<int64_t>{1, 7, 16, 24, 48, 50, 97}[rng() % 7];
    if (groups > 1) {
      c = groups * std::vector<int64_t>{6, 10, 16, 32}[rng() % 4];
      k = groups * std::vector<int64_t>{5, 16, 24}[rng() % 3];
    }
    const int64_t n = 1 + rng() % 2, h = 1 + rng() % 9, w = 1 + rng() % 17;
    const int64_t reach_h = (win.kh - 1) * win.dil + 1, reach_w = (win.kw - 1) * win.dil + 1;
    if (h + 2 * win.pad < reach_h || w + 2 * win.pad < reach_w) continue;  // no output
    kc::DirectConv::Geometry g;
    g.sh = g.sw = win.stride, g.ph = g.pw = win.pad, g.dh = g.dw = win.dil;
    const at::Tensor wt =
        (at::randn({k, c / groups, win.kh, win.kw}, gen) / win.kh).to(at::kBFloat16).to(at::kFloat);
    const at::Tensor bias = rng() % 2 ? at::randn({k}, gen) : at::Tensor();
    const kc::DirectConv conv(wt, bias, groups, g, isa, true);
    ASSERT_TRUE(conv.takes_bf16());
    ASSERT_FALSE(kc::DirectConv(wt, bias, groups, g, isa).takes_bf16());  // float32 only
    at::Tensor x = at::randn({n, c, h, w}, gen);
    if (it % 5 == 0) {  // non-finite inputs
      x.view(-1)[0] = NAN;
      x.view(-1)[x.numel() - 1] = INFINITY;
    }
    const at::Tensor xb = x.to(at::kBFloat16).contiguous(at::MemoryFormat::ChannelsLast);
    at::Tensor ref = at::convolution(xb.to(at::kDouble), wt.to(at::kDouble),
                                     bias.defined() ? bias.to(at::kDouble) : at::Tensor(),
                                     {win.stride, win.stride}, {win.pad, win.pad},
                                     {win.dil, win.dil}, false, {0, 0}, groups);
    const at::Tensor res = rng() % 2 ? at::randn(ref.sizes(), gen).to(at::kBFloat16) : at::Tensor();
    const kc::Activation act = random_activation(rng);
    const at::Tensor y = conv.run(xb, res, act);
    if (res.defined()) ref = ref + res.to(at::kDouble);
    ref = activation_reference(ref, act);
    const std::string what = "case " + std::to_string(it) + " " + std::to_string(c) + " -> " +
                             std::to_string(k) + " groups " + std::to_string(groups) + " " +
                             std::to_string(h) + "x" + std::to_string(w) + " kernel " +
                             std::to_string(win.kh) + "x" + std::to_string(win.kw) + " stride " +
                             std::to_string(win.stride) + " pad " + std::to_string(win.pad) +
                             " dilation " + std::to_string(win.dil);
    ASSERT_EQ(y.scalar_type(), at::kBFloat16) << what;
    ASSERT_EQ(y.sizes(), ref.sizes()) << what;
    ASSERT_TRUE(y.is_contiguous(at::MemoryFormat::ChannelsLast)) << what;
    EXPECT_TRUE(at::equal(at::isnan(y), at::isnan(ref))) << what;
    const at::Tensor finite = at::isfinite(ref);
    // float32 sums of exact products, rounded once to bf16 (the reference: rounded too); a sum of
    // a few thousand terms (7 x 130) flips the odd rounding at a bf16 boundary (each flip 1.5e-5
    // of its value, squared)
    const double flips = win.kh * win.kw == 1 ? 1e-10 : 1e-8;
    EXPECT_LT(nmse(y.masked_select(finite), ref.to(at::kBFloat16).masked_select(finite)), flips)
        << what;
    EXPECT_LT(nmse(y.masked_select(finite), ref.masked_select(finite)), 1e-5) << what;
    EXPECT_EQ(conv.run(xb.narrow(0, 0, 0), {}, act).size(0), 0) << what;
    ++checked;
  }
  EXPECT_GE(checked, 75);
  // Subnormal results rounded as ATen rounds them (vcvtneps2bf16 would make them zeros): a zero
  // weight passes a subnormal bf16 residual through, bit for bit.
  {
    kc::DirectConv::Geometry same;
    same.ph = same.pw = 1;
    const kc::DirectConv zero(at::zeros({16, 16, 3, 3}), {}, 1, same, isa, true);
    const auto cl = at::MemoryFormat::ChannelsLast;
    const at::Tensor res = (at::rand({1, 16, 5, 5}, gen) * 1e-39).to(at::kBFloat16).contiguous(cl);
    const at::Tensor y =
        zero.run(at::randn({1, 16, 5, 5}, gen).to(at::kBFloat16).contiguous(cl), res, {});
    EXPECT_TRUE(at::equal(y, res));
    EXPECT_GT(at::count_nonzero(res).item<int64_t>(), 0);
  }
  // An odd channel count past a first layer's 4 (a group's too), narrow groups, a depthwise
  // layer: float32 only.
  EXPECT_FALSE(kc::DirectConv(at::randn({8, 5, 1, 1}), {}, 1, {}, isa, true).takes_bf16());
  EXPECT_FALSE(kc::DirectConv(at::randn({8, 5, 3, 3}), {}, 1, {}, isa, true).takes_bf16());
  EXPECT_FALSE(kc::DirectConv(at::randn({8, 3, 3, 3}), {}, 2, {}, isa, true).takes_bf16());
  EXPECT_FALSE(kc::DirectConv(at::randn({8, 4, 1, 1}), {}, 2, {}, isa, true).takes_bf16());
  EXPECT_FALSE(kc::DirectConv(at::randn({8, 1, 3, 3}), {}, 8, {}, isa, true).takes_bf16());
  const kc::DirectConv odd(at::randn({8, 5, 1, 1}), {}, 1, {}, isa, true);
  EXPECT_THROW(odd.run(at::randn({1, 5, 3, 3}).to(at::kBFloat16), {}, {}), lopper::Error);
  // A map the kernel does not fit: the one-line error, in bf16 as in float32.
  const kc::DirectConv big(at::randn({8, 8, 5, 5}), {}, 1, {}, isa, true);
  EXPECT_THROW(big.run(at::randn({1, 8, 3, 3}).to(at::kBFloat16), {}, {}), lopper::Error);
  // Its bf16 pairs alone (keep_bf16_only): the same bf16 result; a float32 x refused in one line.
  // Where no pairs are packed (an odd channel count) the float32 packing stays.
  {
    const at::Tensor w = at::randn({24, 16, 1, 1}, gen), b = at::randn({24}, gen);
    const at::Tensor x = at::randn({1, 16, 4, 5}, gen).to(at::kBFloat16);
    kc::DirectConv both(w, b, 1, {}, isa, true), lean(w, b, 1, {}, isa, true);
    lean.keep_bf16_only();
    EXPECT_TRUE(at::equal(lean.run(x, {}, {}), both.run(x, {}, {})));
    EXPECT_THROW(lean.run(x.to(at::kFloat), {}, {}), lopper::Error);
    kc::DirectConv odd_lean(at::randn({8, 5, 1, 1}), {}, 1, {}, isa, true);
    odd_lean.keep_bf16_only();
    EXPECT_EQ(odd_lean.run(at::randn({1, 5, 3, 3}), {}, {}).size(1), 8);
  }
}

// A bf16 first layer of 1-4 planes (a bf16 model's input, NCHW) by its kernel rows' taps in bf16
// pairs (DirectConv::takes_bf16 for any channel count up to 4), against ATen's convolution in
// float64 on the same bf16 values rounded to bf16: odd and even kernel widths (the last tap of an
// odd one paired with a zero), strides 1 to 4, padding, dilation along rows, output rows of fewer
// pixels than a tile and not a multiple of it, 1 to 97 output channels (partial blocks of 32 and
// vectors of 16), bias and every activation. An infinity right past a pixel's window (read with
// its odd tap's pair, weighed by zero) leaves that pixel finite, as in ATen. A channels-last input
// or a residual runs in float32 and agrees too.
TEST(DenseConvKernels, PlanarBf16MatchesAten) {
  const kc::Isa isa = kc::Isa::kAvx512;
  if (!has_bf16_dot()) GTEST_SKIP();
  std::mt19937 rng(73);
  at::Generator gen = at::detail::createCPUGenerator(73);
  struct Window {
    int64_t kh, kw, sh, sw, ph, pw, dh;
  };
  const std::vector<Window> windows = {
      {3, 3, 2, 2, 1, 1, 1}, {7, 7, 2, 2, 3, 3, 1}, {1, 1, 1, 1, 0, 0, 1}, {5, 5, 1, 1, 2, 2, 1},
      {3, 3, 1, 1, 0, 0, 1}, {4, 4, 4, 4, 0, 0, 1}, {3, 3, 1, 2, 2, 1, 2}, {2, 3, 2, 1, 0, 1, 1}};
  int checked = 0;
  for (int it = 0; it < 64; ++it) {
    const Window win = windows[it % windows.size()];
    const int64_t c = 1 + rng() % 4;
    const int64_t k = std::vector<int64_t>{1, 16, 24, 32, 40, 64, 97}[rng() % 7];
    const int64_t n = 1 + rng() % 2, h = 1 + rng() % 20, w = 1 + rng() % 40;
    if (h + 2 * win.ph < (win.kh - 1) * win.dh + 1 || w + 2 * win.pw < win.kw) continue;
    kc::DirectConv::Geometry g;
    g.sh = win.sh, g.sw = win.sw, g.ph = win.ph, g.pw = win.pw, g.dh = win.dh;
    const at::Tensor wt =
        (at::randn({k, c, win.kh, win.kw}, gen) / win.kh).to(at::kBFloat16).to(at::kFloat);
    const at::Tensor bias = rng() % 2 ? at::randn({k}, gen) : at::Tensor();
    const kc::DirectConv conv(wt, bias, 1, g, isa, true);
    ASSERT_TRUE(conv.takes_bf16());
    at::Tensor x = at::randn({n, c, h, w}, gen);
    if (it % 4 == 0) {  // an infinity where the odd last tap's pair reads past a window
      x[0][0][h / 2][std::min<int64_t>(w - 1, win.kw - win.pw)] = INFINITY;
      x.view(-1)[x.numel() - 1] = NAN;
    }
    const at::Tensor xb = x.to(at::kBFloat16);
    at::Tensor ref =
        at::convolution(xb.to(at::kDouble), wt.to(at::kDouble),
                        bias.defined() ? bias.to(at::kDouble) : at::Tensor(), {win.sh, win.sw},
                        {win.ph, win.pw}, {win.dh, 1}, false, {0, 0}, 1);
    const kc::Activation act = random_activation(rng);
    const std::string what = "case " + std::to_string(it) + " " + std::to_string(c) + " -> " +
                             std::to_string(k) + " " + std::to_string(h) + "x" + std::to_string(w) +
                             " kernel " + std::to_string(win.kh) + "x" + std::to_string(win.kw) +
                             " stride " + std::to_string(win.sh) + "," + std::to_string(win.sw);
    // planes as they come; channels-last; planes with a residual (the last two in float32)
    for (int form = 0; form < 3; ++form) {
      const at::Tensor in = form == 1 ? xb.contiguous(at::MemoryFormat::ChannelsLast) : xb;
      const at::Tensor res =
          form == 2 ? at::randn(ref.sizes(), gen).to(at::kBFloat16) : at::Tensor();
      at::Tensor want = res.defined() ? ref + res.to(at::kDouble) : ref;
      want = activation_reference(want, act);
      const at::Tensor y = conv.run(in, res, act);
      const std::string where = what + " form " + std::to_string(form);
      ASSERT_EQ(y.scalar_type(), at::kBFloat16) << where;
      ASSERT_EQ(y.sizes(), want.sizes()) << where;
      ASSERT_TRUE(y.is_contiguous(at::MemoryFormat::ChannelsLast)) << where;
      EXPECT_TRUE(at::equal(at::isnan(y), at::isnan(want))) << where;
      const at::Tensor finite = at::isfinite(want);
      EXPECT_TRUE(at::equal(at::isfinite(y), finite)) << where;
      EXPECT_LT(nmse(y.masked_select(finite), want.to(at::kBFloat16).masked_select(finite)), 1e-8)
          << where;
    }
    EXPECT_EQ(conv.run(xb.narrow(0, 0, 0), {}, act).size(0), 0) << what;
    ++checked;
  }
  EXPECT_GE(checked, 50);
  // Dilation along a row is not taken for bf16 planes: float32 only.
  kc::DirectConv::Geometry wide;
  wide.dw = 2;
  EXPECT_FALSE(kc::DirectConv(at::randn({8, 3, 3, 3}), {}, 1, wide, isa, true).takes_bf16());
}

// The chain's three convolutions by ATen in float64 (x and res float64).
static at::Tensor chain_reference(const at::Tensor& x,
                                  const std::optional<kc::ConvChain::Pointwise>& expand,
                                  const at::Tensor& dw, const at::Tensor& dw_b,
                                  const kc::DirectConv::Geometry& g, const kc::Activation& dw_act,
                                  const std::optional<kc::ConvChain::Pointwise>& project,
                                  const at::Tensor& res, int64_t groups) {
  auto d = [](const at::Tensor& t) { return t.defined() ? t.to(at::kDouble) : at::Tensor(); };
  at::Tensor ref = x;
  if (expand)
    ref = activation_reference(
        at::convolution(ref, d(expand->w), d(expand->b), {1, 1}, {0, 0}, {1, 1}, false, {0, 0}, 1),
        expand->act);
  ref = at::convolution(ref, d(dw), d(dw_b), {g.sh, g.sw}, {g.ph, g.pw}, {g.dh, g.dw}, false,
                        {0, 0}, groups);
  if (!project) {
    if (res.defined()) ref = ref + res;
    return activation_reference(ref, dw_act);
  }
  ref = at::convolution(activation_reference(ref, dw_act), d(project->w), d(project->b), {1, 1},
                        {0, 0}, {1, 1}, false, {0, 0}, 1);
  if (res.defined()) ref = ref + res;
  return activation_reference(ref, project->act);
}

// The inverted residual's chain (expansion, depthwise, projection; any two of them) and the
// ResNeXt bottleneck's (the middle convolution in groups of 2, 4 or 8 channels, the narrow-group
// kernel's, up to 11 groups: vectors of channels filled in part) against ATen's three
// convolutions in float64: random geometries (strides, padding, dilation, kernels up to 5x5, maps
// smaller than the kernel's reach skipped), odd channel counts, batches of 1 to 3 (bands of rows
// per image and images per thread), 1 and 2 threads, each stage's activation, bias or none,
// residual or none.
TEST(DenseConvKernels, ConvChainEveryIsaMatchesAtenConvolutions) {
  std::mt19937 rng(13);
  at::Generator gen = at::detail::createCPUGenerator(13);
  const int threads = at::get_num_threads();
  int cases = 0, pair_cases = 0, narrow_cases = 0;
  for (kc::Isa isa : isas()) {
    for (int it = 0; it < 160; ++it) {
      // Every 7th case the middle convolution alone (a bf16 layer run row by row).
      const bool alone = it % 7 == 3;
      const bool has_expand = !alone && it % 3 != 2, has_project = !alone && it % 3 != 1;
      const int64_t n = 1 + rng() % 3, h = 1 + rng() % 13, w = 1 + rng() % 20;
      // Every 4th case a grouped middle convolution of `width` channels a group.
      const int64_t width = it % 4 == 1 ? std::vector<int64_t>{2, 4, 8}[rng() % 3] : 1;
      int64_t c = std::vector<int64_t>{3, 8, 16, 24}[rng() % 4];
      int64_t m = has_expand ? std::vector<int64_t>{5, 16, 48, 72}[rng() % 4] : c;
      if (width > 1) {
        m = width * (1 + rng() % 11);
        if (!has_expand) c = m;
      }
      const int64_t groups = m / width;
      const int64_t k = std::vector<int64_t>{7, 16, 24}[rng() % 3];
      int64_t kh = 1 + rng() % 5, kw = 1 + rng() % 5;
      kc::DirectConv::Geometry g;
      g.sh = 1 + rng() % 2, g.sw = 1 + rng() % 2, g.ph = rng() % 3, g.pw = rng() % 3;
      g.dh = 1 + rng() % 2, g.dw = 1 + rng() % 2;
      if (it % 2 == 0) kh = kw = 3, g.dh = g.dw = 1, g.ph = g.pw = 1;  // MobileNet's
      const int64_t spare_h = h + 2 * g.ph - g.dh * (kh - 1) - 1;
      const int64_t spare_w = w + 2 * g.pw - g.dw * (kw - 1) - 1;
      if (spare_h < 0 || spare_w < 0) continue;
      const int64_t oh = spare_h / g.sh + 1, ow = spare_w / g.sw + 1;
      auto bias = [&](int64_t size) { return rng() % 2 ? at::randn({size}, gen) : at::Tensor(); };
      // 1x1 weights exact in bf16, as a bf16 model's (the dot product rounds them).
      auto bf16_exact = [](const at::Tensor& t) { return t.to(at::kBFloat16).to(at::kFloat); };
      std::optional<kc::ConvChain::Pointwise> expand, project;
      if (has_expand)
        expand = kc::ConvChain::Pointwise{bf16_exact(at::randn({m, c, 1, 1}, gen)), bias(m),
                                          random_activation(rng)};
      const at::Tensor dw = at::randn({m, width, kh, kw}, gen), dw_b = bias(m);
      const kc::Activation dw_act = random_activation(rng);
      if (has_project)
        project = kc::ConvChain::Pointwise{bf16_exact(at::randn({k, m, 1, 1}, gen)), bias(k),
                                           random_activation(rng)};
      const int64_t out_c = has_project ? k : m;
      const at::Tensor x = at::randn({n, c, h, w}, gen);
      const at::Tensor res = rng() % 2 ? at::randn({n, out_c, oh, ow}, gen) : at::Tensor();
      // The narrow kernel takes groups narrower than the ISA's vector, dividing it.
      const bool taken = width == 1 || kc::conv_isa_ops(isa).narrow_takes(width);
      ASSERT_EQ(kc::ConvChain::takes(expand ? &*expand : nullptr, dw, project ? &*project : nullptr,
                                     alone, isa),
                taken)
          << kc::isa_name(isa) << " case " << it << " width " << width;
      if (!taken) continue;
      narrow_cases += width > 1;
      const kc::ConvChain chain(expand, dw, dw_b, g, dw_act, project, isa, true);
      at::set_num_threads(1 + it % 2);
      const at::Tensor y = chain.run(x, res);
      // bfloat16 rows in and out. Widened: the float32 chain on the same values, rounded once
      // (bit for bit: the rows are widened exactly and the arithmetic is the same). On the dot
      // product (pairs()): the reference below on the bf16 values, within bf16's rounding of the
      // projection's input and of the output.
      const at::Tensor xb = x.to(at::kBFloat16);
      const at::Tensor rb = res.defined() ? res.to(at::kBFloat16) : at::Tensor();
      const at::Tensor yb = chain.run(xb, rb);
      const at::Tensor yb_want =
          chain.run(xb.to(at::kFloat), rb.defined() ? rb.to(at::kFloat) : rb).to(at::kBFloat16);
      at::set_num_threads(threads);
      ASSERT_EQ(yb.scalar_type(), at::kBFloat16);
      ASSERT_TRUE(yb.is_contiguous(at::MemoryFormat::ChannelsLast));
      if (!chain.pairs())
        ASSERT_TRUE(at::equal(yb, yb_want)) << kc::isa_name(isa) << " bf16 case " << it;
      auto d = [](const at::Tensor& t) { return t.defined() ? t.to(at::kDouble) : at::Tensor(); };
      if (chain.pairs()) {
        const at::Tensor refb =
            chain_reference(d(xb), expand, dw, dw_b, g, dw_act, project, d(rb), groups);
        EXPECT_LT(nmse(yb, refb), 1e-4) << kc::isa_name(isa) << " bf16 pairs case " << it;
        ++pair_cases;
      }
      const at::Tensor ref =
          chain_reference(x.to(at::kDouble), expand, dw, dw_b, g, dw_act, project, d(res), groups);
      const std::string what = std::string(kc::isa_name(isa)) + " case " + std::to_string(it) +
                               " " + std::to_string(n) + "x" + std::to_string(c) + "x" +
                               std::to_string(h) + "x" + std::to_string(w) + " m " +
                               std::to_string(m) + " groups " + std::to_string(groups) +
                               " kernel " + std::to_string(kh) + "x" + std::to_string(kw);
      ASSERT_EQ(y.sizes(), ref.sizes()) << what;
      ASSERT_TRUE(y.is_contiguous(at::MemoryFormat::ChannelsLast)) << what;
      EXPECT_LE((y.to(at::kDouble) - ref).abs().max().item<double>(),
                1e-4 * (1 + ref.abs().max().item<double>()))
          << what;
      ++cases;
    }
  }
  EXPECT_GT(cases, 250);
  if (isas().size() > 1) EXPECT_GT(narrow_cases, 40);
  // A bf16 bottleneck whose narrow groups (2, 4 and 8 channels; strides 1 and 2) run on the dot
  // product too, end to end with no activation to hide an error: ATen's convolutions in float64
  // on the same bf16 values, the weights exact in bf16 (what is left: the expanded rows and the
  // middle row rounded to bf16).
  if (kc::bf16_dot_supported(kc::Isa::kAvx512)) {
    auto exact = [](const at::Tensor& t) { return t.to(at::kBFloat16).to(at::kFloat); };
    for (int64_t width : {2, 4, 8})
      for (int64_t stride : {1, 2}) {
        const int64_t c = 16, m = width * 5, k = 24;
        kc::DirectConv::Geometry g;
        g.sh = g.sw = stride, g.ph = g.pw = 1;
        const kc::ConvChain::Pointwise reduce{
            exact(at::randn({m, c, 1, 1}, gen)), at::randn({m}, gen), {}};
        const kc::ConvChain::Pointwise expand{
            exact(at::randn({k, m, 1, 1}, gen)), at::randn({k}, gen), {}};
        const at::Tensor mid = exact(at::randn({m, width, 3, 3}, gen)), mid_b = at::randn({m}, gen);
        const kc::ConvChain chain(reduce, mid, mid_b, g, {}, expand, kc::Isa::kAvx512, true);
        ASSERT_TRUE(chain.pairs());
        const at::Tensor xb = at::randn({2, c, 9, 13}, gen).to(at::kBFloat16);
        const at::Tensor ref =
            chain_reference(xb.to(at::kDouble), reduce, mid, mid_b, g, {}, expand, {}, m / width);
        EXPECT_LT(nmse(chain.run(xb, {}), ref), 1e-4) << "width " << width << " stride " << stride;
      }
  }
  if (kc::bf16_dot_supported(kc::Isa::kAvx512)) EXPECT_GT(pair_cases, 20);
  // One convolution alone is not a chain; a projection must read the depthwise channels.
  const at::Tensor dw = at::randn({8, 1, 3, 3});
  EXPECT_FALSE(kc::ConvChain::takes(nullptr, dw, nullptr));
  const kc::ConvChain::Pointwise wrong{at::randn({4, 6, 1, 1}), {}, {}};
  EXPECT_FALSE(kc::ConvChain::takes(nullptr, dw, &wrong));
  EXPECT_FALSE(kc::ConvChain::takes(&wrong, dw, nullptr));
  // Groups of 3 channels (no narrow kernel), or 4 channels a group that do not divide 6.
  const kc::ConvChain::Pointwise six{at::randn({6, 6, 1, 1}), {}, {}};
  EXPECT_FALSE(kc::ConvChain::takes(&six, at::randn({6, 3, 3, 3}), &six));
  EXPECT_FALSE(kc::ConvChain::takes(&six, at::randn({6, 4, 3, 3}), &six));
  EXPECT_THROW(kc::ConvChain(six, at::randn({6, 3, 3, 3}), {}, {}, {}, six), lopper::Error);
}

// The chain's output rows are shared among the threads with stealing (parallel_steal): a thread's
// ring carries on from one chunk of rows to its next and starts again where a chunk does not
// continue its last (another thread's share, rows taken from the back of a share, the next image).
// Every row is the same arithmetic whoever makes it, so the output is the same bits with 1, 2, 3
// and 4 threads, run after run: an inverted residual (stride 1 and 2, float32 and bf16) and a
// narrow-group bottleneck, batches of 1 and 3.
TEST(DenseConvKernels, ConvChainSameBitsWhateverTheThreads) {
  at::Generator gen = at::detail::createCPUGenerator(29);
  const int threads = at::get_num_threads();
  for (const int64_t width : {1, 4})
    for (const int64_t stride : {1, 2}) {
      const int64_t c = 16, m = width == 1 ? 96 : 64, k = 24;
      kc::DirectConv::Geometry g;
      g.sh = g.sw = stride, g.ph = g.pw = 1;
      const kc::ConvChain::Pointwise expand{at::randn({m, c, 1, 1}, gen), at::randn({m}, gen), {}};
      const kc::ConvChain::Pointwise project{at::randn({k, m, 1, 1}, gen), at::randn({k}, gen), {}};
      const at::Tensor mid = at::randn({m, width, 3, 3}, gen), mid_b = at::randn({m}, gen);
      // (groups of 4 where the ISA's narrow-group kernel takes them: not the scalar one)
      if (width > 1 && !kc::ConvChain::takes(&expand, mid, &project, false, kc::active_isa()))
        continue;
      const kc::ConvChain chain(expand, mid, mid_b, g, {}, project, kc::active_isa(), true);
      for (const int64_t n : {1, 3})
        for (const bool bf16 : {false, true}) {
          at::Tensor x = at::randn({n, c, 29, 23}, gen);
          if (bf16) x = x.to(at::kBFloat16);
          at::set_num_threads(1);
          const at::Tensor want = chain.run(x, {});
          for (int t = 2; t <= 4; ++t)
            for (int rep = 0; rep < 10; ++rep) {
              at::set_num_threads(t);
              const at::Tensor y = chain.run(x, {});
              at::set_num_threads(threads);
              ASSERT_TRUE(at::equal(y, want))
                  << "groups of " << width << " stride " << stride << " batch " << n
                  << (bf16 ? " bf16" : " float32") << " threads " << t << " run " << rep;
            }
        }
    }
  at::set_num_threads(threads);
}

// Each ISA's NHWC max pooling against ATen's max_pool2d: random geometries, odd channel counts,
// NaN and -inf in the input (NaN propagates, as ONNX's reference does); and the executor's entry
// point (the active ISA) on a channels-last tensor.
// Winograd F(4x4, 3x3) against ATen's convolution in double, dense and grouped: odd channel
// counts (vector tails),
// maps that do not tile evenly, every padding to 2, batches, a channel slice read in place, the
// threads splitting tiles or (few tiles) output channels.
TEST(DenseConvKernels, WinogradEveryIsaMatchesAtenConvolution) {
  std::mt19937 rng(29);
  at::Generator gen = at::detail::createCPUGenerator(29);
  const int threads = at::get_num_threads();
  int cases = 0;
  for (kc::Isa isa : isas()) {
    for (int it = 0; it < 90; ++it) {
      const int64_t n = 1 + rng() % 3, h = 1 + rng() % 30, w = 1 + rng() % 30;
      // A third of the cases grouped (RegNet's 16 channels a group, ResNeXt's 4 to 32, odd ones
      // whose groups do not start on a vector).
      const int64_t group = it % 3 == 0 ? std::vector<int64_t>{2, 3, 6, 18}[rng() % 4] : 1;
      const int64_t c = group * (group > 1 ? std::vector<int64_t>{4, 5, 16, 24}[rng() % 4]
                                           : std::vector<int64_t>{1, 3, 8, 17, 32, 64}[rng() % 6]);
      const int64_t k =
          group * (group > 1 ? std::vector<int64_t>{4, 7, 16, 20}[rng() % 4]
                             : std::vector<int64_t>{1, 7, 16, 48, 50, 150}[rng() % 6]);
      kc::DirectConv::Geometry g;
      g.ph = rng() % 3, g.pw = rng() % 3;
      const int64_t oh = h + 2 * g.ph - 2, ow = w + 2 * g.pw - 2;
      if (oh < 1 || ow < 1) continue;
      const at::Tensor wt = at::randn({k, c / group, 3, 3}, gen);
      const at::Tensor b = rng() % 2 ? at::randn({k}, gen) : at::Tensor();
      const kc::Activation act = random_activation(rng);
      // Half the inputs are the second channel slice of a wider channels-last tensor.
      const bool slice = rng() % 2;
      const at::Tensor wide =
          at::randn({n, slice ? c + 5 : c, h, w}, gen).contiguous(at::MemoryFormat::ChannelsLast);
      const at::Tensor x = slice ? wide.narrow(1, 5, c) : wide;
      const at::Tensor res = rng() % 2 ? at::randn({n, k, oh, ow}, gen) : at::Tensor();
      ASSERT_TRUE(kc::WinogradConv::takes(wt, group, g));
      const kc::WinogradConv conv(wt, b, group, g, isa);
      at::set_num_threads(1 + it % 2);
      const at::Tensor y = conv.run(x, res, act);
      at::set_num_threads(threads);
      at::Tensor ref = at::convolution(x.to(at::kDouble), wt.to(at::kDouble),
                                       b.defined() ? b.to(at::kDouble) : at::Tensor(), {1, 1},
                                       {g.ph, g.pw}, {1, 1}, false, {0, 0}, group);
      if (res.defined()) ref = ref + res.to(at::kDouble);
      // The rounding is relative to the values before the activation (a sigmoid's output is at
      // most 1 whatever the sums were); the activations' slopes are at most 1.5.
      const double scale = 1 + ref.abs().max().item<double>();
      ref = activation_reference(ref, act);
      const std::string what = std::string(kc::isa_name(isa)) + " case " + std::to_string(it) +
                               " " + std::to_string(n) + "x" + std::to_string(c) + "x" +
                               std::to_string(h) + "x" + std::to_string(w) + " -> " +
                               std::to_string(k) + " groups " + std::to_string(group) + " pad " +
                               std::to_string(g.ph) + "," + std::to_string(g.pw);
      ASSERT_EQ(y.sizes(), ref.sizes()) << what;
      ASSERT_TRUE(y.is_contiguous(at::MemoryFormat::ChannelsLast)) << what;
      EXPECT_LE((y.to(at::kDouble) - ref).abs().max().item<double>(), 1.5e-5 * scale) << what;
      // bfloat16 in, residual and out: the float32 run on the same values, rounded once (bit for
      // bit: widened exactly as read, the same arithmetic, rounded as written; every fourth case
      // with a NaN and an infinity in x: NaN where the float32 run has it, the NaN's bits aside, as
      // ATen's conversion writes 0xFFFF and to_bf16 0x7FC0).
      at::Tensor xb = x.to(at::kBFloat16);
      if (it % 4 == 0) {
        xb[0][0][0][0] = NAN;
        xb[n - 1][c - 1][h / 2][w / 2] = INFINITY;
      }
      const at::Tensor rb = res.defined() ? res.to(at::kBFloat16) : res;
      const at::Tensor yb = conv.run(xb, rb, act);
      ASSERT_EQ(yb.scalar_type(), at::kBFloat16) << what;
      ASSERT_TRUE(yb.is_contiguous(at::MemoryFormat::ChannelsLast)) << what;
      const at::Tensor want =
          conv.run(xb.to(at::kFloat), rb.defined() ? rb.to(at::kFloat) : rb, act).to(at::kBFloat16);
      const at::Tensor nan = at::isnan(want);
      EXPECT_TRUE(at::equal(at::isnan(yb), nan)) << what << " bf16";
      EXPECT_TRUE(at::equal(yb.view(at::kShort).masked_fill(nan, 0),
                            want.view(at::kShort).masked_fill(nan, 0)))
          << what << " bf16";
      ++cases;
    }
  }
  EXPECT_GT(cases, 100);
  kc::DirectConv::Geometry strided;
  strided.sh = 2;
  kc::DirectConv::Geometry dilated;
  dilated.dw = 2;
  EXPECT_FALSE(kc::WinogradConv::takes(at::randn({8, 8, 3, 3}), 1, strided));
  EXPECT_FALSE(kc::WinogradConv::takes(at::randn({8, 8, 3, 3}), 1, dilated));
  EXPECT_TRUE(kc::WinogradConv::takes(at::randn({8, 4, 3, 3}), 2, {}));
  EXPECT_FALSE(kc::WinogradConv::takes(at::randn({8, 2, 3, 3}), 4, {}));  // 2 channels a group
  EXPECT_FALSE(kc::WinogradConv::takes(at::randn({8, 1, 3, 3}), 8, {}));  // depthwise
  EXPECT_FALSE(kc::WinogradConv::takes(at::randn({8, 8, 5, 5}), 1, {}));
  EXPECT_FALSE(kc::WinogradConv::takes(at::randn({8, 8, 3, 3}, at::kDouble), 1, {}));
  EXPECT_THROW(
      kc::WinogradConv(at::randn({8, 8, 3, 3}), {}, 1, {}).run(at::randn({1, 8, 1, 1}), {}, {}),
      lopper::Error);
}

// softmax(scale * x) along the last axis against ATen's in double, float32 and bf16 rows: row
// lengths around the vector widths (tails), scales of both signs, -inf entries (attention masks),
// a row of -inf only and a NaN (both rows NaN, as ATen's), 1-2 threads.
TEST(RowKernels, SoftmaxEveryIsaMatchesAten) {
  at::Generator gen = at::detail::createCPUGenerator(31);
  const int threads = at::get_num_threads();
  const float inf = std::numeric_limits<float>::infinity();
  int cases = 0;
  for (kc::Isa isa : isas())
    for (int64_t n : {1, 7, 8, 15, 16, 17, 33, 197, 1000})
      for (float scale : {1.f, 0.125f, -2.f}) {
        at::Tensor x = at::randn({3, 5, n}, gen) * 4;
        x.index_put_({1, 2, 0}, -inf);
        if (n > 3) x.index_put_({2, 1, n - 2}, -inf);
        at::set_num_threads(1 + cases % 2);
        const at::Tensor y = kc::softmax_last_axis(x, scale, isa);
        at::set_num_threads(threads);
        const at::Tensor ref = at::softmax(x.to(at::kDouble) * scale, -1);
        const std::string what = std::string(kc::isa_name(isa)) + " n " + std::to_string(n) +
                                 " scale " + std::to_string(scale);
        ASSERT_EQ(y.sizes(), x.sizes()) << what;
        // Where ATen gives NaN (a row whose only entry is -inf, scaled by a negative scale: +inf
        // - inf), so must the kernel; elsewhere, within 1e-6 (exp's relative error is 2e-7).
        const at::Tensor nan = ref.isnan();
        EXPECT_TRUE(at::equal(y.isnan(), nan)) << what;
        EXPECT_LE((y.to(at::kDouble) - ref).masked_fill(nan, 0).abs().max().item<double>(), 1e-6)
            << what;
        // bf16 rows: float32 arithmetic rounded once, as ATen's bf16 softmax; so within half a
        // bf16 step of the exact softmax of the bf16 values (plus float32's error).
        const at::Tensor x16 = x.to(at::kBFloat16);
        at::set_num_threads(1 + cases % 2);
        const at::Tensor y16 = kc::softmax_last_axis(x16, scale, isa);
        at::set_num_threads(threads);
        ASSERT_EQ(y16.scalar_type(), at::kBFloat16) << what;
        const at::Tensor ref16 = at::softmax(x16.to(at::kDouble) * scale, -1);
        const at::Tensor nan16 = ref16.isnan();
        EXPECT_TRUE(at::equal(y16.isnan(), nan16)) << what << " bf16";
        const at::Tensor err16 = (y16.to(at::kDouble) - ref16).abs() - ref16.abs() / 256 - 1e-6;
        EXPECT_LE(err16.masked_fill(nan16, 0).max().item<double>(), 0) << what << " bf16";
        ++cases;
      }
  EXPECT_GT(cases, 50);
  // A row of -inf only is 0 / 0; a NaN makes its row NaN.
  at::Tensor x = at::randn({3, 20}, gen);
  x.index_put_({0}, -inf);
  x.index_put_({1, 5}, std::numeric_limits<float>::quiet_NaN());
  const at::Tensor y = kc::softmax_last_axis(x, 1.f);
  EXPECT_TRUE(y[0].isnan().all().item<bool>());
  EXPECT_TRUE(y[1].isnan().all().item<bool>());
  EXPECT_NEAR(y[2].sum().item<double>(), 1.0, 1e-6);
  EXPECT_THROW(kc::softmax_last_axis(at::randn({2, 3}, at::kDouble), 1.f), lopper::Error);
}

// Layer norm along the last axis against ATen's in float64 (float32 rows) and ATen's mixed bf16
// kernel (bf16 rows: float32 arithmetic, one rounding): row lengths around the vector widths, with
// and without a bias, a row holding a NaN or an infinity, 1 and 2 threads, every ISA.
TEST(RowKernels, LayerNormEveryIsaMatchesAten) {
  at::Generator gen = at::detail::createCPUGenerator(31);
  const int threads = at::get_num_threads();
  int checked = 0;
  for (kc::Isa isa : isas())
    for (int64_t n : {1, 5, 16, 33, 768})
      for (bool with_bias : {true, false}) {
        at::set_num_threads(1 + checked % 2);
        at::Tensor x = at::randn({7, 3, n}, gen) * 3 + 1;
        x[1][2][0] = NAN;
        x[2][0][n - 1] = INFINITY;
        const at::Tensor g = at::randn({n}, gen),
                         b = with_bias ? at::randn({n}, gen) : at::Tensor();
        const std::string what =
            std::string(kc::isa_name(isa)) + " n " + std::to_string(n) + (with_bias ? " bias" : "");
        const at::Tensor y = kc::layer_norm_last_axis(x, g, b, 1e-5f, isa);
        const at::Tensor ref = at::layer_norm(x.to(at::kDouble), {n}, g.to(at::kDouble),
                                              with_bias ? b.to(at::kDouble) : at::Tensor(), 1e-5);
        EXPECT_TRUE(at::equal(at::isnan(y), at::isnan(ref))) << what;
        const at::Tensor finite = at::isfinite(ref);
        EXPECT_LE((y.to(at::kDouble) - ref).abs().masked_fill(~finite, 0).max().item<double>(),
                  1e-5 * (1 + ref.abs().masked_fill(~finite, 0).max().item<double>()))
            << what;
        const at::Tensor x16 = x.to(at::kBFloat16), g16 = g.to(at::kBFloat16);
        const at::Tensor b16 = with_bias ? b.to(at::kBFloat16) : at::Tensor();
        const at::Tensor y16 = kc::layer_norm_last_axis(x16, g16, b16, 1e-5f, isa);
        ASSERT_EQ(y16.scalar_type(), at::kBFloat16);
        // The bf16 values in float64, and ATen's mixed kernel for the NaN pattern: the result is
        // float32 arithmetic rounded once, so within half a bf16 step of the exact value plus the
        // float32 error.
        const at::Tensor ref16 =
            at::layer_norm(x16.to(at::kDouble), {n}, g16.to(at::kDouble),
                           with_bias ? b16.to(at::kDouble) : at::Tensor(), 1e-5);
        EXPECT_TRUE(at::equal(at::isnan(y16), at::isnan(at::layer_norm(x16, {n}, g16, b16, 1e-5))))
            << what << " bf16";
        const at::Tensor ok16 = at::isfinite(ref16);
        const at::Tensor mag16 = ref16.abs().masked_fill(~ok16, 0);
        const at::Tensor d16 = (y16.to(at::kDouble) - ref16).abs().masked_fill(~ok16, 0);
        EXPECT_LE((d16 - mag16 / 256).max().item<double>(), 1e-5 * (1 + mag16.max().item<double>()))
            << what << " bf16";
        ++checked;
      }
  at::set_num_threads(threads);
  EXPECT_GE(checked, 10);
  EXPECT_THROW(kc::layer_norm_last_axis(at::randn({2, 4}), at::randn({5}), {}, 1e-5f),
               lopper::Error);
  EXPECT_THROW(kc::layer_norm_last_axis(at::randn({2, 4}, at::kDouble), at::randn({4}), {}, 1e-5f),
               lopper::Error);
}

// Attention in one pass against ATen's three steps in float64: head views of a fused QKV
// projection (strided rows and columns), a long key axis (blocks of a few query rows), one and
// many heads, 1 and 2 threads, every ISA; float32 and bfloat16.
TEST(RowKernels, ScaledAttentionEveryIsaMatchesAten) {
  at::Generator gen = at::detail::createCPUGenerator(29);
  const int threads = at::get_num_threads();
  int checked = 0;
  for (kc::Isa isa : isas())
    for (auto [heads, sq, sk, d] : std::vector<std::array<int64_t, 4>>{
             {12, 197, 197, 32}, {1, 1, 9, 5}, {3, 20, 5000, 8}, {4, 7, 7, 64}}) {
      at::set_num_threads(1 + checked % 2);
      const at::Tensor qkv = at::randn({sk, 3, heads, d}, gen);  // [tokens, q/k/v, heads, d]
      const at::Tensor q = at::randn({sq, heads, d}, gen).permute({1, 0, 2});
      const at::Tensor kt = qkv.select(1, 1).permute({1, 2, 0});  // [heads, d, sk], strided
      const at::Tensor v = qkv.select(1, 2).permute({1, 0, 2});   // [heads, sk, d], strided
      const float scale = 0.125f;
      const at::Tensor y = kc::scaled_attention(q, kt, v, scale, isa);
      const at::Tensor ref =
          at::matmul(at::softmax(at::matmul(q.to(at::kDouble), kt.to(at::kDouble)) * scale, -1),
                     v.to(at::kDouble));
      ASSERT_EQ(y.sizes(), ref.sizes());
      EXPECT_LT(nmse(y, ref), 1e-10)
          << kc::isa_name(isa) << " heads " << heads << " sq " << sq << " sk " << sk << " d " << d;
      // bfloat16 views of the same layout: on the CPU's bfloat16 dot product where it has one
      // (AVX-512 table; the softmaxed scores rounded to bf16 for the product with v), else widened
      // as they are packed; the output rounded once (the reference: the bf16 values in float64,
      // rounded to bf16 at the end).
      const at::Tensor qkv16 = qkv.to(at::kBFloat16), q16 = q.to(at::kBFloat16);
      const at::Tensor kt16 = qkv16.select(1, 1).permute({1, 2, 0});
      const at::Tensor v16 = qkv16.select(1, 2).permute({1, 0, 2});
      const at::Tensor y16 = kc::scaled_attention(q16, kt16, v16, scale, isa);
      ASSERT_EQ(y16.scalar_type(), at::kBFloat16);
      const at::Tensor ref16 =
          at::matmul(at::softmax(at::matmul(q16.to(at::kDouble), kt16.to(at::kDouble)) * scale, -1),
                     v16.to(at::kDouble))
              .to(at::kBFloat16);
      EXPECT_LT(nmse(y16, ref16), 1e-5)
          << kc::isa_name(isa) << " bf16 heads " << heads << " sq " << sq << " sk " << sk;
      ++checked;
    }
  at::set_num_threads(threads);
  EXPECT_GE(checked, 4);
  EXPECT_THROW(
      kc::scaled_attention(at::randn({2, 3, 4}), at::randn({2, 5, 6}), at::randn({2, 6, 1}), 1.f),
      std::exception);
}

// The few-rows product (a decoded token's attention products) against ATen's in float64: b as
// keys transposed (rows contiguous: K^T of a cache), as values (columns contiguous), and strided
// both ways; a as rows of a wider tensor and transposed; 1 to 16 rows, one and many heads, key
// counts around the vector widths, 1 and 2 threads, every ISA; float32 and bfloat16 (sums in
// float32, rounded once); refusals.
TEST(RowKernels, FewRowsProductEveryIsaMatchesAten) {
  at::Generator gen = at::detail::createCPUGenerator(41);
  const int threads = at::get_num_threads();
  int checked = 0;
  for (kc::Isa isa : isas())
    for (auto [heads, m, k, n] : std::vector<std::array<int64_t, 4>>{
             {4, 8, 64, 257}, {4, 8, 257, 64}, {1, 1, 5, 3}, {6, 16, 17, 33}, {2, 3, 64, 1000}})
      for (int layout = 0; layout < 3; ++layout) {
        at::set_num_threads(1 + checked % 2);
        const at::Tensor wide = at::randn({heads, m, k + 5}, gen);
        const at::Tensor a = layout == 2 ? at::randn({heads, k, m}, gen).transpose(1, 2)
                                         : wide.narrow(2, 2, k);  // strided rows
        at::Tensor b;
        if (layout == 0)
          b = at::randn({heads, n, k}, gen).transpose(1, 2);  // K^T: rows contiguous
        else if (layout == 1)
          b = at::randn({heads, k, n}, gen);  // V: columns contiguous
        else
          b = at::randn({heads, k, 2 * n}, gen).narrow(2, 0, 2 * n - 1).slice(2, 0, 2 * n, 2);
        const std::string what = std::string(kc::isa_name(isa)) + " heads " +
                                 std::to_string(heads) + " m " + std::to_string(m) + " k " +
                                 std::to_string(k) + " n " + std::to_string(n) + " layout " +
                                 std::to_string(layout);
        const at::Tensor y = kc::few_rows_product(a, b, isa);
        const at::Tensor ref = at::matmul(a.to(at::kDouble), b.to(at::kDouble));
        ASSERT_EQ(y.sizes(), ref.sizes()) << what;
        EXPECT_LT(nmse(y, ref), 1e-10) << what;
        const at::Tensor a16 = a.to(at::kBFloat16), b16 = b.to(at::kBFloat16);
        const at::Tensor y16 = kc::few_rows_product(a16, b16, isa);
        ASSERT_EQ(y16.scalar_type(), at::kBFloat16) << what;
        const at::Tensor ref16 = at::matmul(a16.to(at::kDouble), b16.to(at::kDouble));
        // float32 sums rounded once: within half a bf16 step of the exact product, plus float32's
        // error on the sum
        const at::Tensor err = (y16.to(at::kDouble) - ref16).abs() - ref16.abs() / 256;
        EXPECT_LE(err.max().item<double>(), 1e-5 * (1 + ref16.abs().max().item<double>()))
            << what << " bf16";
        ++checked;
      }
  at::set_num_threads(threads);
  EXPECT_GE(checked, 15);
  // Refusals: more rows than a few, mixed types, shapes that do not chain.
  EXPECT_THROW(kc::few_rows_product(at::randn({2, 17, 4}), at::randn({2, 4, 5})), lopper::Error);
  EXPECT_THROW(kc::few_rows_product(at::randn({2, 3, 4}), at::randn({2, 4, 5}).to(at::kBFloat16)),
               lopper::Error);
  EXPECT_THROW(kc::few_rows_product(at::randn({2, 3, 4}), at::randn({2, 5, 5})), lopper::Error);
  EXPECT_THROW(kc::few_rows_product(at::randn({2, 3, 4}), at::randn({3, 4, 5})), lopper::Error);
}

TEST(DenseConvKernels, MaxPoolEveryIsaMatchesAten) {
  std::mt19937 rng(11);
  at::Generator gen = at::detail::createCPUGenerator(11);
  for (kc::Isa isa : isas()) {
    for (int it = 0; it < 120; ++it) {
      kc::ConvShape s;
      s.n = 1 + rng() % 2, s.h = 1 + rng() % 13, s.w = 1 + rng() % 13, s.c = 1 + rng() % 40;
      s.k = s.c, s.kh = 1 + rng() % 3, s.kw = 1 + rng() % 3, s.sh = 1 + rng() % 2;
      s.sw = 1 + rng() % 2, s.ph = rng() % (s.kh / 2 + 1), s.pw = rng() % (s.kw / 2 + 1);
      s.dh = 1 + rng() % 2, s.dw = 1;
      const int64_t spare_h = s.h + 2 * s.ph - s.dh * (s.kh - 1) - 1;
      const int64_t spare_w = s.w + 2 * s.pw - s.dw * (s.kw - 1) - 1;
      if (spare_h < 0 || spare_w < 0) continue;
      s.oh = spare_h / s.sh + 1, s.ow = spare_w / s.sw + 1;
      at::Tensor x = at::randn({s.n, s.c, s.h, s.w}, gen);
      if (it % 4 == 0) x.view(-1).index_put_({at::randint(x.numel(), {3}, gen)}, NAN);
      if (it % 5 == 0) x.view(-1).index_put_({at::randint(x.numel(), {3}, gen)}, -INFINITY);
      const at::Tensor xl = x.contiguous(at::MemoryFormat::ChannelsLast);
      at::Tensor y = at::empty({s.n, s.c, s.oh, s.ow}).contiguous(at::MemoryFormat::ChannelsLast);
      kc::conv_isa_ops(isa).max_pool(xl.data_ptr<float>(), y.data_ptr<float>(), s, 0, s.n * s.oh);
      const at::Tensor ref =
          at::max_pool2d(x, {s.kh, s.kw}, {s.sh, s.sw}, {s.ph, s.pw}, {s.dh, s.dw}, false);
      ASSERT_TRUE(at::equal(at::isnan(y), at::isnan(ref))) << kc::isa_name(isa) << " case " << it;
      ASSERT_TRUE(at::allclose(y.nan_to_num(0), ref.nan_to_num(0)))
          << kc::isa_name(isa) << " case " << it;
    }
  }
  const at::Tensor x = at::randn({2, 19, 15, 15}).contiguous(at::MemoryFormat::ChannelsLast);
  const at::Tensor y = kc::max_pool2d_nhwc(x, {3, 3}, {2, 2}, {1, 1}, {1, 1}, {8, 8});
  EXPECT_TRUE(y.is_contiguous(at::MemoryFormat::ChannelsLast));
  EXPECT_TRUE(at::equal(y, at::max_pool2d(x, {3, 3}, {2, 2}, {1, 1}, {1, 1}, false)));
  // Ceil mode: the last window hangs over the end.
  const at::Tensor yc = kc::max_pool2d_nhwc(x, {2, 2}, {2, 2}, {0, 0}, {1, 1}, {8, 8});
  EXPECT_TRUE(at::equal(yc, at::max_pool2d(x, {2, 2}, {2, 2}, {0, 0}, {1, 1}, true)));
}

// The whole-tensor bf16 <-> float32 conversions give ATen's bit for bit (ties to even, NaN, Inf,
// subnormals), keep the layout (channels-last stays channels-last) and take views that are not
// dense (through ATen).
TEST(Bf16Convert, MatchesAtenAndKeepsTheLayout) {
  at::Generator gen = at::detail::createCPUGenerator(13);
  at::Tensor f = at::randn({2, 70, 9, 11}, gen) * 1e3;
  f.view(-1).index_put_({at::randint(f.numel(), {5}, gen)}, NAN);
  f.view(-1).index_put_({at::randint(f.numel(), {5}, gen)}, INFINITY);
  f.view(-1).index_put_({at::randint(f.numel(), {5}, gen)}, 1e-40f);  // subnormal
  // Exact ties between two bf16 values: 1 + 2^-8 (to even: 1) and 1 + 3 * 2^-8 (to even: up).
  f.view(-1)[0] = 1.f + 1.f / 256, f.view(-1)[1] = 1.f + 3.f / 256;
  for (auto format : {at::MemoryFormat::Contiguous, at::MemoryFormat::ChannelsLast}) {
    const at::Tensor x = f.contiguous(format);
    const at::Tensor b = kc::narrow_to_bf16(x);
    const at::Tensor want = x.to(at::kBFloat16);
    ASSERT_EQ(b.scalar_type(), at::kBFloat16);
    EXPECT_TRUE(b.is_contiguous(format));
    EXPECT_TRUE(at::equal(at::isnan(b), at::isnan(want)));
    EXPECT_TRUE(at::equal(b.nan_to_num(0), want.nan_to_num(0)));
    const at::Tensor w = kc::widen_bf16(b);
    ASSERT_EQ(w.scalar_type(), at::kFloat);
    EXPECT_TRUE(w.is_contiguous(format));
    EXPECT_TRUE(at::equal(w.nan_to_num(0), b.to(at::kFloat).nan_to_num(0)));
  }
  const at::Tensor slice = f.slice(1, 3, 40);  // not dense
  EXPECT_TRUE(
      at::equal(kc::narrow_to_bf16(slice).nan_to_num(0), slice.to(at::kBFloat16).nan_to_num(0)));
  EXPECT_TRUE(kc::widen_bf16(f).is_same(f));  // float32 passes through
}

// An image's few planes (1 to 4 channels) in channels-last layout, float32 and bf16, bit for bit
// ATen's copy (NaN kept); more channels, another type, a view that is not contiguous: undefined
// (the caller copies as before).
TEST(Bf16Convert, FewChannelsLastMatchesAten) {
  at::Generator gen = at::detail::createCPUGenerator(15);
  for (const int64_t c : {1, 2, 3, 4})
    for (const auto type : {at::kFloat, at::kBFloat16}) {
      SCOPED_TRACE(std::to_string(c) + " channels " + std::string(c10::toString(type)));
      at::Tensor x = at::randn({2, c, 37, 29}, gen);
      x.view(-1).index_put_({at::randint(x.numel(), {3}, gen)}, NAN);
      x = x.to(type);
      const at::Tensor y = kc::few_channels_last(x);
      ASSERT_TRUE(y.defined());
      EXPECT_TRUE(y.is_contiguous(at::MemoryFormat::ChannelsLast));
      EXPECT_EQ(y.scalar_type(), type);
      const at::Tensor want = x.contiguous(at::MemoryFormat::ChannelsLast);
      EXPECT_TRUE(at::equal(y.nan_to_num(0), want.nan_to_num(0)));
      EXPECT_TRUE(at::equal(at::isnan(y), at::isnan(want)));
      // the same bytes in memory: channel fastest
      EXPECT_TRUE(at::equal(y.permute({0, 2, 3, 1}).contiguous().nan_to_num(0),
                            x.permute({0, 2, 3, 1}).contiguous().nan_to_num(0)));
    }
  EXPECT_FALSE(kc::few_channels_last(at::randn({1, 5, 4, 4})).defined());
  EXPECT_FALSE(kc::few_channels_last(at::randn({1, 3, 4, 4}, at::kDouble)).defined());
  EXPECT_FALSE(kc::few_channels_last(at::randn({2, 6, 4, 4}).slice(1, 0, 3)).defined());
  EXPECT_FALSE(kc::few_channels_last(at::randn({3, 4, 4})).defined());
}

// The in-place bf16 ReLU and clip (after a oneDNN primitive) give ATen's relu_ and clamp_: NaN
// stays NaN, -Inf and +Inf go where ATen puts them; a float32 or strided tensor is left to ATen.
TEST(Bf16Convert, ReluAndClampMatchAten) {
  at::Generator gen = at::detail::createCPUGenerator(14);
  at::Tensor x = (at::randn({2, 37, 5, 7}, gen) * 10).to(at::kBFloat16);
  x.view(-1).index_put_({at::randint(x.numel(), {6}, gen)}, NAN);
  x.view(-1).index_put_({at::randint(x.numel(), {3}, gen)}, -INFINITY);
  x.view(-1).index_put_({at::randint(x.numel(), {3}, gen)}, INFINITY);
  x.view(-1)[0] = -0.f;
  const at::Tensor cl = x.contiguous(at::MemoryFormat::ChannelsLast);
  at::Tensor r = cl.clone();
  ASSERT_TRUE(kc::relu_bf16_(r));
  const at::Tensor rw = at::relu(cl);
  EXPECT_TRUE(at::equal(at::isnan(r), at::isnan(rw)));
  EXPECT_TRUE(at::equal(r.nan_to_num(0), rw.nan_to_num(0)));
  EXPECT_TRUE(r.is_contiguous(at::MemoryFormat::ChannelsLast));
  for (auto [lo, hi] : {std::pair<float, float>{0.f, 6.f}, {-1.5f, 2.3f}, {-INFINITY, 1.f}}) {
    at::Tensor c = cl.clone();
    ASSERT_TRUE(kc::clamp_bf16_(c, lo, hi));
    const at::Tensor cw = at::clamp(cl, lo, hi);
    EXPECT_TRUE(at::equal(at::isnan(c), at::isnan(cw))) << lo << " " << hi;
    EXPECT_TRUE(at::equal(c.nan_to_num(0), cw.nan_to_num(0))) << lo << " " << hi;
  }
  EXPECT_FALSE(kc::relu_bf16_(at::randn({4})));    // float32
  EXPECT_FALSE(kc::relu_bf16_(x.slice(1, 0, 5)));  // not dense
  EXPECT_FALSE(kc::clamp_bf16_(x.slice(1, 0, 5), 0.f, 1.f));
}

// The bfloat16 pools (--precision bf16): max pooling gives ATen's bf16 max_pool2d bit for bit,
// NaN and -Inf included, at channel counts around the kernel's 64-channel chunks and its builds of
// one to four vectors; the mean over the pixels is within one bf16 rounding of ATen's float mean.
TEST(DenseConvKernels, Bf16PoolsMatchAten) {
  std::mt19937 rng(12);
  at::Generator gen = at::detail::createCPUGenerator(12);
  for (int it = 0; it < 110; ++it) {
    const int64_t n = 1 + rng() % 2, h = 1 + rng() % 13, w = 1 + rng() % 13;
    const int64_t c = std::vector<int64_t>{1, 7, 16, 17, 32, 40, 48, 63, 64, 65, 130}[rng() % 11];
    const int64_t kh = 1 + rng() % 3, kw = 1 + rng() % 3, sh = 1 + rng() % 2, sw = 1 + rng() % 2;
    const int64_t ph = rng() % (kh / 2 + 1), pw = rng() % (kw / 2 + 1), dh = 1 + rng() % 2;
    const int64_t spare_h = h + 2 * ph - dh * (kh - 1) - 1, spare_w = w + 2 * pw - (kw - 1) - 1;
    if (spare_h < 0 || spare_w < 0) continue;
    at::Tensor x = at::randn({n, c, h, w}, gen).to(at::kBFloat16);
    if (it % 4 == 0) x.view(-1).index_put_({at::randint(x.numel(), {3}, gen)}, NAN);
    if (it % 5 == 0) x.view(-1).index_put_({at::randint(x.numel(), {3}, gen)}, -INFINITY);
    const at::Tensor xl = x.contiguous(at::MemoryFormat::ChannelsLast);
    const at::Tensor ref = at::max_pool2d(x, {kh, kw}, {sh, sw}, {ph, pw}, {dh, 1}, false);
    for (const kc::Isa isa : {kc::Isa::kScalar, kc::Isa::kAvx2, kc::Isa::kAvx512}) {
      if (!kc::isa_supported(isa)) continue;
      const at::Tensor y = kc::max_pool2d_nhwc(xl, {kh, kw}, {sh, sw}, {ph, pw}, {dh, 1},
                                               {spare_h / sh + 1, spare_w / sw + 1}, isa);
      ASSERT_EQ(y.scalar_type(), at::kBFloat16);
      ASSERT_TRUE(y.is_contiguous(at::MemoryFormat::ChannelsLast));
      ASSERT_TRUE(at::equal(at::isnan(y), at::isnan(ref))) << kc::isa_name(isa) << " case " << it;
      ASSERT_TRUE(at::equal(y.nan_to_num(0), ref.nan_to_num(0)))
          << kc::isa_name(isa) << " case " << it;
    }
    const at::Tensor m = kc::mean_over_pixels_nhwc(xl);
    const at::Tensor mref = x.to(at::kFloat).mean({2, 3}, true);
    ASSERT_EQ(m.scalar_type(), at::kBFloat16);
    ASSERT_TRUE(at::equal(at::isnan(m), at::isnan(mref))) << "case " << it;
    ASSERT_TRUE(at::allclose(m.to(at::kFloat).nan_to_num(0, 0, 0), mref.nan_to_num(0, 0, 0),
                             1.0 / 128, 1e-6))
        << "case " << it;
  }
}

// NaN and +-Inf in the input come out of every own kernel where ATen's unfused ops put them (a
// NaN is never turned into a number by a fused ReLU, clip or bias), and every kernel takes an
// empty batch: the sparse formats and kernels, the dense GEMV, the direct, depthwise, Winograd and
// chained convolutions, with a bias, each activation and (convolutions) a residual.
TEST(EveryKernel, KeepsNanAndInfAsAtenAndTakesEmptyBatches) {
  at::Generator gen = at::detail::createCPUGenerator(41);
  std::mt19937 rng(41);
  auto poison = [](at::Tensor x) {
    at::Tensor flat = x.view(-1);  // x is contiguous
    flat.slice(0, 0, flat.numel(), 7).fill_(NAN);
    flat.slice(0, 3, flat.numel(), 11).fill_(INFINITY);
    flat.slice(0, 5, flat.numel(), 13).fill_(-INFINITY);
    return x;
  };
  int checked = 0;
  // `tiles`: Winograd's transforms mix a tile's inputs, so a non-finite input makes its whole tile
  // NaN (never a number where ATen has NaN; NaN where ATen may have an infinity or a number).
  auto same_nans = [&](const at::Tensor& y, const at::Tensor& ref, const std::string& what,
                       bool tiles = false) {
    ASSERT_EQ(y.sizes(), ref.sizes()) << what;
    EXPECT_TRUE(at::any(at::isnan(ref)).item<bool>()) << what << ": the case reaches no NaN";
    if (tiles)
      EXPECT_TRUE(at::all(at::isnan(y.masked_select(at::isnan(ref)))).item<bool>()) << what;
    else
      EXPECT_TRUE(at::equal(at::isnan(y), at::isnan(ref))) << what;
    const at::Tensor finite = at::isfinite(ref) & at::isfinite(y);
    const double err =
        (y.to(at::kDouble) - ref).abs().masked_fill(finite.logical_not(), 0).max().item<double>();
    EXPECT_LE(err, 1e-3 * (1 + ref.abs().masked_fill(finite.logical_not(), 0).max().item<double>()))
        << what;
    ++checked;
  };
  for (kc::Isa isa : isas())
    for (int kind = 0; kind <= kc::Activation::kGelu; ++kind) {
      kc::Activation act;
      act.kind = static_cast<kc::Activation::Kind>(kind);
      act.lo = -0.5f, act.hi = 0.75f, act.beta = 0.4f;
      act.alpha = kind == kc::Activation::kHardSigmoid ? 0.3f : 0.1f;
      const std::string tag = std::string(kc::isa_name(isa)) + " act " + std::to_string(kind);
      // Linear layers: [m, 24] -> 20, no weight zero (a format that skips zeros skips 0 x NaN,
      // which ATen's dense product counts).
      const at::Tensor w = at::randn({20, 24}, gen);
      const at::Tensor b = at::randn({20}, gen);
      for (int64_t m : {3, 40}) {
        const at::Tensor x = poison(at::randn({m, 24}, gen));
        const at::Tensor ref = reference(x, w, b, act);
        for (const kc::BlockShape& bs : kc::kernel_block_shapes()) {
          const kc::SparseWeight sw(w, bs, b);
          for (kc::Algo algo :
               {kc::Algo::kCols, kc::Algo::kRows, kc::Algo::kGather, kc::Algo::kDot})
            if (sw.supports(algo)) {
              const std::string what = tag + " sparse " + bs.str() + " " + kc::algo_name(algo);
              same_nans(sw.linear(x, algo, act, isa), ref, what);
              EXPECT_EQ(sw.linear(x.narrow(0, 0, 0), algo, act, isa).sizes(),
                        (std::vector<int64_t>{0, 20}))
                  << what;
            }
        }
        const kc::MaskedWeight mw(w, b, 0, isa);
        if (mw.runs_on(isa)) {
          same_nans(mw.linear(x, act, isa), ref, tag + " masked");
          EXPECT_EQ(mw.linear(x.narrow(0, 0, 0), act, isa).size(0), 0) << tag;
        }
        if (m <= 16) {
          // Panels: float32 (AVX-512 or the plain loop), bfloat16 with x in float32 (the plain
          // loop) and in bfloat16 (the dot product): NaN exactly where ATen's dense product has it.
          same_nans(kc::MaskedWeight(w, b, 16).linear(x, act, isa), ref, tag + " panels");
          const at::Tensor w16 = w.to(at::kBFloat16);
          const kc::MaskedWeight mp(w16, b, 16, isa);
          for (const at::Tensor& xi : {x, x.to(at::kBFloat16)}) {
            const at::Tensor yp = mp.linear(xi, act, isa).to(at::kFloat);
            const at::Tensor rp = reference(xi, w16, b, act);
            EXPECT_TRUE(at::equal(at::isnan(yp), at::isnan(rp))) << tag << " panels " << xi.dtype();
          }
        }
        if (m <= 16) {
          const kc::DenseGemv gemv(w, isa);
          same_nans(gemv.linear(x, b, act), ref, tag + " gemv");
          EXPECT_EQ(gemv.linear(x.narrow(0, 0, 0), b, act).size(0), 0) << tag;
        }
      }
      // Convolutions on [2, 8, 9, 10] maps: 3x3 dense (direct and Winograd), depthwise, 1x1.
      const at::Tensor x = poison(at::randn({2, 8, 9, 10}, gen));
      kc::DirectConv::Geometry g;
      g.ph = g.pw = 1;
      auto conv_ref = [&](const at::Tensor& wt, const at::Tensor& bias, int64_t groups, int64_t pad,
                          const at::Tensor& res) {
        at::Tensor r = at::convolution(x.to(at::kDouble), wt.to(at::kDouble), bias.to(at::kDouble),
                                       {1, 1}, {pad, pad}, {1, 1}, false, {0, 0}, groups);
        if (res.defined()) r = r + res.to(at::kDouble);
        return activation_reference(r, act);
      };
      const at::Tensor w3 = at::randn({16, 8, 3, 3}, gen), b16 = at::randn({16}, gen);
      const at::Tensor res16 = at::randn({2, 16, 9, 10}, gen);
      const kc::DirectConv direct(w3, b16, 1, g, isa);
      same_nans(direct.run(x, res16, act), conv_ref(w3, b16, 1, 1, res16), tag + " direct");
      EXPECT_EQ(direct.run(x.narrow(0, 0, 0), {}, act).size(0), 0) << tag;
      if (kc::WinogradConv::takes(w3, 1, g)) {
        const kc::WinogradConv wino(w3, b16, 1, g, isa);
        same_nans(wino.run(x, res16, act), conv_ref(w3, b16, 1, 1, res16), tag + " winograd", true);
        EXPECT_EQ(wino.run(x.narrow(0, 0, 0), {}, act).size(0), 0) << tag;
      }
      const at::Tensor wd = at::randn({8, 1, 3, 3}, gen), b8 = at::randn({8}, gen);
      const kc::DirectConv depthwise(wd, b8, 8, g, isa);
      same_nans(depthwise.run(x, {}, act), conv_ref(wd, b8, 8, 1, {}), tag + " depthwise");
      EXPECT_EQ(depthwise.run(x.narrow(0, 0, 0), {}, act).size(0), 0) << tag;
      kc::DirectConv::Geometry g1;
      const at::Tensor w1 = at::randn({16, 8, 1, 1}, gen);
      const kc::DirectConv pointwise(w1, b16, 1, g1, isa);
      same_nans(pointwise.run(x, res16, act), conv_ref(w1, b16, 1, 0, res16), tag + " 1x1");
      // The chain: 1x1 expansion to 24, 3x3 depthwise, 1x1 projection to 8, each with `act`.
      const kc::ConvChain::Pointwise expand{at::randn({24, 8, 1, 1}, gen), at::randn({24}, gen),
                                            act};
      const at::Tensor dw = at::randn({24, 1, 3, 3}, gen), dw_b = at::randn({24}, gen);
      const kc::ConvChain::Pointwise project{at::randn({8, 24, 1, 1}, gen), at::randn({8}, gen),
                                             act};
      if (kc::ConvChain::takes(&expand, dw, &project)) {
        const kc::ConvChain chain(expand, dw, dw_b, g, act, project, isa);
        at::Tensor r = activation_reference(
            at::convolution(x.to(at::kDouble), expand.w.to(at::kDouble), expand.b.to(at::kDouble),
                            {1, 1}, {0, 0}, {1, 1}, false, {0, 0}, 1),
            act);
        r = activation_reference(at::convolution(r, dw.to(at::kDouble), dw_b.to(at::kDouble),
                                                 {1, 1}, {1, 1}, {1, 1}, false, {0, 0}, 24),
                                 act);
        r = activation_reference(
            at::convolution(r, project.w.to(at::kDouble), project.b.to(at::kDouble), {1, 1}, {0, 0},
                            {1, 1}, false, {0, 0}, 1),
            act);
        same_nans(chain.run(x, {}), r, tag + " chain");
        EXPECT_EQ(chain.run(x.narrow(0, 0, 0), {}).size(0), 0) << tag;
      }
    }
  EXPECT_GE(checked, 8 * 6);
}

TEST(SparseKernels, PackingCountsAndRefusals) {
  // 8x1 blocks of a weight with one nonzero: one block of 8 stored values.
  at::Tensor w = at::zeros({16, 8});
  w[3][5] = 2.0f;
  EXPECT_EQ(kc::stored_values(w, {8, 1}), 8);
  EXPECT_EQ(kc::stored_values(w, {1, 4}), 4);
  EXPECT_EQ(kc::stored_values(w, {1, 1}), 1);
  kc::SparseWeight sw(w, {4, 1});
  EXPECT_EQ(sw.nonzeros(), 1);
  EXPECT_EQ(sw.stored(), 4);
  EXPECT_TRUE(sw.supports(kc::Algo::kRows));
  EXPECT_FALSE(sw.supports(kc::Algo::kGather));
  EXPECT_THROW(kc::SparseWeight(w, {2, 2}), lopper::Error);                  // no kernel takes 2x2
  EXPECT_THROW(kc::SparseWeight(at::zeros({4, 3}), {1, 4}), lopper::Error);  // k < c
  EXPECT_THROW(kc::SparseWeight(at::zeros({4, 3}, at::kDouble), {1, 1}), lopper::Error);
  EXPECT_THROW(sw.linear(at::zeros({2, 7}), kc::Algo::kRows, {}, kc::Isa::kScalar), lopper::Error);
  // The bitmask format's tiles: 1 or 4 rows; AVX-512 takes 1 (the default where it is active).
  EXPECT_THROW(kc::MaskedWeight(at::zeros({4, 16}), {}, 3), lopper::Error);
  EXPECT_EQ(kc::MaskedWeight(at::zeros({4, 16}), {}, 0, kc::Isa::kAvx512).tile(), 1);
  EXPECT_EQ(kc::MaskedWeight(at::zeros({4, 16}), {}, 0, kc::Isa::kAvx2).tile(), 4);
  EXPECT_FALSE(kc::MaskedWeight(at::zeros({4, 16}), {}, 4).runs_on(kc::Isa::kAvx512));
  // A bfloat16 2:4 weight goes in panels by default where the ISA multiplies them; unstructured,
  // or in float32, it keeps its rows.
  {
    const at::Tensor w24 =
        at::tensor({1.f, 0.f, 2.f, 0.f, 0.f, 3.f, 0.f, 4.f}).repeat({5, 2}).to(at::kBFloat16);
    for (kc::Isa isa : isas()) {
      const int rows = isa == kc::Isa::kAvx512 ? 1 : 4;
      EXPECT_EQ(kc::MaskedWeight(w24, {}, 0, isa).tile(),
                kc::MaskedWeight::takes_panels(isa, true) ? 16 : rows);
      EXPECT_EQ(kc::MaskedWeight(w24.to(at::kFloat), {}, 0, isa).tile(), rows);
      EXPECT_EQ(kc::MaskedWeight(at::ones({5, 16}, at::kBFloat16), {}, 0, isa).tile(), rows);
    }
  }
  // Panels of 16 rows run on every ISA.
  EXPECT_TRUE(kc::MaskedWeight(at::zeros({4, 16}), {}, 16).runs_on(kc::Isa::kAvx512));
  EXPECT_TRUE(
      kc::MaskedWeight(at::zeros({4, 16}, at::kBFloat16), {}, 16).runs_on(kc::Isa::kAvx512));
  EXPECT_TRUE(kc::MaskedWeight(at::zeros({4, 16}, at::kBFloat16), {}, 16).runs_on(kc::Isa::kAvx2));
  EXPECT_THROW(sw.linear(at::zeros({2, 8}), kc::Algo::kGather, {}, kc::Isa::kScalar),
               lopper::Error);
  // Nonzeros counted as ATen counts them: -0 is zero, NaN and denormals are not; float32 and
  // bfloat16 by lopper's count (odd sizes, across the threads' parts), others by ATen.
  at::Tensor v = at::randn({999919}) * (at::rand({999919}) > 0.3);
  v[0] = -0.0f;
  v[1] = std::numeric_limits<float>::quiet_NaN();
  v[2] = std::numeric_limits<float>::denorm_min();
  for (const at::Tensor& t : {v, v.to(at::kBFloat16), v.to(at::kDouble), v.view({1009, -1}).t()})
    EXPECT_EQ(kc::count_nonzero(t), t.count_nonzero().item<int64_t>()) << t.scalar_type();
}

// lopper's own CUDA kernel: the packing (runs anywhere: CSR with 16-bit column indices, indices
// past 32767 included) and, on a GPU, every dtype against cuBLAS's dense result.
TEST(SparseKernelsCuda, PacksCsrWithSixteenBitIndices) {
  namespace kcu = lopper::kernels::cuda;
  at::Generator gen = at::detail::createCPUGenerator(5);
  at::Tensor w = at::randn({7, 65536}, gen) * (at::rand({7, 65536}, gen) >= 0.999);
  w[2].zero_();         // an empty row
  w[3][65535] = 1.5f;   // the last column: 0xffff as an index
  w[4][40000] = -2.0f;  // past int16's range
  ASSERT_TRUE(kcu::SparseWeightCuda::fits(w));
  EXPECT_FALSE(kcu::SparseWeightCuda::fits(at::zeros({2, 65537})));
  kcu::SparseWeightCuda sw(w, at::Tensor(), at::kFloat, at::kCPU);
  EXPECT_EQ(sw.nonzeros(), w.count_nonzero().item<int64_t>());
  at::Tensor dense = at::zeros_like(w);
  auto ptr = sw.row_ptr().accessor<int32_t, 1>();
  auto col = sw.col().accessor<int16_t, 1>();
  auto val = sw.values().accessor<float, 1>();
  int64_t padding = 0;
  for (int64_t r = 0; r < w.size(0); ++r) {
    // Rows start at and hold multiples of kVec entries; padding is a zero at a real column.
    EXPECT_EQ(ptr[r] % kcu::kVec, 0);
    const int64_t real = w[r].count_nonzero().item<int64_t>();
    EXPECT_EQ(ptr[r + 1] - ptr[r], (real + kcu::kVec - 1) / kcu::kVec * kcu::kVec);
    for (int32_t j = ptr[r]; j < ptr[r + 1]; ++j) {
      if (val[j] == 0.0f) {
        ++padding;
        EXPECT_NE(w[r][uint16_t(col[j])].item<float>(), 0.0f) << "padding off the row's columns";
      }
      dense[r][uint16_t(col[j])] += val[j];
    }
  }
  EXPECT_TRUE(at::equal(dense, w));
  EXPECT_EQ(ptr[w.size(0)], sw.nonzeros() + padding);
  EXPECT_EQ(ptr[3] - ptr[2], 0);
  EXPECT_THROW(kcu::SparseWeightCuda(w, at::zeros({6}), at::kFloat, at::kCPU), lopper::Error);
  EXPECT_THROW(kcu::SparseWeightCuda(w, at::Tensor(), at::kInt, at::kCPU), lopper::Error);
}

TEST(SparseKernelsCuda, EveryDtypeMatchesCublasDense) {
  namespace kcu = lopper::kernels::cuda;
  if (!lopper::cuda_available()) GTEST_SKIP() << "no CUDA GPU here";
  if (!kcu::built()) GTEST_SKIP() << "built without nvcc";
  std::mt19937 rng(7);
  at::manual_seed(3);
  const at::Device dev(at::kCUDA, 0);
  int checked = 0;
  for (at::ScalarType dtype : {at::kFloat, at::kHalf, at::kBFloat16}) {
    // fp32 accumulation in both and the same rounding of the inputs; the outputs' rounding to 16
    // bits can differ by one unit in the last place where the fp32 sums straddle a step.
    const double tol = dtype == at::kFloat ? 1e-10 : dtype == at::kHalf ? 2e-5 : 2e-4;
    for (int i = 0; i < 40; ++i) {
      const int64_t n = std::vector<int64_t>{1, 7, 32, 33, 257, 1024}[rng() % 6];
      const int64_t k = std::vector<int64_t>{1, 5, 64, 97, 4096, 65536}[rng() % 6];
      const int64_t m = std::vector<int64_t>{1, 2, 3, 8, 16, 17, 40}[rng() % 7];
      const double sparsity = std::vector<double>{0.0, 0.5, 0.9, 0.99, 1.0}[rng() % 5];
      at::Tensor w = at::randn({n, k}) * (at::rand({n, k}) >= sparsity);
      if (rng() % 3 == 0) w.narrow(0, 0, (n + 1) / 2).zero_();
      at::Tensor b = rng() % 2 ? at::randn({n}) : at::Tensor();
      kcu::SparseWeightCuda sw(w, b, dtype, dev);
      at::Tensor x = at::randn({m, k}).to(dev, dtype);
      at::Tensor y = sw.linear(x);
      at::Tensor ref = at::linear(x.to(at::kFloat), w.to(dev, dtype).to(at::kFloat),
                                  b.defined() ? b.to(dev, dtype).to(at::kFloat) : at::Tensor());
      SCOPED_TRACE(std::string(at::toString(dtype)) + " n=" + std::to_string(n) +
                   " k=" + std::to_string(k) + " m=" + std::to_string(m) +
                   " sparsity=" + std::to_string(sparsity));
      ASSERT_EQ(y.scalar_type(), dtype);
      // y is rounded to the dtype once; compare in its precision.
      ASSERT_LT(nmse(y.cpu(), ref.to(dtype).cpu().to(at::kDouble)), tol);
      ++checked;
    }
  }
  EXPECT_EQ(checked, 120);
}

// 2:4 on the sparse tensor cores: which weights qualify (runs anywhere), and on a GPU each
// backend this libtorch has against cuBLAS's dense result, odd output and batch counts included.
TEST(SemiStructuredCuda, DetectsTwoFourWeights) {
  namespace kcu = lopper::kernels::cuda;
  at::manual_seed(11);
  at::Tensor w = at::randn({48, 128});
  EXPECT_FALSE(kcu::is_two_four(w));
  // Keep the 2 largest |w| of every 4 consecutive inputs, as `prune --pattern 2:4` does.
  at::Tensor g = w.view({48, 32, 4});
  at::Tensor keep =
      at::zeros_like(g, at::kBool).scatter_(-1, std::get<1>(g.abs().topk(2, -1)), true);
  at::Tensor w24 = (g * keep).view({48, 128});
  EXPECT_TRUE(kcu::is_two_four(w24));
  EXPECT_TRUE(kcu::semi_fits(w24, at::kBFloat16));
  EXPECT_TRUE(kcu::semi_fits(w24, at::kHalf));
  EXPECT_FALSE(kcu::semi_fits(w24, at::kFloat));  // tensor cores: 16-bit only
  EXPECT_FALSE(kcu::semi_fits(w24.narrow(1, 0, 96).contiguous(), at::kHalf));  // k % 64
  EXPECT_FALSE(kcu::is_two_four(w24.t().contiguous()));   // groups run along the inputs
  EXPECT_FALSE(kcu::is_two_four(at::zeros({8, 64})));     // nothing to multiply
  EXPECT_FALSE(kcu::is_two_four(w24.narrow(1, 0, 126)));  // k % 4
  at::Tensor three = w24.clone();
  three[5][1] = three[5][2] = three[5][3] = three[5][0] = 1.0f;  // 4 of 4 in one group
  EXPECT_FALSE(kcu::is_two_four(three));
  EXPECT_THROW(kcu::SemiStructuredWeight(kcu::SemiBackend::kCutlass, w24, {}, at::kHalf, at::kCPU),
               lopper::Error);
  EXPECT_STREQ(kcu::semi_name(kcu::SemiBackend::kCusparselt), "cuda-2:4-cusparselt");
}

TEST(SemiStructuredCuda, EveryBackendMatchesCublasDense) {
  namespace kcu = lopper::kernels::cuda;
  if (!lopper::cuda_available()) GTEST_SKIP() << "no CUDA GPU here";
  std::mt19937 rng(13);
  at::manual_seed(5);
  const at::Device dev(at::kCUDA, 0);
  int checked = 0, refused = 0;
  for (auto backend : {kcu::SemiBackend::kCusparselt, kcu::SemiBackend::kCutlass}) {
    if (!kcu::semi_compiled(backend)) continue;
    for (at::ScalarType dtype : {at::kHalf, at::kBFloat16}) {
      for (int i = 0; i < 12; ++i) {
        const int64_t n = std::vector<int64_t>{32, 40, 256, 1000}[rng() % 4];
        const int64_t k = std::vector<int64_t>{64, 128, 1024}[rng() % 3];
        const int64_t m = std::vector<int64_t>{1, 8, 13, 64, 300}[rng() % 5];
        at::Tensor g = at::randn({n, k / 4, 4});
        at::Tensor keep =
            at::zeros_like(g, at::kBool).scatter_(-1, std::get<1>(g.abs().topk(2, -1)), true);
        at::Tensor w = (g * keep).view({n, k});
        at::Tensor b = rng() % 2 ? at::randn({n}) : at::Tensor();
        SCOPED_TRACE(std::string(kcu::semi_name(backend)) + " " + at::toString(dtype) + " n=" +
                     std::to_string(n) + " k=" + std::to_string(k) + " m=" + std::to_string(m));
        std::unique_ptr<kcu::SemiStructuredWeight> sw;
        try {
          sw = std::make_unique<kcu::SemiStructuredWeight>(backend, w, b, dtype, dev);
        } catch (const lopper::Error&) {
          ++refused;  // e.g. CUTLASS's kernels on a GPU they were not built for
          continue;
        }
        at::Tensor x = at::randn({m, k}).to(dev, dtype);
        at::Tensor y = sw->linear(x);
        at::Tensor ref = at::linear(x.to(at::kFloat), w.to(dev, dtype).to(at::kFloat),
                                    b.defined() ? b.to(dev, dtype).to(at::kFloat) : at::Tensor());
        ASSERT_EQ(y.sizes(), ref.sizes());
        ASSERT_EQ(y.scalar_type(), dtype);
        ASSERT_LT(nmse(y.cpu(), ref.to(dtype).cpu().to(at::kDouble)),
                  dtype == at::kHalf ? 1e-5 : 1e-4);
        ++checked;
      }
    }
  }
  // cuSPARSELt runs on every GPU the wheel supports from sm_80 up; a pre-Ampere GPU refuses all.
  EXPECT_GT(checked + refused, 0);
  if (at::cuda::getCurrentDeviceProperties()->major >= 8) EXPECT_GE(checked, 24);
}

// lopper's GPU max pool against ATen's on the CPU over a -inf-padded copy (windows that overhang
// the input, as ceil mode makes them, included): every layout, dtype and vector tail, exactly.
TEST(PoolKernelsCuda, MaxPoolMatchesAtenOnEveryLayoutAndDtype) {
  namespace kcu = lopper::kernels::cuda;
  if (!lopper::cuda_available()) GTEST_SKIP() << "no CUDA GPU here";
  if (!kcu::built()) GTEST_SKIP() << "built without nvcc";
  struct Geom {
    int64_t k0, k1, s0, s1, p0, p1, d0, d1, extra;  // extra: output pixels past floor mode
  };
  const Geom geoms[] = {{3, 3, 2, 2, 1, 1, 1, 1, 0},   // ResNet's pool
                        {2, 2, 2, 2, 0, 0, 1, 1, 0},   // VGG's
                        {3, 3, 2, 2, 0, 0, 1, 1, 1},   // ceil mode: the last window overhangs
                        {3, 2, 1, 2, 0, 1, 1, 1, 0},   // asymmetric
                        {3, 3, 1, 1, 2, 2, 2, 2, 0}};  // dilated
  const int64_t channels[] = {1, 3, 8, 37, 64};
  at::manual_seed(11);
  const at::Device dev(at::kCUDA, 0);
  int checked = 0;
  for (const Geom& g : geoms)
    for (int64_t c : channels)
      for (at::ScalarType dtype : {at::kFloat, at::kHalf, at::kBFloat16})
        for (bool cl : {false, true}) {
          const int64_t n = 2, h = 13, w = 10;
          at::Tensor xc = at::randn({n, c, h, w}).to(dtype);
          xc[1][c - 1][h / 2][w / 2] = std::numeric_limits<float>::quiet_NaN();
          at::Tensor x = xc.to(dev).contiguous(cl ? at::MemoryFormat::ChannelsLast
                                                  : at::MemoryFormat::Contiguous);
          ASSERT_TRUE(kcu::max_pool2d_fits(x));
          const int64_t oh = (h + 2 * g.p0 - (g.k0 - 1) * g.d0 - 1) / g.s0 + 1 + g.extra;
          const int64_t ow = (w + 2 * g.p1 - (g.k1 - 1) * g.d1 - 1) / g.s1 + 1 + g.extra;
          at::Tensor y =
              kcu::max_pool2d(x, {g.k0, g.k1}, {g.s0, g.s1}, {g.p0, g.p1}, {g.d0, g.d1}, {oh, ow});
          // Reference: pad with -inf on both sides, enough for the overhang, then floor mode.
          const int64_t e0 = (oh - 1) * g.s0 + (g.k0 - 1) * g.d0 + 1 - h - g.p0;
          const int64_t e1 = (ow - 1) * g.s1 + (g.k1 - 1) * g.d1 + 1 - w - g.p1;
          at::Tensor xp = at::constant_pad_nd(
              xc.to(at::kFloat), {g.p1, std::max<int64_t>(e1, 0), g.p0, std::max<int64_t>(e0, 0)},
              -std::numeric_limits<double>::infinity());
          at::Tensor ref = at::max_pool2d(xp, {g.k0, g.k1}, {g.s0, g.s1}, {0, 0}, {g.d0, g.d1})
                               .narrow(2, 0, oh)
                               .narrow(3, 0, ow);
          SCOPED_TRACE(std::string(at::toString(dtype)) + (cl ? " NHWC" : " NCHW") +
                       " c=" + std::to_string(c) + " k=" + std::to_string(g.k0) + "x" +
                       std::to_string(g.k1) + " extra=" + std::to_string(g.extra));
          ASSERT_EQ(y.sizes(), ref.sizes());
          EXPECT_EQ(y.scalar_type(), dtype);
          EXPECT_EQ(y.is_contiguous(at::MemoryFormat::ChannelsLast) && !y.is_contiguous(),
                    cl && c > 1);
          at::Tensor got = y.cpu().to(at::kFloat);
          EXPECT_TRUE(at::equal(got.isnan(), ref.isnan()));
          EXPECT_TRUE(at::equal(got.nan_to_num(0, 1e30, -1e30), ref.nan_to_num(0, 1e30, -1e30)));
          ++checked;
        }
  EXPECT_EQ(checked, 5 * 5 * 3 * 2);
}
