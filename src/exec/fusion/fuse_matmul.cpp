// MatMul by a constant 2-D weight (or Gemm as a Linear layer) [+ bias Add] [+ activation] ->
// ai.lopper.FusedMatMul(x, W, B) [transB]: the bias added and the activation applied as the
// product is written.
#include "exec/fusion/passes.h"
#include "exec/fusion/rewrite.h"

namespace lopper::exec::fusion {

bool fuse_matmul(ir::Graph& g, int64_t opset) {
  Rewrite r(g, opset);
  for (size_t i = 0; i < r.size(); ++i) {
    const ir::Node& mm = g.nodes[i];
    if (!r.live(i) || outputs_used(mm) != 1 || mm.inputs.size() < 2) continue;
    const ir::Initializer* w = r.initializer(mm.inputs[1]);
    if (!w || w->value.dim() != 2 || !w->value.is_floating_point()) continue;
    bool trans_b = false;
    std::string bias;
    if (is(mm, "Gemm")) {
      auto iattr = [&](const char* k, int64_t d) {
        auto* a = mm.attr(k);
        return a ? a->i : d;
      };
      auto fattr = [&](const char* k, float d) {
        auto* a = mm.attr(k);
        return a ? a->f : d;
      };
      if (iattr("transA", 0) || fattr("alpha", 1.0f) != 1.0f || fattr("beta", 1.0f) != 1.0f)
        continue;
      trans_b = iattr("transB", 0) != 0;
      if (mm.inputs.size() > 2 && !mm.inputs[2].empty()) {
        const auto* b = r.initializer(mm.inputs[2]);
        if (!b || b->value.numel() != (trans_b ? w->value.size(0) : w->value.size(1))) continue;
        bias = mm.inputs[2];
      }
    } else if (!is(mm, "MatMul")) {
      continue;
    }
    const int64_t n = trans_b ? w->value.size(0) : w->value.size(1);
    Absorbed a{mm.outputs[0], {}, {}};
    if (auto k = bias.empty() ? r.reader(a.out, "Add") : std::nullopt) {
      const ir::Node& add = g.nodes[*k];
      const std::string b = other_input(add, a.out);
      const auto* bt = b.empty() ? nullptr : r.initializer(b);
      if (bt && bt->value.dim() == 1 && bt->value.size(0) == n &&
          bt->value.scalar_type() == w->value.scalar_type()) {
        bias = b;
        a.take(*k, add.outputs[0]);
      }
    }
    r.absorb_activation(a);
    if (a.nodes.empty()) continue;
    ir::Node& f = r.change(i);
    f.inputs = {f.inputs[0], f.inputs[1], bias};
    f.attrs.clear();  // Gemm's are checked above: transB is the one that stays
    if (trans_b) f.attrs.push_back(int_attr("transB", 1));
    r.fuse_into(i, "FusedMatMul", a);
  }
  return r.finish();
}

}  // namespace lopper::exec::fusion
