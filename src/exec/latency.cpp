#include "lopper/latency.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/DeviceGuard.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "exec/kernel_choice.h"
#include "kernels/cuda/library.h"
#include "lopper/analysis.h"
#include "lopper/error.h"
#include "lopper/executor.h"
#include "lopper/onnx_io.h"

namespace lopper {

namespace {

// The p-quantile of sorted `v` (p in [0, 1]), interpolated between neighbouring ranks.
double quantile(const std::vector<double>& v, double p) {
  const double pos = p * double(v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (pos - double(lo)) * (v[hi] - v[lo]);
}

}  // namespace

std::string LatencyStats::warning() const {
  if (contended)
    return fmt::format(
        "another process holds a core lopper's threads need (each of them ran a fixed piece of "
        "work {:.1f}x slower than one thread alone): every run waited for it, the figures are the "
        "busy machine's, not the model's; use fewer threads or a quiet machine",
        contention);
  if (!wide) return "";
  return fmt::format(
      "latency spread is wide (p90 {:.1f}x the median over {} runs): the machine is busy; the "
      "figures may not be reliable",
      spread, runs);
}

LatencyStats latency_stats(std::vector<double> ms) {
  LOPPER_CHECK(!ms.empty(), "[latency] no timed runs");
  for (double v : ms)
    LOPPER_CHECK(std::isfinite(v) && v >= 0, "[latency] a run's time is ", v, " ms");
  std::sort(ms.begin(), ms.end());
  LatencyStats s;
  s.runs = static_cast<int>(ms.size());
  s.min_ms = ms.front();
  s.max_ms = ms.back();
  for (double v : ms) s.mean_ms += v;
  s.mean_ms /= double(ms.size());
  s.median_ms = quantile(ms, 0.5);
  s.p10_ms = quantile(ms, 0.1);
  s.p90_ms = quantile(ms, 0.9);
  s.spread = s.median_ms > 0 ? s.p90_ms / s.median_ms : 1.0;
  s.wide = s.spread > kWideLatencySpread;
  return s;
}

void wait_for_device(c10::Device device) {
  if (!device.is_cuda()) return;
  c10::DeviceGuard guard(device);
  kernels::cuda::need_library().synchronize();
}

LatencyStats measure_latency(const std::function<void()>& run, c10::Device device,
                             const LatencyOptions& o) {
  LOPPER_CHECK(o.warmup >= 0 && o.min_runs >= 1 && o.max_runs >= o.min_runs && o.budget_ms >= 0,
               "[latency] bad options: warmup ", o.warmup, ", min_runs ", o.min_runs, ", max_runs ",
               o.max_runs, ", budget_ms ", o.budget_ms);
  // On a GPU a run only queues work: wait for the device (all its streams) before the clock stops.
  auto call = [&] {
    run();
    wait_for_device(device);
  };
  // NOTE: the threads' probe against one thread's, before and after: a held core slows every run
  // alike, which the spread cannot see.
  const int threads = device.is_cuda() ? 1 : at::get_num_threads();
  auto contention = [&] { return threads > 1 ? ops::probe_ms(threads) / ops::probe_ms(1) : 1.0; };
  const double before = contention();
  for (int i = 0; i < o.warmup; ++i) call();
  std::vector<double> ms;
  double total = 0;
  while (int(ms.size()) < o.min_runs ||
         (o.budget_ms > 0 && total < o.budget_ms && int(ms.size()) < o.max_runs)) {
    const auto t0 = std::chrono::steady_clock::now();
    call();
    ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    total += ms.back();
  }
  LatencyStats s = latency_stats(std::move(ms));
  s.warmup = o.warmup;
  s.contention = std::max(before, contention());
  s.contended = s.contention > kContendedProbe;
  return s;
}

LatencyStats measure_model_latency(const ir::Model& model, const std::string& device,
                                   const std::map<std::string, std::vector<int64_t>>& input_shapes,
                                   const LatencyOptions& opts) {
  ExecOptions eo;
  eo.device = device;
  Executor ex(model, eo);
  const auto shapes = resolve_input_shapes(model, input_shapes, 1);
  NamedTensors feeds;
  at::Generator gen = at::detail::createCPUGenerator(0);
  for (const auto* v : ex.inputs()) {
    const auto& dims = shapes.at(v->name);
    const auto type = v->type.elem_type == ir::DType::kUndefined
                          ? at::kFloat
                          : onnx::to_scalar_type(v->type.elem_type);
    at::Tensor t = at::isFloatingType(type) ? at::randn(dims, gen).to(type)
                                            : at::zeros(dims, at::TensorOptions().dtype(type));
    feeds.emplace_back(v->name, t.to(ex.device()));
  }
  return measure_latency([&] { ex.run(feeds); }, ex.device(), opts);
}

}  // namespace lopper
