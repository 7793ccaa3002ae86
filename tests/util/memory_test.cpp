// Memory bombs and raw messages: a node, a --shape or a --batch asking for more memory than the
// machine has is refused before anything is allocated, in one line naming it and the size; an
// allocation that fails anyway, a filesystem error and a message of several lines all reach the
// user as one lopper line. Every case here must stay fast: the checks fire before allocating.
#include "lopper/memory.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>

#include "lopper/analysis.h"
#include "lopper/error.h"
#include "lopper/executor.h"
#include "lopper/npy.h"
#include "lopper/onnx_io.h"
#include "test_models.h"

namespace fs = std::filesystem;
using namespace lopper;
using namespace lopper::test;

namespace {

ir::Model model_of(std::vector<ir::ValueInfo> inputs, std::vector<ir::Node> nodes,
                   std::vector<ir::Initializer> inits = {}, int64_t opset = 17) {
  ir::Model m;
  m.ir_version = 8;
  m.opset_import = {{"", opset}};
  m.graph.name = "g";
  m.graph.inputs = std::move(inputs);
  m.graph.initializers = std::move(inits);
  m.graph.outputs = {value_info(nodes.back().outputs[0], {}, ir::DType::kUndefined, false)};
  m.graph.nodes = std::move(nodes);
  return m;
}

at::Tensor longs(std::vector<int64_t> v) { return at::tensor(v, at::kLong); }

// c = ConstantOfShape([1000000, 1000000]): 10^12 float32 values, 4.0 TB.
ir::Model constant_of_shape_bomb() {
  return model_of({value_info("x", {1}, ir::DType::kFloat)},
                  {node("ConstantOfShape", {"s"}, {"c"})},
                  {{"s", longs({1000000, 1000000}), "", false}});
}

// What running `m` on `feeds` says ("" when it runs).
std::string run_error(const ir::Model& m, const NamedTensors& feeds) {
  return error_of([&] {
    Executor exec(m);
    exec.run(feeds);
  });
}

void expect_one_line(const test::CliResult& r, int code, std::initializer_list<const char*> words) {
  EXPECT_EQ(r.code, code) << r.err;
  EXPECT_EQ(lines(r.err), 1) << r.err;
  EXPECT_EQ(r.err.rfind("lopper: ", 0), 0u) << r.err;
  for (const char* w : words)
    EXPECT_NE(r.err.find(w), std::string::npos) << w << " not in " << r.err;
}

TEST(Memory, HelpersSayTheSize) {
  EXPECT_EQ(human_bytes(4e12), "4.0 TB");
  EXPECT_EQ(human_bytes(24.6e9), "25 GB");
  EXPECT_EQ(human_bytes(512), "512 B");
  EXPECT_EQ(tensor_bytes({1000000, 1000000}, 4), 4e12);
  EXPECT_EQ(tensor_bytes({100000, 0, 100000}, 4), 0);
  EXPECT_EQ(
      allocation_size_in(
          "DefaultCPUAllocator: not enough memory: you tried to allocate 4000000000000 bytes."),
      "4.0 TB");
  EXPECT_EQ(allocation_size_in("CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has"),
            "20.00 GiB");
  EXPECT_EQ(allocation_size_in("something else"), "");
  EXPECT_EQ(first_line("\n  could not create a primitive  \nmore detail\n"),
            "could not create a primitive");
  EXPECT_GT(memory_bytes(), 0);
  EXPECT_TRUE(exceeds_memory(1e18));
}

TEST(Memory, ConstantOfShapeIsRefusedByTheLibraryBeforeAllocating) {
  // Folded at load (its input is an initializer) ...
  std::string err = run_error(constant_of_shape_bomb(), {{"x", at::zeros({1})}});
  EXPECT_NE(err.find("[exec] node 'c' (ConstantOfShape): output [1000000x1000000] needs 4.0 TB, "
                     "more than this machine's memory ("),
            std::string::npos)
      << err;
  // ... and from a shape only known at run time.
  ir::Model m =
      model_of({value_info("s", {2}, ir::DType::kInt64)}, {node("ConstantOfShape", {"s"}, {"c"})});
  err = run_error(m, {{"s", longs({1000000, 1000000})}});
  EXPECT_NE(err.find("node 'c' (ConstantOfShape): output [1000000x1000000] needs 4.0 TB"),
            std::string::npos)
      << err;
}

TEST(Memory, EveryOpThatMaterialisesAShapeFromValuesChecksIt) {
  struct Case {
    const char* op;
    ir::Model model;
    NamedTensors feeds;
    const char* shape;
  };
  const auto f = ir::DType::kFloat, l = ir::DType::kInt64;
  ir::Node random = node("RandomNormal", {}, {"r"}, {ints_attr("shape", {1000000, 1000000})});
  std::vector<Case> cases;
  cases.push_back({"Expand",
                   model_of({value_info("x", {1}, f), value_info("s", {2}, l)},
                            {node("Expand", {"x", "s"}, {"e"})}),
                   {{"x", at::zeros({1})}, {"s", longs({1000000, 1000000})}},
                   "[1000000x1000000]"});
  cases.push_back({"Tile",
                   model_of({value_info("x", {1000}, f), value_info("r", {1}, l)},
                            {node("Tile", {"x", "r"}, {"t"})}),
                   {{"x", at::zeros({1000})}, {"r", longs({1000000000000})}},
                   "[1000000000000000]"});
  cases.push_back(
      {"Range",
       model_of({value_info("a", {}, l), value_info("b", {}, l), value_info("d", {}, l)},
                {node("Range", {"a", "b", "d"}, {"r"})}),
       {{"a", longs({0}).reshape({})},
        {"b", longs({1000000000000000}).reshape({})},
        {"d", longs({1}).reshape({})}},
       "[1000000000000000]"});
  cases.push_back({"Pad",
                   model_of({value_info("x", {1, 1}, f), value_info("p", {4}, l)},
                            {node("Pad", {"x", "p"}, {"p_out"})}),
                   {{"x", at::zeros({1, 1})}, {"p", longs({0, 0, 999999, 999999})}},
                   "[1000000x1000000]"});
  cases.push_back(
      {"OneHot",
       model_of({value_info("i", {1000000}, l), value_info("d", {}, l), value_info("v", {2}, f)},
                {node("OneHot", {"i", "d", "v"}, {"o"})}),
       {{"i", at::zeros({1000000}, at::kLong)},
        {"d", longs({10000000}).reshape({})},
        {"v", at::zeros({2})}},
       "[1000000x10000000]"});
  cases.push_back({"Resize",
                   model_of({value_info("x", {1, 1, 2, 2}, f), value_info("s", {4}, f)},
                            {node("Resize", {"x", "", "s"}, {"y"})}),
                   {{"x", at::zeros({1, 1, 2, 2})}, {"s", at::tensor({1.f, 1.f, 1e6f, 1e6f})}},
                   "[1x1x2000000x2000000]"});
  cases.push_back({"CenterCropPad",
                   model_of({value_info("x", {2}, f), value_info("s", {1}, l)},
                            {node("CenterCropPad", {"x", "s"}, {"y"})}, {}, 18),
                   {{"x", at::zeros({2})}, {"s", longs({10000000000000})}},
                   "[10000000000000]"});
  cases.push_back({"RandomNormal", model_of({}, {random}), {}, "[1000000x1000000]"});
  for (auto& c : cases) {
    std::string err = run_error(c.model, c.feeds);
    EXPECT_NE(err.find(std::string("(") + c.op + "): output " + c.shape + " needs "),
              std::string::npos)
        << c.op << ": " << err;
    EXPECT_NE(err.find("more than this machine's memory"), std::string::npos)
        << c.op << ": " << err;
  }
}

TEST(Memory, AFailedAllocationNamesTheNodeAndTheSize) {
  // [10^7 x 1] @ [1 x 10^7]: the inputs are small, the product (400 TB) is past any machine and any
  // address space, so the allocation fails at once, without touching memory.
  const auto f = ir::DType::kFloat;
  ir::Model m = model_of({value_info("a", {-1, 1}, f), value_info("b", {1, -1}, f)},
                         {node("MatMul", {"a", "b"}, {"mm"})});
  std::string err =
      run_error(m, {{"a", at::zeros({10000000, 1})}, {"b", at::zeros({1, 10000000})}});
  EXPECT_NE(err.find("[exec] node 'mm' (MatMul): out of memory"), std::string::npos) << err;
  EXPECT_NE(err.find("400 TB"), std::string::npos) << err;
  EXPECT_EQ(err.find('\n'), std::string::npos) << err;
}

TEST(Memory, ShapeAnalysisRefusesShapesThatCannotFit) {
  ir::Model m = model_of({value_info("x", {-1, 3, 224, 224}, ir::DType::kDouble)},
                         {node("Relu", {"x"}, {"y"})});
  try {
    resolve_input_shapes(m, {{"x", {100000000, 3, 224, 224}}});
    ADD_FAILURE() << "not refused";
  } catch (const UsageError& e) {
    std::string err = e.what();
    EXPECT_NE(err.find("input_shapes for input 'x' [100000000x3x224x224] (float64) needs 120 TB"),
              std::string::npos)
        << err;
  }
  ir::Model declared = model_of({value_info("x", {100000, 100000, 100000}, ir::DType::kFloat)},
                                {node("Relu", {"x"}, {"y"})});
  EXPECT_THROW(resolve_input_shapes(declared, {}), Error);
}

// The CLI on the saved bomb: run, bench and inspect each print the node, its op and the size.
TEST(MemoryCli, ConstantOfShapeOnRunBenchInspect) {
  TempDir d;
  onnx::save_model(constant_of_shape_bomb(), d / "bomb.onnx");
  save_npy(at::zeros({1}), d / "x.npy");
  for (const std::string& cmd :
       {"run " + (d / "bomb.onnx") + " -i x=" + (d / "x.npy") + " -o " + (d / "out"),
        "bench " + (d / "bomb.onnx") + " --warmup 0 --iters 1", "inspect " + (d / "bomb.onnx")}) {
    SCOPED_TRACE(cmd);
    expect_one_line(lopper_cli(cmd), 1,
                    {"node 'c' (ConstantOfShape)", "[1000000x1000000]", "4.0 TB", "memory ("});
  }
  EXPECT_FALSE(fs::exists(d / "out"));
  // The shape given at run time, in a file.
  ir::Model m =
      model_of({value_info("s", {2}, ir::DType::kInt64)}, {node("ConstantOfShape", {"s"}, {"c"})});
  onnx::save_model(m, d / "dyn.onnx");
  save_npy(longs({1000000, 1000000}), d / "s.npy");
  expect_one_line(
      lopper_cli("run " + (d / "dyn.onnx") + " -i s=" + (d / "s.npy") + " -o " + (d / "out")), 1,
      {"node 'c' (ConstantOfShape)", "4.0 TB"});
}

TEST(MemoryCli, HugeShapeFlagIsAUsageError) {
  TempDir d;
  ir::Model m = model_of({value_info("x", {-1, 3, 224, 224}, ir::DType::kFloat)},
                         {node("Relu", {"x"}, {"y"})});
  onnx::save_model(m, d / "relu.onnx");
  for (const char* cmd : {"inspect", "bench"}) {
    SCOPED_TRACE(cmd);
    expect_one_line(
        lopper_cli(std::string(cmd) + " " + (d / "relu.onnx") + " --shape x=100000x100000x100000"),
        2, {"--shape x=100000x100000x100000", "1000000000000000 values", "PB"});
  }
  // A model that declares a static shape past memory: an error of the model (exit 1).
  ir::Model big = model_of({value_info("x", {100000, 100000, 100000}, ir::DType::kFloat)},
                           {node("Relu", {"x"}, {"y"})});
  onnx::save_model(big, d / "big.onnx");
  expect_one_line(lopper_cli("inspect " + (d / "big.onnx")), 1,
                  {"input 'x' [100000x100000x100000] (float32) needs 4.0 PB"});
}

TEST(MemoryCli, HugeBatchIsAUsageError) {
  TempDir d;
  ir::Model m = model_of({value_info("x", {-1, 1000, 1000}, ir::DType::kFloat)},
                         {node("Relu", {"x"}, {"y"})});
  onnx::save_model(m, d / "relu.onnx");
  expect_one_line(lopper_cli("bench " + (d / "relu.onnx") + " --batch 1048576"), 2,
                  {"--batch 1048576", "input 'x' [1048576x1000x1000]", "4.2 TB"});
  expect_one_line(lopper_cli("bench " + (d / "relu.onnx") + " --batch 1000000000"), 2,
                  {"--batch", "1000000000"});
}

TEST(MemoryCli, FilesystemErrorsAreOneIoLine) {
  TempDir d;
  ir::Model m = model_of({value_info("x", {-1, 4}, ir::DType::kFloat)},
                         {node("MatMul", {"x", "W"}, {"y"})}, {{"W", at::ones({4, 4}), "", false}});
  onnx::save_model(m, d / "m.onnx");
  save_npy(at::ones({8, 4}), d / "x.npy");
  save_npy(at::zeros({8}, at::kLong), d / "y.npy");
  // std::filesystem throws for a name longer than the system takes.
  std::string long_name = d / std::string(300, 'a');
  auto r = lopper_cli("train " + (d / "m.onnx") + " --data npy:" + (d / "x.npy") + "," +
                      (d / "y.npy") + " -o " + (d / "t.onnx") + " --resume " + long_name);
  // (train reports its plan on stderr first: the error is the one line after it.)
  EXPECT_EQ(r.code, 1) << r.err;
  const std::string last = r.err.substr(r.err.rfind('\n', r.err.size() - 2) + 1);
  EXPECT_EQ(last.rfind("lopper: [io] ", 0), 0u) << r.err;
  EXPECT_NE(last.find("File name too long"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("lopper:"), r.err.rfind("lopper:")) << r.err;
  EXPECT_EQ(r.err.find("filesystem error"), std::string::npos) << r.err;
  // An output folder that is a file.
  std::ofstream(d / "file") << "x";
  r = lopper_cli("run " + (d / "m.onnx") + " -i x=" + (d / "x.npy") + " -o " + (d / "file"));
  EXPECT_NE(r.code, 0);
  EXPECT_EQ(lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find(d / "file"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("filesystem error"), std::string::npos) << r.err;
}

TEST(MemoryCli, AMessageOfSeveralLinesIsPrintedAsOne) {
  // A node name with newlines in it, in a message the executor makes.
  TempDir d;
  ir::Model m = model_of({value_info("x", {1}, ir::DType::kFloat)}, {node("Foo", {"x"}, {"y"})});
  m.graph.nodes[0].name = "bad\nname\n";
  onnx::save_model(m, d / "m.onnx");
  expect_one_line(lopper_cli("inspect " + (d / "m.onnx")), 1, {"bad name", "unsupported op 'Foo'"});
}

}  // namespace
