// An inverted residual's convolutions, [1x1 expansion ->] depthwise [-> 1x1 projection] (at least
// two), or a ResNeXt bottleneck's, its middle one grouped (a few channels a group), each read only
// by the next -> ai.lopper.ConvChain(x [, residual]) whose "body" attribute
// holds the convolutions themselves and their weights: the op runs them in one pass over the rows,
// or runs the body layer by layer where that is faster or its kernels do not apply (ops/conv.cpp).
#include <algorithm>
#include <memory>

#include "exec/fusion/passes.h"
#include "exec/fusion/rewrite.h"

namespace lopper::exec::fusion {
namespace {

// Whether attribute `name` of `n` is absent or every one of its ints is `v`.
bool ints_are(const ir::Node& n, const char* name, int64_t v) {
  const auto* a = n.attr(name);
  if (!a) return true;
  return std::all_of(a->ints.begin(), a->ints.end(), [&](int64_t x) { return x == v; });
}

int64_t group_of(const ir::Node& n) {
  const auto* a = n.attr("group");
  return a ? a->i : int64_t{1};
}

// The 4-D weight of a Conv or FusedConv of constant weight and bias, explicit padding and one
// output; nullptr for any other node.
const ir::Initializer* conv_weight(const Rewrite& r, const ir::Node& n) {
  const bool conv = is(n, "Conv") || (n.domain == "ai.lopper" && n.op_type == "FusedConv");
  if (!conv || n.inputs.size() < 2 || outputs_used(n) != 1 || n.outputs[0].empty()) return nullptr;
  const auto* ap = n.attr("auto_pad");
  if (ap && !ap->s.empty() && ap->s != "NOTSET") return nullptr;
  const ir::Initializer* w = r.initializer(n.inputs[1]);
  if (!w || w->value.dim() != 4 || !w->value.is_floating_point()) return nullptr;
  if (n.inputs.size() > 2 && !n.inputs[2].empty() && !r.initializer(n.inputs[2])) return nullptr;
  return w;
}

// A 1x1 convolution of stride 1 without padding; `residual`: whether it may add one.
const ir::Initializer* pointwise(const Rewrite& r, const ir::Node& n, bool residual) {
  const ir::Initializer* w = conv_weight(r, n);
  const bool ok = w && w->value.size(2) == 1 && w->value.size(3) == 1 && group_of(n) == 1 &&
                  ints_are(n, "strides", 1) && ints_are(n, "pads", 0) &&
                  ints_are(n, "dilations", 1) && (residual || n.inputs.size() <= 3);
  return ok ? w : nullptr;
}

}  // namespace

bool fuse_conv_chain(ir::Graph& g, int64_t opset) {
  Rewrite r(g, opset);
  for (size_t i = 0; i < r.size(); ++i) {
    if (!r.live(i)) continue;
    const ir::Node& dw = g.nodes[i];
    const ir::Initializer* dww = conv_weight(r, dw);
    if (!dww) continue;
    // Depthwise (one channel a group), or groups of 2, 4 or 8 channels in and out (ResNeXt's
    // first two stages, the narrow-group kernel's): as many channels in as out.
    const int64_t m = dww->value.size(0), width = dww->value.size(1);
    if (group_of(dw) < 2 || group_of(dw) * width != m ||
        !(width == 1 || width == 2 || width == 4 || width == 8))
      continue;
    std::optional<size_t> expand, project;
    if (auto p = r.producer(dw.inputs[0]); p && r.single(dw.inputs[0])) {
      const auto* w = pointwise(r, g.nodes[*p], false);
      if (w && w->value.size(0) == m) expand = p;
    }
    if (dw.inputs.size() <= 3) {
      if (auto p = r.reader(dw.outputs[0])) {
        const ir::Node& pn = g.nodes[*p];
        const auto* w = pointwise(r, pn, true);
        if (w && pn.inputs[0] == dw.outputs[0] &&
            (pn.inputs.size() <= 3 || pn.inputs[3] != dw.outputs[0]) && w->value.size(1) == m)
          project = p;
      }
    }
    if (!expand && !project) continue;
    std::vector<size_t> pieces;
    if (expand) pieces.push_back(*expand);
    pieces.push_back(i);
    if (project) pieces.push_back(*project);
    const ir::Node& first = g.nodes[pieces.front()];
    const ir::Node& last = g.nodes[pieces.back()];
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
          body->initializers.push_back(*r.initializer(n.inputs[q]));  // shares the tensor
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
    const size_t at = pieces.back();
    r.change(at) = std::move(chain);
    for (size_t k : pieces)
      if (k != at) r.remove(k);
    r.commit();
    // The weights now in the body alone leave the graph (a lowered precision would convert them
    // twice), unless they are also graph inputs (an input's default).
    for (const auto& t : body->initializers)
      if (r.uses(t.name) == 0 &&
          std::none_of(g.inputs.begin(), g.inputs.end(),
                       [&](const ir::ValueInfo& v) { return v.name == t.name; }))
        r.drop_initializer(t.name);
  }
  return r.finish();
}

}  // namespace lopper::exec::fusion
