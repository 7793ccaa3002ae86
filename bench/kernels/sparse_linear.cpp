// Google Benchmark: lopper's sparse kernels against dense ATen (MKL/OpenBLAS through at::linear)
// and oneDNN on a Linear layer, y = x . W^T + b. bench/sparse_kernels.py runs it, turns the
// times into speedups and the crossover sparsity, and writes docs/bench-sparse-kernels.json.
//
//   build/bench/lopper_kernel_bench --benchmark_filter='768x3072'
//
// Arguments of every benchmark: in, out, batch, sparsity (%). Weights are pruned at random
// (unstructured: CSR) or by blocks (block:8x1: the 8x1 format), with torch's L1 order irrelevant
// for speed; x is random.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <benchmark/benchmark.h>

#include <chrono>
#include <map>
#include <memory>
#include <vector>

#include "exec/allocator.h"
#include "exec/onednn.h"
#include "kernels/cpu/sparse.h"
#include "kernels/cuda/semi_structured.h"
#include "kernels/cuda/sparse_cuda.h"
#include "lopper/executor.h"

namespace kc = lopper::kernels::cpu;

namespace {

at::Tensor pruned_weight(int64_t out, int64_t in, double sparsity, kc::BlockShape b) {
  at::manual_seed(7);
  at::Tensor w = at::randn({out, in});
  at::Tensor keep = at::rand({(out + b.r - 1) / b.r, (in + b.c - 1) / b.c}) >= sparsity;
  keep =
      keep.repeat_interleave(b.r, 0).repeat_interleave(b.c, 1).narrow(0, 0, out).narrow(1, 0, in);
  return (w * keep).contiguous();
}

struct Shape {
  int64_t in, out, batch;
  double sparsity;
  explicit Shape(const benchmark::State& s)
      : in(s.range(0)), out(s.range(1)), batch(s.range(2)), sparsity(s.range(3) / 100.0) {}
};

void set_counters(benchmark::State& state, const Shape& s) {
  state.counters["MACs_dense"] = double(s.in * s.out * s.batch);
  state.counters["aten_threads"] = at::get_num_threads();
}

void BM_DenseAten(benchmark::State& state) {
  Shape s(state);
  at::Tensor w = pruned_weight(s.out, s.in, s.sparsity, {1, 1});
  at::Tensor b = at::randn({s.out}), x = at::randn({s.batch, s.in});
  for (auto _ : state) benchmark::DoNotOptimize(at::linear(x, w, b));
  set_counters(state, s);
}

void BM_DenseOnednn(benchmark::State& state) {
  Shape s(state);
  at::Tensor w = pruned_weight(s.out, s.in, s.sparsity, {1, 1});
  at::Tensor b = at::randn({s.out}), x = at::randn({s.batch, s.in});
  at::Tensor packed = lopper::ops::onednn::pack_linear_weight(w, s.batch);
  for (auto _ : state) benchmark::DoNotOptimize(lopper::ops::onednn::linear(x, packed, b, {}));
  set_counters(state, s);
}

template <int R, int C, kc::Algo A>
void BM_Sparse(benchmark::State& state) {
  Shape s(state);
  kc::BlockShape blk{R, C};
  at::Tensor w = pruned_weight(s.out, s.in, s.sparsity, blk);
  at::Tensor b = at::randn({s.out}), x = at::randn({s.batch, s.in});
  kc::SparseWeight sw(w, blk, b);
  at::Tensor y = at::empty({s.batch, s.out});
  const kc::Isa isa = kc::active_isa();
  for (auto _ : state) {
    sw.linear_into(x, y, A, {}, isa);
    benchmark::ClobberMemory();
  }
  set_counters(state, s);
  state.counters["stored"] = double(sw.stored());
  state.SetLabel(std::string(kc::isa_name(isa)));
}

// The cols kernel in bfloat16 (weights in pairs, AVX512_BF16): x and y bfloat16. Named bf16-*, so
// that bench/sparse_kernels.py's float32 tables leave it out.
template <int R, int C>
void BM_SparseBf16(benchmark::State& state) {
  Shape s(state);
  kc::BlockShape blk{R, C};
  at::Tensor w = pruned_weight(s.out, s.in, s.sparsity, blk).to(at::kBFloat16).to(at::kFloat);
  at::Tensor b = at::randn({s.out}), x = at::randn({s.batch, s.in}).to(at::kBFloat16);
  kc::SparseWeight sw(w, blk, b, true);
  const kc::Isa isa = kc::active_isa();
  if (!sw.runs_bf16(isa)) {
    state.SkipWithError("no AVX512_BF16 on this CPU");
    return;
  }
  for (auto _ : state) benchmark::DoNotOptimize(sw.linear_bf16(x, {}, isa));
  set_counters(state, s);
  state.counters["stored"] = double(sw.stored());
  state.SetLabel(std::string(kc::isa_name(isa)) + " bf16");
}

void shapes(benchmark::internal::Benchmark* b, bool dense) {
  for (auto [in, out] : {std::pair<int64_t, int64_t>{768, 3072}, {3072, 768}})
    for (int64_t batch : {1, 8, 32, 128})
      for (int64_t sp : {50, 70, 80, 90, 95}) {
        if (dense && sp != 90) continue;  // dense time does not depend on the zeros
        b->Args({in, out, batch, sp});
      }
  b->ArgNames({"in", "out", "batch", "sparsity"})->Unit(benchmark::kMicrosecond)->UseRealTime();
}
void dense_shapes(benchmark::internal::Benchmark* b) { shapes(b, true); }
void sparse_shapes(benchmark::internal::Benchmark* b) { shapes(b, false); }

}  // namespace

