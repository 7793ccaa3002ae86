// Shared helpers for lopper's tests.
#pragma once

#include <ATen/ATen.h>

#include <stdlib.h>

#include <filesystem>
#include <string>

namespace lopper::test {

/// Folder of the models made by tests/fixtures/make_models.py (in the build tree).
inline std::string fixtures_dir() { return LOPPER_FIXTURES_DIR; }

/// A fresh folder under /tmp, removed with everything in it at the end of the scope.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    char tmpl[] = "/tmp/lopper_test_XXXXXX";
    path = mkdtemp(tmpl);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  std::string operator/(const std::string& f) const { return (path / f).string(); }
};

/// max |a - b| / max |b| (0 when both are all zero); shapes must match.
inline double relative_max_diff(const at::Tensor& a, const at::Tensor& b) {
  at::Tensor x = a.detach().cpu().to(at::kDouble), y = b.detach().cpu().to(at::kDouble);
  double scale = y.abs().max().item<double>();
  double diff = (x - y).abs().max().item<double>();
  return scale > 0 ? diff / scale : diff;
}

}  // namespace lopper::test
