// ShuffleNet's channel shuffle, [Concat(x1, ..., xn, axis 1) ->] Reshape to 5-D -> Transpose perm
// 0,2,1,3,4 -> Reshape, each read only by the next -> ai.lopper.ChannelShuffle(shape1, shape2,
// x1, ..., xn) with allowzero = [the Reshapes' allowzero]: one pass from the inputs to the
// shuffled tensor instead of a concatenation, a copy to NCHW and back (ops/shape.cpp).
#include "exec/fusion/passes.h"
#include "exec/fusion/rewrite.h"

namespace lopper::exec::fusion {

bool fuse_channel_shuffle(ir::Graph& g, int64_t opset) {
  if (opset < 5) return false;  // Reshape's shape became an input in opset 5
  Rewrite r(g, opset);
  auto allowzero = [&](const ir::Node& n) -> int64_t {
    const auto* az = n.attr("allowzero");
    return opset >= 14 && az && az->i != 0 ? 1 : 0;
  };
  for (size_t i = 0; i < r.size(); ++i) {
    const ir::Node& last = g.nodes[i];
    if (!r.live(i) || !is(last, "Reshape") || last.inputs.size() != 2 || outputs_used(last) != 1 ||
        last.outputs[0].empty() || !r.single(last.inputs[0]))
      continue;
    auto t = r.made_by(last.inputs[0], "Transpose");
    if (!t) continue;
    const ir::Node& tr = g.nodes[*t];
    const auto* perm = tr.attr("perm");
    if (!perm || perm->ints != std::vector<int64_t>{0, 2, 1, 3, 4} || tr.inputs.size() != 1 ||
        !r.single(tr.inputs[0]))
      continue;
    auto f = r.made_by(tr.inputs[0], "Reshape");
    if (!f || g.nodes[*f].inputs.size() != 2) continue;
    const ir::Node& first = g.nodes[*f];
    std::vector<size_t> absorbed{*f, *t};
    std::vector<std::string> xs{first.inputs[0]};
    auto k = r.made_by(first.inputs[0], "Concat");
    if (k && r.single(first.inputs[0])) {
      const ir::Node& cat = g.nodes[*k];
      const ir::Attribute* axis = cat.attr("axis");
      bool plain = axis && axis->i == 1 && outputs_used(cat) == 1;
      for (const auto& in : cat.inputs) plain = plain && !in.empty();
      if (plain) {
        xs = cat.inputs;
        absorbed.push_back(*k);
      }
    }
    std::vector<std::string> inputs{first.inputs[1], last.inputs[1]};
    inputs.insert(inputs.end(), xs.begin(), xs.end());
    const ir::Attribute az = ir::ints_attr("allowzero", {allowzero(first), allowzero(last)});
    ir::Node& shuffle = r.change(i);
    shuffle.domain = "ai.lopper";
    shuffle.op_type = "ChannelShuffle";
    shuffle.inputs = std::move(inputs);
    shuffle.attrs = {az};
    for (size_t a : absorbed) r.remove(a);
    r.commit();
  }
  return r.finish();
}

}  // namespace lopper::exec::fusion
