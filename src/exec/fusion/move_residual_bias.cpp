// A FusedConv whose residual is a Conv's output read by nothing else (ResNet's downsample): the
// residual's bias moves into the FusedConv's, act(conv(x) + b + (conv'(x') + b')) =
// act(conv(x) + (b + b') + conv'(x')). On a GPU a convolution's bias is a separate pass over its
// output (ATen's cuDNN path); the fused kernel adds its own bias in the epilogue.
#include <ATen/ATen.h>

#include "exec/fusion/passes.h"
#include "exec/fusion/rewrite.h"

namespace lopper::exec::fusion {

bool move_residual_bias(ir::Graph& g, int64_t opset) {
  Rewrite r(g, opset);
  for (size_t i = 0; i < r.size(); ++i) {
    const ir::Node& fc = g.nodes[i];
    if (!r.live(i) || fc.domain != "ai.lopper" || fc.op_type != "FusedConv" ||
        fc.inputs.size() != 4 || !r.single(fc.inputs[3]))
      continue;
    auto p = r.made_by(fc.inputs[3], "Conv");
    if (!p) continue;
    const ir::Node& rc = g.nodes[*p];
    if (outputs_used(rc) != 1 || rc.inputs.size() < 3 || rc.inputs[2].empty()) continue;
    const ir::Initializer* rb = r.initializer(rc.inputs[2]);
    const ir::Initializer* w = r.initializer(fc.inputs[1]);
    const ir::Initializer* b = fc.inputs[2].empty() ? nullptr : r.initializer(fc.inputs[2]);
    if (!rb || !w || (!fc.inputs[2].empty() && !b) || !w->value.is_floating_point()) continue;
    const int64_t cout = w->value.size(0);
    const auto type = w->value.scalar_type();
    if (rb->value.dim() != 1 || rb->value.size(0) != cout || rb->value.scalar_type() != type ||
        (b && (b->value.dim() != 1 || b->value.size(0) != cout || b->value.scalar_type() != type)))
      continue;
    at::Tensor sum = rb->value.to(at::kDouble);
    if (b) sum = sum + b->value.to(at::kDouble);
    const std::string name = fc.outputs[0] + "/bias_with_residual";
    r.add_initializer({name, sum.to(type).contiguous(), "", false});
    r.change(i).inputs[2] = name;
    r.change(*p).inputs.resize(2);
    r.commit();
  }
  return r.finish();
}

}  // namespace lopper::exec::fusion
