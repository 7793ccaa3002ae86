// lopper prune MODEL -o OUT --method abs|l1|random|grad|taylor [--threshold T] [--amount A]
//   [--seed S] [--scope local|global] [--pattern unstructured|N:M|row|column|block:RxC]
//   [--norm 1|2] [--exclude REGEX] [--skip-first-last] [--sparse-initializers] [--json]
//   grad/taylor: --data SPEC [--split train|test] [--calib-batches N] [--batch-size B]
//   [--device cpu|cuda] [--normalize MEAN,STD] [--resize HxW]
// lopper prune MODEL -o OUT --recipe FILE.yaml [--data SPEC ...] [--sparse-initializers] [--json]
// lopper prune MODEL -o OUT --structured channel|head [--method l1|l2|bn|taylor|fpgm|random]
//   --amount A [--scope local|global] [--max-layer-amount F] [--round-to N] [--exclude REGEX]
//   [--recipe FILE.yaml] [--shape NAME=DIMS] [--seed S] [--json]   (taylor: --data SPEC ...)
// lopper prune MODEL -o OUT --target-macs F | --target-params F | --target-latency-ms X
//   [--structured channel] [--sensitivity FILE | --data SPEC [--eval-batches N]] [--device D]
// Any of them: [--report FILE.html] (with --data: top-1 before and after on --eval-batches batches)
#include "lopper/prune.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <iostream>
#include <nlohmann/json.hpp>
#include <regex>

#include "cli/commands.h"
#include "cli/common.h"
#include "cli/report.h"
#include "lopper/data.h"
#include "lopper/error.h"
#include "lopper/executor.h"
#include "lopper/files.h"
#include "lopper/onnx_io.h"
#include "lopper/report.h"
#include "lopper/progress.h"
#include "lopper/analysis.h"
#include "lopper/target.h"
#include "lopper/sensitivity.h"
#include "lopper/structured.h"
#include "lopper/train.h"

