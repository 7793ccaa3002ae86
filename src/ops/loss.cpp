// Loss ops: NegativeLogLikelihoodLoss, SoftmaxCrossEntropyLoss.
#include <ATen/ATen.h>

#include "ops/op.h"

namespace lopper::ops {

namespace {

// NLL over log-probabilities `lp` [N, C, d...] and integer `target` [N, d...] (ONNX semantics:
// ignored positions weigh 0; "mean" divides by the sum of the applied weights).
at::Tensor nll(const OpContext& c, const at::Tensor& lp, const at::Tensor& target_in,
               const at::Tensor& weight) {
  c.check(lp.is_floating_point(), "input must be a floating-point tensor");
  c.check(lp.dim() >= 2, "input must have rank >= 2, got ", lp.dim());
  c.check(!at::isFloatingType(target_in.scalar_type()) && target_in.scalar_type() != at::kBool,
          "target must be an integer tensor");
  c.check(target_in.dim() == lp.dim() - 1, "target must have rank ", lp.dim() - 1, ", got ",
          target_in.dim());
  for (int64_t d = 0; d < target_in.dim(); ++d)
    c.check(target_in.size(d) == lp.size(d == 0 ? 0 : d + 1), "target shape ", target_in.sizes(),
            " does not match input shape ", lp.sizes());
  const int64_t C = lp.size(1);
  std::string reduction = c.attr_string("reduction", "mean");
  c.check(reduction == "none" || reduction == "sum" || reduction == "mean", "unknown reduction '",
          reduction, "'");
  at::Tensor target = target_in.to(lp.device(), at::kLong);
  bool has_ii = c.has_attr("ignore_index");
  int64_t ii = c.attr_int("ignore_index", 0);
  at::Tensor mask =
      has_ii ? (target != ii) : at::ones_like(target, target.options().dtype(at::kBool));
  if (target.numel() > 0) {
    bool bad = (((target < 0) | (target >= C)) & mask).any().item<bool>();
    c.check(!bad, "target holds a class index outside [0, ", C, ")");
  }
  at::Tensor safe = at::where(mask, target, at::zeros_like(target));
  at::Tensor picked = -at::gather(lp, 1, safe.unsqueeze(1)).squeeze(1);
  at::Tensor zero = at::zeros({}, lp.options());
  at::Tensor wt;
  bool weighted = weight.defined() || has_ii;
  if (weight.defined()) {
    c.check(weight.dim() == 1 && weight.size(0) == C, "weight must have shape [", C, "], got ",
            weight.sizes());
    wt = at::where(
        mask, weight.to(lp.scalar_type()).index_select(0, safe.reshape({-1})).reshape(safe.sizes()),
        zero);
  } else {
    wt = at::where(mask, at::ones({}, lp.options()), zero);
  }
  at::Tensor loss = picked * wt;
  if (reduction == "none") return loss;
  if (reduction == "sum") return loss.sum();
  if (weighted) return loss.sum() / wt.sum();
  return loss.mean();
}

void nll_forward(OpContext& c) {
  const at::Tensor& x = c.input(0);
  at::Tensor w = c.has_input(2) ? c.input(2) : at::Tensor();
  c.set_output(0, nll(c, x, c.input(1), w).to(x.scalar_type()));
}

void sce_forward(OpContext& c) {
  const at::Tensor& x = c.input(0);
  c.check(x.is_floating_point(), "scores must be a floating-point tensor");
  c.check(x.dim() >= 2, "scores must have rank >= 2, got ", x.dim());
  // NOTE: half-precision scores get their log-softmax in float32, then are cast back.
  at::ScalarType ct = at::promote_types(x.scalar_type(), at::kFloat);
  at::Tensor lp = at::log_softmax(x.to(ct), 1);
  at::Tensor w = c.has_input(2) ? c.input(2) : at::Tensor();
  c.set_output(0, nll(c, lp, c.input(1), w).to(x.scalar_type()));
  if (c.wants_output(1)) c.set_output(1, lp.to(x.scalar_type()));
}

}  // namespace

void register_loss(OpTable& t) {
  t.add({"", "NegativeLogLikelihoodLoss", nll_forward});
  t.add({"", "SoftmaxCrossEntropyLoss", sce_forward});
}

}  // namespace lopper::ops
