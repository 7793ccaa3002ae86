// The one latency helper (lopper/latency.h) and the thread settings behind every figure: its
// statistics on known timings, --threads on every command that runs a model, and the default
// thread count staying fast when another process holds a core.
#include "lopper/latency.h"

#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <numeric>
#include <thread>

#include "lopper/error.h"
#include "lopper/executor.h"
#include "lopper/npy.h"
#include "lopper/onnx_io.h"
#include "test_models.h"

namespace lopper {
namespace {

using namespace lopper::test;

std::vector<double> one_to(int n) {
  std::vector<double> v(n);
  std::iota(v.begin(), v.end(), 1.0);
  return v;
}

TEST(LatencyStats, PercentilesInterpolateBetweenRanks) {
  std::vector<double> ms = one_to(10);
  std::reverse(ms.begin(), ms.end());  // order does not matter
  const LatencyStats s = latency_stats(ms);
  EXPECT_EQ(s.runs, 10);
  EXPECT_DOUBLE_EQ(s.median_ms, 5.5);
  EXPECT_DOUBLE_EQ(s.mean_ms, 5.5);
  EXPECT_DOUBLE_EQ(s.p10_ms, 1.9);
  EXPECT_DOUBLE_EQ(s.p90_ms, 9.1);
  EXPECT_DOUBLE_EQ(s.min_ms, 1);
  EXPECT_DOUBLE_EQ(s.max_ms, 10);
  EXPECT_DOUBLE_EQ(s.spread, 9.1 / 5.5);
  EXPECT_TRUE(s.wide);  // 1.65 > 1.5
  const std::string w = s.warning();
  EXPECT_NE(w.find("latency spread is wide (p90 1.7x the median over 10 runs)"), std::string::npos)
      << w;
  EXPECT_EQ(w.find('\n'), std::string::npos);
}

TEST(LatencyStats, OneHiccupIsWideInTenRunsNotInAHundred) {
  std::vector<double> ms(10, 1.0);
  ms[3] = 30;  // one scheduler hiccup: p90 lies between ranks 8 and 9 (1 and 30)
  LatencyStats s = latency_stats(ms);
  EXPECT_DOUBLE_EQ(s.median_ms, 1);
  EXPECT_NEAR(s.p90_ms, 1 + 0.1 * 29, 1e-12);
  EXPECT_NEAR(s.spread, 3.9, 1e-12);
  EXPECT_TRUE(s.wide);
  // Over 100 runs one hiccup is above the p90: not wide.
  ms.assign(100, 1.0);
  ms[50] = 30;
  s = latency_stats(ms);
  EXPECT_DOUBLE_EQ(s.p90_ms, 1);
  EXPECT_DOUBLE_EQ(s.spread, 1);
  EXPECT_FALSE(s.wide);
  EXPECT_EQ(s.warning(), "");
  EXPECT_DOUBLE_EQ(s.max_ms, 30);
  // A fifth of the runs 2x slower: p90 at 2x the median, wide.
  for (int i = 0; i < 20; ++i) ms[i] = 2;
  s = latency_stats(ms);
  EXPECT_DOUBLE_EQ(s.median_ms, 1);
  EXPECT_DOUBLE_EQ(s.p90_ms, 2);
  EXPECT_TRUE(s.wide);
}

TEST(LatencyStats, SteadyRunsAndEdgeCases) {
  LatencyStats s = latency_stats({2, 2.2, 2.1, 2.4, 2.3});
  EXPECT_DOUBLE_EQ(s.median_ms, 2.2);
  EXPECT_NEAR(s.p90_ms, 2.36, 1e-12);
  EXPECT_FALSE(s.wide);
  s = latency_stats({0.5});
  EXPECT_EQ(s.runs, 1);
  EXPECT_DOUBLE_EQ(s.median_ms, 0.5);
  EXPECT_DOUBLE_EQ(s.p10_ms, 0.5);
  EXPECT_DOUBLE_EQ(s.p90_ms, 0.5);
  EXPECT_DOUBLE_EQ(s.spread, 1);
  s = latency_stats({0, 0, 0});  // a clock too coarse for the run: no division by zero
  EXPECT_DOUBLE_EQ(s.spread, 1);
  EXPECT_FALSE(s.wide);
  EXPECT_THROW(latency_stats({}), Error);
  EXPECT_THROW(latency_stats({1, -1}), Error);
  EXPECT_THROW(latency_stats({1, std::nan("")}), Error);
}

TEST(MeasureLatency, WarmsUpThenTimesTheRunsAskedFor) {
  int calls = 0;
  LatencyOptions o;
  o.warmup = 4;
  o.min_runs = 7;
  LatencyStats s = measure_latency([&] { ++calls; }, c10::Device(c10::kCPU), o);
  EXPECT_EQ(calls, 11);
  EXPECT_EQ(s.runs, 7);
  EXPECT_EQ(s.warmup, 4);
  // A budget far larger than the runs take: max_runs stops it.
  calls = 0;
  o.budget_ms = 1e9;
  o.max_runs = 40;
  s = measure_latency([&] { ++calls; }, c10::Device(c10::kCPU), o);
  EXPECT_EQ(s.runs, 40);
  EXPECT_EQ(calls, 44);
  o.min_runs = 0;
  EXPECT_THROW(measure_latency([] {}, c10::Device(c10::kCPU), o), Error);
  o.min_runs = 50;  // more than max_runs
  EXPECT_THROW(measure_latency([] {}, c10::Device(c10::kCPU), o), Error);
}

TEST(MeasureLatency, TimesARealModel) {
  const ir::Model m = onnx::load_model(example("lenet5.onnx"));
  LatencyOptions o;
  o.min_runs = 5;
  const LatencyStats s = measure_model_latency(m, "cpu", {}, o);
  EXPECT_EQ(s.runs, 5);
  EXPECT_GT(s.median_ms, 0);
  EXPECT_LE(s.min_ms, s.median_ms);
  EXPECT_LE(s.median_ms, s.p90_ms);
  EXPECT_LE(s.p90_ms, s.max_ms);
}

// Every command that runs a model takes --threads 0..4x the hardware threads; anything else is a
// usage error (exit 2, one line) before any work, not an abort inside the OpenMP runtime.
TEST(ThreadsOption, EveryCommandAcceptsItAndRefusesOutOfRange) {
  test::TempDir tmp;
  const std::string data = " --data " + random_npy_data(tmp, 8, 3);
  const std::string mlp = fixture("mlp.ts.onnx"), cnn = example("cnn_small.onnx");
  struct Case {
    std::string name, args;
  };
  const std::vector<Case> cases = {
      {"inspect", "inspect " + mlp},
      {"run",
       "run " + mlp + " --input input=" + fixture("mlp.input_0.npy") + " --out " + (tmp / "run")},
      {"bench", "bench " + mlp + " --iters 2 --warmup 1"},
      {"prune", "prune " + cnn + " -o " + (tmp / "p.onnx") + " --method l1 --amount 0.5"},
      {"train", "train " + mlp + data + " -o " + (tmp / "t.onnx") + " --epochs 1 --no-eval"},
      {"finetune", "finetune " + mlp + data + " -o " + (tmp / "f.onnx") + " --epochs 1 --no-eval"},
      {"eval", "eval " + mlp + data},
      {"compare", "compare " + mlp + " " + mlp + " --iters 2"},
      {"sensitivity", "sensitivity " + mlp + data + " --amounts 0.5 --eval-batches 1"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    for (const std::string& bad : std::vector<std::string>{"100000", "-1"}) {
      auto r = lopper_cli(c.args + " --threads " + bad);
      EXPECT_EQ(r.code, 2) << bad << ": " << r.err;
      EXPECT_EQ(lines(r.err), 1) << bad << ": " << r.err;
      EXPECT_NE(r.err.find("--threads: must be 0.."), std::string::npos) << r.err;
    }
    auto ok = lopper_cli(c.args + " --threads 1");
    EXPECT_EQ(ok.code, 0) << ok.err;
  }
  // The bound is 4x the hardware threads; a value that is not a whole number is refused too.
  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  EXPECT_EQ(lopper_cli("inspect " + mlp + " --threads " + std::to_string(4 * hw)).code, 0);
  for (const std::string& bad :
       std::vector<std::string>{std::to_string(4 * hw + 1), "two", "1.5"}) {
    auto r = lopper_cli("inspect " + mlp + " --threads " + bad);
    EXPECT_EQ(r.code, 2) << bad << ": " << r.err;
    EXPECT_EQ(lines(r.err), 1) << bad << ": " << r.err;
  }
}

// A child that spins on one core until it is killed.
struct BusyCore {
  pid_t pid;
  BusyCore() {
    pid = fork();
    if (pid == 0) {
      volatile unsigned long n = 0;
      for (;;) n = n + 1;
    }
  }
  ~BusyCore() {
    if (pid > 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  }
};

// `lopper bench MODEL --json` at the default thread count: (median ms, threads); (-1, 0) on
// failure.
std::pair<double, int> bench_default(const std::string& model) {
  auto r = lopper_cli("bench " + model + " --iters 200 --warmup 20 --json");
  EXPECT_EQ(r.code, 0) << r.err;
  if (r.code != 0) return {-1, 0};
  const auto j = nlohmann::json::parse(r.out);
  return {j["median_ms"].get<double>(), j["threads"].get<int>()};
}

int allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  return sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;
}

// The regression guard of issue 8: with one core held by another process, one thread per core made
// OpenMP's barriers wait for that core's scheduler slices (lenet5: 35 ms instead of 0.1 ms). The
// default leaves the busy core out, and the loaded median stays within 5x of the idle one measured
// just before (a collapse is 100x or more); a second try absorbs a burst of other work.
TEST(ThreadsDefault, BenchStaysFastWhenAnotherProcessHoldsACore) {
  const std::string model = example("lenet5.onnx");
  std::pair<double, int> idle, loaded;
  for (int attempt = 0; attempt < 2; ++attempt) {
    idle = bench_default(model);
    ASSERT_GT(idle.first, 0);
    {
      BusyCore busy;
      ASSERT_GT(busy.pid, 0);
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      loaded = bench_default(model);
    }
    ASSERT_GT(loaded.first, 0);
    if (loaded.first < 5 * idle.first) break;
  }
  EXPECT_LT(loaded.first, 5 * idle.first)
      << "idle median " << idle.first << " ms, loaded " << loaded.first << " ms";
  if (allowed_cpus() > 1 && !std::getenv("OMP_NUM_THREADS"))
    EXPECT_LT(loaded.second, allowed_cpus()) << "the default used the busy core";
}

// The default is 1 at least, never more than the CPUs this process may use, and OMP_NUM_THREADS
// when the user set it.
TEST(ThreadsDefault, CountsAllowedCpusAndRespectsOmpNumThreads) {
  const char* old = std::getenv("OMP_NUM_THREADS");
  const std::string saved = old ? old : "";
  unsetenv("OMP_NUM_THREADS");
  const int n = default_threads();
  EXPECT_GE(n, 1);
  EXPECT_LE(n, allowed_cpus());
  setenv("OMP_NUM_THREADS", "3", 1);
  EXPECT_EQ(default_threads(), 3);
  setenv("OMP_NUM_THREADS", "junk", 1);
  EXPECT_GE(default_threads(), 1);
  EXPECT_LE(default_threads(), allowed_cpus());
  if (old)
    setenv("OMP_NUM_THREADS", saved.c_str(), 1);
  else
    unsetenv("OMP_NUM_THREADS");
}

}  // namespace
}  // namespace lopper
