// The dependency graph: one topological pass that gives every node's channel rule its tracked
// inputs, shapes and constants, and records the atoms, couplings, pins, slices and edits the rules
// make. Then, once the caller has chosen what goes, the edits run on the model.
#include "prune/depgraph.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <map>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "ir/index.h"
#include "lopper/error.h"

namespace lopper::depgraph {

void pin_atoms(DepGraph& dg, const std::vector<int64_t>& atoms, const std::string& where) {
  bool any = false;
  for (int64_t a : atoms)
    if (dg.pinned[a].empty()) dg.pinned[a] = where, any = true;
  if (any && std::find(dg.barriers.begin(), dg.barriers.end(), where) == dg.barriers.end())
    dg.barriers.push_back(where);
}

namespace {

// Every value some node (or the graph's outputs) reads.
std::unordered_set<std::string> values_read(const ir::Graph& g) {
  std::unordered_set<std::string> read;
  for (const auto& n : g.nodes)
    for (const auto& r : ir::node_reads(n)) read.insert(r);
  for (const auto& o : g.outputs) read.insert(o.name);
  return read;
}

std::vector<int64_t> inverse(const std::vector<int64_t>& perm) {
  std::vector<int64_t> inv(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) inv[perm[i]] = int64_t(i);
  return inv;
}

using ops::ShapeEntry;
using Entries = std::vector<ShapeEntry>;
using Kind = ShapeEntry::Kind;

// Whether input i of `n` is a shape operand of its op (OpDef::shape_operands): a computation on
// constants only there is a constant to the rules (TorchScript's Where(Equal(shape, -1), 1,
// shape) before an Expand). Elsewhere (a Gather's indices: an embedding's positions) it stays
// data.
bool shape_operand(const ir::Node& n, size_t i) {
  const ops::OpDef* def = n.domain.empty() ? ops::OpTable::global().find("", n.op_type) : nullptr;
  return def && std::find(def->shape_operands.begin(), def->shape_operands.end(), i) !=
                    def->shape_operands.end();
}

bool small_int(const at::Tensor& v) {
  return v.defined() && at::isIntegralType(v.scalar_type(), false) && v.dim() <= 1 &&
         v.numel() <= 64;
}

std::vector<int64_t> values_of(const at::Tensor& v) {
  at::Tensor t = v.to(at::kLong).reshape({-1}).contiguous();
  return std::vector<int64_t>(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel());
}

// Following shape arithmetic (ops::ShapeEntry): the entries of every integer vector or scalar
// computed so far, node by node in topological order.
class ShapeFollower {
 public:
  ShapeFollower(const ir::Graph& g, const ir::GraphIndex& index,
                const std::unordered_map<std::string, at::Tensor>& folded)
      : g_(g), index_(index), folded_(folded) {}

  const ir::GraphIndex& index() const { return index_; }

  const Entries* find(const std::string& name) const {
    auto it = sym_.find(name);
    return it == sym_.end() ? nullptr : &it->second;
  }

  // After node `n` ran its rule: its outputs' entries. `tracked`: the channel axes; `taint`: the
  // channels each derived value depends on.
  void follow(const ir::Node& n, const NodeIO& io, int64_t opset,
              const std::unordered_map<std::string, ops::Tracked>& tracked,
              const std::unordered_map<std::string, std::vector<int64_t>>& taint) {
    std::optional<Entries> out;
    if (n.domain.empty() && !n.outputs.empty() && !n.outputs[0].empty())
      out = compute(n, io, opset, tracked, taint);
    for (size_t o = 0; o < n.outputs.size(); ++o) {
      if (n.outputs[o].empty()) continue;
      if (o == 0 && out) {
        sym_[n.outputs[0]] = std::move(*out);
        continue;
      }
      // Constants are read as such (entries()); the rest is what lopper does not follow.
      if (o >= io.small_ints.size() || !small_int(io.small_ints[o]) || n.op_type == "Constant" ||
          folded_.count(n.outputs[o]))
        continue;
      Entries e;
      auto t = taint.find(n.outputs[o]);
      for (int64_t v : values_of(io.small_ints[o])) {
        ShapeEntry x;
        x.kind = Kind::kOther, x.value = v;
        x.why = "it is computed by node '" + n.label() + "' (" + n.op_type +
                "), which lopper does not follow";
        if (t != taint.end()) x.atoms = t->second;
        e.push_back(std::move(x));
      }
      sym_[n.outputs[o]] = std::move(e);
    }
  }