BENCHMARK(BM_DenseAten)->Apply(dense_shapes);
BENCHMARK(BM_DenseOnednn)->Apply(dense_shapes);
BENCHMARK(BM_Sparse<1, 1, kc::Algo::kCols>)->Name("csr-cols")->Apply(sparse_shapes);
BENCHMARK(BM_Sparse<1, 1, kc::Algo::kGather>)->Name("csr-gather")->Apply(sparse_shapes);
BENCHMARK(BM_Sparse<1, 1, kc::Algo::kDot>)->Name("csr-dot")->Apply(sparse_shapes);
BENCHMARK(BM_Sparse<1, 4, kc::Algo::kCols>)->Name("bcsr1x4-cols")->Apply(sparse_shapes);
BENCHMARK(BM_Sparse<4, 1, kc::Algo::kRows>)->Name("bcsr4x1-rows")->Apply(sparse_shapes);
BENCHMARK(BM_Sparse<4, 1, kc::Algo::kCols>)->Name("bcsr4x1-cols")->Apply(sparse_shapes);
BENCHMARK(BM_Sparse<8, 1, kc::Algo::kRows>)->Name("bcsr8x1-rows")->Apply(sparse_shapes);
BENCHMARK(BM_Sparse<8, 1, kc::Algo::kCols>)->Name("bcsr8x1-cols")->Apply(sparse_shapes);
BENCHMARK(BM_SparseBf16<1, 1>)->Name("bf16-csr-cols")->Apply(sparse_shapes);
BENCHMARK(BM_SparseBf16<1, 4>)->Name("bf16-bcsr1x4-cols")->Apply(sparse_shapes);
BENCHMARK(BM_SparseBf16<4, 1>)->Name("bf16-bcsr4x1-cols")->Apply(sparse_shapes);
BENCHMARK(BM_SparseBf16<8, 1>)->Name("bf16-bcsr8x1-cols")->Apply(sparse_shapes);

