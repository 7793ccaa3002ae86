// Channel rules: how an op carries prunable channels from its inputs to its outputs and to its
// weights. The dependency graph (src/prune/depgraph.cpp) is built from these rules alone; an op
// without one is a barrier that structured pruning never crosses. Internal header.
//
// A channel is an "atom": one unit that a structured prune keeps or removes everywhere at once.
// A value carries at most one tracked axis, and for each index along it the atom that index belongs
// to (several indices may hold the same atom: Flatten after a Conv makes each channel a block of
// features). Rules connect atoms: `couple` makes two atoms one (a residual Add), `fresh` makes new
// ones (a Conv's output channels), `pin` forbids removing them (a graph output, a barrier).
// Parameters and shape constants that must shrink with the atoms are recorded as edits and carried
// out when the channels are removed.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "ops/op.h"

namespace lopper::ops {

/// A value's tracked axis and the atom of each index along it; axis < 0 when untracked.
struct Tracked {
  int64_t axis = -1;
  std::vector<int64_t> atoms;
  bool tracked() const { return axis >= 0; }
};

/// One entry of a shape vector (or scalar) computed at run time, as the dependency graph follows
/// its arithmetic: Shape -> Gather / Slice -> Unsqueeze -> Concat with constants -> Reshape, and
/// Mul / Div / Add / Sub of such scalars (hidden = heads * head_dim), as TorchScript's and
/// torch.export's attention compute their reshape targets when the batch and sequence are dynamic.
struct ShapeEntry {
  enum class Kind {
    kLiteral,   // an element of a constant, carried unchanged (Concat, Gather, Unsqueeze, Cast):
                // the edits can rewrite it
    kConstant,  // computed from constants only
    kDim,       // a run-time size of an axis without channels (batch, sequence), or arithmetic on
                // such sizes and constants: the same after any prune
    kChannels,  // num / den * the number of `atoms` (a tracked axis read by Shape): follows the
                // channels by itself
    kOther,     // not followed (`why` says what stops it)
  };
  Kind kind = Kind::kOther;
  int64_t value = 0;           // in the analysis run
  std::vector<int64_t> atoms;  // kChannels: the axis read; kOther: the channels it depends on
  int64_t num = 1, den = 1;    // kChannels
  // kLiteral: the constant's place: from the reader's input, the input followed at each node
  // back to the constant, and the element of it.
  std::vector<size_t> hops;
  int64_t offset = 0;
  std::string why;  // kOther
};

/// What a parameter slice is, for the importance scores.
enum class ParamRole {
  kWeightOut,  // a layer's weight along its output channels (a filter, a neuron's row)
  kWeightIn,   // a layer's weight along its input channels
  kNormScale,  // BatchNormalization / InstanceNormalization / LayerNormalization gamma
  kOther,      // biases, running statistics, per-channel constants
};

/// Carries out one edit when channels are removed.
class ChannelEditor {
 public:
  virtual ~ChannelEditor() = default;
  virtual bool removed(int64_t atom) const = 0;
  /// The node the edit belongs to (its attributes may be rewritten).
  virtual ir::Node& node() = 0;
  /// The current value of a constant input (initializer, Constant node, or either through a
  /// Transpose), after the edits before this one.
  virtual at::Tensor constant(size_t input) = 0;
  /// Replaces a constant input's value. A tensor read by other nodes too is copied for this node.
  virtual void set_constant(size_t input, const at::Tensor& value) = 0;
  /// Rewrites the constant behind entry `e` (a kLiteral of ChannelContext::shape_entries(input))
  /// to `value`, for this node only: shape arithmetic that other nodes read too is copied first.
  virtual void set_shape_entry(size_t input, const ShapeEntry& e, int64_t value) = 0;
  /// Indices along an axis of `atoms.size()` whose atom stays.
  std::vector<int64_t> kept(const std::vector<int64_t>& atoms) const {
    std::vector<int64_t> k;
    for (size_t i = 0; i < atoms.size(); ++i)
      if (!removed(atoms[i])) k.push_back(int64_t(i));
    return k;
  }
};
using ChannelEdit = std::function<void(ChannelEditor&)>;

/// What every rule of the dependency graph sees of a node: its attributes, the model's opset for
/// its domain, its inputs' static shapes from one run and their tracked axes.
class RuleContext : public AttrReader {
 public:
  using AttrReader::AttrReader;
  virtual ~RuleContext() = default;

