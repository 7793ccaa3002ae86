// lopper train MODEL --data D -o OUT [optimiser, schedule, regularisers, progressive pruning]
// lopper finetune MODEL --data D -o OUT   (train with fine-tuning defaults: lr 0.001, 3 epochs)
// lopper eval MODEL --data D [--split test] [--json]
// Data parallel like torchrun: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT in the environment.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>

#include "commands.h"
#include "common.h"
#include "lopper/analysis.h"
#include "lopper/command.h"
#include "lopper/data.h"
#include "lopper/distributed.h"
#include "lopper/error.h"
#include "lopper/executor.h"
#include "lopper/files.h"
#include "lopper/onnx_io.h"
#include "lopper/progress.h"
#include "lopper/report.h"
#include "lopper/train.h"
#include "report.h"

namespace lopper::cli {

namespace {

namespace fs = std::filesystem;

void print_table_row(const std::string& what, const std::string& value) {
  std::cout << fmt::format("{:<18}{}\n", what, value);
}

}  // namespace

Action add_train_command(CLI::App& app, bool finetune) {
  struct Opts {
    std::string model, out, schedule = "none", prune_method, prune_amount, prune_scope = "global",
                            prune_pattern = "unstructured", every = "1", eval_split = "test",
                            prune_structured, report, optimizer = "sgd", lr_schedule = "constant",
                            precision = "fp32", teacher;
    std::optional<double> distill_alpha, distill_temperature, distill_state_weight;
    std::vector<std::string> distill_states;
    DataFlags data;
    TrainOptions t;
    bool no_eval = false, sparse = false;
    int threads = 0;
    double dist_timeout = 120;
  };
  auto o = std::make_shared<Opts>();
  if (finetune) {
    o->t.lr = 0.001;
    o->t.epochs = 3;
  }
  auto* cmd = model_command(
      app, finetune ? "finetune" : "train",
      finetune ? "train with fine-tuning defaults (lr 0.001, 3 epochs), pruned weights held at zero"
               : "train the model's weights on data (masks held, regularisers, progressive "
                 "pruning, data parallel)",
      o->model);
  cmd->add_option("-o,--out", o->out, "where to write the trained model")->required();
  o->data.add(cmd, "train");
  TrainOptions& t = o->t;
  cmd->add_option("--epochs", t.epochs, fmt::format("epochs (default {})", t.epochs));
  cmd->add_option("--optimizer", o->optimizer, "sgd (default) | adam | adamw");
  cmd->add_option("--lr", t.lr, fmt::format("learning rate (default {})", t.lr));
  cmd->add_option("--momentum", t.momentum, "sgd momentum (default 0.9)");
  cmd->add_flag("--nesterov", t.nesterov, "sgd: Nesterov momentum");
  cmd->add_option("--weight-decay", t.weight_decay, "L2 (sgd, adam) or decoupled (adamw); 0");
  cmd->add_option("--lr-schedule", o->lr_schedule, "constant (default) | step | cosine, per epoch");
  cmd->add_option("--lr-step-epochs", t.lr_step_epochs, "step: every N epochs (default epochs/3)");
  cmd->add_option("--lr-gamma", t.lr_gamma, "step: multiply the lr by this (default 0.1)");
  cmd->add_option("--warmup-epochs", t.warmup_epochs, "linear warmup, per step (default 0)");
  cmd->add_option("--grad-clip", t.grad_clip, "clip the gradient norm to this (default off)");
  cmd->add_option("--seed", t.seed, "shuffling and random pruning (default 0)");
  cmd->add_option("--device", t.device, "cpu (default) | cuda | cuda:N");
  cmd->add_option("--precision", o->precision,
                  "fp32 (default) | bf16 | fp16 (CUDA; dynamic loss scaling): autocast, fp32 "
                  "weights");
  cmd->add_option("--freeze", t.freeze, "do not train initializers whose name matches REGEX");
  cmd->add_option("--teacher", o->teacher,
                  "distil from this model (the dense one): its outputs on each batch are the "
                  "student's targets too");
  cmd->add_option("--distill-alpha", o->distill_alpha,
                  "the loss is (1-A) * task + A * T^2 * KL(teacher || student); 1: no labels "
                  "needed (default 0.5)");
  cmd->add_option("--distill-temperature", o->distill_temperature,
                  "T: both softmaxes over logits / T (default 1)");
  cmd->add_option("--distill-state", o->distill_states,
                  "STUDENT_TENSOR=TEACHER_TENSOR: add the MSE between these intermediate tensors "
                  "(same shape; repeat for more)");
  cmd->add_option("--distill-state-weight", o->distill_state_weight,
                  "the weight of the states' MSE (default 1)");
  cmd->add_option("--l1", t.l1, "joint training: lambda * sum |w| over prunable weights");
  cmd->add_option("--bn-l1", t.bn_l1, "joint training: lambda * sum |gamma| of BatchNorm scales");
  cmd->add_option("--group-lasso", t.group_lasso,
                  "joint training: lambda * sum of output-channel L2 norms");
  cmd->add_option("--schedule", o->schedule,
                  "progressive pruning: none (default) | iterative | agp");
  cmd->add_option("--prune-method", o->prune_method,
                  criterion_names(weight_criteria(), " | ") +
                      "; with --prune-structured: " + criterion_names(channel_criteria(), " | "));
  cmd->add_option("--prune-structured", o->prune_structured,
                  "channel | head: the schedule removes whole channels or heads; the model shrinks "
                  "while it trains");
  cmd->add_option("--prune-amount", o->prune_amount, "the final sparsity, a fraction in [0, 1)");
  cmd->add_option("--prune-scope", o->prune_scope, "global (default) | local");
  cmd->add_option("--prune-pattern", o->prune_pattern,
                  "unstructured (default) | N:M | row | column | block:RxC (e.g. block:8x1)");
  cmd->add_flag("--allow-tied", t.prune.allow_tied,
                "schedules: prune tied weights too (e.g. GPT-2's lm_head, the token embedding)");
  cmd->add_option("--rounds", t.rounds, "iterative: rounds (prune, then retrain)");
  cmd->add_option("--epochs-per-round", t.epochs_per_round, "iterative: epochs after each prune");
  cmd->add_option("--start-epoch", t.start_epoch, "agp: the ramp starts (0-based epoch)");
  cmd->add_option("--end-epoch", t.end_epoch, "agp: the ramp reaches the final amount");
  cmd->add_option("--every", o->every, "agp: prune every N epochs (2) or steps (100steps)");
  cmd->add_option("--checkpoint-dir", t.checkpoint_dir, "checkpoint after every epoch here");
  cmd->add_option("--resume", t.resume, "resume from a checkpoint folder");
  cmd->add_option("--eval-split", o->eval_split, "evaluate on this split after training (test)");
  cmd->add_flag("--no-eval", o->no_eval, "skip the evaluation after training");
  add_threads_option(cmd, o->threads);
  cmd->add_option("--dist-timeout", o->dist_timeout,
                  "data parallel: seconds a rank waits for its peers before failing (120)")
      ->check(CLI::PositiveNumber);
  cmd->add_flag("--sparse-initializers", o->sparse,
                "store pruned weights as sparse_initializer where that makes them smaller");
  cmd->add_option("--report", o->report,
                  "write an HTML report here: training curves, before/after (top-1 of both on "
                  "--eval-split), per layer");
  return [o]() {
    TrainOptions& t = o->t;
    // What it reads, then what it writes: checked before any work.
    OutputFiles files("train");
    files.input(o->model);
    if (!o->teacher.empty()) files.input(o->teacher);
    add_data_inputs(files, o->data.data);
    files.declare(o->out, "-o");
    files.declare(o->out + ".train.json", "the JSON report");
    if (!o->report.empty()) files.declare(o->report, "--report");
    if (!t.checkpoint_dir.empty()) {
      if (files.declared(t.checkpoint_dir))
        throw UsageError("[train] --checkpoint-dir " + t.checkpoint_dir +
                         ": another output names the same path");
      check_checkpoint_dir(t.checkpoint_dir);
    }
    auto given = [](const std::string& v) {
      return v.empty() ? std::nullopt : std::optional<std::string>(v);
    };
    TrainRequest req;
    req.options = t;
    req.options.loss = o->data.loss_options(t.seed);
    req.schedule = o->schedule;
    req.prune_criterion = given(o->prune_method);
    req.prune_amount = given(o->prune_amount);
    req.prune_structured = given(o->prune_structured);
    req.prune_scope = o->prune_scope;
    req.prune_pattern = o->prune_pattern;
    req.every = o->every;
    req.optimizer = o->optimizer;
    req.lr_schedule = o->lr_schedule;
    req.precision = o->precision;
    req.teacher = given(o->teacher);
    req.distill_alpha = o->distill_alpha;
    req.distill_temperature = o->distill_temperature;
    req.distill_state_weight = o->distill_state_weight;
    req.distill_states = o->distill_states;
    t = req.validate();  // a bad device: exit 1, as where it is checked elsewhere
    configure_threads(o->threads);
    DistOptions dopt = dist_options_from_env(t.device);
    dopt.timeout_s = o->dist_timeout;
    std::unique_ptr<Distributed> dist;
    if (dopt.world > 1) dist = std::make_unique<Distributed>(dopt);
    bool main_rank = !dist || dist->is_main();

    ir::Model model = load_input_model(files, o->model);
    if (!o->teacher.empty())
      t.distill.teacher = std::make_shared<const ir::Model>(load_input_model(files, o->teacher));
    const bool distilling = t.distill.teacher != nullptr;
    bool fixed = false;
    LoaderOptions lo = o->data.loader(model, fixed);
    lo.seed = t.seed;
    lo.drop_last = fixed;  // a fixed batch dim takes only full batches
    if (dist) {
      lo.rank = dist->rank();
      lo.world = dist->world();
    }
    DataLoader loader(open_dataset(o->data.data, o->data.split), lo);

    std::unique_ptr<Progress> bar;
    TrainCallbacks cb;
    bool tty = ::isatty(2) != 0;  // off a terminal, the epoch line below is the only progress
    // --report: each step's loss (recovered from the epoch's running mean), smoothed across
    // epochs by an exponential moving average; about 1500 points in all.
    std::vector<ReportStep> curve;
    double last_mean = 0, smoothed = -1;
    // Distillation: the loss's terms apart ("loss 0.41 (task 0.52, kl 0.30)").
    auto terms = [&](double loss, double task, double kl, double state) {
      if (!distilling) return fmt::format("loss {:.4f}", loss);
      std::string s = fmt::format("loss {:.4f} (", loss);
      if (!std::isnan(task)) s += fmt::format("task {:.4f}, ", task);
      s += fmt::format("kl {:.4f}", kl);
      if (!t.distill.states.empty()) s += fmt::format(", state {:.4g}", state);
      return s + ")";
    };
    auto accuracy = [&](double acc, bool agreement) {
      return fmt::format("{} {:.2f}%", agreement ? "agrees" : "acc", 100 * acc);
    };
    cb.step = [&](const StepStats& st) {
      const int64_t epoch = st.epoch, step = st.step, steps = st.steps;
      const double loss = st.loss, acc = st.accuracy, lr = st.lr;
      if (!o->report.empty()) {
        const double step_loss =
            double(step) * loss - double(step - 1) * (step > 1 ? last_mean : 0);
        last_mean = loss;
        smoothed = smoothed < 0 ? step_loss : 0.95 * smoothed + 0.05 * step_loss;
        const int64_t stride = std::max<int64_t>(1, steps * t.epochs / 1500);
        if (step % stride == 0 || step == steps)
          curve.push_back({double(epoch - 1) + double(step) / double(steps), smoothed, acc, lr});
      }
      if (!tty) return;
      if (!bar || step == 1)
        bar = std::make_unique<Progress>(fmt::format("epoch {}/{}", epoch, t.epochs), steps, 1);
      double sps = double(step * lo.batch_size * (dist ? dist->world() : 1)) /
                   std::max(1e-9, bar->elapsed_s());
      bar->update(step, fmt::format("{}  {}  {:.0f} samples/s  lr {:.3g}",
                                    terms(loss, st.task_loss, st.distill_kl, st.distill_state),
                                    accuracy(acc, std::isnan(st.task_loss)), sps, lr));
    };
    cb.epoch = [&](const EpochStats& s) {
      if (bar) bar->finish();
      bar.reset();
      std::cerr << fmt::format(
          "epoch {}/{}  {}  {}  {:.0f} samples/s  lr {:.3g}  sparsity {:.1f}%  {:.1f}s{}\n",
          s.epoch, t.epochs, terms(s.loss, s.task_loss, s.distill_kl, s.distill_state),
          accuracy(s.accuracy, s.teacher_agreement), s.samples_per_s, s.lr, 100 * s.sparsity,
          s.seconds,
          s.loss_scale > 0
              ? fmt::format("  loss scale {:g}, {} steps skipped", s.loss_scale, s.skipped_steps)
              : "");
    };
    cb.note = [&](const std::string& s) {
      if (bar) bar->finish();
      std::cerr << s << "\n";
    };
    cb.start = [&] {
      if (main_rank)
        std::cerr << fmt::format(
            "train {} on {} ({} samples/epoch{}, batch {}, {} epochs){}\n", o->model,
            loader.dataset().name(), loader.samples_per_epoch(),
            dist ? fmt::format(" on rank 0 of {}", dist->world()) : "", lo.batch_size, t.epochs,
            distilling ? fmt::format(", distilled from {} (alpha {:g}, temperature {:g})",
                                     o->teacher, t.distill.alpha, t.distill.temperature)
                       : "");
    };
    TrainResult r = train(model, loader, t, cb, dist.get());
    if (dist) dist->barrier();
    if (!main_rank) return 0;
    onnx::SaveOptions so;
    if (o->sparse) so.sparse = onnx::SaveOptions::Sparse::kAll;
    onnx::save_model(model, o->out, so, files);

    nlohmann::json j = to_json(r);
    j["model"] = o->model;
    j["out"] = o->out;
    j["data"] = o->data.data;
    if (distilling)
      j["distill"] = {{"teacher", o->teacher},
                      {"alpha", t.distill.alpha},
                      {"temperature", t.distill.temperature}};
    j["sparsity"] = prunable_sparsity(model);
    std::unique_ptr<DataLoader> test;
    std::optional<EvalResult> ev;
    if (!o->no_eval && !o->data.one_split()) {
      LoaderOptions eo = lo;
      eo.shuffle = false;
      eo.rank = 0;
      eo.world = 1;
      test = std::make_unique<DataLoader>(open_dataset(o->data.data, o->eval_split), eo);
      EvalOptions eval;
      eval.device = t.device;
      eval.precision = t.precision;
      eval.loss = t.loss;
      ev = evaluate(model, *test, eval);
      j["eval"] = to_json(*ev);
      j["eval"]["split"] = o->eval_split;
      std::cout << o->eval_split << " " << eval_summary(*ev) << "\n";
    }
    files.write(o->out + ".train.json", j.dump(2) + "\n");
    if (!o->report.empty()) {
      // The model before: read again, measured like the one after (top-1 on the same split).
      const ir::Model before = onnx::load_model(o->model);
      ReportMeasure how;
      how.device = t.device;
      how.data = test.get();
      how.data_name = fmt::format("{} ({})", o->data.data, o->eval_split);
      how.loss = t.loss;
      const ModelCost cost_before = analyze(before, resolve_input_shapes(before, {}, 1));
      const ModelCost cost_after = analyze(model, resolve_input_shapes(model, {}, 1));
      const ReportModel mb = measure_for_report("before", o->model, before, cost_before, how);
      how.data = nullptr;  // measured above
      ReportModel ma = measure_for_report("after", o->out, model, cost_after, how);
      ma.file_bytes = staged_model_bytes(files, o->out);  // written, not yet in place
      if (ev) set_accuracy(ma, ev->top1, ev->loss, ev->samples, how.data_name);
      HtmlReport rep("train", "Training " + o->model, command_line());
      rep.add_model(mb, cost_before);
      rep.add_model(ma, cost_after);
      rep.add_training(r, curve, o->eval_split, ev ? ev->top1 : -1);
      const std::string x = "sparsity of the prunable weights", y = "accuracy";
      const std::string intro =
          "Training accuracy per epoch against the sparsity the schedule had reached; the "
          "models before and after on " +
          how.data_name + ".";
      ReportSeries epochs{"training (per epoch)", {}, true, ""};
      for (const auto& e : r.epochs)
        epochs.points.push_back({e.sparsity, e.accuracy, fmt::format("epoch {}", e.epoch)});
      rep.add_tradeoff(x, y, intro, epochs);
      if (ev) {
        rep.add_tradeoff(
            x, y, intro,
            {"before", {{prunable_sparsity(before), mb.top1, ""}}, false, "reference"});
        rep.add_tradeoff(x, y, intro,
                         {"after", {{prunable_sparsity(model), ev->top1, ""}}, false, "result"});
      }
      files.write(o->report, rep.html());
    }
    files.commit();
    print_table_row("wrote", o->out);
    print_table_row("sparsity", fmt::format("{:.1f}%", 100 * j["sparsity"].get<double>()));
    if (!o->report.empty()) print_table_row("report", o->report);
    return 0;
  };
}

Action add_train(CLI::App& app) { return add_train_command(app, false); }
Action add_finetune(CLI::App& app) { return add_train_command(app, true); }

Action add_eval(CLI::App& app) {
  struct Opts {
    EvalRequest req;
    DataFlags data;
    bool json = false;
    int threads = 0;
  };
  auto o = std::make_shared<Opts>();
  auto* cmd = model_command(app, "eval",
                            "a model on a dataset: top-1, top-5, loss and per class for a "
                            "classifier; loss, perplexity and token accuracy for an LM",
                            o->req.model);
  o->data.add(cmd, "test");
  cmd->add_option("--device", o->req.device, "cpu (default) | cuda | cuda:N");
  cmd->add_option("--precision", o->req.precision, "fp32 (default) | bf16 | fp16 (CUDA only)");
  cmd->add_flag("--json", o->json,
                "print JSON (top1, top5, loss, samples, per_class; tokens, perplexity)");
  add_threads_option(cmd, o->threads);
  return [o]() {
    configure_threads(o->threads);
    EvalRequest& req = o->req;
    req.data = o->data;
    req.warn = warn;
    std::optional<Progress> bar;
    req.progress = [&](int64_t b, int64_t of) {
      if (!bar) bar.emplace("eval", of, 1);
      bar->update(b);
    };
    EvalResult r = req.run();
    if (bar) bar->finish();
    if (o->json) {
      nlohmann::json j = to_json(r);
      j["model"] = req.model;
      j["data"] = o->data.data;
      j["split"] = o->data.split;
      std::cout << j.dump(2) << "\n";
      return 0;
    }
    std::cout << fmt::format("{} on {} ({}): {} samples\n", req.model, o->data.data, o->data.split,
                             r.samples);
    if (r.tokens > 0) {
      std::cout << fmt::format(
          "loss        {:.4f} ({}, per token)\nperplexity  {:.2f}\ntop-1       {:.2f}% of {} "
          "tokens\ntop-5       {:.2f}%\n",
          r.loss, r.loss_kind, r.perplexity, 100 * r.top1, r.tokens, 100 * r.top5);
      return 0;
    }
    std::cout << fmt::format("top-1   {:.2f}%\ntop-5   {:.2f}%\nloss    {:.4f} ({})\n",
                             100 * r.top1, 100 * r.top5, r.loss, r.loss_kind)
              << "class   samples  accuracy\n";
    for (size_t c = 0; c < r.per_class.size(); ++c)
      std::cout << fmt::format("{:<7} {:>7}  {}\n", c, r.per_class_count[c],
                               std::isnan(r.per_class[c])
                                   ? std::string("-")
                                   : fmt::format("{:.2f}%", 100 * r.per_class[c]));
    return 0;
  };
}

}  // namespace lopper::cli
