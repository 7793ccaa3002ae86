// Pruning masks and prune() on small tensors and hand-built models: counts, cumulative behaviour,
// N:M layout, rows/columns, ties, and the errors of bad options.
#include "lopper/prune.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "lopper/error.h"
#include "prune/masks.h"
#include "test_models.h"

using namespace lopper;
using test::error_of;
using test::init;
using test::two_layers;

namespace {

PruneAmount frac(double v) { return PruneAmount{v, false}; }
PruneAmount count(int64_t v) { return PruneAmount{double(v), true}; }

// at::tensor has no bool overload: 0/1 -> a bool tensor.
at::Tensor bools(std::vector<int64_t> v) { return at::tensor(v).to(at::kBool); }

int64_t nnz(const at::Tensor& t) { return t.count_nonzero().item<int64_t>(); }

}  // namespace

TEST(PruneAmount, ParseAndCount) {
  EXPECT_TRUE(PruneAmount::parse("40").is_count);
  EXPECT_FALSE(PruneAmount::parse("0.4").is_count);
  EXPECT_FALSE(PruneAmount::parse("1.0").is_count);  // torch: 1.0 is all, 1 is one weight
  EXPECT_EQ(PruneAmount::parse("1.0").count_of(10), 10);
  EXPECT_EQ(PruneAmount::parse("1").count_of(10), 1);
  // Python's round: half to even.
  EXPECT_EQ(frac(0.5).count_of(5), 2);
  EXPECT_EQ(frac(0.5).count_of(7), 4);
  EXPECT_EQ(frac(0.25).count_of(10), 2);
  EXPECT_THROW(PruneAmount::parse("1.5"), Error);
  EXPECT_THROW(PruneAmount::parse("-0.1"), Error);
  EXPECT_THROW(PruneAmount::parse("-3"), Error);
  EXPECT_THROW(PruneAmount::parse("half"), Error);
  EXPECT_THROW(count(11).count_of(10), Error);
}

TEST(PruneMask, L1RemovesTheSmallestAndCountsFromWhatIsLeft) {
  at::Tensor w = at::tensor({0.5f, -0.1f, 0.0f, 0.3f, -0.7f, 0.2f});
  at::Tensor keep = l1_mask(w, frac(0.4));  // 5 alive -> round(2.0) = 2 go: -0.1 and 0.2
  EXPECT_TRUE(at::equal(keep, bools({1, 0, 0, 1, 1, 0})));
  // A count: 1 more goes from the 5 alive, the zero stays pruned.
  keep = l1_mask(w, count(1));
  EXPECT_TRUE(at::equal(keep, bools({1, 0, 0, 1, 1, 1})));
  EXPECT_THROW(l1_mask(w, count(6)), Error);  // only 5 are left
  EXPECT_EQ(l1_mask(w, frac(1.0)).sum().item<int64_t>(), 0);
  EXPECT_EQ(l1_mask(w, frac(0.0)).sum().item<int64_t>(), 5);
}

TEST(PruneMask, TiesFollowTorchTopk) {
  // Eight equal weights, three go: whichever at::topk(largest=False) picks, which is what
  // torch.nn.utils.prune picks on the same values.
  at::Tensor w = at::full({8}, 0.25f);
  at::Tensor keep = l1_mask(w, count(3));
  at::Tensor idx = std::get<1>(at::topk(w.abs(), 3, 0, false, true));
  at::Tensor want = at::ones({8}, at::kBool).index_fill_(0, idx, false);
  EXPECT_TRUE(at::equal(keep, want));
}

TEST(PruneMask, GlobalSelectionMatchesASortAcrossTensors) {
  at::manual_seed(0);
  std::vector<at::Tensor> ws = {at::randn({37, 11}), at::randn({5, 3, 3, 3}), at::randn({64})};
  std::vector<at::Tensor> scores, alive;
  for (auto& w : ws) {
    w.masked_fill_(w.abs() < 0.1, 0);  // some already pruned
    scores.push_back(w.abs());
    alive.push_back(w.ne(0));
  }
  at::Tensor all = at::cat({scores[0].flatten().masked_select(alive[0].flatten()),
                            scores[1].flatten().masked_select(alive[1].flatten()),
                            scores[2].flatten().masked_select(alive[2].flatten())});
  int64_t k = all.numel() / 3;
  double t = std::get<0>(all.sort()).index({k - 1}).item<double>();
  auto removed = smallest_k(scores, alive, k);
  int64_t total = 0;
  for (size_t i = 0; i < ws.size(); ++i) {
    EXPECT_TRUE(at::equal(removed[i], scores[i].le(t) & alive[i]));
    total += removed[i].sum().item<int64_t>();
  }
  EXPECT_EQ(total, k);
}

TEST(PruneMask, NMKeepsNOfEveryMAlongTheLastDim) {
  at::Tensor w = at::tensor({1.f, -4.f, 3.f, 2.f, 0.5f, 0.1f, -0.2f, 0.3f}).reshape({1, 8});
  at::Tensor keep = nm_mask(w, 2, 4);
  EXPECT_TRUE(at::equal(keep, bools({0, 1, 1, 0, 1, 0, 0, 1}).reshape({1, 8})));
  at::manual_seed(1);
  at::Tensor big = at::randn({16, 64});
  at::Tensor k = nm_mask(big, 2, 4).reshape({16, 16, 4}).sum(-1);
  EXPECT_TRUE(k.eq(2).all().item<bool>());
  EXPECT_THROW(nm_mask(at::randn({4, 6}), 2, 4), Error);
  EXPECT_THROW(nm_mask(big, 4, 4), Error);
}

