// lopper prune --target-macs | --target-params | --target-latency-ms.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <iostream>
#include <nlohmann/json.hpp>
#include "common.h"
#include "lopper/analysis.h"
#include "lopper/data.h"
#include "lopper/error.h"
#include "lopper/files.h"
#include "lopper/onnx_io.h"
#include "lopper/progress.h"
#include "lopper/prune.h"
#include "lopper/report.h"
#include "lopper/sensitivity.h"
#include "lopper/target.h"
#include "lopper/train.h"
#include "prune.h"
#include "report.h"

namespace lopper::cli {

// lopper prune --target-macs|--target-params|--target-latency-ms: per-layer amounts chosen to meet
// the target with the least estimated loss (sensitivity data from --sensitivity FILE or measured
// on --data; without either, LAMP or the global channel ranking).
int run_target(const Opts& o, const TargetJob& job) {
  TargetOptions t = job.options;
  const bool inputs = job.reads_inputs;
  check_device_flag(o.device);
  OutputFiles files("prune");
  declare_files(files, o);
  ir::Model model = load_input_model(files, o.model);
  std::optional<SensitivityResult> sens;
  std::unique_ptr<DataLoader> loader;  // --data: the sensitivity's batches, then the loss measured
  std::unique_ptr<DataLoader> calib;   // wanda, sparsegpt: the calibration's batches
  if (inputs) {
    auto [lo, co] = input_calibration(o, model);
    calib = std::make_unique<DataLoader>(o.data.dataset(), lo);
    t.calibration = co;
    t.calibration_data = calib.get();
    check_calibration(*calib, co);  // before the sweep
  }
  // --data: the sensitivity is measured on it, or (with --sensitivity FILE) only the model before
  // and after pruning, for the report's top-1 and loss.
  if (o.data.given()) {
    LoaderOptions lo = o.data.loader(model);
    lo.shuffle = false;
    loader = std::make_unique<DataLoader>(o.data.dataset(), lo);
  }
  if (!o.sensitivity.empty()) {
    sens = parse_sensitivity(read_file(o.sensitivity), o.sensitivity);
  } else if (loader) {
    SensitivityOptions so = sensitivity_options(t);
    so.eval_batches = o.eval_batches;
    if (inputs && o.calib_batches_given) so.calib_batches = o.calib_batches;
    so.loss = o.data.loss_options(o.seed);
    std::unique_ptr<Progress> bar;
    so.progress = [&](int64_t done, int64_t total, const std::string& what) {
      if (!bar) bar = std::make_unique<Progress>("sensitivity", total, 10);
      bar->update(done, what);
    };
    sens = sensitivity(model, *loader, so);
  }
  t.sensitivity = sens ? &*sens : nullptr;
  std::unique_ptr<Progress> bar;
  t.progress = [&](const std::string& what, int64_t done, int64_t total) {
    if (!bar) bar = std::make_unique<Progress>("target", total, 10);
    bar->update(done, what);
  };
  EvalOptions eval_opts;
  eval_opts.device = o.device;
  eval_opts.max_batches = o.eval_batches;
  if (o.data.given()) eval_opts.loss = o.data.loss_options(o.seed);
  std::optional<EvalResult> base;  // the model before, measured here when the file holds the sweep
  if (!o.sensitivity.empty() && loader) base = evaluate(model, *loader, eval_opts);
  const auto shapes = resolve_input_shapes(model, t.input_shapes, 1);
  const ModelCost before = analyze(model, shapes);
  TargetReport r = prune_to_target(model, t);
  if (bar) bar->finish();
  for (const auto& w : r.warnings) std::cerr << "lopper: [prune] warning: " << w << "\n";
  const ModelCost after = analyze(model, shapes);
  onnx::SaveOptions save;
  if (o.sparse) save.sparse = onnx::SaveOptions::Sparse::kAll;
  onnx::save_model(model, o.out, save, files);

  const bool latency = t.kind == TargetKind::kLatency;
  nlohmann::json j = to_json(r, sens.has_value());
  j["model"] = o.model;
  j["out"] = o.out;
  j["target"]["value"] = t.value;
  if (latency) j["target"]["device"] = o.device;
  const std::string spread_warning = j["target"].value("latency_warning", "");
  std::optional<EvalResult> measured;  // the pruned model on the sensitivity's own batches
  std::optional<std::pair<EvalResult, EvalResult>> evaluated;  // before and after, for --report
  if (sens && loader) {
    measured = evaluate(model, *loader, eval_opts);
    if (!base) {  // the sweep's own measurement of the model before, on the same batches
      base.emplace();
      base->samples = sens->samples;
      base->top1 = sens->top1;
      base->loss = sens->loss;
    }
    evaluated.emplace(*base, *measured);
    j["target"]["loss"]["measured"] = measured->loss;
    j["target"]["loss"]["top1_base"] = base->top1;
    j["target"]["loss"]["top1_measured"] = measured->top1;
  }
  j["structured"] = t.structured;
  put_costs(j, o, files, model, before, after);
  j["nonzero_before"] = before.nonzero;
  j["nonzero"] = after.nonzero;
  const std::string report_path = o.out + ".report.json";
  files.write(report_path, j.dump(2) + "\n");
  if (!o.report.empty())
    write_html_report(
        files, o, model,
        [&](HtmlReport& rep) {
          std::vector<std::pair<std::string, double>> chosen;
          for (const auto& u : r.units) chosen.emplace_back(u.label(), u.amount);
          rep.add_target(j["target"], chosen);
          if (sens) rep.add_sensitivity(*sens);
        },
        evaluated ? &*evaluated : nullptr);
  files.commit();
  if (latency && r.measured > r.target)
    std::cerr << fmt::format(
        "lopper: [prune] warning: measured {:.3f} ms, over the target {:.3f} "
        "ms (latency is noisy: measure again with lopper bench)\n",
        r.measured, r.target);
  if (!spread_warning.empty()) std::cerr << "lopper: [prune] warning: " << spread_warning << "\n";
  if (o.json) {
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::cout << to_table(r, t.structured, sens.has_value());
  std::cout << "\n"
            << target_summary(r, t.value, sens ? &*sens : nullptr, measured ? &*measured : nullptr,
                              before, after)
            << "report   " << report_path << "\n";
  if (!o.report.empty()) std::cout << "report   " << o.report << "\n";
  return 0;
}

}  // namespace lopper::cli
