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

#include "lopper/prune.h"
#include "lopper/sensitivity.h"
#include "lopper/structured.h"
#include "lopper/target.h"
#include "lopper/train.h"

namespace lopper {

class DataLoader;  // lopper/data.h

/// What a PruneRequest resolves to: one way of pruning for every layer, or a recipe, and what it
/// reads.
struct PruneJob {
  std::optional<PruneOptions> options;  // one way for every layer ...
  std::optional<PruneRecipe> recipe;    // ... or per layer
  bool needs_data = false;              // a criterion ranks by data, or OWL weighs the blocks
  bool reads_inputs = false;            // wanda, sparsegpt, OWL: prune_calibrated()
  std::string data_method;              // the first criterion that ranks by data ("" for OWL alone)

  /// Prunes `model` as planned: calibrated on `data` block by block when the job reads the
  /// layers' inputs, else by gradient saliencies on `data` when a criterion needs them, else by
  /// the weights alone (`data` may then be null). `calib` says how many batches, on which device.
  PruneReport run(ir::Model& model, DataLoader* data, const CalibrationOptions& calib) const;
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

  /// Every rule between the options; throws UsageError naming the first one broken (an unknown
  /// device: lopper::Error). The trainer's options, ready to run.
  TrainOptions validate() const;
};

}  // namespace lopper
