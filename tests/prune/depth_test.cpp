// Depth pruning (lopper/depth.h): residual blocks found, ranked and removed.
#include "lopper/depth.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "lopper/error.h"
#include "lopper/executor.h"
#include "lopper/sensitivity.h"
#include "lopper/target.h"
#include "test_models.h"

namespace lopper {
namespace {

using test::node;
using test::value_info;

// x [N, 8] -> three residual blocks h_{i+1} = h_i + relu(h_i W1_i^T) W2_i (Gemm, Relu, MatMul,
// Add) -> y. Block `quiet` has a branch 1000x smaller than the others': the least influence.
ir::Model residual_mlp(int quiet = 1, uint64_t seed = 0) {
  at::manual_seed(int64_t(seed));
  ir::Model m;
  m.ir_version = 8;
  m.opset_import = {{"", 17}};
  std::string h = "x";
  for (int i = 0; i < 3; ++i) {
    const std::string p = "blocks." + std::to_string(i) + ".";
    ir::Node gemm = node("Gemm", {h, p + "fc1.weight", p + "fc1.bias"}, {p + "a"}, p + "fc1");
    gemm.attrs = {ir::int_attr("transB", 1)};
    const std::string out = i == 2 ? "y" : p + "out";
    m.graph.nodes.push_back(gemm);
    m.graph.nodes.push_back(node("Relu", {p + "a"}, {p + "r"}, p + "relu"));
    m.graph.nodes.push_back(node("MatMul", {p + "r", p + "fc2.weight"}, {p + "b"}, p + "fc2"));
    m.graph.nodes.push_back(node("Add", {h, p + "b"}, {out}, p + "add"));
    const double scale = i == quiet ? 1e-3 : 1.0;
    m.graph.initializers.push_back({p + "fc1.weight", at::randn({16, 8})});
    m.graph.initializers.push_back({p + "fc1.bias", at::randn({16}) * 0.1});
    m.graph.initializers.push_back({p + "fc2.weight", at::randn({16, 8}) * scale});
    h = out;
  }
  m.graph.inputs = {value_info("x", {-1, 8})};
  m.graph.outputs = {value_info("y", {-1, 8})};
  return m;
}

DataLoader vectors(const test::TempDir& tmp, int64_t n = 16) {
  at::manual_seed(7);
  save_npy(at::randn({n, 8}), tmp / "x.npy");
  save_npy(at::randint(0, 8, {n}, at::kLong), tmp / "y.npy");
  LoaderOptions lo;
  lo.batch_size = 4;
  lo.shuffle = false;
  return DataLoader(open_dataset("npy:" + (tmp / "x.npy") + "," + (tmp / "y.npy")), lo);
}

// What prune_depth(m, o) is refused with, "" when it is not.
std::string refusal(ir::Model& m, const StructuredOptions& o) {
  return test::error_of([&] { prune_depth(m, o, nullptr, {}); });
}

at::Tensor run(const ir::Model& m, const at::Tensor& x) {
  Executor ex(m);
  return ex.run({{"x", x}}).at(0);
}

TEST(Depth, FindsEachResidualBlockWithItsWeights) {
  auto units = depth_units(residual_mlp(), {});
  ASSERT_EQ(units.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    const auto& u = units[size_t(i)];
    const std::string p = "blocks." + std::to_string(i);
    EXPECT_EQ(u.kind, "block");
    EXPECT_EQ(u.label, p);
    EXPECT_EQ(u.input, i == 0 ? "x" : "blocks." + std::to_string(i - 1) + ".out");
    EXPECT_TRUE(u.blocked.empty()) << u.blocked;
    EXPECT_EQ(u.nodes.size(), 4u);
    EXPECT_EQ(u.params_count, 16 * 8 + 16 + 16 * 8);
    EXPECT_EQ(u.feature_axis, 1);
  }
}

TEST(Depth, InfluenceRemovesTheQuietBlockAndHandsItsInputOn) {
  test::TempDir tmp;
  for (int quiet : {0, 1, 2}) {
    ir::Model m = residual_mlp(quiet);
    const ir::Model original = m;
    DataLoader data = vectors(tmp);
    StructuredOptions o;
    o.unit = StructuredUnit::kBlock;
    o.criterion = "influence";
    o.amount = PruneAmount{1, true};
    StructuredReport r = prune_depth(m, o, &data, {});
    ASSERT_EQ(r.groups.size(), 3u);
    for (int i = 0; i < 3; ++i)
      EXPECT_EQ(r.groups[size_t(i)].size_after, i == quiet ? 0 : 1) << "quiet " << quiet;
    EXPECT_LT(r.groups[size_t(quiet)].score, r.groups[size_t((quiet + 1) % 3)].score);
    EXPECT_EQ(r.channels_before, 3);
    EXPECT_EQ(r.channels_after, 2);
    EXPECT_EQ(r.groups[size_t(quiet)].params, 16 * 8 + 16 + 16 * 8);
    // The block's nodes and weights are gone; what is left computes the model without it.
    // (8 nodes left, and an Identity that keeps the name "y" when the last block went.)
    EXPECT_EQ(m.graph.nodes.size(), quiet == 2 ? 9u : 8u);
    EXPECT_EQ(m.graph.initializers.size(), 6u);
    const std::string p = "blocks." + std::to_string(quiet) + ".";
    EXPECT_EQ(m.graph.find_initializer(p + "fc1.weight"), nullptr);
    ir::Model zeroed = original;
    zeroed.graph.find_initializer(p + "fc2.weight")->value.zero_();
    const at::Tensor x = at::randn({5, 8});
    EXPECT_TRUE(at::allclose(run(m, x), run(zeroed, x), 1e-5, 1e-6)) << "quiet " << quiet;
  }
}

TEST(Depth, LossAndRandomRankTooAndCountsAndFractionsAgree) {
  test::TempDir tmp;
  ir::Model m = residual_mlp(2);
  DataLoader data = vectors(tmp);
  StructuredOptions o;
  o.unit = StructuredUnit::kBlock;
  o.criterion = "loss";
  o.amount = PruneAmount{1, true};
  StructuredReport r = prune_depth(m, o, &data, {});
  // The quiet block barely changes the loss; the unit removed is the one whose removal raised
  // the loss least (random weights: another may lower it).
  EXPECT_LT(std::abs(r.groups[2].score), std::abs(r.groups[0].score));
  EXPECT_LT(std::abs(r.groups[2].score), std::abs(r.groups[1].score));
  size_t lowest = 0;
  for (size_t i = 1; i < 3; ++i)
    if (r.groups[i].score < r.groups[lowest].score) lowest = i;
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(r.groups[i].size_after, i == lowest ? 0 : 1);

  ir::Model a = residual_mlp(), b = residual_mlp();
  o.criterion = "random";
  o.seed = 3;
  o.amount = PruneAmount{2.0 / 3.0, false};
  StructuredReport ra = prune_depth(a, o, nullptr, {});
  o.amount = PruneAmount{2, true};
  StructuredReport rb = prune_depth(b, o, nullptr, {});
  EXPECT_EQ(ra.channels_after, 1);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(ra.groups[i].size_after, rb.groups[i].size_after);
}

TEST(Depth, AValueReadAfterTheBlockKeepsItAndTheGraphOutputStays) {
  ir::Model m = residual_mlp();
  // blocks.1's hidden activation is also a graph output: the block cannot go.
  m.graph.outputs.push_back(value_info("blocks.1.r", {-1, 16}));
  auto units = depth_units(m, {});
  ASSERT_EQ(units.size(), 3u);
  EXPECT_NE(units[1].blocked.find("'blocks.1.r' is an output of the model"), std::string::npos)
      << units[1].blocked;
  // The last block's output is the model's: removing it keeps the name with an Identity.
  StructuredOptions o;
  o.unit = StructuredUnit::kBlock;
  o.criterion = "random";
  o.amount = PruneAmount{1, true};
  o.exclude = "blocks\\.0";
  StructuredReport r = prune_depth(m, o, nullptr, {});
  EXPECT_EQ(r.groups[0].blocked, "excluded");
  EXPECT_TRUE(r.warnings.empty()) << r.warnings.front();  // the regex matched: no warning
  EXPECT_EQ(r.groups[2].size_after, 0);
  ASSERT_FALSE(m.graph.nodes.empty());
  EXPECT_EQ(m.graph.nodes.back().op_type, "Identity");
  EXPECT_EQ(m.graph.nodes.back().outputs[0], "y");
  EXPECT_EQ(m.graph.nodes.back().inputs[0], "blocks.1.out");
  ir::validate(m);
}

TEST(Depth, RefusesWhatCannotBeDone) {
  test::TempDir tmp;
  ir::Model m = residual_mlp();
  StructuredOptions o;
  o.unit = StructuredUnit::kBlock;
  o.criterion = "influence";
  o.amount = PruneAmount{1, true};
  EXPECT_NE(refusal(m, o).find("give"), std::string::npos)
      << refusal(m, o);  // influence needs data
  o.criterion = "l1";
  EXPECT_NE(refusal(m, o).find("unknown method 'l1' for depth"), std::string::npos)
      << refusal(m, o);
  o.criterion = "random";
  o.amount = PruneAmount{4, true};
  EXPECT_NE(refusal(m, o).find("residual blocks"), std::string::npos) << refusal(m, o);
  o.amount = PruneAmount{1, true};
  o.exclude = "blocks";
  EXPECT_NE(refusal(m, o).find("none of the model's 3 residual blocks"), std::string::npos)
      << refusal(m, o);
  // A model without residual blocks.
  ir::Model plain = test::two_layers(at::randn({4, 3}), at::randn({4, 2}), {0.0f, true, true});
  o.exclude.clear();
  EXPECT_NE(refusal(plain, o).find("no residual block"), std::string::npos) << refusal(plain, o);
  // Nothing was changed by any refusal.
  EXPECT_EQ(m.graph.nodes.size(), 12u);
}

TEST(Depth, BlockInfluenceIsOneMinusTheMeanCosine) {
  BlockInfluence bi;
  // Along axis 1: the rows [1, 0] vs [0, 1] (cos 0) and [1, 1] vs [2, 2] (cos 1).
  bi.add(at::tensor({1.0, 0.0, 1.0, 1.0}).view({2, 2}),
         at::tensor({0.0, 1.0, 2.0, 2.0}).view({2, 2}), 1);
  EXPECT_EQ(bi.vectors(), 2);
  EXPECT_NEAR(bi.value(), 0.5, 1e-12);
  // Along axis 0 of the same tensors: columns [1, 1] vs [0, 2] and [0, 1] vs [1, 2].
  BlockInfluence cols;
  cols.add(at::tensor({1.0, 0.0, 1.0, 1.0}).view({2, 2}),
           at::tensor({0.0, 1.0, 2.0, 2.0}).view({2, 2}), 0);
  const double c1 = 2 / (std::sqrt(2.0) * 2), c2 = 2 / std::sqrt(5.0);
  EXPECT_NEAR(cols.value(), 1 - (c1 + c2) / 2, 1e-12);
  BlockInfluence zero;
  zero.add(at::zeros({3, 4}), at::zeros({3, 4}), -1);
  EXPECT_NEAR(zero.value(), 0.0, 1e-12);
}

TEST(Depth, ChoosesTheLowestFreeUnitsTiesToTheFirst) {
  EXPECT_EQ(choose_depth_units({0.5, 0.1, 0.1, 0.0}, {"", "", "", "kept"}, {2, true}, "units"),
            (std::vector<size_t>{1, 2}));
  EXPECT_EQ(choose_depth_units({0.5, 0.1, 0.1, 0.0}, {"", "", "", ""}, {0.5, false}, "units"),
            (std::vector<size_t>{1, 3}));
  EXPECT_THROW(choose_depth_units({0.5}, {""}, {1.5, false}, "units"), Error);
}

}  // namespace
}  // namespace lopper

