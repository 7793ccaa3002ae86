// lopper prune MODEL -o OUT --method abs|l1|random|grad|taylor [--threshold T] [--amount A]
//   [--seed S] [--scope local|global] [--pattern unstructured|N:M|row|column|block:RxC]
//   [--norm 1|2] [--exclude REGEX] [--skip-first-last] [--allow-tied] [--sparse-initializers]
//   [--json]
//   grad/taylor: --data SPEC [--split train|test] [--calib-batches N] [--batch-size B]
//   [--device cpu|cuda] [--normalize MEAN,STD] [--resize HxW]
// lopper prune MODEL -o OUT --recipe FILE.yaml [--data SPEC ...] [--sparse-initializers] [--json]
// lopper prune MODEL -o OUT --structured channel|head [--method l1|l2|bn|taylor|fpgm|random]
//   --amount A [--scope local|global] [--max-layer-amount F] [--round-to N] [--exclude REGEX]
//   [--recipe FILE.yaml] [--shape NAME=DIMS] [--seed S] [--json]   (taylor: --data SPEC ...)
// lopper prune MODEL -o OUT --structured block [--method influence|loss|random] --amount A
//   [--exclude REGEX] [--seed S] [--json]   (influence, loss: --data SPEC ...)
// lopper prune MODEL -o OUT --target-macs F | --target-params F | --target-latency-ms X
//   [--structured channel] [--sensitivity FILE | --data SPEC [--eval-batches N]] [--device D]
//   [--method wanda|sparsegpt --data SPEC [--calib-batches N] [--block-size B] [--dampening D]]
// Any of them: [--report FILE.html] (with --data: top-1 before and after on --eval-batches batches)
#include "lopper/prune.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "common.h"
#include "lopper/analysis.h"
#include "lopper/command.h"
#include "lopper/data.h"
#include "lopper/depth.h"
#include "lopper/error.h"
#include "lopper/executor.h"
#include "lopper/files.h"
#include "lopper/onnx_io.h"
#include "lopper/progress.h"
#include "lopper/report.h"
#include "lopper/sensitivity.h"
#include "lopper/structured.h"
#include "lopper/target.h"
#include "lopper/train.h"
#include "prune.h"
#include "report.h"

