// Layer input statistics (issue 20's calibration for Wanda and SparseGPT): per Gemm weight, the
// squared norm of each input feature and the Gram matrix over every calibration sample, equal to
// what the layer's input computed directly gives; batches add up; a MatMul language model counts
// tokens.
#include "prune/layer_inputs.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "lopper/data.h"
#include "lopper/error.h"
#include "lopper/npy.h"
#include "lopper/onnx_io.h"
#include "lopper/prune.h"
#include "test_models.h"
#include "test_util.h"

using namespace lopper;

namespace {

DataLoader npy_loader(const at::Tensor& x, const test::TempDir& tmp, const std::string& stem,
                      int64_t batch) {
  const std::string xs = tmp / (stem + "_x.npy"), ys = tmp / (stem + "_y.npy");
  save_npy(x, xs);
  save_npy(at::zeros({x.size(0)}, at::kLong), ys);  // labels the statistics do not read
  LoaderOptions lo;
  lo.batch_size = batch;
  lo.shuffle = false;
  return DataLoader(open_dataset("npy:" + xs + "," + ys), lo);
}

}  // namespace

TEST(LayerInputs, NormsAndGramAreTheLayersInputs) {
  ir::Model m = onnx::load_model(test::fixture("mlp.ts.onnx"));
  test::TempDir tmp;
  at::manual_seed(7);
  at::Tensor x = at::rand({8, 1, 28, 28});
  DataLoader loader = npy_loader(x, tmp, "x", 4);  // the fixture's fixed batch
  LayerInputOptions o;
  o.gram = true;
  int64_t calls = 0;
  o.progress = [&](int64_t b, int64_t of) {
    EXPECT_EQ(b, ++calls);
    EXPECT_EQ(of, 2);
  };
  auto stats = collect_layer_inputs(m, loader, o);
  EXPECT_EQ(calls, 2);
  const auto weights = prunable_weights(m.graph);
  ASSERT_EQ(weights.size(), 3u);
  ASSERT_EQ(stats.size(), 3u);
  // The inputs layer by layer: Flatten, then Gemm (transB) and Relu.
  at::Tensor h = x.reshape({8, -1}).to(at::kDouble);
  for (size_t i = 0; i < weights.size(); ++i) {
    const ir::Node& n = *weights[i].node;
    ASSERT_EQ(n.op_type, "Gemm");
    ASSERT_TRUE(n.attr("transB") && n.attr("transB")->i == 1);
    const LayerInput& li = stats.at(weights[i].weight);
    EXPECT_EQ(li.tokens, 8);
    EXPECT_TRUE(at::allclose(li.sq_norm, h.square().sum(0), 1e-5, 1e-6)) << weights[i].weight;
    EXPECT_TRUE(at::allclose(li.gram, h.t().mm(h), 1e-5, 1e-5)) << weights[i].weight;
    const at::Tensor w = m.graph.find_initializer(weights[i].weight)->value.to(at::kDouble);
    const at::Tensor b = m.graph.find_initializer(n.inputs[2])->value.to(at::kDouble);
    h = at::linear(h, w, b);
    if (i + 1 < weights.size()) h = h.relu();
  }
}

TEST(LayerInputs, BatchesAddUp) {
  ir::Model m = onnx::load_model(test::fixture("mlp.ts.onnx"));
  test::TempDir tmp;
  at::manual_seed(8);
  at::Tensor x = at::rand({8, 1, 28, 28});
  DataLoader both = npy_loader(x, tmp, "both", 4);
  DataLoader first = npy_loader(x.slice(0, 0, 4), tmp, "first", 4);
  LayerInputOptions o;
  auto all = collect_layer_inputs(m, both, o);
  auto half = collect_layer_inputs(m, first, o);
  o.batches = 1;
  auto one = collect_layer_inputs(m, both, o);  // at most one batch: the first half
  for (const auto& [name, li] : all) {
    EXPECT_FALSE(li.gram.defined());
    EXPECT_TRUE(at::allclose(one.at(name).sq_norm, half.at(name).sq_norm)) << name;
    EXPECT_TRUE(at::all(li.sq_norm >= half.at(name).sq_norm - 1e-9).item<bool>()) << name;
  }
  o.batches = 0;
  EXPECT_THROW(collect_layer_inputs(m, both, o), Error);
}

TEST(LayerInputs, LanguageModelCountsTokens) {
  ir::Model m = onnx::load_model(test::fixture("gpt2.dynamo.onnx"));
  test::TempDir tmp;
  at::manual_seed(9);
  at::Tensor ids = at::randint(0, 100, {4, 16}, at::kLong);
  DataLoader loader = test::token_loader(tmp, ids);
  auto stats = collect_layer_inputs(m, loader, LayerInputOptions{});
  ASSERT_FALSE(stats.empty());
  for (const auto& pw : prunable_weights(m.graph)) {
    auto it = stats.find(pw.weight);
    if (it == stats.end()) continue;  // a tied embedding's lm_head is one of them too
    const at::Tensor& w = m.graph.find_initializer(pw.weight)->value;
    EXPECT_EQ(it->second.sq_norm.size(0), w.size(pw.in_axis)) << pw.weight;
    EXPECT_EQ(it->second.tokens % 64, 0) << pw.weight;  // 4 sequences of 16 tokens, per reader
    EXPECT_GT(it->second.sq_norm.sum().item<double>(), 0) << pw.weight;
  }
}

// A transformer's q, k and v read one input, and so do gate and up: they hold one set of sums (one
// Gram matrix, not three), equal to what each collected alone gives; the others have their own.
TEST(LayerInputs, LayersOfOneInputShareTheirSums) {
  ir::Model m = onnx::load_model(test::fixture("llama.dynamo.onnx"));
  test::TempDir tmp;
  at::manual_seed(10);
  DataLoader loader = test::token_loader(tmp, at::randint(1, 100, {4, 16}, at::kLong));
  LayerInputOptions o;
  o.gram = true;
  const auto all = collect_layer_inputs(m, loader, o);
  std::map<std::string, std::string> param;  // "q_proj" -> its weight, block 0
  for (const auto& pw : prunable_weights(m.graph))
    for (const char* p :
         {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"})
      if (pw.param.find("layers.0.") != std::string::npos && pw.param.find(p) != std::string::npos)
        param[p] = pw.weight;
  ASSERT_EQ(param.size(), 7u);
  auto gram = [&](const char* p) { return all.at(param.at(p)).gram; };
  EXPECT_TRUE(gram("k_proj").is_same(gram("q_proj")));
  EXPECT_TRUE(gram("v_proj").is_same(gram("q_proj")));
  EXPECT_TRUE(gram("up_proj").is_same(gram("gate_proj")));
  EXPECT_FALSE(gram("o_proj").is_same(gram("q_proj")));
  EXPECT_FALSE(gram("down_proj").is_same(gram("gate_proj")));
  for (const char* p : {"k_proj", "up_proj", "o_proj"}) {
    o.weights = {param.at(p)};
    const LayerInput alone = collect_layer_inputs(m, loader, o).at(param.at(p));
    const LayerInput& shared = all.at(param.at(p));
    EXPECT_EQ(shared.tokens, alone.tokens) << p;
    EXPECT_TRUE(at::allclose(shared.gram, alone.gram, 1e-9, 1e-9)) << p;
    EXPECT_TRUE(at::allclose(shared.sq_norm, alone.sq_norm, 1e-9, 1e-9)) << p;
  }
}
