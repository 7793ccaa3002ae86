// Google Benchmark: lopper's dense NHWC convolution kernels (direct, depthwise) against oneDNN's
// convolution (weight reordered once, channels-last activations, bias and ReLU fused: what the
// executor runs otherwise) on the layers of the CNNs lopper is measured on: MobileNetV2's pointwise
// and depthwise layers, ResNet's 3x3 (also by Winograd's F(4x4, 3x3)), RegNet's grouped 3x3, the
// 3-channel first layer, and the odd channel counts a 50% structured pruning leaves. Part of
// lopper_kernel_bench:
//
//   build/bench/lopper_kernel_bench --benchmark_filter='Conv'
//
// Arguments of every benchmark: image side, input channels, output channels, kernel side, stride,
// groups (1: dense; 0: depthwise, one group per channel; n: n groups), batch. The executor times
// both on the real layer and keeps the faster.
#include <ATen/ATen.h>
#include <benchmark/benchmark.h>

#include "exec/onednn.h"
#include "kernels/cpu/bf16.h"
#include "kernels/cpu/chain.h"
#include "kernels/cpu/conv.h"
#include "kernels/cpu/winograd.h"

namespace kc = lopper::kernels::cpu;

namespace {

struct ConvArgs {
  int64_t side, c, k, kernel, stride, group, batch;
  explicit ConvArgs(const benchmark::State& s)
      : side(s.range(0)),
        c(s.range(1)),
        k(s.range(5) == 0 ? s.range(1) : s.range(2)),
        kernel(s.range(3)),
        stride(s.range(4)),
        group(s.range(5) == 0 ? s.range(1) : s.range(5)),
        batch(s.range(6)) {}
  int64_t pad() const { return kernel / 2; }
  // lopper's kernels' geometry of the layer (same padding, no dilation).
  kc::DirectConv::Geometry geometry() const {
    kc::DirectConv::Geometry g;
    g.sh = g.sw = stride;
    g.ph = g.pw = pad();
    return g;
  }
  at::Tensor weight() const { return at::randn({k, c / group, kernel, kernel}); }
  // A first layer's input (a few channels) as a model gets it, NCHW; the others channels-last.
  at::Tensor input() const {
    const at::Tensor x = at::randn({batch, c, side, side});
    return c <= 4 ? x : x.contiguous(at::MemoryFormat::ChannelsLast);
  }
  int64_t macs() const {
    const int64_t o = (side + 2 * pad() - kernel) / stride + 1;
    return batch * o * o * k * (c / group) * kernel * kernel;
  }
};

void counters(benchmark::State& state, const ConvArgs& a) {
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * a.macs(), benchmark::Counter::kIsIterationInvariantRate);
}

// oneDNN's convolution of the layer, float32 or (bf16) bf16 weight and channels-last activations.
void onednn_conv(benchmark::State& state, bool bf16) {
  const ConvArgs a(state);
  at::manual_seed(7);
  at::Tensor w = a.weight(), x = a.input();
  const at::Tensor b = at::randn({a.k});
  if (bf16) {
    w = w.to(at::kBFloat16);
    x = x.to(at::kBFloat16).contiguous(at::MemoryFormat::ChannelsLast);
  }
  const at::Tensor packed = lopper::ops::onednn::pack_conv2d_weight(
      w, {a.pad(), a.pad()}, {a.stride, a.stride}, {1, 1}, a.group, x.sizes());
  lopper::ops::onednn::PostOp relu;
  relu.attr = "relu";
  for (auto _ : state)
    benchmark::DoNotOptimize(lopper::ops::onednn::conv2d(
        x, packed, b, {a.pad(), a.pad()}, {a.stride, a.stride}, {1, 1}, a.group, relu));
  counters(state, a);
}

void BM_ConvOnednn(benchmark::State& state) { onednn_conv(state, false); }

void BM_ConvLopper(benchmark::State& state) {
  const ConvArgs a(state);
  at::manual_seed(7);
  const at::Tensor w = a.weight(), b = at::randn({a.k}), x = a.input();
  const kc::DirectConv::Geometry g = a.geometry();
  const kc::DirectConv conv(w, b, a.group, g);
  kc::Activation relu;
  relu.kind = kc::Activation::kRelu;
  for (auto _ : state) benchmark::DoNotOptimize(conv.run(x, {}, relu));
  counters(state, a);
  state.SetLabel(kc::isa_name(kc::active_isa()));
}