namespace lopper::cli {

std::pair<LoaderOptions, CalibrationOptions> input_calibration(const Opts& o,
                                                               const ir::Model& model) {
  LoaderOptions lo = o.data.loader(model);
  lo.seed = o.seed;
  lo.drop_last = true;  // every calibration batch the same size
  CalibrationOptions co;
  constexpr int64_t samples = CalibrationOptions::kLayerInputSamples;
  co.batches =
      o.calib_batches_given ? o.calib_batches : (samples + lo.batch_size - 1) / lo.batch_size;
  co.device = o.device;
  co.loss = o.data.loss_options(o.seed);
  co.sequential = !o.one_pass;
  return {lo, co};
}

std::unique_ptr<Calibration> calibration(const Opts& o, const ir::Model& model, bool layer_inputs) {
  auto c = std::make_unique<Calibration>();
  Calibration* self = c.get();  // the callbacks' (a heap object: its address stays)
  if (layer_inputs) {
    auto [lo, co] = input_calibration(o, model);
    c->loader = std::make_unique<DataLoader>(o.data.dataset(), lo);
    c->co = std::move(co);
    c->co.on_pass = [self](int64_t pass, int64_t of, const std::string& what) {
      if (!self->bar) self->bar = std::make_unique<Progress>("calibrate", of);
      self->bar->update(pass, what);  // as the pass starts: the block being calibrated
    };
    return c;
  }
  LoaderOptions lo = o.data.loader(model);
  lo.seed = o.seed;
  lo.drop_last = true;  // every calibration batch the same size
  c->loader = std::make_unique<DataLoader>(o.data.dataset(), lo);
  c->co.batches = o.calib_batches;
  c->co.device = o.device;
  c->co.loss = o.data.loss_options(o.seed);
  c->bar_total = std::min<int64_t>(c->co.batches, c->loader->batches_per_epoch());
  c->bar = std::make_unique<Progress>("calibrate", c->bar_total);
  c->co.progress = [self](int64_t b, int64_t of, double loss) {
    if (of != self->bar_total) {  // depth's loss criterion: a pass over the batches per block
      self->bar = std::make_unique<Progress>("calibrate", of);
      self->bar_total = of;
    }
    self->bar->update(b, std::isnan(loss) ? std::string() : fmt::format("loss {:.4f}", loss));
  };
  c->finish_bar = true;
  return c;
}

void Calibration::done() {
  if (finish_bar && bar) bar->finish();
}

// --report: the models before (read again from --model) and after, measured on --device, top-1
// and loss on the first --eval-batches batches of --data when it is given (`known`: already
// evaluated there, before and after); `extra` adds what the kind of pruning knows (target,
// sensitivity, notes).
void write_html_report(OutputFiles& files, const Opts& o, const ir::Model& after,
                       const std::function<void(HtmlReport&)>& extra,
                       const std::pair<EvalResult, EvalResult>* known) {
  const ir::Model before = onnx::load_model(o.model);
  ReportMeasure how;
  how.device = o.device;
  how.shapes = parse_shape_overrides(o.shapes);
  std::unique_ptr<DataLoader> loader;
  const std::string data_name = fmt::format("{} ({})", o.data.data, o.data.split);
  if (o.data.given() && !known) {
    LoaderOptions lo = o.data.loader(before);
    lo.shuffle = false;
    loader = std::make_unique<DataLoader>(o.data.dataset(), lo);
    how.data = loader.get();
    how.eval_batches = o.eval_batches;
    how.data_name = data_name;
    how.loss = o.data.loss_options(o.seed);
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
    rep.add_tradeoff(
        x, y, intro,
        {"after", {{1.0 - double(ca.nonzero) / double(cb.nonzero), ma.top1, ""}}, false, "result"});
  }
  if (extra) extra(rep);
  files.write(o.report, rep.html());
}

// The report's model costs before and after (a model that shrinks, or a target).
void put_costs(nlohmann::json& j, const Opts& o, const OutputFiles& files, const ir::Model& input,
               const ModelCost& before, const ModelCost& after) {
  lopper::put_costs(j, before, after);
  j["file_bytes_before"] = model_file_bytes(o.model, input);
  j["file_bytes_after"] = staged_model_bytes(files, o.out);
}

// The files of a prune: what it reads, then what it writes (checked before any work).
void declare_files(OutputFiles& files, const Opts& o) {
  files.input(o.model);
  files.input(o.recipe);
  files.input(o.sensitivity);
  add_data_inputs(files, o.data.data);
  files.declare(o.out, "-o");
  files.declare(o.out + ".report.json", "the JSON report");
  if (!o.report.empty()) files.declare(o.report, "--report");
}

// The request's job; its usage errors name the flags.
template <typename Request>
auto validated(const Request& req) {
  try {
    return req.validate();
  } catch (const UsageError& e) {
    throw UsageError(e.render(flag_of));
  }
}

Action add_prune(CLI::App& app) {
  auto o = std::make_shared<Opts>();
  auto* cmd =
      model_command(app, "prune",
                    "zero weights (magnitude, random, gradients, N:M, rows/columns, blocks) or "
                    "remove whole channels and heads (--structured)",
                    o->model);
  cmd->add_option("-o,--out", o->out, "where to write the pruned model")->required();
  auto* method = cmd->add_option("--method", o->method, method_help());
  auto* th = cmd->add_option("--threshold", o->threshold, "abs: remove every |w| < T");
  auto* amount =
      cmd->add_option("--amount", o->amount,
                      "a fraction in [0, 1] of the weights left, or an integer count (every "
                      "method that ranks; abs takes --threshold)");
  auto* seed =
      cmd->add_option("--seed", o->seed,
                      "random: the seed; " + data_methods() + ": the data's shuffling (default 0)");
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
  auto* exclude =
      cmd->add_option("--exclude", o->exclude,
                      "leave layers whose node, weight or PyTorch parameter name matches REGEX");
  auto* sfl =
      cmd->add_flag("--skip-first-last", o->skip_first_last, "leave the first and last layers");
  auto* allow_tied = cmd->add_flag(
      "--allow-tied", o->allow_tied,
      "prune tied weights too (a weight another node shares, e.g. GPT-2's lm_head and its token "
      "embedding), changing every reader; by default they are left alone");
  cmd->add_flag("--sparse-initializers", o->sparse,
                "store pruned weights as sparse_initializer where that makes them smaller");
  cmd->add_flag("--json", o->json, "print the report as JSON instead of a table");
  auto* structured =
      cmd->add_option("--structured", o->structured,
                      "channel | head | block: remove whole channels (filters, neurons), "
                      "attention heads or residual blocks (decoder layers); the model shrinks. "
                      "Methods: " +
                          criterion_names(channel_criteria()) + " (default l1); blocks: " +
                          criterion_names(depth_criteria()) + " (default influence)")
          ->check(CLI::Validator(
              [](std::string& v) -> std::string {
                // NOTE: CLI11 hands the next word over whatever it is: `--structured --amount
                // 0.5` would read the unit "--amount" and leave "0.5" unexpected. Any other
                // word is the request's to judge (it names the units).
                if (!v.empty() && v[0] != '-') return "";
                return "needs its unit, channel, head or block, right after it (got '" + v + "')";
              },
              "channel|head|block", "unit"));
  auto* mla = cmd->add_option("--max-layer-amount", o->max_layer_amount,
                              "structured, global: no group loses more than this share (0.9)");
  auto* round_to =
      cmd->add_option("--round-to", o->round_to, "structured: keep channel counts a multiple of N");
  auto* shape = cmd->add_option("--shape", o->shapes,
                                "structured: NAME=1x3x224x224 for the analysis run (dynamic dims "
                                "default to 1)");
  cmd->add_option(
      "--recipe", o->recipe,
      "per-layer rules from YAML, first match wins (examples/recipe.yaml); local scope");
  std::vector<CLI::Option*> data_opts =
      o->data.add(cmd, "train",
                  data_methods() + ": calibration data; targets: sensitivity data; --report: top-1",
                  /*default_batch_size=*/32);
  auto* data = data_opts.front();
  data_opts.erase(data_opts.begin());
  auto* calib_batches = cmd->add_option(
      "--calib-batches", o->calib_batches,
      data_methods() + ": batches (default 32; wanda, sparsegpt and OWL: 128 samples)");
  data_opts.push_back(calib_batches);
  data_opts.push_back(cmd->add_option("--device", o->device,
                                      data_methods() + ", targets: cpu (default) | cuda | cuda:N"));
  auto* block_size = cmd->add_option("--block-size", o->block_size,
                                     "sparsegpt: columns pruned together (default 128)");
  auto* dampening = cmd->add_option(
      "--dampening", o->dampening,
      "sparsegpt: added to the Hessian's diagonal, a fraction of its mean (default 0.01)");
  auto* owl_lambda = cmd->add_option(
      "--owl-lambda", o->owl_lambda,
      "OWL layer budgets: transformer blocks with more outlier weights keep more, amounts in "
      "amount +- lambda (e.g. 0.08; needs --data)");
  auto* owl_m = cmd->add_option("--owl-m", o->owl_m,
                                "OWL: an outlier scores above M x its block's mean (default 5)");
  auto* one_pass = cmd->add_flag(
      "--one-pass", o->one_pass,
      "wanda, sparsegpt: calibrate every layer on the unpruned model in one pass (default: block "
      "by block, each on the blocks before it already pruned)");
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
  return [o, method, th, seed, exclude, scope, data, data_opts, structured, mla, round_to, shape,
          pattern, norm, sfl, targets, sens, eval_batches, amount, recipe_opt, report, allow_tied,
          calib_batches, block_size, dampening, owl_lambda, owl_m, one_pass]() {
    configure_threads(o->threads);
    o->calib_batches_given = calib_batches->count() > 0;
    if (targets[0]->count() + targets[1]->count() + targets[2]->count() > 0) {
      TargetRequest req;
      if (targets[0]->count() > 0) req.target_macs = o->target_macs;
      if (targets[1]->count() > 0) req.target_params = o->target_params;
      if (targets[2]->count() > 0) req.target_latency_ms = o->target_latency_ms;
      if (structured->count() > 0) req.structured = o->structured;
      if (method->count() > 0) req.criterion = o->method;
      if (round_to->count() > 0) req.round_to = o->round_to;
      if (exclude->count() > 0) req.exclude = o->exclude;
      req.allow_tied = o->allow_tied;
      if (block_size->count() > 0) req.block_size = o->block_size;
      if (dampening->count() > 0) req.dampening = o->dampening;
      if (calib_batches->count() > 0) req.batches = o->calib_batches;
      if (eval_batches->count() > 0) req.eval_batches = o->eval_batches;
      req.device = o->device;
      req.input_shapes = parse_shape_overrides(o->shapes);
      for (const auto* opt :
           {amount, th, pattern, norm, sfl, scope, mla, recipe_opt, owl_lambda, owl_m, one_pass})
        if (opt->count() > 0) req.per_layer_options.push_back(library_name(*opt));
      req.data = o->data.given();
      req.data_hint = " SPEC (e.g. --data tokens:ids.npy)";
      return run_target(*o, validated(req));
    }
    // The options of a target, and what lopper's data options are called, as given.
    std::vector<std::string> target_given;
    for (const auto* opt : {sens, eval_batches})
      if (opt->count() > 0) target_given.push_back(library_name(*opt));
    std::vector<std::string> data_given;
    if (data->count() > 0) data_given.push_back("data");
    for (const auto* opt : data_opts)
      if (opt->count() > 0) data_given.push_back(library_name(*opt));
    if (structured->count() > 0) {
      StructuredRequest req;
      req.unit = o->structured;
      if (method->count() > 0) req.criterion = o->method;
      if (amount->count() > 0)
        req.amount = parse_flag([&] { return PruneAmount::parse(o->amount); });
      if (scope->count() > 0) req.scope = o->scope;
      if (mla->count() > 0) req.max_layer_amount = o->max_layer_amount;
      if (round_to->count() > 0) req.round_to = o->round_to;
      if (exclude->count() > 0) req.exclude = o->exclude;
      if (seed->count() > 0) req.seed = o->seed;
      if (!o->recipe.empty()) req.recipe = [&] { return load_prune_recipe(o->recipe); };
      req.input_shapes = parse_shape_overrides(o->shapes);
      for (const auto* opt :
           {th, pattern, norm, sfl, allow_tied, block_size, dampening, owl_lambda, owl_m, one_pass})
        if (opt->count() > 0) req.unstructured_options.push_back(library_name(*opt));
      req.data = o->data.given();
      req.data_options = data_given;
      req.offers_report = true;
      req.report = report->count() > 0;
      req.data_hint = " SPEC (e.g. --data fashion-mnist)";
      req.target_options = target_given;
      return run_structured(*o, validated(req));
    }
    PruneRequest req;
    req.target_options = target_given;
    for (const auto* opt : {mla, round_to, shape})
      if (opt->count() > 0) req.structured_options.push_back(library_name(*opt));
    if (method->count() > 0) req.criterion = o->method;
    if (amount->count() > 0) req.amount = parse_flag([&] { return PruneAmount::parse(o->amount); });
    if (th->count() > 0) req.threshold = o->threshold;
    if (scope->count() > 0) req.scope = o->scope;
    if (pattern->count() > 0) req.pattern = o->pattern;
    if (norm->count() > 0) req.norm = o->norm;
    if (seed->count() > 0) req.seed = o->seed;
    if (exclude->count() > 0) req.exclude = o->exclude;
    req.skip_first_last = o->skip_first_last;
    req.allow_tied = o->allow_tied;
    if (!o->recipe.empty()) req.recipe = [&] { return load_prune_recipe(o->recipe); };
    if (block_size->count() > 0) req.block_size = o->block_size;
    if (dampening->count() > 0) req.dampening = o->dampening;
    if (owl_lambda->count() > 0) req.owl_lambda = o->owl_lambda;
    if (owl_m->count() > 0) req.owl_m = o->owl_m;
    req.one_pass = o->one_pass;
    if (calib_batches->count() > 0) req.batches = o->calib_batches;
    req.data = o->data.given();
    req.data_options = data_given;
    req.offers_report = true;
    req.data_hint = " SPEC (e.g. --data fashion-mnist)";
    req.report = report->count() > 0;
    // NOTE: not parse_flag: a recipe that does not read is an Error of its file (exit 1), not of
    // the flags.
    const PruneJob job = validated(req);

    OutputFiles files("prune");
    declare_files(files, *o);
    // Calibrated pruning streams a model with external data: the data file is copied to the
    // output's and mapped, each block's weights are read as it is calibrated, pruned in the copy
    // and dropped from memory (peak memory: a block, not the model).
    std::shared_ptr<onnx::MappedData> mapped;
    const std::string data_out = o->out + ".data";
    ir::Model model;
    if (job.reads_inputs) {
      files.input(o->model);
      onnx::LoadOptions lo;
      lo.external_copy = [&] {
        if (!files.declared(data_out)) files.declare(data_out, "external data of " + o->out);
        return files.temp(data_out);
      };
      model = onnx::load_model(o->model, lo, &mapped);
      for (const auto& f : model.external_files) files.input(f);
    } else {
      model = load_input_model(files, o->model);
    }
    PruneReport r;
    if (job.needs_data) {
      const auto cal = calibration(*o, model, job.reads_inputs);
      if (mapped) cal->co.release_memory = [m = mapped.get()] { m->release(); };
      r = job.run(model, cal->loader.get(), cal->co);
      cal->done();
    } else {
      r = job.run(model, nullptr, {});
    }
    onnx::SaveOptions so;
    if (o->sparse) so.sparse = onnx::SaveOptions::Sparse::kAll;  // where it makes a tensor smaller
    if (mapped) {
      so.mapped = mapped;
      so.mapped_location = std::filesystem::path(data_out).filename().string();
    }
    onnx::save_model(model, o->out, so, files);
    for (const auto& w : r.warnings) std::cerr << "lopper: [prune] warning: " << w << "\n";

    nlohmann::json j = to_json(r);
    j["model"] = o->model;
    j["out"] = o->out;
    j["file_bytes_before"] = model_file_bytes(o->model, model);
    j["file_bytes_after"] = staged_model_bytes(files, o->out);
    if (job.recipe) j["recipe"] = o->recipe;
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
    std::cout << to_table(r)
              << fmt::format("file            {:>14} bytes (was {})\n",
                             j["file_bytes_after"].get<int64_t>(),
                             j["file_bytes_before"].get<int64_t>())
              << "report          " << report_path << "\n";
    if (!o->report.empty()) std::cout << "report          " << o->report << "\n";
    return 0;
  };
}

}  // namespace lopper::cli
