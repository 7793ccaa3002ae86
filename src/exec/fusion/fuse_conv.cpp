// Conv [+ residual Add] [+ activation] -> ai.lopper.FusedConv(x, W, B [, residual]): the
// residual added and the activation applied as the convolution writes its output.
#include "exec/fusion/passes.h"
#include "exec/fusion/rewrite.h"

namespace lopper::exec::fusion {

bool fuse_conv(ir::Graph& g, int64_t opset) {
  Rewrite r(g, opset);
  for (size_t i = 0; i < r.size(); ++i) {
    const ir::Node& conv = g.nodes[i];
    if (!r.writes_one(i, "Conv")) continue;
    std::string out = conv.outputs[0];
    std::string residual;
    std::vector<ir::Attribute> act;
    std::vector<size_t> absorbed;
    if (auto a = r.reader(out, "Add")) {
      const ir::Node& add = g.nodes[*a];
      if (add.inputs.size() == 2 && outputs_used(add) == 1 && add.inputs[0] != add.inputs[1]) {
        residual = other_input(add, out);
        absorbed.push_back(*a);
        out = add.outputs[0];
      }
    }
    r.absorb_activation(out, absorbed, act);
    if (absorbed.empty()) continue;
    ir::Node& c = r.change(i);
    c.inputs.resize(3);
    if (!residual.empty()) c.inputs.push_back(residual);
    r.fuse_into(i, "FusedConv", out, act, absorbed);
  }
  return r.finish();
}

}  // namespace lopper::exec::fusion
