// Attention's scores: Softmax(MatMul(Q [* a], K [* b]) [* c | / c]) along the last axis, with a,
// b, c scalar constants (PyTorch's exports of scaled_dot_product_attention put sqrt(scale) on Q
// and on K; older ones divide the product) -> ai.lopper.ScaledSoftmax(MatMul(Q, K), scale a*b*c):
// the two or three passes over Q, K or the scores become a multiply inside the softmax's own.
#include <cmath>

#include "exec/fusion/passes.h"
#include "exec/fusion/rewrite.h"

namespace lopper::exec::fusion {
namespace {

// The tensor before a multiplication (or division) by a scalar constant read by nothing else, and
// the factor, the scaling node appended to `absorbed`; {v, 1} when v is not made so.
std::pair<std::string, double> unscaled(const Rewrite& r, const std::string& v,
                                        std::vector<size_t>& absorbed) {
  auto p = r.producer(v);
  if (!p || !r.single(v)) return {v, 1.0};
  const ir::Node& n = r.g.nodes[*p];
  if (n.inputs.size() != 2 || (!is(n, "Mul") && !is(n, "Div"))) return {v, 1.0};
  for (int k = 0; k < 2; ++k) {
    if (k == 0 && is(n, "Div")) continue;  // c / x is not a scaling of x
    const auto c = r.scalar(n.inputs[k]);
    // NOTE: a constant of rank 2 or more would raise the product's rank by broadcasting.
    if (!c || *c == 0.f || !std::isfinite(*c) || r.initializer(n.inputs[k])->value.dim() > 1)
      continue;
    absorbed.push_back(*p);
    return {n.inputs[1 - k], is(n, "Div") ? 1.0 / *c : double(*c)};
  }
  return {v, 1.0};
}

}  // namespace

bool fuse_scaled_softmax(ir::Graph& g, int64_t opset) {
  Rewrite r(g, opset);
  for (size_t i = 0; i < r.size(); ++i) {
    const ir::Node& sm = g.nodes[i];
    if (!r.live(i) || !is(sm, "Softmax") || sm.inputs.size() != 1) continue;
    const auto* axis = sm.attr("axis");
    if (axis ? axis->i != -1 : opset < 13) continue;  // the last axis, whatever the rank
    std::vector<size_t> absorbed;
    auto [scores, c] = unscaled(r, sm.inputs[0], absorbed);
    auto mm = r.made_by(scores, "MatMul");
    if (!mm || !r.single(scores)) continue;
    auto [q, a] = unscaled(r, g.nodes[*mm].inputs[0], absorbed);
    auto [k, b] = unscaled(r, g.nodes[*mm].inputs[1], absorbed);
    if (absorbed.empty()) continue;
    r.change(*mm).inputs = {q, k};
    ir::Node& s = r.change(i);
    s.domain = "ai.lopper";
    s.op_type = "ScaledSoftmax";
    s.inputs = {scores};
    s.attrs = {float_attr("scale", static_cast<float>(a * b * c))};
    for (size_t n : absorbed) r.remove(n);
    r.commit();
  }
  return r.finish();
}

}  // namespace lopper::exec::fusion
