// SGD (momentum, Nesterov, L2 weight decay), Adam (bias-corrected, L2 weight decay) and AdamW
// (decoupled weight decay), step for step the formulas of torch.optim's single-tensor code.
#include "train/optimizer.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <cmath>

#include "lopper/error.h"

namespace lopper::optim {

Optimizer::Optimizer(OptimizerConfig cfg, std::vector<at::Tensor> params)
    : cfg_(std::move(cfg)), params_(std::move(params)), state_(params_.size()) {
  LOPPER_CHECK(cfg_.momentum >= 0 && cfg_.weight_decay >= 0 && cfg_.eps > 0 && cfg_.beta1 >= 0 &&
                   cfg_.beta1 < 1 && cfg_.beta2 >= 0 && cfg_.beta2 < 1,
               "[train] momentum, weight decay, betas and eps must be >= 0 (betas < 1)");
  LOPPER_CHECK(!cfg_.nesterov || cfg_.kind == lopper::Optimizer::kSgd,
               "[train] " LOPPER_OPTION("nesterov") " is for sgd");
  LOPPER_CHECK(!cfg_.nesterov || cfg_.momentum > 0,
               "[train] " LOPPER_OPTION("nesterov") " needs " LOPPER_OPTION("momentum") " > 0");
}

// NOTE: each update is a few multi-tensor (_foreach_) ops over all parameters, as torch.optim does
// on a GPU by default: one launch per op for the whole model instead of one per parameter, which is
// most of a small model's step on a GPU. On the CPU they run the same per-tensor ops.
void Optimizer::step(double lr) {
  c10::NoGradGuard no_grad;
  ++t_;
  std::vector<at::Tensor> ws, gs;
  std::vector<size_t> idx;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!params_[i].grad().defined()) continue;
    ws.push_back(params_[i].detach());
    gs.push_back(params_[i].grad());
    idx.push_back(i);
    // Lazily created state, zero: SGD's first momentum update 0 * momentum + g is torch's clone.
    const size_t n = cfg_.kind == lopper::Optimizer::kSgd ? (cfg_.momentum != 0 ? 1 : 0) : 2;
    while (state_[i].size() < n) state_[i].push_back(at::zeros_like(ws.back()));
  }
  if (ws.empty()) return;
  auto state = [&](size_t k) {
    std::vector<at::Tensor> v;
    for (size_t i : idx) v.push_back(state_[i][k]);
    return v;
  };
  if (cfg_.kind == lopper::Optimizer::kSgd) {
    std::vector<at::Tensor> g =
        cfg_.weight_decay != 0 ? at::_foreach_add(gs, ws, cfg_.weight_decay) : gs;
    if (cfg_.momentum != 0) {
      std::vector<at::Tensor> buf = state(0);
      at::_foreach_mul_(buf, cfg_.momentum);
      at::_foreach_add_(buf, g);
      g = cfg_.nesterov ? at::_foreach_add(g, buf, cfg_.momentum) : buf;
    }
    at::_foreach_add_(ws, g, -lr);
    return;
  }
  std::vector<at::Tensor> g = gs;
  if (cfg_.kind == lopper::Optimizer::kAdamW)
    at::_foreach_mul_(ws, 1 - lr * cfg_.weight_decay);
  else if (cfg_.weight_decay != 0)
    g = at::_foreach_add(gs, ws, cfg_.weight_decay);
  std::vector<at::Tensor> m = state(0), v = state(1);
  at::_foreach_lerp_(m, g, 1 - cfg_.beta1);
  at::_foreach_mul_(v, cfg_.beta2);
  at::_foreach_addcmul_(v, g, g, 1 - cfg_.beta2);
  const double bc1 = 1 - std::pow(cfg_.beta1, double(t_));
  const double bc2 = 1 - std::pow(cfg_.beta2, double(t_));
  std::vector<at::Tensor> denom = at::_foreach_sqrt(v);
  at::_foreach_div_(denom, std::sqrt(bc2));
  at::_foreach_add_(denom, cfg_.eps);
  at::_foreach_addcdiv_(ws, m, denom, -lr / bc1);
}

void Optimizer::mask_state(size_t i, const at::Tensor& keep) {
  c10::NoGradGuard no_grad;
  for (auto& s : state_[i]) s.mul_(keep);
}

}  // namespace lopper::optim
