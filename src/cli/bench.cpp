// lopper bench MODEL [--batch N] [--threads T] [--device cpu|cuda] [--warmup W] [--iters K]
// [--json]
//              [--profile] [--explain]
#include <fmt/format.h>

#include <algorithm>
#include <iostream>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "common.h"
#include "lopper/command.h"
#include "lopper/executor.h"

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

nlohmann::json explain_json(const std::vector<KernelDecision>& decisions) {
  nlohmann::json layers = nlohmann::json::array();
  for (const auto& d : decisions) {
    nlohmann::json t = nlohmann::json::object();
    for (const auto& [name, ms] : d.timings) t[name] = ms;
    nlohmann::json in_model = nlohmann::json::object();
    for (const auto& [name, ms] : d.in_model) in_model[name] = ms;
    nlohmann::json impls = nlohmann::json::object();
    for (const auto& [name, impl] : d.implementations) impls[name] = impl;
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
                      {"in_model_ms", in_model},
                      {"refused", d.refused},
                      {"implementations", impls}});
  }
  return {{"isa", cpu_isa()}, {"layers", layers}};
}

void print_explain(const std::vector<KernelDecision>& decisions) {
  int64_t cached = 0, cold = 0;
  for (const auto& d : decisions) {
    cached += d.cached;
    cold += d.cold;
  }
  std::cout << fmt::format(
      "\nkernel choice per layer (sparse kernels: {}; {} of {} from the cache; "
      "* = chosen (the fastest, or lopper's own within 10% of it; or of the two in a trial, the "
      "faster in the model), ms = best of up to 15 rounds on the layer's input{})\n",
      cpu_isa(), cached, decisions.size(),
      cold ? ", weights read from memory: the model's outgrow the last-level cache" : "");
  std::cout << fmt::format("{:<40} {:<12} {:<14} {:>8}  {:<18} {}\n", "layer", "op", "weight",
                           "sparsity", "chosen", "candidates");
  for (const auto& d : decisions) {
    std::string cands;
    for (const auto& [name, ms] : d.timings)
      cands += fmt::format("{}{} {:.3f}  ", name, name == d.chosen ? "*" : "", ms);
    std::string node = fit_name(d.node, 40);
    const bool weight = !d.weight_shape.empty();  // none: an attention
    std::cout << fmt::format("{:<40} {:<12} {:<14} {:>8}  {:<18} {}\n", node, d.op,
                             weight ? shape_string(d.weight_shape) : "-",
                             weight ? fmt::format("{:.1f}%", 100.0 * d.sparsity) : "-", d.chosen,
                             cands);
    for (const auto& why : d.refused) std::cout << fmt::format("{:<40}   not run: {}\n", "", why);
    for (const auto& [name, impl] : d.implementations)
      std::cout << fmt::format("{:<40}   {} runs {}\n", "", name, impl);
    if (d.busy)
      std::cout << fmt::format("{:<40}   timed while the machine ran slow: not cached\n", "");
    if (d.in_model.size() == 2)
      std::cout << fmt::format("{:<40}   in the model, taking turns: {} {:.3f}, {} {:.3f}\n", "",
                               d.in_model[0].first, d.in_model[0].second, d.in_model[1].first,
                               d.in_model[1].second);
    else if (const auto* best = faster_than_chosen(d))
      std::cout << fmt::format(
          "{:<40}   lopper's own kept: {:.0f}% slower than {} timed alone, within its 10% "
          "margin\n",
          "", 100.0 * (timing_of(d, d.chosen) / best->second - 1), best->first);
  }
}

}  // namespace

