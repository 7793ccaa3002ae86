// A report people look at: one self-contained HTML file (the data and Chart.js inlined, nothing
// fetched) with what a prune, a sensitivity sweep or a training run found — before/after summary,
// per-layer bars, sensitivity curves, the accuracy–sparsity trade-off, training curves.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "lopper/loss.h"

namespace lopper {

namespace ir {
struct Model;  // lopper/graph.h
}  // namespace ir
class DataLoader;          // lopper/data.h
struct LatencyStats;       // lopper/latency.h
struct ModelCost;          // lopper/analysis.h
struct SensitivityResult;  // lopper/sensitivity.h
struct TrainResult;        // lopper/train.h
struct EvalResult;         // lopper/train.h
struct PruneReport;        // lopper/prune.h
struct StructuredReport;   // lopper/structured.h
struct TargetReport;       // lopper/target.h

// --- JSON: every report as the CLI writes it beside its model (and prints with --json). --------
// A command adds what only it knows (the files, their sizes) to these objects.

/// "params", "nonzero_before", "nonzero", "sparsity", "warnings", and per layer "layers": name,
/// op, weight, param, shape, params, nonzero_before, nonzero, sparsity, method, amount (skipped,
/// rule, shared: the weight's other readers, each node, op, use and module).
nlohmann::json to_json(const PruneReport& r);
/// "channels_before", "channels", "barriers", "warnings", and per group "groups": id, kind,
/// layers, layer_params, size_before, size_after, score, removed (blocked, blocks, rule).
nlohmann::json to_json(const StructuredReport& r);
/// "target": kind, goal, before, predicted, measured, estimator, rounds (and the latency spread);
/// per unit "layers": name, layers, amount (weight, param, group, est_loss_increase with
/// sensitivity).
nlohmann::json to_json(const TargetReport& r, bool with_sensitivity);
/// Per epoch "epochs" (epoch, loss, accuracy, samples_per_s, lr, sparsity, seconds,
/// skipped_steps) and the pruning events "notes".
nlohmann::json to_json(const TrainResult& r);
/// top1, top5, loss, loss_kind, samples (per class: see EvalResult; language models: tokens,
/// perplexity).
nlohmann::json to_json(const EvalResult& r);
/// Puts the costs of a model before and after into a report: params_before, params, macs_before,
/// macs.
void put_costs(nlohmann::json& j, const ModelCost& before, const ModelCost& after);

// --- Text: the tables the CLI prints. ----------------------------------------------------------

/// Per layer (named by its PyTorch parameter where the model tells it, else by its node): op,
/// params, nonzero before and after, sparsity, how it was pruned (and what shares its weight);
/// then the totals.
std::string to_table(const PruneReport& r);
/// Per group: kind, size before and after, score, layers (parameter names where known; and why a
/// group was kept); then the channels left.
std::string to_table(const StructuredReport& r);
/// "params N (was M, -x%)" and the same for MACs, one line each: what structured pruning saved.
std::string cost_change(const ModelCost& before, const ModelCost& after);
/// Per layer (or group, `structured`): the amount chosen (and, with sensitivity data, the loss
/// increase it is estimated to cost).
std::string to_table(const TargetReport& r, bool structured, bool with_sensitivity);
/// What pruning to a target came to, under its table: the target (`value` as asked) and the
/// estimator, predicted and measured cost; with sensitivity data `sens`, the loss (and `measured`:
/// the pruned model's loss and top-1 on the sweep's batches); the parameters and MACs `before`
/// and `after`.
std::string target_summary(const TargetReport& r, double value, const SensitivityResult* sens,
                           const EvalResult* measured, const ModelCost& before,
                           const ModelCost& after);
/// The unpruned top-1, loss and samples, then per layer (or channel group) its parameters and
/// the top-1 at each amount.
std::string to_table(const SensitivityResult& r);
/// One line: "top-1 91.20%  top-5 99.80%  loss 0.2512  (10000 samples)", or for a language model
/// "loss 4.1211  perplexity 61.64  top-1 12.50% of 3840 tokens  (256 samples)".
std::string eval_summary(const EvalResult& r);

/// One model's figures: a column of the report's summary. Negative: not measured.
struct ReportModel {
  std::string label;  // "before", "after", "model"
  std::string path;
  int64_t params = 0, nonzero = 0, macs = 0, file_bytes = 0;
  int64_t effective_macs = 0;  // MACs on nonzero weights (unstructured sparsity counted)
  double latency_ms = -1;      // the median
  double latency_p10_ms = -1, latency_p90_ms = -1;  // -1: not measured
  int latency_runs = 0;
  std::string latency_warning;  // LatencyStats::warning(): the runs' spread was wide
  double top1 = -1, loss = -1;
  std::string measured;  // how latency and accuracy were measured ("cpu, batch 1; 512 samples ...")
};

/// A point of the per-step training curve (x: fractional epoch): the loss smoothed over steps,
/// the epoch's running accuracy, the learning rate.
struct ReportStep {
  double epoch = 0, loss = 0, accuracy = 0, lr = 0;
};

/// A series of the accuracy–sparsity chart; x and y are shares in [0, 1].
struct ReportSeries {
  struct Point {
    double x = 0, y = 0;
    std::string label;
  };
  std::string label;
  std::vector<Point> points;
  bool line = false;  // joined by a line (a curve) or loose points
  std::string role;   // "reference" (before, unpruned), "result" (after), "": one of a family
};

/// How a report's models are measured (measure_report_model).
struct ReportMeasure {
  std::string device = "cpu";
  std::map<std::string, std::vector<int64_t>> shapes;  // inputs for latency (dynamic dims: 1)
  DataLoader* data = nullptr;                          // top-1 and loss on it, when given ...
  int64_t eval_batches = 0;                            // ... on its first batches (0: all)
  std::string data_name;                               // "fashion-mnist (test)"
  LossOptions loss;                                    // what the loss on `data` is
};

/// `m`'s summary column (label, costs from `cost`, latency, top-1 and loss on `how.data`); the
/// caller sets what only it knows (path, file_bytes). A wide latency spread is in
/// latency_warning.
ReportModel measure_report_model(const std::string& label, const ir::Model& m,
                                 const ModelCost& cost, const ReportMeasure& how);
/// A latency measurement into `m`: its median, p10, p90, runs and the wide-spread warning.
void set_latency(ReportModel& m, const LatencyStats& s);
/// Top-1 and loss measured on `samples` samples of `data_name`, into `m` (and its `measured` note).
void set_accuracy(ReportModel& m, double top1, double loss, int64_t samples,
                  const std::string& data_name);

class HtmlReport {
 public:
  /// `kind`: prune, sensitivity, train or compare; `command`: the command line, shown in the
  /// header.
  HtmlReport(std::string kind, std::string title, std::string command);

