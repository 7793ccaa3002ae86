// Loss scaling for fp16 training (internal).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace lopper::amp {

// Dynamic loss scaling for fp16, PyTorch's GradScaler policy: the loss is multiplied by the scale
// before backward and the gradients divided back; a step whose gradients hold inf or NaN is
// skipped and halves the scale; 2000 clean steps in a row double it.
struct LossScaler {
  double scale = 65536.0;
  int64_t clean = 0, skipped = 0;

  static constexpr int64_t kGrowthInterval = 2000;

  /// Unscales `grads` (one device) in place; false when one holds inf/NaN: the step must be
  /// skipped (the gradients are then garbage).
  bool unscale(std::vector<at::Tensor>& grads);
};

}  // namespace lopper::amp
