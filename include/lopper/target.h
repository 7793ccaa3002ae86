// Pruning to a target: per-layer amounts chosen so the pruned model keeps a share of its
// parameters or MACs, or runs within a latency, with the least estimated loss.
//
// With sensitivity data (lopper/sensitivity.h) each layer's (or channel group's) loss increase and
// cost saving are known per amount; amounts are chosen by a Lagrangian relaxation (every layer
// takes the amount minimising loss increase - lambda * saving; lambda is bisected until the
// savings meet the target), on the sensitivity curves interpolated linearly. Without data, weights
// are ranked across layers by LAMP (Lee et al. 2021: w^2 over the sum of the squares of the layer's
// weights that are not smaller) and channels by their group-normalised importance, and the one
// global amount that meets the target is found by bisection. Either way the pruned model is then
// measured: savings that do not add up across layers (structured groups that meet in one layer,
// latency) are corrected in further rounds until the measurement meets the target.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "lopper/graph.h"
#include "lopper/latency.h"
#include "lopper/prune.h"
#include "lopper/sensitivity.h"
#include "lopper/structured.h"

namespace lopper {

enum class TargetKind { kParams, kMacs, kLatency };
const char* target_name(TargetKind k);  // "params", "macs", "latency"

struct TargetOptions {
  TargetKind kind = TargetKind::kMacs;
  /// kParams, kMacs: the share of the unpruned model's nonzero parameters or MACs kept, in (0, 1);
  /// kLatency: milliseconds per run at the input shapes on `device`.
  double value = 0.5;
  bool structured = false;  // channel groups (the model shrinks) instead of single weights
  /// Residual blocks (lopper/depth.h) too, or alone: each kept or removed whole, chosen with the
  /// channel groups on the sensitivity curves (blocks need sensitivity data: `sensitivity`, or
  /// measured on data).
  bool blocks = false;
  /// Structured, without sensitivity data: what ranks the channels. Unstructured: l1, or with
  /// sensitivity data measured by it, a criterion that reads the layers' inputs (wanda,
  /// sparsegpt): the amounts are chosen on the curves, then applied by prune_calibrated() on
  /// `calibration_data` (target_recipe()).
  std::string criterion = "l1";
  DataLoader* calibration_data = nullptr;
  CalibrationOptions calibration;
  int64_t block_size = PruneLayerOptions().block_size;  // sparsegpt
  double dampening = PruneLayerOptions().dampening;     // sparsegpt
  int64_t round_to = 1;
  std::string exclude;  // layers (or groups with a layer) left alone
  /// Unstructured: prune tied weights too (PruneLayerOptions::allow_tied); off, they stay.
  bool allow_tied = false;
  /// Measured sensitivities of this model (same unit); null: LAMP / global channel ranking.
  const SensitivityResult* sensitivity = nullptr;
  /// Amounts tried per layer when the latency of each is measured (and without data).
  std::vector<double> grid = {0.1, 0.3, 0.5, 0.7, 0.9};
  std::string device = "cpu";
  std::map<std::string, std::vector<int64_t>> input_shapes;  // dynamic dims default to 1
  /// Structured: parameter axes that keep their size (StructuredOptions::fixed).
  std::vector<FixedAxis> fixed;
  int latency_iters = 20;
  std::function<void(const std::string& what, int64_t done, int64_t total)> progress;
  /// kLatency: called with each latency measurement of the search (before, candidates, result).
  std::function<void(const LatencyStats&)> on_latency;
};

struct TargetUnit {
  std::string name;  // the layer, or "group N: first layer"
  std::vector<std::string> layers;
  std::string weight;            // unstructured
  std::string param;             // unstructured: the PyTorch parameter's name, "" when unknown
  int64_t group = -1;            // structured
  int64_t block = -1;            // a residual block (depth_units() index): amount 1 = removed
  double amount = 0;             // chosen share of its weights (channels) removed
  double est_loss_increase = 0;  // from the sensitivity data (0 without)
  /// What tables show: the parameter's name, else `name`.
  const std::string& label() const { return param.empty() ? name : param; }
};

struct TargetReport {
  TargetKind kind = TargetKind::kMacs;
  std::string estimator;  // "sensitivity", "lamp" or "global channel ranking"
  /// In the target's unit (nonzero parameters, MACs as in EffectiveCost, or ms).
  double target = 0, before = 0, predicted = 0, measured = 0;
  double base_loss = 0, predicted_loss = 0;  // sensitivity: the evaluated loss and its estimate
  int rounds = 0;                            // allocations until the measurement met the target
  std::vector<TargetUnit> units;
  /// kLatency: latency measurements taken, how many of them had a wide spread
  /// (LatencyStats::wide: the machine was busy), and the widest one.
  int latency_measurements = 0, latency_wide = 0;
  LatencyStats latency_widest;
  std::vector<std::string> warnings;  // what deserves a look (a weight holding NaN or Inf)
};

/// The sensitivity sweep a target measures on data when it has none: the target's unit,
/// criterion, rounding, exclusions, device and shapes; for single weights, amounts up to 0.99 (a
/// high target, 95% of the weights removed overall, needs some layers past 95%).
SensitivityOptions sensitivity_options(const TargetOptions& o);

/// Throws lopper::Error ("[prune] ...") naming the first option out of range (a share outside
/// (0, 1), a latency <= 0, round_to < 1, a channel criterion that needs data): what
/// prune_to_target() checks first.
void check_target_options(const TargetOptions& o);

/// The chosen amounts as a recipe: one rule per unit with an amount > 0 (matching its weight's
/// name exactly), each pruned as `how` says with the unit's amount; every other layer is left
/// alone. Unstructured units only.
PruneRecipe target_recipe(const TargetReport& r, const PruneLayerOptions& how);

/// Prunes `model` in place to the target. Throws lopper::Error ("[prune] ...") when the options
/// are bad, the sensitivity data does not match the model, or the target cannot be reached (every
/// layer at its largest amount is not enough); the model is untouched then.
TargetReport prune_to_target(ir::Model& model, const TargetOptions& opts);

}  // namespace lopper