TEST(PruneMask, RowsAndColumnsByNorm) {
  at::Tensor w = at::tensor({1.f, 1.f, 1.f, 0.1f, 0.1f, 0.1f, 3.f, 0.f, 0.f}).reshape({3, 3});
  // Rows: L1 norms 3, 0.3, 3 -> the middle goes.
  at::Tensor keep = channel_mask(w, 0, count(1), 1, nullptr);
  EXPECT_TRUE(at::equal(keep.any(1), bools({1, 0, 1})));
  // L2 norms 1.73, 0.17, 3: same; two rows go -> only the last stays.
  keep = channel_mask(w, 0, count(2), 2, nullptr);
  EXPECT_TRUE(at::equal(keep.any(1), bools({0, 0, 1})));
  // Columns: L1 4.1, 1.1, 1.1 -> a 0.34 fraction of 3 = 1 column goes (one of the tied two).
  keep = channel_mask(w, 1, frac(0.34), 1, nullptr);
  EXPECT_EQ(keep.any(0).sum().item<int64_t>(), 2);
  EXPECT_TRUE(keep.any(0)[0].item<bool>());
  // Cumulative: a zero row no longer counts; 50% of the two rows left = 1 more.
  at::Tensor w2 = w.clone();
  w2[1].zero_();
  keep = channel_mask(w2, 0, frac(0.5), 1, nullptr);
  EXPECT_EQ(keep.any(1).sum().item<int64_t>(), 1);
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(3);
  keep = channel_mask(w, 0, count(1), 0, &gen);  // random_structured
  EXPECT_EQ(keep.any(1).sum().item<int64_t>(), 2);
}

TEST(PruneModel, LocalL1PrunesEachWeightNeverTheBias) {
  at::manual_seed(2);
  ir::Model m = two_layers(at::randn({8, 16}), at::randn({8, 4}));
  PruneOptions o;
  o.amount = frac(0.5);
  PruneReport r = prune(m, o);
  ASSERT_EQ(r.layers.size(), 2u);
  EXPECT_EQ(r.layers[0].name, "fc1");
  EXPECT_EQ(r.layers[0].nonzero_after, 64);
  EXPECT_EQ(r.layers[1].nonzero_after, 16);
  EXPECT_EQ(nnz(init(m, "w1")), 64);
  EXPECT_EQ(nnz(init(m, "b1")), 8);
  EXPECT_EQ(r.params, 160);
  EXPECT_EQ(r.nonzero_after, 80);
  EXPECT_DOUBLE_EQ(r.layers[0].sparsity(), 0.5);
  // Again: half of what is left.
  r = prune(m, o);
  EXPECT_EQ(r.layers[0].nonzero_before, 64);
  EXPECT_EQ(r.layers[0].nonzero_after, 32);
}

TEST(PruneModel, GlobalRanksAllWeightsTogether) {
  // fc1's weights are all small, fc2's all large: a global 50% takes fc1 first.
  ir::Model m = two_layers(at::full({4, 4}, 0.01f), at::full({4, 4}, 1.0f));
  PruneOptions o;
  o.scope = PruneScope::kGlobal;
  o.amount = frac(0.5);
  PruneReport r = prune(m, o);
  EXPECT_EQ(r.layers[0].nonzero_after, 0);
  EXPECT_EQ(r.layers[1].nonzero_after, 16);
}

TEST(PruneModel, AbsThresholdAndRandomCounts) {
  ir::Model m = two_layers(at::tensor({0.1f, -0.2f, 0.3f, -0.4f}).reshape({2, 2}),
                           at::tensor({0.05f, 0.5f, -0.6f, 0.0f}).reshape({2, 2}));
  PruneOptions o;
  o.criterion = "abs";
  o.threshold = 0.3;  // |w| < 0.3 goes, 0.3 stays
  prune(m, o);
  EXPECT_TRUE(at::equal(init(m, "w1"), at::tensor({0.f, 0.f, 0.3f, -0.4f}).reshape({2, 2})));
  EXPECT_EQ(nnz(init(m, "w2")), 2);

  at::manual_seed(3);
  ir::Model a = two_layers(at::randn({10, 10}), at::randn({10, 10}));
  ir::Model b = two_layers(init(a, "w1").clone(), init(a, "w2").clone());
  PruneOptions ro;
  ro.criterion = "random";
  ro.amount = frac(0.3);
  ro.seed = 9;
  PruneReport r = prune(a, ro);
  EXPECT_EQ(r.layers[0].nonzero_after, 70);
  prune(b, ro);
  EXPECT_TRUE(at::equal(init(a, "w1"), init(b, "w1")));  // the seed decides
}

