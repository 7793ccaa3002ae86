// The dependency graph over a model's channels, built from the op table's channel rules
// (ops/channels.h) in one topological pass. Internal header.
#pragma once

#include <ATen/core/Tensor.h>

#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "ir/index.h"
#include "lopper/analysis.h"
#include "lopper/graph.h"
#include "ops/channels.h"

namespace lopper::depgraph {

/// A constant input as the rules see it: an initializer or a Constant node's value, possibly read
/// through a Transpose (perm non-empty).
struct ConstRef {
  std::string name;  // the initializer, or the Constant node's output
  bool is_initializer = true;
  std::vector<int64_t> perm;  // the Transpose between it and the reader
};

struct Slice {
  size_t node = 0;  // index in graph.nodes
  size_t input = 0;
  int64_t axis = 0;  // in the reader's view (through the Transpose)
  std::vector<int64_t> atoms;
  ops::ParamRole role = ops::ParamRole::kOther;
  at::Tensor value;  // the reader's view of the tensor before any edit
  ConstRef ref;
};

struct Edit {
  size_t node = 0;
  ops::ChannelEdit fn;
  std::vector<int64_t> atoms;  // what it follows: a slice's atoms, else the node's tracked inputs'
};

struct DepGraph {
  std::vector<int64_t> parent;      // union-find over atoms
  std::vector<size_t> source;       // per atom: the node that made it
  std::vector<std::string> pinned;  // per atom: why it must stay (empty: free)
  std::vector<char> head;           // per atom: part of an attention head split
  std::vector<Slice> slices;
  std::vector<Edit> edits;  // slices included, in the order recorded
  std::vector<std::pair<std::vector<int64_t>, int64_t>> blocks;  // equal_blocks constraints
  // Tracked values with atoms of their own (a Split output, a Slice, a Concat): each must keep one.
  std::vector<std::vector<int64_t>> parts;
  std::vector<std::string> barriers;        // once each
  std::vector<std::string> tracked_values;  // values whose shape may change
  // Shape operands computed from constants only, with their value (the rules see them as
  // constants; an edit gives its node an initializer instead).
  std::unordered_map<std::string, at::Tensor> folded;
  std::set<int64_t> head_dims;  // features per head of the whole-head splits so far

  int64_t find(int64_t a) {
    while (parent[a] != a) a = parent[a] = parent[parent[a]];
    return a;
  }
  void unite(int64_t a, int64_t b) {
    a = find(a), b = find(b);
    if (a != b) parent[std::max(a, b)] = std::min(a, b);
  }
};

/// Runs every node's channel rule over `model` with the shapes of one run. `whole_heads`: see
/// ops::ChannelContext::whole_heads.
DepGraph build(const ir::Model& model, const NodeShapes& shapes, bool whole_heads);

/// Pins `atoms` (those not pinned yet) for `where`, and lists `where` once among the barriers.
void pin_atoms(DepGraph& dg, const std::vector<int64_t>& atoms, const std::string& where);

/// Resolves `name` to a constant (initializer, Constant node, or a Transpose of either), looked
/// up in `index` (an index of `g`).
bool resolve_constant(const ir::Graph& g, const ir::GraphIndex& index, const std::string& name,
                      ConstRef& ref, at::Tensor& value);

/// Carries out the edits on `model` (which must be the model `dg` was built from), with
/// `removed(root)` saying which atom classes go.
void apply(ir::Model& model, DepGraph& dg, const std::vector<char>& removed_class);

}  // namespace lopper::depgraph
