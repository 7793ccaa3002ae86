// Activation importance (src/prune/activations.h, Minitron): the scores equal the mean |activation|
// of each channel computed here with ATen from the same batches, a tensor read by two layers counts
// once, heads take the L2 norm of their features, and the channels removed are the lowest.
#include "prune/activations.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "lopper/analysis.h"
#include "lopper/data.h"
#include "lopper/error.h"
#include "lopper/npy.h"
#include "lopper/prune.h"
#include "lopper/structured.h"
#include "prune/depgraph.h"
#include "test_models.h"

namespace lopper {
namespace {

using test::init;
using test::node;

// x [2, 3, 8, 8] -> Conv "c1" (w1 [6, 3, 3, 3], b1, pads 1) -> Relu -> r; r -> Conv "c2" (w2
// [4, 6, 1, 1]) and Conv "c3" (w3) -> Add -> Relu -> GlobalAveragePool -> Flatten -> f -> Gemm "fc"
// (w4 [5, 4], transB) -> y [2, 5]. Groups: c1's 6 channels (read in r by c2 and c3), c2's and c3's
// 4 coupled by the Add (read in f by fc); y's 5 are the graph output's.
ir::Model cnn() {
  at::manual_seed(3);
  ir::Model m;
  m.ir_version = 8;
  m.opset_import = {{"", 17}};
  ir::Node c1 = node("Conv", {"x", "w1", "b1"}, {"h1"}, "c1");
  c1.attrs = {test::ints_attr("pads", {1, 1, 1, 1})};
  ir::Node fc = node("Gemm", {"f", "w4"}, {"y"}, "fc");
  fc.attrs = {test::int_attr("transB", 1)};
  m.graph.nodes = {c1,
                   node("Relu", {"h1"}, {"r"}, "relu1"),
                   node("Conv", {"r", "w2"}, {"a"}, "c2"),
                   node("Conv", {"r", "w3"}, {"b"}, "c3"),
                   node("Add", {"a", "b"}, {"s"}, "add"),
                   node("Relu", {"s"}, {"s2"}, "relu2"),
                   node("GlobalAveragePool", {"s2"}, {"g"}, "gap"),
                   node("Flatten", {"g"}, {"f"}, "flatten"),
                   fc};
  m.graph.inputs = {test::value_info("x", {2, 3, 8, 8})};
  m.graph.outputs = {test::value_info("y", {2, 5})};
  // Channels of different sizes, so that the ranking is clear.
  at::Tensor scale = at::linspace(0.2, 2.0, 6).view({6, 1, 1, 1});
  m.graph.initializers = {{"w1", at::randn({6, 3, 3, 3}) * scale},
                          {"b1", at::randn({6}) * 0.1},
                          {"w2", at::randn({4, 6, 1, 1})},
                          {"w3", at::randn({4, 6, 1, 1})},
                          {"w4", at::randn({5, 4})}};
  return m;
}

DataLoader loader(const std::string& spec, int64_t batch) {
  LoaderOptions lo;
  lo.batch_size = batch;
  lo.shuffle = false;
  return DataLoader(open_dataset(spec), lo);
}

// The indices of the k smallest values of v.
std::vector<int64_t> lowest(const at::Tensor& v, int64_t k) {
  std::vector<int64_t> i(size_t(v.numel()));
  std::iota(i.begin(), i.end(), 0);
  auto d = v.to(at::kDouble).contiguous();
  std::stable_sort(i.begin(), i.end(),
                   [&](int64_t a, int64_t b) { return d[a].item<double>() < d[b].item<double>(); });
  i.resize(size_t(k));
  std::sort(i.begin(), i.end());
  return i;
}

const ChannelGroupReport& group_of_size(const StructuredReport& r, int64_t size) {
  for (const auto& g : r.groups)
    if (g.size_before == size) return g;
  throw std::runtime_error("no group of " + std::to_string(size));
}

// The CNN's two groups: scores are the mean |x| of the tensor each is read from (over batch and
// spatial positions: r; over the batch: f after the pooling), computed here from the same six
// samples; r, read by c2 and c3, counts once; the lowest channels go.
TEST(Activations, ChannelScoresAreTheMeanMagnitudeOfWhatTheNextLayersRead) {
  test::TempDir tmp;
  at::manual_seed(5);
  const at::Tensor x = at::randn({6, 3, 8, 8});
  save_npy(x, tmp / "x.npy");
  save_npy(at::randint(0, 5, {6}, at::kLong), tmp / "y.npy");
  const std::string spec = "npy:" + (tmp / "x.npy") + "," + (tmp / "y.npy");
  const ir::Model m = cnn();

  const at::Tensor r = at::relu(at::conv2d(x, init(m, "w1"), init(m, "b1"), 1, 1));
  const at::Tensor s2 = at::relu(at::conv2d(r, init(m, "w2")) + at::conv2d(r, init(m, "w3")));
  const at::Tensor want_r = r.abs().mean({0, 2, 3}).to(at::kDouble);        // [6]
  const at::Tensor want_f = s2.mean({2, 3}).abs().mean(0).to(at::kDouble);  // [4]

  StructuredOptions so;
  so.criterion = "activation";
  so.amount = PruneAmount{0.5, false};
  DataLoader data = loader(spec, 2);
  CalibrationOptions co;
  co.batches = 3;
  const Saliency sal = structured_saliency(m, so, data, co);
  EXPECT_EQ(sal.batches, 3);
  EXPECT_EQ(sal.samples, 6);
  const auto& terms = sal.scores.at("activation");
  ASSERT_EQ(terms.size(), 2u);  // r once, though two layers read it; f
  EXPECT_TRUE(at::allclose(terms.at("r"), want_r, 1e-5, 1e-7)) << terms.at("r") << want_r;
  EXPECT_TRUE(at::allclose(terms.at("f"), want_f, 1e-5, 1e-7)) << terms.at("f") << want_f;

  ir::Model pruned = m;
  const StructuredReport rep = prune_structured(pruned, so, &sal);
  const ChannelGroupReport& g1 = group_of_size(rep, 6);
  const ChannelGroupReport& g2 = group_of_size(rep, 4);
  EXPECT_EQ(g1.removed, lowest(want_r, 3));
  EXPECT_EQ(g2.removed, lowest(want_f, 2));
  EXPECT_NEAR(g1.score, want_r.mean().item<double>(), 1e-6 * want_r.mean().item<double>());
  EXPECT_NEAR(g2.score, want_f.mean().item<double>(), 1e-6 * want_f.mean().item<double>());
  EXPECT_EQ(init(pruned, "w1").size(0), 3);
  EXPECT_EQ(init(pruned, "w4").size(1), 2);
  // Not what l1 removes here (the weights' norms rank otherwise), so the data decided.
  ir::Model by_l1 = m;
  StructuredOptions l1 = so;
  l1.criterion = "l1";
  const StructuredReport r1 = prune_structured(by_l1, l1);
  EXPECT_TRUE(group_of_size(r1, 6).removed != g1.removed ||
              group_of_size(r1, 4).removed != g2.removed);
}

// One site with classes of two features each: heads (l2) score the mean over rows of the L2 norm of
// their two features, channels the mean of |x| over them; each feature holds half its class's
// score.
TEST(Activations, HeadsTakeTheL2NormOfTheirFeatures) {
  test::TempDir tmp;
  at::manual_seed(7);
  const at::Tensor x = at::randn({5, 16});
  save_npy(x, tmp / "x.npy");
  save_npy(at::zeros({5}, at::kLong), tmp / "y.npy");
  const std::string spec = "npy:" + (tmp / "x.npy") + "," + (tmp / "y.npy");
  const at::Tensor w1 = at::randn({8, 16}), w2 = at::randn({8, 4});
  const ir::Model m = test::two_layers(w1, w2, {.bias = 0.5f, .relu = true, .graph_io = true});
  const at::Tensor r = at::relu(x.matmul(w1.t()) + 0.5).to(at::kDouble);  // fc2's input [5, 8]

  // The model's own site: fc2's input r, eight channels.
  depgraph::DepGraph dg = depgraph::build(m, node_shapes(m, resolve_input_shapes(m, {}, 1)), false);
  const std::vector<ActivationSite> own = activation_sites(m.graph, dg);
  ASSERT_EQ(own.size(), 1u);
  EXPECT_EQ(own[0].value, "r");
  EXPECT_EQ(own[0].reader, "y");
  EXPECT_EQ(own[0].parts, 8);

  ActivationSite pairs;
  pairs.value = "r", pairs.reader = "y", pairs.axis = -1;
  pairs.part = {0, 0, 1, 1, 2, 2, 3, 3}, pairs.parts = 4;
  const at::Tensor paired = r.view({5, 4, 2});
  const at::Tensor want_l2 = paired.square().sum(2).sqrt().mean(0);  // [4]
  const at::Tensor want_mean = paired.abs().mean(2).mean(0);
  for (bool l2 : {true, false}) {
    SCOPED_TRACE(l2 ? "l2" : "mean");
    DataLoader data = loader(spec, 1);
    CalibrationOptions co;
    co.batches = 5;
    const Saliency s = collect_activations(m, {pairs}, l2, data, co, "activation");
    const at::Tensor got = s.scores.at("activation").at("r");
    const at::Tensor want = (l2 ? want_l2 : want_mean).repeat_interleave(2) / 2;
    EXPECT_TRUE(at::allclose(got, want, 1e-5, 1e-7)) << got << want;
  }
}

// A depthwise convolution reads its input with its weight too: x [2, 3, 8, 8] -> Conv "c1" (6) ->
// Relu -> r -> Conv "dw" (group 6) -> Relu -> d -> Conv "c2" (4) -> GlobalAveragePool -> Flatten
// -> y [2, 4]. c1's channels are read in r (by dw) and in d (by c2): their score is the sum of the
// two means.
TEST(Activations, DepthwiseConvolutionsReadTheirInputToo) {
  test::TempDir tmp;
  at::manual_seed(11);
  ir::Model m;
  m.ir_version = 8;
  m.opset_import = {{"", 17}};
  ir::Node dw = node("Conv", {"r", "wd"}, {"e"}, "dw");
  dw.attrs = {test::int_attr("group", 6), test::ints_attr("pads", {1, 1, 1, 1})};
  m.graph.nodes = {node("Conv", {"x", "w1"}, {"h"}, "c1"),
                   node("Relu", {"h"}, {"r"}, "relu1"),
                   dw,
                   node("Relu", {"e"}, {"d"}, "relu2"),
                   node("Conv", {"d", "w2"}, {"c"}, "c2"),
                   node("GlobalAveragePool", {"c"}, {"g"}, "gap"),
                   node("Flatten", {"g"}, {"y"}, "flatten")};
  m.graph.inputs = {test::value_info("x", {2, 3, 8, 8})};
  m.graph.outputs = {test::value_info("y", {2, 4})};
  m.graph.initializers = {{"w1", at::randn({6, 3, 1, 1})},
                          {"wd", at::randn({6, 1, 3, 3})},
                          {"w2", at::randn({4, 6, 1, 1})}};
  const at::Tensor x = at::randn({4, 3, 8, 8});
  save_npy(x, tmp / "x.npy");
  save_npy(at::randint(0, 4, {4}, at::kLong), tmp / "y.npy");
  const at::Tensor r = at::relu(at::conv2d(x, init(m, "w1")));
  const at::Tensor d = at::relu(at::conv2d(r, init(m, "wd"), {}, 1, 1, 1, 6));
  const at::Tensor want_r = r.abs().mean({0, 2, 3}).to(at::kDouble);
  const at::Tensor want_d = d.abs().mean({0, 2, 3}).to(at::kDouble);

  depgraph::DepGraph dg = depgraph::build(m, node_shapes(m, resolve_input_shapes(m, {}, 1)), false);
  const std::vector<ActivationSite> sites = activation_sites(m.graph, dg);
  ASSERT_EQ(sites.size(), 2u);
  EXPECT_EQ(sites[0].value, "r");
  EXPECT_EQ(sites[0].reader, "e");
  EXPECT_EQ(sites[1].value, "d");
  for (const auto& s : sites) EXPECT_EQ(s.parts, 6);

  StructuredOptions so;
  so.criterion = "activation";
  so.amount = PruneAmount{2, true};
  DataLoader data = loader("npy:" + (tmp / "x.npy") + "," + (tmp / "y.npy"), 2);
  CalibrationOptions co;
  co.batches = 2;
  const Saliency sal = structured_saliency(m, so, data, co);
  EXPECT_TRUE(at::allclose(sal.scores.at("activation").at("r"), want_r, 1e-5, 1e-7));
  EXPECT_TRUE(at::allclose(sal.scores.at("activation").at("d"), want_d, 1e-5, 1e-7));
  ir::Model pruned = m;
  const StructuredReport rep = prune_structured(pruned, so, &sal);
  const ChannelGroupReport& g = group_of_size(rep, 6);
  EXPECT_EQ(g.removed, lowest(want_r + want_d, 2));
  EXPECT_EQ(init(pruned, "wd").size(0), 4);
}

// What cannot be ranked by activation is one error, and the model is untouched.
TEST(Activations, Refusals) {
  test::TempDir tmp;
  const std::string spec = test::random_npy_data(tmp, 4, 0);
  ir::Model m = cnn();
  StructuredOptions so;
  so.amount = PruneAmount{0.5, false};
  DataLoader data = loader(spec, 2);
  CalibrationOptions co;
  // l1 needs no data
  EXPECT_THROW(structured_saliency(m, so, data, co), Error);
  so.criterion = "activation";
  co.batches = 0;
  EXPECT_THROW(structured_saliency(m, so, data, co), Error);
  // No Saliency: the criterion needs data.
  try {
    prune_structured(m, so);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("activation needs calibration data"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(init(m, "w1").size(0), 6);
  // Scores of another model (fewer channels than the tensor has): named.
  Saliency wrong;
  wrong.scores["activation"]["r"] = at::ones({5}, at::kDouble);
  EXPECT_THROW(prune_structured(m, so, &wrong), Error);
  EXPECT_EQ(init(m, "w1").size(0), 6);
}

}  // namespace
}  // namespace lopper
