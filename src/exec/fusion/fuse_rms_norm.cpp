// RMSNorm written out, as PyTorch exports LLaMA's: Mul(gamma, Mul(x, R)) with
// R = Reciprocal(Sqrt(Add(ReduceMean(Pow(x, 2), axes [-1]), eps))) (or Div(1, Sqrt(..)), or
// Mul(x, R) as Div(x, Sqrt(..))) -> RMSNormalization(x, gamma): one pass over each row instead of
// seven ops of a few microseconds each.
#include <ATen/ATen.h>

#include "exec/fusion/passes.h"
#include "exec/fusion/rewrite.h"

namespace lopper::exec::fusion {
namespace {

// The values of an integer initializer of rank 0 or 1.
std::optional<std::vector<int64_t>> ints_of(const Rewrite& r, const std::string& name) {
  const auto* t = r.initializer(name);
  if (!t || t->value.is_floating_point() || t->value.dim() > 1) return std::nullopt;
  at::Tensor v = t->value.to(at::kLong).contiguous();
  return std::vector<int64_t>(v.data_ptr<int64_t>(), v.data_ptr<int64_t>() + v.numel());
}

}  // namespace

bool fuse_rms_norm(ir::Graph& g, int64_t opset) {
  Rewrite r(g, opset);
  for (size_t i = 0; i < r.size(); ++i) {
    const ir::Node& pow = g.nodes[i];
    if (!r.live(i) || !is(pow, "Pow") || pow.inputs.size() != 2 || !r.scalar_is(pow.inputs[1], 2.0))
      continue;
    const std::string x = pow.inputs[0];
    auto mean = r.reader(pow.outputs[0], "ReduceMean");
    if (!mean) continue;
    const ir::Node& rm = g.nodes[*mean];
    std::optional<std::vector<int64_t>> axes;
    if (opset >= 18)  // the axes became an input in opset 18
      axes = rm.inputs.size() == 2 ? ints_of(r, rm.inputs[1]) : std::nullopt;
    else if (const auto* a = rm.attr("axes"))
      axes = a->ints;
    const auto* keep = rm.attr("keepdims");
    if (!axes || *axes != std::vector<int64_t>{-1} || (keep && keep->i == 0)) continue;
    auto add = r.reader(rm.outputs[0], "Add");
    if (!add) continue;
    const auto eps = r.scalar(other_input(g.nodes[*add], rm.outputs[0]));
    auto sqrt = r.reader(g.nodes[*add].outputs[0], "Sqrt");
    if (!eps || !sqrt) continue;
    const std::string root = g.nodes[*sqrt].outputs[0];
    std::vector<size_t> absorbed{i, *mean, *add, *sqrt};
    std::optional<size_t> normed;  // the node whose output is x / sqrt(..)
    if (auto rc = r.reader(root, "Reciprocal")) {
      absorbed.push_back(*rc);
      auto m = r.reader(g.nodes[*rc].outputs[0], "Mul");
      if (m && other_input(g.nodes[*m], g.nodes[*rc].outputs[0]) == x) normed = m;
    } else if (auto dv = r.reader(root, "Div");
               dv && g.nodes[*dv].inputs.size() == 2 && g.nodes[*dv].inputs[1] == root) {
      const std::string num = g.nodes[*dv].inputs[0];
      if (num == x) {
        normed = dv;
      } else if (r.scalar_is(num, 1.0)) {
        absorbed.push_back(*dv);
        auto m = r.reader(g.nodes[*dv].outputs[0], "Mul");
        if (m && other_input(g.nodes[*m], g.nodes[*dv].outputs[0]) == x) normed = m;
      }
    }
    if (!normed) continue;
    absorbed.push_back(*normed);
    auto scaled = r.reader(g.nodes[*normed].outputs[0], "Mul");
    if (!scaled) continue;
    const std::string gamma = other_input(g.nodes[*scaled], g.nodes[*normed].outputs[0]);
    const auto* gt = gamma.empty() ? nullptr : r.initializer(gamma);
    if (!gt || gt->value.dim() != 1 || !gt->value.is_floating_point()) continue;
    ir::Node& out = r.change(*scaled);
    out.op_type = "RMSNormalization";
    out.inputs = {x, gamma};
    out.attrs = {int_attr("axis", -1), float_attr("epsilon", *eps)};
    for (size_t k : absorbed) r.remove(k);
    r.commit();
  }
  return r.finish();
}

}  // namespace lopper::exec::fusion
