// Structured pruning: whole channels (conv filters, linear neurons) and attention heads are removed
// and the model physically shrinks. A dependency graph built from the op table's channel rules
// finds everything that must shrink together (the next layers' inputs, normalisation parameters,
// residual branches, concatenations, splits, grouped convolutions, flattens, head reshapes); an op
// without a rule is a barrier the pruning never crosses, and the report names it.
//
// Attention heads (StructuredUnit::kHead) go whole: a head's query, key and value features and the
// output projection's rows for them. Grouped-query attention (fewer key/value heads than query
// heads, repeated by Expand and Reshape) loses whole key/value groups: a key/value head together
// with the query heads that read it, so the repeat count stays and every shape stays valid
// (LLaMA's 4 query and 2 key/value heads at 50%: 2 and 1). Reshape targets that an export
// computes from Shape at run time (dynamic batch and sequence) are followed: their constant
// entries (the head count, head_dim) are rewritten and the dynamic ones left alone.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "lopper/analysis.h"
#include "lopper/executor.h"
#include "lopper/graph.h"
#include "lopper/prune.h"

namespace lopper {

/// kBlock: whole residual blocks (depth pruning, lopper/depth.h: prune_depth()).
enum class StructuredUnit { kChannel, kHead, kBlock };

/// An initializer's axis that structured pruning leaves whole (axis -1: every axis); `why` is the
/// barrier the report lists (once for every FixedAxis with the same `why`).
struct FixedAxis {
  std::string weight;
  int64_t axis = -1;
  std::string why;
};

/// The model's runs that structured pruning makes anyway (the analysis of the model, the check that
/// the shrunk one runs), on a caller's inputs: a caller that compares a module with the graph
/// gets both graphs' outputs and costs from them instead of running them again.
struct StructuredRuns {
  NamedTensors feeds;                     // in: one tensor per graph input, of the analysis' shapes
  std::vector<at::Tensor> before, after;  // out: the model's outputs before and after pruning
  ModelCost cost_before, cost_after;      // out: analyze() of each at the feeds' shapes
};

struct StructuredOptions {
  StructuredUnit unit = StructuredUnit::kChannel;  // kHead: only groups that hold attention heads
  /// What ranks the channels: a criterion of the table (src/prune/importance.cpp) that ranks
  /// channels: l1 or l2 (the norm of every weight slice of the group: filters, neurons and the
  /// next layers' inputs), bn (|gamma| of the group's normalisation), fpgm (each filter's distance
  /// to the others, He et al. 2019), random (seeded), taylor (sum |w * dL/dw|) and activation
  /// (mean |activation|, Minitron), each from a Saliency (structured_saliency()).
  std::string criterion = "l1";
  PruneAmount amount;  // of each group's channels (local) or of all (global)
  PruneScope scope = PruneScope::kLocal;
  double max_layer_amount = 0.9;  // global: no group loses more than this share
  int64_t round_to = 1;           // keep channel counts a multiple of this
  std::string
      exclude;  // regex (prune.h: regex_error) on the names of a group's layers (node or parameter)
  uint64_t seed = 0;  // random
  const PruneRecipe* recipe =
      nullptr;  // per-group amount or skip, by the first rule matching a layer
  /// Per-group fractions by ChannelGroupReport::id (sensitivity, pruning to a target): the listed
  /// groups lose that share of their channels, the others none. Overrides amount, scope and recipe.
  std::map<int64_t, double> group_amounts;
  /// kBlock: remove exactly these units (indices of depth_units()) instead of ranking them.
  std::vector<int64_t> blocks;
  /// Input shapes for the analysis run (by name); dynamic dims default to 1.
  std::map<std::string, std::vector<int64_t>> input_shapes;
  /// Parameter axes that must keep their size, and why: the groups whose channels they hold are
  /// blocked with that reason (lopper.prune_structured pins what a module cannot follow, e.g.
  /// nn.MultiheadAttention's projections).
  std::vector<FixedAxis> fixed;
  /// Groups kept whole by ChannelGroupReport::id (ids are the same for the same model and unit),
  /// and why: lopper.prune_structured keeps the groups whose size a module's forward() hard-codes.
  std::map<int64_t, std::string> kept_groups;
  /// When set, the analysis run and the check of the shrunk model run on runs->feeds (their
  /// shapes are input_shapes) and leave their outputs and costs there.
  StructuredRuns* runs = nullptr;
};

struct ChannelGroupReport {
  int64_t id = 0;
  std::string kind;                 // "channel" or "head"
  std::vector<std::string> layers;  // the nodes whose parameters or shapes shrink with the group
  /// Per layer, its weight's PyTorch parameter name (param_name), "" for a node without one.
  std::vector<std::string> layer_params;
  int64_t size_before = 0, size_after = 0;
  int64_t blocks = 1;            // grouped convolution: channels go in equal numbers per group
  double score = 0;              // mean importance of the group's channels
  std::string blocked;           // why it cannot be pruned (a barrier, a graph output ...)
  std::string rule;              // recipes: the rule that set its amount
  std::vector<int64_t> removed;  // indices of the removed channels (0 .. size_before - 1)
  int64_t params = 0;            // depth units: the weights' elements that go with the unit
  /// What tables show for layer i: its parameter's name, else the node's.
  const std::string& layer_label(size_t i) const {
    return i < layer_params.size() && !layer_params[i].empty() ? layer_params[i] : layers.at(i);
  }
};

struct StructuredReport {
  std::vector<ChannelGroupReport> groups;
  std::vector<std::string> barriers;  // "node 'X' (Op): why", once each
  std::vector<std::string> warnings;
  int64_t channels_before = 0, channels_after = 0;  // over the groups that could be pruned
  std::string counted = "channels";  // what channels_* count: "channels", or "blocks" (depth)
};

/// The criterion called `name` among those that rank channels (l1, l2, bn, fpgm, random, taylor,
/// activation).
/// Throws lopper::Error "[prune] unknown method 'x' (methods: ...)".
CriterionInfo channel_criterion_info(const std::string& name);
/// Every criterion that ranks channels, in the table's order.
std::vector<CriterionInfo> channel_criteria();

/// The structured options a sweep or a target implies (`o`: SensitivityOptions, TargetOptions):
/// the criterion that ranks channels, the rounding, the analysis shapes and the axes kept whole.
template <typename Options>
StructuredOptions structured_options_of(const Options& o) {
  StructuredOptions so;
  so.criterion = o.criterion;
  so.round_to = o.round_to;
  so.input_shapes = o.input_shapes;
  so.fixed = o.fixed;
  return so;
}

/// Throws lopper::Error naming the first option out of range (what prune_structured() checks
/// before it looks at the model).
void check_structured_options(const StructuredOptions& opts);

/// The channel groups of `model` and its barriers, without pruning.
StructuredReport channel_groups(const ir::Model& model, const StructuredOptions& opts = {});

/// One parameter slice of a channel group, for penalties over whole groups (group lasso):
/// initializer `weight` along `axis`, whose position index[i] belongs to channel `channel[i]` of
/// `group`. A weight that follows several groups (a Concat's consumer) has one slice per group,
/// each with that group's positions only.
struct GroupSlice {
  std::string weight;
  int64_t axis = 0;
  int64_t group = 0;
  std::vector<int64_t> channel;
  std::vector<int64_t> index;  // positions along `axis`, as many as `channel`
};
struct GroupSlices {
  std::vector<int64_t> group_sizes;  // channels per group, for the groups that can be pruned
  std::vector<GroupSlice> slices;    // their weights (filters, next layers' inputs) and norm scales
};
GroupSlices channel_group_slices(const ir::Model& model, const StructuredOptions& opts = {});

/// What the data-driven criterion opts.criterion ranks channels by, from at most calib.batches
/// batches of `data`: taylor's gradient saliencies (compute_saliency()), or activation's mean
/// activation magnitudes (Minitron): per tensor that a layer with a weight reads along a group's
/// channels (its data input: a CNN's feature map after normalisation and activation, an MLP's
/// intermediate activations, the attention output before its projection; each tensor once), a
/// channel's mean |x| over batch and positions (spatial positions or tokens), a head's (unit
/// kHead) mean L2 norm over its features; a channel's score is the sum over those tensors. Throws
/// lopper::Error on bad options, a criterion that needs no data, or data that gives no batch.
Saliency structured_saliency(const ir::Model& model, const StructuredOptions& opts,
                             DataLoader& data, const CalibrationOptions& calib);

/// Removes channels (or heads) from `model` as `opts` says: parameters are sliced, shape constants
/// and group attributes rewritten. Amount 0 leaves the model unchanged. Throws lopper::Error
/// ("[prune] ...") on bad options, when a data-driven criterion has no `saliency`, and when no
/// group can be pruned; the model is untouched then.
StructuredReport prune_structured(ir::Model& model, const StructuredOptions& opts,
                                  const Saliency* saliency = nullptr);

}  // namespace lopper
