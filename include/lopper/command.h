// The workflows of lopper's front ends as requests. A request holds what the user gave (an unset
// std::optional or an empty list: not given); validate() applies every rule between the options
// (what an option needs, what does not go with it, the ranges) and resolves them into what the
// library runs. The CLI and the Python package only parse into a request and print or convert its
// result, so that a rule is written once and both front ends keep it.
//
// Errors are UsageErrors that name options by their library names, each marked with
// LOPPER_OPTION: the CLI renders them as its flags (criterion -> --method), Python as its keyword
// arguments (criterion -> method).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "lopper/analysis.h"
#include "lopper/data.h"
#include "lopper/error.h"
#include "lopper/executor.h"
#include "lopper/files.h"
#include "lopper/latency.h"
#include "lopper/loss.h"
#include "lopper/prune.h"
#include "lopper/sensitivity.h"
#include "lopper/structured.h"
#include "lopper/target.h"
#include "lopper/train.h"

namespace lopper {

/// Runs `f`; a lopper::Error it throws is thrown again with each marked option given as
/// `name(option)` (a front end's spelling: a flag, a Python argument), keeping its kind, or as a
/// UsageError whatever its kind when `all_usage` (the front end's parsing of the caller's values).
template <typename F>
auto with_option_names(F&& f, std::string (*name)(const std::string&), bool all_usage)
    -> decltype(f()) {
  try {
    return f();
  } catch (const UsageError& e) {
    throw UsageError(e.render(name));
  } catch (const Error& e) {
    if (all_usage) throw UsageError(e.render(name));
    throw Error(e.render(name));
  }
}

/// What a request says of the models it reads before its work, one line each ("PATH: what"):
/// what makes a model's figures another model's than the one a user deploys (load_warnings), a
/// latency spread too wide to trust. Null: nothing said.
using Warn = std::function<void(const std::string&)>;

/// The data a command reads: the dataset SPEC (open_dataset) and what shapes its batches and
/// its loss, by their library names (the CLI's --data, --split, --batch-size, ...).
struct DataSpec {
  std::string data, split = "test", normalize, resize, loss = "auto";
  int64_t batch_size = 64;
  int64_t mask_token = -1;
  double mask_prob = 0.15;