// The same with the caches emptied before each run (a 64 MB read, not timed): the weight, input
// and output come from memory, as in a model whose weights outgrow the last-level cache. On the
// AMD EPYC (Zen 4) a 56x56 1x1 layer took 10-20% longer so than warm.
void BM_ConvLopperCold(benchmark::State& state) {
  const ConvArgs a(state);
  at::manual_seed(7);
  const at::Tensor w = a.weight(), b = at::randn({a.k}), x = a.input();
  const kc::DirectConv conv(w, b, a.group, a.geometry());
  kc::Activation relu;
  relu.kind = kc::Activation::kRelu;
  std::vector<float> junk(size_t(16) << 20, 1.f);
  float sink = 0;
  for (auto _ : state) {
    state.PauseTiming();
    for (size_t i = 0; i < junk.size(); i += 16) sink += junk[i];
    state.ResumeTiming();
    benchmark::DoNotOptimize(conv.run(x, {}, relu));
  }
  benchmark::DoNotOptimize(sink);
  counters(state, a);
}

// bf16 in and out (--precision bf16): oneDNN's bf16 convolution, and lopper's direct one on the
// CPU's bfloat16 dot product (pairs of input channels, or of a first layer's kernel row's taps;
// skipped without AVX512_BF16 or for an odd channel count or groups).
void BM_ConvOnednnBf16(benchmark::State& state) { onednn_conv(state, true); }

void BM_ConvLopperBf16(benchmark::State& state) {
  const ConvArgs a(state);
  at::manual_seed(7);
  const at::Tensor w = a.weight().to(at::kBFloat16).to(at::kFloat), b = at::randn({a.k});
  const kc::DirectConv conv(w, b, a.group, a.geometry(), kc::active_isa(), true);
  if (!conv.takes_bf16()) {
    state.SkipWithError("no bfloat16 dot product, an odd channel count, or groups");
    return;
  }
  // (a first layer's few planes NCHW, as a model gets them: the kernel reads them in place)
  const at::Tensor x16 = a.input().to(at::kBFloat16);
  const at::Tensor x = a.c <= 4 ? x16 : x16.contiguous(at::MemoryFormat::ChannelsLast);
  kc::Activation relu;
  relu.kind = kc::Activation::kRelu;
  for (auto _ : state) benchmark::DoNotOptimize(conv.run(x, {}, relu));
  counters(state, a);
}

// Winograd F(4x4, 3x3) (kernels/cpu/winograd.h) on the same layers: the 3x3 ones of stride 1,
// dense or grouped; the others are skipped.
void BM_ConvWinograd(benchmark::State& state) {
  const ConvArgs a(state);
  at::manual_seed(7);
  const at::Tensor w = a.weight(), b = at::randn({a.k}), x = a.input();
  const kc::DirectConv::Geometry g = a.geometry();
  if (!kc::WinogradConv::takes(w, a.group, g)) {
    state.SkipWithError("not a 3x3 convolution of stride 1 (nor depthwise)");
    return;
  }
  const kc::WinogradConv conv(w, b, a.group, g);
  kc::Activation relu;
  relu.kind = kc::Activation::kRelu;
  for (auto _ : state) benchmark::DoNotOptimize(conv.run(x, {}, relu));
  counters(state, a);  // the direct convolution's arithmetic per second (what it replaces)
  state.SetLabel(kc::isa_name(kc::active_isa()));
}

// A first layer's input (3 planes of 224x224, batch 1) made channels-last, as the layer's oneDNN
// candidate reads it: ATen's strided copy (`aten` 1) or lopper's interleave (0); bf16 or float32.
void BM_FewChannelsLast(benchmark::State& state) {
  const bool aten = state.range(0) != 0, bf16 = state.range(1) != 0;
  at::manual_seed(7);
  at::Tensor x = at::randn({1, 3, 224, 224});
  if (bf16) x = x.to(at::kBFloat16);
  for (auto _ : state)
    benchmark::DoNotOptimize(aten ? x.contiguous(at::MemoryFormat::ChannelsLast)
                                  : kc::few_channels_last(x));
}