 private:
  // Input `name` entry by entry: computed ones, or a constant's elements (literals; computed
  // from constants only: constants).
  std::optional<Entries> entries(const std::string& name) const {
    if (name.empty()) return std::nullopt;
    if (auto it = sym_.find(name); it != sym_.end()) return it->second;
    ConstRef ref;
    at::Tensor v;
    const bool literal = resolve_constant(g_, index_, name, ref, v);
    if (!literal) {
      auto f = folded_.find(name);
      if (f == folded_.end()) return std::nullopt;
      v = f->second;
    }
    if (!small_int(v)) return std::nullopt;
    Entries out;
    auto vals = values_of(v);
    for (size_t j = 0; j < vals.size(); ++j) {
      ShapeEntry e;
      e.kind = literal ? Kind::kLiteral : Kind::kConstant;
      e.value = vals[j], e.offset = int64_t(j);
      out.push_back(std::move(e));
    }
    return out;
  }
  // What an op's shape rule (OpDef::shape) sees of node `n`.
  class Context : public ops::ShapeArithContext {
   public:
    Context(const ShapeFollower& f, const ir::Node& n, const NodeIO& io, int64_t opset,
            const std::unordered_map<std::string, ops::Tracked>& tracked,
            const std::unordered_map<std::string, std::vector<int64_t>>& taint)
        : ShapeArithContext(n), f_(f), io_(io), opset_(opset), tracked_(tracked), taint_(taint) {}
    int64_t opset() const override { return opset_; }
    size_t num_inputs() const override { return node().inputs.size(); }
    const std::vector<int64_t>& in_shape(size_t i) const override {
      static const std::vector<int64_t> none;
      return i < io_.in.size() ? io_.in[i] : none;
    }
    int64_t out_rank(size_t o) const override {
      return o < io_.out.size() ? int64_t(io_.out[o].size()) : -1;
    }
    int64_t out_numel(size_t o) const override {
      if (o >= io_.out.size() || io_.out[o].size() > 1) return -1;
      int64_t k = 1;
      for (int64_t d : io_.out[o]) k *= d;
      return k;
    }
    std::optional<Entries> entries(size_t i) const override {
      return i < node().inputs.size() ? f_.entries(node().inputs[i]) : std::nullopt;
    }
    const ops::Tracked* in(size_t i) const override {
      if (i >= node().inputs.size()) return nullptr;
      auto t = tracked_.find(node().inputs[i]);
      return t == tracked_.end() ? nullptr : &t->second;
    }
    const std::vector<int64_t>* depends_on(size_t i) const override {
      if (i >= node().inputs.size()) return nullptr;
      auto t = taint_.find(node().inputs[i]);
      return t == taint_.end() ? nullptr : &t->second;
    }

   private:
    const ShapeFollower& f_;
    const NodeIO& io_;
    const int64_t opset_;
    const std::unordered_map<std::string, ops::Tracked>& tracked_;
    const std::unordered_map<std::string, std::vector<int64_t>>& taint_;
  };

  // The entries of node `n`'s first output, by its op's shape rule.
  std::optional<Entries> compute(
      const ir::Node& n, const NodeIO& io, int64_t opset,
      const std::unordered_map<std::string, ops::Tracked>& tracked,
      const std::unordered_map<std::string, std::vector<int64_t>>& taint) const {
    const ops::OpDef* def = ops::OpTable::global().find("", n.op_type);
    if (!def || !def->shape) return std::nullopt;
    return def->shape(Context(*this, n, io, opset, tracked, taint));
  }

  const ir::Graph& g_;
  const ir::GraphIndex& index_;
  const std::unordered_map<std::string, at::Tensor>& folded_;
  std::unordered_map<std::string, Entries> sym_;
};

class Context final : public ops::ChannelContext {
 public:
  Context(const ir::Model& m, size_t index, const NodeIO& io, DepGraph& dg,
          std::unordered_map<std::string, ops::Tracked>& tracked, bool whole_heads,
          const std::unordered_map<std::string, at::Tensor>& recorded,
          std::unordered_map<std::string, ops::Tracked>& shapes_of, const ShapeFollower& follower)
      : ChannelContext(m.graph.nodes[index]),
        model_(m),
        index_(index),
        io_(io),
        dg_(dg),
        tracked_(tracked),
        whole_heads_(whole_heads),
        recorded_(recorded),
        shapes_of_(shapes_of),
        follower_(follower) {}

