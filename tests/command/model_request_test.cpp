// The requests that read a model and say what it is, run it, write it again or measure it
// (inspect, run, convert, bench, eval, compare): their rules, and what each hands back.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "lopper/command.h"
#include "lopper/error.h"
#include "lopper/npy.h"
#include "lopper/onnx_io.h"
#include "test_models.h"

namespace lopper {
namespace {

using test::refusal_of;
using test::TempDir;

// An option as the CLI spells it: "sparse_initializers" -> "--sparse-initializers".
std::string flag(const std::string& o) {
  std::string f = "--" + o;
  for (char& c : f)
    if (c == '_') c = '-';
  return f;
}

// x [1, 8] -> MatMul "a" (w) -> MatMul "b" (w) -> y: one weight both layers read.
std::string shared_weight_model(const TempDir& tmp) {
  ir::Model m;
  m.ir_version = 8;
  m.opset_import = {{"", 17}};
  m.graph.nodes = {test::node("MatMul", {"x", "w"}, {"h"}, "a"),
                   test::node("MatMul", {"h", "w"}, {"y"}, "b")};
  m.graph.inputs = {test::value_info("x", {1, 8})};
  m.graph.outputs = {test::value_info("y", {1, 8})};
  at::manual_seed(3);
  m.graph.initializers = {{"w", at::randn({8, 8})}};
  const std::string path = tmp / "shared.onnx";
  onnx::save_model(m, path);
  return path;
}

TEST(ConvertRequest, OneStorageForTheInitializers) {
  ConvertRequest r;
  r.sparse_initializers = r.dense = true;
  EXPECT_EQ(refusal_of(r, flag),
            "[convert] --sparse-initializers does not go with --dense: one storage for the "
            "initializers");
  r.dense = false;
  EXPECT_EQ(refusal_of(r, flag), "(accepted)");
}

TEST(ConvertRequest, RefusedBeforeAnythingIsWritten) {
  TempDir tmp;
  ConvertRequest r;
  r.model = shared_weight_model(tmp);
  r.out = tmp / "out.onnx";
  r.sparse_initializers = r.dense = true;
  EXPECT_THROW(r.run(), UsageError);
  EXPECT_FALSE(std::filesystem::exists(r.out));
  r.dense = false;
  const ConvertResult written = r.run();
  EXPECT_GT(written.written_bytes, 0);
  EXPECT_EQ(written.written_bytes, int64_t(std::filesystem::file_size(r.out)));
  EXPECT_EQ(written.model_bytes, int64_t(std::filesystem::file_size(r.model)));
}

// Bench and compare take the same counts: each outside its range is refused, in `op`'s words.
template <typename Request>
void expect_counts_checked(const std::string& op) {
  Request r;
  EXPECT_EQ(refusal_of(r, flag), "(accepted)");
  r.batch = 0;
  EXPECT_EQ(refusal_of(r, flag), "[" + op + "] --batch must be 1..1048576, got 0");
  r.batch = 4;
  r.iters = 0;
  EXPECT_EQ(refusal_of(r, flag), "[" + op + "] --iters must be 1..1000000, got 0");
  r.iters = 1000001;
  EXPECT_EQ(refusal_of(r, flag), "[" + op + "] --iters must be 1..1000000, got 1000001");
  r.iters = 5;
  EXPECT_EQ(refusal_of(r, flag), "(accepted)");
}

TEST(BenchRequest, EachCountInItsRange) {
  expect_counts_checked<BenchRequest>("bench");
  BenchRequest r;
  r.warmup = -1;
  EXPECT_EQ(refusal_of(r, flag), "[bench] --warmup must be 0..100000, got -1");
}

TEST(CompareRequest, EachCountInItsRange) { expect_counts_checked<CompareRequest>("compare"); }

TEST(BenchRequest, TimesTheRunsAskedForAtTheBatchAsked) {
  TempDir tmp;
  BenchRequest r;
  r.model = shared_weight_model(tmp);
  r.batch = 1;
  r.warmup = 0;
  r.iters = 3;
  r.profile = true;
  const BenchResult b = r.run();
  EXPECT_EQ(b.batch, 1);
  EXPECT_EQ(b.latency.runs, 3);
  ASSERT_EQ(b.ops.size(), 1u);  // MatMul
  EXPECT_EQ(b.ops[0].op, "MatMul");
  EXPECT_EQ(b.ops[0].calls_per_run, 2);
  EXPECT_EQ(b.nodes.size(), 2u);
  EXPECT_GE(b.nodes[0].first, b.nodes[1].first);  // slowest first
  // The model's batch is fixed at 1: another is refused, naming the input.
  r.batch = 2;
  EXPECT_THROW(
      {
        try {
          r.run();
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("input 'x' has a fixed batch of 1"),
                    std::string::npos)
              << e.what();
          throw;
        }
      },
      Error);
}

TEST(InspectRequest, MarksTheLayersThatReadOneWeight) {
  TempDir tmp;
  InspectRequest r;
  r.model = shared_weight_model(tmp);
  const InspectResult i = r.run();
  ASSERT_EQ(i.cost.layers.size(), 2u);
  EXPECT_EQ(i.shared, std::vector<bool>({true, true}));
  EXPECT_EQ(i.cost.params, 64);  // stored once, counted once
  EXPECT_EQ(i.file_bytes, int64_t(std::filesystem::file_size(r.model)));
}

TEST(RunRequest, WritesEveryOutputOrNothing) {
  TempDir tmp;
  RunRequest r;
  r.model = shared_weight_model(tmp);
  r.out = tmp / "out";
  save_npy(at::ones({1, 8}), tmp / "x.npy");
  r.inputs = {{"x", tmp / "x.txt"}};
  try {
    r.run();
    ADD_FAILURE() << "a .txt input was read";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("must be .npy or .pb"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(std::filesystem::exists(r.out));
  r.inputs = {{"x", tmp / "x.npy"}};
  const auto outs = r.run();
  ASSERT_EQ(outs.size(), 1u);
  EXPECT_EQ(outs[0].name, "y");
  EXPECT_EQ(outs[0].shape, std::vector<int64_t>({1, 8}));
  const at::Tensor w = onnx::load_model(r.model).graph.find_initializer("w")->value;
  EXPECT_TRUE(at::allclose(load_npy(outs[0].path), at::ones({1, 8}).mm(w).mm(w), 1e-5, 1e-5));
}

TEST(DataSpec, AFixedBatchWinsAndMeasuresFullBatchesOnly) {
  TempDir tmp;
  const ir::Model fixed = onnx::load_model(shared_weight_model(tmp));  // x [1, 8]
  DataSpec d;
  d.batch_size = 32;
  const LoaderOptions lo = d.eval_loader(fixed);
  EXPECT_EQ(lo.batch_size, 1);
  EXPECT_TRUE(lo.drop_last);
  EXPECT_FALSE(lo.shuffle);
  d.batch_size = 0;
  EXPECT_THROW(d.loader(fixed), Error);
  d.batch_size = 8;
  d.loss = "hinge";
  EXPECT_THROW(d.loss_options(), UsageError);
}

}  // namespace
}  // namespace lopper