// A weight holding NaN or Inf: one warning names it, a threshold never removes a NaN (|NaN| < t
// is false, as in torch), l1 ranks NaN largest (torch.topk's order), and LAMP keeps the other
// weights of its layer comparable (one NaN made every LAMP score of the layer NaN).
TEST(PruneModel, NonFiniteWeightsAreNamedAndRankedAsTorchRanksThem) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  ir::Model m = two_layers(at::tensor({0.1f, nan, 0.3f, -0.4f}).reshape({2, 2}),
                           at::tensor({0.05f, 0.5f, -0.6f, 0.2f}).reshape({2, 2}));
  PruneOptions o;
  o.criterion = "abs";
  o.threshold = 0.35;
  PruneReport r = prune(m, o);
  const at::Tensor w1 = init(m, "w1").flatten();
  EXPECT_TRUE(std::isnan(w1[1].item<float>()));  // kept
  EXPECT_EQ(nnz(init(m, "w1")), 2);              // NaN and -0.4
  ASSERT_EQ(r.warnings.size(), 1u);
  EXPECT_NE(r.warnings[0].find("'w1'"), std::string::npos) << r.warnings[0];
  EXPECT_NE(r.warnings[0].find("non-finite"), std::string::npos) << r.warnings[0];

  ir::Model l = two_layers(at::tensor({0.1f, nan, 0.3f, -0.4f}).reshape({2, 2}),
                           at::tensor({0.05f, 0.5f, -0.6f, 0.2f}).reshape({2, 2}));
  PruneOptions lo;
  lo.amount = count(1);
  prune(l, lo);
  EXPECT_TRUE(std::isnan(init(l, "w1").flatten()[1].item<float>()));  // NaN ranks largest
  EXPECT_EQ(init(l, "w1").flatten()[0].item<float>(), 0.f);           // 0.1 goes

  // LAMP, global, 50%: with one NaN and one Inf in fc1, fc1's finite weights still rank among
  // fc2's; the non-finite ones stay; no layer is emptied.
  at::manual_seed(5);
  at::Tensor a = at::randn({8, 8}), b = at::randn({8, 8});
  a.view(-1)[3] = nan;
  a.view(-1)[9] = inf;
  ir::Model g = two_layers(a, b);
  PruneOptions go;
  go.criterion = "lamp";
  go.scope = PruneScope::kGlobal;
  go.amount = frac(0.5);
  PruneReport gr = prune(g, go);
  EXPECT_TRUE(std::isnan(init(g, "w1").view(-1)[3].item<float>()));
  EXPECT_TRUE(std::isinf(init(g, "w1").view(-1)[9].item<float>()));
  EXPECT_GT(gr.layers[0].nonzero_after, 8);
  EXPECT_GT(gr.layers[1].nonzero_after, 8);
  EXPECT_EQ(gr.layers[0].nonzero_after + gr.layers[1].nonzero_after, 64);
}

TEST(PruneModel, NMAlongTheReductionDimAndSkipsWhatDoesNotDivide) {
  at::manual_seed(4);
  // fc1: Gemm transB=1, w1 [out=8, K=16]: groups along dim 1. fc2: MatMul, w2 [K=8, N=6]: groups
  // along dim 0.
  ir::Model m = two_layers(at::randn({8, 16}), at::randn({8, 6}));
  PruneOptions o;
  o.pattern = PrunePattern::kNM;
  o.n = 2, o.m = 4;
  PruneReport r = prune(m, o);
  EXPECT_TRUE(init(m, "w1").ne(0).reshape({8, 4, 4}).sum(-1).eq(2).all().item<bool>());
  EXPECT_TRUE(init(m, "w2").ne(0).t().reshape({6, 2, 4}).sum(-1).eq(2).all().item<bool>());
  EXPECT_TRUE(r.layers[1].skipped.empty());

  ir::Model odd = two_layers(at::randn({8, 16}), at::randn({6, 3}));  // K=6 for 4 -> skipped
  r = prune(odd, o);
  EXPECT_NE(r.layers[1].skipped.find("not divisible"), std::string::npos);
  EXPECT_EQ(r.layers[1].nonzero_after, 18);
}

TEST(PruneModel, ExcludeAndSkipFirstLast) {
  at::manual_seed(5);
  ir::Model m = two_layers(at::randn({4, 4}), at::randn({4, 4}));
  PruneOptions o;
  o.amount = frac(0.5);
  o.exclude = "^fc2$";
  PruneReport r = prune(m, o);
  EXPECT_EQ(r.layers[0].nonzero_after, 8);
  EXPECT_EQ(r.layers[1].nonzero_after, 16);
  EXPECT_FALSE(r.layers[1].skipped.empty());
  EXPECT_TRUE(r.warnings.empty());

  o.exclude = "nothing-like-this";
  r = prune(m, o);
  EXPECT_EQ(r.warnings.size(), 1u);

  o.exclude = "";
  o.skip_first_last = true;  // two layers: both are first or last
  EXPECT_THROW(prune(m, o), Error);
}

TEST(PruneModel, BadOptionsAreErrorsAndLeaveTheModelAlone) {
  at::manual_seed(6);
  ir::Model m = two_layers(at::randn({4, 4}), at::randn({4, 4}));
  at::Tensor before = init(m, "w1").clone();
  PruneOptions o;
  o.amount = frac(1.5);
  EXPECT_THROW(prune(m, o), Error);
  o.amount = frac(-0.1);
  EXPECT_THROW(prune(m, o), Error);
  o.amount = count(17);  // each tensor has 16
  EXPECT_THROW(prune(m, o), Error);
  o.amount = frac(0.5);
  o.criterion = "abs";
  o.threshold = -1;
  EXPECT_THROW(prune(m, o), Error);
  o.criterion = "l1";
  o.pattern = PrunePattern::kNM;
  o.n = 4, o.m = 4;
  EXPECT_THROW(prune(m, o), Error);
  o.pattern = PrunePattern::kRow;
  o.norm = 3;
  EXPECT_THROW(prune(m, o), Error);
  o.norm = 1;
  o.scope = PruneScope::kGlobal;
  EXPECT_THROW(prune(m, o), Error);
  o.pattern = PrunePattern::kUnstructured;
  o.exclude = "(";
  EXPECT_THROW(prune(m, o), Error);
  EXPECT_TRUE(at::equal(init(m, "w1"), before));

  ir::Model none;
  none.graph.initializers = {{"b", at::ones({3})}};
  EXPECT_THROW(prune(none, PruneOptions{}), Error);
}

