// Shared helpers for lopper's tests.
#pragma once

#include <ATen/ATen.h>

#include <string>

namespace lopper::test {

/// Folder of the models made by tests/fixtures/make_models.py (in the build tree).
inline std::string fixtures_dir() { return LOPPER_FIXTURES_DIR; }

/// max |a - b| / max |b| (0 when both are all zero); shapes must match.
inline double relative_max_diff(const at::Tensor& a, const at::Tensor& b) {
  at::Tensor x = a.detach().cpu().to(at::kDouble), y = b.detach().cpu().to(at::kDouble);
  double scale = y.abs().max().item<double>();
  double diff = (x - y).abs().max().item<double>();
  return scale > 0 ? diff / scale : diff;
}

}  // namespace lopper::test
