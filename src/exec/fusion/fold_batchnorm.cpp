// BatchNormalization(Conv(x)), the convolution's output read by nothing else -> Conv(x) with the
// normalisation folded into its weight and bias (computed in double, rounded once).
#include <ATen/ATen.h>

#include "exec/fusion/passes.h"
#include "exec/fusion/rewrite.h"

namespace lopper::exec::fusion {
namespace {

// Folds node `bn_i` into the Conv `conv_i` before it. Returns true if it did.
bool fold(Rewrite& r, size_t conv_i, size_t bn_i) {
  const ir::Node& conv = r.g.nodes[conv_i];
  const ir::Node& bn = r.g.nodes[bn_i];
  if (bn.inputs.size() < 5 || outputs_used(bn) != 1 || bn.outputs[0].empty()) return false;
  if (const auto* tm = bn.attr("training_mode"); tm && tm->i) return false;
  const bool has_bias = conv.inputs.size() > 2 && !conv.inputs[2].empty();
  const auto* w = r.initializer(conv.inputs[1]);
  const auto* b = has_bias ? r.initializer(conv.inputs[2]) : nullptr;
  if (!w || (has_bias && !b)) return false;
  const ir::Initializer* p[4];
  for (int k = 0; k < 4; ++k)
    if (!(p[k] = r.initializer(bn.inputs[1 + k]))) return false;
  const int64_t cout = w->value.size(0);
  for (int k = 0; k < 4; ++k)
    if (p[k]->value.dim() != 1 || p[k]->value.size(0) != cout) return false;
  if (!w->value.is_floating_point()) return false;
  const auto* eps_attr = bn.attr("epsilon");
  const double eps = eps_attr ? eps_attr->f : 1e-5;
  at::Tensor scale = p[0]->value.to(at::kDouble), shift = p[1]->value.to(at::kDouble);
  at::Tensor mean = p[2]->value.to(at::kDouble), var = p[3]->value.to(at::kDouble);
  at::Tensor k = scale / at::sqrt(var + eps);
  std::vector<int64_t> shape(w->value.dim(), 1);
  shape[0] = cout;
  at::Tensor new_w = (w->value.to(at::kDouble) * k.view(shape)).to(w->value.scalar_type());
  at::Tensor old_b = b ? b->value.to(at::kDouble) : at::zeros({cout}, at::kDouble);
  at::Tensor new_b = ((old_b - mean) * k + shift).to(w->value.scalar_type());
  const std::string base = conv.outputs[0] + "/bn_folded";
  const std::string out = bn.outputs[0];
  r.add_initializer({base + "/W", new_w.contiguous(), "", false});
  r.add_initializer({base + "/B", new_b.contiguous(), "", false});
  ir::Node& c = r.change(conv_i);
  c.inputs.resize(3);
  c.inputs[1] = base + "/W";
  c.inputs[2] = base + "/B";
  c.outputs[0] = out;
  r.remove(bn_i);
  r.commit();
  return true;
}

}  // namespace

bool fold_batchnorm(ir::Graph& g, int64_t opset) {
  Rewrite r(g, opset);
  for (size_t i = 0; i < r.size(); ++i) {
    if (!r.live(i) || !is(g.nodes[i], "BatchNormalization") || g.nodes[i].inputs.empty()) continue;
    auto c = r.producer(g.nodes[i].inputs[0]);
    if (!c) continue;
    const ir::Node& conv = g.nodes[*c];
    if (!is(conv, "Conv") || conv.inputs.size() < 2 || outputs_used(conv) != 1 ||
        !r.single(conv.outputs[0]))
      continue;
    fold(r, *c, i);
  }
  return r.finish();
}

}  // namespace lopper::exec::fusion