  const Entries* shape_entries(size_t i) const override {
    return has_input(i) ? follower_.find(node().inputs[i]) : nullptr;
  }
  at::Tensor recorded(size_t i) const override {
    if (!has_input(i)) return {};
    auto it = recorded_.find(node().inputs[i]);
    return it == recorded_.end() ? at::Tensor() : it->second;
  }
  const ops::Tracked* shape_in(size_t i) const override {
    if (!has_input(i)) return nullptr;
    auto it = shapes_of_.find(node().inputs[i]);
    return it == shapes_of_.end() ? nullptr : &it->second;
  }
  void set_shape_out(size_t o, ops::Tracked t) override {
    if (o >= node().outputs.size() || node().outputs[o].empty()) return;
    derived_.emplace_back(o, t.atoms);
    shapes_of_[node().outputs[o]] = std::move(t);
  }
  void independent_of(size_t i) override { independent_.push_back(i); }
  const std::vector<size_t>& independent() const { return independent_; }
  const std::vector<std::pair<size_t, std::vector<int64_t>>>& derived() const { return derived_; }

  bool whole_heads() const override { return whole_heads_; }
  int64_t opset() const override { return model_.opset(node().domain); }
  size_t num_inputs() const override { return node().inputs.size(); }
  size_t num_outputs() const override { return node().outputs.size(); }
  bool has_input(size_t i) const override {
    return i < node().inputs.size() && !node().inputs[i].empty();
  }
  const std::vector<int64_t>& in_shape(size_t i) const override {
    return i < io_.in.size() ? io_.in[i] : empty_;
  }
  const std::vector<int64_t>& out_shape(size_t i) const override {
    return i < io_.out.size() ? io_.out[i] : empty_;
  }
  const ops::Tracked* in(size_t i) const override {
    if (!has_input(i)) return nullptr;
    auto it = tracked_.find(node().inputs[i]);
    return it == tracked_.end() ? nullptr : &it->second;
  }
  at::Tensor constant(size_t i) const override {
    if (!has_input(i)) return {};
    ConstRef ref;
    at::Tensor v;
    if (resolve_constant(model_.graph, follower_.index(), node().inputs[i], ref, v)) return v;
    auto f = dg_.folded.find(node().inputs[i]);
    return f != dg_.folded.end() && shape_operand(node(), i) ? f->second : at::Tensor();
  }
  void set_out(size_t o, ops::Tracked t) override {
    if (o >= node().outputs.size() || node().outputs[o].empty()) return;
    const auto& shape = out_shape(o);
    if (t.axis < 0 || t.axis >= int64_t(shape.size()) || shape[t.axis] != int64_t(t.atoms.size())) {
      pin(t.atoms, "channel rule of " + node().op_type + " disagrees with the shapes");
      return;
    }
    dg_.tracked_values.push_back(node().outputs[o]);
    bool own = true;  // not an input's atoms passed on: one that may lose all of them
    for (size_t i = 0; i < num_inputs() && own; ++i)
      if (const ops::Tracked* x = in(i)) own = x->atoms != t.atoms;
    if (own) dg_.parts.push_back(t.atoms);
    tracked_[node().outputs[o]] = std::move(t);
  }
  std::vector<int64_t> fresh(int64_t n) override {
    std::vector<int64_t> out;
    for (int64_t i = 0; i < n; ++i) {
      int64_t a = int64_t(dg_.parent.size());
      dg_.parent.push_back(a);
      dg_.source.push_back(index_);
      dg_.pinned.emplace_back();
      dg_.head.push_back(0);
      out.push_back(a);
    }
    return out;
  }
  void couple(const std::vector<int64_t>& a, const std::vector<int64_t>& b) override {
    LOPPER_ASSERT(a.size() == b.size(), "couple of ", a.size(), " and ", b.size(), " atoms");
    for (size_t i = 0; i < a.size(); ++i) dg_.unite(a[i], b[i]);
  }
  void pin(const std::vector<int64_t>& atoms, const std::string& why) override {
    pin_atoms(dg_, atoms, "node '" + node().label() + "' (" + node().op_type + "): " + why);
  }
  void slice(size_t input, int64_t axis, const std::vector<int64_t>& atoms,
             ops::ParamRole role) override {
    Slice s;
    s.node = index_, s.input = input, s.axis = axis, s.atoms = atoms, s.role = role;
    if (!has_input(input) ||
        !resolve_constant(model_.graph, follower_.index(), node().inputs[input], s.ref, s.value) ||
        axis >= s.value.dim() || s.value.size(axis) != int64_t(atoms.size())) {
      pin(atoms, "a parameter that cannot follow the channels");
      return;
    }
    dg_.slices.push_back(s);
    dg_.edits.push_back({index_,
                         [input, axis, atoms](ops::ChannelEditor& e) {
                           auto keep = e.kept(atoms);
                           if (keep.size() == atoms.size()) return;
                           at::Tensor t = e.constant(input);
                           e.set_constant(input,
                                          t.index_select(axis, at::tensor(keep)).contiguous());
                         },
                         atoms});
  }
  void edit(ops::ChannelEdit e) override {
    std::vector<int64_t> atoms;
    for (size_t i = 0; i < num_inputs(); ++i)
      if (const ops::Tracked* t = in(i))
        atoms.insert(atoms.end(), t->atoms.begin(), t->atoms.end());
    dg_.edits.push_back({index_, std::move(e), std::move(atoms)});
  }
  void equal_blocks(const std::vector<int64_t>& atoms, int64_t blocks) override {
    dg_.blocks.emplace_back(atoms, blocks);
  }
  void mark_heads(const std::vector<int64_t>& atoms, int64_t head_dim) override {
    for (int64_t a : atoms) dg_.head[a] = 1;
    if (head_dim > 0) dg_.head_dims.insert(head_dim);
  }
  bool head_dim_seen(int64_t head_dim) const override { return dg_.head_dims.count(head_dim) > 0; }

