// Sensitivity analysis: how much a model's loss and accuracy suffer when one layer (or one channel
// group) alone is pruned to each of a list of amounts, on a fixed set of evaluation batches. The
// curves say where a model can be pruned and how far; pruning to a target (lopper/target.h) reads
// them to choose per-layer amounts.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "lopper/graph.h"
#include "lopper/prune.h"
#include "lopper/structured.h"

namespace lopper {

class DataLoader;  // lopper/data.h

struct SensitivityOptions {
  /// Each in [0, 1): the share of a layer's weights (structured: of a group's channels) removed.
  std::vector<double> amounts = {0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95};
  bool structured = false;  // channel groups (structured.h) instead of single weights
  /// Residual blocks (lopper/depth.h) too, or alone: each removed on its own, one point (amount
  /// 1: the whole block) per block.
  bool blocks = false;
  /// What ranks the weights (l1, random, or by the layer's inputs: wanda, sparsegpt) or the
  /// channels (a criterion of the weights alone: l1, l2, bn, fpgm, random); gradient criteria
  /// would need gradients at every point.
  std::string criterion = "l1";
  /// wanda, sparsegpt: the layers' inputs are collected once, on the unpruned model (only one
  /// layer is pruned at a time), over this many of the data's first batches (0: enough for
  /// CalibrationOptions::kLayerInputSamples samples); the evaluated batches are among them.
  int64_t calib_batches = 0;
  int64_t block_size = PruneLayerOptions().block_size;  // sparsegpt
  double dampening = PruneLayerOptions().dampening;     // sparsegpt
  int64_t round_to = 1;  // structured: channel counts a multiple of this
  uint64_t seed = 0;     // random
  std::string exclude;   // regex (prune.h: regex_error): layers (or groups with a layer) left out
  /// Unstructured: analyse tied weights too (PruneLayerOptions::allow_tied); off, a weight that a
  /// node other than a prunable layer shares (a tied embedding) is left out, as prune() leaves it.
  bool allow_tied = false;
  int64_t eval_batches = 16;  // batches of the data evaluated per point (the same ones each time)
  std::string device = "cpu";
  LossOptions loss;  // lopper/loss.h: what the points' loss and top-1 measure
  /// Input shapes for MAC counts (dynamic dims default to 1).
  std::map<std::string, std::vector<int64_t>> input_shapes;
  /// Structured: parameter axes that keep their size (StructuredOptions::fixed).
  std::vector<FixedAxis> fixed;
  /// The sweep's progress in batches (each evaluated batch, each calibration batch): first step 0
  /// with the plan ("21 layers x 10 amounts = 210 points, 16 batches each: 3376 batch runs"),
  /// then after every batch done of total and what ("layer @ 0.5: batch 3/16").
  std::function<void(int64_t done, int64_t total, const std::string& what)> progress;
};

struct SensitivityPoint {
  double amount = 0;   // as asked
  double removed = 0;  // the share actually removed (rounding, --round-to, weights already zero)
  double loss = 0, top1 = 0;
  /// The whole model with only this layer pruned: nonzero parameters and MACs. Unstructured MACs
  /// count a layer's multiply-accumulates times its density (what a sparse kernel computes).
  int64_t params = 0, macs = 0;
};

struct LayerSensitivity {
  std::string name;    // unstructured: the layer (node); structured: "group N: first layer"
  std::string weight;  // unstructured: its weight initializer
  std::string param;   // unstructured: the PyTorch parameter's name, "" when the model lacks it
  int64_t group = -1;  // structured: the channel group's id
  int64_t block = -1;  // a residual block: its index among depth_units() (one point, amount 1)
  std::vector<std::string> layers;  // the layers that shrink (unstructured: the one layer)
  int64_t params = 0, macs = 0;     // dense, of the layer itself (structured: its group's layers)
  std::vector<SensitivityPoint> points;  // one per amount, in order
  /// What tables show: the parameter's name, else `name`.
  const std::string& label() const { return param.empty() ? name : param; }
};

struct SensitivityResult {
  std::string unit;           // "weight", "channel", "block" or "channel+block"
  std::string method;         // the criterion ranking weights or channels
  double loss = 0, top1 = 0;  // the unpruned model on the same batches
  int64_t samples = 0;
  int64_t params = 0, macs = 0;  // the unpruned model (nonzero parameters; MACs as above)
  std::vector<LayerSensitivity> layers;
  /// Layers that could not be analysed, each with why ("lm_head: the calibration data never
  /// reached it").
  std::vector<std::string> skipped;
};

/// Throws lopper::Error naming the first option out of range (what sensitivity() checks first).
void check_sensitivity_options(const SensitivityOptions& o);

/// Evaluates `model` on the first `eval_batches` batches of `data` (cross-entropy loss and top-1
/// against its labels), then once per layer and amount with only that layer pruned. Throws
/// lopper::Error on bad options (an amount outside [0, 1), no layer to analyse, taylor/grad).
/// wanda and sparsegpt analyse the Gemm, MatMul and Conv layers whose inputs can be collected
/// (the others are left out, each named in `skipped`).
SensitivityResult sensitivity(const ir::Model& model, DataLoader& data,
                              const SensitivityOptions& opts);

/// The result as JSON (what `lopper sensitivity --json` prints and `--sensitivity FILE` reads).
std::string sensitivity_json(const SensitivityResult& r);
/// Parses sensitivity_json's output; throws lopper::Error naming `source` on anything else.
SensitivityResult parse_sensitivity(const std::string& json, const std::string& source);

/// The model's nonzero parameters and MACs, unstructured sparsity counted as in SensitivityPoint.
struct EffectiveCost {
  int64_t params = 0, macs = 0, dense_macs = 0;
};
EffectiveCost effective_cost(const ir::Model& model,
                             const std::map<std::string, std::vector<int64_t>>& input_shapes);
/// The same from an analysis already made (lopper/analysis.h).
struct ModelCost;
EffectiveCost effective_cost(const ModelCost& cost);

}  // namespace lopper
