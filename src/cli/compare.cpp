// lopper compare BEFORE AFTER [--data D] [--split test] [--batch 1] [--iters 200] [--threads T]
//   [--json] [--report FILE]
// The gain, measured: params, nonzero, MACs, file size, accuracy and latency of two models, side by
// side, with the ratio after / before.
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "common.h"
#include "lopper/analysis.h"
#include "lopper/data.h"
#include "lopper/error.h"
#include "lopper/executor.h"
#include "lopper/files.h"
#include "lopper/latency.h"
#include "lopper/onnx_io.h"
#include "lopper/report.h"
#include "lopper/train.h"
#include "report.h"

namespace lopper::cli {

namespace {

struct Measured {
  int64_t params = 0, nonzero = 0, macs = 0, effective_macs = 0, file_bytes = 0;
  double top1 = -1;  // -1: no data
  double latency_ms = 0;
  LatencyStats latency;
};

// Latency of `iters` inference runs (after iters / 10 warm-ups, at least 3) on zeros at the
// model's input shapes (batch `batch`).
LatencyStats latency_ms(const ir::Model& m,
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
  LatencyOptions lo;
  lo.warmup = std::max(3, iters / 10);
  lo.min_runs = iters;
  return measure_latency([&] { ex.run(feeds); }, ex.device(), lo);
}

}  // namespace

Action add_compare(CLI::App& app) {
  struct Opts {
    std::string before, after, report, out, device = "cpu", precision = "fp32";
    DataFlags data;
    int64_t batch = 1;
    int iters = 200, threads = 0;
    bool json = false;
  };
  auto o = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand(
      "compare", "two models side by side: params, nonzero, MACs, file size, accuracy, latency");
  cmd->add_option("before", o->before, "the model before (e.g. dense)")->required();
  cmd->add_option("after", o->after, "the model after (e.g. pruned)")->required();
  o->data.add(cmd, "test", "measure top-1 accuracy on this dataset", /*default_batch_size=*/256);
  cmd->add_option("--batch", o->batch, "latency at this batch size (default 1)")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 20));
  cmd->add_option("--iters", o->iters, "timed runs per model (default 200)")
      ->check(CLI::Range(1, 1000000));
  add_threads_option(cmd, o->threads);
  cmd->add_option("--device", o->device, "cpu (default) | cuda | cuda:N");
  cmd->add_option("--precision", o->precision, "fp32 (default) | bf16 | fp16 (CUDA only)");
  cmd->add_flag("--json", o->json, "print JSON");
  cmd->add_option("-o,--out", o->out, "also write the JSON here");
  cmd->add_option("--report", o->report,
                  "write an HTML report here: the two models side by side, per layer");
  return [o]() {
    // What it reads, then what it writes: checked before any work.
    OutputFiles files("compare");
    files.input(o->before);
    files.input(o->after);
    add_data_inputs(files, o->data.data);
    if (!o->out.empty()) files.declare(o->out, "-o");
    if (!o->report.empty()) files.declare(o->report, "--report");
    configure_threads(o->threads);
    const ExecOptions eo = exec_options(o->device, o->precision);
    std::vector<std::string> paths = {o->before, o->after};
    std::vector<Measured> r(2);
    std::vector<ModelCost> costs;
    for (int i = 0; i < 2; ++i) {
      ir::Model m = load_input_model(files, paths[i]);
      auto shapes = resolve_input_shapes(m, {}, o->batch);
      ModelCost c = analyze(m, shapes);
      r[i].params = c.params;
      r[i].nonzero = c.nonzero;
      r[i].macs = c.macs;
      // MACs a sparse kernel would do: each prunable layer's MACs scaled by its density.
      r[i].effective_macs = c.macs;
      for (const auto& l : c.layers)
        if (l.params)
          r[i].effective_macs -=
              int64_t(double(l.macs) * (1.0 - double(l.nonzero) / double(l.params)));
      r[i].file_bytes = model_file_bytes(paths[i], m);
      costs.push_back(std::move(c));
      r[i].latency = latency_ms(m, shapes, o->iters, eo);
      r[i].latency_ms = r[i].latency.median_ms;
      if (r[i].latency.unreliable())
        std::cerr << "lopper: warning: " << paths[i] << ": " << r[i].latency.warning() << "\n";
      if (o->data.given()) {
        bool fixed = false;
        LoaderOptions lo = o->data.loader(m, fixed);
        lo.shuffle = false;
        lo.drop_last = fixed;
        DataLoader dl(o->data.dataset(), lo);
        EvalOptions ev;
        ev.device = o->device;
        ev.precision = eo.precision;
        ev.loss = o->data.loss_options();
        r[i].top1 = evaluate(m, dl, ev).top1;
      }
    }
    auto row = [](const Measured& m) {
      nlohmann::json j = {{"params", m.params},
                          {"nonzero", m.nonzero},
                          {"macs", m.macs},
                          {"effective_macs", m.effective_macs},
                          {"file_bytes", m.file_bytes},
                          {"latency_ms", m.latency_ms}};
      j["latency_p10_ms"] = m.latency.p10_ms;
      j["latency_p90_ms"] = m.latency.p90_ms;
      j["latency_spread"] = m.latency.spread;
      j["latency_spread_wide"] = m.latency.wide;
      j["latency_contended"] = m.latency.contended;
      if (m.latency.unreliable()) j["latency_warning"] = m.latency.warning();
      if (m.top1 >= 0) j["top1"] = m.top1;
      return j;
    };
    nlohmann::json j = {{"before", o->before}, {"after", o->after},        {"batch", o->batch},
                        {"iters", o->iters},   {"data", o->data.data},     {"split", o->data.split},
                        {"device", o->device}, {"precision", o->precision}};
    j["before_measured"] = row(r[0]);
    j["after_measured"] = row(r[1]);
    if (!o->out.empty()) files.write(o->out, j.dump(2) + "\n");
    if (!o->report.empty()) {
      HtmlReport rep("compare", "Comparing " + o->before + " and " + o->after, command_line());
      for (int i = 0; i < 2; ++i) {
        ReportModel m;
        m.label = i == 0 ? "before" : "after";
        m.path = paths[i];
        m.params = r[i].params;
        m.nonzero = r[i].nonzero;
        m.macs = r[i].macs;
        m.effective_macs = r[i].effective_macs;
        m.file_bytes = r[i].file_bytes;
        set_latency(m, r[i].latency);
        m.top1 = r[i].top1;
        m.measured = fmt::format("latency: median of {} runs on {}, batch {}, {}", o->iters,
                                 o->device, o->batch, o->precision);
        if (r[i].top1 >= 0)
          m.measured += fmt::format("; top-1 on {} ({})", o->data.data, o->data.split);
        rep.add_model(m, costs[i]);
      }
      files.write(o->report, rep.html());
    }
    files.commit();
    if (o->json) {
      std::cout << j.dump(2) << "\n";
      return 0;
    }
    auto ratio = [](double a, double b) { return a > 0 ? fmt::format("{:.3f}x", b / a) : "-"; };
    std::cout << fmt::format("{:<22} {:>14} {:>14} {:>10}\n", "", "before", "after",
                             "after/before");
    auto line = [&](const std::string& what, double a, double b, const std::string& fa,
                    const std::string& fb) {
      std::cout << fmt::format("{:<22} {:>14} {:>14} {:>10}\n", what, fa, fb, ratio(a, b));
    };
    auto n = [](int64_t v) { return fmt::format("{}", v); };
    line("params", r[0].params, r[1].params, n(r[0].params), n(r[1].params));
    line("nonzero params", r[0].nonzero, r[1].nonzero, n(r[0].nonzero), n(r[1].nonzero));
    line("MACs (dense)", r[0].macs, r[1].macs, n(r[0].macs), n(r[1].macs));
    line("MACs (nonzero)", r[0].effective_macs, r[1].effective_macs, n(r[0].effective_macs),
         n(r[1].effective_macs));
    line("file bytes", r[0].file_bytes, r[1].file_bytes, n(r[0].file_bytes), n(r[1].file_bytes));
    if (r[0].top1 >= 0)
      std::cout << fmt::format("{:<22} {:>13.2f}% {:>13.2f}% {:>+9.2f}pt\n",
                               o->data.split + " top-1", 100 * r[0].top1, 100 * r[1].top1,
                               100 * (r[1].top1 - r[0].top1));
    line(fmt::format("latency ms (batch {})", o->batch), r[0].latency_ms, r[1].latency_ms,
         fmt::format("{:.3f}", r[0].latency_ms), fmt::format("{:.3f}", r[1].latency_ms));
    return 0;
  };
}

}  // namespace lopper::cli