void conv_shapes(benchmark::internal::Benchmark* b) {
  // side, c, k, kernel, stride, groups
  const int64_t layers[][6] = {
      {224, 3, 32, 3, 2, 1},      // first layer (MobileNetV2)
      {224, 3, 64, 7, 2, 1},      // first layer (ResNet, DenseNet)
      {112, 32, 32, 3, 1, 0},     // depthwise
      {112, 32, 16, 1, 1, 1},     // projection
      {112, 16, 96, 1, 1, 1},     // expansion
      {56, 144, 144, 3, 1, 0},    // depthwise
      {112, 96, 96, 3, 2, 0},     // depthwise stride 2 (MobileNetV2's block 2)
      {56, 144, 144, 3, 2, 0},    // depthwise stride 2 (MobileNetV2's block 4)
      {56, 144, 24, 1, 1, 1},     // projection
      {56, 24, 144, 1, 1, 1},     // expansion
      {14, 384, 64, 1, 1, 1},     // projection
      {14, 64, 384, 1, 1, 1},     // expansion
      {14, 384, 384, 3, 1, 0},    // depthwise
      {7, 1152, 1152, 5, 1, 0},   // depthwise 5x5 (MnasNet): no interior run of four pixels
      {28, 240, 240, 5, 1, 0},    // depthwise 5x5 (MnasNet, EfficientNet) on a larger map
      {7, 960, 160, 1, 1, 1},     // projection
      {7, 320, 1280, 1, 1, 1},    // last pointwise
      {56, 64, 64, 3, 1, 1},      // ResNet-18 3x3
      {28, 128, 128, 3, 1, 1},    // ResNet-18 3x3
      {7, 512, 512, 3, 1, 1},     // ResNet-18 3x3
      {56, 72, 12, 1, 1, 1},      // pruned: 144 -> 72 expansion, 24 -> 12 projection
      {56, 12, 72, 1, 1, 1},      // pruned expansion
      {56, 72, 72, 3, 1, 0},      // pruned depthwise
      {56, 29, 29, 3, 1, 1},      // pruned ResNet 3x3, odd channels
      {28, 61, 61, 3, 1, 1},      // pruned ResNet 3x3, odd channels
      {28, 64, 16, 3, 1, 1},      // pruned DenseNet 3x3, block 2
      {14, 64, 16, 3, 1, 1},      // pruned DenseNet 3x3, block 3
      {7, 64, 16, 3, 1, 1},       // pruned DenseNet 3x3, block 4
      {112, 32, 32, 3, 2, 2},     // RegNetX-400MF grouped 3x3 (16 channels a group), stride 2
      {112, 64, 64, 3, 2, 4},     // RegNetX-800MF grouped 3x3, stride 2
      {28, 64, 64, 3, 1, 4},      // RegNetX-400MF grouped 3x3, stage 2
      {14, 160, 160, 3, 1, 10},   // RegNetX-400MF grouped 3x3, stage 3
      {7, 400, 400, 3, 1, 25},    // RegNetX-400MF grouped 3x3, stage 4
      {14, 288, 288, 3, 1, 18},   // RegNetX-800MF grouped 3x3, stage 3
      {112, 32, 32, 1, 1, 1},     // RegNetX-400MF block 1's first 1x1, after the first layer
      {224, 3, 24, 3, 2, 1},      // first layer (MnasNet 0.75)
      {112, 24, 24, 3, 1, 0},     // depthwise (MnasNet 0.75)
      {112, 24, 16, 1, 1, 1},     // projection (MnasNet 0.75)
      {56, 72, 24, 1, 1, 1},      // projection, 24 outputs: 1.5 vectors (MnasNet 0.75)
      {56, 24, 72, 1, 1, 1},      // expansion, 72 outputs: 4.5 vectors (MnasNet 0.75)
      {14, 432, 72, 1, 1, 1},     // projection (MnasNet 0.75)
      {56, 128, 256, 1, 1, 1},    // ResNeXt-50's layer 1 1x1 (ResNet-50's: 64 -> 256)
      {56, 256, 128, 1, 1, 1},    // ResNeXt-50's layer 1 1x1, the block's first
      {28, 512, 256, 1, 1, 1},    // ResNeXt-50's layer 2 1x1, the block's first
      {28, 256, 512, 1, 1, 1},    // ResNeXt-50's layer 2 1x1, the block's last
      {14, 1024, 512, 1, 1, 1},   // ResNeXt-50's layer 3 1x1, the block's first
      {56, 128, 128, 3, 1, 32},   // ResNeXt-50's layer 1 grouped 3x3 (4 channels a group)
      {28, 256, 256, 3, 1, 32},   // ResNeXt-50's layer 2 grouped 3x3 (8 channels a group)
      {56, 128, 128, 3, 2, 1},    // ResNet-50's layer 2 first 3x3, stride 2
      {14, 256, 256, 3, 1, 1},    // ResNet's layer 3 3x3
      {14, 512, 512, 3, 1, 32},   // ResNeXt-50's layer 3 grouped 3x3 (16 channels a group)
      {7, 1024, 1024, 3, 1, 32},  // ResNeXt-50's layer 4 grouped 3x3 (32 channels a group)
  };
  for (const auto& l : layers)
    for (int64_t batch : {1, 32}) b->Args({l[0], l[1], l[2], l[3], l[4], l[5], batch});
  b->ArgNames({"side", "c", "k", "kernel", "stride", "groups", "batch"})
      ->Unit(benchmark::kMicrosecond)
      ->UseRealTime();
}

