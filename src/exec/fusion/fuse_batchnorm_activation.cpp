// BatchNormalization that no Conv absorbed (DenseNet's, after each Concat) + activation ->
// ai.lopper.FusedBatchNormalization: one pass over the activation instead of two.
#include "exec/fusion/passes.h"
#include "exec/fusion/rewrite.h"

namespace lopper::exec::fusion {

bool fuse_batchnorm_activation(ir::Graph& g, int64_t opset) {
  Rewrite r(g, opset);
  for (size_t i = 0; i < r.size(); ++i) {
    if (!r.writes_one(i, "BatchNormalization")) continue;
    Absorbed a{g.nodes[i].outputs[0], {}, {}};
    r.absorb_activation(a);
    if (!a.nodes.empty()) r.fuse_into(i, "FusedBatchNormalization", a);
  }
  return r.finish();
}

}  // namespace lopper::exec::fusion
