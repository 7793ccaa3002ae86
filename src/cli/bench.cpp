// lopper bench MODEL [--batch N] [--threads T] [--device cpu|cuda] [--warmup W] [--iters K]
// [--json]
//              [--profile] [--explain]
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "common.h"
#include "lopper/analysis.h"
#include "lopper/error.h"
#include "lopper/executor.h"
#include "lopper/latency.h"
#include "lopper/memory.h"
#include "lopper/onnx_io.h"

namespace lopper::cli {

namespace {

double timing_of(const KernelDecision& d, const std::string& name) {
  for (const auto& [n, ms] : d.timings)
    if (n == name) return ms;
  return 0;
}

// The fastest candidate when the chosen one is not it (lopper's own kept within its margin), else
// null.
const std::pair<std::string, double>* faster_than_chosen(const KernelDecision& d) {
  const std::pair<std::string, double>* best = nullptr;
  double chosen = -1;
  for (const auto& t : d.timings) {
    if (!best || t.second < best->second) best = &t;
    if (t.first == d.chosen) chosen = t.second;
  }
  return best && chosen >= 0 && best->first != d.chosen && best->second < chosen ? best : nullptr;
}

nlohmann::json explain_json(const Executor& exec) {
  nlohmann::json layers = nlohmann::json::array();
  for (const auto& d : exec.kernel_decisions()) {
    nlohmann::json t = nlohmann::json::object();
    for (const auto& [name, ms] : d.timings) t[name] = ms;
    layers.push_back({{"node", d.node},
                      {"op", d.op},
                      {"weight_shape", d.weight_shape},
                      {"input_shape", d.input_shape},
                      {"sparsity", d.sparsity},
                      {"chosen", d.chosen},
                      {"cached", d.cached},
                      {"cold", d.cold},
                      {"busy", d.busy},
                      {"own_within_margin", faster_than_chosen(d) != nullptr},
                      {"ms", t},
                      {"refused", d.refused}});
  }
  return {{"isa", cpu_isa()}, {"layers", layers}};
}

void print_explain(const Executor& exec) {
  auto decisions = exec.kernel_decisions();
  int64_t cached = 0, cold = 0;
  for (const auto& d : decisions) {
    cached += d.cached;
    cold += d.cold;
  }
  std::cout << fmt::format(
      "\nkernel choice per layer (sparse kernels: {}; {} of {} from the cache; "
      "* = chosen (the fastest, or lopper's own within 10% of it), ms = best of up to 15 rounds "
      "on the layer's input{})\n",
      cpu_isa(), cached, decisions.size(),
      cold ? ", weights read from memory: the model's outgrow the last-level cache" : "");
  std::cout << fmt::format("{:<40} {:<12} {:<14} {:>8}  {:<18} {}\n", "layer", "op", "weight",
                           "sparsity", "chosen", "candidates");
  for (const auto& d : decisions) {
    std::string cands;
    for (const auto& [name, ms] : d.timings)
      cands += fmt::format("{}{} {:.3f}  ", name, name == d.chosen ? "*" : "", ms);
    std::string node = fit_name(d.node, 40);
    std::cout << fmt::format("{:<40} {:<12} {:<14} {:>7.1f}%  {:<18} {}\n", node, d.op,
                             shape_string(d.weight_shape), 100.0 * d.sparsity, d.chosen, cands);
    for (const auto& why : d.refused) std::cout << fmt::format("{:<40}   not run: {}\n", "", why);
    if (d.busy)
      std::cout << fmt::format("{:<40}   timed while the machine ran slow: not cached\n", "");
    if (const auto* best = faster_than_chosen(d))
      std::cout << fmt::format(
          "{:<40}   lopper's own kept: {:.0f}% slower than {} timed alone, within its 10% "
          "margin\n",
          "", 100.0 * (timing_of(d, d.chosen) / best->second - 1), best->first);
  }
}

// Per-node times (the "node (Op)" label -> ms), slowest first.
std::vector<std::pair<double, std::string>> slowest_first(const std::map<std::string, double>& t) {
  std::vector<std::pair<double, std::string>> nodes;
  for (const auto& [n, ms] : t) nodes.emplace_back(ms, n);
  std::sort(nodes.rbegin(), nodes.rend());
  return nodes;
}

}  // namespace

Action add_bench(CLI::App& app) {
  struct Opts {
    std::string model, device = "cpu", precision = "fp32";
    std::vector<std::string> shapes;
    int64_t batch = 0;
    int threads = 0, warmup = 10, iters = 50;
    bool json = false, profile = false, explain = false;
  };
  auto o = std::make_shared<Opts>();
  auto* cmd = model_command(app, "bench", "latency and throughput of a model", o->model);
  cmd->add_option("--batch", o->batch,
                  "batch size: first dim of every input (default: the model's, 1 if dynamic)")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 20));
  cmd->add_option("--shape", o->shapes, "NAME=1x3x224x224 (dynamic dims default to 1)");
  add_threads_option(cmd, o->threads);
  cmd->add_option("--device", o->device, "cpu, cuda or cuda:N");
  cmd->add_option("--precision", o->precision, "fp32 (default) | bf16 | fp16 (CUDA only)");
  cmd->add_option("--warmup", o->warmup, "untimed runs first")->check(CLI::Range(0, 100000));
  cmd->add_option("--iters", o->iters, "timed runs")->check(CLI::Range(1, 1000000));
  cmd->add_flag("--json", o->json, "print one JSON object");
  cmd->add_flag("--profile", o->profile, "time per op type (after the timed runs)");
  cmd->add_flag("--explain", o->explain,
                "per layer with a kernel choice: its sparsity, the kernel chosen and the time of "
                "each candidate on the layer's input");
  return [o]() {
    configure_threads(o->threads);
    auto overrides = parse_shape_overrides(o->shapes);
    ir::Model model = onnx::load_model(o->model);
    warn_about_model(model, o->model);
    auto shapes = resolve_input_shapes(model, overrides);
    Executor exec(model, exec_options(o->device, o->precision));
    NamedTensors feeds;
    at::manual_seed(0);
    for (const auto* v : exec.inputs()) {
      auto dims = shapes.at(v->name);
      if (!dims.empty() && !overrides.count(v->name) && o->batch > 0) {
        const auto& d0 = v->type.dims.empty() ? ir::Dim{} : v->type.dims[0];
        LOPPER_CHECK(!d0.is_static() || d0.value == o->batch, "[bench] input '", v->name,
                     "' has a fixed batch of ", d0.value, "; --batch ", o->batch,
                     " needs a model exported with a dynamic batch");
        dims[0] = o->batch;
      }
      auto type = v->type.elem_type == ir::DType::kUndefined
                      ? at::kFloat
                      : onnx::to_scalar_type(v->type.elem_type);
      double bytes = tensor_bytes(dims, c10::elementSize(type));
      if (exceeds_memory(bytes))
        throw UsageError(memory_message(detail::concat("[bench] --batch ", o->batch, ": input '",
                                                       v->name, "' ", dims_string(dims)),
                                        bytes));
      at::Tensor t = at::isFloatingType(type) ? at::randn(dims).to(type)
                                              : at::zeros(dims, at::TensorOptions().dtype(type));
      feeds.emplace_back(v->name, t.to(exec.device()));
    }
    LatencyOptions lo;
    lo.warmup = o->warmup;
    lo.min_runs = o->iters;
    lo.max_runs = std::max(lo.max_runs, o->iters);  // --iters asks for exactly that many
    const LatencyStats lat = measure_latency([&] { exec.run(feeds); }, exec.device(), lo);
    if (lat.unreliable()) std::cerr << "lopper: warning: " << lat.warning() << "\n";
    std::map<std::string, std::pair<double, int64_t>> per_op;  // op -> (ms, calls)
    std::map<std::string, double> per_node;                    // "node (op)" -> ms
    if (o->profile) {
      // On a GPU a node only queues its kernels: wait for them, so that each node's time is its
      // own (launch included) and not the host's queueing; the sum then exceeds the median.
      auto last = std::chrono::steady_clock::now();
      exec.on_node = [&](const ir::Node& n, const std::vector<at::Tensor>&,
                         const std::vector<at::Tensor>&) {
        wait_for_device(exec.device());
        auto now = std::chrono::steady_clock::now();
        auto& e = per_op[n.domain.empty() ? n.op_type : n.domain + "." + n.op_type];
        double dt = std::chrono::duration<double, std::milli>(now - last).count();
        e.first += dt;
        e.second += 1;
        per_node[n.label() + " (" + n.op_type + ")"] += dt;
        last = now;
      };
      for (int i = 0; i < o->iters; ++i) {
        wait_for_device(exec.device());
        last = std::chrono::steady_clock::now();
        exec.run(feeds);
      }
      exec.on_node = nullptr;
    }
    const double median = lat.median_ms;
    int64_t batch = feeds.empty() || feeds[0].second.dim() == 0 ? 1 : feeds[0].second.size(0);
    double throughput = batch * 1000.0 / median;
    int threads = at::get_num_threads();
    std::vector<std::pair<std::string, std::pair<double, int64_t>>> ops(per_op.begin(),
                                                                        per_op.end());
    std::sort(ops.begin(), ops.end(),
              [](auto& a, auto& b) { return a.second.first > b.second.first; });
    if (o->json) {
      nlohmann::json j{{"model", o->model},
                       {"device", o->device},
                       {"batch", batch},
                       {"threads", threads},
                       {"iters", lat.runs},
                       {"median_ms", median},
                       {"p90_ms", lat.p90_ms},
                       {"mean_ms", lat.mean_ms},
                       {"min_ms", lat.min_ms},
                       {"throughput_per_s", throughput},
                       {"p10_ms", lat.p10_ms},
                       {"max_ms", lat.max_ms},
                       {"spread", lat.spread},
                       {"spread_wide", lat.wide},
                       {"contention", lat.contention},
                       {"contended", lat.contended}};
      if (lat.unreliable()) j["warning"] = lat.warning();
      if (o->profile) {
        nlohmann::json p = nlohmann::json::array();
        for (const auto& [op, v] : ops)
          p.push_back({{"op", op},
                       {"ms_per_run", v.first / o->iters},
                       {"calls_per_run", v.second / o->iters}});
        j["profile"] = p;
        nlohmann::json per = nlohmann::json::array();
        for (const auto& [t, n] : slowest_first(per_node))
          per.push_back({{"node", n}, {"ms_per_run", t / o->iters}});
        j["profile_nodes"] = per;
      }
      if (o->explain) j["kernels"] = explain_json(exec);
      std::cout << j.dump(2) << "\n";
    } else {
      std::cout << fmt::format("{}  device {}  batch {}  threads {}  iters {}\n", o->model,
                               o->device, batch, threads, o->iters)
                << fmt::format(
                       "median {:.3f} ms   p10 {:.3f} ms   p90 {:.3f} ms   min {:.3f} ms   "
                       "{:.1f} samples/s\n",
                       median, lat.p10_ms, lat.p90_ms, lat.min_ms, throughput);
      if (o->profile) {
        std::cout << fmt::format("\n{:<28} {:>10} {:>8}\n", "op", "ms/run", "calls");
        for (const auto& [op, v] : ops)
          std::cout << fmt::format("{:<28} {:>10.3f} {:>8}\n", op, v.first / o->iters,
                                   v.second / o->iters);
        auto nodes = slowest_first(per_node);
        std::cout << fmt::format("\n{:<60} {:>10}\n", "slowest nodes", "ms/run");
        for (size_t i = 0; i < nodes.size() && i < 15; ++i)
          std::cout << fmt::format("{:<60} {:>10.3f}\n", nodes[i].second.substr(0, 60),
                                   nodes[i].first / o->iters);
      }
      if (o->explain) print_explain(exec);
    }
    return 0;
  };
}

}  // namespace lopper::cli