  virtual int64_t opset() const = 0;
  virtual size_t num_inputs() const = 0;
  /// Static shapes seen when the model ran once; empty for a missing input.
  virtual const std::vector<int64_t>& in_shape(size_t i) const = 0;
  /// The tracked axis of input i, or nullptr.
  virtual const Tracked* in(size_t i) const = 0;
};

/// What a channel rule sees (the node, static shapes from one run, the tracked inputs) and does.
class ChannelContext : public RuleContext {
 public:
  using RuleContext::RuleContext;

  /// --structured head: a hidden axis split into [heads, head_dim] follows whole heads (the outer
  /// axis) rather than one head_dim shared by all heads (the inner axis, fewest atoms merged).
  virtual bool whole_heads() const = 0;
  virtual size_t num_outputs() const = 0;
  virtual bool has_input(size_t i) const = 0;
  virtual const std::vector<int64_t>& out_shape(size_t i) const = 0;
  /// Input i's value when it is constant (initializer, Constant node, a Transpose of either, or
  /// for a shape operand — a Reshape target, Expand shape, Slice bounds, Split sizes ... — a
  /// computation on constants only); undefined otherwise.
  virtual at::Tensor constant(size_t i) const = 0;

  /// Input i's value as seen in the analysis run, when it is a small integer tensor (shape
  /// arithmetic computed at run time); undefined otherwise.
  virtual at::Tensor recorded(size_t i) const = 0;
  /// Input i entry by entry when it is an integer vector or scalar computed at run time (see
  /// ShapeEntry); nullptr when it is not one (or is a constant: constant()).
  virtual const std::vector<ShapeEntry>* shape_entries(size_t i) const = 0;
  /// When input i is (part of) a shape read from a tracked tensor: the position of the channel
  /// count in it and the channels; nullptr otherwise.
  virtual const Tracked* shape_in(size_t i) const = 0;
  /// Output o is a shape vector holding the channel count of `t.atoms` at position `t.axis`.
  virtual void set_shape_out(size_t o, Tracked t) = 0;
  /// This node's outputs do not depend on input i's channel count (a Gather that picks another
  /// dim of a shape, a Reshape target rewritten as a constant). Otherwise every output of a node
  /// that reads a value derived from a channel count is derived from it too, and one that reaches
  /// a graph output pins those channels.
  virtual void independent_of(size_t i) = 0;

  virtual void set_out(size_t o, Tracked t) = 0;
  /// New atoms, one per index (the output channels of a layer). Their source is this node.
  virtual std::vector<int64_t> fresh(int64_t n) = 0;
  /// Makes a[i] and b[i] one atom for every i (sizes must agree).
  virtual void couple(const std::vector<int64_t>& a, const std::vector<int64_t>& b) = 0;
  /// These atoms can never be removed; `why` goes in the report.
  virtual void pin(const std::vector<int64_t>& atoms, const std::string& why) = 0;
  /// Pins every tracked input: this node cannot follow a change of its channels.
  void barrier(const std::string& why) {
    for (size_t i = 0; i < num_inputs(); ++i)
      if (const Tracked* t = in(i)) pin(t->atoms, why);
  }
  /// Constant input `input` shrinks along `axis` with `atoms` (its size along the axis).
  virtual void slice(size_t input, int64_t axis, const std::vector<int64_t>& atoms,
                     ParamRole role) = 0;
  /// Any other edit (shape constants, attributes); run in the order recorded.
  virtual void edit(ChannelEdit e) = 0;
  /// The atoms split into `blocks` equal contiguous blocks must lose as many atoms from each
  /// (grouped convolution).
  virtual void equal_blocks(const std::vector<int64_t>& atoms, int64_t blocks) = 0;
  /// Marks these atoms as attention heads (for --structured head) of `head_dim` features each.
  virtual void mark_heads(const std::vector<int64_t>& atoms, int64_t head_dim) = 0;
  /// Whether an earlier split made whole heads of `head_dim` features (grouped-query attention:
  /// the key/value split [.., 2, head_dim] follows the query split [.., 4, head_dim]).
  virtual bool head_dim_seen(int64_t head_dim) const = 0;
};

using ChannelRule = std::function<void(ChannelContext&)>;

/// What a shape-arithmetic rule sees (the node, static shapes from one run, its inputs entry by
/// entry, the tracked axes): the rule gives its first output's entries, or nothing when it does
/// not follow them (the dependency graph then sees a value it cannot rewrite).
class ShapeArithContext : public RuleContext {
 public:
  using RuleContext::RuleContext;