 private:
  const ir::Model& model_;
  size_t index_;
  const NodeIO& io_;
  DepGraph& dg_;
  std::unordered_map<std::string, ops::Tracked>& tracked_;
  std::vector<int64_t> empty_;
  bool whole_heads_;
  const std::unordered_map<std::string, at::Tensor>& recorded_;
  std::unordered_map<std::string, ops::Tracked>& shapes_of_;
  const ShapeFollower& follower_;
  std::vector<size_t> independent_;
  std::vector<std::pair<size_t, std::vector<int64_t>>> derived_;
};

class Editor final : public ops::ChannelEditor {
 public:
  Editor(ir::Graph& g, ir::GraphIndex& ix, size_t index, const DepGraph& dg,
         const std::vector<char>& removed, std::unordered_set<std::string>& replaced,
         std::vector<std::pair<std::string, std::string>>& copies,
         std::vector<std::pair<std::string, std::string>>* node_copies = nullptr)
      : g_(g),
        ix_(ix),
        index_(index),
        dg_(dg),
        removed_(removed),
        replaced_(replaced),
        copies_(copies),
        node_copies_(node_copies) {}

  bool removed(int64_t atom) const override {
    return removed_[const_cast<DepGraph&>(dg_).find(atom)] != 0;
  }
  ir::Node& node() override { return g_.nodes[index_]; }
  at::Tensor constant(size_t input) override { return constant_at(index_, input); }
  void set_constant(size_t input, const at::Tensor& value) override {
    set_constant_at(index_, input, value);
  }
  void set_shape_entry(size_t input, const ops::ShapeEntry& e, int64_t value) override {
    LOPPER_ASSERT(e.kind == ops::ShapeEntry::Kind::kLiteral, "set_shape_entry of a computed entry");
    size_t reader = index_, slot = input;
    for (size_t hop : e.hops) {
      const std::string name = g_.nodes[reader].inputs.at(slot);
      size_t p = producer_index(name);
      if (readers(name) > 1) p = copy_for(p, reader, slot);
      reader = p, slot = hop;
    }
    at::Tensor t = constant_at(reader, slot);
    at::Tensor v = t.to(at::kLong).clone().contiguous();
    LOPPER_ASSERT(e.offset < v.numel(), "shape entry ", e.offset, " of ", v.numel());
    v.data_ptr<int64_t>()[e.offset] = value;
    set_constant_at(reader, slot, v.to(t.scalar_type()));
  }