// MobileNetV2's inverted residual block (1x1 expansion by 6, ReLU6; 3x3 depthwise, ReLU6; 1x1
// projection, the residual added where the stride is 1 and the channels match): lopper's three
// kernels layer by layer against the same three in one pass (kernels/cpu/chain.h). Arguments:
// image side, block input channels, expanded channels, output channels, depthwise stride, batch.
struct BlockArgs {
  int64_t side, c, m, k, stride, batch;
  explicit BlockArgs(const benchmark::State& s)
      : side(s.range(0)),
        c(s.range(1)),
        m(s.range(2)),
        k(s.range(3)),
        stride(s.range(4)),
        batch(s.range(5)) {}
  bool residual() const { return stride == 1 && c == k; }
};

kc::Activation relu6() {
  kc::Activation a;
  a.kind = kc::Activation::kClip, a.lo = 0, a.hi = 6;
  return a;
}

void BM_BlockLayers(benchmark::State& state) {
  const BlockArgs a(state);
  at::manual_seed(7);
  kc::DirectConv::Geometry one, dw;
  dw.sh = dw.sw = a.stride, dw.ph = dw.pw = 1;
  const kc::DirectConv expand(at::randn({a.m, a.c, 1, 1}), at::randn({a.m}), 1, one);
  const kc::DirectConv depthwise(at::randn({a.m, 1, 3, 3}), at::randn({a.m}), a.m, dw);
  const kc::DirectConv project(at::randn({a.k, a.m, 1, 1}), at::randn({a.k}), 1, one);
  const at::Tensor x =
      at::randn({a.batch, a.c, a.side, a.side}).contiguous(at::MemoryFormat::ChannelsLast);
  const at::Tensor res = a.residual() ? x : at::Tensor();
  for (auto _ : state)
    benchmark::DoNotOptimize(
        project.run(depthwise.run(expand.run(x, {}, relu6()), {}, relu6()), res, {}));
}

// The chain in one pass on float32 rows, or (bf16) on bf16 rows: the 1x1 stages on the CPU's
// bfloat16 dot product where it has one (ConvChain::pairs), else widened.
void block_chain(benchmark::State& state, bool bf16) {
  const BlockArgs a(state);
  at::manual_seed(7);
  kc::DirectConv::Geometry dw;
  dw.sh = dw.sw = a.stride, dw.ph = dw.pw = 1;
  const kc::ConvChain chain(
      kc::ConvChain::Pointwise{at::randn({a.m, a.c, 1, 1}), at::randn({a.m}), relu6()},
      at::randn({a.m, 1, 3, 3}), at::randn({a.m}), dw, relu6(),
      kc::ConvChain::Pointwise{at::randn({a.k, a.m, 1, 1}), at::randn({a.k}), {}}, kc::active_isa(),
      bf16);
  at::Tensor x =
      at::randn({a.batch, a.c, a.side, a.side}).contiguous(at::MemoryFormat::ChannelsLast);
  if (bf16) x = x.to(at::kBFloat16);
  const at::Tensor res = a.residual() ? x : at::Tensor();
  for (auto _ : state) benchmark::DoNotOptimize(chain.run(x, res));
  if (bf16) state.SetLabel(chain.pairs() ? "bf16 dot product" : "bf16 widened");
}
void BM_BlockChain(benchmark::State& state) { block_chain(state, false); }
void BM_BlockChainBf16(benchmark::State& state) { block_chain(state, true); }

void block_shapes(benchmark::internal::Benchmark* b) {
  const int64_t blocks[][5] = {
      {112, 16, 96, 24, 2},   // MobileNetV2 features.2
      {56, 24, 144, 24, 1},   // features.3
      {28, 32, 192, 32, 1},   // features.5
      {14, 64, 384, 64, 1},   // features.8
      {7, 160, 960, 160, 1},  // features.15
      {112, 8, 48, 12, 2},    // features.2 with half its channels removed (lopper's structured)
      {56, 12, 72, 12, 1},    // features.3 likewise
  };
  for (const auto& l : blocks)
    for (int64_t batch : {1, 32}) b->Args({l[0], l[1], l[2], l[3], l[4], batch});
  b->ArgNames({"side", "c", "m", "k", "stride", "batch"})
      ->Unit(benchmark::kMicrosecond)
      ->UseRealTime();
}

