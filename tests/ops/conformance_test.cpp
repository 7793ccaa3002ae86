// ONNX's own backend conformance cases (model.onnx + test_data_set_*/{input,output}_*.pb), for
// every op lopper registers: the node cases inside the onnx package (current opsets) and Debian's
// libonnx-testdata (pytorch-converted, pytorch-operator). Expected failures live in
// tests/ops/conformance_xfail*.txt (one file per op family) with a reason each; an expected
// failure that passes is an error too.
//
// LOPPER_CONFORMANCE_FILTER=substring runs a subset; LOPPER_CONFORMANCE_VERBOSE=1 prints each case.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
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

// How a case runs: the executor's options; `constant_weights`: the weights (and biases) of the
// ops that choose a kernel per layer become initializers of the first data set's values (those
// ops prepack and time their candidates only for a constant weight), and that set alone runs;
// `backward` (with autograd): every floating-point input requires grad, and the sum of the
// floating-point outputs that carry one is differentiated back to them.
struct Variant {
  ExecOptions opts;
  bool constant_weights = false;
  bool backward = false;
  /// With constant_weights: the fraction of each weight's values (the smallest) set to zero, so
  /// that the layers offer their sparse kernels too. The outputs then differ from ONNX's: they
  /// are compared with `want` (a run on ATen's plain ops) instead.
  double sparsity = 0;
  const std::vector<at::Tensor>* want = nullptr;
  std::vector<at::Tensor>* got = nullptr;            // the outputs of the last data set
  std::vector<KernelDecision>* decisions = nullptr;  // what the last run chose, per layer
};

// The ops whose kernel is chosen per layer, and the inputs a constant weight of theirs is made of.
const std::map<std::string, std::vector<size_t>>& weighted_ops() {
  static const std::map<std::string, std::vector<size_t>> ops{
      {"Conv", {1, 2}}, {"ConvTranspose", {1, 2}}, {"Gemm", {1, 2}}, {"MatMul", {1}}};
  return ops;
}

bool has_weighted_op(const ir::Graph& g) {
  for (const auto& n : g.nodes)
    if (n.domain.empty() && weighted_ops().count(n.op_type)) return true;
  return false;
}

// Makes the fed weights of the weighted ops initializers (taken out of `feeds`), the smallest
// `sparsity` of each weight's values zero.
void make_weights_constant(ir::Model& model, NamedTensors& feeds, double sparsity) {
  for (const auto& n : model.graph.nodes) {
    auto w = weighted_ops().find(n.op_type);
    if (!n.domain.empty() || w == weighted_ops().end()) continue;
    for (size_t k : w->second) {
      if (k >= n.inputs.size() || n.inputs[k].empty()) continue;
      auto fed = std::find_if(feeds.begin(), feeds.end(),
                              [&](const auto& f) { return f.first == n.inputs[k]; });
      if (fed == feeds.end()) continue;
      at::Tensor t = fed->second;
      if (k == 1 && sparsity > 0 && t.is_floating_point() && t.numel() >= 4) {
        const auto cut = static_cast<int64_t>(sparsity * double(t.numel()));
        at::Tensor order = t.abs().reshape({-1}).argsort();
        t = t.clone().reshape({-1}).index_fill_(0, order.slice(0, 0, cut), 0).reshape(t.sizes());
      }
      model.graph.initializers.push_back({fed->first, t, "", false});
      feeds.erase(fed);
    }
  }
  auto& in = model.graph.inputs;
  in.erase(std::remove_if(in.begin(), in.end(),
                          [&](const ir::ValueInfo& v) {
                            return model.graph.find_initializer(v.name) != nullptr;
                          }),
           in.end());
}

// The types autograd differentiates (float8 types have no arithmetic to sum them with).
bool differentiable(at::ScalarType t) {
  return t == at::kFloat || t == at::kDouble || t == at::kHalf || t == at::kBFloat16;
}

