// Import validation (src/ir/validate.cpp): every model a command reads is checked once, and each
// malformed graph is refused with one line naming the thing, by the library and by the CLI.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>

#include "lopper/error.h"
#include "lopper/onnx_io.h"
#include "test_models.h"

namespace fs = std::filesystem;
using namespace lopper;
using namespace lopper::test;

namespace {

// x[1,4] -> MatMul(W) -> h -> Relu -> y: valid, and prunable.
ir::Model mlp() {
  ir::Model m;
  m.ir_version = 8;
  m.opset_import = {{"", 17}};
  m.graph.name = "g";
  m.graph.inputs = {value_info("x", {1, 4})};
  m.graph.outputs = {value_info("y", {1, 4})};
  at::manual_seed(0);
  m.graph.initializers.push_back({"W", at::randn({4, 4}), "", false});
  m.graph.nodes = {node("MatMul", {"x", "W"}, {"h"}, "mm"), node("Relu", {"h"}, {"y"}, "relu")};
  return m;
}

// mlp() and one more node: a Relu `name` from `in` to `out`.
ir::Model mlp_and_relu(const std::string& in, const std::string& out, const std::string& name) {
  ir::Model m = mlp();
  m.graph.nodes.push_back(node("Relu", {in}, {out}, name));
  return m;
}

// What importing `m` says ("" when it loads).
std::string import_error(const ir::Model& m) {
  std::string bytes = onnx::serialize_model(m);
  return error_of([&] { onnx::parse_model(bytes.data(), bytes.size()); });
}

#define EXPECT_REFUSED(model, ...)                                                  \
  do {                                                                              \
    std::string err = import_error(model);                                          \
    for (const char* w : {__VA_ARGS__})                                             \
      EXPECT_NE(err.find(w), std::string::npos) << "'" << w << "' not in: " << err; \
    EXPECT_EQ(err.find('\n'), std::string::npos) << err;                            \
  } while (0)

// `lopper inspect` on `m` saved to a file: exit code 1, one stderr line holding every word.
void expect_cli_refuses(const ir::Model& m, std::initializer_list<const char*> words) {
  TempDir d;
  onnx::save_model(m, d / "m.onnx");
  auto r = lopper_cli("inspect " + (d / "m.onnx"));
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_EQ(lines(r.err), 1) << r.err;
  EXPECT_EQ(r.out, "");
  for (const char* w : words)
    EXPECT_NE(r.err.find(w), std::string::npos) << w << " not in " << r.err;
}

TEST(Validate, ValidModelLoads) { EXPECT_EQ(import_error(mlp()), ""); }

TEST(Validate, CycleIsRefusedNamingANodeOnIt) {
  // add reads relu's output, relu reads mm's, mm reads add's: add -> mm -> relu -> add.
  ir::Model m = mlp();
  m.graph.nodes = {node("Add", {"x", "y"}, {"a"}, "add"), node("MatMul", {"a", "W"}, {"h"}, "mm"),
                   node("Relu", {"h"}, {"y"}, "relu")};
  EXPECT_REFUSED(m, "[import]", "cycle", "'mm'", "'relu'", "'add'");
  expect_cli_refuses(m, {"cycle through node 'add' (Add): 'add' -> 'mm' -> 'relu' -> 'add'"});
}

TEST(Validate, CycleBehindAValidPrefixNamesANodeOnTheCycleOnly) {
  // pre feeds the cycle but is not on it; post hangs off it.
  ir::Model m = mlp();
  m.graph.nodes = {node("Relu", {"x"}, {"p"}, "pre"), node("Add", {"p", "c"}, {"a"}, "add"),
                   node("Relu", {"a"}, {"c"}, "loop"), node("Relu", {"c"}, {"y"}, "post")};
  std::string err = import_error(m);
  EXPECT_NE(err.find("cycle through node 'add' (Add)"), std::string::npos) << err;
  EXPECT_EQ(err.find("'pre'"), std::string::npos) << err;
  EXPECT_EQ(err.find("'post'"), std::string::npos) << err;
}

TEST(Validate, NodeReadingItsOwnOutputIsACycle) {
  ir::Model m = mlp();
  m.graph.nodes = {node("Add", {"x", "a"}, {"a"}, "self"), node("Relu", {"a"}, {"y"}, "relu")};
  EXPECT_REFUSED(m, "cycle", "node 'self' (Add) reads its own output 'a'");
}

TEST(Validate, PruneRefusesACyclicModelAndWritesNothing) {
  ir::Model m = mlp();
  m.graph.nodes = {node("Add", {"x", "y"}, {"a"}, "add"), node("MatMul", {"a", "W"}, {"h"}, "mm"),
                   node("Relu", {"h"}, {"y"}, "relu")};
  TempDir d;
  onnx::save_model(m, d / "cyc.onnx");
  auto r = lopper_cli("prune " + (d / "cyc.onnx") + " -o " + (d / "out.onnx") +
                      " --method l1 --amount 0.5");
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_EQ(lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("cycle"), std::string::npos) << r.err;
  int files = 0;
  for (const auto& e : fs::directory_iterator(d.path)) files += e.path().filename() != "cyc.onnx";
  EXPECT_EQ(files, 0) << "prune wrote something for a model it refused";
}

TEST(Validate, DuplicateInitializerIsRefused) {
  ir::Model m = mlp();
  m.graph.initializers.push_back({"W", at::zeros({4, 4}), "", false});
  EXPECT_REFUSED(m, "initializer 'W' is defined twice");
  expect_cli_refuses(m, {"'W'", "twice"});
}

TEST(Validate, InitializerThatIsAlsoASparseInitializerIsRefused) {
  ir::Model m = mlp();
  at::Tensor sparse = at::zeros({4, 4});
  sparse[0][1] = 2.0;
  m.graph.initializers.push_back({"W", sparse, "", true});
  EXPECT_REFUSED(m, "'W' is both an initializer and a sparse initializer");
}

TEST(Validate, TwoNodesWritingOneValueAreRefused) {
  ir::Model m = mlp_and_relu("x", "h", "again");
  EXPECT_REFUSED(m, "value 'h' is written by node 'mm' (MatMul) and by node 'again' (Relu)");
  expect_cli_refuses(m, {"'h'", "'again'"});
  // One node naming the same output twice.
  ir::Model t = mlp();
  t.graph.nodes[1].outputs = {"y", "y"};
  t.graph.nodes[1].op_type = "Split";
  EXPECT_REFUSED(t, "value 'y' is written by node 'relu' (Split) twice");
}

TEST(Validate, NodeOutputShadowingAGraphInputIsRefused) {
  ir::Model m = mlp_and_relu("y", "x", "shadow");
  EXPECT_REFUSED(m, "node 'shadow' (Relu) writes 'x', which is an input of graph 'g'");
}

TEST(Validate, NodeOutputShadowingAnInitializerIsRefused) {
  ir::Model m = mlp_and_relu("y", "W", "shadow");
  EXPECT_REFUSED(m, "node 'shadow' (Relu) writes 'W', which is an initializer of graph 'g'");
  expect_cli_refuses(m, {"'shadow'", "initializer"});
}

TEST(Validate, OpsetOutsideTheSupportedRangeIsRefused) {
  for (int64_t v : {int64_t(0), int64_t(-3), ir::kMaxOpset + 1, int64_t(99)}) {
    ir::Model m = mlp();
    m.opset_import = {{"", v}};
    EXPECT_REFUSED(m, "ai.onnx opset", std::to_string(v).c_str(), "opsets 1 to 28");
  }
  ir::Model m = mlp();
  m.opset_import = {{"ai.onnx", 99}};
  EXPECT_REFUSED(m, "ai.onnx opset 99");
  m.opset_import = {{"", 99}};
  expect_cli_refuses(m, {"opset 99", "1 to 28"});
  // Both ends of the range load; other domains' versions are theirs.
  for (int64_t v : {ir::kMinOpset, ir::kMaxOpset}) {
    m.opset_import = {{"", v}, {"com.example", 1000}};
    EXPECT_EQ(import_error(m), "") << v;
  }
}

TEST(Validate, MaxOpsetIsTheNewestTheOnnxPackageKnows) {
  // A model made by the venv's onnx at its newest opset is exactly at the top of the range.
  TempDir d;
  std::string script = d / "make.py";
  std::ofstream(script) << "import onnx, sys\n"
                           "from onnx import helper as h, TensorProto as T\n"
                           "v = onnx.defs.onnx_opset_version()\n"
                           "g = h.make_graph([h.make_node('Relu', ['x'], ['y'])], 'g',\n"
                           "    [h.make_tensor_value_info('x', T.FLOAT, [2])],\n"
                           "    [h.make_tensor_value_info('y', T.FLOAT, [2])])\n"
                           "m = h.make_model(g, opset_imports=[h.make_opsetid('', v)])\n"
                           "onnx.save(m, sys.argv[1])\n";
  std::string cmd = std::string(LOPPER_SOURCE_DIR) + "/.venv/bin/python " + script + " " +
                    (d / "m.onnx") + " 2>/dev/null";
  if (std::system(cmd.c_str()) != 0) GTEST_SKIP() << "no onnx in the venv";
  ir::Model m = onnx::load_model(d / "m.onnx");
  EXPECT_EQ(m.opset(), ir::kMaxOpset);
}

TEST(Validate, InputNamingNoValueIsRefused) {
  ir::Model m = mlp();
  m.graph.nodes[1].inputs = {"nowhere"};
  EXPECT_REFUSED(m, "node 'relu' (Relu) reads 'nowhere', which no node, input or initializer");
  expect_cli_refuses(m, {"'nowhere'"});
  // An empty name is an omitted optional input, not a reference.
  ir::Model ok = mlp();
  ok.graph.nodes[1] = node("Clip", {"h", "", ""}, {"y"}, "clip");
  EXPECT_EQ(import_error(ok), "");
}

ir::Attribute graph_attr(const char* name, ir::Graph g) {
  ir::Attribute a;
  a.name = name;
  a.type = ir::AttrType::kGraph;
  a.g = std::make_shared<ir::Graph>(std::move(g));
  return a;
}

// If(cond) { then: Relu(h) } else { else: reads `else_reads` }: branches read the outer scope.
ir::Model if_model(const std::string& else_reads) {
  ir::Model m = mlp();
  m.graph.inputs.push_back({"cond", {ir::DType::kBool, true, {}, "", ""}, ""});
  ir::Graph then_g, else_g;
  then_g.name = "then";
  then_g.nodes = {node("Relu", {"h"}, {"t"}, "then_relu")};
  then_g.outputs = {value_info("t", {1, 4})};
  else_g.name = "else";
  else_g.nodes = {node("Neg", {else_reads}, {"e"}, "else_neg")};
  else_g.outputs = {value_info("e", {1, 4})};
  ir::Node n = node("If", {"cond"}, {"y"}, "if");
  n.attrs = {graph_attr("then_branch", then_g), graph_attr("else_branch", else_g)};
  m.graph.nodes = {node("MatMul", {"x", "W"}, {"h"}, "mm"), n};
  return m;
}

TEST(Validate, SubgraphsSeeEnclosingScopes) {
  EXPECT_EQ(import_error(if_model("x")), "");  // a graph input of the outer graph
  EXPECT_EQ(import_error(if_model("W")), "");  // an outer initializer
  EXPECT_EQ(import_error(if_model("h")), "");  // an outer node's output
  EXPECT_REFUSED(if_model("ghost"), "node 'else_neg' (Neg) reads 'ghost'", "subgraph 'else'");
}

TEST(Validate, SubgraphsAreValidatedToo) {
  ir::Model m = if_model("x");
  auto& else_g = *m.graph.nodes[1].attrs[1].g;
  else_g.nodes.push_back(node("Relu", {"x"}, {"e"}, "twice"));
  EXPECT_REFUSED(m, "subgraph 'else'", "value 'e' is written by");
}

TEST(Validate, FixtureModelsStillLoad) {
  for (const char* f :
       {"mlp.ts.onnx", "mlp.dynamo.onnx", "resnet18.ts.onnx", "mobilenet_v2.dynamo.onnx"}) {
    if (!fs::exists(test::fixture(f))) continue;
    EXPECT_NO_THROW(onnx::load_model(test::fixture(f))) << f;
  }
}

}  // namespace
