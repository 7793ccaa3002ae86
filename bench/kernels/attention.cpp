// Google Benchmark: lopper's attention kernel (kernels::cpu::scaled_attention) on the head views a
// fused QKV projection hands it, as BERT's and ViT's layers do: q, k and v of one [seq, 3 x heads
// x d] matrix, kt the keys transposed (a view), float32 or bfloat16.
//
//   build/bench/lopper_kernel_bench --benchmark_filter='Attention'
//
// Arguments: heads, seq (queries = keys), d, bf16 (0/1).
#include <ATen/ATen.h>
#include <benchmark/benchmark.h>

#include <cmath>
#include <string>

#include "kernels/cpu/rows.h"

namespace kc = lopper::kernels::cpu;

namespace {

void BM_Attention(benchmark::State& state) {
  const int64_t heads = state.range(0), seq = state.range(1), d = state.range(2);
  const bool bf16 = state.range(3) != 0;
  at::manual_seed(3);
  at::Tensor qkv = at::randn({seq, 3, heads, d});
  if (bf16) qkv = qkv.to(at::kBFloat16);
  // [heads, seq, d] views; kt [heads, d, seq]
  const at::Tensor q = qkv.select(1, 0).permute({1, 0, 2});
  const at::Tensor kt = qkv.select(1, 1).permute({1, 2, 0});
  const at::Tensor v = qkv.select(1, 2).permute({1, 0, 2});
  const kc::Isa isa = kc::active_isa();
  const float scale = 1.f / std::sqrt(float(d));
  for (auto _ : state) benchmark::DoNotOptimize(kc::scaled_attention(q, kt, v, scale, isa));
  // the two products' multiply-adds
  state.counters["MACs"] = double(heads) * seq * seq * d * 2;
  state.SetLabel(std::string(kc::isa_name(isa)) + (bf16 ? " bf16" : " fp32"));
}

}  // namespace

BENCHMARK(BM_Attention)
    ->ArgNames({"heads", "seq", "d", "bf16"})
    ->ArgsProduct({{12}, {128, 197}, {64}, {0, 1}})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();