  bool given() const { return !data.empty(); }
  /// Loader options for `model`: a fixed batch dim wins over batch_size (`fixed_batch` says so).
  LoaderOptions loader(const ir::Model& model, bool& fixed_batch) const;
  LoaderOptions loader(const ir::Model& model) const;
  /// For measuring `model`: in order, and only full batches where its batch dim is fixed.
  LoaderOptions eval_loader(const ir::Model& model) const;
  std::shared_ptr<Dataset> dataset() const;
  /// The loss and its masking, checked (UsageError naming the option); `seed` picks the masked
  /// tokens.
  LossOptions loss_options(uint64_t seed = 0) const;
  /// Whether the data is one split only (npy:, tokens:): `split` does not apply.
  bool one_split() const;
};

/// The files a dataset SPEC reads (npy:X.npy,Y.npy: both), as inputs of `files`.
void add_data_inputs(OutputFiles& files, const std::string& spec);
/// Bytes of the model file at `path` plus the external data files `model` was read from (0 when
/// the file cannot be read).
int64_t model_file_bytes(const std::string& path, const ir::Model& model);
/// Bytes of a model staged in `files` (the model and "<path>.data").
int64_t staged_model_bytes(const OutputFiles& files, const std::string& path);
/// The model's fixed batch size: the first dim of its first real input when that dim is static and
/// positive, else 0 (dynamic).
int64_t fixed_batch_size(const ir::Model& model);
/// Loads the model at `path`; it and its external data files become inputs of `files`, and what
/// load_warnings says of it goes to `warn`.
ir::Model load_input_model(OutputFiles& files, const std::string& path, const Warn& warn);
/// The executor's options for a device and a precision, checked: a bad spelling is a UsageError,
/// a CUDA device that is not there an Error.
ExecOptions exec_options(const std::string& device, const std::string& precision);

/// lopper inspect: what a model holds and computes, per layer.
struct InspectResult {
  ModelCost cost;
  int64_t file_bytes = 0;    // the model file with its external data
  std::vector<bool> shared;  // per layer of cost: its weight is read by other layers too
};
struct InspectRequest {
  std::string model;
  std::map<std::string, std::vector<int64_t>> input_shapes;  // dynamic dims default to 1
  InspectResult run() const;
};

/// lopper run: a model run once on inputs read from files, every output written as .npy.
struct RunOutput {
  std::string name, path;
  std::vector<int64_t> shape;
};
struct RunRequest {
  std::string model;
  std::vector<std::pair<std::string, std::string>> inputs;  // (input, .npy or TensorProto .pb)
  std::string out;  // the folder for <output name>.npy (made if new)
  std::string device = "cpu", precision = "fp32";
  Warn warn;
  /// Writes the outputs (staged, then renamed: nothing when any fails) and says where.
  std::vector<RunOutput> run() const;
};

/// lopper convert: a model read and written again with other storage options.
struct ConvertResult {
  int64_t model_bytes = 0, written_bytes = 0;  // with their external data
};
struct ConvertRequest {
  std::string model, out;
  bool sparse_initializers = false;  // weights as sparse_initializer where that is smaller
  bool dense = false;                // every initializer dense
  bool external_data = false;        // weights in OUT.data
  Warn warn;
  void validate() const;
  ConvertResult run() const;
};

/// lopper bench: latency and throughput of a model on random inputs.
struct BenchResult {
  LatencyStats latency;
  int64_t batch = 1;
  int threads = 1;
  double throughput_per_s = 0;
  struct OpTime {
    std::string op;  // "Conv", or "domain.Op"
    double ms_per_run = 0;
    int64_t calls_per_run = 0;
  };
  std::vector<OpTime> ops;                            // profile: per op type, slowest first
  std::vector<std::pair<double, std::string>> nodes;  // profile: ms per run of "node (Op)"
  std::vector<KernelDecision> kernels;                // explain: the kernel chosen per layer
};
struct BenchRequest {
  std::string model;
  std::map<std::string, std::vector<int64_t>> input_shapes;
  std::optional<int64_t>
      batch;  // the first dim of every input (default: the model's, 1 if dynamic)
  std::string device = "cpu", precision = "fp32";
  int64_t warmup = 10, iters = 50;
  bool profile = false;  // the time per op type and node, on `iters` more runs
  bool explain = false;  // the kernel chosen per layer and the time of each candidate
  Warn warn;
  void validate() const;
  BenchResult run() const;
};

/// lopper eval: a model measured on a dataset.
struct EvalRequest {
  std::string model;
  DataSpec data;
  std::string device = "cpu", precision = "fp32";
  Warn warn;
  std::function<void(int64_t batch, int64_t of)> progress;
  EvalResult run() const;
};

/// lopper compare: two models side by side (params, nonzero, MACs, file size, accuracy, latency).
struct CompareMeasured {
  int64_t params = 0, nonzero = 0, macs = 0, file_bytes = 0;
  int64_t effective_macs = 0;  // what a sparse kernel does: each layer's MACs times its density
  double top1 = -1;            // -1: no data
  LatencyStats latency;
  ModelCost cost;
};
struct CompareResult {
  CompareMeasured before, after;
  std::string json;  // the JSON report (written to `out` too), indented
};
struct CompareRequest {
  std::string before, after;
  DataSpec data;  // top-1 accuracy on it, when given
  int64_t batch = 1, iters = 200;
  std::string device = "cpu", precision = "fp32";
  std::string out;      // the JSON report, also written here
  std::string report;   // an HTML report of the two models, per layer
  std::string command;  // the command line, for the HTML report's header
  Warn warn;
  void validate() const;
  CompareResult run() const;
};

/// What a PruneRequest resolves to: one way of pruning for every layer, or a recipe, and what it
/// reads.
struct PruneJob {
  std::optional<PruneOptions> options;  // one way for every layer ...
  std::optional<PruneRecipe> recipe;    // ... or per layer
  bool needs_data = false;              // a criterion ranks by data, or OWL weighs the blocks
  bool reads_inputs = false;            // wanda, sparsegpt, OWL: prune_calibrated()
  bool gradients = false;               // a criterion ranks by gradients (grad, taylor)
  std::string data_method;              // the first criterion that ranks by data ("" for OWL alone)

