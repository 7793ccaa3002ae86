// BatchNormalization that no Conv absorbed (DenseNet's, after each Concat) + activation ->
// ai.lopper.FusedBatchNormalization: one pass over the activation instead of two.
#include "exec/fusion/passes.h"
#include "exec/fusion/rewrite.h"

namespace lopper::exec::fusion {

bool fuse_batchnorm_activation(ir::Graph& g, int64_t opset) {
  Rewrite r(g, opset);
  for (size_t i = 0; i < r.size(); ++i) {
    const ir::Node& bn = g.nodes[i];
    if (!r.writes_one(i, "BatchNormalization")) continue;
    std::string out = bn.outputs[0];
    std::vector<ir::Attribute> act;
    std::vector<size_t> absorbed;
    r.absorb_activation(out, absorbed, act);
    if (!absorbed.empty()) r.fuse_into(i, "FusedBatchNormalization", out, act, absorbed);
  }
  return r.finish();
}

}  // namespace lopper::exec::fusion
