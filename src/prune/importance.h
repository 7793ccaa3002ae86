// The pruning criteria, in one table: what ranks single weights (unstructured, N:M, rows, columns,
// blocks) and what ranks channels and heads (structured). Unstructured and structured pruning,
// LAMP targets, sensitivity sweeps, the trainer's schedules and the CLI (parsing, help text,
// errors) all read it. A new criterion is one entry in importance.cpp, and its test.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace lopper {

struct Saliency;       // lopper/prune.h
struct CriterionInfo;  // lopper/prune.h
struct LayerInput;     // prune/layer_inputs.h

namespace importance {

/// What a criterion reads besides the weights.
enum class Needs {
  kWeights,      // the weights alone
  kGradients,    // gradients of the loss on calibration data, accumulated into a Saliency
  kActivations,  // the layers' inputs on calibration data: single weights by LayerInput
                 // (prune/layer_inputs.h), channels by their magnitude (prune/activations.h)
};

/// How a criterion ranks single weights.
enum class WeightRank {
  kNone,       // it does not: channels only
  kMagnitude,  // |w|, read from the weight itself (no copy); rows, columns and blocks by an Ln norm
  kThreshold,  // |w| against a threshold instead of an amount
  kDrawn,      // at random (seeded), as torch's random_unstructured / random_structured
  kScores,     // by the scores weight_scores() computes (>= 0, the weight's shape)
  kReconstruct,  // by a solver that also updates the weights it keeps so that the layer's output
                 // on the calibration inputs changes least (SparseGPT; prune/sparsegpt.h)
};

/// How a criterion ranks the channels of a structured group.
enum class SliceRank {
  kNone,          // it does not: single weights only
  kWeightScores,  // each channel by the sum of its weights' scores (|w| for kMagnitude) over
                  // every weight slice of the group (filters and the next layers' inputs)
  kCustom,        // by slice_scores() over the group's slices, then finish()
  kDrawn,         // at random (seeded)
  kActivations,   // by the mean magnitude of their activations where layers read them: the terms
                  // of a Saliency (activation_terms) per tensor that layers read them from
                  // (prune/activations.h), each tensor once
};

struct Criterion;

/// One weight to score: the reader's view of an initializer.
struct WeightInput {
  const Criterion& criterion;
  const at::Tensor& w;
  const std::string& name;           // the initializer
  const std::vector<int64_t>& perm;  // the Transpose between the initializer and its reader (empty:
                                     // none); saliencies are stored in the initializer's layout
  const Saliency* saliency;          // Needs::kGradients
  const LayerInput* input = nullptr;  // Needs::kActivations: the layer's inputs
  int64_t out_axis = -1;              // the weight's output axis (Needs::kActivations)
};

/// One parameter slice of a channel group (depgraph::Slice, without the graph).
struct SliceInput {
  const at::Tensor& value;  // the reader's view
  int64_t axis = 0;         // the channel axis in that view
  bool weight_out = false;  // a layer's weight along its output channels (a filter, a neuron)
  bool weight_in = false;   // a layer's weight along its input channels
  bool norm_scale = false;  // a normalisation layer's gamma
};

struct Criterion {
  const char* name;
  const char* summary;  // one line for help texts: what ranks, what goes first
  Needs needs = Needs::kWeights;

  WeightRank weights = WeightRank::kNone;
  /// kScores: the weight's scores, lowest removed first.
  at::Tensor (*weight_scores)(const WeightInput&) = nullptr;
  /// Needs::kGradients: one calibration batch's term of the per-weight statistic (the weight and
  /// its gradient), summed over the batches ...
  at::Tensor (*gradient_term)(const at::Tensor& w, const at::Tensor& g) = nullptr;
  bool mean_over_batches = false;  // ... and divided by their number
  /// Needs::kActivations: the Gram matrix of the inputs too (LayerInput::gram), not only their
  /// squared norms.
  bool needs_gram = false;
  /// Compares a weight only with the others of its output row (Wanda): unstructured pruning
  /// removes the amount from each row, and scores do not compare across layers (no global scope).
  bool per_row = false;

  SliceRank slices = SliceRank::kNone;
  /// kCustom: a slice's term per index along its axis (double), or undefined when the slice does
  /// not count; a channel's score is the sum of its terms, then finish() (nullptr: the sum).
  at::Tensor (*slice_scores)(const SliceInput&) = nullptr;
  double (*finish)(double sum) = nullptr;
  /// kCustom, kActivations: a group none of whose channels any slice scored cannot be ranked; this
  /// says why.
  const char* unscored = nullptr;

  bool ranks_weights() const { return weights != WeightRank::kNone; }
  bool ranks_channels() const { return slices != SliceRank::kNone; }
  bool needs_data() const { return needs != Needs::kWeights; }
};

/// Every criterion, in the order help texts list them.
const std::vector<Criterion>& criteria();

/// Which criteria a list names.
enum class Use { kWeights, kChannels };

/// The criterion called `name` that ranks what `use` says. Throws lopper::Error "[prune] unknown
/// method 'x' (methods: ...)" ("unknown structured method" for channels).
const Criterion& find(const std::string& name, Use use);
/// The criteria of `use` that pass `keep`, comma separated, the last after `last` (", " or " or ").
std::string names(Use use, bool (*keep)(const Criterion&) = nullptr, const char* last = ", ");
/// "by their gradients" / "by the layers' inputs": what a data-driven criterion ranks by.
std::string data_needed(const Criterion& c);
/// What callers are told of `c` whatever it ranks: its name, its summary and the data it needs.
CriterionInfo info(const Criterion& c);
/// `info_of` each criterion of `use` (by its name), in the table's order.
std::vector<CriterionInfo> infos(Use use, CriterionInfo (*info_of)(const std::string& name));

/// The scores of one weight under `c` (kScores, kMagnitude as |w|). Throws lopper::Error when a
/// gradient criterion has no saliency for it, or one of the wrong shape.
at::Tensor weight_scores(const WeightInput& in);

/// kActivations: the terms of the tensor `value` (one per index along its channel axis; a channel's
/// are summed) in `saliency`'s entry for `c`, undefined when it has none.
at::Tensor activation_terms(const Criterion& c, const Saliency* saliency, const std::string& value);

/// The warning for weight `name` when `w` holds NaN or Inf (how every criterion ranks them), ""
/// when it is finite or not floating point.
std::string non_finite_warning(const std::string& name, const at::Tensor& w);

/// Accumulates the per-weight statistics of the gradient criteria over calibration batches:
/// compute_saliency() and the trainer's data-driven schedules both fill their Saliency with it.
class GradientStats {
 public:
  /// `only`: the one criterion to accumulate (empty: every gradient criterion of the table).
  explicit GradientStats(const std::string& only = "");
  /// Starts weight `name` (of `like`'s shape) at zero, so that a weight the loss never reaches
  /// still has (zero) scores.
  void track(const std::string& name, const at::Tensor& like);
  /// One batch's gradient `g` of weight `name` (value `w`); scores are kept in float32.
  void add(const std::string& name, const at::Tensor& w, const at::Tensor& g);
  /// Counts a batch (after add() for each of its weights).
  void end_batch() { ++batches_; }
  int64_t batches() const { return batches_; }
  /// The statistics so far, on the CPU, into `out` (scores, batches).
  void fill(Saliency& out) const;
  void clear();

 private:
  std::vector<const Criterion*> criteria_;
  std::vector<std::pair<std::string, std::vector<at::Tensor>>> sums_;  // weight -> per criterion
  int64_t batches_ = 0;
};

}  // namespace importance
}  // namespace lopper
