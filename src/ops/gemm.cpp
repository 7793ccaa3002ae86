// Gemm and MatMul. Constant weights are prepacked at the first inference run into the layout
// at::linear reads directly ([N, K] contiguous).
#include "ops/op.h"

namespace lopper::ops {
namespace {

struct PackedWeight {
  at::Tensor weight;  // [N, K] contiguous
};

void gemm_forward(OpContext& c) {
  at::Tensor a = c.input(0), b = c.input(1);
  c.check(a.dim() == 2 && b.dim() == 2, "A and B must be 2-D, got ", a.dim(), "-D and ", b.dim(),
          "-D");
  bool trans_a = c.attr_int("transA", 0) != 0, trans_b = c.attr_int("transB", 0) != 0;
  float alpha = c.attr_float("alpha", 1.0f), beta = c.attr_float("beta", 1.0f);
  if (trans_a) a = a.t();
  int64_t k = a.size(1), kb = trans_b ? b.size(1) : b.size(0);
  c.check(k == kb, "A is ", a.size(0), "x", k, " but B has ", kb, " rows (after transposes)");
  at::Tensor bias = c.has_input(2) ? c.input(2) : at::Tensor();

  // Weight as [N, K]: already so when transB, else transposed once (prepacked when constant).
  at::Tensor w;
  if (trans_b) {
    w = b;
  } else if (c.is_constant(1) && !c.grad_mode()) {
    auto& st = c.state<PackedWeight>();
    if (!st.weight.defined()) st.weight = b.t().contiguous();
    w = st.weight;
  } else {
    w = b.t();
  }
  int64_t n = w.size(0);
  if (bias.defined() && beta != 0.0f) {
    bool row_bias = bias.dim() == 1 && bias.size(0) == n;
    if (alpha == 1.0f && beta == 1.0f && row_bias && a.is_floating_point()) {
      c.set_output(0, at::linear(a, w, bias));
      return;
    }
    at::Tensor mm = a.is_floating_point() ? at::linear(a, w) : at::matmul(a, w.t());
    if (alpha != 1.0f) mm = mm * alpha;
    at::Tensor cb = beta != 1.0f ? bias * beta : bias;
    c.set_output(0, (mm + cb).to(a.scalar_type()));
    return;
  }
  at::Tensor mm = a.is_floating_point() ? at::linear(a, w) : at::matmul(a, w.t());
  c.set_output(0, alpha != 1.0f ? mm * alpha : mm);
}

int64_t gemm_macs(const MacContext& m) {
  if (m.in_shapes.size() < 2 || m.out_shapes.empty() || m.in_shapes[0].size() != 2) return 0;
  int64_t k = m.attr_int("transA", 0) ? m.in_shapes[0][0] : m.in_shapes[0][1];
  return numel_of(m.out_shapes[0]) * k;
}

void matmul_forward(OpContext& c) {
  const at::Tensor& a = c.input(0);
  const at::Tensor& b = c.input(1);
  c.check(a.dim() >= 1 && b.dim() >= 1, "MatMul inputs must be at least 1-D");
  int64_t ka = a.size(-1), kb = b.dim() == 1 ? b.size(0) : b.size(-2);
  c.check(ka == kb, "inner dimensions differ: ", ka, " vs ", kb);
  if (b.dim() == 2 && a.dim() >= 2 && a.is_floating_point() && c.is_constant(1) && !c.grad_mode()) {
    // A constant [K, N] weight: prepack as [N, K] once and run as a linear layer.
    auto& st = c.state<PackedWeight>();
    if (!st.weight.defined()) st.weight = b.t().contiguous();
    c.set_output(0, at::linear(a, st.weight));
    return;
  }
  c.set_output(0, at::matmul(a, b));
}

int64_t matmul_macs(const MacContext& m) {
  if (m.in_shapes.size() < 2 || m.out_shapes.empty() || m.in_shapes[0].empty()) return 0;
  int64_t k = m.in_shapes[0].back();
  return numel_of(m.out_shapes[0]) * k;
}

}  // namespace

void register_gemm(OpTable& t) {
  t.add({"", "Gemm", gemm_forward, gemm_macs});
  t.add({"", "MatMul", matmul_forward, matmul_macs});
}

}  // namespace lopper::ops