  /// Prunes `model` as planned: calibrated on `data` block by block when the job reads the
  /// layers' inputs, else by gradient saliencies on `data` when a criterion needs them, else by
  /// the weights alone (`data` may then be null). `calib` says how many batches, on which device.
  PruneReport run(ir::Model& model, DataLoader* data, const CalibrationOptions& calib) const;
  /// The same on a layer model whose calibration the caller runs (reads_inputs only).
  PruneReport run(ir::Model& layers, CalibrationRunner& runner,
                  const CalibrationOptions& calib) const;
};

/// lopper prune (per layer or by a recipe) and lopper.prune.
struct PruneRequest {
  std::optional<std::string> criterion;  // --method / method
  std::optional<PruneAmount> amount;
  std::optional<double> threshold;
  std::optional<std::string> scope;    // local (default) | global
  std::optional<std::string> pattern;  // unstructured (default) | N:M | row | column | block:RxC
  std::optional<int> norm;
  std::optional<uint64_t> seed;
  std::optional<std::string> exclude;
  bool skip_first_last = false, allow_tied = false;
  /// Per-layer rules instead of the options above: reads them (a YAML file, a dict), called once
  /// validate() has checked that no option above is given with them.
  std::function<PruneRecipe()> recipe;
  std::optional<int64_t> block_size;  // sparsegpt
  std::optional<double> dampening;    // sparsegpt
  std::optional<double> owl_lambda, owl_m;
  bool one_pass = false;           // wanda, sparsegpt: calibrate on the unpruned model in one pass
  std::optional<int64_t> batches;  // calibration batches (--calib-batches / calib_batches)

  bool data = false;  // calibration data given
  /// The options given that shape the data (their library names: "data", "split", "device"...):
  /// each is refused when nothing reads data.
  std::vector<std::string> data_options;
  /// Whether the front end has an accuracy report that reads the data too (the CLI's --report),
  /// and whether it was asked for: then the data options are not refused, except `batches`.
  bool offers_report = false, report = false;
  /// What follows "give data" in the front end's words (the CLI: " SPEC (e.g. --data
  /// fashion-mnist)").
  std::string data_hint;
  /// Options of the other workflows given with this one (a front end that takes them all in one
  /// command, as the CLI's prune does; library names): each is refused, naming its workflow.
  std::vector<std::string> structured_options;  // max_layer_amount, round_to, input_shapes
  std::vector<std::string> target_options;      // sensitivity; eval_batches without the report

  /// Every rule between the options; throws UsageError naming the first one broken.
  PruneJob validate() const;
};

/// What a StructuredRequest resolves to.
struct StructuredJob {
  StructuredOptions options;                  // its recipe (if any) points into `recipe`
  std::shared_ptr<const PruneRecipe> recipe;  // per-group amounts, or null
  bool needs_data = false;                    // the criterion ranks channels by data (taylor)

  /// Prunes `model` as planned, ranking by gradient saliencies on `data` when the criterion
  /// needs them (`data` may be null otherwise).
  StructuredReport run(ir::Model& model, DataLoader* data, const CalibrationOptions& calib) const;
};

/// lopper prune --structured and lopper.prune_structured: whole channels or heads removed.
struct StructuredRequest {
  std::string unit = "channel";  // channel | head
  std::optional<std::string> criterion;
  std::optional<PruneAmount> amount;
  std::optional<std::string> scope;  // local (default) | global
  std::optional<double> max_layer_amount;
  std::optional<int64_t> round_to;
  std::optional<std::string> exclude;
  std::optional<uint64_t> seed;
  std::function<PruneRecipe()> recipe;  // per-group amounts instead of `amount`
  std::map<std::string, std::vector<int64_t>> input_shapes;
  /// Options of unstructured pruning given with this (their library names): each is refused.
  std::vector<std::string> unstructured_options;

  bool data = false;                      // calibration data given
  std::vector<std::string> data_options;  // as PruneRequest's
  bool offers_report = false, report = false;
  std::string data_hint;
  std::vector<std::string> target_options;  // as PruneRequest's

