// Matrix products and linear algebra: Gemm, MatMul, Einsum, Det: what each computes (shapes,
// MACs, channel rules, the reference forward on ATen). A product by a constant weight (a linear
// layer) runs on the kernel chosen for it per device (exec/linear_kernels.h).
#include <cctype>
#include <map>

#include "exec/linear_kernels.h"
#include "exec/onednn.h"
#include "ops/channels.h"
#include "ops/op.h"

namespace lopper::ops {
namespace {

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
  int64_t n = trans_b ? b.size(0) : b.size(1);
  bool row_bias = !bias.defined() || beta == 0.0f || (bias.dim() == 1 && bias.size(0) == n) ||
                  (bias.dim() == 2 && bias.size(0) == 1 && bias.size(1) == n);

  // The common case, a Linear layer: constant weight, bias per output, alpha = beta = 1.
  if (c.is_constant(1) && (!bias.defined() || c.is_constant(2)) && c.prepack() &&
      a.is_floating_point() && alpha == 1.0f && (beta == 1.0f || !bias.defined()) && row_bias) {
    c.set_output(0, linear_by_kernel(
                        c, a, [&] { return trans_b ? b.contiguous() : b.t().contiguous(); },
                        bias.defined() ? bias.reshape({n}) : bias));
    return;
  }
  at::Tensor w = trans_b ? b : b.t();  // [N, K]
  if (bias.defined() && beta != 0.0f) {
    if (alpha == 1.0f && beta == 1.0f && bias.dim() == 1 && bias.size(0) == n &&
        a.is_floating_point()) {
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
  if (b.dim() == 2 && a.dim() >= 2 && a.is_floating_point() && c.is_constant(1) && c.prepack()) {
    // A constant [K, N] weight: a linear layer with the weight prepacked as [N, K].
    c.set_output(0, linear_by_kernel(c, a, [&] { return b.t().contiguous(); }, {}));
    return;
  }
  c.set_output(0, at::matmul(a, b));
}

// FusedMatMul = activation(X @ W + B) (lopper's own op, made by the executor's fusion pass from
// MatMul/Gemm, a bias Add and an activation). W is [K, N], or [N, K] with transB = 1.
void fused_matmul_forward(OpContext& c) {
  const at::Tensor& x = c.input(0);
  const at::Tensor& w = c.input(1);
  at::Tensor bias = c.has_input(2) ? c.input(2) : at::Tensor();
  bool trans_b = c.attr_int("transB", 0) != 0;
  auto post = onednn::post_op_of(c);
  c.check(w.dim() == 2 && x.dim() >= 1, "W must be 2-D");
  int64_t k = trans_b ? w.size(1) : w.size(0), n = trans_b ? w.size(0) : w.size(1);
  c.check(x.size(-1) == k, "inner dimensions differ: ", x.size(-1), " vs ", k);
  if (bias.defined()) c.check(bias.numel() == n, "bias must have ", n, " elements");
  if (x.dim() >= 2 && x.is_floating_point() && c.is_constant(1) &&
      (!bias.defined() || c.is_constant(2)) && c.prepack()) {
    c.set_output(0, linear_by_kernel(
                        c, x, [&] { return trans_b ? w.contiguous() : w.t().contiguous(); },
                        bias.defined() ? bias.reshape({n}) : bias, post));
    return;
  }
  at::Tensor y = at::matmul(x, trans_b ? w.t() : w);
  if (bias.defined()) y = y + bias.reshape({n});
  c.set_output(0, onednn::apply_unfused(y, post));
}

int64_t matmul_macs(const MacContext& m) {
  if (m.in_shapes.size() < 2 || m.out_shapes.empty() || m.in_shapes[0].empty()) return 0;
  int64_t k = m.in_shapes[0].back();
  return numel_of(m.out_shapes[0]) * k;
}

// Channel rules. A constant weight makes the layer's output features new atoms and its input
// features shrink the weight's reduction axis. MatMul between two activations (attention) couples
// the contracted axis of both sides and carries row, column and batch axes through.
void gemm_channels(ChannelContext& c) {
  at::Tensor b = c.constant(1);
  const Tracked* a = c.in(0);
  if (!b.defined() || b.dim() != 2 || c.in(1) || c.in(2))
    return c.barrier("Gemm with a weight computed at run time");
  const bool ta = c.attr_int("transA", 0) != 0, tb = c.attr_int("transB", 0) != 0;
  if (a) {
    if (a->axis != (ta ? 0 : 1)) return c.barrier("Gemm input tracked off its features");
    c.slice(1, tb ? 1 : 0, a->atoms, ParamRole::kWeightIn);
  }
  auto out = c.fresh(b.size(tb ? 0 : 1));
  c.slice(1, tb ? 0 : 1, out, ParamRole::kWeightOut);
  if (c.has_input(2)) {
    const auto& cs = c.in_shape(2);
    if (!cs.empty() && cs.back() == int64_t(out.size()) && out.size() > 1) {
      if (!c.constant(2).defined()) return c.pin(out, "Gemm bias computed at run time");
      c.slice(2, int64_t(cs.size()) - 1, out, ParamRole::kOther);
    }
  }
  c.set_out(0, Tracked{1, out});
}

void matmul_channels(ChannelContext& c) {
  const auto& as = c.in_shape(0);
  const auto& bs = c.in_shape(1);
  const int64_t ra = int64_t(as.size()), rb = int64_t(bs.size()),
                ro = int64_t(c.out_shape(0).size());
  if (ra < 2 || rb < 2) return c.barrier("MatMul with a 1-D operand");
  const Tracked* a = c.in(0);
  const Tracked* b = c.in(1);
  at::Tensor bc = b ? at::Tensor() : c.constant(1);
  if (bc.defined() && bc.dim() == 2) {  // a linear layer
    if (a && a->axis == ra - 1) {
      c.slice(1, 0, a->atoms, ParamRole::kWeightIn);
    } else if (a) {  // rows or batch axes carried through; the features stay
      return c.set_out(0, Tracked{a->axis + ro - ra, a->atoms});
    }
    auto out = c.fresh(bc.size(1));
    c.slice(1, 1, out, ParamRole::kWeightOut);
    return c.set_out(0, Tracked{ro - 1, out});
  }
  // Two activations (or a batched constant): couple the contracted axes, carry the rest.
  if (bc.defined()) return c.barrier("MatMul with a batched constant weight");
  int64_t out_axis = -1;
  std::vector<int64_t> out;
  auto carry = [&](int64_t axis, const std::vector<int64_t>& atoms) {
    if (out_axis < 0) {
      out_axis = axis, out = atoms;
      return true;
    }
    if (axis != out_axis) return false;
    c.couple(out, atoms);
    return true;
  };
  bool a_k = a && a->axis == ra - 1, b_k = b && b->axis == rb - 2;
  if (a_k && b_k) {
    c.couple(a->atoms, b->atoms);
  } else if (a_k || b_k) {
    return c.barrier("MatMul contracts channels with an untracked operand");
  }
  bool ok = true;
  if (a && !a_k) ok = carry(a->axis == ra - 2 ? ro - 2 : a->axis + ro - ra, a->atoms);
  if (b && !b_k && ok) ok = carry(b->axis == rb - 1 ? ro - 1 : b->axis + ro - rb, b->atoms);
  if (!ok) return c.barrier("MatMul with channels on two output axes");
  if (out_axis >= 0) c.set_out(0, Tracked{out_axis, out});
}

// --- Einsum and Det
// ---------------------------------------------------------------------------------

std::string strip_spaces(const std::string& s) {
  std::string out;
  for (char ch : s)
    if (ch != ' ') out += ch;
  return out;
}

void einsum(OpContext& c) {
  std::string eq = strip_spaces(c.attr_string("equation", ""));
  c.check(!eq.empty(), "missing required attribute 'equation'");
  std::vector<at::Tensor> ins;
  for (size_t i = 0; i < c.num_inputs(); ++i) ins.push_back(c.input(i));
  c.check(!ins.empty(), "needs at least one input");
  at::Tensor y = at::einsum(eq, ins);
  c.set_output(0, y.to(ins[0].scalar_type()));
}

int64_t einsum_macs(const MacContext& m) {
  std::string eq = strip_spaces(m.attr_string("equation", ""));
  std::string lhs = eq.substr(0, eq.find("->"));
  std::map<char, int64_t> dims;
  std::vector<int64_t> ell;  // broadcast of the "..." parts, right-aligned
  size_t term = 0, start = 0;
  while (start <= lhs.size() && term < m.in_shapes.size()) {
    size_t end = lhs.find(',', start);
    if (end == std::string::npos) end = lhs.size();
    std::string t = lhs.substr(start, end - start);
    const auto& shape = m.in_shapes[term];
    size_t letters = 0;
    for (char ch : t)
      if (std::isalpha(static_cast<unsigned char>(ch))) ++letters;
    size_t ell_rank = shape.size() >= letters ? shape.size() - letters : 0;
    size_t d = 0;
    for (size_t i = 0; i < t.size() && d <= shape.size(); ++i) {
      if (t[i] == '.') {
        if (t.compare(i, 3, "...") == 0) {
          std::vector<int64_t> part(shape.begin() + d, shape.begin() + d + ell_rank);
          if (part.size() > ell.size()) ell.insert(ell.begin(), part.size() - ell.size(), 1);
          for (size_t k = 0; k < part.size(); ++k) {
            int64_t& e = ell[ell.size() - part.size() + k];
            e = std::max(e, part[k]);
          }
          d += ell_rank;
          i += 2;
        }
        continue;
      }
      if (d < shape.size()) dims[t[i]] = std::max(dims[t[i]], shape[d]);
      ++d;
    }
    ++term;
    start = end + 1;
  }
  int64_t macs = numel_of(ell);
  for (const auto& [ch, n] : dims) macs *= n;
  return macs;
}

void det(OpContext& c) {
  const at::Tensor& x = c.input(0);
  c.check(x.is_floating_point(), "input must be a floating-point tensor");
  c.check(x.dim() >= 2 && x.size(-1) == x.size(-2), "input must be [*, M, M], got shape ",
          x.sizes());
  at::ScalarType ct = at::promote_types(x.scalar_type(), at::kFloat);
  c.set_output(0, at::linalg_det(x.to(ct)).to(x.scalar_type()));
}

}  // namespace

void register_gemm(OpTable& t) {
  t.add({"", "Gemm", gemm_forward, gemm_macs});
  t.add({"", "MatMul", matmul_forward, matmul_macs});
  t.add({"ai.lopper", "FusedMatMul", fused_matmul_forward, matmul_macs});
  t.add({"", "Einsum", einsum, einsum_macs});
  t.add({"", "Det", det});
  t.set_channels({"Gemm"}, gemm_channels);
  t.set_channels({"MatMul"}, matmul_channels);
}

}  // namespace lopper::ops