// ResNeXt's bottleneck (1x1 reduction, ReLU; grouped 3x3 of `width` channels a group, ReLU; 1x1
// expansion, the residual added and ReLU where the stride is 1 and the channels match): lopper's
// three kernels layer by layer against the same three in one pass (kernels/cpu/chain.h).
// Arguments: image side, block input channels, middle channels, output channels, grouped
// stride, batch, channels a group.
struct BottleneckArgs : BlockArgs {
  int64_t width;
  explicit BottleneckArgs(const benchmark::State& s) : BlockArgs(s), width(s.range(6)) {}
  kc::DirectConv::Geometry grouped() const {
    kc::DirectConv::Geometry g;
    g.sh = g.sw = stride, g.ph = g.pw = 1;
    return g;
  }
  at::Tensor input() const {
    return at::randn({batch, c, side, side}).contiguous(at::MemoryFormat::ChannelsLast);
  }
};

kc::Activation relu() {
  kc::Activation a;
  a.kind = kc::Activation::kRelu;
  return a;
}

void BM_BottleneckLayers(benchmark::State& state) {
  const BottleneckArgs a(state);
  at::manual_seed(7);
  const kc::DirectConv reduce(at::randn({a.m, a.c, 1, 1}), at::randn({a.m}), 1, {});
  const kc::DirectConv grouped(at::randn({a.m, a.width, 3, 3}), at::randn({a.m}), a.m / a.width,
                               a.grouped());
  const kc::DirectConv expand(at::randn({a.k, a.m, 1, 1}), at::randn({a.k}), 1, {});
  const at::Tensor x = a.input(), res = a.residual() ? x : at::Tensor();
  for (auto _ : state)
    benchmark::DoNotOptimize(
        expand.run(grouped.run(reduce.run(x, {}, relu()), {}, relu()), res, relu()));
}

void BM_BottleneckChain(benchmark::State& state) {
  const BottleneckArgs a(state);
  at::manual_seed(7);
  const at::Tensor w = at::randn({a.m, a.width, 3, 3});
  const kc::ConvChain::Pointwise reduce{at::randn({a.m, a.c, 1, 1}), at::randn({a.m}), relu()};
  const kc::ConvChain::Pointwise expand{at::randn({a.k, a.m, 1, 1}), at::randn({a.k}), relu()};
  if (!kc::ConvChain::takes(&reduce, w, &expand)) {
    state.SkipWithError("no narrow-group kernel for these groups on this CPU");
    return;
  }
  const kc::ConvChain chain(reduce, w, at::randn({a.m}), a.grouped(), relu(), expand);
  const at::Tensor x = a.input(), res = a.residual() ? x : at::Tensor();
  for (auto _ : state) benchmark::DoNotOptimize(chain.run(x, res));
}

void bottleneck_shapes(benchmark::internal::Benchmark* b) {
  const int64_t blocks[][6] = {
      {56, 256, 128, 256, 1, 4},  // ResNeXt-50 32x4d layer1.1
      {56, 256, 256, 512, 2, 8},  // layer2.0 (grouped stride 2)
      {28, 512, 256, 512, 1, 8},  // layer2.1
      {28, 512, 128, 512, 1, 4},  // layer2.1 with half its grouped channels pruned away
  };
  for (const auto& l : blocks)
    for (int64_t batch : {1, 32}) b->Args({l[0], l[1], l[2], l[3], l[4], batch, l[5]});
  b->ArgNames({"side", "c", "m", "k", "stride", "batch", "width"})
      ->Unit(benchmark::kMicrosecond)
      ->UseRealTime();
}

}  // namespace

BENCHMARK(BM_ConvOnednn)->Apply(conv_shapes);
BENCHMARK(BM_ConvLopper)->Apply(conv_shapes);
BENCHMARK(BM_ConvLopperCold)->Apply(conv_shapes);
BENCHMARK(BM_ConvOnednnBf16)->Apply(conv_shapes);
BENCHMARK(BM_ConvLopperBf16)->Apply(conv_shapes);
BENCHMARK(BM_ConvWinograd)->Apply(conv_shapes);
BENCHMARK(BM_BlockLayers)->Apply(block_shapes);
BENCHMARK(BM_BlockChain)->Apply(block_shapes);
BENCHMARK(BM_BottleneckLayers)->Apply(bottleneck_shapes);
BENCHMARK(BM_BottleneckChain)->Apply(bottleneck_shapes);
BENCHMARK(BM_BlockChainBf16)->Apply(block_shapes);
BENCHMARK(BM_FewChannelsLast)
    ->ArgsProduct({{1, 0}, {1, 0}})
    ->ArgNames({"aten", "bf16"})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();
