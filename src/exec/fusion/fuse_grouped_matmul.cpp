// Grouped-query attention's key/value head repeat read by a MatMul:
// MatMul(A, [Transpose perm 0,1,3,2](Reshape(Expand(..), shape))) ->
// ai.lopper.GroupedMatMul(A, Expand's output, shape), which skips the copy the Reshape makes of
// the repeated heads (checked at run time; otherwise it does what the nodes did).
#include "exec/fusion/passes.h"
#include "exec/fusion/rewrite.h"

namespace lopper::exec::fusion {

bool fuse_grouped_matmul(ir::Graph& g, int64_t opset) {
  if (opset < 5) return false;  // Reshape's shape became an input in opset 5
  Rewrite r(g, opset);
  for (size_t i = 0; i < r.size(); ++i) {
    const ir::Node& mm = g.nodes[i];
    if (!r.live(i) || !is(mm, "MatMul") || mm.inputs.size() != 2 || outputs_used(mm) != 1) continue;
    std::string b = mm.inputs[1];
    std::vector<size_t> absorbed;
    bool trans_b = false;
    if (auto t = r.made_by(b, "Transpose"); t && r.single(b)) {
      const auto* perm = g.nodes[*t].attr("perm");
      if (!perm || perm->ints != std::vector<int64_t>{0, 1, 3, 2}) continue;
      trans_b = true;
      absorbed.push_back(*t);
      b = g.nodes[*t].inputs[0];
    }
    auto m = r.made_by(b, "Reshape");
    if (!m || !r.single(b) || g.nodes[*m].inputs.size() != 2 ||
        !r.made_by(g.nodes[*m].inputs[0], "Expand"))
      continue;
    const ir::Node& reshape = g.nodes[*m];
    absorbed.push_back(*m);
    std::vector<ir::Attribute> attrs{int_attr("transB", trans_b)};
    if (const auto* az = reshape.attr("allowzero"); az && opset >= 14) attrs.push_back(*az);
    std::vector<std::string> inputs{mm.inputs[0], reshape.inputs[0], reshape.inputs[1]};
    ir::Node& f = r.change(i);
    f.domain = "ai.lopper";
    f.op_type = "GroupedMatMul";
    f.inputs = std::move(inputs);
    f.attrs = std::move(attrs);
    for (size_t k : absorbed) r.remove(k);
    r.commit();
  }
  return r.finish();
}

}  // namespace lopper::exec::fusion
