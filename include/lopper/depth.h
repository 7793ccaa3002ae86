// Depth pruning: whole residual blocks go (ShortGPT, Minitron's depth pruning). A residual block
// is an Add whose one input x passes straight on and whose other input is computed from x by a
// body of nodes nothing else reads: a ResNet bottleneck or basic block with an identity shortcut,
// a transformer's attention or MLP sub-layer. In a transformer an attention block and the MLP block
// that reads its output make one layer (a decoder layer). Removing a unit hands x straight on; its
// nodes and the weights only they read leave the model.
//
// The units are ranked by block influence (1 - the mean cosine similarity of the unit's input and
// output, per position along the channel axis, over calibration batches; Men et al. 2024,
// ShortGPT), by the calibration loss with the unit left out, or at random, and the lowest go.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "lopper/data.h"
#include "lopper/graph.h"
#include "lopper/prune.h"
#include "lopper/structured.h"

namespace lopper {

/// One unit depth pruning can remove.
struct DepthUnit {
  std::string kind;                // "block", or "layer" (an attention block and its MLP block)
  std::string label;               // the common prefix of its weights' names, else its first node's
  std::string input, output;       // the value it reads and the value it hands on
  std::vector<std::string> nodes;  // every node that goes with it (its residual Adds included)
  std::vector<std::string> layers;  // its nodes with a weight, and ...
  std::vector<std::string> params;  // ... their weights' PyTorch names ("" where not known)
  int64_t params_count = 0;         // elements of the weights only it reads
  int64_t feature_axis = -1;        // the axis its block influence compares along
  std::string blocked;              // why it cannot be removed ("" : it can)
  /// What an `exclude` regex is searched in: its layers, their weights' names and its label.
  std::vector<std::string> names() const {
    std::vector<std::string> n = layers;
    n.insert(n.end(), params.begin(), params.end());
    n.push_back(label);
    return n;
  }
};

/// The units of `model` in graph order, with their shapes at `input_shapes` (dynamic dims 1).
std::vector<DepthUnit> depth_units(const ir::Model& model,
                                   const std::map<std::string, std::vector<int64_t>>& input_shapes);

/// The criteria that rank depth units: influence (block influence, on data), loss (the loss with
/// the unit left out, on data), random (seeded). Throws lopper::Error "[prune] unknown method".
CriterionInfo depth_criterion_info(const std::string& name);
std::vector<CriterionInfo> depth_criteria();

/// Block influence (ShortGPT): 1 - the mean cosine similarity between a unit's input and output,
/// over the vectors along `axis` (a sample's channels at one position, a token's hidden state).
/// Accumulated batch by batch in double; a pair of zero vectors counts as similar (cos 1).
class BlockInfluence {
 public:
  /// x and y of the same shape; axis may be negative.
  void add(const at::Tensor& x, const at::Tensor& y, int64_t axis);
  double value() const { return n_ ? 1.0 - sum_ / double(n_) : 0.0; }
  int64_t vectors() const { return n_; }

 private:
  double sum_ = 0;
  int64_t n_ = 0;
};

/// Per unit, "excluded" where the regex `exclude` (prune.h: regex rules) is found in one of its
/// `names`, else "". Throws lopper::Error (option "exclude") on a bad regex.
std::vector<std::string> depth_excluded(const std::vector<std::vector<std::string>>& names,
                                        const std::string& exclude);

/// The random criterion's scores of `n` units (seeded: the same for the same n and seed).
std::vector<double> depth_random_scores(size_t n, uint64_t seed);

/// The units to remove: `amount` of those not blocked (a fraction of them, or a count), lowest
/// score first, ties to the earlier unit; in ascending order. Throws lopper::Error naming `what`
/// when the amount is out of range.
std::vector<size_t> choose_depth_units(const std::vector<double>& scores,
                                       const std::vector<std::string>& blocked,
                                       const PruneAmount& amount, const std::string& what);

/// Removes the units `opts` asks for (opts.unit == kBlock; opts.criterion one of depth_criteria();
/// opts.amount; opts.exclude blocks the units with a matching layer or weight name; opts.seed):
/// each removed unit's input is handed straight to its readers, its nodes and the weights only
/// they read are gone. `data` (with `calib`): the calibration batches of influence and loss.
/// The report has one group per unit (kind "block" or "layer", size 1 before, 0 after when
/// removed, its score). Throws lopper::Error when nothing can be removed; the model is untouched
/// then.
StructuredReport prune_depth(ir::Model& model, const StructuredOptions& opts, DataLoader* data,
                             const CalibrationOptions& calib);

}  // namespace lopper
