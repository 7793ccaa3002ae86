// ONNX's own backend conformance cases (model.onnx + test_data_set_*/{input,output}_*.pb), for
// every op lopper registers: the node cases inside the onnx package (current opsets) and Debian's
// libonnx-testdata (pytorch-converted, pytorch-operator). Expected failures live in
// tests/ops/conformance_xfail*.txt (one file per op family) with a reason each; an expected
// failure that passes is an error too.
//
// LOPPER_CONFORMANCE_FILTER=substring runs a subset; LOPPER_CONFORMANCE_VERBOSE=1 prints each case.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <sstream>

#include "lopper/error.h"
#include "lopper/executor.h"
#include "lopper/onnx_io.h"
#include "ops/op.h"

namespace fs = std::filesystem;
using namespace lopper;

namespace {

void collect_ops(const ir::Graph& g, std::set<std::pair<std::string, std::string>>& ops) {
  for (const auto& n : g.nodes) {
    ops.insert({n.domain, n.op_type});
    for (const auto& a : n.attrs) {
      if (a.g) collect_ops(*a.g, ops);
      for (const auto& sg : a.graphs) collect_ops(*sg, ops);
    }
  }
}

// Returns "" when `got` matches `want`, else a one-line reason.
std::string compare(const at::Tensor& got_in, const at::Tensor& want, double rtol, double atol) {
  at::Tensor got = got_in.detach().cpu();
  if (got.scalar_type() != want.scalar_type())
    return "dtype " + std::string(c10::toString(got.scalar_type())) +
           " != " + c10::toString(want.scalar_type());
  if (got.sizes() != want.sizes()) {
    std::ostringstream os;
    os << "shape " << got.sizes() << " != " << want.sizes();
    return os.str();
  }
  if (got.numel() == 0) return "";
  if (at::isFloatingType(want.scalar_type()) || at::isComplexType(want.scalar_type())) {
    at::Tensor g = at::isComplexType(want.scalar_type()) ? at::view_as_real(got).to(at::kDouble)
                                                         : got.to(at::kDouble);
    at::Tensor w = at::isComplexType(want.scalar_type()) ? at::view_as_real(want).to(at::kDouble)
                                                         : want.to(at::kDouble);
    at::Tensor both_nan = at::isnan(g) & at::isnan(w);
    at::Tensor same_inf = at::isinf(w) & (g == w);
    at::Tensor close = (g - w).abs() <= atol + rtol * w.abs();
    at::Tensor ok = both_nan | same_inf | close;
    if (!ok.all().item<bool>()) {
      at::Tensor diff = at::where(ok, at::zeros_like(g), (g - w).abs());
      std::ostringstream os;
      os << "max |diff| " << diff.max().item<double>() << " (max |ref| "
         << w.abs().nan_to_num(0, 0, 0).max().item<double>() << ")";
      return os.str();
    }
    return "";
  }
  if (!at::equal(got, want)) return "values differ";
  return "";
}

struct Xfail {
  std::map<std::string, std::string> cases;  // case name -> reason
  std::set<std::string> uncovered_ops;       // ops allowed to have no passing case
};

Xfail load_xfail() {
  Xfail x;
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(std::string(LOPPER_SOURCE_DIR) + "/tests/ops"))
    if (e.path().filename().string().rfind("conformance_xfail", 0) == 0) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  std::string line;
  for (const auto& file : files) {
    std::ifstream f(file);
    while (std::getline(f, line)) {
      if (line.empty() || line[0] == '#') continue;
      std::istringstream is(line);
      std::string name;
      is >> name;
      std::string reason;
      std::getline(is, reason);
      reason.erase(0, std::min(reason.size(), reason.find_first_not_of(" \t")));
      EXPECT_FALSE(reason.find_first_not_of(" \t") == std::string::npos)
          << "conformance_xfail.txt: '" << name << "' has no reason";
      if (name.rfind("op:", 0) == 0)
        x.uncovered_ops.insert(name.substr(3));
      else
        x.cases[name] = reason;
    }
  }
  return x;
}

struct Outcome {
  enum Kind { kPass, kFail, kUnsupported } kind;
  std::string reason;
};

