#include "exec/fuse.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>
#include <unordered_map>
#include <unordered_set>

namespace lopper::exec {
namespace {

struct Uses {
  std::unordered_map<std::string, int> count;  // readers of each value; graph outputs count too
  void build(const ir::Graph& g, const std::vector<bool>& removed) {
    count.clear();
    for (size_t i = 0; i < g.nodes.size(); ++i) {
      if (removed[i]) continue;
      for (const auto& r : ir::node_reads(g.nodes[i])) ++count[r];
    }
    for (const auto& o : g.outputs) count[o.name] += 2;  // never fused away
  }
  bool single(const std::string& v) const {
    auto it = count.find(v);
    return it != count.end() && it->second == 1;
  }
};

bool is(const ir::Node& n, const char* op) { return n.domain.empty() && n.op_type == op; }

int outputs_used(const ir::Node& n) {
  int k = 0;
  for (const auto& o : n.outputs) k += !o.empty();
  return k;
}

const ir::Attribute* find_attr(const ir::Node& n, const char* name) { return n.attr(name); }

ir::Attribute make_attr(const std::string& name, const std::string& s) {
  ir::Attribute a;
  a.name = name;
  a.type = ir::AttrType::kString;
  a.s = s;
  return a;
}
ir::Attribute int_attr(const std::string& name, int64_t i) {
  ir::Attribute a;
  a.name = name;
  a.type = ir::AttrType::kInt;
  a.i = i;
  return a;
}
ir::Attribute make_attr(const std::string& name, float f) {
  ir::Attribute a;
  a.name = name;
  a.type = ir::AttrType::kFloat;
  a.f = f;
  return a;
}

// The scalar value of an initializer, if `name` is one with a single element.
std::optional<float> scalar_initializer(const ir::Graph& g, const std::string& name) {
  const auto* t = g.find_initializer(name);
  if (!t || t->value.numel() != 1 || !t->value.is_floating_point()) return std::nullopt;
  return t->value.to(at::kFloat).item<float>();
}

// HardSigmoid(x) = clamp(alpha x + beta, 0, 1) with torch.nn.Hardsigmoid's line (alpha 1/6,
// beta 1/2), the one oneDNN's fused hardsigmoid computes.
bool is_torch_hardsigmoid(const ir::Node& n) {
  const auto* a = find_attr(n, "alpha");
  const auto* b = find_attr(n, "beta");
  const float alpha = a ? a->f : 0.2f, beta = b ? b->f : 0.5f;
  return std::abs(alpha - 1.f / 6) < 1e-6f && beta == 0.5f;
}

// Activation attributes for a FusedConv when `n` is an activation lopper can fuse.
std::optional<std::vector<ir::Attribute>> activation_of(const ir::Graph& g, const ir::Node& n,
                                                        int64_t opset) {
  if (n.inputs.empty() || outputs_used(n) != 1) return std::nullopt;
  if (is(n, "Relu") || is(n, "Sigmoid") || is(n, "Tanh"))
    return std::vector<ir::Attribute>{make_attr("activation", n.op_type)};
  if (is(n, "Gelu")) {
    const auto* a = find_attr(n, "approximate");
    return std::vector<ir::Attribute>{make_attr("activation", "Gelu"),
                                      make_attr("activation_approximate", a ? a->s : "none")};
  }
  if (is(n, "HardSwish")) return std::vector<ir::Attribute>{make_attr("activation", "HardSwish")};
  if (is(n, "HardSigmoid") && is_torch_hardsigmoid(n))
    return std::vector<ir::Attribute>{make_attr("activation", "HardSigmoid")};
  if (is(n, "LeakyRelu")) {
    const auto* a = find_attr(n, "alpha");
    return std::vector<ir::Attribute>{make_attr("activation", "LeakyRelu"),
                                      make_attr("activation_alpha", a ? a->f : 0.01f)};
  }
  if (is(n, "Clip")) {
    float lo = -INFINITY, hi = INFINITY;
    if (opset < 11) {
      if (const auto* a = find_attr(n, "min")) lo = a->f;
      if (const auto* a = find_attr(n, "max")) hi = a->f;
    } else {
      if (n.inputs.size() > 1 && !n.inputs[1].empty()) {
        auto v = scalar_initializer(g, n.inputs[1]);
        if (!v) return std::nullopt;
        lo = *v;
      }
      if (n.inputs.size() > 2 && !n.inputs[2].empty()) {
        auto v = scalar_initializer(g, n.inputs[2]);
        if (!v) return std::nullopt;
        hi = *v;
      }
    }
    return std::vector<ir::Attribute>{make_attr("activation", "Clip"),
                                      make_attr("activation_min", lo),
                                      make_attr("activation_max", hi)};
  }
  return std::nullopt;
}

// Folds BatchNormalization(Conv(x)) into the Conv's weight and bias. Returns true if it did.
bool fold_batchnorm(ir::Graph& g, size_t conv_i, size_t bn_i) {
  ir::Node& conv = g.nodes[conv_i];
  const ir::Node& bn = g.nodes[bn_i];
  if (bn.inputs.size() < 5 || outputs_used(bn) != 1 || bn.outputs[0].empty()) return false;
  if (const auto* tm = find_attr(bn, "training_mode"); tm && tm->i) return false;
  const auto* w = g.find_initializer(conv.inputs[1]);
  const auto* b = conv.inputs.size() > 2 && !conv.inputs[2].empty()
                      ? g.find_initializer(conv.inputs[2])
                      : nullptr;
  if (!w || (conv.inputs.size() > 2 && !conv.inputs[2].empty() && !b)) return false;
  const ir::Initializer* p[4];
  for (int k = 0; k < 4; ++k)
    if (!(p[k] = g.find_initializer(bn.inputs[1 + k]))) return false;
  int64_t cout = w->value.size(0);
  for (int k = 0; k < 4; ++k)
    if (p[k]->value.dim() != 1 || p[k]->value.size(0) != cout) return false;
  if (!w->value.is_floating_point()) return false;
  const auto* eps_attr = find_attr(bn, "epsilon");
  double eps = eps_attr ? eps_attr->f : 1e-5;
  at::Tensor scale = p[0]->value.to(at::kDouble), shift = p[1]->value.to(at::kDouble);
  at::Tensor mean = p[2]->value.to(at::kDouble), var = p[3]->value.to(at::kDouble);
  at::Tensor k = scale / at::sqrt(var + eps);
  std::vector<int64_t> shape(w->value.dim(), 1);
  shape[0] = cout;
  at::Tensor new_w = (w->value.to(at::kDouble) * k.view(shape)).to(w->value.scalar_type());
  at::Tensor old_b = b ? b->value.to(at::kDouble) : at::zeros({cout}, at::kDouble);
  at::Tensor new_b = ((old_b - mean) * k + shift).to(w->value.scalar_type());
  std::string base = conv.outputs[0] + "/bn_folded";
  g.initializers.push_back({base + "/W", new_w.contiguous(), "", false});
  g.initializers.push_back({base + "/B", new_b.contiguous(), "", false});
  conv.inputs.resize(3);
  conv.inputs[1] = base + "/W";
  conv.inputs[2] = base + "/B";
  conv.outputs[0] = bn.outputs[0];
  return true;
}

}  // namespace

// Constant nodes, and Identity nodes of initializers (how exporters share deduplicated weights),
// become initializers, so the passes below (and the executor) see them as constants.
void constants_to_initializers(ir::Graph& g) {
  std::vector<ir::Node> kept;
  for (auto& n : g.nodes) {
    at::Tensor v;
    if (is(n, "Identity") && n.inputs.size() == 1 && n.outputs.size() == 1) {
      if (const auto* t = g.find_initializer(n.inputs[0])) v = t->value;  // shares the storage
    } else if (is(n, "Constant") && n.outputs.size() == 1 && n.attrs.size() == 1) {
      v = ir::constant_value(n);
    }
    if (v.defined())
      g.initializers.push_back({n.outputs[0], v, "", false});
    else
      kept.push_back(std::move(n));
  }
  g.nodes = std::move(kept);
}

ir::Graph fuse_for_inference(const ir::Graph& src, int64_t opset) {
  ir::Graph g = src;
  constants_to_initializers(g);
  std::vector<bool> removed(g.nodes.size(), false);
  std::unordered_map<std::string, size_t> producer;
  auto index = [&] {
    producer.clear();
    for (size_t i = 0; i < g.nodes.size(); ++i)
      if (!removed[i])
        for (const auto& o : g.nodes[i].outputs)
          if (!o.empty()) producer[o] = i;
  };
  Uses uses;
  // Each value's single reader (only meaningful when uses.single(v)).
  auto reader_of = [&](const std::string& v) -> std::optional<size_t> {
    for (size_t i = 0; i < g.nodes.size(); ++i) {
      if (removed[i]) continue;
      for (const auto& in : g.nodes[i].inputs)
        if (in == v) return i;
    }
    return std::nullopt;
  };

  // 1. BatchNormalization after a Conv whose output nothing else reads.
  index();
  uses.build(g, removed);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    if (removed[i] || !is(g.nodes[i], "BatchNormalization") || g.nodes[i].inputs.empty()) continue;
    auto it = producer.find(g.nodes[i].inputs[0]);
    if (it == producer.end()) continue;
    ir::Node& conv = g.nodes[it->second];
    if (!is(conv, "Conv") || conv.inputs.size() < 2 || outputs_used(conv) != 1 ||
        !uses.single(conv.outputs[0]))
      continue;
    if (fold_batchnorm(g, it->second, i)) {
      removed[i] = true;
      index();
    }
  }