TEST(PruneOptions, CheckedBeforeAnyWork) {
  PruneOptions o;
  o.amount = frac(0.5);
  EXPECT_NO_THROW(check_prune_options(o));
  o.scope = PruneScope::kGlobal;
  o.pattern = PrunePattern::kColumn;
  EXPECT_NE(error_of([&] { check_prune_options(o); }).find("scope global ranks single weights"),
            std::string::npos);
  o.pattern = PrunePattern::kUnstructured;
  o.exclude = "(";
  EXPECT_NE(error_of([&] { check_prune_options(o); }).find("exclude '(' is not a valid regex"),
            std::string::npos);
  o.exclude = "";
  o.amount = frac(2);
  EXPECT_NE(error_of([&] { check_prune_options(o); }).find("amount must be in [0, 1]"),
            std::string::npos);

  EXPECT_TRUE(weight_criterion_info("abs").takes_threshold);
  EXPECT_FALSE(weight_criterion_info("abs").needs_data);
  const CriterionInfo taylor = weight_criterion_info("taylor");
  EXPECT_TRUE(taylor.needs_data && !taylor.takes_threshold);
  EXPECT_EQ(taylor.data_needed, "by their gradients");
  EXPECT_NE(error_of([] { weight_criterion_info("nope"); }).find("unknown method 'nope'"),
            std::string::npos);
  EXPECT_NE(error_of([] { weight_criterion_info("bn"); }).find("unknown method 'bn'"),
            std::string::npos);  // ranks channels only
}

TEST(PruneRecipe, FirstMatchWinsSkipAndDefaults) {
  at::manual_seed(7);
  // fc1 (w1) and fc2 (w2): the first rule that matches decides, the weight name matches too.
  ir::Model m = two_layers(at::randn({8, 16}), at::randn({8, 4}));
  PruneRecipe r = parse_prune_recipe(R"(
defaults: {method: l1, amount: 0.5}
rules:
  - {match: "^w2$", method: l1, amount: 0.25}
  - {match: "fc", skip: true}
)",
                                     "t.yaml");
  PruneReport rep = prune(m, r);
  EXPECT_EQ(rep.layers[0].nonzero_after, 128);  // fc1: rule 1 skips it
  EXPECT_NE(rep.layers[0].skipped.find("skip"), std::string::npos);
  EXPECT_EQ(rep.layers[1].nonzero_after, 24);  // fc2: rule 0, 25% of 32
  EXPECT_EQ(rep.layers[1].method, "l1");
  EXPECT_EQ(rep.layers[1].amount, "0.25");
  EXPECT_TRUE(rep.warnings.empty());

  // Unmatched layers take the defaults; a rule that matches nothing is a warning.
  ir::Model d = two_layers(at::randn({8, 16}), at::randn({8, 4}));
  rep = prune(d, parse_prune_recipe(R"(
defaults: {method: l1, amount: 0.5}
rules:
  - {match: "^fc2$", pattern: "2:4"}
  - {match: "nothing-like-this", skip: true}
)",
                                    "t.yaml"));
  EXPECT_EQ(rep.layers[0].nonzero_after, 64);
  EXPECT_EQ(rep.layers[0].rule, "defaults");
  EXPECT_EQ(rep.layers[1].method, "l1 2:4");
  EXPECT_TRUE(init(d, "w2").ne(0).t().reshape({4, 2, 4}).sum(-1).eq(2).all().item<bool>());
  ASSERT_EQ(rep.warnings.size(), 1u);
  EXPECT_NE(rep.warnings[0].find("nothing-like-this"), std::string::npos);

  // No method in the defaults: unmatched layers are left alone.
  ir::Model n = two_layers(at::randn({8, 16}), at::randn({8, 4}));
  rep = prune(
      n, parse_prune_recipe("rules:\n  - {match: fc2, method: abs, threshold: 0.5}\n", "t.yaml"));
  EXPECT_EQ(rep.layers[0].nonzero_after, 128);
  EXPECT_FALSE(rep.layers[0].skipped.empty());
  EXPECT_EQ(rep.layers[1].nonzero_after, init(n, "w2").ne(0).sum().item<int64_t>());
  EXPECT_TRUE(init(n, "w2").eq(0).logical_or(init(n, "w2").abs().ge(0.5)).all().item<bool>());
}

TEST(PruneRecipe, ErrorsNameTheFileTheKeyAndTheLine) {
  struct Case {
    std::string yaml, needle;
  } cases[] = {
      {"rules: [\n  {match: a\n", "bad.yaml:"},  // does not parse
      {"defaults: {method: l1, amount: 0.5}\nfrobs: 1\n", "bad.yaml:2: frobs: unknown key"},
      {"defaults:\n  method: l1\n  amount: 0.5\n  colour: red\n", "bad.yaml:4: defaults.colour"},
      {"rules:\n  - {match: a, method: l1, amount: 0.5, depth: 3}\n", "rules[0].depth"},
      {"defaults: {method: abs, threshold: lots}\n", "defaults.threshold: must be a number"},
      {"defaults: {method: l1, amount: [1, 2]}\n", "defaults.amount"},
      {"defaults: {method: l1, amount: 1.5}\n", "amount must be in [0, 1]"},
      {"defaults: {method: frob, amount: 0.5}\n", "unknown method"},
      {"defaults: {method: l1, amount: 0.5, pattern: diagonal}\n", "unknown pattern"},
      {"defaults: {method: l1}\n", "needs amount"},
      {"defaults: {method: abs}\n", "needs threshold"},
      {"rules:\n  - {match: \"(\", skip: true}\n", "bad.yaml:2: rules[0].match"},
      {"rules:\n  - {skip: true}\n", "needs 'match'"},
      {"rules:\n  - {match: a}\n", "needs 'skip: true' or a method"},
      {"rules:\n  - {match: a, skip: maybe}\n", "rules[0].skip"},
      {"rules:\n  - {match: a, skip: true, amount: 0.5}\n", "skip: true takes no"},
      {"rules: 3\n", "rules: must be a list"},
      {"- 1\n- 2\n", "must be a map"},
  };
  for (const auto& c : cases) {
    std::string msg = error_of([&] { parse_prune_recipe(c.yaml, "bad.yaml"); });
    EXPECT_NE(msg.find(c.needle), std::string::npos) << c.yaml << " -> " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    EXPECT_EQ(msg.rfind("[prune] recipe bad.yaml", 0), 0u) << msg;
  }
  EXPECT_NE(error_of([] { load_prune_recipe("/nonexistent/r.yaml"); }).find("/nonexistent/r.yaml"),
            std::string::npos);

  // Nothing left to prune: an error, the model untouched.
  at::manual_seed(8);
  ir::Model m = two_layers(at::randn({4, 4}), at::randn({4, 4}));
  at::Tensor before = init(m, "w1").clone();
  std::string msg = error_of(
      [&] { prune(m, parse_prune_recipe("rules:\n  - {match: fc, skip: true}\n", "s.yaml")); });
  EXPECT_NE(msg.find("nothing left to prune"), std::string::npos) << msg;
  // A count above a layer's weights: an error naming the layer, the model untouched.
  msg = error_of(
      [&] { prune(m, parse_prune_recipe("defaults: {method: l1, amount: 17}\n", "c.yaml")); });
  EXPECT_FALSE(msg.empty());
  EXPECT_TRUE(at::equal(init(m, "w1"), before));
}

