// The requests that measure models: bench (latency, per op, kernel choice), eval (a dataset) and
// compare (two models side by side).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <nlohmann/json.hpp>

#include "exec/kernel_choice.h"
#include "lopper/command.h"
#include "lopper/error.h"
#include "lopper/memory.h"
#include "lopper/onnx_io.h"
#include "lopper/report.h"
#include "lopper/train.h"
#include "rules.h"

namespace lopper {

using command::opt;

namespace {

// Refuses `value` of `option` outside [lo, hi], in `op`'s words ("bench").
void check_range(const char* op, const char* option, int64_t value, int64_t lo, int64_t hi) {
  if (value < lo || value > hi)
    throw UsageError(
        detail::concat("[", op, "] ", opt(option), " must be ", lo, "..", hi, ", got ", value));
}

constexpr int64_t kMostBatch = int64_t(1) << 20;

}  // namespace

void BenchRequest::validate() const {
  if (batch) check_range("bench", "batch", *batch, 1, kMostBatch);
  check_range("bench", "warmup", warmup, 0, 100000);
  check_range("bench", "iters", iters, 1, 1000000);
}

namespace {

// Runs `run` untimed while a layer's chosen kernel and its runner-up still take turns in the model
// (the first run's trials: 8 calls, InModelTrial), so that the slower one's calls are not among
// the timed runs after the warm-up.
void settle_trials(const Executor& exec, const std::function<void()>& run) {
  auto under_way = [&] {
    for (const auto& d : exec.kernel_decisions())
      if (d.in_trial) return true;
    return false;
  };
  for (int i = 0; i < 2 * ops::InModelTrial::kTrialCalls && under_way(); ++i) run();
}

}  // namespace

BenchResult BenchRequest::run() const {
  validate();
  ir::Model m = onnx::load_model(model);
  command::say_warnings(m, model, warn);
  auto shapes = resolve_input_shapes(m, input_shapes);
  Executor exec(m, exec_options(device, precision));
  NamedTensors feeds;
  at::manual_seed(0);
  for (const auto* v : exec.inputs()) {
    auto dims = shapes.at(v->name);
    if (!dims.empty() && !input_shapes.count(v->name) && batch) {
      const auto& d0 = v->type.dims.empty() ? ir::Dim{} : v->type.dims[0];
      if (d0.is_static() && d0.value != *batch)
        throw Error(detail::concat("[bench] input '", v->name, "' has a fixed batch of ", d0.value,
                                   "; ", opt("batch"), " ", *batch,
                                   " needs a model exported with a dynamic batch"));
      dims[0] = *batch;
    }
    auto type = v->type.elem_type == ir::DType::kUndefined
                    ? at::kFloat
                    : onnx::to_scalar_type(v->type.elem_type);
    double bytes = tensor_bytes(dims, c10::elementSize(type));
    if (exceeds_memory(bytes))
      throw UsageError(
          memory_message(detail::concat("[bench] ", opt("batch"), " ", batch.value_or(0),
                                        ": input '", v->name, "' ", dims_string(dims)),
                         bytes));
    at::Tensor t = at::isFloatingType(type) ? at::randn(dims).to(type)
                                            : at::zeros(dims, at::TensorOptions().dtype(type));
    feeds.emplace_back(v->name, t.to(exec.device()));
  }
  for (int64_t i = 0; i < warmup; ++i) exec.run(feeds);
  if (warmup > 0) settle_trials(exec, [&] { exec.run(feeds); });
  LatencyOptions lo;
  lo.warmup = 0;
  lo.min_runs = int(iters);
  lo.max_runs = std::max(lo.max_runs, int(iters));  // iters asks for exactly that many
  BenchResult r;
  r.latency = measure_latency([&] { exec.run(feeds); }, exec.device(), lo);
  r.latency.warmup = int(warmup);
  if (r.latency.unreliable() && warn) warn(r.latency.warning());
  std::map<std::string, std::pair<double, int64_t>> per_op;  // op -> (ms, calls)
  std::map<std::string, double> per_node;                    // "node (op)" -> ms
  if (profile) {
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
    for (int64_t i = 0; i < iters; ++i) {
      wait_for_device(exec.device());
      last = std::chrono::steady_clock::now();
      exec.run(feeds);
    }
    exec.on_node = nullptr;
  }
  r.batch = feeds.empty() || feeds[0].second.dim() == 0 ? 1 : feeds[0].second.size(0);
  r.throughput_per_s = r.batch * 1000.0 / r.latency.median_ms;
  r.threads = at::get_num_threads();
  std::vector<std::pair<std::string, std::pair<double, int64_t>>> ops(per_op.begin(), per_op.end());
  std::sort(ops.begin(), ops.end(),
            [](auto& a, auto& b) { return a.second.first > b.second.first; });
  for (const auto& [op, v] : ops) r.ops.push_back({op, v.first / double(iters), v.second / iters});
  for (const auto& [n, ms] : per_node) r.nodes.emplace_back(ms, n);
  std::sort(r.nodes.rbegin(), r.nodes.rend());
  for (auto& node : r.nodes) node.first /= double(iters);
  if (explain) r.kernels = exec.kernel_decisions();
  return r;
}

EvalResult EvalRequest::run() const {
  ir::Model m = onnx::load_model(model);
  command::say_warnings(m, model, warn);
  DataLoader loader(open_dataset(data.data, data.split), data.eval_loader(m));
  EvalOptions eval;
  eval.device = device;
  eval.precision = command::as_usage([&] { return parse_precision(precision); });
  eval.loss = data.loss_options();
  eval.progress = progress;
  return evaluate(m, loader, eval);
}

void CompareRequest::validate() const {
  check_range("compare", "batch", batch, 1, kMostBatch);
  check_range("compare", "iters", iters, 1, 1000000);
}

namespace {

// Latency of `iters` inference runs (after iters / 10 warm-ups, at least 3) on zeros at the
// model's input shapes.
LatencyStats latency_of(const ir::Model& m,
                        const std::map<std::string, std::vector<int64_t>>& shapes, int iters,
                        const ExecOptions& eo) {
  Executor ex(m, eo);
  NamedTensors feeds;
  for (const auto* in : ex.inputs()) {
    auto it = shapes.find(in->name);
    LOPPER_CHECK(it != shapes.end(), "[compare] no shape for input '", in->name, "'");
    at::ScalarType st = in->type.elem_type == ir::DType::kInt64 ? at::kLong : at::kFloat;
    feeds.emplace_back(in->name,
                       at::zeros(it->second, at::TensorOptions().dtype(st).device(ex.device())));
  }
  const int warmup = std::max(3, iters / 10);
  for (int i = 0; i < warmup; ++i) ex.run(feeds);
  settle_trials(ex, [&] { ex.run(feeds); });
  LatencyOptions lo;
  lo.warmup = 0;
  lo.min_runs = iters;
  LatencyStats s = measure_latency([&] { ex.run(feeds); }, ex.device(), lo);
  s.warmup = warmup;
  return s;
}

nlohmann::json row(const CompareMeasured& m) {
  nlohmann::json j = {{"params", m.params},
                      {"nonzero", m.nonzero},
                      {"macs", m.macs},
                      {"effective_macs", m.effective_macs},
                      {"file_bytes", m.file_bytes},
                      {"latency_ms", m.latency.median_ms}};
  j["latency_p10_ms"] = m.latency.p10_ms;
  j["latency_p90_ms"] = m.latency.p90_ms;
  j["latency_spread"] = m.latency.spread;
  j["latency_spread_wide"] = m.latency.wide;
  j["latency_contended"] = m.latency.contended;
  if (m.latency.unreliable()) j["latency_warning"] = m.latency.warning();
  if (m.top1 >= 0) j["top1"] = m.top1;
  return j;
}

}  // namespace

CompareResult CompareRequest::run() const {
  validate();
  // What it reads, then what it writes: checked before any work.
  OutputFiles files("compare");
  files.input(before);
  files.input(after);
  add_data_inputs(files, data.data);
  if (!out.empty()) files.declare(out, opt("out"));
  if (!report.empty()) files.declare(report, opt("report"));
  const ExecOptions eo = exec_options(device, precision);
  const std::string paths[2] = {before, after};
  CompareResult result;
  CompareMeasured* r[2] = {&result.before, &result.after};
  for (int i = 0; i < 2; ++i) {
    ir::Model m = load_input_model(files, paths[i], warn);
    auto shapes = resolve_input_shapes(m, {}, batch);
    r[i]->cost = analyze(m, shapes);
    const ModelCost& c = r[i]->cost;
    r[i]->params = c.params;
    r[i]->nonzero = c.nonzero;
    r[i]->macs = c.macs;
    r[i]->effective_macs = c.macs;
    for (const auto& l : c.layers)
      if (l.params)
        r[i]->effective_macs -=
            int64_t(double(l.macs) * (1.0 - double(l.nonzero) / double(l.params)));
    r[i]->file_bytes = model_file_bytes(paths[i], m);
    r[i]->latency = latency_of(m, shapes, int(iters), eo);
    if (r[i]->latency.unreliable() && warn) warn(paths[i] + ": " + r[i]->latency.warning());
    if (data.given()) {
      DataLoader dl(data.dataset(), data.eval_loader(m));
      EvalOptions ev;
      ev.device = device;
      ev.precision = eo.precision;
      ev.loss = data.loss_options();
      r[i]->top1 = evaluate(m, dl, ev).top1;
    }
  }
  nlohmann::json j = {{"before", before}, {"after", after},        {"batch", batch},
                      {"iters", iters},   {"data", data.data},     {"split", data.split},
                      {"device", device}, {"precision", precision}};
  j["before_measured"] = row(result.before);
  j["after_measured"] = row(result.after);
  result.json = j.dump(2);
  if (!out.empty()) files.write(out, result.json + "\n");
  if (!report.empty()) {
    HtmlReport rep("compare", "Comparing " + before + " and " + after, command);
    for (int i = 0; i < 2; ++i) {
      ReportModel m;
      m.label = i == 0 ? "before" : "after";
      m.path = paths[i];
      m.params = r[i]->params;
      m.nonzero = r[i]->nonzero;
      m.macs = r[i]->macs;
      m.effective_macs = r[i]->effective_macs;
      m.file_bytes = r[i]->file_bytes;
      set_latency(m, r[i]->latency);
      m.top1 = r[i]->top1;
      m.measured = fmt::format("latency: median of {} runs on {}, batch {}, {}", iters, device,
                               batch, precision);
      if (r[i]->top1 >= 0) m.measured += fmt::format("; top-1 on {} ({})", data.data, data.split);
      rep.add_model(m, r[i]->cost);
    }
    files.write(report, rep.html());
  }
  files.commit();
  return result;
}

}  // namespace lopper