namespace {

// The decode regime: a few rows of x against a weight far larger than the caches,
// unstructured 50% (random) or 2:4, float32 or bfloat16 weights; dense ATen in the same dtype.
// Arguments: in, out, batch, sparsity (%; 24: 2:4), bf16 (0/1), tile (the bitmask format's rows
// per tile: 1, 4, or 0: the active ISA's; dense ignores it).
at::Tensor decode_weight(int64_t out, int64_t in, int64_t sp) {
  at::manual_seed(7);
  at::Tensor w = at::randn({out, in});
  if (sp == 24) {  // the 2 largest |w| of every 4 (by index: ties keep 2 too)
    const at::Tensor g = w.abs().reshape({out, -1, 4});
    const at::Tensor keep = at::zeros_like(g).scatter_(-1, std::get<1>(g.topk(2, -1)), 1.0);
    return (w * keep.reshape({out, in})).contiguous();
  }
  return (w * (at::rand({out, in}) >= double(sp) / 100.0)).contiguous();
}

void BM_DecodeDense(benchmark::State& state) {
  const int64_t in = state.range(0), out = state.range(1), batch = state.range(2);
  const auto dt = state.range(4) ? at::kBFloat16 : at::kFloat;
  at::Tensor w = decode_weight(out, in, 50).to(dt);
  at::Tensor b = at::randn({out}).to(dt), x = at::randn({batch, in}).to(dt);
  for (auto _ : state) benchmark::DoNotOptimize(at::linear(x, w, b));
  state.counters["bytes"] = double(w.numel() * w.element_size());
}

// lopper's dense GEMV (a classifier at batch 1 picks it): its panels streamed once per 4 rows of
// x; bf16 in pairs of inputs on the CPU's bfloat16 dot product, where it has one.
void BM_DecodeGemv(benchmark::State& state) {
  const int64_t in = state.range(0), out = state.range(1), batch = state.range(2);
  const kc::Isa isa = kc::active_isa();
  if (state.range(4) && !kc::DenseGemv::takes_bf16(isa))
    return state.SkipWithError("no bfloat16 dot product on this CPU");
  const auto dt = state.range(4) ? at::kBFloat16 : at::kFloat;
  at::Tensor w = decode_weight(out, in, 50).to(dt);
  at::Tensor b = at::randn({out}), x = at::randn({batch, in}).to(dt);
  const kc::DenseGemv g(w, isa);
  for (auto _ : state) benchmark::DoNotOptimize(g.linear(x, b, {}));
  state.counters["bytes"] = double(w.numel() * w.element_size());
}

void BM_DecodeMasked(benchmark::State& state) {
  const int64_t in = state.range(0), out = state.range(1), batch = state.range(2);
  const auto dt = state.range(4) ? at::kBFloat16 : at::kFloat;
  at::Tensor w = decode_weight(out, in, state.range(3)).to(dt);
  at::Tensor b = at::randn({out}), x = at::randn({batch, in}).to(dt);
  const kc::Isa isa = kc::active_isa();
  kc::MaskedWeight mw(w, b, int(state.range(5)), isa);
  if (!mw.runs_on(isa)) return state.SkipWithError("this ISA takes a row per tile");
  for (auto _ : state) benchmark::DoNotOptimize(mw.linear(x, {}, isa));
  state.counters["bytes"] = double(mw.bytes());
  state.SetLabel(std::string(kc::isa_name(isa)) + (mw.pairs() ? " 2:4" : ""));
}

void decode_shapes(benchmark::internal::Benchmark* b, bool masked) {
  // NOTE: 16384 x 32768 (1 GB in bf16) is past any cache: DRAM's bandwidth; 2048 x 128 (0.5 MB
  // at 50% in float32) stays in L2: the kernel's own speed, memory aside.
  for (auto [in, out] : {std::pair<int64_t, int64_t>{2048, 128},
                         {4096, 4096},
                         {4096, 11008},
                         {11008, 4096},
                         {16384, 32768}})
    for (int64_t batch : {1, 4, 16})
      for (int64_t sp : {50, 24})
        for (int64_t bf16 : {0, 1}) {
          b->Args({in, out, batch, sp, bf16, 0});
          if (masked) b->Args({in, out, batch, sp, bf16, 16});  // panels of 16 rows
        }
  b->ArgNames({"in", "out", "batch", "sparsity", "bf16", "tile"})
      ->Unit(benchmark::kMicrosecond)
      ->UseRealTime();
}
void dense_decode_shapes(benchmark::internal::Benchmark* b) { decode_shapes(b, false); }
void masked_decode_shapes(benchmark::internal::Benchmark* b) { decode_shapes(b, true); }

}  // namespace

BENCHMARK(BM_DecodeDense)->Apply(dense_decode_shapes);
BENCHMARK(BM_DecodeGemv)->Apply(dense_decode_shapes);
BENCHMARK(BM_DecodeMasked)->Apply(masked_decode_shapes);
// Rows in tiles of 1 and of 4 side by side (AVX2: one stream per 4 rows against four), and
// bfloat16 panels of 16 rows.
BENCHMARK(BM_DecodeMasked)
    ->Name("BM_DecodeMaskedTile")
    ->ArgNames({"in", "out", "batch", "sparsity", "bf16", "tile"})
    ->ArgsProduct({{2048}, {5632}, {1}, {50, 24}, {0, 1}, {1, 4, 16}})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

// On a GPU (registered only where one is): lopper's sparse kernel against cuBLAS for the decode
// shape, W 8192x8192 bf16, batch 1-16, 90% and 95% zero. Each timed iteration is 20 launches and
// one synchronisation.
namespace kcu = lopper::kernels::cuda;

// 5 warm-up launches, then each timed iteration is 20 launches and one synchronisation.
template <typename F>
void time_on_gpu(benchmark::State& state, F&& once) {
  for (int i = 0; i < 5; ++i) once();
  kcu::synchronize();
  for (auto _ : state) {
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 20; ++i) once();
    kcu::synchronize();
    state.SetIterationTime(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 20);
  }
}

