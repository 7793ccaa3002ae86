#include "train/loss_scaler.h"

#include <ATen/ATen.h>

namespace lopper::amp {

bool LossScaler::unscale(std::vector<at::Tensor>& grads) {
  if (grads.empty()) return true;
  auto opts = at::TensorOptions().dtype(at::kFloat).device(grads[0].device());
  at::Tensor found = at::zeros({1}, opts), inv = at::full({1}, 1.0 / scale, opts);
  // One fused pass over all gradients: multiply by 1/scale and flag any inf/NaN.
  at::_amp_foreach_non_finite_check_and_unscale_(grads, found, inv);
  if (found.item<float>() > 0) {
    scale *= 0.5, clean = 0, ++skipped;
    return false;
  }
  if (++clean == kGrowthInterval) scale *= 2.0, clean = 0;
  return true;
}

}  // namespace lopper::amp
