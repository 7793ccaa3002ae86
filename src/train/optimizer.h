// Optimisers with PyTorch's update rules (torch.optim.SGD, Adam, AdamW; their defaults), whose
// state can be masked so that pruned weights stay exactly zero (internal).
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "lopper/train.h"

namespace lopper::optim {

struct OptimizerConfig {
  lopper::Optimizer kind = lopper::Optimizer::kSgd;
  double momentum = 0.9;
  bool nesterov = false;
  double weight_decay = 0;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
};

class Optimizer {
 public:
  Optimizer(OptimizerConfig cfg, std::vector<at::Tensor> params);
  /// One step with learning rate `lr` on the params' .grad() (params without a grad are left
  /// alone, as PyTorch does). Runs without recording autograd.
  void step(double lr);
  /// Zeroes param i's state where `keep` is false (a pruned weight's momentum must not move it).
  void mask_state(size_t i, const at::Tensor& keep);
  /// The state tensors (one list per param: momentum buffer, or Adam's m and v) and the step
  /// count, for checkpoints.
  std::vector<std::vector<at::Tensor>>& state() { return state_; }
  int64_t& steps() { return t_; }
  const OptimizerConfig& config() const { return cfg_; }

 private:
  OptimizerConfig cfg_;
  std::vector<at::Tensor> params_;
  std::vector<std::vector<at::Tensor>> state_;
  int64_t t_ = 0;
};

}  // namespace lopper::optim