// The radix select against a sort, on signed values (absolute and not), with a NaN that torch.topk
// ranks last and ties between tensors.
TEST(PruneMask, RadixSelectMatchesASort) {
  at::manual_seed(2);
  std::vector<at::Tensor> ws = {at::randn({300, 17}), at::randn({4000}), at::randn({9, 3, 5})};
  ws[1].index_put_({0}, std::numeric_limits<float>::quiet_NaN());
  ws[2].index_put_({0, 0, 0}, ws[0].index({0, 0}).item<float>());  // a tie across tensors
  for (bool absolute : {true, false}) {
    std::vector<at::Tensor> flat, none(ws.size());
    for (auto& w : ws) flat.push_back((absolute ? w.abs() : w).flatten());
    at::Tensor all = at::cat(flat);
    for (int64_t k : {int64_t(1), int64_t(777), all.numel() - 1}) {
      auto removed = smallest_k(ws, none, k, absolute);
      at::Tensor idx = std::get<1>(at::topk(all, k, 0, /*largest=*/false));
      at::Tensor want = at::zeros({all.numel()}, at::kBool).index_fill_(0, idx, true);
      std::vector<at::Tensor> got;
      for (auto& r : removed) got.push_back(r.flatten());
      EXPECT_TRUE(at::equal(at::cat(got), want)) << "absolute " << absolute << " k " << k;
    }
  }
}

// Past 2^24 alive scores a tie at the threshold is broken by order, not by torch.topk.
TEST(PruneMask, TiesBeyondTheExactLimitGoFirstInOrder) {
  int64_t n = (int64_t(1) << 24) + 100;
  at::Tensor a = at::ones({n / 2}), b = at::ones({n - n / 2});
  a.index_put_({0}, 0.5f);
  auto removed = smallest_k({a, b}, {at::Tensor(), at::Tensor()}, n / 2 + 10, /*absolute=*/true);
  EXPECT_EQ(removed[0].sum().item<int64_t>(), n / 2);
  EXPECT_EQ(removed[1].sum().item<int64_t>(), 10);
  EXPECT_TRUE(removed[1].slice(0, 0, 10).all().item<bool>());
  EXPECT_FALSE(removed[1].slice(0, 10).any().item<bool>());
}

// grad and taylor rank by the Saliency they are given: local, global, N:M and rows.
TEST(PruneModel, GradAndTaylorRankByTheirSaliency) {
  at::manual_seed(3);
  ir::Model m = two_layers(at::randn({8, 16}), at::randn({8, 4}));
  Saliency s;
  // Scores that disagree with |w|: pruning by them must not be pruning by magnitude.
  s.scores["grad"]["w1"] = at::arange(128, at::kFloat).reshape({8, 16});
  s.scores["grad"]["w2"] = at::arange(32, at::kFloat).flip(0).reshape({8, 4});
  s.scores["taylor"]["w1"] = s.scores["grad"]["w1"].flip(1);
  s.scores["taylor"]["w2"] = s.scores["grad"]["w2"];

  PruneOptions o;
  o.criterion = "grad";
  o.amount = frac(0.25);
  ir::Model a = two_layers(init(m, "w1").clone(), init(m, "w2").clone());
  prune(a, o, &s);
  // The 32 smallest grad scores of w1 are its first two rows; of w2 the last 8 entries.
  EXPECT_EQ(nnz(init(a, "w1").slice(0, 0, 2)), 0);
  EXPECT_EQ(nnz(init(a, "w1").slice(0, 2)), 96);
  EXPECT_EQ(nnz(init(a, "w2").flatten().slice(0, 24)), 0);

  o.criterion = "taylor";
  o.scope = PruneScope::kGlobal;
  ir::Model g = two_layers(init(m, "w1").clone(), init(m, "w2").clone());
  PruneReport r = prune(g, o, &s);
  EXPECT_EQ(r.nonzero_after, 160 - 40);
  EXPECT_EQ(r.layers[0].method, "taylor global");

  o = PruneOptions();
  o.criterion = "grad";
  o.pattern = PrunePattern::kNM;
  ir::Model nm = two_layers(init(m, "w1").clone(), init(m, "w2").clone());
  prune(nm, o, &s);
  // 2:4 along w1's input dim keeps the two largest scores of each group: its last two columns.
  at::Tensor groups = init(nm, "w1").reshape({8, 4, 4}).ne(0);
  EXPECT_TRUE(groups.select(2, 2).all().item<bool>() && groups.select(2, 3).all().item<bool>());
  EXPECT_FALSE(groups.select(2, 0).any().item<bool>() || groups.select(2, 1).any().item<bool>());

  o = PruneOptions();
  o.criterion = "grad";
  o.pattern = PrunePattern::kRow;
  o.amount = count(3);
  ir::Model rows = two_layers(init(m, "w1").clone(), init(m, "w2").clone());
  prune(rows, o, &s);
  EXPECT_EQ(nnz(init(rows, "w1").slice(0, 0, 3)), 0);  // the rows with the smallest score sums
  EXPECT_EQ(nnz(init(rows, "w1").slice(0, 3)), 80);
}

