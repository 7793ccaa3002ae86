// Constants become initializers: Constant nodes, and Identity nodes of initializers (how exporters
// share deduplicated weights).
#include "exec/fusion/passes.h"
#include "exec/fusion/rewrite.h"

namespace lopper::exec::fusion {

bool constants_to_initializers(ir::Graph& g, int64_t) {
  std::vector<ir::Node> kept;
  bool changed = false;
  for (auto& n : g.nodes) {
    at::Tensor v;
    if (is(n, "Identity") && n.inputs.size() == 1 && n.outputs.size() == 1) {
      if (const auto* t = g.find_initializer(n.inputs[0])) v = t->value;  // shares the storage
    } else if (is(n, "Constant") && n.outputs.size() == 1 && n.attrs.size() == 1) {
      v = ir::constant_value(n);
    }
    if (v.defined()) {
      g.initializers.push_back({n.outputs[0], v, "", false});
      changed = true;
    } else {
      kept.push_back(std::move(n));
    }
  }
  g.nodes = std::move(kept);
  return changed;
}

}  // namespace lopper::exec::fusion