  /// A summary column; `cost` (the model's analysis) adds its per-layer parameters, nonzeros and
  /// MACs, matched to earlier models' layers by node name (a layer a model lacks counts 0).
  void add_model(const ReportModel& m, const ModelCost& cost);
  /// Sensitivity curves; with `tradeoff`, also each point's share of the model's nonzero
  /// parameters removed against its top-1.
  void add_sensitivity(const SensitivityResult& r, bool tradeoff = true);
  /// The amount chosen per layer (or group) by pruning to a target, and the target's figures
  /// (the "target" object of prune's report JSON).
  void add_target(const nlohmann::json& target,
                  const std::vector<std::pair<std::string, double>>& chosen);
  /// Training curves: per epoch, and the running means of `steps`.
  void add_training(const TrainResult& r, const std::vector<ReportStep>& steps,
                    const std::string& eval_split = "", double eval_top1 = -1);
  /// The accuracy–sparsity chart: axis names and `intro` set once, series appended in order.
  void add_tradeoff(const std::string& x, const std::string& y, const std::string& intro,
                    const ReportSeries& series);
  void add_note(const std::string& note);

  /// The data the page draws (format "lopper.report/1").
  const nlohmann::json& data() const { return data_; }
  /// The page: the template with Chart.js and the data inlined.
  std::string html() const;
  /// Writes html() to `path` (a temporary file, then a rename).
  void write(const std::string& path) const;

 private:
  nlohmann::json data_;
};

/// A text table's name column width: the longest of `names`, at least `min`, at most 48.
size_t name_column_width(const std::vector<std::string>& names, size_t min);
/// `name` cut to `width` from the left ("…" + its end) when longer.
std::string fit_name(const std::string& name, size_t width);

}  // namespace lopper