TEST(PruneModel, GradWithoutItsSaliencyIsAnError) {
  ir::Model m = two_layers(at::randn({8, 16}), at::randn({8, 4}));
  at::Tensor before = init(m, "w1").clone();
  PruneOptions o;
  o.criterion = "taylor";
  o.amount = frac(0.5);
  try {
    prune(m, o);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("calibration data"), std::string::npos) << e.what();
  }
  Saliency s;
  s.scores["taylor"]["w1"] = at::ones({8, 16});
  s.scores["taylor"]["w2"] = at::ones({4, 8});  // the wrong shape
  try {
    prune(m, o, &s);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("shape"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(at::equal(init(m, "w1"), before));
}

TEST(PruneModel, WeightsSharedWithACopyAreNotWrittenThrough) {
  ir::Model m = two_layers(at::randn({8, 16}), at::randn({8, 4}));
  ir::Model copy = m;  // shares the tensors
  at::Tensor before = init(m, "w1").clone();
  PruneOptions o;
  o.amount = frac(0.5);
  prune(copy, o);
  EXPECT_TRUE(at::equal(init(m, "w1"), before));
  EXPECT_EQ(nnz(init(copy, "w1")), 64);
}

namespace {

// Block pruning of a [O, K] matrix the slow, obvious way: a score per block (mean |w| or root mean
// square), sorted, the k lowest zeroed. Weights must be nonzero and their scores distinct.
at::Tensor reference_block_keep(const at::Tensor& m, int64_t r, int64_t c, int64_t k, int norm) {
  std::vector<std::tuple<double, int64_t, int64_t>> blocks;
  for (int64_t i = 0; i < m.size(0); i += r)
    for (int64_t j = 0; j < m.size(1); j += c) {
      at::Tensor b = m.slice(0, i, i + r).slice(1, j, j + c).to(at::kDouble);
      blocks.emplace_back(
          norm == 1 ? b.abs().mean().item<double>() : b.square().mean().sqrt().item<double>(), i,
          j);
    }
  std::sort(blocks.begin(), blocks.end());
  at::Tensor keep = at::ones(m.sizes(), at::kBool);
  for (int64_t b = 0; b < k; ++b) {
    auto [score, i, j] = blocks[b];
    keep.slice(0, i, i + r).slice(1, j, j + c).fill_(false);
  }
  return keep;
}

at::Tensor block_keep(const at::Tensor& w, int64_t out_axis, int64_t in_axis, int64_t r, int64_t c,
                      const PruneAmount& amount, int norm = 1) {
  return block_masks({{w, out_axis, in_axis}}, r, c, amount, norm, nullptr)[0];
}

}  // namespace

TEST(PruneMask, BlocksGoWholeLowestMeanFirstAndCountFromWhatIsLeft) {
  // [4, 6] in 2x3 blocks: mean |w| 1, 0.1 (top) and 3, 0.2 (bottom), signs mixed.
  at::Tensor w = at::tensor({1.f,  -1.f, 1.f,  0.1f,  -0.1f, 0.1f,   //
                             -1.f, 1.f,  -1.f, 0.1f,  0.1f,  -0.1f,  //
                             3.f,  3.f,  -3.f, 0.2f,  -0.2f, 0.2f,   //
                             3.f,  -3.f, 3.f,  -0.2f, 0.2f,  0.2f})
                     .reshape({4, 6});
  at::Tensor keep = block_keep(w, 0, 1, 2, 3, count(2));
  at::Tensor want = bools({1, 1, 1, 0, 0, 0, 1, 1, 1, 0, 0, 0}).reshape({2, 6});
  EXPECT_TRUE(at::equal(keep, at::cat({want, want})));
  // Cumulative: the zero blocks no longer count; half of the two left is one, the mean-1 block.
  at::Tensor w2 = w * keep;
  keep = block_keep(w2, 0, 1, 2, 3, frac(0.5));
  EXPECT_EQ(nnz(keep.slice(0, 0, 2)), 0);
  EXPECT_EQ(nnz(keep.slice(0, 2)), 6);
  EXPECT_THROW(block_keep(w2, 0, 1, 2, 3, count(3)), Error);  // 2 blocks left
  EXPECT_EQ(nnz(block_keep(w2, 0, 1, 2, 3, frac(1.0))), 0);
  // A block with one zero weight is alive, and its zero stays zero.
  w2.index_put_({0, 0}, 0.f);
  keep = block_keep(w2, 0, 1, 2, 3, count(1));
  EXPECT_EQ(nnz(keep), 6);
  EXPECT_TRUE(keep.slice(0, 2).slice(1, 0, 3).all().item<bool>());
}

TEST(PruneMask, BlocksAtTheEdgesAreScoredByTheirMean) {
  // [5, 5] in 2x2 blocks: a 3x3 grid whose last row and column of blocks are partial. The corner
  // block is one weight of 0.5: by sum (0.5) it would go before the 0.4 block (sum 1.6); by mean,
  // after it.
  at::Tensor w = at::ones({5, 5});
  w.slice(0, 0, 2).slice(1, 0, 2).fill_(0.4f);
  w.index_put_({4, 4}, 0.5f);
  at::Tensor keep = block_keep(w, 0, 1, 2, 2, count(1));
  EXPECT_EQ(nnz(keep.slice(0, 0, 2).slice(1, 0, 2)), 0);
  EXPECT_EQ(nnz(keep), 21);
  keep = block_keep(w, 0, 1, 2, 2, count(2));
  EXPECT_EQ(nnz(keep), 20);
  EXPECT_FALSE(keep[4][4].item<bool>());
  // Norm 2 is the root mean square: {0.1, 0.1, 0.1, 0.9} has mean 0.3 but RMS 0.46 > 0.4.
  w.slice(0, 2, 4).slice(1, 0, 2).copy_(at::tensor({0.1f, 0.1f, 0.1f, 0.9f}).reshape({2, 2}));
  EXPECT_EQ(nnz(block_keep(w, 0, 1, 2, 2, count(1), 1).slice(0, 2, 4).slice(1, 0, 2)), 0);
  EXPECT_EQ(nnz(block_keep(w, 0, 1, 2, 2, count(1), 2).slice(0, 0, 2).slice(1, 0, 2)), 0);
}

TEST(PruneMask, BlocksFollowTheOutputAndInputAxes) {
  at::manual_seed(9);
  // Conv [O=5, I=3, 2, 2]: blocks of [5, 12], straddling input channels, partial at both edges.
  at::Tensor conv = at::randn({5, 3, 2, 2});
  int64_t k = int64_t(std::nearbyint(0.5 * 3 * 3));
  EXPECT_TRUE(
      at::equal(block_keep(conv, 0, 1, 2, 5, frac(0.5)),
                reference_block_keep(conv.reshape({5, 12}), 2, 5, k, 1).reshape({5, 3, 2, 2})));
  // ConvTranspose [I=3, O=5, 2, 2]: outputs along axis 1, inputs I*kh*kw.
  at::Tensor deconv = at::randn({3, 5, 2, 2});
  at::Tensor view = deconv.permute({1, 0, 2, 3}).reshape({5, 12});
  EXPECT_TRUE(at::equal(
      block_keep(deconv, 1, 0, 2, 5, frac(0.5)),
      reference_block_keep(view, 2, 5, k, 1).reshape({5, 3, 2, 2}).permute({1, 0, 2, 3})));
  // MatMul [K=10, N=7]: a block is r consecutive outputs along axis 1 by c inputs along axis 0.
  at::Tensor mm = at::randn({10, 7});
  k = int64_t(std::nearbyint(0.6 * 3 * 3));
  EXPECT_TRUE(at::equal(block_keep(mm, 1, 0, 3, 4, frac(0.6), 2),
                        reference_block_keep(mm.t(), 3, 4, k, 2).t()));
  // 1x1 blocks scored by |w| are l1_unstructured.
  EXPECT_TRUE(at::equal(block_keep(mm, 1, 0, 1, 1, frac(0.3)), l1_mask(mm, frac(0.3))));
  EXPECT_THROW(block_keep(mm, 1, 0, 0, 4, frac(0.5)), Error);
  EXPECT_THROW(block_keep(mm, 1, 0, 4, 257, frac(0.5)), Error);
}

TEST(PruneModel, BlocksLocalGlobalRandomAndSaliency) {
  at::manual_seed(10);
  // fc1: Gemm transB=1, w1 [8 outputs, 16 inputs]; fc2: MatMul, w2 [K=8, N=6].
  ir::Model m = two_layers(at::randn({8, 16}), at::randn({8, 6}));
  PruneOptions o;
  parse_prune_pattern("block:2x4", o);
  o.amount = frac(0.5);
  ir::Model a = two_layers(init(m, "w1").clone(), init(m, "w2").clone());
  PruneReport r = prune(a, o);
  EXPECT_EQ(r.layers[0].method, "l1 block:2x4 L1");
  EXPECT_EQ(r.layers[0].nonzero_after, 64);  // 8 of 16 blocks
  EXPECT_EQ(r.layers[1].nonzero_after, 24);  // 3 of 6 blocks: pairs of outputs (axis 1)
  EXPECT_TRUE(at::equal(init(a, "w1").ne(0), block_keep(init(m, "w1"), 0, 1, 2, 4, frac(0.5))));
  EXPECT_TRUE(at::equal(init(a, "w2").ne(0), block_keep(init(m, "w2"), 1, 0, 2, 4, frac(0.5))));
  at::Tensor z2 = init(a, "w2").eq(0).reshape({2, 4, 3, 2});  // [K/4, 4, N/2, 2]
  EXPECT_TRUE(at::equal(z2.all(3).all(1), z2.any(3).any(1)));
  // Again: half of the 8 blocks left.
  r = prune(a, o);
  EXPECT_EQ(r.layers[0].nonzero_after, 32);

  // Global: fc1's 16 blocks are all small, fc2's 6 all large: 16 blocks are all of fc1's.
  ir::Model g = two_layers(at::full({8, 16}, 0.01f), at::full({8, 6}, 1.0f));
  o.scope = PruneScope::kGlobal;
  o.amount = count(16);
  r = prune(g, o);
  EXPECT_EQ(r.layers[0].method, "l1 global block:2x4 L1");
  EXPECT_EQ(r.layers[0].nonzero_after, 0);
  EXPECT_EQ(r.layers[1].nonzero_after, 48);
  o.amount = count(7);  // 6 blocks left
  EXPECT_NE(error_of([&] { prune(g, o); }).find("all prunable layers"), std::string::npos);

  // Random, local and global: whole blocks, the right count, the seed decides.
  o.criterion = "random";
  o.amount = frac(0.5);
  o.seed = 4;
  for (PruneScope scope : {PruneScope::kLocal, PruneScope::kGlobal}) {
    o.scope = scope;
    ir::Model x = two_layers(init(m, "w1").clone(), init(m, "w2").clone());
    ir::Model y = two_layers(init(m, "w1").clone(), init(m, "w2").clone());
    r = prune(x, o);
    prune(y, o);
    EXPECT_EQ(r.nonzero_after, 88);  // 11 of the 22 blocks, 8 weights each
    EXPECT_TRUE(at::equal(init(x, "w1"), init(y, "w1")));
    at::Tensor z1 = init(x, "w1").eq(0).reshape({4, 2, 4, 4});
    EXPECT_TRUE(at::equal(z1.all(3).all(1), z1.any(3).any(1)));
  }

  // grad: a block is ranked by its mean saliency. Row-major arange: the lowest means are the first
  // blocks of w1's first two rows.
  Saliency s;
  s.scores["grad"]["w1"] = at::arange(128, at::kFloat).reshape({8, 16});
  s.scores["grad"]["w2"] = at::arange(48, at::kFloat).flip(0).reshape({8, 6});
  o = PruneOptions();
  o.criterion = "grad";
  parse_prune_pattern("block:2x4", o);
  o.amount = count(3);
  ir::Model gr = two_layers(init(m, "w1").clone(), init(m, "w2").clone());
  prune(gr, o, &s);
  EXPECT_EQ(nnz(init(gr, "w1").slice(0, 0, 2).slice(1, 0, 12)), 0);
  EXPECT_EQ(nnz(init(gr, "w1")), 128 - 24);
  // w2's scores fall along its flat order: its last four inputs (rows) go, for all six outputs.
  EXPECT_EQ(nnz(init(gr, "w2").slice(0, 4)), 0);
  EXPECT_EQ(nnz(init(gr, "w2").slice(0, 0, 4)), 24);
}

TEST(PruneModel, BlockPatternsParseOrFailInOneLine) {
  PruneLayerOptions o;
  parse_prune_pattern("block:8x1", o);
  EXPECT_EQ(o.pattern, PrunePattern::kBlock);
  EXPECT_EQ(o.block_r, 8);
  EXPECT_EQ(o.block_c, 1);
  parse_prune_pattern("block:256x256", o);
  EXPECT_EQ(o.block_r, 256);
  for (std::string bad : {"block:0x4", "block:4", "block:4x", "block:axb", "block:300x1",
                          "block:4x0", "block:4x1x", "block:-1x4", "block"}) {
    std::string msg = error_of([&] { parse_prune_pattern(bad, o); });
    EXPECT_NE(msg.find("[prune] bad pattern '" + bad + "'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("block:RxC"), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
  EXPECT_NE(error_of([&] { parse_prune_pattern("blocks", o); }).find("bad pattern"),
            std::string::npos);

  // abs removes single weights; rows and columns still refuse global scope; hand-built sizes.
  ir::Model m = two_layers(at::randn({4, 4}), at::randn({4, 4}));
  at::Tensor before = init(m, "w1").clone();
  PruneOptions po;
  parse_prune_pattern("block:2x2", po);
  po.criterion = "abs";
  po.threshold = 0.1;
  EXPECT_NE(error_of([&] { prune(m, po); }).find("criterion abs"), std::string::npos);
  po.criterion = "l1";
  po.amount = frac(0.5);
  po.norm = 3;
  EXPECT_NE(error_of([&] { prune(m, po); }).find("norm"), std::string::npos);
  po.norm = 1;
  po.block_r = 0;
  EXPECT_NE(error_of([&] { prune(m, po); }).find("'block:0x2'"), std::string::npos);
  po.pattern = PrunePattern::kRow;
  po.scope = PruneScope::kGlobal;
  EXPECT_NE(error_of([&] { prune(m, po); }).find("scope global"), std::string::npos);
  EXPECT_TRUE(at::equal(init(m, "w1"), before));

  // A 1-D MatMul weight has no block layout: skipped, with the reason.
  ir::Model v = two_layers(at::randn({4, 4}), at::randn({4}));
  po = PruneOptions();
  parse_prune_pattern("block:2x2", po);
  po.amount = frac(0.5);
  PruneReport r = prune(v, po);
  EXPECT_NE(r.layers[1].skipped.find("1-D"), std::string::npos) << r.layers[1].skipped;
  EXPECT_EQ(r.layers[0].nonzero_after, 8);
}

TEST(PruneRecipe, BlockPatternPerRule) {
  at::manual_seed(12);
  ir::Model m = two_layers(at::randn({8, 16}), at::randn({8, 6}));
  PruneReport r = prune(m, parse_prune_recipe(R"(
defaults: {method: l1, amount: 0.5}
rules:
  - {match: "^fc1$", pattern: "block:4x1", norm: 2}
)",
                                              "t.yaml"));
  EXPECT_EQ(r.layers[0].method, "l1 block:4x1 L2");
  EXPECT_EQ(r.layers[0].nonzero_after, 64);
  at::Tensor z = init(m, "w1").eq(0).reshape({2, 4, 16});
  EXPECT_TRUE(at::equal(z.all(1), z.any(1)));
  EXPECT_EQ(r.layers[1].method, "l1");
  std::string msg = error_of([] {
    parse_prune_recipe(
        "defaults: {method: l1, amount: 0.5}\nrules:\n  - {match: a, pattern: "
        "\"block:0x4\"}\n",
        "bad.yaml");
  });
  EXPECT_NE(msg.find("bad.yaml:3: rules[0].pattern: bad pattern 'block:0x4'"), std::string::npos)
      << msg;
  msg = error_of(
      [] { parse_prune_recipe("defaults: {method: l1, pattern: \"block:2x2\"}\n", "b.yaml"); });
  EXPECT_NE(msg.find("needs amount"), std::string::npos) << msg;
}
