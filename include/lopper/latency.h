// Latency: the one way lopper times a model. bench, compare, the HTML reports and pruning to a
// latency target all measure through measure_latency, so their figures agree and each says when
// the machine was too busy for them to be trusted.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace lopper {

namespace ir {
struct Model;
}  // namespace ir

/// A run is "wide" when its p90 is more than this many times its median.
/// NOTE: measured with `lopper bench` (the table in src/exec/executor.cpp, 90 processes): on a
/// quiet machine p90/median stays within 1.02-1.10 (lenet5 at 0.1 ms, resnet18 at 15 ms), also
/// with another process busy on a core lopper does not use; when lopper's threads share a core
/// with other work, scheduler slices land in some runs and it reaches 1.4-1.7 (time-sliced) or
/// 2-600 (OpenMP barriers waiting for a slice). 1.5 sits between: a warning on a quiet machine is
/// rare, and a slowdown of the kind that made bench print 35 ms for a 0.1 ms model is flagged.
/// What the spread cannot flag is a run that is slow every time (every run waits alike): see
/// kContendedProbe.
inline constexpr double kWideLatencySpread = 1.5;

/// A measurement on 2+ CPU threads is "contended" when the same fixed arithmetic on each thread
/// takes more than this many times what it takes on one thread (measured before and after the
/// timed runs): a core lopper's threads need is held by another process, and every run's OpenMP
/// barriers wait for it (bench reported 60-120x the real latency with a steady spread). On a quiet
/// machine the ratio stays near 1 (each thread does one thread's work on its own core).
inline constexpr double kContendedProbe = 1.5;

/// Statistics of timed runs, in milliseconds.
struct LatencyStats {
  int warmup = 0;  // untimed runs first
  int runs = 0;    // timed runs
  double median_ms = 0, mean_ms = 0, min_ms = 0, max_ms = 0;
  double p10_ms = 0, p90_ms = 0;  // percentiles, linearly interpolated between ranks
  /// p90 / median (1 when every run took as long; 0 without runs).
  double spread = 0;
  /// spread > kWideLatencySpread: the runs disagree and the median may not be the model's.
  bool wide = false;
  /// The threads' probe over one thread's (the larger of before and after; 1 on one thread or a
  /// GPU), and whether it is above kContendedProbe.
  double contention = 1;
  bool contended = false;

  /// wide or contended: the figures may not be the model's.
  bool unreliable() const { return wide || contended; }
  /// One line for stderr when unreliable ("another process holds a core: ...", "latency spread is
  /// wide (p90 2.3x the median): ..."), else "".
  std::string warning() const;
};

/// The statistics of `ms` (one timing per run). Throws lopper::Error when `ms` is empty or holds
/// a negative or non-finite value.
LatencyStats latency_stats(std::vector<double> ms);

/// How many runs measure_latency times.
struct LatencyOptions {
  int warmup = 3;        // untimed runs first (the executor's first-run kernel choice, caches)
  int min_runs = 10;     // timed runs, at least
  double budget_ms = 0;  // > 0: more runs while all timed runs together stay under this
  int max_runs = 500;    // with budget_ms: timed runs at most
};

/// Waits for the work queued on `device` (all its streams); nothing on the CPU.
void wait_for_device(c10::Device device);

/// Calls `run` `warmup` times, then times it `min_runs` times (or more, up to `max_runs`, while
/// the runs fit in `budget_ms`). On a CUDA `device` each run is followed by a device
/// synchronisation inside the timed interval, so queued work is counted. Throws lopper::Error on
/// bad options.
LatencyStats measure_latency(const std::function<void()>& run, c10::Device device,
                             const LatencyOptions& opts = {});

/// measure_latency of `model` on `device` ("cpu", "cuda:N"), on random inputs (seeded, so every
/// call feeds the same values) of `input_shapes` (dynamic dims default to 1); the executor's
/// first-run kernel choice happens in the warm-up.
LatencyStats measure_model_latency(const ir::Model& model, const std::string& device,
                                   const std::map<std::string, std::vector<int64_t>>& input_shapes,
                                   const LatencyOptions& opts = {});

}  // namespace lopper
