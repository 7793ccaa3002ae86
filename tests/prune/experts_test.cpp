// Whole-expert pruning's library half (lopper/experts.h): the request's rules, the counts as
// llm-compressor's REAP drops them, the statistics against sums written out here, the choice and
// its ties, the per-layer sequence and the report. The model side runs in
// python/tests/test_experts.py, and tests/python/check_expert_parity.py against llm-compressor.
#include "lopper/experts.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "lopper/error.h"

namespace lopper {
namespace {

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

PruneAmount fraction(double v) { return PruneAmount{v, false}; }
PruneAmount count(int64_t v) { return PruneAmount{double(v), true}; }

TEST(Experts, RequestRules) {
  ExpertRequest r;
  r.amount = fraction(0.25);
  r.data = true;
  EXPECT_EQ(r.validate().criterion, "reap");  // the default
  r.criterion = "l1";
  EXPECT_EQ(error_of([&] { r.validate(); }),
            "[prune] criterion 'l1' does not rank experts (unit 'expert' takes reap, frequency, "
            "activation, random)");
  r.criterion = "frequency";
  r.data = false;
  EXPECT_NE(error_of([&] { r.validate(); }).find("give data"), std::string::npos);
  r.criterion = "random";
  r.data = true;
  EXPECT_EQ(error_of([&] { r.validate(); }), "[prune] criterion random reads no data: drop data");
  r.data = false;
  r.seed = 7;
  EXPECT_EQ(r.validate().seed, 7u);
  r.criterion = "activation";
  r.data = true;
  EXPECT_EQ(error_of([&] { r.validate(); }),
            "[prune] seed is for criterion random, not activation");
  r.seed.reset();
  r.amount.reset();
  EXPECT_NE(error_of([&] { r.validate(); }).find("needs amount"), std::string::npos);
  r.amount = fraction(1.5);
  EXPECT_EQ(error_of([&] { r.validate(); }), "[prune] amount must be in [0, 1], got 1.5");
  r.amount = fraction(0.5);
  r.channel_options = {"round_to"};
  EXPECT_EQ(error_of([&] { r.validate(); }),
            "[prune] round_to is for channels and heads, not unit 'expert'");
}

TEST(Experts, DropCountsTruncateAsLlmCompressorAndKeepTopK) {
  ExpertLayer l{"moe", 100, 2, 10};
  // int(100 * 0.29) is 28 in double arithmetic (28.999999999999996), as Python's int() gives.
  EXPECT_EQ(experts_to_drop(fraction(0.29), l), 28);
  EXPECT_EQ(experts_to_drop(fraction(0.5), l), 50);
  EXPECT_EQ(experts_to_drop(count(98), l), 98);
  EXPECT_EQ(experts_to_drop(fraction(0.0), l), 0);
  ExpertLayer small{"model.layers.0.mlp", 8, 2, 10};
  EXPECT_EQ(experts_to_drop(fraction(0.75), small), 6);  // 2 left: top-2 still has its 2
  EXPECT_EQ(error_of([&] { experts_to_drop(fraction(0.9), small); }),
            "[prune] amount 0.9 leaves MoE layer 'model.layers.0.mlp' 1 of its 8 experts, fewer "
            "than the 2 its router picks for each token (top-k)");
  EXPECT_EQ(error_of([&] { experts_to_drop(count(9), small); }),
            "[prune] amount 9 is more than the 8 experts of MoE layer 'model.layers.0.mlp'");
  // Refused up front, before any batch.
  ExpertOptions o;
  o.amount = count(7);
  EXPECT_NE(error_of([&] { ExpertPruning(o, {small}); }).find("fewer than the 2"),
            std::string::npos);
  EXPECT_NE(error_of([&] { ExpertPruning(o, {}); }).find("no mixture-of-experts layer"),
            std::string::npos);
}

TEST(Experts, StatisticsAreTheSumsOverRoutedTokens) {
  // 3 tokens, top-2 of 4 experts.
  const at::Tensor idx = at::tensor({0, 2, 2, 1, 0, 2}, at::kLong).view({3, 2});
  const at::Tensor w = at::tensor({0.75f, 0.25f, 0.5f, 0.5f, 0.6f, 0.4f}).view({3, 2});
  const at::Tensor n = at::tensor({2.f, 4.f, 1.f, 3.f, 5.f, 8.f}).view({3, 2});
  ExpertStats s(4);
  s.add(idx, w, n);
  EXPECT_EQ(s.tokens(), (std::vector<double>{2, 1, 3, 0}));
  const std::vector<double> reap = s.scores("reap");
  EXPECT_NEAR(reap[0], (0.75 * 2 + 0.6 * 5) / 2, 1e-7);  // the weights are floats
  EXPECT_DOUBLE_EQ(reap[1], 0.5 * 3);
  EXPECT_NEAR(reap[2], (0.25 * 4 + 0.5 * 1 + 0.4 * 8) / 3, 1e-7);
  EXPECT_EQ(reap[3], 0);  // no token: 0, as llm-compressor's sum / max(count, 1)
  const std::vector<double> act = s.scores("activation");
  EXPECT_DOUBLE_EQ(act[0], 3.5);
  EXPECT_DOUBLE_EQ(act[2], 13.0 / 3);
  EXPECT_EQ(s.scores("frequency"), (std::vector<double>{2, 1, 3, 0}));
  // A second batch adds up.
  s.add(idx.narrow(0, 0, 1), w.narrow(0, 0, 1), n.narrow(0, 0, 1));
  EXPECT_EQ(s.tokens(), (std::vector<double>{3, 1, 4, 0}));

  EXPECT_NE(error_of([&] { s.add(idx + 2, w, n); }).find("chose expert 4, out of range for 4"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              s.add(idx, w.view({6, 1}), n);
            }).find("routing weights"),
            std::string::npos);
  EXPECT_NE(error_of([&] { s.add(w, w, n); }).find("integer tensor"), std::string::npos);
  EXPECT_EQ(s.tokens(), (std::vector<double>{3, 1, 4, 0}));  // refused batches added nothing
}

TEST(Experts, ChoiceDropsTheLowestAndBreaksTiesByIndex) {
  const ExpertChoice c = choose_experts({0.5, 0.1, 0.9, 0.1, 0.3}, 2);
  EXPECT_EQ(c.removed, (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(c.kept, (std::vector<int64_t>{0, 2, 4}));
  EXPECT_EQ(choose_experts({1, 1, 1, 1}, 1).removed, (std::vector<int64_t>{0}));
  EXPECT_EQ(choose_experts({1, NAN, 0, 2}, 1).removed, (std::vector<int64_t>{1}));
  EXPECT_TRUE(choose_experts({1, 2}, 0).removed.empty());
}

TEST(Experts, LayerByLayerAndTheReport) {
  ExpertOptions o;
  o.criterion = "frequency";
  o.amount = fraction(0.5);
  ExpertPruning p(o, {{"a", 4, 1, 10}, {"b", 4, 2, 20}});
  EXPECT_EQ(p.drop(p.index("b")), 2);
  p.observe(0, at::tensor({3, 3, 1, 0}, at::kLong).view({4, 1}), at::ones({4, 1}), {});
  const ExpertChoice c = p.choose(0);
  EXPECT_EQ(c.removed, (std::vector<int64_t>{0, 2}));  // 2 had none, 0 and 1 one each: 0 first
  EXPECT_NE(error_of([&] {
              p.observe(0, at::zeros({1, 1}, at::kLong), at::ones({1, 1}), {});
            }).find("has chosen its experts already"),
            std::string::npos);
  EXPECT_NE(error_of([&] { p.index("c"); }).find("no MoE layer 'c'"), std::string::npos);
  ExpertReport r = p.report();  // layer b not chosen yet: not in it
  ASSERT_EQ(r.structured.groups.size(), 1u);
  EXPECT_EQ(r.structured.groups[0].kind, "expert");
  EXPECT_EQ(r.structured.warnings.size(), 1u);  // expert 2 saw no token
  p.observe(1, at::tensor({0, 1, 2, 3}, at::kLong).view({2, 2}), at::ones({2, 2}), {});
  p.choose(1);
  r = p.report();
  r.params_before = 1000, r.params_after = 900;
  ASSERT_EQ(r.structured.groups.size(), 2u);
  EXPECT_EQ(r.structured.channels_before, 8);
  EXPECT_EQ(r.structured.channels_after, 4);
  const nlohmann::json j = to_json(r);
  EXPECT_EQ(j["experts"], 4);
  EXPECT_EQ(j["groups"][0]["tokens"], (std::vector<double>{1, 1, 0, 2}));
  EXPECT_FALSE(j.contains("channels"));
  const std::string t = to_table(r);
  EXPECT_NE(t.find("experts               4  (was 8, -50.0%)"), std::string::npos) << t;

  // random: from the seed and the layer alone, the same whatever the other layers do.
  o.criterion = "random";
  o.seed = 5;
  ExpertPruning q1(o, {{"a", 16, 1, 1}, {"b", 16, 1, 1}}), q2(o, {{"b", 16, 1, 1}});
  EXPECT_EQ(q1.choose(1).removed,
            ExpertPruning(o, {{"a", 16, 1, 1}, {"b", 16, 1, 1}}).choose(1).removed);
  EXPECT_NE(q1.choose(0).removed, q1.choose(1).removed);
  EXPECT_EQ(q1.choose(0).removed, q2.choose(0).removed);
}

}  // namespace
}  // namespace lopper