Action add_bench(CLI::App& app) {
  struct Opts {
    BenchRequest req;
    std::vector<std::string> shapes;
    int64_t batch = 0;
    int threads = 0;
    bool json = false;
  };
  auto o = std::make_shared<Opts>();
  auto* cmd = model_command(app, "bench", "latency and throughput of a model", o->req.model);
  auto* batch = cmd->add_option(
      "--batch", o->batch,
      "batch size, 1..1048576: first dim of every input (default: the model's, 1 if dynamic)");
  cmd->add_option("--shape", o->shapes, "NAME=1x3x224x224 (dynamic dims default to 1)");
  add_threads_option(cmd, o->threads);
  cmd->add_option("--device", o->req.device, "cpu, cuda or cuda:N");
  cmd->add_option("--precision", o->req.precision, "fp32 (default) | bf16 | fp16 (CUDA only)");
  cmd->add_option("--warmup", o->req.warmup, "untimed runs first (0..100000)");
  cmd->add_option("--iters", o->req.iters, "timed runs (1..1000000)");
  cmd->add_flag("--json", o->json, "print one JSON object");
  cmd->add_flag("--profile", o->req.profile, "time per op type (after the timed runs)");
  cmd->add_flag("--explain", o->req.explain,
                "per layer with a kernel choice: its sparsity, the kernel chosen and the time of "
                "each candidate on the layer's input");
  return [o, batch]() {
    configure_threads(o->threads);
    BenchRequest& req = o->req;
    req.input_shapes = parse_shape_overrides(o->shapes);
    if (batch->count() > 0) req.batch = o->batch;
    req.warn = warn;
    const BenchResult r = req.run();
    const LatencyStats& lat = r.latency;
    const double median = lat.median_ms;
    if (o->json) {
      nlohmann::json j{{"model", req.model},
                       {"device", req.device},
                       {"batch", r.batch},
                       {"threads", r.threads},
                       {"iters", lat.runs},
                       {"median_ms", median},
                       {"p90_ms", lat.p90_ms},
                       {"mean_ms", lat.mean_ms},
                       {"min_ms", lat.min_ms},
                       {"throughput_per_s", r.throughput_per_s},
                       {"p10_ms", lat.p10_ms},
                       {"max_ms", lat.max_ms},
                       {"spread", lat.spread},
                       {"spread_wide", lat.wide},
                       {"contention", lat.contention},
                       {"contended", lat.contended}};
      if (lat.unreliable()) j["warning"] = lat.warning();
      if (req.profile) {
        nlohmann::json p = nlohmann::json::array();
        for (const auto& t : r.ops)
          p.push_back(
              {{"op", t.op}, {"ms_per_run", t.ms_per_run}, {"calls_per_run", t.calls_per_run}});
        j["profile"] = p;
        nlohmann::json per = nlohmann::json::array();
        for (const auto& [ms, n] : r.nodes) per.push_back({{"node", n}, {"ms_per_run", ms}});
        j["profile_nodes"] = per;
      }
      if (req.explain) j["kernels"] = explain_json(r.kernels);
      std::cout << j.dump(2) << "\n";
    } else {
      std::cout << fmt::format("{}  device {}  batch {}  threads {}  iters {}\n", req.model,
                               req.device, r.batch, r.threads, req.iters)
                << fmt::format(
                       "median {:.3f} ms   p10 {:.3f} ms   p90 {:.3f} ms   min {:.3f} ms   "
                       "{:.1f} samples/s\n",
                       median, lat.p10_ms, lat.p90_ms, lat.min_ms, r.throughput_per_s);
      if (req.profile) {
        std::cout << fmt::format("\n{:<28} {:>10} {:>8}\n", "op", "ms/run", "calls");
        for (const auto& t : r.ops)
          std::cout << fmt::format("{:<28} {:>10.3f} {:>8}\n", t.op, t.ms_per_run, t.calls_per_run);
        std::cout << fmt::format("\n{:<60} {:>10}\n", "slowest nodes", "ms/run");
        for (size_t i = 0; i < r.nodes.size() && i < 15; ++i)
          std::cout << fmt::format("{:<60} {:>10.3f}\n", r.nodes[i].second.substr(0, 60),
                                   r.nodes[i].first);
      }
      if (req.explain) print_explain(r.kernels);
    }
    return 0;
  };
}

}  // namespace lopper::cli
