// GELU written out with Erf (what the TorchScript exporter emits before opset 20):
// Mul(Mul(x, Add(Erf(Div(x, sqrt 2)), 1)), 0.5) -> Gelu(x).
#include <cmath>

#include "exec/fusion/passes.h"
#include "exec/fusion/rewrite.h"

namespace lopper::exec::fusion {

bool fuse_gelu(ir::Graph& g, int64_t opset) {
  Rewrite r(g, opset);
  for (size_t i = 0; i < r.size(); ++i) {
    if (!r.live(i) || !is(g.nodes[i], "Erf") || g.nodes[i].inputs.size() != 1) continue;
    auto d = r.made_by(g.nodes[i].inputs[0], "Div");
    if (!d) continue;
    const ir::Node& div = g.nodes[*d];
    if (div.inputs.size() != 2 || !r.scalar_is(div.inputs[1], std::sqrt(2.0)) ||
        !r.single(div.outputs[0]))
      continue;
    const std::string x = div.inputs[0];
    auto add = r.reader(g.nodes[i].outputs[0], "Add");
    if (!add || !r.scalar_is(other_input(g.nodes[*add], g.nodes[i].outputs[0]), 1.0)) continue;
    auto mul1 = r.reader(g.nodes[*add].outputs[0], "Mul");
    if (!mul1 || other_input(g.nodes[*mul1], g.nodes[*add].outputs[0]) != x) continue;
    auto mul2 = r.reader(g.nodes[*mul1].outputs[0], "Mul");
    if (!mul2 || !r.scalar_is(other_input(g.nodes[*mul2], g.nodes[*mul1].outputs[0]), 0.5))
      continue;
    ir::Node gelu;
    const ir::Node& last = g.nodes[*mul2];
    gelu.name = last.name.empty() ? last.outputs[0] + "/gelu" : last.name;
    gelu.op_type = "Gelu";
    gelu.inputs = {x};
    gelu.outputs = {last.outputs[0]};
    r.change(*mul2) = std::move(gelu);
    for (size_t k : {*d, i, *add, *mul1}) r.remove(k);
    r.commit();
  }
  return r.finish();
}

}  // namespace lopper::exec::fusion
