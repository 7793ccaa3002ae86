#include "exec/fusion/rewrite.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>

namespace lopper::exec::fusion {

bool is(const ir::Node& n, const char* op) { return n.domain.empty() && n.op_type == op; }

int outputs_used(const ir::Node& n) {
  int k = 0;
  for (const auto& o : n.outputs) k += !o.empty();
  return k;
}

std::string other_input(const ir::Node& n, const std::string& v) {
  if (n.inputs.size() != 2) return "";
  return n.inputs[0] == v ? n.inputs[1] : (n.inputs[1] == v ? n.inputs[0] : "");
}

Rewrite::Rewrite(ir::Graph& graph, int64_t opset_)
    : g(graph), opset(opset_), index_(graph), removed_(graph.nodes.size(), false) {}

std::optional<size_t> Rewrite::producer(const std::string& v) const {
  const size_t i = index_.producer(v);
  if (i == ir::GraphIndex::npos) return std::nullopt;
  return i;
}

std::optional<size_t> Rewrite::made_by(const std::string& v, const char* op) const {
  auto p = producer(v);
  if (!p || !is(g.nodes[*p], op)) return std::nullopt;
  return p;
}

bool Rewrite::single(const std::string& v) const {
  return index_.uses(v) == 1 && !index_.is_output(v);
}

std::optional<size_t> Rewrite::reader(const std::string& v, const char* op) const {
  if (!single(v)) return std::nullopt;
  const auto& r = index_.readers(v);
  if (r.size() != 1 || (op && !is(g.nodes[r[0]], op))) return std::nullopt;
  return r[0];
}

std::optional<float> Rewrite::scalar(const std::string& name) const {
  const auto* t = initializer(name);
  if (!t || t->value.numel() != 1 || !t->value.is_floating_point()) return std::nullopt;
  return t->value.to(at::kFloat).item<float>();
}

bool Rewrite::scalar_is(const std::string& name, double want) const {
  auto s = scalar(name);
  return s && std::abs(*s - want) < 1e-4 * std::abs(want);
}

ir::Node& Rewrite::change(size_t i) {
  if (std::find(changing_.begin(), changing_.end(), i) == changing_.end()) {
    index_.remove_node(i);
    changing_.push_back(i);
  }
  changed_ = true;
  return g.nodes[i];
}

void Rewrite::commit() {
  for (size_t i : changing_) index_.add_node(i);
  changing_.clear();
}

void Rewrite::remove(size_t i) {
  if (removed_[i]) return;
  if (std::find(changing_.begin(), changing_.end(), i) == changing_.end()) index_.remove_node(i);
  changing_.erase(std::remove(changing_.begin(), changing_.end(), i), changing_.end());
  removed_[i] = true;
  changed_ = true;
}

void Rewrite::add_initializer(ir::Initializer t) {
  g.initializers.push_back(std::move(t));
  index_.add_initializer(g.initializers.size() - 1);
  changed_ = true;
}

bool Rewrite::finish() {
  commit();
  std::vector<ir::Node> kept;
  kept.reserve(g.nodes.size());
  for (size_t i = 0; i < g.nodes.size(); ++i)
    if (!removed_[i]) kept.push_back(std::move(g.nodes[i]));
  g.nodes = std::move(kept);
  for (const auto& name : dropped_) {
    auto it = std::find_if(g.initializers.begin(), g.initializers.end(),
                           [&](const ir::Initializer& t) { return t.name == name; });
    if (it != g.initializers.end()) g.initializers.erase(it);
  }
  changed_ = changed_ || !dropped_.empty();
  removed_.assign(g.nodes.size(), false);
  dropped_.clear();
  index_.rebuild();
  return changed_;
}

namespace {

// HardSigmoid(x) = clamp(alpha x + beta, 0, 1) with torch.nn.Hardsigmoid's line (alpha 1/6,
// beta 1/2), the one oneDNN's fused hardsigmoid computes.
bool is_torch_hardsigmoid(const ir::Node& n) {
  const auto* a = n.attr("alpha");
  const auto* b = n.attr("beta");
  const float alpha = a ? a->f : 0.2f, beta = b ? b->f : 0.5f;
  return std::abs(alpha - 1.f / 6) < 1e-6f && beta == 0.5f;
}

}  // namespace

std::optional<std::vector<ir::Attribute>> Rewrite::activation_of(const ir::Node& n) const {
  if (n.inputs.empty() || outputs_used(n) != 1) return std::nullopt;
  if (is(n, "Relu") || is(n, "Sigmoid") || is(n, "Tanh"))
    return std::vector<ir::Attribute>{string_attr("activation", n.op_type)};
  if (is(n, "Gelu")) {
    const auto* a = n.attr("approximate");
    return std::vector<ir::Attribute>{string_attr("activation", "Gelu"),
                                      string_attr("activation_approximate", a ? a->s : "none")};
  }
  if (is(n, "HardSwish")) return std::vector<ir::Attribute>{string_attr("activation", "HardSwish")};
  if (is(n, "HardSigmoid") && is_torch_hardsigmoid(n))
    return std::vector<ir::Attribute>{string_attr("activation", "HardSigmoid")};
  if (is(n, "LeakyRelu")) {
    const auto* a = n.attr("alpha");
    return std::vector<ir::Attribute>{string_attr("activation", "LeakyRelu"),
                                      float_attr("activation_alpha", a ? a->f : 0.01f)};
  }
  if (is(n, "Clip")) {
    float lo = -INFINITY, hi = INFINITY;
    if (opset < 11) {  // the bounds were attributes before opset 11
      if (const auto* a = n.attr("min")) lo = a->f;
      if (const auto* a = n.attr("max")) hi = a->f;
    } else {
      if (n.inputs.size() > 1 && !n.inputs[1].empty()) {
        auto v = scalar(n.inputs[1]);
        if (!v) return std::nullopt;
        lo = *v;
      }
      if (n.inputs.size() > 2 && !n.inputs[2].empty()) {
        auto v = scalar(n.inputs[2]);
        if (!v) return std::nullopt;
        hi = *v;
      }
    }
    return std::vector<ir::Attribute>{string_attr("activation", "Clip"),
                                      float_attr("activation_min", lo),
                                      float_attr("activation_max", hi)};
  }
  return std::nullopt;
}

void Rewrite::absorb_activation(Absorbed& a) const {
  const std::string out = a.out;
  // x * gate(x), x read by nothing else.
  if (uses(out) == 2 && !is_output(out) && readers(out).size() == 2) {
    const std::vector<size_t> r = readers(out);
    for (int k = 0; k < 2; ++k) {
      const ir::Node& gate = g.nodes[r[k]];
      const ir::Node& mul = g.nodes[r[1 - k]];
      const char* name = is(gate, "Sigmoid")                                     ? "Silu"
                         : is(gate, "HardSigmoid") && is_torch_hardsigmoid(gate) ? "HardSwish"
                                                                                 : nullptr;
      if (!name || gate.inputs.size() != 1 || outputs_used(gate) != 1 || !single(gate.outputs[0]) ||
          !is(mul, "Mul") || mul.inputs.size() != 2 || outputs_used(mul) != 1)
        continue;
      if (other_input(mul, out) != gate.outputs[0]) continue;
      a.act = {string_attr("activation", name)};
      a.take(r[k], gate.outputs[0]);
      a.take(r[1 - k], mul.outputs[0]);
      return;
    }
    return;
  }
  auto r = reader(out);
  if (!r) return;
  if (auto act = activation_of(g.nodes[*r])) {
    a.act = *act;
    a.take(*r, g.nodes[*r].outputs[0]);
  }
}

void Rewrite::fuse_into(size_t i, const char* op, const Absorbed& a) {
  ir::Node& n = change(i);
  n.domain = "ai.lopper";
  n.op_type = op;
  n.outputs = {a.out};
  n.attrs.insert(n.attrs.end(), a.act.begin(), a.act.end());
  for (size_t r : a.nodes) remove(r);
  commit();
}

}  // namespace lopper::exec::fusion