// The weights rotate over copies that together outgrow the GPU's L2 cache (50 MB on an H100, 60 on
// an H200): the sparse 8192x8192 weight at 90% is about 27 MB and would otherwise be read from L2
// on every launch after the first, while the dense one (128 MB) never fits. Built once per sparsity
// (Google Benchmark calls a benchmark several times while it settles the iteration count).
template <bool kSparse>
void BM_Cuda(benchmark::State& state) {
  const int64_t batch = state.range(0);
  const int64_t percent = state.range(1);
  const at::Device dev(at::kCUDA, 0);
  // Each instantiation (dense, sparse) builds only its own copies.
  static std::map<int64_t, std::vector<at::Tensor>> dense_copies;
  static std::map<int64_t, std::vector<std::shared_ptr<kcu::SparseWeightCuda>>> sparse_copies;
  auto& wd = dense_copies[percent];
  auto& sw = sparse_copies[percent];
  if (wd.empty() && sw.empty()) {
    at::Tensor w = pruned_weight(8192, 8192, percent / 100.0, {1, 1});
    for (int i = 0; i < (kSparse ? 8 : 2); ++i) {
      if (kSparse)
        sw.push_back(std::make_shared<kcu::SparseWeightCuda>(w, at::Tensor(), at::kBFloat16, dev));
      else
        wd.push_back(w.to(dev, at::kBFloat16));
    }
  }
  at::Tensor x = at::randn({batch, 8192}).to(dev, at::kBFloat16);
  size_t i = 0;
  auto once = [&] {
    ++i;
    benchmark::DoNotOptimize(kSparse ? sw[i % sw.size()]->linear(x)
                                     : at::linear(x, wd[i % wd.size()]));
  };
  time_on_gpu(state, once);
  state.counters["MACs_dense"] = double(8192 * 8192 * batch);
}

// 2:4 on the sparse tensor cores against cuBLAS on the same weight (8192x8192 bf16, two of every
// four inputs zero) for large batches, where the GEMM is compute-bound. Timed as above.
enum class Dense24 { kCublas, kCusparselt, kCutlass };

template <Dense24 kKind>
void BM_Cuda24(benchmark::State& state) {
  const int64_t batch = state.range(0);
  const at::Device dev(at::kCUDA, 0);
  at::Tensor g = at::randn({8192, 8192 / 4, 4});
  at::Tensor keep =
      at::zeros_like(g, at::kBool).scatter_(-1, std::get<1>(g.abs().topk(2, -1)), true);
  at::Tensor w = (g * keep).view({8192, 8192});
  at::Tensor x = at::randn({batch, 8192}).to(dev, at::kBFloat16);
  at::Tensor wd = w.to(dev, at::kBFloat16);
  std::unique_ptr<kcu::SemiStructuredWeight> sw;
  try {
    if (kKind != Dense24::kCublas)
      sw = std::make_unique<kcu::SemiStructuredWeight>(kKind == Dense24::kCusparselt
                                                           ? kcu::SemiBackend::kCusparselt
                                                           : kcu::SemiBackend::kCutlass,
                                                       w, at::Tensor(), at::kBFloat16, dev);
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
    return;
  }
  auto once = [&] { benchmark::DoNotOptimize(sw ? sw->linear(x) : at::linear(x, wd)); };
  time_on_gpu(state, once);
  state.counters["MACs_dense"] = double(8192) * 8192 * double(batch);
}

void register_cuda() {
  if (!lopper::cuda_available()) return;
  for (auto [name, fn] : {std::pair{"Cuda24Cublas", &BM_Cuda24<Dense24::kCublas>},
                          {"Cuda24Cusparselt", &BM_Cuda24<Dense24::kCusparselt>},
                          {"Cuda24Cutlass", &BM_Cuda24<Dense24::kCutlass>}})
    for (int64_t batch : {2048, 4096, 8192})
      benchmark::RegisterBenchmark(name, fn)
          ->Args({batch, 50})
          ->ArgNames({"batch", "sparsity"})
          ->UseManualTime()
          ->Unit(benchmark::kMicrosecond);
  if (!kcu::built()) return;
  for (auto [name, fn] : {std::pair{"CudaCublas", &BM_Cuda<false>}, {"CudaCsr16", &BM_Cuda<true>}})
    for (int64_t batch : {1, 4, 16})
      for (int64_t sp : {90, 95})
        benchmark::RegisterBenchmark(name, fn)
            ->Args({batch, sp})
            ->ArgNames({"batch", "sparsity"})
            ->UseManualTime()
            ->Unit(benchmark::kMicrosecond);
}

int main(int argc, char** argv) {
  register_cuda();
  // NOTE: the same pool configuration as `lopper bench` (one intra-op thread per core).
  at::set_num_interop_threads(1);
  // And the executor's allocator: without it every large output is fresh pages from the OS, and
  // the page faults, not the kernels, are timed.
  lopper::exec::install_caching_cpu_allocator();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
