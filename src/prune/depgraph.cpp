// The dependency graph: one topological pass that gives every node's channel rule its tracked
// inputs, shapes and constants, and records the atoms, couplings, pins, slices and edits the rules
// make. Then, once the caller has chosen what goes, the edits run on the model.
#include "prune/depgraph.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "lopper/error.h"

namespace lopper::depgraph {

namespace {

const ir::Node* producer(const ir::Graph& g, const std::string& name) {
  for (const auto& n : g.nodes)
    for (const auto& o : n.outputs)
      if (o == name) return &n;
  return nullptr;
}

// Pins `atoms` (those not pinned yet) for `where`, and lists `where` once among the barriers.
void pin_atoms(DepGraph& dg, const std::vector<int64_t>& atoms, const std::string& where) {
  bool any = false;
  for (int64_t a : atoms)
    if (dg.pinned[a].empty()) dg.pinned[a] = where, any = true;
  if (any && std::find(dg.barriers.begin(), dg.barriers.end(), where) == dg.barriers.end())
    dg.barriers.push_back(where);
}

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

class Context final : public ops::ChannelContext {
 public:
  Context(const ir::Model& m, size_t index, const NodeIO& io, DepGraph& dg,
          std::unordered_map<std::string, ops::Tracked>& tracked, bool whole_heads,
          const std::unordered_map<std::string, at::Tensor>& recorded,
          std::unordered_map<std::string, ops::Tracked>& shapes_of)
      : ChannelContext(m.graph.nodes[index]),
        model_(m),
        index_(index),
        io_(io),
        dg_(dg),
        tracked_(tracked),
        whole_heads_(whole_heads),
        recorded_(recorded),
        shapes_of_(shapes_of) {}

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
    return resolve_constant(model_.graph, node().inputs[i], ref, v) ? v : at::Tensor();
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
        !resolve_constant(model_.graph, node().inputs[input], s.ref, s.value) ||
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
  void mark_heads(const std::vector<int64_t>& atoms) override {
    for (int64_t a : atoms) dg_.head[a] = 1;
  }

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
  std::vector<size_t> independent_;
  std::vector<std::pair<size_t, std::vector<int64_t>>> derived_;
};

class Editor final : public ops::ChannelEditor {
 public:
  Editor(ir::Graph& g, size_t index, const DepGraph& dg, const std::vector<char>& removed,
         std::unordered_set<std::string>& replaced)
      : g_(g), index_(index), dg_(dg), removed_(removed), replaced_(replaced) {}

  bool removed(int64_t atom) const override {
    return removed_[const_cast<DepGraph&>(dg_).find(atom)] != 0;
  }
  ir::Node& node() override { return g_.nodes[index_]; }
  at::Tensor constant(size_t input) override {
    ConstRef ref;
    at::Tensor v;
    LOPPER_ASSERT(
        input < node().inputs.size() && resolve_constant(g_, node().inputs[input], ref, v),
        "edit of a non-constant input ", input, " of ", node().label());
    return v;
  }
  void set_constant(size_t input, const at::Tensor& value) override {
    ir::Node& n = node();
    if (input >= n.inputs.size()) n.inputs.resize(input + 1);
    ConstRef ref;
    at::Tensor old;
    const bool known = !n.inputs[input].empty() && resolve_constant(g_, n.inputs[input], ref, old);
    const bool direct = known && n.inputs[input] == ref.name;
    if (known && readers(n.inputs[input]) == 1 && (direct || readers(ref.name) == 1)) {
      at::Tensor v = ref.perm.empty() ? value : value.permute(inverse(ref.perm)).contiguous();
      if (ref.is_initializer) {
        g_.find_initializer(ref.name)->value = v.contiguous();
        replaced_.insert(ref.name);  // its declared shape (value_info, graph input) is stale
      } else {
        ir::Node* c = const_cast<ir::Node*>(producer(g_, ref.name));
        c->attrs.clear();
        ir::Attribute a;
        a.name = "value", a.type = ir::AttrType::kTensor, a.t = v.contiguous();
        c->attrs.push_back(a);
      }
      return;
    }
    // Shared (or new): this node gets its own initializer with the reader's view.
    std::string base = (known ? ref.name : n.label()) + "_pruned";
    std::string name = base;
    for (int k = 1; g_.find_initializer(name) || producer(g_, name); ++k)
      name = base + "_" + std::to_string(k);
    if (known) replaced_.insert(ref.name);
    g_.initializers.push_back({name, value.contiguous(), "", false});
    n.inputs[input] = name;
  }

 private:
  int64_t readers(const std::string& name) const {
    int64_t r = 0;
    for (const auto& n : g_.nodes)
      for (const auto& i : ir::node_reads(n)) r += i == name;
    for (const auto& o : g_.outputs) r += o.name == name;
    return r;
  }
  ir::Graph& g_;
  size_t index_;
  const DepGraph& dg_;
  const std::vector<char>& removed_;
  std::unordered_set<std::string>& replaced_;
};

}  // namespace

bool resolve_constant(const ir::Graph& g, const std::string& name, ConstRef& ref,
                      at::Tensor& value) {
  ref = {};
  if (const auto* init = g.find_initializer(name)) {
    ref.name = name, ref.is_initializer = true, value = init->value;
    return true;
  }
  const ir::Node* p = producer(g, name);
  if (!p || !p->domain.empty()) return false;
  if (p->op_type == "Constant") {
    value = ir::constant_value(*p);
    ref.name = name, ref.is_initializer = false;
    return value.defined();
  }
  if (p->op_type == "Identity" && !p->inputs.empty()) {  // how exporters share equal tensors
    if (!resolve_constant(g, p->inputs[0], ref, value) || !ref.perm.empty()) return false;
    return true;
  }
  if (p->op_type == "Transpose" && !p->inputs.empty()) {
    ConstRef inner;
    at::Tensor v;
    if (!resolve_constant(g, p->inputs[0], inner, v) || !inner.perm.empty()) return false;
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
  NodeIO none;
  for (size_t idx : g.topological_order()) {
    const ir::Node& n = g.nodes[idx];
    auto it = shapes.find(&n);
    Context ctx(model, idx, it == shapes.end() ? none : it->second, dg, tracked, whole_heads,
                recorded, shapes_of);
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
  }
  for (const auto& o : g.outputs) {
    if (auto t = tracked.find(o.name); t != tracked.end())
      pin_atoms(dg, t->second.atoms, "graph output '" + o.name + "'");
    if (auto t = taint.find(o.name); t != taint.end())
      pin_atoms(dg, t->second, "graph output '" + o.name + "' depends on a channel count (Shape)");
  }
  return dg;
}

void apply(ir::Model& model, DepGraph& dg, const std::vector<char>& removed_class) {
  ir::Graph& g = model.graph;
  std::unordered_set<std::string> replaced;
  for (const auto& e : dg.edits) {
    Editor ed(g, e.node, dg, removed_class, replaced);
    e.fn(ed);
  }
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