  // The nodes that read `v` (each once).
  auto readers_of = [&](const std::string& v) {
    std::vector<size_t> r;
    for (size_t i = 0; i < g.nodes.size(); ++i)
      if (!removed[i] && std::find(g.nodes[i].inputs.begin(), g.nodes[i].inputs.end(), v) !=
                             g.nodes[i].inputs.end())
        r.push_back(i);
    return r;
  };
  // x * gate(x), with x read by nothing else: Mul(x, Sigmoid(x)) is SiLU (EfficientNet's), and
  // Mul(x, HardSigmoid(x)) is HardSwish (as older opsets export it). The activation's attributes,
  // the two nodes and the product, or nothing.
  struct Gated {
    std::vector<ir::Attribute> act;
    size_t gate, mul;
  };
  auto gated_of = [&](const std::string& x) -> std::optional<Gated> {
    const auto c = uses.count.find(x);
    if (c == uses.count.end() || c->second != 2) return std::nullopt;
    const std::vector<size_t> r = readers_of(x);
    if (r.size() != 2) return std::nullopt;
    for (int k = 0; k < 2; ++k) {
      const ir::Node& gate = g.nodes[r[k]];
      const ir::Node& mul = g.nodes[r[1 - k]];
      const char* act = is(gate, "Sigmoid")                                     ? "Silu"
                        : is(gate, "HardSigmoid") && is_torch_hardsigmoid(gate) ? "HardSwish"
                                                                                : nullptr;
      if (!act || gate.inputs.size() != 1 || outputs_used(gate) != 1 ||
          !uses.single(gate.outputs[0]) || !is(mul, "Mul") || mul.inputs.size() != 2 ||
          outputs_used(mul) != 1)
        continue;
      const bool pair = (mul.inputs[0] == x && mul.inputs[1] == gate.outputs[0]) ||
                        (mul.inputs[1] == x && mul.inputs[0] == gate.outputs[0]);
      if (pair) return Gated{{make_attr("activation", act)}, r[k], r[1 - k]};
    }
    return std::nullopt;
  };
  // When the only reader of `out` is an activation lopper fuses, or `out` is gated by itself
  // (gated_of): absorb it.
  auto absorb_activation = [&](std::string& out, std::vector<size_t>& absorbed,
                               std::vector<ir::Attribute>& act) {
    if (auto gated = gated_of(out)) {
      act = gated->act;
      absorbed.push_back(gated->gate);
      absorbed.push_back(gated->mul);
      out = g.nodes[gated->mul].outputs[0];
      return;
    }
    if (!uses.single(out)) return;
    size_t r = *reader_of(out);
    if (auto a = activation_of(g, g.nodes[r], opset)) {
      act = *a;
      absorbed.push_back(r);
      out = g.nodes[r].outputs[0];
    }
  };