 private:
  at::Tensor constant_at(size_t index, size_t input) {
    const ir::Node& n = g_.nodes[index];
    ConstRef ref;
    at::Tensor v;
    if (input < n.inputs.size() && resolve_constant(g_, ix_, n.inputs[input], ref, v)) return v;
    auto f = input < n.inputs.size() ? dg_.folded.find(n.inputs[input]) : dg_.folded.end();
    LOPPER_ASSERT(f != dg_.folded.end(), "edit of a non-constant input ", input, " of ", n.label());
    return f->second;
  }
  void set_constant_at(size_t index, size_t input, const at::Tensor& value) {
    ir::Node& n = g_.nodes[index];
    if (input >= n.inputs.size()) n.inputs.resize(input + 1);
    ConstRef ref;
    at::Tensor old;
    const bool known =
        !n.inputs[input].empty() && resolve_constant(g_, ix_, n.inputs[input], ref, old);
    const bool direct = known && n.inputs[input] == ref.name;
    if (known && readers(n.inputs[input]) == 1 && (direct || readers(ref.name) == 1)) {
      at::Tensor v = ref.perm.empty() ? value : value.permute(inverse(ref.perm)).contiguous();
      if (ref.is_initializer) {
        g_.initializers[ix_.initializer(ref.name)].value = v.contiguous();
        replaced_.insert(ref.name);  // its declared shape (value_info, graph input) is stale
      } else {
        ir::Node* c = &g_.nodes[ix_.producer(ref.name)];
        c->attrs.clear();
        ir::Attribute a;
        a.name = "value", a.type = ir::AttrType::kTensor, a.t = v.contiguous();
        c->attrs.push_back(a);
      }
      return;
    }
    // Shared, computed (folded) or new: this node gets its own initializer with the reader's view.
    std::string name = fresh_name((known ? ref.name : n.label()) + "_pruned");
    if (known) replaced_.insert(ref.name);
    if (known && ref.is_initializer && ref.perm.empty()) copies_.emplace_back(name, ref.name);
    g_.initializers.push_back({name, value.contiguous(), "", false});
    ix_.add_initializer(g_.initializers.size() - 1);
    const std::string before = g_.nodes[index].inputs[input];
    g_.nodes[index].inputs[input] = name;
    ix_.set_input(index, before, name);
  }
  size_t producer_index(const std::string& name) const {
    const size_t i = ix_.producer(name);
    LOPPER_ASSERT(i != ir::GraphIndex::npos, "no node makes '", name, "'");
    return i;
  }
  // A copy of node `p` (appended; apply() restores the topological order) whose outputs only
  // `reader` reads, at its input `slot`. Returns the copy's index.
  size_t copy_for(size_t p, size_t reader, size_t slot) {
    ir::Node c = g_.nodes[p];
    c.name = fresh_name((c.name.empty() ? c.label() : c.name) + "_pruned");
    std::vector<std::pair<std::string, std::string>> renamed;  // the reader's input: before, after
    for (auto& o : c.outputs) {
      if (o.empty()) continue;
      const std::string fresh = fresh_name(o + "_pruned");
      if (g_.nodes[reader].inputs[slot] == o) {
        g_.nodes[reader].inputs[slot] = fresh;
        renamed.emplace_back(o, fresh);
      }
      if (node_copies_) node_copies_->emplace_back(fresh, o);
      o = fresh;
    }
    g_.nodes.push_back(std::move(c));
    ix_.add_node(g_.nodes.size() - 1);
    for (const auto& [before, after] : renamed) ix_.set_input(reader, before, after);
    return g_.nodes.size() - 1;
  }
  // `base`, or base_1, base_2 ...: a name no value or node has.
  std::string fresh_name(const std::string& base) const {
    std::string name = base;
    for (int k = 1; ix_.taken(name); ++k) name = base + "_" + std::to_string(k);
    return name;
  }
  int64_t readers(const std::string& name) const { return int64_t(ix_.uses(name)); }
  ir::Graph& g_;
  ir::GraphIndex& ix_;
  size_t index_;
  const DepGraph& dg_;
  const std::vector<char>& removed_;
  std::unordered_set<std::string>& replaced_;
  std::vector<std::pair<std::string, std::string>>& copies_;  // (a reader's copy, the original)
  std::vector<std::pair<std::string, std::string>>* node_copies_;  // (copy's output, original's)
};

}  // namespace

bool resolve_constant(const ir::Graph& g, const ir::GraphIndex& index, const std::string& name,
                      ConstRef& ref, at::Tensor& value) {
  ref = {};
  if (const size_t i = index.initializer(name); i != ir::GraphIndex::npos) {
    ref.name = name, ref.is_initializer = true, value = g.initializers[i].value;
    return true;
  }
  const ir::Node* p = index.producer_node(name);
  if (!p || !p->domain.empty()) return false;
  if (p->op_type == "Constant") {
    value = ir::constant_value(*p);
    ref.name = name, ref.is_initializer = false;
    return value.defined();
  }
  if (p->op_type == "Identity" && !p->inputs.empty()) {  // how exporters share equal tensors
    if (!resolve_constant(g, index, p->inputs[0], ref, value) || !ref.perm.empty()) return false;
    return true;
  }
  if (p->op_type == "Transpose" && !p->inputs.empty()) {
    ConstRef inner;
    at::Tensor v;
    if (!resolve_constant(g, index, p->inputs[0], inner, v) || !inner.perm.empty()) return false;
    std::vector<int64_t> perm;
    if (const auto* a = p->attr("perm")) perm = a->ints;
    if (perm.empty())
      for (int64_t i = v.dim() - 1; i >= 0; --i) perm.push_back(i);
    if (int64_t(perm.size()) != v.dim()) return false;
    ref = inner, ref.perm = perm, value = v.permute(perm);
    return true;
  }
  return false;
}

DepGraph build(const ir::Model& model, const NodeShapes& shapes, bool whole_heads) {
  const ir::Graph& g = model.graph;
  const auto& table = ops::OpTable::global();
  DepGraph dg;
  std::unordered_map<std::string, ops::Tracked> tracked, shapes_of;
  // Shape arithmetic seen in the analysis run, usable as constants only when every input dim is
  // static (then the values are the same on every run).
  bool all_static = true;
  for (const auto* v : g.real_inputs())
    for (const auto& d : v->type.dims) all_static = all_static && d.is_static();
  std::unordered_map<std::string, at::Tensor> recorded;
  if (all_static)
    for (const auto& [node, io] : shapes)
      for (size_t j = 0; j < io.small_ints.size() && j < node->outputs.size(); ++j)
        if (io.small_ints[j].defined()) recorded[node->outputs[j]] = io.small_ints[j];
  // Values derived from a channel count (through Shape): the channels they depend on.
  std::unordered_map<std::string, std::vector<int64_t>> taint;
  // Values computed from constants only (the same on every run), and the shape arithmetic
  // followed entry by entry.
  std::unordered_set<std::string> constant;
  for (const auto& i : g.initializers) constant.insert(i.name);
  const ir::GraphIndex index(g);
  ShapeFollower follower(g, index, dg.folded);
  NodeIO none;
  for (size_t idx : g.topological_order()) {
    const ir::Node& n = g.nodes[idx];
    auto it = shapes.find(&n);
    const NodeIO& io = it == shapes.end() ? none : it->second;
    Context ctx(model, idx, io, dg, tracked, whole_heads, recorded, shapes_of, follower);
    bool any_tracked = false;
    for (const auto& r : ir::node_reads(n)) any_tracked |= tracked.count(r) > 0;
    const ops::OpDef* def = table.find(n.domain, n.op_type);
    bool has_subgraph = false;
    for (const auto& a : n.attrs) has_subgraph |= a.g != nullptr || !a.graphs.empty();
    if (!def || !def->channels || has_subgraph || it == shapes.end()) {
      if (any_tracked) {
        std::string why = !def || !def->channels ? "no channel rule for " + n.op_type
                          : has_subgraph         ? "subgraphs are not followed"
                                                 : "never ran";
        for (const auto& r : ir::node_reads(n))
          if (auto t = tracked.find(r); t != tracked.end()) ctx.pin(t->second.atoms, why);
      }
    } else {
      def->channels(ctx);
    }
    // What this node's outputs inherit from channel counts it read.
    std::vector<int64_t> inherited;
    std::unordered_set<std::string> cut;
    for (size_t i : ctx.independent())
      if (i < n.inputs.size()) cut.insert(n.inputs[i]);
    for (const auto& r : ir::node_reads(n))
      if (auto t = taint.find(r); t != taint.end() && !cut.count(r))
        inherited.insert(inherited.end(), t->second.begin(), t->second.end());
    for (size_t o = 0; o < n.outputs.size(); ++o) {
      if (n.outputs[o].empty()) continue;
      std::vector<int64_t> mine = inherited;
      for (const auto& [out, atoms] : ctx.derived())
        if (out == o) mine.insert(mine.end(), atoms.begin(), atoms.end());
      if (!mine.empty()) {
        std::sort(mine.begin(), mine.end());
        mine.erase(std::unique(mine.begin(), mine.end()), mine.end());
        taint[n.outputs[o]] = std::move(mine);
      }
    }
    const ops::OpDef* op = table.find(n.domain, n.op_type);
    bool from_constants = op && op->deterministic && !has_subgraph && it != shapes.end();
    for (const auto& r : ir::node_reads(n)) from_constants = from_constants && constant.count(r);
    if (from_constants)
      for (size_t o = 0; o < n.outputs.size(); ++o) {
        if (n.outputs[o].empty()) continue;
        constant.insert(n.outputs[o]);
        if (o < io.small_ints.size() && small_int(io.small_ints[o]) && n.op_type != "Constant")
          dg.folded[n.outputs[o]] = io.small_ints[o];
      }
    follower.follow(n, io, model.opset(n.domain), tracked, taint);
  }
  // NOTE: a tied weight (one initializer two layers read, or a layer and an embedding: GPT-2's
  // and BERT's output projection is the token embedding's table) is one tensor: what its readers
  // track along one of its axes is one channel per position, so their atoms are coupled and the
  // tensor is sliced once, alike for all of them. Only weights: exporters also store equal
  // constants once (an untrained model's BatchNorm ones), which must not tie their layers.
  std::map<std::pair<std::string, int64_t>, size_t> first_slice;  // (weight, axis) -> slice
  for (size_t i = 0; i < dg.slices.size(); ++i) {
    const Slice& sl = dg.slices[i];
    if (!sl.ref.is_initializer ||
        (sl.role != ops::ParamRole::kWeightOut && sl.role != ops::ParamRole::kWeightIn))
      continue;
    const int64_t axis = sl.ref.perm.empty() ? sl.axis : sl.ref.perm[size_t(sl.axis)];
    auto [it, fresh] = first_slice.try_emplace({sl.ref.name, axis}, i);
    const Slice& other = dg.slices[it->second];
    if (fresh || other.atoms.size() != sl.atoms.size()) continue;
    for (size_t k = 0; k < sl.atoms.size(); ++k) dg.unite(other.atoms[k], sl.atoms[k]);
  }
  for (const auto& o : g.outputs) {
    if (auto t = tracked.find(o.name); t != tracked.end())
      pin_atoms(dg, t->second.atoms, "graph output '" + o.name + "'");
    if (auto t = taint.find(o.name); t != taint.end())
      pin_atoms(dg, t->second, "graph output '" + o.name + "' depends on a channel count (Shape)");
  }
  return dg;
}

namespace {

// NOTE: a shared initializer's first reader gets a copy (the others still read the original)
// and the last reader edits the original in place. A tie (GPT-2's lm_head weight, which the
// embedding's Gather reads too) is sliced alike for every reader, so such a copy ends up equal to
// the original: its readers go back to the original, and the tie stays one tensor.
void rejoin_copies(ir::Graph& g, const std::vector<std::pair<std::string, std::string>>& copies) {
  std::unordered_map<std::string, std::string> to;  // copy -> the initializer it equals
  for (const auto& [copy, orig] : copies) {
    const ir::Initializer* c = g.find_initializer(copy);
    const ir::Initializer* o = g.find_initializer(orig);
    if (c && o && o->value.sizes() == c->value.sizes() &&
        o->value.scalar_type() == c->value.scalar_type() && at::equal(o->value, c->value))
      to[copy] = orig;
  }
  if (to.empty()) return;
  for (auto& n : g.nodes)
    for (auto& in : n.inputs)
      if (auto it = to.find(in); it != to.end()) in = it->second;
  g.initializers.erase(std::remove_if(g.initializers.begin(), g.initializers.end(),
                                      [&](const ir::Initializer& i) { return to.count(i.name); }),
                       g.initializers.end());
}

// Copies of shape arithmetic (Editor::copy_for) that ended up reading what their original reads
// (every reader kept the same count, and rejoin_copies gave them the original constants back):
// their readers read the original again, and the copies go with the unread nodes. Latest copies
// first: a copy of a Concat reads a copy of an Unsqueeze made after it.
void rejoin_node_copies(ir::Graph& g,
                        const std::vector<std::pair<std::string, std::string>>& node_copies) {
  const ir::GraphIndex index(g);  // producers only: what the loop rewrites are inputs
  for (auto it = node_copies.rbegin(); it != node_copies.rend(); ++it) {
    const ir::Node* c = index.producer_node(it->first);
    const ir::Node* o = index.producer_node(it->second);
    if (!c || !o || c->op_type != o->op_type || c->domain != o->domain || c->inputs != o->inputs)
      continue;
    for (auto& n : g.nodes)
      for (auto& in : n.inputs)
        if (in == it->first) in = it->second;
  }
}

}  // namespace

void apply(ir::Model& model, DepGraph& dg, const std::vector<char>& removed_class) {
  ir::Graph& g = model.graph;
  std::unordered_set<std::string> replaced;
  std::vector<std::pair<std::string, std::string>> copies;
  std::vector<std::pair<std::string, std::string>> node_copies;
  ir::GraphIndex ix(g);  // the edits record what they add and rewire
  for (const auto& e : dg.edits) {
    Editor ed(g, ix, e.node, dg, removed_class, replaced, copies, &node_copies);
    e.fn(ed);
  }
  rejoin_copies(g, copies);
  rejoin_node_copies(g, node_copies);
  // Nodes left with no reader (the shape arithmetic of a Reshape target now constant).
  std::unordered_set<std::string> read;
  for (bool again = true; again;) {
    read = values_read(g);
    size_t before = g.nodes.size();
    g.nodes.erase(std::remove_if(g.nodes.begin(), g.nodes.end(),
                                 [&](const ir::Node& n) {
                                   if (n.outputs.empty()) return false;
                                   for (const auto& o : n.outputs)
                                     if (!o.empty() && read.count(o)) return false;
                                   return true;
                                 }),
                  g.nodes.end());
    again = g.nodes.size() != before;
  }
  {  // copies of shape arithmetic (Editor::set_shape_entry) were appended: back in order
    std::vector<ir::Node> sorted;
    sorted.reserve(g.nodes.size());
    for (size_t i : g.topological_order()) sorted.push_back(std::move(g.nodes[i]));
    g.nodes = std::move(sorted);
  }
  // Constants that every reader stopped using (`read` is after the last pass), and intermediate
  // shapes that changed.
  g.initializers.erase(std::remove_if(g.initializers.begin(), g.initializers.end(),
                                      [&](const ir::Initializer& i) {
                                        return replaced.count(i.name) && !read.count(i.name);
                                      }),
                       g.initializers.end());
  std::unordered_set<std::string> changed(dg.tracked_values.begin(), dg.tracked_values.end());
  changed.insert(replaced.begin(), replaced.end());
  for (size_t idx : g.topological_order()) {  // constants read through (resolve_constant)
    const ir::Node& n = g.nodes[idx];
    if (n.domain.empty() && (n.op_type == "Transpose" || n.op_type == "Identity") &&
        !n.inputs.empty() && changed.count(n.inputs[0]))
      changed.insert(n.outputs.begin(), n.outputs.end());
  }
  for (auto& in : g.inputs)  // old models list initializers as graph inputs too
    if (const auto* init = g.find_initializer(in.name); init && changed.count(in.name)) {
      in.type.dims.clear();
      for (int64_t d : init->value.sizes()) in.type.dims.push_back({d, ""});
    }
  g.value_info.erase(
      std::remove_if(g.value_info.begin(), g.value_info.end(),
                     [&](const ir::ValueInfo& v) { return changed.count(v.name) > 0; }),
      g.value_info.end());
}

}  // namespace lopper::depgraph
