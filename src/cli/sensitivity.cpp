// lopper sensitivity MODEL --data D [--structured channel] [--method M] [--amounts 0.1,...,0.95]
//                    [--calib-batches N] [--block-size 128] [--dampening 0.01] [--eval-batches 16]
//                    [--split test] [--device cpu|cuda] [--exclude REGEX]
//                    [--round-to N] [--seed S] [--allow-tied] [-o FILE.json] [--json]
//                    [--report FILE.html]
// Each prunable layer (or channel group) pruned alone to each amount; loss and top-1 per point.
#include <fmt/format.h>

#include <iostream>
#include <sstream>

#include "commands.h"
#include "common.h"
#include "lopper/analysis.h"
#include "lopper/command.h"
#include "lopper/data.h"
#include "lopper/error.h"
#include "lopper/files.h"
#include "lopper/onnx_io.h"
#include "lopper/progress.h"
#include "lopper/sensitivity.h"
#include "report.h"

namespace lopper::cli {
namespace {

std::vector<double> parse_amounts(const std::string& s) {
  std::vector<double> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const std::optional<double> v = whole_double(item);
    LOPPER_CHECK(v, "[sensitivity] --amounts: '", item,
                 "' is not a number (expected e.g. 0.1,0.5,0.9)");
    out.push_back(*v);
  }
  return out;
}

}  // namespace

Action add_sensitivity(CLI::App& app) {
  struct Opts {
    SensitivityRequest req;
    std::string model, out, report, amounts = "0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9,0.95";
    std::vector<std::string> shapes;
    DataFlags data;
    bool json = false;
    int threads = 0;
  };
  auto o = std::make_shared<Opts>();
  auto* cmd =
      model_command(app, "sensitivity",
                    "how much each layer (or channel group) pruned alone costs: loss and top-1 "
                    "at each amount",
                    o->model);
  o->data.add(cmd, "test");
  cmd->add_option("--structured", o->req.structured,
                  "channel: prune each channel group (the model shrinks) instead of each "
                  "weight; block: remove each residual block (decoder layer); channel,block: "
                  "both");
  cmd->add_option("--method", o->req.criterion,
                  "weights: l1 (default) | random | wanda | sparsegpt (by the layers' inputs on "
                  "the data); channels: l1 (default) | l2 | bn | fpgm | random");
  cmd->add_option(
      "--calib-batches", o->req.batches,
      "wanda, sparsegpt: the data's first batches the layers' inputs are collected on (default: "
      "128 samples; the evaluated batches are among them)");
  cmd->add_option("--block-size", o->req.block_size,
                  "sparsegpt: columns pruned together (default 128)");
  cmd->add_option("--dampening", o->req.dampening,
                  "sparsegpt: added to the Hessian's diagonal, a share of its mean (default 0.01)");
  cmd->add_option("--amounts", o->amounts,
                  "comma-separated shares removed, each in [0, 1) (default 0.1,...,0.9,0.95)");
  cmd->add_option("--eval-batches", o->req.eval_batches,
                  "batches evaluated per point, the same ones each time (default 16)");
  cmd->add_option("--device", o->req.device, "cpu (default) | cuda | cuda:N");
  cmd->add_option("--exclude", o->req.exclude,
                  "leave out layers (or groups with a layer) whose node, weight or parameter name "
                  "matches REGEX");
  cmd->add_option("--round-to", o->req.round_to, "channels: keep counts a multiple of N");
  cmd->add_flag("--allow-tied", o->req.allow_tied,
                "weights: analyse tied weights too (e.g. GPT-2's lm_head, the token embedding)");
  cmd->add_option("--seed", o->req.seed, "random: the seed (default 0)");
  cmd->add_option("--shape", o->shapes, "NAME=1x3x224x224 for MAC counts (dynamic dims: 1)");
  cmd->add_option("-o,--out", o->out,
                  "write the result as JSON here (pruning to a target reads it)");
  cmd->add_flag("--json", o->json, "print the result as JSON instead of a table");
  cmd->add_option("--report", o->report,
                  "write an HTML report here: the curves, the accuracy-sparsity trade-off, the "
                  "model's layers");
  add_threads_option(cmd, o->threads);
  return [o]() {
    configure_threads(o->threads);
    SensitivityRequest& req = o->req;
    req.amounts = parse_flag([&] { return parse_amounts(o->amounts); });
    req.input_shapes = parse_shape_overrides(o->shapes);
    req.data = o->data.given();
    SensitivityOptions so = parse_flag([&] { return req.validate(); }).options;
    // What it reads, then what it writes: checked before any work.
    OutputFiles files("sensitivity");
    files.input(o->model);
    add_data_inputs(files, o->data.data);
    if (!o->out.empty()) files.declare(o->out, "-o");
    if (!o->report.empty()) files.declare(o->report, "--report");
    check_device_flag(req.device);  // fails before the data is read
    so.loss = o->data.loss_options(so.seed);

    ir::Model model = load_input_model(files, o->model);
    bool fixed = false;
    LoaderOptions lo = o->data.loader(model, fixed);
    lo.shuffle = false;
    DataLoader loader(open_dataset(o->data.data, o->data.split), lo);
    std::unique_ptr<Progress> bar;
    so.progress = [&](int64_t done, int64_t total, const std::string& what) {
      if (!bar) bar = std::make_unique<Progress>("sensitivity", total, 10);
      bar->update(done, what);
    };
    SensitivityResult r = sensitivity(model, loader, so);
    if (bar) bar->finish();
    const std::string js = sensitivity_json(r);
    if (!o->out.empty()) files.write(o->out, js + "\n");
    if (!o->report.empty()) {
      HtmlReport rep("sensitivity", "Sensitivity of " + o->model, command_line());
      ReportMeasure how;
      how.device = req.device;
      how.shapes = so.input_shapes;
      const ModelCost cost = analyze(model, resolve_input_shapes(model, so.input_shapes, 1));
      ReportModel m = measure_for_report("model", o->model, model, cost, how);
      set_accuracy(m, r.top1, r.loss, r.samples,
                   fmt::format("{} ({}), the sweep's own batches", o->data.data, o->data.split));
      rep.add_model(m, cost);
      rep.add_sensitivity(r);
      files.write(o->report, rep.html());
    }
    files.commit();
    if (o->json) {
      std::cout << js << "\n";
    } else {
      std::cout << to_table(r);
      if (!o->out.empty()) std::cout << "wrote " << o->out << "\n";
      if (!o->report.empty()) std::cout << "report " << o->report << "\n";
    }
    return 0;
  };
}

}  // namespace lopper::cli
