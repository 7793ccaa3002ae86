// One index of a graph's values: the node that makes each value, the nodes that read it, the
// initializers by name and the graph's outputs, built in one pass over the graph and looked up in
// constant time. The passes over a graph (the dependency graph, pruning, cost analysis, fusion)
// read it instead of scanning the nodes for each lookup. Internal header.
//
// An index describes the graph as it was when it was built: a pass that adds, removes or rewires
// nodes or initializers either records the change (add_node, add_initializer, set_input) or
// builds the index again. It holds indices into the graph's vectors, never pointers, so a vector
// that grows does not invalidate it.
#pragma once

#include <cstddef>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "lopper/graph.h"

namespace lopper::ir {

class GraphIndex {
 public:
  static constexpr size_t npos = static_cast<size_t>(-1);

  explicit GraphIndex(const Graph& g) : g_(&g) { rebuild(); }

  /// Indexes the graph again, from scratch.
  void rebuild();

  /// The index in Graph::nodes of the node that makes `value`; npos for a graph input, an
  /// initializer, "" or an unknown name.
  size_t producer(const std::string& value) const;
  /// That node, or nullptr.
  const Node* producer_node(const std::string& value) const {
    const size_t i = producer(value);
    return i == npos ? nullptr : &g_->nodes[i];
  }
  /// The nodes that read `value` (node_reads: inputs and what subgraphs capture), each once, in
  /// the order of Graph::nodes when built (recorded nodes after).
  const std::vector<size_t>& readers(const std::string& value) const;
  /// How many times `value` is read: once per node input and subgraph capture (node_reads), and
  /// once per graph output that names it.
  size_t uses(const std::string& value) const;
  bool is_output(const std::string& value) const { return outputs_.count(value) > 0; }

  /// The index in Graph::initializers of the initializer `name`, or npos.
  size_t initializer(const std::string& name) const;
  const Initializer* find_initializer(const std::string& name) const {
    const size_t i = initializer(name);
    return i == npos ? nullptr : &g_->initializers[i];
  }
  /// Whether any value, node or initializer of the graph is called `name` (for fresh names).
  bool taken(const std::string& name) const;

  /// Records node `i` (just appended to Graph::nodes): its outputs, reads and name.
  void add_node(size_t i);
  /// Forgets node `i` as it is now (its outputs and reads; its names stay taken): before the node
  /// is removed, or edited and recorded again with add_node(i).
  void remove_node(size_t i);
  /// Records initializer `i` (just appended to Graph::initializers).
  void add_initializer(size_t i);
  /// Records that one input of node `node` changed from `before` to `after` (the graph holds
  /// `after` already).
  void set_input(size_t node, const std::string& before, const std::string& after);

 private:
  void read(size_t node, const std::string& value);

  const Graph* g_;
  std::unordered_map<std::string, size_t> producer_, initializer_;
  std::unordered_map<std::string, std::vector<size_t>> readers_;
  std::unordered_map<std::string, size_t> uses_;
  std::unordered_set<std::string> outputs_, names_;
};

}  // namespace lopper::ir