  StructuredJob validate() const;
};

/// What a TargetRequest resolves to: the target's options without their data, sensitivity or
/// callbacks (the front end's), and what it reads.
struct TargetJob {
  TargetOptions options;
  bool reads_inputs = false;  // wanda, sparsegpt: pruned by them on the calibration batches
};

/// lopper prune --target-macs|--target-params|--target-latency-ms and lopper.prune_to_target.
struct TargetRequest {
  std::optional<double> target_macs, target_params, target_latency_ms;  // exactly one
  std::optional<std::string> structured;  // "channel": channel groups instead of single weights
  std::optional<std::string> criterion;
  std::optional<int64_t> round_to;
  std::optional<std::string> exclude;
  bool allow_tied = false;
  std::optional<int64_t> block_size;  // sparsegpt
  std::optional<double> dampening;    // sparsegpt
  std::optional<int64_t> batches;     // wanda, sparsegpt: calibration batches
  std::optional<int64_t> eval_batches;
  std::string device = "cpu";
  std::map<std::string, std::vector<int64_t>> input_shapes;
  /// Options that choose each layer's amount themselves (amount, pattern, recipe...), given with
  /// the target (their library names): each is refused.
  std::vector<std::string> per_layer_options;
  bool data = false;  // data given (the sensitivity sweep's, the calibration's)
  std::string data_hint;

  TargetJob validate() const;
};

/// What a SensitivityRequest resolves to: the sweep's options, without its loss or callbacks.
struct SensitivityJob {
  SensitivityOptions options;
  bool reads_inputs = false;  // wanda, sparsegpt: the layers' inputs collected on the data
};

/// lopper sensitivity and lopper.sensitivity: each layer (or channel group) pruned alone.
struct SensitivityRequest {
  std::optional<std::string> structured;  // "channel": channel groups instead of single weights
  std::optional<std::string> criterion;
  std::optional<std::vector<double>> amounts;
  std::optional<int64_t> eval_batches, round_to;
  std::optional<std::string> exclude;
  std::optional<uint64_t> seed;
  bool allow_tied = false;
  std::optional<int64_t> batches;     // wanda, sparsegpt: calibration batches
  std::optional<int64_t> block_size;  // sparsegpt
  std::optional<double> dampening;    // sparsegpt
  std::string device = "cpu";
  std::map<std::string, std::vector<int64_t>> input_shapes;
  bool data = false;
  std::string data_hint;

  SensitivityJob validate() const;
};

/// lopper train and lopper finetune: training, with progressive pruning on a schedule.
struct TrainRequest {
  /// The settings that need no rule between them as given (epochs, lr, momentum, regularisers,
  /// freeze, rounds, start/end epochs, checkpoints, device, seed, allow_tied ...); validate()
  /// fills in what the fields below name.
  TrainOptions options;
  std::optional<std::string> schedule;          // none (default) | iterative | agp
  std::optional<std::string> prune_criterion;   // --prune-method
  std::optional<std::string> prune_amount;      // the final sparsity, a fraction
  std::optional<std::string> prune_structured;  // channel | head: the model shrinks as it trains
  std::optional<std::string> prune_scope;       // global (default) | local
  std::optional<std::string> prune_pattern;     // unstructured (default) | N:M | row | ...
  std::optional<std::string> every;             // agp: "2" (epochs) or "100steps"
  std::optional<std::string> optimizer;         // sgd (default) | adam | adamw
  std::optional<std::string> lr_schedule;       // constant (default) | step | cosine
  std::optional<std::string> precision;         // fp32 (default) | bf16 | fp16
  /// Distillation: the teacher's path (the caller loads it into options.distill.teacher), alpha
  /// and temperature (defaults 0.5 and 1), STUDENT=TEACHER tensor pairs and their weight.
  std::optional<std::string> teacher;
  std::optional<double> distill_alpha, distill_temperature, distill_state_weight;
  std::vector<std::string> distill_states;

  /// Every rule between the options; throws UsageError naming the first one broken (an unknown
  /// device: lopper::Error). The trainer's options, ready to run.
  TrainOptions validate() const;
};

}  // namespace lopper