  /// Output o's rank and element count when it was seen (-1 when not, and the count -1 too
  /// when it is no scalar or vector).
  virtual int64_t out_rank(size_t o) const = 0;
  virtual int64_t out_numel(size_t o) const = 0;
  /// Input i entry by entry: computed shape arithmetic, or a small integer constant's elements
  /// (kLiteral, kConstant); nothing for any other input.
  virtual std::optional<std::vector<ShapeEntry>> entries(size_t i) const = 0;
  /// Input i's values when every entry is a literal or a constant.
  std::optional<std::vector<int64_t>> constant_values(size_t i) const {
    auto e = entries(i);
    if (!e) return std::nullopt;
    std::vector<int64_t> v;
    for (const auto& x : *e) {
      if (x.kind != ShapeEntry::Kind::kLiteral && x.kind != ShapeEntry::Kind::kConstant)
        return std::nullopt;
      v.push_back(x.value);
    }
    return v;
  }
  /// The channels input i's value depends on (a size of a tensor whose shape follows channel
  /// counts), or nullptr.
  virtual const std::vector<int64_t>* depends_on(size_t i) const = 0;
};

// Shape-arithmetic rules and helpers shared by several op families (src/ops/channel_rules.cpp).
namespace shape_rules {
/// `e` carried through input `hop` unchanged: its literals remember the way back to their
/// constant.
std::vector<ShapeEntry> via(std::vector<ShapeEntry> e, size_t hop);
/// An entry not followed, depending on `atoms`, and why.
ShapeEntry other(std::vector<int64_t> atoms, std::string why);
/// Input 0's entries, unchanged (Identity, Reshape, Flatten, Squeeze, Unsqueeze).
std::optional<std::vector<ShapeEntry>> same(const ShapeArithContext& c);
/// a (op) b entry by entry, numpy broadcasting a scalar: Add, Sub, Mul, Div.
std::optional<std::vector<ShapeEntry>> arithmetic(const ShapeArithContext& c);
}  // namespace shape_rules

// Rules shared by several op families (src/ops/channel_rules.cpp).
namespace channel_rules {
/// Elementwise, one output, numpy broadcasting (Add, Mul, Where, Max, PRelu ...): tracked axes
/// that land on the same output axis are coupled; constants with the channel's size along it are
/// sliced; an untracked activation that has it pins the channels.
void broadcast(ChannelContext& c);
/// Output 0 = input 0's channels (activations, Dropout, Cast, Identity ...).
void same(ChannelContext& c);
/// Per-channel ops on [N, C, ...] (pooling, Resize with scale 1 on C ...): channels must be axis 1.
void spatial(ChannelContext& c);
/// A reshape (Reshape, Flatten, Squeeze, Unsqueeze): maps the tracked axis by the in/out shapes;
/// `target_input` >= 0 is the input whose constant holds the target shape (rewritten).
void reshape(ChannelContext& c, int64_t target_input);
}  // namespace channel_rules

}  // namespace lopper::ops
