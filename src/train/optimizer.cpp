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

void Optimizer::step(double lr) {
  c10::NoGradGuard no_grad;
  ++t_;
  for (size_t i = 0; i < params_.size(); ++i) {
    at::Tensor w = params_[i].detach();
    at::Tensor grad = params_[i].grad();
    if (!grad.defined()) continue;
    auto& st = state_[i];
    if (cfg_.kind == lopper::Optimizer::kSgd) {
      at::Tensor g = cfg_.weight_decay != 0 ? grad.add(w, cfg_.weight_decay) : grad;
      if (cfg_.momentum != 0) {
        if (st.empty())
          st.push_back(g.clone());
        else
          st[0].mul_(cfg_.momentum).add_(g);
        g = cfg_.nesterov ? g.add(st[0], cfg_.momentum) : st[0];
      }
      w.add_(g, -lr);
      continue;
    }
    if (st.empty()) {
      st.push_back(at::zeros_like(w));
      st.push_back(at::zeros_like(w));
    }
    at::Tensor g = grad;
    if (cfg_.kind == lopper::Optimizer::kAdamW)
      w.mul_(1 - lr * cfg_.weight_decay);
    else if (cfg_.weight_decay != 0)
      g = grad.add(w, cfg_.weight_decay);
    at::Tensor& m = st[0];
    at::Tensor& v = st[1];
    m.lerp_(g, 1 - cfg_.beta1);
    v.mul_(cfg_.beta2).addcmul_(g, g, 1 - cfg_.beta2);
    double bc1 = 1 - std::pow(cfg_.beta1, double(t_));
    double bc2 = 1 - std::pow(cfg_.beta2, double(t_));
    at::Tensor denom = (v.sqrt() / std::sqrt(bc2)).add_(cfg_.eps);
    w.addcdiv_(m, denom, -lr / bc1);
  }
}

void Optimizer::mask_state(size_t i, const at::Tensor& keep) {
  c10::NoGradGuard no_grad;
  for (auto& s : state_[i]) s.mul_(keep);
}

}  // namespace lopper::optim
