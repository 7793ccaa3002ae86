// The inference rewrites' common ground (internal): a Rewrite holds the graph one pass changes and
// the index of its live nodes, kept up to date by each edit, so that every lookup (the node that
// makes a value, its readers, an initializer by name) takes constant time; and the matchers the
// passes share (the activations a fused node absorbs).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ir/index.h"
#include "lopper/graph.h"

namespace lopper::exec::fusion {

/// Whether `n` is the default domain's `op`.
bool is(const ir::Node& n, const char* op);
/// How many of its outputs `n` writes (a name left empty is an output not asked for).
int outputs_used(const ir::Node& n);
using ir::float_attr;
using ir::int_attr;
using ir::string_attr;
/// The input of the two-input `n` other than `v`; "" when `n` does not read `v` so.
std::string other_input(const ir::Node& n, const std::string& v);

/// What a fused node takes over from the nodes after it: the value it writes in the end, the
/// nodes it absorbs, the attributes of the activation it applies.
struct Absorbed {
  std::string out;
  std::vector<size_t> nodes;
  std::vector<ir::Attribute> act;
  /// Takes node `i`, whose output `v` the fused node writes instead.
  void take(size_t i, const std::string& v) {
    nodes.push_back(i);
    out = v;
  }
};

/// One pass's view of a graph: the nodes it removed stay in place (their indices valid) until
/// finish() drops them. Every change goes through change()/commit(), remove() or
/// add_initializer(), which keep the index of the live nodes true.
class Rewrite {
 public:
  Rewrite(ir::Graph& g, int64_t opset);

  ir::Graph& g;
  /// The model's default-domain opset (what an attribute or input means depends on it).
  const int64_t opset;

  size_t size() const { return g.nodes.size(); }
  bool live(size_t i) const { return !removed_[i]; }

  /// Whether node `i` is live, the default domain's `op`, and writes one output, its first.
  bool writes_one(size_t i, const char* op) const {
    const ir::Node& n = g.nodes[i];
    return live(i) && is(n, op) && outputs_used(n) == 1 && !n.outputs[0].empty();
  }
  /// The live node that makes `v`.
  std::optional<size_t> producer(const std::string& v) const;
  /// That node, when it is the default domain's `op`.
  std::optional<size_t> made_by(const std::string& v, const char* op) const;
  /// Whether `v` is read exactly once, by a live node, and is no graph output.
  bool single(const std::string& v) const;
  /// How many times live nodes read `v` (graph outputs count once each).
  size_t uses(const std::string& v) const { return index_.uses(v); }
  bool is_output(const std::string& v) const { return index_.is_output(v); }
  /// The live nodes that read `v`, each once.
  const std::vector<size_t>& readers(const std::string& v) const { return index_.readers(v); }
  /// The one node that reads `v` when single(v) (and is the default domain's `op`, if given).
  std::optional<size_t> reader(const std::string& v, const char* op = nullptr) const;
  const ir::Initializer* initializer(const std::string& name) const {
    return index_.find_initializer(name);
  }
  /// The value of `name` when it is an initializer of one floating-point element.
  std::optional<float> scalar(const std::string& name) const;
  /// Whether scalar(name) is `want` (to a relative 1e-4).
  bool scalar_is(const std::string& name, double want) const;

  /// Node `i`, about to be edited: the index forgets it until commit().
  ir::Node& change(size_t i);
  /// Records the nodes changed since the last commit() as they are now.
  void commit();
  /// Removes live node `i` (call before commit() when a changed node takes over its outputs).
  void remove(size_t i);
  /// Appends an initializer (pointers to the graph's initializers do not survive this).
  void add_initializer(ir::Initializer t);
  /// Drops the initializer `name` at finish() (no live node may read it by then).
  void drop_initializer(const std::string& name) { dropped_.push_back(name); }
  /// Drops the removed nodes and initializers; whether the pass changed the graph.
  bool finish();

  /// The activation attributes of a fused node (`activation`, `activation_alpha`, ...) when `n`
  /// is an activation lopper fuses.
  std::optional<std::vector<ir::Attribute>> activation_of(const ir::Node& n) const;
  /// When the only reader of `a.out` is such an activation, or `a.out` is gated by itself
  /// (Mul(x, Sigmoid(x)) is SiLU, Mul(x, HardSigmoid(x)) HardSwish): `a` takes it, its attributes
  /// becoming a.act.
  void absorb_activation(Absorbed& a) const;
  /// Makes node `i` the fused node ai.lopper.`op` writing a.out with a.act, and removes the nodes
  /// `a` took.
  void fuse_into(size_t i, const char* op, const Absorbed& a);

 private:
  ir::GraphIndex index_;
  std::vector<bool> removed_;
  std::vector<size_t> changing_;
  std::vector<std::string> dropped_;
  bool changed_ = false;
};

}  // namespace lopper::exec::fusion