Outcome run_case(const fs::path& dir, std::set<std::pair<std::string, std::string>>& ops,
                 const Variant& v = {}) {
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
  for (const auto* in : model.graph.real_inputs())
    if (!in->type.is_tensor()) return {Outcome::kUnsupported, "non-tensor input"};
  for (const auto& out : model.graph.outputs)
    if (!out.type.is_tensor()) return {Outcome::kUnsupported, "non-tensor output"};
  std::vector<fs::path> sets;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_directory() && e.path().filename().string().rfind("test_data_set_", 0) == 0)
      sets.push_back(e.path());
  std::sort(sets.begin(), sets.end());
  if (sets.empty()) return {Outcome::kUnsupported, "no test data"};
  if (v.constant_weights) sets.resize(1);
  try {
    std::unique_ptr<Executor> exec;
    for (const auto& set : sets) {
      NamedTensors feeds;
      // Inputs are numbered in the order of the graph's inputs (initializer-backed ones excluded,
      // unless a file is given for them).
      size_t k = 0;
      for (const auto& in : model.graph.inputs) {
        fs::path p = set / ("input_" + std::to_string(k) + ".pb");
        bool is_init = model.graph.find_initializer(in.name) != nullptr;
        if (!fs::exists(p)) {
          if (is_init) continue;
          break;
        }
        feeds.emplace_back(in.name, onnx::load_tensor_pb(p.string()));
        ++k;
      }
      if (v.constant_weights) make_weights_constant(model, feeds, v.sparsity);
      if (!exec) exec = std::make_unique<Executor>(model, v.opts);
      if (v.backward)
        for (auto& [name, t] : feeds)
          if (differentiable(t.scalar_type())) t = t.clone().requires_grad_(true);
      auto outs = exec->run(feeds);
      if (v.backward) {
        at::Tensor sum;
        for (const auto& o : outs)
          if (o.defined() && o.requires_grad() && differentiable(o.scalar_type()))
            sum = sum.defined() ? sum + o.sum() : o.sum();
        if (sum.defined()) sum.backward();
      }
      if (v.got) *v.got = outs;
      for (size_t i = 0; i < outs.size(); ++i) {
        fs::path p = set / ("output_" + std::to_string(i) + ".pb");
        if (!v.want && !fs::exists(p)) continue;
        const at::Tensor want = v.want ? v.want->at(i) : onnx::load_tensor_pb(p.string());
        // Against ATen's plain ops: another order of summation, to float rounding of the largest.
        const double atol =
            v.want && want.is_floating_point() && want.numel()
                ? std::max(1e-5, 1e-4 * want.abs().nan_to_num(0, 0, 0).max().item<double>())
                : 1e-5;
        std::string why = compare(outs[i], want, 1e-3, atol);
        if (!why.empty())
          return {Outcome::kFail,
                  set.filename().string() + " output " + std::to_string(i) + ": " + why};
      }
    }
    if (v.decisions) *v.decisions = exec->kernel_decisions();
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

namespace {

// Sets an environment variable for a scope, and puts back what was there.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (old_)
      setenv(name_, old_->c_str(), 1);
    else
      unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// The cases every path must pass: those the inference path passes here (listed as no expected
// failure), with the ops they use.
std::vector<fs::path> passing_cases(const Xfail& xfail) {
  std::vector<fs::path> out;
  const char* filter = std::getenv("LOPPER_CONFORMANCE_FILTER");
  for (const auto& dir : case_dirs()) {
    const std::string name = dir.parent_path().filename().string() + "/" + dir.filename().string();
    if ((filter && name.find(filter) == std::string::npos) || xfail.cases.count(name)) continue;
    std::set<std::pair<std::string, std::string>> ops;
    if (run_case(dir, ops).kind == Outcome::kPass) out.push_back(dir);
  }
  return out;
}

std::string case_name(const fs::path& dir) {
  return dir.parent_path().filename().string() + "/" + dir.filename().string();
}

// Every kernel each layer of `dir` can run on `device`, forced one at a time, matches ONNX's
// outputs (the weights constant, as the kernels need); with `sparsity`, the weights that sparse
// its smallest values zero, against ATen's plain ops. Adds the candidates run to `tried`.
void expect_every_kernel(const fs::path& dir, const std::string& device, double sparsity,
                         std::set<std::string>& tried) {
  std::set<std::pair<std::string, std::string>> ops;
  std::vector<KernelDecision> decisions;
  std::vector<at::Tensor> plain;
  Variant v;
  v.opts.device = device;
  v.constant_weights = true;
  v.sparsity = sparsity;
  if (sparsity > 0) {  // the reference: ATen's plain ops, nothing prepacked
    Variant aten = v;
    aten.opts.prepack = false;
    aten.got = &plain;
    // NOTE: only its outputs count: against ONNX's (of the dense weights) it fails.
    run_case(dir, ops, aten);
    if (plain.empty()) return;
    v.want = &plain;
  }
  v.decisions = &decisions;
  Outcome timed = run_case(dir, ops, v);
  ASSERT_EQ(timed.kind, Outcome::kPass) << case_name(dir) << " with constant weights (" << sparsity
                                        << " zero) on " << device << ": " << timed.reason;
  std::map<std::string, std::set<std::string>> candidates;  // layer -> the kernels it can run
  for (const auto& d : decisions)
    for (const auto& [name, ms] : d.timings) candidates[d.node].insert(name);
  std::set<std::string> names;
  for (const auto& [layer, c] : candidates) names.insert(c.begin(), c.end());
  for (const auto& name : names) {
    ScopedEnv force("LOPPER_FORCE_KERNEL", name);
    std::vector<KernelDecision> forced;
    v.decisions = &forced;
    Outcome r = run_case(dir, ops, v);
    EXPECT_EQ(r.kind, Outcome::kPass) << case_name(dir) << " on " << device << ", kernel " << name
                                      << " (" << sparsity << " zero): " << r.reason;
    for (const auto& d : forced)  // the layers that have the kernel ran it
      if (candidates[d.node].count(name))
        EXPECT_EQ(d.chosen, name + " (forced)") << case_name(dir) << " layer " << d.node;
    tried.insert(name);
  }
}

// The autograd path (training, gradient scores: plain differentiable ATen, nothing prepacked,
// fused or folded) on `dir`, every floating-point input differentiated, matches ONNX's outputs.
void expect_autograd(const fs::path& dir, const std::string& device) {
  std::set<std::pair<std::string, std::string>> ops;
  Variant v;
  v.opts.device = device;
  v.opts.autograd = true;
  v.backward = true;
  Outcome r = run_case(dir, ops, v);
  EXPECT_EQ(r.kind, Outcome::kPass)
      << case_name(dir) << " under autograd on " << device << ": " << r.reason;
}

}  // namespace

// ggml's test-backend-ops, for lopper: every conformance case of an op that chooses its kernel
// per layer (Conv, ConvTranspose, Gemm, MatMul) runs with each kernel its layers can run forced
// in turn, not only the one that won the timing on this machine; and every case the inference
// path passes runs through the autograd path, forward and backward.
TEST(Consistency, EveryKernelCandidateMatchesOnnx) {
  configure_threads(2);
  ScopedEnv no_cache("LOPPER_KERNEL_CACHE", "off");  // every candidate timed, none cached
  const auto cases = passing_cases(load_xfail());
  std::set<std::string> tried;
  int weighted = 0;
  for (const auto& dir : cases) {
    ir::Model m = onnx::load_model((dir / "model.onnx").string());
    if (!has_weighted_op(m.graph)) continue;
    ++weighted;
    for (double sparsity : {0.0, 0.8}) expect_every_kernel(dir, "cpu", sparsity, tried);
  }
  std::string all;
  for (const auto& t : tried) all += " " + t;
  std::cout << "kernels: " << weighted << " cases, " << tried.size() << " kernels:" << all << "\n";
  if (std::getenv("LOPPER_CONFORMANCE_FILTER")) return;
  EXPECT_GE(weighted, 40);
  EXPECT_GE(tried.size(), 12u) << all;  // oneDNN, ATen, lopper's dense and sparse kernels
}

TEST(Consistency, TheAutogradPathMatchesOnnx) {
  configure_threads(2);
  const auto cases = passing_cases(load_xfail());
  for (const auto& dir : cases) expect_autograd(dir, "cpu");
  std::cout << "autograd: " << cases.size() << " cases\n";
  if (!std::getenv("LOPPER_CONFORMANCE_FILTER")) EXPECT_GT(cases.size(), 1000u);
}

// The same on a CUDA device: every case the CPU passes, each kernel forced, and under autograd.
TEST(Consistency, OnCuda) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA GPU here";
  ScopedEnv no_cache("LOPPER_KERNEL_CACHE", "off");
  std::set<std::string> tried;
  for (const auto& dir : passing_cases(load_xfail())) {
    std::set<std::pair<std::string, std::string>> ops;
    Variant v;
    v.opts.device = "cuda";
    Outcome r = run_case(dir, ops, v);
    EXPECT_EQ(r.kind, Outcome::kPass) << case_name(dir) << " on cuda: " << r.reason;
    if (has_weighted_op(onnx::load_model((dir / "model.onnx").string()).graph))
      for (double sparsity : {0.0, 0.8}) expect_every_kernel(dir, "cuda", sparsity, tried);
    expect_autograd(dir, "cuda");
  }
}
