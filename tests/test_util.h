// Shared helpers for lopper's tests.
#pragma once

#include <ATen/ATen.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>

#include "lopper/error.h"
#include "lopper/files.h"

namespace lopper::test {

/// The message request `r` is refused with (UsageError: the options as the library names them,
/// or as `name` renders each), "(accepted)" when validate() takes it.
template <typename Request>
std::string refusal_of(const Request& r, std::string (*name)(const std::string&) = nullptr) {
  try {
    r.validate();
  } catch (const UsageError& e) {
    return name ? e.render(name) : e.what();
  }
  return "(accepted)";
}

/// Folder of the models made by tests/fixtures/make_models.py (in the build tree).
inline std::string fixtures_dir() { return LOPPER_FIXTURES_DIR; }
/// A file in that folder.
inline std::string fixture(const std::string& f) { return fixtures_dir() + "/" + f; }

/// A file in the source tree's examples/ folder.
inline std::string example(const std::string& f) {
  return std::string(LOPPER_SOURCE_DIR) + "/examples/" + f;
}

/// A whole file as a string ("" when it cannot be read).
inline std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

/// Number of newline-terminated lines.
inline int lines(const std::string& s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

/// The message of the lopper::Error `f` throws ("" when it throws none).
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

/// What a run of the lopper binary gave back.
struct CliResult {
  int code;
  std::string out, err;
};

/// Runs `lopper ARGS` (the build's binary) and captures its exit code, stdout and stderr.
inline CliResult lopper_cli(const std::string& args) {
  static int n = 0;
  std::string base = "/tmp/lopper_cli_" + std::to_string(getpid()) + "_" + std::to_string(n++);
  std::string cmd =
      std::string(LOPPER_BINARY) + " " + args + " >" + base + ".out 2>" + base + ".err";
  int status = std::system(cmd.c_str());
  CliResult r{WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status),
              slurp(base + ".out"), slurp(base + ".err")};
  std::filesystem::remove(base + ".out");
  std::filesystem::remove(base + ".err");
  return r;
}

/// A fresh folder under /tmp, removed with everything in it at the end of the scope.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    char tmpl[] = "/tmp/lopper_test_XXXXXX";
    path = mkdtemp(tmpl);
  }
  ~TempDir() {
    std::error_code ec;
    remove_tree(path.string(), ec);
  }
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