namespace lopper {
namespace {

// Sensitivity and targets mix blocks with channel groups: each block removed alone is one point of
// the sweep (amount 1), and a parameter target picks the quiet block whole (it costs next to no
// loss and saves its every weight), which the report lists as a unit; the file round-trips.
TEST(Depth, SensitivityAndTargetsMixBlocksWithChannelGroups) {
  test::TempDir tmp;
  ir::Model m = residual_mlp(1);
  // Labels the dense model gets right: any change that matters raises the loss.
  at::manual_seed(5);
  const at::Tensor x = at::randn({16, 8});
  save_npy(x, tmp / "x.npy");
  save_npy(run(m, x).argmax(1), tmp / "y.npy");
  LoaderOptions lo;
  lo.batch_size = 4;
  lo.shuffle = false;
  DataLoader data(open_dataset("npy:" + (tmp / "x.npy") + "," + (tmp / "y.npy")), lo);
  SensitivityOptions so;
  so.structured = so.blocks = true;
  so.amounts = {0.5, 0.9};
  so.eval_batches = 4;
  const SensitivityResult s = sensitivity(m, data, so);
  EXPECT_EQ(s.unit, "channel+block");
  std::vector<const LayerSensitivity*> blocks;
  for (const auto& l : s.layers)
    if (l.block >= 0) blocks.push_back(&l);
  ASSERT_EQ(blocks.size(), 3u);
  for (const auto* b : blocks) {
    ASSERT_EQ(b->points.size(), 1u);
    EXPECT_EQ(b->points[0].amount, 1.0);
    EXPECT_EQ(s.params - b->points[0].params, 16 * 8 + 16 + 16 * 8);
  }
  EXPECT_LT(std::abs(blocks[1]->points[0].loss - s.loss),
            std::abs(blocks[0]->points[0].loss - s.loss));
  const SensitivityResult back = parse_sensitivity(sensitivity_json(s), "s.json");
  EXPECT_EQ(back.unit, s.unit);
  EXPECT_EQ(back.layers.back().block, s.layers.back().block);

  TargetOptions t;
  t.kind = TargetKind::kParams;
  t.value = 0.7;
  t.structured = t.blocks = true;
  t.sensitivity = &s;
  ir::Model pruned = m;
  const TargetReport r = prune_to_target(pruned, t);
  EXPECT_LE(r.measured, r.target);
  bool quiet_removed = false;
  for (const auto& u : r.units)
    if (u.block == 1) quiet_removed = u.amount == 1.0;
  EXPECT_TRUE(quiet_removed);
  EXPECT_EQ(pruned.graph.find_initializer("blocks.1.fc1.weight"), nullptr);
  Executor ex(pruned);
  EXPECT_EQ(ex.run({{"x", at::randn({2, 8})}})[0].sizes().vec(), (std::vector<int64_t>{2, 8}));

  // Without sensitivity data a target cannot weigh a block against channels.
  TargetOptions blind = t;
  blind.sensitivity = nullptr;
  ir::Model copy = m;
  EXPECT_NE(test::error_of([&] { prune_to_target(copy, blind); }).find("give sensitivity data"),
            std::string::npos);
}

}  // namespace
}  // namespace lopper