Outcome run_case(const fs::path& dir, std::set<std::pair<std::string, std::string>>& ops) {
  ir::Model model;
  try {
    model = onnx::load_model((dir / "model.onnx").string());
  } catch (const Error& e) {
    return {Outcome::kUnsupported, e.what()};
  }
  collect_ops(model.graph, ops);
  const auto& table = ops::OpTable::global();
  for (const auto& [d, op] : ops)
    if (!table.find(d, op)) return {Outcome::kUnsupported, "op " + op};
  for (const auto* v : model.graph.real_inputs())
    if (!v->type.is_tensor()) return {Outcome::kUnsupported, "non-tensor input"};
  for (const auto& v : model.graph.outputs)
    if (!v.type.is_tensor()) return {Outcome::kUnsupported, "non-tensor output"};
  try {
    Executor exec(model);
    auto inputs = exec.inputs();
    std::vector<fs::path> sets;
    for (const auto& e : fs::directory_iterator(dir))
      if (e.is_directory() && e.path().filename().string().rfind("test_data_set_", 0) == 0)
        sets.push_back(e.path());
    std::sort(sets.begin(), sets.end());
    if (sets.empty()) return {Outcome::kUnsupported, "no test data"};
    for (const auto& set : sets) {
      NamedTensors feeds;
      // Inputs are numbered in the order of the graph's inputs (initializer-backed ones excluded,
      // unless a file is given for them).
      const auto& all = model.graph.inputs;
      size_t k = 0;
      for (const auto& v : all) {
        fs::path p = set / ("input_" + std::to_string(k) + ".pb");
        bool is_init = model.graph.find_initializer(v.name) != nullptr;
        if (!fs::exists(p)) {
          if (is_init) continue;
          break;
        }
        feeds.emplace_back(v.name, onnx::load_tensor_pb(p.string()));
        ++k;
      }
      auto outs = exec.run(feeds);
      for (size_t i = 0; i < outs.size(); ++i) {
        fs::path p = set / ("output_" + std::to_string(i) + ".pb");
        if (!fs::exists(p)) continue;
        at::Tensor want = onnx::load_tensor_pb(p.string());
        std::string why = compare(outs[i], want, 1e-3, 1e-5);
        if (!why.empty())
          return {Outcome::kFail,
                  set.filename().string() + " output " + std::to_string(i) + ": " + why};
      }
    }
  } catch (const std::exception& e) {
    std::string msg = e.what();
    return {Outcome::kFail, msg.substr(0, msg.find('\n'))};
  }
  return {Outcome::kPass, ""};
}

std::vector<fs::path> case_dirs() {
  std::vector<fs::path> roots = {LOPPER_ONNX_NODE_TESTS,
                                 "/usr/share/libonnx-testdata/data/pytorch-converted",
                                 "/usr/share/libonnx-testdata/data/pytorch-operator"};
  std::vector<fs::path> out;
  for (const auto& r : roots) {
    if (!fs::exists(r)) continue;
    for (const auto& e : fs::directory_iterator(r))
      if (fs::exists(e.path() / "model.onnx")) out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

TEST(Conformance, OnnxBackendCases) {
  configure_threads(2);
  Xfail xfail = load_xfail();
  const char* filter = std::getenv("LOPPER_CONFORMANCE_FILTER");
  bool verbose = std::getenv("LOPPER_CONFORMANCE_VERBOSE") != nullptr;
  auto dirs = case_dirs();
  ASSERT_GT(dirs.size(), 1000u) << "ONNX's backend test data not found";

  std::set<std::pair<std::string, std::string>> passed_ops;
  int pass = 0, fail = 0, xfailed = 0, unsupported = 0;
  std::set<std::string> seen_names;
  for (const auto& dir : dirs) {
    std::string name = dir.parent_path().filename().string() + "/" + dir.filename().string();
    if (filter && name.find(filter) == std::string::npos) continue;
    seen_names.insert(name);
    std::set<std::pair<std::string, std::string>> ops;
    Outcome r = run_case(dir, ops);
    auto xf = xfail.cases.find(name);
    if (r.kind == Outcome::kUnsupported) {
      ++unsupported;
      if (verbose) std::cout << "  skip " << name << ": " << r.reason << "\n";
      continue;
    }
    if (r.kind == Outcome::kPass) {
      passed_ops.insert(ops.begin(), ops.end());
      ++pass;
      // NOTE: an entry whose reason starts "on some CPUs:" fails on some machines only (a
      // rounding edge that depends on the CPU's float32 kernels), and one whose reason starts
      // "random " compares a random draw with numpy's (a few Bernoulli draws can agree by
      // chance): passing is no error there.
      EXPECT_TRUE(xf == xfail.cases.end() || xf->second.rfind("on some CPUs:", 0) == 0 ||
                  xf->second.rfind("random ", 0) == 0)
          << name << " passes but is listed in conformance_xfail.txt (remove it)";
      if (verbose) std::cout << "  pass " << name << "\n";
      continue;
    }
    if (xf != xfail.cases.end()) {
      ++xfailed;
      if (verbose) std::cout << "  xfail " << name << ": " << r.reason << "\n";
      continue;
    }
    ++fail;
    ADD_FAILURE() << name << ": " << r.reason;
  }
  std::cout << "conformance: " << pass << " passed, " << fail << " failed, " << xfailed
            << " expected failures, " << unsupported << " use ops lopper does not register ("
            << ops::OpTable::global().all().size() << " ops registered)\n";
  if (filter) return;
  for (const auto& [name, reason] : xfail.cases)
    EXPECT_TRUE(seen_names.count(name)) << "conformance_xfail.txt names unknown case " << name;
  for (const auto* op : ops::OpTable::global().all()) {
    if (passed_ops.count({op->domain, op->op_type}) || xfail.uncovered_ops.count(op->op_type))
      continue;
    ADD_FAILURE() << "registered op " << op->op_type << " passes no conformance case";
  }
}
