// Hand-built models and random data for lopper's tests: the ir builders that several test files
// share. (test_util.h holds the helpers that need no lopper headers beyond lopper/error.h.)
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "lopper/data.h"
#include "lopper/executor.h"
#include "lopper/graph.h"
#include "lopper/npy.h"
#include "lopper/onnx_io.h"
#include "test_util.h"

namespace lopper::test {

/// An OP node reading IN and writing OUT, named after its first output, with ATTRS.
inline ir::Node node(const char* op, std::vector<std::string> in, std::vector<std::string> out,
                     std::vector<ir::Attribute> attrs = {}) {
  ir::Node n;
  n.op_type = op;
  n.name = out[0];
  n.inputs = std::move(in);
  n.outputs = std::move(out);
  n.attrs = std::move(attrs);
  return n;
}

/// The same node named NAME.
inline ir::Node node(const char* op, std::vector<std::string> in, std::vector<std::string> out,
                     const std::string& name) {
  ir::Node n = node(op, std::move(in), std::move(out));
  n.name = name;
  return n;
}

using ir::float_attr;  // attributes of one value (lopper/graph.h)
using ir::int_attr;
using ir::ints_attr;

/// A graph input or output: NAME of element type T with DIMS (-1: the symbolic dimension "N");
/// without a shape at all when !HAS_SHAPE.
inline ir::ValueInfo value_info(const std::string& name, std::vector<int64_t> dims,
                                ir::DType t = ir::DType::kFloat, bool has_shape = true) {
  ir::ValueInfo v;
  v.name = name;
  v.type.elem_type = t;
  v.type.has_shape = has_shape;
  for (int64_t d : dims) v.type.dims.push_back({d, d < 0 ? "N" : ""});
  return v;
}

/// What two_layers() puts around its two layers.
struct TwoLayerOptions {
  float bias = 0.001f;    // every value of fc1's bias b1 (never pruned)
  bool relu = false;      // a Relu between fc1 and fc2
  bool graph_io = false;  // x [1, in] and y [1, out] declared as the graph's input and output
};

/// x -> Gemm "fc1" (w1 [out1, in], transB=1, b1) [-> Relu "relu"] -> MatMul "fc2" (w2) -> y,
/// opset 17: w1's rows, b1 and w2's rows are one channel group.
inline ir::Model two_layers(at::Tensor w1, at::Tensor w2, const TwoLayerOptions& o = {}) {
  ir::Model m;
  m.ir_version = 8;
  m.opset_import = {{"", 17}};
  ir::Node gemm = node("Gemm", {"x", "w1", "b1"}, {"h"}, "fc1");
  gemm.attrs = {int_attr("transB", 1)};
  if (o.relu)
    m.graph.nodes = {gemm, node("Relu", {"h"}, {"r"}, "relu"),
                     node("MatMul", {"r", "w2"}, {"y"}, "fc2")};
  else
    m.graph.nodes = {gemm, node("MatMul", {"h", "w2"}, {"y"}, "fc2")};
  if (o.graph_io) {
    m.graph.inputs = {value_info("x", {1, w1.size(1)})};
    m.graph.outputs = {value_info("y", {1, w2.size(1)})};
  }
  const int64_t out1 = w1.size(0);
  m.graph.initializers = {{"w1", w1}, {"b1", at::full({out1}, o.bias)}, {"w2", w2}};
  return m;
}

/// A classifier whose output layer is tied to an embedding, as GPT-2's lm_head is (opset 17):
/// x [4, 1, 28, 28] -> Flatten -> Gemm "fc" (w1 [16, 784], transB=1) -> h; Gather "embed" reads
/// row 0 of the table E [10, 16] and Add "add" adds it to h; MatMul "lm_head" (h + e,
/// Transpose "t" (E)) -> y [4, 10]. E is one initializer: the embedding's table and, through the
/// Transpose, lm_head's weight.
inline ir::Model tied_classifier(uint64_t seed = 0) {
  at::manual_seed(int64_t(seed));
  ir::Model m;
  m.ir_version = 8;
  m.opset_import = {{"", 17}};
  ir::Node gemm = node("Gemm", {"xf", "w1"}, {"h"}, "fc");
  gemm.attrs = {int_attr("transB", 1)};
  ir::Node t = node("Transpose", {"E"}, {"Et"}, "t");
  t.attrs = {ints_attr("perm", {1, 0})};
  m.graph.nodes = {node("Flatten", {"x"}, {"xf"}, "flatten"),
                   gemm,
                   node("Gather", {"E", "row"}, {"e"}, "embed"),
                   node("Add", {"h", "e"}, {"h2"}, "add"),
                   t,
                   node("MatMul", {"h2", "Et"}, {"y"}, "lm_head")};
  m.graph.inputs = {value_info("x", {4, 1, 28, 28})};
  m.graph.outputs = {value_info("y", {4, 10})};
  m.graph.initializers = {{"w1", at::randn({16, 784}) * 0.05},
                          {"E", at::randn({10, 16})},
                          {"row", at::zeros({1}, at::kLong)}};
  return m;
}

/// The value of M's initializer NAME (which must exist).
inline at::Tensor init(const ir::Model& m, const std::string& name) {
  return m.graph.find_initializer(name)->value;
}

/// N random 1x28x28 samples in [0, 1) with labels 0-9 (Fashion-MNIST's shapes), drawn after
/// at::manual_seed(SEED) and saved as x.npy and y.npy in TMP; returns their --data spec "npy:X,Y".
inline std::string random_npy_data(const TempDir& tmp, int64_t n, uint64_t seed) {
  at::manual_seed(seed);
  save_npy(at::rand({n, 1, 28, 28}), tmp / "x.npy");
  save_npy(at::randint(0, 10, {n}, at::kLong), tmp / "y.npy");
  return "npy:" + (tmp / "x.npy") + "," + (tmp / "y.npy");
}

/// Token ids `ids` saved under tmp, read as a language model's batches of `batch` rows, in order.
inline DataLoader token_loader(const TempDir& tmp, const at::Tensor& ids, int64_t batch = 2) {
  const std::string path = tmp / "ids.npy";
  save_npy(ids, path);
  LoaderOptions lo;
  lo.batch_size = batch;
  lo.shuffle = false;
  return DataLoader(open_dataset("tokens:" + path), lo);
}

// A model tests/fixtures/make_models.py exported, with PyTorch's inputs and outputs for it.
struct FixtureCase {
  ir::Model model;
  NamedTensors feeds;            // the recorded inputs the model declares (exporters may drop some)
  std::vector<at::Tensor> want;  // PyTorch's outputs; empty when the fixture is not there
};

// The fixture `stem` (e.g. resnet18.dynamo) from fixtures_dir(); want is empty when it has no
// metadata (not exported on this machine: make_models.py --only).
inline FixtureCase load_fixture(const std::string& stem) {
  namespace fs = std::filesystem;
  const std::string name = stem.substr(0, stem.find('.'));  // resnet18
  const fs::path dir = fixtures_dir();
  std::ifstream meta(dir / (stem + ".json"));
  FixtureCase c;
  if (!meta.good()) return c;
  auto j = nlohmann::json::parse(meta);
  c.model = onnx::load_model((dir / (stem + ".onnx")).string());
  auto names = j["inputs"].get<std::vector<std::string>>();
  for (size_t i = 0; i < names.size(); ++i) {
    bool declared = false;
    for (const auto& v : c.model.graph.inputs) declared |= v.name == names[i];
    if (declared)
      c.feeds.emplace_back(
          names[i], load_npy((dir / (name + ".input_" + std::to_string(i) + ".npy")).string()));
  }
  for (int k = 0; k < j["outputs"].get<int>(); ++k)
    c.want.push_back(load_npy((dir / (name + ".expected_" + std::to_string(k) + ".npy")).string()));
  return c;
}

}  // namespace lopper::test
