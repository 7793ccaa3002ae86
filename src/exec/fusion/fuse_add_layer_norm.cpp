// A transformer's residual Add whose sum a LayerNormalization normalises (BERT's and GPT's blocks,
// a ViT's): -> ai.lopper.AddLayerNormalization(A, B, scale [, bias]) writing the norm and, where
// anything else reads the sum (a pre-norm block's next residual), the sum too: one pass over each
// row instead of the Add's and the norm's (and the sum never read back where nothing else needs
// it).
#include "exec/fusion/passes.h"
#include "exec/fusion/rewrite.h"

namespace lopper::exec::fusion {

bool fuse_add_layer_norm(ir::Graph& g, int64_t opset) {
  Rewrite r(g, opset);
  for (size_t i = 0; i < r.size(); ++i) {
    if (!r.writes_one(i, "Add")) continue;
    const ir::Node& add = g.nodes[i];
    const std::string sum = add.outputs[0];
    if (add.inputs.size() != 2 || add.inputs[0].empty() || add.inputs[1].empty()) continue;
    std::optional<size_t> ln;
    for (size_t n : r.readers(sum)) {
      const ir::Node& node = g.nodes[n];
      if (is(node, "LayerNormalization") && node.inputs.size() >= 2 && node.inputs[0] == sum &&
          outputs_used(node) == 1 && !node.outputs[0].empty())
        ln = n;
    }
    if (!ln) continue;
    const ir::Node& norm = g.nodes[*ln];
    // NOTE: the fused node takes the Add's place, before the sum's other readers: the norm's scale
    // and bias must be there by then (constants, as exporters write them).
    bool constant = true;
    for (size_t k = 1; k < norm.inputs.size(); ++k)
      constant = constant && (norm.inputs[k].empty() || r.initializer(norm.inputs[k]));
    if (!constant) continue;
    std::vector<std::string> inputs{add.inputs[0], add.inputs[1]};
    inputs.insert(inputs.end(), norm.inputs.begin() + 1, norm.inputs.end());
    const bool sum_read = r.uses(sum) > 1 || r.is_output(sum);
    ir::Node fused = norm;
    fused.domain = "ai.lopper";
    fused.op_type = "AddLayerNormalization";
    fused.inputs = std::move(inputs);
    fused.outputs = {norm.outputs[0]};
    if (sum_read) fused.outputs.push_back(sum);
    r.remove(*ln);
    r.change(i) = std::move(fused);
    r.commit();
  }
  return r.finish();
}

}  // namespace lopper::exec::fusion
