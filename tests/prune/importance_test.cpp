// The criteria table (src/prune/importance.h): its lookups and messages, LAMP's scores, the
// gradient statistics, and every entry run end to end through prune() and prune_structured(), so
// that a new entry is exercised by these tests the day it is added.
#include "prune/importance.h"

#include <gtest/gtest.h>

#include "lopper/data.h"
#include "lopper/error.h"
#include "lopper/npy.h"
#include "lopper/prune.h"
#include "lopper/structured.h"
#include "test_models.h"

namespace lopper {
namespace {

using importance::Use;
using test::init;

// x [1, 16] -> Gemm(w1 [8, 16], transB) -> Relu -> MatMul(w2 [8, 4]) -> y: one channel group of 8
// (w1's rows, b1, w2's rows); y's 4 are a graph output's and stay.
ir::Model mlp(at::Tensor w1, at::Tensor w2) {
  return test::two_layers(w1, w2, {.bias = 0.5f, .relu = true, .graph_io = true});
}

TEST(Importance, LookupsAndMessages) {
  EXPECT_EQ(importance::names(Use::kWeights),
            "abs, l1, lamp, random, grad, taylor, wanda, sparsegpt");
  EXPECT_EQ(importance::names(Use::kChannels), "l1, l2, bn, fpgm, random, taylor, activation");
  EXPECT_EQ(
      importance::names(
          Use::kWeights, [](const importance::Criterion& c) { return c.needs_data(); }, " and "),
      "grad, taylor, wanda and sparsegpt");
  EXPECT_STREQ(importance::find("taylor", Use::kChannels).name, "taylor");
  try {
    importance::find("grad", Use::kChannels);  // grad ranks single weights only
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "[prune] unknown structured method 'grad' (methods: l1, l2, bn, fpgm, random, "
                 "taylor, activation)");
  }
  EXPECT_THROW(importance::find("l2", Use::kWeights), Error);
  EXPECT_THROW(importance::find("", Use::kWeights), Error);
  // Every entry is whole: a name, a summary, and a way to rank what it says it ranks.
  for (const auto& c : importance::criteria()) {
    SCOPED_TRACE(c.name);
    EXPECT_TRUE(c.ranks_weights() || c.ranks_channels());
    EXPECT_GT(std::string(c.summary).size(), 10u);
    EXPECT_EQ(c.weights == importance::WeightRank::kScores, c.weight_scores != nullptr);
    EXPECT_EQ(c.slices == importance::SliceRank::kCustom, c.slice_scores != nullptr);
    EXPECT_EQ(c.needs == importance::Needs::kGradients, c.gradient_term != nullptr);
  }
}

// LAMP: w^2 / (sum of the squares not smaller), zeros score 0; a layer's largest weight scores 1.
TEST(Importance, LampScores) {
  const auto& lamp = importance::find("lamp", Use::kWeights);
  at::Tensor w = at::tensor({0.f, -1.f, 2.f, 3.f}).reshape({2, 2});
  static const std::vector<int64_t> no_perm;
  at::Tensor s = importance::weight_scores({lamp, w, "w", no_perm, nullptr});
  ASSERT_EQ(s.sizes(), w.sizes());
  EXPECT_FLOAT_EQ(s[0][0].item<float>(), 0.f);
  EXPECT_FLOAT_EQ(s[0][1].item<float>(), 1.f / 14.f);
  EXPECT_FLOAT_EQ(s[1][0].item<float>(), 4.f / 13.f);
  EXPECT_FLOAT_EQ(s[1][1].item<float>(), 1.f);
}

// Global LAMP keeps every layer alive where global l1 empties the layer of small weights.
TEST(Importance, GlobalLampKeepsEachLayer) {
  at::manual_seed(0);
  ir::Model m = mlp(at::randn({8, 16}) * 1e-3, at::randn({8, 4}));
  PruneOptions o;
  o.scope = PruneScope::kGlobal;
  o.amount = PruneAmount{0.85, false};  // 136 of 160: more than w1's 128
  ir::Model by_l1 = m, by_lamp = m;
  by_l1.graph.find_initializer("w1")->value = init(m, "w1").clone();
  by_lamp.graph.find_initializer("w1")->value = init(m, "w1").clone();
  by_lamp.graph.find_initializer("w2")->value = init(m, "w2").clone();
  prune(by_l1, o);
  EXPECT_EQ(init(by_l1, "w1").count_nonzero().item<int64_t>(), 0);
  o.criterion = "lamp";
  PruneReport r = prune(by_lamp, o);
  EXPECT_EQ(r.nonzero_after, 160 - 136);
  EXPECT_GT(init(by_lamp, "w1").count_nonzero().item<int64_t>(), 0);
  EXPECT_GT(init(by_lamp, "w2").count_nonzero().item<int64_t>(), 0);
  EXPECT_EQ(r.layers[0].method, "lamp global");
}

// grad: the mean of |g| over the batches; taylor: the sum of |w * g|; only the named one when
// asked.
TEST(Importance, GradientStats) {
  importance::GradientStats all;
  at::Tensor w = at::tensor({1.f, -2.f});
  all.add("w", w, at::tensor({3.f, 1.f}));
  all.end_batch();
  all.add("w", w, at::tensor({-1.f, 1.f}));
  all.end_batch();
  Saliency s;
  all.fill(s);
  EXPECT_EQ(s.batches, 2);
  EXPECT_TRUE(at::equal(s.scores.at("grad").at("w"), at::tensor({2.f, 1.f})));
  EXPECT_TRUE(at::equal(s.scores.at("taylor").at("w"), at::tensor({4.f, 4.f})));

  importance::GradientStats one("taylor");
  one.track("v", w);  // never reached by the loss: zero scores
  Saliency t;
  one.fill(t);
  EXPECT_EQ(t.scores.size(), 1u);
  EXPECT_TRUE(at::equal(t.scores.at("taylor").at("v"), at::zeros({2})));
}

// Every criterion of the table prunes a model end to end: single weights (local and, where it
// ranks, global) and channels, with gradient scores given where the criterion needs them.
TEST(Importance, EveryCriterionPrunes) {
  at::manual_seed(1);
  const at::Tensor w1 = at::randn({8, 16}), w2 = at::randn({8, 4});
  Saliency sal;
  for (const auto& c : importance::criteria())
    if (c.needs == importance::Needs::kGradients) {
      sal.scores[c.name]["w1"] = at::rand({8, 16});
      sal.scores[c.name]["w2"] = at::rand({8, 4});
    }
  // The layers' inputs, for the criteria that read them (the model's input is [1, 16]).
  test::TempDir tmp;
  save_npy(at::randn({4, 16}), tmp / "x.npy");
  save_npy(at::zeros({4}, at::kLong), tmp / "y.npy");
  LoaderOptions lo;
  lo.batch_size = 1;
  lo.shuffle = false;
  for (const auto& c : importance::criteria()) {
    SCOPED_TRACE(c.name);
    if (c.needs == importance::Needs::kActivations && c.ranks_weights()) {
      ir::Model m = mlp(w1.clone(), w2.clone());
      PruneOptions o;
      o.criterion = c.name;
      o.amount = PruneAmount{0.5, false};
      DataLoader data(open_dataset("npy:" + (tmp / "x.npy") + "," + (tmp / "y.npy")), lo);
      CalibrationOptions co;
      co.batches = 4;
      const PruneReport r = prune_calibrated(m, o, data, co);
      EXPECT_EQ(r.nonzero_after, 80);  // half of each layer
      EXPECT_EQ(init(m, "w1").count_nonzero().item<int64_t>(), 64);
      EXPECT_EQ(init(m, "w2").count_nonzero().item<int64_t>(), 16);
      ir::Model u = mlp(w1.clone(), w2.clone());
      EXPECT_THROW(prune(u, o), Error);  // without its data: one error, the model untouched
      EXPECT_TRUE(at::equal(init(u, "w1"), w1));
      o.scope = PruneScope::kGlobal;  // compared within layers: no global ranking
      EXPECT_THROW(prune_calibrated(u, o, data, co), Error);
      continue;
    }
    const Saliency* s = c.needs_data() ? &sal : nullptr;
    if (c.ranks_weights()) {
      ir::Model m = mlp(w1.clone(), w2.clone());
      PruneOptions o;
      o.criterion = c.name;
      if (c.weights == importance::WeightRank::kThreshold)
        o.threshold = 0.5;
      else
        o.amount = PruneAmount{0.5, false};
      PruneReport r = prune(m, o, s);
      EXPECT_LT(r.nonzero_after, r.nonzero_before);
      if (c.weights != importance::WeightRank::kThreshold) {
        EXPECT_EQ(init(m, "w1").count_nonzero().item<int64_t>(), 64);  // half of each layer
        EXPECT_EQ(init(m, "w2").count_nonzero().item<int64_t>(), 16);
        ir::Model g = mlp(w1.clone(), w2.clone());
        o.scope = PruneScope::kGlobal;
        EXPECT_EQ(prune(g, o, s).nonzero_after, 80);  // half of all
      }
      if (c.needs_data()) {  // without its data: one error, the model untouched
        ir::Model u = mlp(w1.clone(), w2.clone());
        EXPECT_THROW(prune(u, o), Error);
        EXPECT_TRUE(at::equal(init(u, "w1"), w1));
      }
    }
    if (c.ranks_channels()) {
      ir::Model m = mlp(w1.clone(), w2.clone());
      StructuredOptions so;
      so.criterion = c.name;
      so.amount = PruneAmount{0.5, false};
      Saliency calibrated;  // the criteria that read activations: from the data
      if (c.needs == importance::Needs::kActivations) {
        DataLoader data(open_dataset("npy:" + (tmp / "x.npy") + "," + (tmp / "y.npy")), lo);
        CalibrationOptions co;
        co.batches = 4;
        calibrated = structured_saliency(m, so, data, co);
        EXPECT_EQ(calibrated.batches, 4);
        s = &calibrated;
      }
      if (c.needs_data()) {  // without its data: one error, the model untouched
        ir::Model u = mlp(w1.clone(), w2.clone());
        EXPECT_THROW(prune_structured(u, so), Error);
        EXPECT_TRUE(at::equal(init(u, "w1"), w1));
      }
      if (c.unscored && c.needs != importance::Needs::kActivations) {
        // e.g. bn: this model has no normalisation to rank by
        EXPECT_THROW(prune_structured(m, so, s), Error);
        continue;
      }
      StructuredReport r = prune_structured(m, so, s);
      EXPECT_EQ(r.channels_before, 8);
      EXPECT_EQ(r.channels_after, 4);
      EXPECT_EQ(init(m, "w1").sizes(), (std::vector<int64_t>{4, 16}));
      EXPECT_EQ(init(m, "w2").sizes(), (std::vector<int64_t>{4, 4}));
    }
  }
}

// l1 and l2 rank channels by the norms of all their weights: rows of w1 and rows of w2.
TEST(Importance, ChannelNormsCoverTheWholeGroup) {
  at::Tensor w1 = at::ones({4, 2}), w2 = at::ones({4, 3});
  w1[0].fill_(0.1f);  // channel 0 small in w1 ...
  w2[0].fill_(10.f);  // ... but large in the next layer: it stays
  w1[1].fill_(0.5f);
  ir::Model m = mlp(w1, w2);
  StructuredOptions so;
  so.amount = PruneAmount{1, true};
  StructuredReport r = prune_structured(m, so);
  ASSERT_EQ(r.channels_before, 4);
  for (const auto& g : r.groups)
    if (g.blocked.empty()) EXPECT_EQ(g.removed, (std::vector<int64_t>{1}));
  so.criterion = "l2";
  ir::Model m2 = mlp(w1, w2);
  for (const auto& g : prune_structured(m2, so).groups)
    if (g.blocked.empty()) EXPECT_EQ(g.removed, (std::vector<int64_t>{1}));
}

}  // namespace
}  // namespace lopper
