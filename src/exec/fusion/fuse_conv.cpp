// Conv [+ residual Add] [+ activation] -> ai.lopper.FusedConv(x, W, B [, residual]): the
// residual added and the activation applied as the convolution writes its output.
#include "exec/fusion/passes.h"
#include "exec/fusion/rewrite.h"

namespace lopper::exec::fusion {

bool fuse_conv(ir::Graph& g, int64_t opset) {
  Rewrite r(g, opset);
  for (size_t i = 0; i < r.size(); ++i) {
    if (!r.writes_one(i, "Conv")) continue;
    Absorbed a{g.nodes[i].outputs[0], {}, {}};
    std::string residual;
    if (auto k = r.reader(a.out, "Add")) {
      const ir::Node& add = g.nodes[*k];
      if (add.inputs.size() == 2 && outputs_used(add) == 1 && add.inputs[0] != add.inputs[1]) {
        residual = other_input(add, a.out);
        a.take(*k, add.outputs[0]);
      }
    }
    r.absorb_activation(a);
    if (a.nodes.empty()) continue;
    ir::Node& c = r.change(i);
    c.inputs.resize(3);
    if (!residual.empty()) c.inputs.push_back(residual);
    r.fuse_into(i, "FusedConv", a);
  }
  return r.finish();
}

}  // namespace lopper::exec::fusion
