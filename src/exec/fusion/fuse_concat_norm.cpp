// Concat along the channels whose only reader is a BatchNormalization (DenseNet's, at every layer)
// -> ai.lopper.FusedConcatNorm(scale, B, mean, var, x1, ..., xn): each input normalised straight
// into its slice of the output; the concatenation itself is never written.
#include "exec/fusion/passes.h"
#include "exec/fusion/rewrite.h"

namespace lopper::exec::fusion {

bool fuse_concat_norm(ir::Graph& g, int64_t opset) {
  Rewrite r(g, opset);
  for (size_t i = 0; i < r.size(); ++i) {
    const ir::Node& cat = g.nodes[i];
    if (!r.writes_one(i, "Concat")) continue;
    const ir::Attribute* axis = cat.attr("axis");
    auto n = r.reader(cat.outputs[0]);
    if (!axis || axis->i != 1 || !n) continue;
    const ir::Node& bn = g.nodes[*n];
    const bool norm = (is(bn, "BatchNormalization") ||
                       (bn.domain == "ai.lopper" && bn.op_type == "FusedBatchNormalization"));
    if (!norm || bn.inputs.size() != 5 || bn.inputs[0] != cat.outputs[0] || outputs_used(bn) != 1)
      continue;
    bool plain = true;  // every input of the concatenation given (no optional one left out)
    for (const auto& in : cat.inputs) plain = plain && !in.empty();
    if (!plain) continue;
    std::vector<std::string> inputs(bn.inputs.begin() + 1, bn.inputs.end());
    inputs.insert(inputs.end(), cat.inputs.begin(), cat.inputs.end());
    ir::Node& fused = r.change(*n);
    fused.domain = "ai.lopper";
    fused.op_type = "FusedConcatNorm";
    fused.inputs = std::move(inputs);
    r.remove(i);
    r.commit();
  }
  return r.finish();
}

}  // namespace lopper::exec::fusion