  // Makes `n` the fused node ai.lopper.`op` writing `out` (the last absorbed node's output) with
  // the activation's attributes; the absorbed nodes are removed.
  auto fuse_into = [&](ir::Node& n, const char* op, const std::string& out,
                       const std::vector<ir::Attribute>& act, const std::vector<size_t>& absorbed) {
    n.domain = "ai.lopper";
    n.op_type = op;
    n.outputs = {out};
    n.attrs.insert(n.attrs.end(), act.begin(), act.end());
    for (size_t r : absorbed) removed[r] = true;
    uses.build(g, removed);
  };

  // 2. Conv [+ Add] [+ activation] -> FusedConv.
  uses.build(g, removed);
  index();
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    ir::Node& conv = g.nodes[i];
    if (removed[i] || !is(conv, "Conv") || outputs_used(conv) != 1 || conv.outputs[0].empty())
      continue;
    std::string out = conv.outputs[0];
    std::string other;
    std::vector<ir::Attribute> act;
    std::vector<size_t> absorbed;
    if (uses.single(out)) {
      size_t r = *reader_of(out);
      const ir::Node& next = g.nodes[r];
      if (is(next, "Add") && next.inputs.size() == 2 && outputs_used(next) == 1 &&
          next.inputs[0] != next.inputs[1]) {
        other = next.inputs[0] == out ? next.inputs[1] : next.inputs[0];
        absorbed.push_back(r);
        out = next.outputs[0];
      }
    }
    absorb_activation(out, absorbed, act);
    if (absorbed.empty()) continue;
    conv.inputs.resize(3);
    if (!other.empty()) conv.inputs.push_back(other);
    fuse_into(conv, "FusedConv", out, act, absorbed);
  }

  // 2a. FusedConv whose residual is a Conv's output read by nothing else (ResNet's downsample):
  //     the residual's bias moves into the FusedConv's, act(conv(x) + b + (conv'(x') + b')) =
  //     act(conv(x) + (b + b') + conv'(x')). On a GPU a convolution's bias is a separate pass
  //     over its output (ATen's cuDNN path); the fused kernel adds its own bias in the epilogue.
  uses.build(g, removed);
  index();
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    ir::Node& fc = g.nodes[i];
    if (removed[i] || fc.domain != "ai.lopper" || fc.op_type != "FusedConv" ||
        fc.inputs.size() != 4 || !uses.single(fc.inputs[3]))
      continue;
    auto it = producer.find(fc.inputs[3]);
    if (it == producer.end()) continue;
    ir::Node& rc = g.nodes[it->second];
    if (!is(rc, "Conv") || outputs_used(rc) != 1 || rc.inputs.size() < 3 || rc.inputs[2].empty())
      continue;
    const ir::Initializer* rb = g.find_initializer(rc.inputs[2]);
    const ir::Initializer* w = g.find_initializer(fc.inputs[1]);
    const ir::Initializer* b = fc.inputs[2].empty() ? nullptr : g.find_initializer(fc.inputs[2]);
    if (!rb || !w || (!fc.inputs[2].empty() && !b) || !w->value.is_floating_point()) continue;
    const int64_t cout = w->value.size(0);
    if (rb->value.dim() != 1 || rb->value.size(0) != cout ||
        rb->value.scalar_type() != w->value.scalar_type() ||
        (b && (b->value.dim() != 1 || b->value.size(0) != cout ||
               b->value.scalar_type() != w->value.scalar_type())))
      continue;
    at::Tensor sum = rb->value.to(at::kDouble);
    if (b) sum = sum + b->value.to(at::kDouble);
    const std::string name = fc.outputs[0] + "/bias_with_residual";
    g.initializers.push_back({name, sum.to(w->value.scalar_type()).contiguous(), "", false});
    fc.inputs[2] = name;
    rc.inputs.resize(2);
  }

  // 2b. BatchNormalization that no Conv absorbed (DenseNet's, after each Concat) + activation ->
  //     FusedBatchNormalization: one pass over the activation instead of two.
  uses.build(g, removed);
  index();
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    ir::Node& bn = g.nodes[i];
    if (removed[i] || !is(bn, "BatchNormalization") || outputs_used(bn) != 1 ||
        bn.outputs[0].empty())
      continue;
    std::string out = bn.outputs[0];
    std::vector<ir::Attribute> act;
    std::vector<size_t> absorbed;
    absorb_activation(out, absorbed, act);
    if (absorbed.empty()) continue;
    fuse_into(bn, "FusedBatchNormalization", out, act, absorbed);
  }

  // 2c. Concat along the channels whose only reader is a BatchNormalization (DenseNet's, at every
  //     layer) -> FusedConcatNorm(scale, B, mean, var, x1, ..., xn): each input normalised
  //     straight into its slice of the output; the concatenation itself is never written.
  uses.build(g, removed);
  index();
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    ir::Node& cat = g.nodes[i];
    if (removed[i] || !is(cat, "Concat") || outputs_used(cat) != 1 || cat.outputs[0].empty() ||
        !uses.single(cat.outputs[0]))
      continue;
    const ir::Attribute* axis = find_attr(cat, "axis");
    if (!axis || axis->i != 1) continue;
    const size_t r = *reader_of(cat.outputs[0]);
    ir::Node& bn = g.nodes[r];
    const bool norm = (is(bn, "BatchNormalization") ||
                       (bn.domain == "ai.lopper" && bn.op_type == "FusedBatchNormalization"));
    if (!norm || bn.inputs.size() != 5 || bn.inputs[0] != cat.outputs[0] || outputs_used(bn) != 1)
      continue;
    bool plain = true;  // every input of the concatenation given (no optional one left out)
    for (const auto& in : cat.inputs) plain = plain && !in.empty();
    if (!plain) continue;
    std::vector<std::string> inputs(bn.inputs.begin() + 1, bn.inputs.end());
    inputs.insert(inputs.end(), cat.inputs.begin(), cat.inputs.end());
    bn.domain = "ai.lopper";
    bn.op_type = "FusedConcatNorm";
    bn.inputs = std::move(inputs);
    removed[i] = true;
    uses.build(g, removed);
    index();
  }

  // 2d. ShuffleNet's channel shuffle, [Concat(x1, ..., xn, axis 1) ->] Reshape to 5-D ->
  //     Transpose perm 0,2,1,3,4 -> Reshape, each read only by the next ->
  //     ChannelShuffle(shape1, shape2, x1, ..., xn) with allowzero = [the Reshapes' allowzero]:
  //     one pass from the inputs to the shuffled tensor instead of a concatenation, a copy to NCHW
  //     and back (ops/shape.cpp).
  uses.build(g, removed);
  index();
  auto allowzero = [&](const ir::Node& r) -> int64_t {
    const auto* az = find_attr(r, "allowzero");
    return opset >= 14 && az && az->i != 0 ? 1 : 0;
  };
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    ir::Node& last = g.nodes[i];
    if (removed[i] || !is(last, "Reshape") || last.inputs.size() != 2 || outputs_used(last) != 1 ||
        last.outputs[0].empty() || opset < 5 || !uses.single(last.inputs[0]))
      continue;
    auto t = producer.find(last.inputs[0]);
    if (t == producer.end() || !is(g.nodes[t->second], "Transpose")) continue;
    const ir::Node& tr = g.nodes[t->second];
    const auto* perm = find_attr(tr, "perm");
    if (!perm || perm->ints != std::vector<int64_t>{0, 2, 1, 3, 4} || tr.inputs.size() != 1 ||
        !uses.single(tr.inputs[0]))
      continue;
    auto f = producer.find(tr.inputs[0]);
    if (f == producer.end() || !is(g.nodes[f->second], "Reshape")) continue;
    const ir::Node& first = g.nodes[f->second];
    if (first.inputs.size() != 2) continue;
    std::vector<size_t> absorbed{f->second, t->second};
    std::vector<std::string> xs{first.inputs[0]};
    auto k = producer.find(first.inputs[0]);
    if (k != producer.end() && uses.single(first.inputs[0]) && is(g.nodes[k->second], "Concat")) {
      const ir::Node& cat = g.nodes[k->second];
      const ir::Attribute* axis = find_attr(cat, "axis");
      bool plain = axis && axis->i == 1 && outputs_used(cat) == 1;
      for (const auto& in : cat.inputs) plain = plain && !in.empty();
      if (plain) {
        xs = cat.inputs;
        absorbed.push_back(k->second);
      }
    }
    std::vector<std::string> inputs{first.inputs[1], last.inputs[1]};
    inputs.insert(inputs.end(), xs.begin(), xs.end());
    last.domain = "ai.lopper";
    last.op_type = "ChannelShuffle";
    last.inputs = std::move(inputs);
    ir::Attribute az;
    az.name = "allowzero";
    az.type = ir::AttrType::kInts;
    az.ints = {allowzero(first), allowzero(last)};
    last.attrs = {az};
    for (size_t r : absorbed) removed[r] = true;
    uses.build(g, removed);
    index();
  }

  // 2e. An inverted residual's convolutions, [1x1 expansion ->] depthwise [-> 1x1 projection]
  //     (at least two), each read only by the next -> ConvChain(x [, residual]) whose "body"
  //     attribute holds the convolutions themselves and their weights: the op runs them in one
  //     pass over the rows, or runs the body layer by layer where that is faster or its kernels
  //     do not apply (ops/conv.cpp).
  uses.build(g, removed);
  index();
  auto conv_weight = [&](const ir::Node& n) -> const ir::Initializer* {
    const bool conv = is(n, "Conv") || (n.domain == "ai.lopper" && n.op_type == "FusedConv");
    if (!conv || n.inputs.size() < 2 || outputs_used(n) != 1 || n.outputs[0].empty())
      return nullptr;
    const auto* ap = find_attr(n, "auto_pad");
    if (ap && !ap->s.empty() && ap->s != "NOTSET") return nullptr;
    const ir::Initializer* w = g.find_initializer(n.inputs[1]);
    if (!w || w->value.dim() != 4 || !w->value.is_floating_point()) return nullptr;
    if (n.inputs.size() > 2 && !n.inputs[2].empty() && !g.find_initializer(n.inputs[2]))
      return nullptr;
    return w;
  };
  auto ints_are = [&](const ir::Node& n, const char* name, int64_t v) {
    const auto* a = find_attr(n, name);
    if (!a) return true;
    for (int64_t x : a->ints)
      if (x != v) return false;
    return true;
  };
  auto group_of = [&](const ir::Node& n) {
    const auto* a = find_attr(n, "group");
    return a ? a->i : int64_t{1};
  };
  // A 1x1 convolution of stride 1 without padding; `residual`: whether it may add one.
  auto pointwise = [&](const ir::Node& n, bool residual) {
    const ir::Initializer* w = conv_weight(n);
    return w && w->value.size(2) == 1 && w->value.size(3) == 1 && group_of(n) == 1 &&
           ints_are(n, "strides", 1) && ints_are(n, "pads", 0) && ints_are(n, "dilations", 1) &&
           (residual || n.inputs.size() <= 3);
  };
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    if (removed[i]) continue;
    const ir::Node& dw = g.nodes[i];
    const ir::Initializer* dww = conv_weight(dw);
    if (!dww || dww->value.size(1) != 1 || group_of(dw) != dww->value.size(0) || group_of(dw) < 2)
      continue;
    const int64_t m = dww->value.size(0);
    std::optional<size_t> expand, project;
    auto p = producer.find(dw.inputs[0]);
    if (p != producer.end() && !removed[p->second] && uses.single(dw.inputs[0]) &&
        pointwise(g.nodes[p->second], false) &&
        g.find_initializer(g.nodes[p->second].inputs[1])->value.size(0) == m)
      expand = p->second;
    if (dw.inputs.size() <= 3 && uses.single(dw.outputs[0])) {
      const size_t r = *reader_of(dw.outputs[0]);
      const ir::Node& pn = g.nodes[r];
      if (pointwise(pn, true) && pn.inputs[0] == dw.outputs[0] &&
          (pn.inputs.size() <= 3 || pn.inputs[3] != dw.outputs[0]) &&
          g.find_initializer(pn.inputs[1])->value.size(1) == m)
        project = r;
    }
    if (!expand && !project) continue;
    std::vector<size_t> pieces;
    if (expand) pieces.push_back(*expand);
    pieces.push_back(i);
    if (project) pieces.push_back(*project);
    const ir::Node& first = g.nodes[pieces.front()];
    ir::Node& last = g.nodes[pieces.back()];
    auto body = std::make_shared<ir::Graph>();
    body->name = dw.name + "/chain";
    body->inputs.push_back({first.inputs[0], {}, ""});
    std::vector<std::string> inputs{first.inputs[0]};
    if (last.inputs.size() > 3 && !last.inputs[3].empty()) {
      body->inputs.push_back({last.inputs[3], {}, ""});
      inputs.push_back(last.inputs[3]);
    }
    body->outputs.push_back({last.outputs[0], {}, ""});
    for (size_t k : pieces) {
      const ir::Node& n = g.nodes[k];
      body->nodes.push_back(n);
      for (size_t q = 1; q < std::min<size_t>(3, n.inputs.size()); ++q)
        if (!n.inputs[q].empty() && !body->find_initializer(n.inputs[q]))
          body->initializers.push_back(*g.find_initializer(n.inputs[q]));  // shares the tensor
    }
    ir::Node chain;
    chain.name = dw.name.empty() ? "" : dw.name + "/chain";
    chain.domain = "ai.lopper";
    chain.op_type = "ConvChain";
    chain.inputs = std::move(inputs);
    chain.outputs = {last.outputs[0]};
    ir::Attribute ba;
    ba.name = "body";
    ba.type = ir::AttrType::kGraph;
    ba.g = body;
    chain.attrs = {ba};
    // NOTE: in the place of the last piece: its residual may be made after the first.
    for (size_t k : pieces) removed[k] = k != pieces.back();
    last = std::move(chain);
    uses.build(g, removed);
    index();
    // The weights now in the body alone leave the graph (a lowered precision would convert them
    // twice), unless they are also graph inputs (an input's default).
    auto is_input = [&](const std::string& name) {
      return std::any_of(g.inputs.begin(), g.inputs.end(),
                         [&](const ir::ValueInfo& v) { return v.name == name; });
    };
    for (const auto& t : body->initializers)
      if (!uses.count.count(t.name) && !is_input(t.name))
        g.initializers.erase(
            std::find_if(g.initializers.begin(), g.initializers.end(),
                         [&](const ir::Initializer& i) { return i.name == t.name; }));
  }

  // 3. GELU written out with Erf (what the TorchScript exporter emits before opset 20):
  //    Mul(Mul(x, Add(Erf(Div(x, sqrt 2)), 1)), 0.5) -> Gelu(x).
  uses.build(g, removed);
  index();
  auto scalar_is = [&](const std::string& v, double want) {
    auto s = scalar_initializer(g, v);
    return s && std::abs(*s - want) < 1e-4 * std::abs(want);
  };
  auto other_input = [](const ir::Node& n, const std::string& v) -> std::string {
    if (n.inputs.size() != 2) return "";
    return n.inputs[0] == v ? n.inputs[1] : (n.inputs[1] == v ? n.inputs[0] : "");
  };
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    if (removed[i] || !is(g.nodes[i], "Erf") || g.nodes[i].inputs.size() != 1) continue;
    auto div_it = producer.find(g.nodes[i].inputs[0]);
    if (div_it == producer.end()) continue;
    const ir::Node& div = g.nodes[div_it->second];
    if (!is(div, "Div") || div.inputs.size() != 2 || !scalar_is(div.inputs[1], std::sqrt(2.0)) ||
        !uses.single(div.outputs[0]))
      continue;
    const std::string x = div.inputs[0];
    const std::string erf_out = g.nodes[i].outputs[0];
    if (!uses.single(erf_out)) continue;
    size_t add_i = *reader_of(erf_out);
    const ir::Node& add = g.nodes[add_i];
    if (!is(add, "Add") || !scalar_is(other_input(add, erf_out), 1.0) ||
        !uses.single(add.outputs[0]))
      continue;
    size_t mul1_i = *reader_of(add.outputs[0]);
    const ir::Node& mul1 = g.nodes[mul1_i];
    if (!is(mul1, "Mul") || other_input(mul1, add.outputs[0]) != x || !uses.single(mul1.outputs[0]))
      continue;
    size_t mul2_i = *reader_of(mul1.outputs[0]);
    ir::Node& mul2 = g.nodes[mul2_i];
    if (!is(mul2, "Mul") || !scalar_is(other_input(mul2, mul1.outputs[0]), 0.5)) continue;
    ir::Node gelu;
    gelu.name = mul2.name.empty() ? mul2.outputs[0] + "/gelu" : mul2.name;
    gelu.op_type = "Gelu";
    gelu.inputs = {x};
    gelu.outputs = {mul2.outputs[0]};
    mul2 = gelu;
    removed[div_it->second] = removed[i] = removed[add_i] = removed[mul1_i] = true;
    uses.build(g, removed);
    index();
  }

  // 4. MatMul by a constant 2-D weight (or Gemm as a Linear layer) [+ bias Add] [+ activation]
  //    -> FusedMatMul.
  uses.build(g, removed);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    ir::Node& mm = g.nodes[i];
    if (removed[i] || outputs_used(mm) != 1 || mm.inputs.size() < 2) continue;
    const ir::Initializer* w = g.find_initializer(mm.inputs[1]);
    if (!w || w->value.dim() != 2 || !w->value.is_floating_point()) continue;
    bool trans_b = false;
    std::string bias;
    if (is(mm, "Gemm")) {
      auto iattr = [&](const char* k, int64_t d) {
        auto* a = find_attr(mm, k);
        return a ? a->i : d;
      };
      auto fattr = [&](const char* k, float d) {
        auto* a = find_attr(mm, k);
        return a ? a->f : d;
      };
      if (iattr("transA", 0) || fattr("alpha", 1.0f) != 1.0f || fattr("beta", 1.0f) != 1.0f)
        continue;
      trans_b = iattr("transB", 0) != 0;
      if (mm.inputs.size() > 2 && !mm.inputs[2].empty()) {
        const auto* b = g.find_initializer(mm.inputs[2]);
        int64_t n = trans_b ? w->value.size(0) : w->value.size(1);
        if (!b || b->value.numel() != n) continue;
        bias = mm.inputs[2];
      }
    } else if (!is(mm, "MatMul")) {
      continue;
    }
    int64_t n = trans_b ? w->value.size(0) : w->value.size(1);
    std::string out = mm.outputs[0];
    std::vector<size_t> absorbed;
    std::vector<ir::Attribute> act;
    if (bias.empty() && uses.single(out)) {
      size_t r = *reader_of(out);
      const ir::Node& add = g.nodes[r];
      std::string b = other_input(add, out);
      const auto* bt = b.empty() ? nullptr : g.find_initializer(b);
      if (is(add, "Add") && bt && bt->value.dim() == 1 && bt->value.size(0) == n &&
          bt->value.scalar_type() == w->value.scalar_type()) {
        bias = b;
        absorbed.push_back(r);
        out = add.outputs[0];
      }
    }
    absorb_activation(out, absorbed, act);
    if (absorbed.empty()) continue;
    mm.inputs = {mm.inputs[0], mm.inputs[1], bias};
    mm.attrs.clear();  // Gemm's are checked above: transB is the one that stays
    if (trans_b) mm.attrs.push_back(int_attr("transB", 1));
    fuse_into(mm, "FusedMatMul", out, act, absorbed);
  }

  // 5. Grouped-query attention's key/value head repeat read by a MatMul:
  //    MatMul(A, [Transpose perm 0,1,3,2](Reshape(Expand(..), shape))) ->
  //    GroupedMatMul(A, Expand's output, shape), which skips the copy the Reshape makes of the
  //    repeated heads (checked at run time; otherwise it does what the nodes did).
  uses.build(g, removed);
  index();
  auto made_by = [&](const std::string& v, const char* op) -> std::optional<size_t> {
    auto it = producer.find(v);
    if (it == producer.end() || !is(g.nodes[it->second], op)) return std::nullopt;
    return it->second;
  };
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    ir::Node& mm = g.nodes[i];
    if (removed[i] || !is(mm, "MatMul") || mm.inputs.size() != 2 || outputs_used(mm) != 1 ||
        opset < 5)
      continue;
    std::string b = mm.inputs[1];
    std::vector<size_t> absorbed;
    bool trans_b = false;
    if (auto t = made_by(b, "Transpose"); t && uses.single(b)) {
      const auto* perm = find_attr(g.nodes[*t], "perm");
      if (!perm || perm->ints != std::vector<int64_t>{0, 1, 3, 2}) continue;
      trans_b = true;
      absorbed.push_back(*t);
      b = g.nodes[*t].inputs[0];
    }
    auto r = made_by(b, "Reshape");
    if (!r || !uses.single(b) || g.nodes[*r].inputs.size() != 2 ||
        !made_by(g.nodes[*r].inputs[0], "Expand"))
      continue;
    const ir::Node& reshape = g.nodes[*r];
    absorbed.push_back(*r);
    std::vector<ir::Attribute> attrs{int_attr("transB", trans_b)};
    if (const auto* az = find_attr(reshape, "allowzero"); az && opset >= 14) attrs.push_back(*az);
    mm.domain = "ai.lopper";
    mm.op_type = "GroupedMatMul";
    mm.inputs = {mm.inputs[0], reshape.inputs[0], reshape.inputs[1]};
    mm.attrs = attrs;
    for (size_t k : absorbed) removed[k] = true;
    uses.build(g, removed);
  }

  // 6. RMSNorm written out, as PyTorch exports LLaMA's: Mul(gamma, Mul(x, R)) with
  //    R = Reciprocal(Sqrt(Add(ReduceMean(Pow(x, 2), axes [-1]), eps))) (or Div(1, Sqrt(..)), or
  //    Mul(x, R) as Div(x, Sqrt(..))) -> RMSNormalization(x, gamma): one pass over each row
  //    instead of seven ops of a few microseconds each.
  uses.build(g, removed);
  index();
  auto reader = [&](const std::string& v, const char* op) -> std::optional<size_t> {
    if (!uses.single(v)) return std::nullopt;
    auto r = reader_of(v);
    if (!r || !is(g.nodes[*r], op)) return std::nullopt;
    return r;
  };
  auto ints_initializer = [&](const std::string& name) -> std::optional<std::vector<int64_t>> {
    const auto* t = g.find_initializer(name);
    if (!t || t->value.is_floating_point() || t->value.dim() > 1) return std::nullopt;
    at::Tensor v = t->value.to(at::kLong).contiguous();
    return std::vector<int64_t>(v.data_ptr<int64_t>(), v.data_ptr<int64_t>() + v.numel());
  };
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const ir::Node& pow = g.nodes[i];
    if (removed[i] || !is(pow, "Pow") || pow.inputs.size() != 2 || !scalar_is(pow.inputs[1], 2.0))
      continue;
    const std::string x = pow.inputs[0];
    auto mean = reader(pow.outputs[0], "ReduceMean");
    if (!mean) continue;
    const ir::Node& rm = g.nodes[*mean];
    std::optional<std::vector<int64_t>> axes;
    if (opset >= 18)
      axes = rm.inputs.size() == 2 ? ints_initializer(rm.inputs[1]) : std::nullopt;
    else if (const auto* a = find_attr(rm, "axes"))
      axes = a->ints;
    const auto* keep = find_attr(rm, "keepdims");
    if (!axes || *axes != std::vector<int64_t>{-1} || (keep && keep->i == 0)) continue;
    auto add = reader(rm.outputs[0], "Add");
    if (!add) continue;
    const auto eps = scalar_initializer(g, other_input(g.nodes[*add], rm.outputs[0]));
    auto sqrt = reader(g.nodes[*add].outputs[0], "Sqrt");
    if (!eps || !sqrt) continue;
    const std::string root = g.nodes[*sqrt].outputs[0];
    std::vector<size_t> absorbed{i, *mean, *add, *sqrt};
    std::optional<size_t> normed;  // the node whose output is x / sqrt(..)
    if (auto rc = reader(root, "Reciprocal")) {
      absorbed.push_back(*rc);
      auto m = reader(g.nodes[*rc].outputs[0], "Mul");
      if (m && other_input(g.nodes[*m], g.nodes[*rc].outputs[0]) == x) normed = m;
    } else if (auto dv = reader(root, "Div");
               dv && g.nodes[*dv].inputs.size() == 2 && g.nodes[*dv].inputs[1] == root) {
      const std::string num = g.nodes[*dv].inputs[0];
      if (num == x) {
        normed = dv;
      } else if (scalar_is(num, 1.0)) {
        absorbed.push_back(*dv);
        auto m = reader(g.nodes[*dv].outputs[0], "Mul");
        if (m && other_input(g.nodes[*m], g.nodes[*dv].outputs[0]) == x) normed = m;
      }
    }
    if (!normed) continue;
    absorbed.push_back(*normed);
    auto scaled = reader(g.nodes[*normed].outputs[0], "Mul");
    if (!scaled) continue;
    const std::string gamma = other_input(g.nodes[*scaled], g.nodes[*normed].outputs[0]);
    const auto* gt = gamma.empty() ? nullptr : g.find_initializer(gamma);
    if (!gt || gt->value.dim() != 1 || !gt->value.is_floating_point()) continue;
    ir::Node& out = g.nodes[*scaled];
    out.op_type = "RMSNormalization";
    out.inputs = {x, gamma};
    out.attrs = {int_attr("axis", -1), make_attr("epsilon", *eps)};
    for (size_t k : absorbed) removed[k] = true;
    uses.build(g, removed);
  }

  // 7. Attention's scores: Softmax(MatMul(Q [* a], K [* b]) [* c | / c]) along the last axis, with
  //    a, b, c scalar constants (PyTorch's exports of scaled_dot_product_attention put sqrt(scale)
  //    on Q and on K; older ones divide the product) -> ScaledSoftmax(MatMul(Q, K), scale a*b*c):
  //    the two or three passes over Q, K or the scores become a multiply inside the softmax's own.
  uses.build(g, removed);
  index();
  // The tensor before a multiplication (or division) by a scalar constant read by nothing else,
  // and the factor; {v, 1} when v is not made so.
  auto unscaled = [&](const std::string& v,
                      std::vector<size_t>& absorbed) -> std::pair<std::string, double> {
    auto it = producer.find(v);
    if (it == producer.end() || !uses.single(v)) return {v, 1.0};
    const ir::Node& n = g.nodes[it->second];
    if (n.inputs.size() != 2 || (!is(n, "Mul") && !is(n, "Div"))) return {v, 1.0};
    for (int k = 0; k < 2; ++k) {
      if (k == 0 && is(n, "Div")) continue;  // c / x is not a scaling of x
      const auto c = scalar_initializer(g, n.inputs[k]);
      // NOTE: a constant of rank 2 or more would raise the product's rank by broadcasting.
      if (!c || *c == 0.f || !std::isfinite(*c) || g.find_initializer(n.inputs[k])->value.dim() > 1)
        continue;
      absorbed.push_back(it->second);
      return {n.inputs[1 - k], is(n, "Div") ? 1.0 / *c : double(*c)};
    }
    return {v, 1.0};
  };
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    ir::Node& sm = g.nodes[i];
    if (removed[i] || !is(sm, "Softmax") || sm.inputs.size() != 1) continue;
    const auto* axis = find_attr(sm, "axis");
    if (axis ? axis->i != -1 : opset < 13) continue;  // the last axis, whatever the rank
    std::vector<size_t> absorbed;
    auto [scores, c] = unscaled(sm.inputs[0], absorbed);
    auto mm = producer.find(scores);
    if (mm == producer.end() || !uses.single(scores) || !is(g.nodes[mm->second], "MatMul"))
      continue;
    ir::Node& product = g.nodes[mm->second];
    auto [q, a] = unscaled(product.inputs[0], absorbed);
    auto [k, b] = unscaled(product.inputs[1], absorbed);
    if (absorbed.empty()) continue;
    product.inputs = {q, k};
    sm.domain = "ai.lopper";
    sm.op_type = "ScaledSoftmax";
    sm.inputs = {scores};
    sm.attrs = {make_attr("scale", static_cast<float>(a * b * c))};
    for (size_t r : absorbed) removed[r] = true;
    uses.build(g, removed);
    index();
  }

  // 8. Attention itself: MatMul(ScaledSoftmax(MatMul(Q, Kt)) | Softmax(...) along the last axis,
  //    V), the scores and the probabilities read by nothing else -> ScaledAttention(Q, Kt, V):
  //    on the CPU a block of each head's scores stays in the caches through the three steps
  //    (a masked attention adds the mask between them and stays as it is).
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    ir::Node& out = g.nodes[i];
    if (removed[i] || !is(out, "MatMul") || out.inputs.size() != 2) continue;
    auto sm = producer.find(out.inputs[0]);
    if (sm == producer.end() || !uses.single(out.inputs[0])) continue;
    const ir::Node& soft = g.nodes[sm->second];
    float scale = 1.f;
    if (soft.domain == "ai.lopper" && soft.op_type == "ScaledSoftmax") {
      const auto* a = find_attr(soft, "scale");
      scale = a ? a->f : 1.f;
    } else if (is(soft, "Softmax") && soft.inputs.size() == 1) {
      const auto* axis = find_attr(soft, "axis");
      if (axis ? axis->i != -1 : opset < 13) continue;
    } else {
      continue;
    }
    auto mm = producer.find(soft.inputs[0]);
    if (mm == producer.end() || !uses.single(soft.inputs[0]) ||
        !is(g.nodes[mm->second], "MatMul") || g.nodes[mm->second].inputs.size() != 2)
      continue;
    const size_t scores = mm->second, probs = sm->second;
    out.inputs = {g.nodes[scores].inputs[0], g.nodes[scores].inputs[1], out.inputs[1]};
    out.domain = "ai.lopper";
    out.op_type = "ScaledAttention";
    out.attrs = {make_attr("scale", scale)};
    removed[scores] = removed[probs] = true;
    uses.build(g, removed);
    index();
  }

  std::vector<ir::Node> kept;
  for (size_t i = 0; i < g.nodes.size(); ++i)
    if (!removed[i]) kept.push_back(std::move(g.nodes[i]));
  g.nodes = std::move(kept);
  return g;
}

}  // namespace lopper::exec