namespace lopper::cli {

namespace {

struct Opts {
  std::string model, out, method, amount, scope = "local", pattern = "unstructured", exclude,
                                          recipe, data, split = "train", device = "cpu",
                                          normalize, resize;
  double threshold = -1;
  uint64_t seed = 0;
  int norm = 1;
  int64_t calib_batches = 32, batch_size = 32;
  bool skip_first_last = false, sparse = false, json = false, have_threshold = false;
  std::string structured;
  double max_layer_amount = 0.9;
  int64_t round_to = 1;
  std::vector<std::string> shapes;
  double target_macs = 0, target_params = 0, target_latency_ms = 0;
  std::string sensitivity, report;
  int64_t eval_batches = 16;
  int threads = 0;
};

// The loader options of --data for `model`: --batch-size (a fixed batch dimension wins),
// --normalize, --resize.
LoaderOptions data_loader_options(const Opts& o, const ir::Model& model) {
  LOPPER_CHECK(o.batch_size > 0, "[prune] --batch-size must be > 0, got ", o.batch_size);
  LoaderOptions lo;
  lo.batch_size = o.batch_size;
  if (int64_t fixed = fixed_batch_size(model)) lo.batch_size = fixed;
  if (!o.normalize.empty()) parse_normalize(o.normalize, lo);
  if (!o.resize.empty()) parse_resize(o.resize, lo);
  return lo;
}

// Gradient saliencies on calibration batches (grad, taylor).
Saliency calibrate(const Opts& o, const ir::Model& model) {
  LoaderOptions lo = data_loader_options(o, model);
  lo.seed = o.seed;
  lo.drop_last = true;  // every calibration batch the same size
  DataLoader loader(open_dataset(o.data, o.split), lo);
  CalibrationOptions co;
  co.batches = o.calib_batches;
  co.device = o.device;
  Progress bar("calibrate", std::min<int64_t>(co.batches, loader.batches_per_epoch()));
  co.progress = [&](int64_t b, int64_t of, double loss) {
    bar.update(b, fmt::format("loss {:.4f}", loss));
  };
  Saliency s = compute_saliency(model, loader, co);
  bar.finish();
  return s;
}

// --report: the models before (read again from --model) and after, measured on --device, top-1
// and loss on the first --eval-batches batches of --data when it is given (`known`: already
// evaluated there, before and after); `extra` adds what the kind of pruning knows (target,
// sensitivity, notes).
void write_html_report(OutputFiles& files, const Opts& o, const ir::Model& after,
                       const std::function<void(HtmlReport&)>& extra = {},
                       const std::pair<EvalResult, EvalResult>* known = nullptr) {
  const ir::Model before = onnx::load_model(o.model);
  ReportMeasure how;
  how.device = o.device;
  how.shapes = parse_shape_overrides(o.shapes);
  std::unique_ptr<DataLoader> loader;
  const std::string data_name = fmt::format("{} ({})", o.data, o.split);
  if (!o.data.empty() && !known) {
    LoaderOptions lo = data_loader_options(o, before);
    lo.shuffle = false;
    loader = std::make_unique<DataLoader>(open_dataset(o.data, o.split), lo);
    how.data = loader.get();
    how.eval_batches = o.eval_batches;
    how.data_name = data_name;
  }
  const ModelCost cb = analyze(before, resolve_input_shapes(before, how.shapes, 1));
  const ModelCost ca = analyze(after, resolve_input_shapes(after, how.shapes, 1));
  ReportModel mb = measure_for_report("before", o.model, before, cb, how);
  ReportModel ma = measure_for_report("after", o.out, after, ca, how);
  ma.file_bytes = staged_model_bytes(files, o.out);  // written, not yet in place
  if (known) {
    set_accuracy(mb, known->first.top1, known->first.loss, known->first.samples, data_name);
    set_accuracy(ma, known->second.top1, known->second.loss, known->second.samples, data_name);
  }
  HtmlReport rep("prune", "Pruning " + o.model, command_line());
  rep.add_model(mb, cb);
  rep.add_model(ma, ca);
  if (mb.top1 >= 0 && cb.nonzero > 0) {
    const std::string x = "share of the nonzero parameters removed", y = "top-1";
    const std::string intro =
        "The model before and after pruning; with sensitivity data, also every point of the "
        "sweep (one layer or group pruned alone), on its own evaluation batches.";
    rep.add_tradeoff(x, y, intro, {"before", {{0.0, mb.top1, ""}}, false, "reference"});
    rep.add_tradeoff(x, y, intro,
                     {"after",
                      {{1.0 - double(ca.nonzero) / double(cb.nonzero), ma.top1, ""}},
                      false,
                      "result"});
  }
  if (extra) extra(rep);
  files.write(o.report, rep.html());
}

// The report's model costs before and after (a model that shrinks, or a target).
void put_costs(nlohmann::json& j, const Opts& o, const OutputFiles& files, const ir::Model& input,
               const ModelCost& before, const ModelCost& after) {
  j["params_before"] = before.params;
  j["params"] = after.params;
  j["macs_before"] = before.macs;
  j["macs"] = after.macs;
  j["file_bytes_before"] = model_file_bytes(o.model, input);
  j["file_bytes_after"] = staged_model_bytes(files, o.out);
}

// The files of a prune: what it reads, then what it writes (checked before any work).
void declare_files(OutputFiles& files, const Opts& o) {
  files.input(o.model);
  files.input(o.recipe);
  files.input(o.sensitivity);
  add_data_inputs(files, o.data);
  files.declare(o.out, "-o");
  files.declare(o.out + ".report.json", "the JSON report");
  if (!o.report.empty()) files.declare(o.report, "--report");
}

// lopper prune --target-macs|--target-params|--target-latency-ms: per-layer amounts chosen to meet
// the target with the least estimated loss (sensitivity data from --sensitivity FILE or measured
// on --data; without either, LAMP or the global channel ranking).
int run_target(const Opts& o, TargetKind kind) {
  TargetOptions t;
  t.kind = kind;
  t.value = t.kind == TargetKind::kMacs     ? o.target_macs
            : t.kind == TargetKind::kParams ? o.target_params
                                            : o.target_latency_ms;
  if (!o.structured.empty()) {
    if (o.structured != "channel")
      throw UsageError("[prune] a target prunes weights or --structured channel, not '" +
                       o.structured + "'");
    t.structured = true;
    t.importance = parse_flag([&] { return parse_channel_importance(o.method.empty() ? "l1" : o.method); });
  } else if (!o.method.empty() && o.method != "l1") {
    throw UsageError("[prune] a target prunes weights by magnitude (l1); --method " + o.method +
                     " does not go with it");
  }
  if (!o.sensitivity.empty() && !o.data.empty())
    throw UsageError("[prune] --sensitivity FILE already holds the measurements: drop --data");
  t.round_to = o.round_to;
  t.exclude = o.exclude;
  t.device = o.device;
  t.input_shapes = parse_shape_overrides(o.shapes);
  check_device_flag(o.device);
  OutputFiles files("prune");
  declare_files(files, o);
  ir::Model model = load_input_model(files, o.model);
  std::optional<SensitivityResult> sens;
  std::unique_ptr<DataLoader> loader;  // --data: the sensitivity's batches, then the loss measured
  if (!o.data.empty()) {
    LoaderOptions lo = data_loader_options(o, model);
    lo.shuffle = false;
    loader = std::make_unique<DataLoader>(open_dataset(o.data, o.split), lo);
  }
  if (!o.sensitivity.empty()) {
    sens = parse_sensitivity(read_file(o.sensitivity), o.sensitivity);
  } else if (loader) {
    SensitivityOptions so;
    so.structured = t.structured;
    so.importance = t.importance;
    so.round_to = t.round_to;
    so.exclude = t.exclude;
    so.device = o.device;
    so.eval_batches = o.eval_batches;
    so.input_shapes = t.input_shapes;
    // NOTE: weights: beyond 0.95, so that high targets (95% of the weights removed overall needs
    // some layers past 95%) have curve points to reach them.
    if (!t.structured) so.amounts = {0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.98, 0.99};
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
  const auto shapes = resolve_input_shapes(model, t.input_shapes, 1);
  const ModelCost before = analyze(model, shapes);
  TargetReport r = prune_to_target(model, t);
  if (bar) bar->finish();
  const ModelCost after = analyze(model, shapes);
  onnx::SaveOptions save;
  if (o.sparse) save.sparse = onnx::SaveOptions::Sparse::kAll;
  onnx::save_model(model, o.out, save, files);

  const bool latency = t.kind == TargetKind::kLatency;
  nlohmann::json j;
  j["model"] = o.model;
  j["out"] = o.out;
  j["target"] = {{"kind", target_name(r.kind)}, {"value", t.value}, {"goal", r.target},
                 {"before", r.before}, {"predicted", r.predicted}, {"measured", r.measured},
                 {"estimator", r.estimator}, {"rounds", r.rounds}};
  if (latency) j["target"]["device"] = o.device;
  std::string spread_warning;  // the search's latency measurements disagreed: a busy machine
  if (latency) {
    j["target"]["latency_spread"] = r.latency_widest.spread;  // the widest p90 / median
    if (r.latency_wide > 0) {
      spread_warning = fmt::format("{} of {} latency measurements: {}", r.latency_wide,
                                   r.latency_measurements, r.latency_widest.warning());
      j["target"]["latency_warning"] = spread_warning;
    }
  }
  std::optional<EvalResult> measured;  // the pruned model on the sensitivity's own batches
  std::optional<std::pair<EvalResult, EvalResult>> evaluated;  // before and after, for --report
  if (sens && loader) {
    measured = evaluate(model, *loader, o.device, {}, at::kFloat, o.eval_batches);
    EvalResult base;
    base.samples = sens->samples;
    base.top1 = sens->top1;
    base.loss = sens->loss;
    evaluated.emplace(base, *measured);
    j["target"]["loss"] = {{"base", r.base_loss},
                           {"predicted", r.predicted_loss},
                           {"measured", measured->loss},
                           {"top1_base", sens->top1},
                           {"top1_measured", measured->top1}};
  } else if (sens) {
    j["target"]["loss"] = {{"base", r.base_loss}, {"predicted", r.predicted_loss}};
  }
  j["structured"] = t.structured;
  put_costs(j, o, files, model, before, after);
  j["nonzero_before"] = before.nonzero;
  j["nonzero"] = after.nonzero;
  j["layers"] = nlohmann::json::array();
  for (const auto& u : r.units) {
    nlohmann::json ju = {{"name", u.name}, {"layers", u.layers}, {"amount", u.amount}};
    if (!u.weight.empty()) ju["weight"] = u.weight;
    if (u.group >= 0) ju["group"] = u.group;
    if (sens) ju["est_loss_increase"] = u.est_loss_increase;
    j["layers"].push_back(ju);
  }
  const std::string report_path = o.out + ".report.json";
  files.write(report_path, j.dump(2) + "\n");
  if (!o.report.empty())
    write_html_report(files, o, model, [&](HtmlReport& rep) {
      std::vector<std::pair<std::string, double>> chosen;
      for (const auto& u : r.units) chosen.emplace_back(u.name, u.amount);
      rep.add_target(j["target"], chosen);
      if (sens) rep.add_sensitivity(*sens);
    }, evaluated ? &*evaluated : nullptr);
  files.commit();
  if (latency && r.measured > r.target)
    std::cerr << fmt::format("lopper: [prune] warning: measured {:.3f} ms, over the target {:.3f} "
                             "ms (latency is noisy: measure again with lopper bench)\n",
                             r.measured, r.target);
  if (!spread_warning.empty()) std::cerr << "lopper: [prune] warning: " << spread_warning << "\n";
  if (o.json) {
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::vector<std::string> names;
  for (const auto& u : r.units) names.push_back(u.name);
  const size_t w = name_column_width(names, 5);
  std::cout << fmt::format("{:<{}}  {:>8}{}\n", t.structured ? "group" : "layer", w, "amount",
                           sens ? "  est. loss +" : "");
  for (const auto& u : r.units)
    std::cout << fmt::format("{:<{}}  {:>7.1f}%{}\n", fit_name(u.name, w), w, 100 * u.amount,
                             sens ? fmt::format("  {:>11.4f}", u.est_loss_increase) : "");
  auto fmt_cost = [&](double v) {
    return latency ? fmt::format("{:.3f} ms", v) : fmt::format("{:.0f}", v);
  };
  std::cout << fmt::format("\ntarget   {} {} = {} (estimator: {}, {} round{})\n",
                           target_name(r.kind), latency ? fmt_cost(t.value)
                                                        : fmt::format("{:g} of {}", t.value,
                                                                      fmt_cost(r.before)),
                           fmt_cost(r.target), r.estimator, r.rounds, r.rounds == 1 ? "" : "s")
            << fmt::format("result   predicted {}, measured {}\n", fmt_cost(r.predicted),
                           fmt_cost(r.measured));
  if (sens)
    std::cout << fmt::format("loss     {:.4f} unpruned, {:.4f} predicted (sum of the layers' "
                             "increases){}\n",
                             r.base_loss, r.predicted_loss,
                             measured ? fmt::format(", {:.4f} measured", measured->loss) : "");
  if (measured)
    std::cout << fmt::format("top-1    {:.2f}% unpruned, {:.2f}% measured (on the same {} "
                             "samples, before fine-tuning)\n",
                             100 * sens->top1, 100 * measured->top1, measured->samples);
  const EffectiveCost eb = effective_cost(before), ea = effective_cost(after);
  std::cout << fmt::format("params   {:>14}  (nonzero {}, was {})\n", after.params, after.nonzero,
                           before.nonzero)
            << fmt::format("MACs     {:>14}  (was {}; on nonzero weights {}, was {})\n",
                           after.macs, before.macs, ea.macs, eb.macs)
            << "report   " << report_path << "\n";
  if (!o.report.empty()) std::cout << "report   " << o.report << "\n";
  return 0;
}

// lopper prune --structured channel|head: channels or heads removed, the model shrinks.
int run_structured(const Opts& o) {
  StructuredOptions so;
  if (o.structured == "channel")
    so.unit = StructuredUnit::kChannel;
  else if (o.structured == "head")
    so.unit = StructuredUnit::kHead;
  else
    throw UsageError("[prune] --structured takes channel or head, got '" + o.structured + "'");
  so.importance =
      parse_flag([&] { return parse_channel_importance(o.method.empty() ? "l1" : o.method); });
  std::optional<PruneRecipe> recipe;
  if (!o.recipe.empty()) {
    recipe = load_prune_recipe(o.recipe);
    so.recipe = &*recipe;
  } else {
    if (o.amount.empty()) throw UsageError("[prune] --structured needs --amount A (or --recipe)");
    so.amount = parse_flag([&] { return PruneAmount::parse(o.amount); });
  }
  if (o.scope == "global")
    so.scope = PruneScope::kGlobal;
  else if (o.scope != "local")
    throw UsageError("[prune] unknown scope '" + o.scope + "' (scopes: local, global)");
  so.max_layer_amount = o.max_layer_amount;
  so.round_to = o.round_to;
  so.exclude = o.exclude;
  so.seed = o.seed;
  so.input_shapes = parse_shape_overrides(o.shapes);
  const bool needs_data = so.importance == ChannelImportance::kTaylor;
  if (needs_data && o.data.empty())
    throw UsageError("[prune] --method taylor ranks channels by gradients on data: give --data SPEC");
  if (!needs_data && !o.data.empty() && o.report.empty())
    throw UsageError("[prune] --data is for --method taylor (and grad/taylor unstructured) only, "
                     "or for the accuracy in --report");

  OutputFiles files("prune");
  declare_files(files, o);
  ir::Model model = load_input_model(files, o.model);
  auto shapes = resolve_input_shapes(model, so.input_shapes);
  ModelCost before = analyze(model, shapes);
  std::optional<Saliency> saliency;
  if (needs_data) saliency = calibrate(o, model);
  StructuredReport r = prune_structured(model, so, saliency ? &*saliency : nullptr);
  ModelCost after = analyze(model, shapes);
  onnx::SaveOptions save;
  if (o.sparse) save.sparse = onnx::SaveOptions::Sparse::kAll;
  onnx::save_model(model, o.out, save, files);
  for (const auto& w : r.warnings) std::cerr << "lopper: [prune] warning: " << w << "\n";

  nlohmann::json j;
  j["model"] = o.model;
  j["out"] = o.out;
  j["structured"] = o.structured;
  j["method"] = importance_name(so.importance);
  j["scope"] = o.scope;
  put_costs(j, o, files, model, before, after);
  j["channels_before"] = r.channels_before;
  j["channels"] = r.channels_after;
  j["barriers"] = r.barriers;
  j["warnings"] = r.warnings;
  j["groups"] = nlohmann::json::array();
  for (const auto& g : r.groups) {
    nlohmann::json jg = {{"id", g.id}, {"kind", g.kind}, {"layers", g.layers},
                         {"size_before", g.size_before}, {"size_after", g.size_after},
                         {"score", g.score}, {"removed", g.removed}};
    if (!g.blocked.empty()) jg["blocked"] = g.blocked;
    if (g.blocks > 1) jg["blocks"] = g.blocks;
    if (!g.rule.empty()) jg["rule"] = g.rule;
    j["groups"].push_back(jg);
  }
  std::string report_path = o.out + ".report.json";
  files.write(report_path, j.dump(2) + "\n");
  if (!o.report.empty())
    write_html_report(files, o, model, [&](HtmlReport& rep) {
      for (const auto& b : r.barriers) rep.add_note("channels kept: " + b);
      for (const auto& w : r.warnings) rep.add_note(w);
    });
  files.commit();
  if (o.json) {
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::cout << fmt::format("{:>5}  {:<7} {:>8} {:>8} {:>12}  {}\n", "group", "kind", "before",
                           "after", "score", "layers");
  for (const auto& g : r.groups) {
    std::string layers;
    for (size_t i = 0; i < g.layers.size() && i < 3; ++i) layers += (i ? ", " : "") + g.layers[i];
    if (g.layers.size() > 3) layers += fmt::format(" (+{})", g.layers.size() - 3);
    if (!g.blocked.empty()) layers += "  [kept: " + g.blocked + "]";
    std::cout << fmt::format("{:>5}  {:<7} {:>8} {:>8} {:>12.4g}  {}\n", g.id, g.kind,
                             g.size_before, g.size_after, g.score, layers);
  }
  auto pct = [](int64_t a, int64_t b) { return b ? 100.0 * (1.0 - double(a) / double(b)) : 0.0; };
  std::cout << fmt::format("\nchannels {:>14}  (was {}, -{:.1f}%)\n", r.channels_after,
                           r.channels_before, pct(r.channels_after, r.channels_before))
            << fmt::format("params   {:>14}  (was {}, -{:.1f}%)\n", after.params, before.params,
                           pct(after.params, before.params))
            << fmt::format("MACs     {:>14}  (was {}, -{:.1f}%)\n", after.macs, before.macs,
                           pct(after.macs, before.macs))
            << fmt::format("file     {:>14} bytes (was {})\n",
                           j["file_bytes_after"].get<int64_t>(), j["file_bytes_before"].get<int64_t>());
  if (!r.barriers.empty()) {
    std::cout << "barriers (channels kept):\n";
    for (const auto& b : r.barriers) std::cout << "  " << b << "\n";
  }
  std::cout << "report   " << report_path << "\n";
  if (!o.report.empty()) std::cout << "report   " << o.report << "\n";
  return 0;
}
}  // namespace

Action add_prune(CLI::App& app) {
  auto o = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand(
      "prune",
      "zero weights (magnitude, random, gradients, N:M, rows/columns, blocks) or "
      "remove whole channels and heads (--structured)");
  cmd->add_option("model", o->model, "the ONNX model")->required();
  cmd->add_option("-o,--out", o->out, "where to write the pruned model")->required();
  auto* method =
      cmd->add_option("--method", o->method, "abs | l1 | random | grad | taylor (or --recipe)");
  auto* th = cmd->add_option("--threshold", o->threshold, "abs: remove every |w| < T");
  auto* amount =
      cmd->add_option("--amount", o->amount,
                      "l1, random, grad, taylor: a fraction in [0, 1] of the weights left, or an "
                      "integer count");
  auto* seed = cmd->add_option("--seed", o->seed,
                               "random: the seed; grad/taylor: the data's shuffling (default 0)");
  auto* scope = cmd->add_option(
      "--scope", o->scope,
      "local (per tensor, default) | global (one ranking; unstructured and block only)");
  auto* pattern = cmd->add_option(
      "--pattern", o->pattern,
      "unstructured (default) | N:M (e.g. 2:4) | row | column | block:RxC (R outputs x C inputs, "
      "each 1..256, e.g. block:8x1)");
  auto* norm = cmd->add_option("--norm", o->norm,
                               "row/column with l1: rank by the L1 or L2 norm; block: by mean |w| "
                               "or root mean square (1 | 2)");
  auto* exclude = cmd->add_option("--exclude", o->exclude,
                                  "leave layers whose node or weight name matches REGEX");
  auto* sfl =
      cmd->add_flag("--skip-first-last", o->skip_first_last, "leave the first and last layers");
  cmd->add_flag("--sparse-initializers", o->sparse,
                "store pruned weights as sparse_initializer where that makes them smaller");
  cmd->add_flag("--json", o->json, "print the report as JSON instead of a table");
  auto* structured = cmd->add_option(
      "--structured", o->structured,
      "channel | head: remove whole channels (filters, neurons) or attention heads; the model "
      "shrinks. Methods: l1 (default), l2, bn, taylor, fpgm, random");
  auto* mla = cmd->add_option("--max-layer-amount", o->max_layer_amount,
                              "structured, global: no group loses more than this share (0.9)");
  auto* round_to = cmd->add_option("--round-to", o->round_to,
                                   "structured: keep channel counts a multiple of N");
  auto* shape = cmd->add_option("--shape", o->shapes,
                                "structured: NAME=1x3x224x224 for the analysis run (dynamic dims "
                                "default to 1)");
  cmd->add_option(
      "--recipe", o->recipe,
      "per-layer rules from YAML, first match wins (examples/recipe.yaml); local scope");
  auto* data = cmd->add_option("--data", o->data,
                               "grad, taylor: calibration data (fashion-mnist, idx:DIR, "
                               "cifar10:DIR, folder:DIR, npy:X.npy,Y.npy)");
  std::vector<CLI::Option*> data_opts = {
      cmd->add_option("--split", o->split, "the data's split: train (default) | test"),
      cmd->add_option("--calib-batches", o->calib_batches, "grad, taylor: batches (default 32)"),
      cmd->add_option("--batch-size", o->batch_size,
                      "grad, taylor: samples per batch (default 32; a model with a fixed batch "
                      "dimension sets it)"),
      cmd->add_option("--device", o->device, "grad, taylor: cpu (default) | cuda | cuda:N"),
      cmd->add_option("--normalize", o->normalize,
                      "grad, taylor: subtract MEAN and divide by STD (one value or one per "
                      "channel: M1,M2,M3,S1,S2,S3) after scaling pixels to [0, 1]"),
      cmd->add_option("--resize", o->resize, "grad, taylor: resize images to HxW")};
  std::vector<CLI::Option*> per_layer = {method, th, amount, seed, pattern, norm, exclude, sfl};
  std::vector<CLI::Option*> targets = {
      cmd->add_option("--target-macs", o->target_macs,
                      "keep this share of the MACs, in (0, 1): per-layer amounts chosen"),
      cmd->add_option("--target-params", o->target_params,
                      "keep this share of the nonzero parameters, in (0, 1)"),
      cmd->add_option("--target-latency-ms", o->target_latency_ms,
                      "run within this many ms on --device (per-layer latencies measured there)")};
  auto* sens = cmd->add_option(
      "--sensitivity", o->sensitivity,
      "target: per-layer loss curves from lopper sensitivity -o FILE (else --data measures them, "
      "else LAMP / the global channel ranking)");
  auto* eval_batches = cmd->add_option(
      "--eval-batches", o->eval_batches,
      "with --data: batches per sensitivity point (target) and for --report's top-1 (16)");
  auto* report = cmd->add_option(
      "--report", o->report,
      "write an HTML report here: before/after, per layer, target and sensitivity (with --data: "
      "top-1 before and after)");
  auto* recipe_opt = cmd->get_option("--recipe");
  add_threads_option(cmd, o->threads);
  return [o, th, scope, data, data_opts, per_layer, structured, mla, round_to, shape, pattern, norm,
          sfl, targets, sens, eval_batches, amount, recipe_opt, report]() {
    configure_threads(o->threads);
    int given = 0;
    TargetKind kind = TargetKind::kMacs;
    const TargetKind kinds[] = {TargetKind::kMacs, TargetKind::kParams, TargetKind::kLatency};
    for (size_t i = 0; i < targets.size(); ++i)
      if (targets[i]->count() > 0) ++given, kind = kinds[i];
    if (given > 1)
      throw UsageError("[prune] give one of --target-macs, --target-params, --target-latency-ms");
    if (given == 1) {
      for (const auto* opt : {amount, th, pattern, norm, sfl, scope, mla, recipe_opt})
        if (opt->count() > 0)
          throw UsageError("[prune] a target chooses each layer's amount: drop " + opt->get_name());
      return run_target(*o, kind);
    }
    if (sens->count() > 0)
      throw UsageError("[prune] --sensitivity is for --target-macs/-params/-latency-ms");
    if (eval_batches->count() > 0 && report->count() == 0)
      throw UsageError("[prune] --eval-batches is for --target-macs/-params/-latency-ms and "
                       "--report");
    if (structured->count() > 0) {
      for (const auto* opt : {th, pattern, norm, sfl})
        if (opt->count() > 0)
          throw UsageError("[prune] " + opt->get_name() + " is for unstructured pruning, not --structured");
      return run_structured(*o);
    }
    for (const auto* opt : {mla, round_to, shape})
      if (opt->count() > 0)
        throw UsageError("[prune] " + opt->get_name() + " is for --structured");
    std::optional<PruneRecipe> recipe;
    PruneOptions po;
    if (!o->recipe.empty()) {
      for (const auto* opt : per_layer)
        if (opt->count() > 0)
          throw UsageError("[prune] --recipe sets each layer's pruning: drop " + opt->get_name() +
                           " (put it in the recipe)");
      if (scope->count() > 0 && o->scope != "local")
        throw UsageError("[prune] --recipe prunes layer by layer: --scope " + o->scope +
                         " does not go with it");
    } else if (o->method.empty()) {
      throw UsageError(
          "[prune] needs --method abs|l1|random|grad|taylor or --recipe FILE.yaml");
    } else {
      po.method = parse_flag([&] { return parse_prune_method(o->method); });
    }
    bool needs_data = false;
    if (!o->recipe.empty()) {
      recipe = load_prune_recipe(o->recipe);
      auto by_data = [](const PruneLayerOptions& l) {
        return l.method == PruneMethod::kGrad || l.method == PruneMethod::kTaylor;
      };
      needs_data = recipe->has_defaults && by_data(recipe->defaults);
      for (const auto& r : recipe->rules) needs_data = needs_data || (!r.skip && by_data(r.options));
    } else {
      needs_data = po.method == PruneMethod::kGrad || po.method == PruneMethod::kTaylor;
    }
    if (needs_data && o->data.empty())
      throw UsageError("[prune] grad and taylor rank weights by their gradients on data: give "
                       "--data SPEC (e.g. --data fashion-mnist)");
    if (!needs_data) {
      // --report measures top-1 on --data: everything but the calibration's own batch count.
      std::vector<CLI::Option*> given = data_opts;
      given.insert(given.begin(), data);
      for (const auto* opt : given)
        if (opt->count() > 0 && (report->count() == 0 || opt->get_name() == "--calib-batches"))
          throw UsageError("[prune] " + opt->get_name() + " is for grad and taylor only" +
                           (report->count() ? "" : " (or --report's accuracy)"));
    }
    if (o->recipe.empty()) {
      if (o->scope == "local")
        po.scope = PruneScope::kLocal;
      else if (o->scope == "global")
        po.scope = PruneScope::kGlobal;
      else
        throw UsageError("[prune] unknown scope '" + o->scope + "' (scopes: local, global)");
      parse_flag([&] { parse_prune_pattern(o->pattern, po); });
      if (po.method == PruneMethod::kAbs) {
        if (th->count() == 0) throw UsageError("[prune] --method abs needs --threshold T");
        if (!o->amount.empty())
          throw UsageError("[prune] --method abs takes --threshold, not --amount");
        po.threshold = o->threshold;
      } else if (po.pattern != PrunePattern::kNM) {
        if (o->amount.empty())
          throw UsageError(std::string("[prune] --method ") + method_name(po.method) +
                           " needs --amount A");
        po.amount = parse_flag([&] { return PruneAmount::parse(o->amount); });
      }
      po.seed = o->seed;
      po.norm = o->norm;
      po.exclude = o->exclude;
      po.skip_first_last = o->skip_first_last;
      parse_flag([&] { check_layer_options(po); });  // every flag checked before any work
    }

    OutputFiles files("prune");
    declare_files(files, *o);
    ir::Model model = load_input_model(files, o->model);
    std::optional<Saliency> saliency;
    if (needs_data) {
      saliency = calibrate(*o, model);
    }
    const Saliency* sal = saliency ? &*saliency : nullptr;
    PruneReport r = recipe ? prune(model, *recipe, sal) : prune(model, po, sal);
    onnx::SaveOptions so;
    if (o->sparse) so.sparse = onnx::SaveOptions::Sparse::kAll;  // where it makes a tensor smaller
    onnx::save_model(model, o->out, so, files);
    for (const auto& w : r.warnings) std::cerr << "lopper: [prune] warning: " << w << "\n";

    nlohmann::json j;
    j["model"] = o->model;
    j["out"] = o->out;
    j["params"] = r.params;
    j["nonzero_before"] = r.nonzero_before;
    j["nonzero"] = r.nonzero_after;
    j["sparsity"] = r.params ? 1.0 - double(r.nonzero_after) / double(r.params) : 0.0;
    j["file_bytes_before"] = model_file_bytes(o->model, model);
    j["file_bytes_after"] = staged_model_bytes(files, o->out);
    if (recipe) j["recipe"] = o->recipe;
    j["warnings"] = r.warnings;
    j["layers"] = nlohmann::json::array();
    for (const auto& l : r.layers) {
      nlohmann::json jl = {{"name", l.name},
                           {"op", l.op},
                           {"weight", l.weight},
                           {"shape", l.shape},
                           {"params", l.params},
                           {"nonzero_before", l.nonzero_before},
                           {"nonzero", l.nonzero_after},
                           {"sparsity", l.sparsity()},
                           {"method", l.method},
                           {"amount", l.amount}};
      if (!l.skipped.empty()) jl["skipped"] = l.skipped;
      if (!l.rule.empty()) jl["rule"] = l.rule;
      j["layers"].push_back(jl);
    }
    // The report beside the model, written like the model: a temporary name, then a rename.
    std::string report_path = o->out + ".report.json";
    files.write(report_path, j.dump(2) + "\n");
    if (!o->report.empty())
      write_html_report(files, *o, model, [&](HtmlReport& rep) {
        for (const auto& w : r.warnings) rep.add_note(w);
      });
    files.commit();

    if (o->json) {
      std::cout << j.dump(2) << "\n";
      return 0;
    }
    std::vector<std::string> names;
    for (const auto& l : r.layers) names.push_back(l.name);
    size_t w = name_column_width(names, 5);
    std::cout << fmt::format("{:<{}}  {:<13} {:>12} {:>12} {:>12} {:>9}  {}\n", "layer", w, "op",
                             "params", "nonzero was", "nonzero", "sparsity", "method");
    for (const auto& l : r.layers) {
      std::string name = fit_name(l.name, w);
      std::string how = l.skipped.empty() ? l.method + " " + l.amount : "skipped: " + l.skipped;
      if (l.skipped.empty() && !l.rule.empty()) how += "  [" + l.rule + "]";
      std::cout << fmt::format("{:<{}}  {:<13} {:>12} {:>12} {:>12} {:>8.1f}%  {}\n", name, w, l.op,
                               l.params, l.nonzero_before, l.nonzero_after, 100 * l.sparsity(),
                               how);
    }
    std::cout
        << fmt::format(
               "\nprunable params {:>14}\nnonzero         {:>14}  (was {}, sparsity {:.1f}%)\n",
               r.params, r.nonzero_after, r.nonzero_before, 100.0 * j["sparsity"].get<double>())
        << fmt::format("file            {:>14} bytes (was {})\n",
                       j["file_bytes_after"].get<int64_t>(), j["file_bytes_before"].get<int64_t>())
        << "report          " << report_path << "\n";
    if (!o->report.empty()) std::cout << "report          " << o->report << "\n";
    return 0;
  };
}

}  // namespace lopper::cli
