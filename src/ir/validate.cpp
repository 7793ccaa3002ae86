// One pass over an imported model: what every command relies on (see validate in graph.h).
#include <algorithm>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "lopper/error.h"
#include "lopper/graph.h"

namespace lopper::ir {
namespace {

using Names = std::unordered_set<std::string>;

std::string node_str(const Node& n) { return "node '" + n.label() + "' (" + n.op_type + ")"; }

// "graph 'main'" for the model's graph, "subgraph 'body'" inside a node.
std::string graph_str(const Graph& g, int depth) {
  return (depth ? "subgraph '" : "graph '") + g.name + "'";
}

// Names the nodes of a cycle among `pending` (nodes Kahn's algorithm could not order): every such
// node waits on another such node, so walking back along waiting edges must come round.
std::string cycle_str(const Graph& g, const std::vector<std::vector<size_t>>& deps,
                      const std::vector<size_t>& pending) {
  size_t start = 0;
  while (pending[start] == 0) ++start;
  std::vector<size_t> walk;
  std::unordered_map<size_t, size_t> seen;  // node -> position in walk
  size_t u = start;
  while (!seen.count(u)) {
    seen[u] = walk.size();
    walk.push_back(u);
    for (size_t d : deps[u])
      if (pending[d] > 0) {
        u = d;
        break;
      }
  }
  // walk[seen[u]..] is the cycle, each node waiting on the next: print it in data-flow order.
  std::vector<size_t> cycle(walk.begin() + static_cast<std::ptrdiff_t>(seen[u]), walk.end());
  std::reverse(cycle.begin(), cycle.end());
  std::rotate(cycle.begin(), std::min_element(cycle.begin(), cycle.end()), cycle.end());
  std::string path;
  for (size_t i = 0; i < cycle.size() && i < 6; ++i)
    path += "'" + g.nodes[cycle[i]].label() + "' -> ";
  path += cycle.size() > 6 ? "..." : "'" + g.nodes[cycle[0]].label() + "'";
  return "through " + node_str(g.nodes[cycle[0]]) + ": " + path;
}

// `outer`: the names every enclosing scope defines (empty for the model's graph).
void validate_graph(const Graph& g, const std::vector<const Names*>& outer, int depth) {
  LOPPER_CHECK(depth < 64, "[import] subgraphs nested too deeply");
  const std::string where = graph_str(g, depth);
  Names inputs, local;
  for (const auto& v : g.inputs) inputs.insert(v.name);
  std::unordered_map<std::string, const Initializer*> inits;
  for (const auto& t : g.initializers) {
    auto [it, fresh] = inits.emplace(t.name, &t);
    if (!fresh && it->second->sparse != t.sparse)
      throw Error(detail::concat("[import] ", where, ": '", t.name,
                                 "' is both an initializer and a sparse initializer"));
    LOPPER_CHECK(fresh, "[import] ", where, ": initializer '", t.name, "' is defined twice");
  }
  local = inputs;
  for (const auto& [name, t] : inits) local.insert(name);

  std::unordered_map<std::string, size_t> producer;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    for (const auto& o : n.outputs) {
      if (o.empty()) continue;
      auto [it, fresh] = producer.emplace(o, i);
      if (!fresh)
        throw Error(detail::concat("[import] ", where, ": value '", o, "' is written by ",
                                   node_str(g.nodes[it->second]),
                                   it->second == i ? " twice" : " and by " + node_str(n)));
      LOPPER_CHECK(!inputs.count(o), "[import] ", node_str(n), " writes '", o,
                   "', which is an input of ", where);
      LOPPER_CHECK(!inits.count(o), "[import] ", node_str(n), " writes '", o,
                   "', which is an initializer of ", where);
      local.insert(o);
    }
  }

  std::vector<const Names*> scopes = outer;
  scopes.push_back(&local);
  auto visible = [&](const std::string& name) {
    for (const Names* s : scopes)
      if (s->count(name)) return true;
    return false;
  };
  std::vector<std::vector<size_t>> deps(g.nodes.size());
  std::vector<std::vector<size_t>> users(g.nodes.size());
  std::vector<size_t> pending(g.nodes.size(), 0);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    for (const auto& in : n.inputs) {
      auto it = producer.find(in);
      LOPPER_CHECK(it == producer.end() || it->second != i, "[import] ", where,
                   " has a cycle: ", node_str(n), " reads its own output '", in, "'");
      LOPPER_CHECK(in.empty() || visible(in), "[import] ", node_str(n), " reads '", in,
                   "', which no node, input or initializer of ", where, " provides");
    }
    for (const auto& a : n.attrs) {
      if (a.g) validate_graph(*a.g, scopes, depth + 1);
      for (const auto& sub : a.graphs)
        if (sub) validate_graph(*sub, scopes, depth + 1);
    }
    Names seen;
    for (const auto& r : node_reads(n)) {
      auto it = producer.find(r);
      if (it == producer.end() || it->second == i || !seen.insert(r).second) continue;
      deps[i].push_back(it->second);
    }
    std::sort(deps[i].begin(), deps[i].end());
    deps[i].erase(std::unique(deps[i].begin(), deps[i].end()), deps[i].end());
    pending[i] = deps[i].size();
    for (size_t d : deps[i]) users[d].push_back(i);
  }
  // Kahn's algorithm: whatever it cannot order waits on a cycle.
  std::vector<size_t> ready;
  for (size_t i = 0; i < g.nodes.size(); ++i)
    if (pending[i] == 0) ready.push_back(i);
  size_t ordered = 0;
  while (!ready.empty()) {
    size_t i = ready.back();
    ready.pop_back();
    ++ordered;
    for (size_t u : users[i])
      if (--pending[u] == 0) ready.push_back(u);
  }
  if (ordered < g.nodes.size())
    throw Error(detail::concat("[import] ", where, " has a cycle ", cycle_str(g, deps, pending)));
}

}  // namespace

void validate(const Model& model) {
  for (const auto& o : model.opset_import) {
    if (!o.domain.empty() && o.domain != "ai.onnx") continue;
    LOPPER_CHECK(o.version >= kMinOpset && o.version <= kMaxOpset, "[import] ai.onnx opset ",
                 o.version, " is not supported (lopper reads opsets ", kMinOpset, " to ", kMaxOpset,
                 ")");
  }
  validate_graph(model.graph, {}, 0);
}

}  // namespace lopper::ir
