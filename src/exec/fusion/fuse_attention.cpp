// Attention itself: MatMul(ScaledSoftmax(MatMul(Q, Kt)) | Softmax(...) along the last axis, V),
// the scores and the probabilities read by nothing else -> ai.lopper.ScaledAttention(Q, Kt, V):
// on the CPU a block of each head's scores stays in the caches through the three steps (a masked
// attention adds the mask between them and stays as it is).
#include "exec/fusion/passes.h"
#include "exec/fusion/rewrite.h"

namespace lopper::exec::fusion {

bool fuse_attention(ir::Graph& g, int64_t opset) {
  Rewrite r(g, opset);
  for (size_t i = 0; i < r.size(); ++i) {
    const ir::Node& out = g.nodes[i];
    if (!r.live(i) || !is(out, "MatMul") || out.inputs.size() != 2) continue;
    auto probs = r.producer(out.inputs[0]);
    if (!probs || !r.single(out.inputs[0])) continue;
    const ir::Node& soft = g.nodes[*probs];
    float scale = 1.f;
    if (soft.domain == "ai.lopper" && soft.op_type == "ScaledSoftmax") {
      const auto* a = soft.attr("scale");
      scale = a ? a->f : 1.f;
    } else if (is(soft, "Softmax") && soft.inputs.size() == 1) {
      const auto* axis = soft.attr("axis");
      if (axis ? axis->i != -1 : opset < 13) continue;
    } else {
      continue;
    }
    auto scores = r.made_by(soft.inputs[0], "MatMul");
    if (!scores || !r.single(soft.inputs[0]) || g.nodes[*scores].inputs.size() != 2) continue;
    std::vector<std::string> inputs{g.nodes[*scores].inputs[0], g.nodes[*scores].inputs[1],
                                    out.inputs[1]};
    // A Mul that made Q or Kt, read by nothing else: its other input becomes a factor input (one
    // element at run time: part of the scale, a pass over Q or Kt saved).
    std::vector<size_t> muls;
    std::string factors[2];
    for (int k = 0; k < 2; ++k) {
      auto p = r.producer(inputs[k]);
      if (!p || !r.single(inputs[k])) continue;
      const ir::Node& m = g.nodes[*p];
      if (!is(m, "Mul") || m.inputs.size() != 2 || m.inputs[0].empty() || m.inputs[1].empty())
        continue;
      inputs[k] = m.inputs[0];
      factors[k] = m.inputs[1];
      muls.push_back(*p);
    }
    if (!muls.empty()) inputs.insert(inputs.end(), {factors[0], factors[1]});
    ir::Node& a = r.change(i);
    a.inputs = std::move(inputs);
    a.domain = "ai.lopper";
    a.op_type = "ScaledAttention";
    a.attrs = {float_attr("scale", scale)};
    r.remove(*scores);
    r.remove(*probs);
    for (size_t m : muls) r.remove(m);
    r.commit();
  }
  return r.finish();
}

}  // namespace lopper::exec::fusion
