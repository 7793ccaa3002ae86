// Feeding models batches (feeds) and the losses of lopper/loss.h (Objective).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "lopper/error.h"
#include "test_util.h"
#include "train/loss.h"

namespace lopper {
namespace {

using test::error_of;

bool has(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

ModelIO lm_io(std::vector<std::string> names, at::ScalarType dtype = at::kLong) {
  ModelIO io;
  for (const auto& n : names) io.inputs.push_back({n, {-1, -1}, dtype});
  io.out_dims = {-1, -1, 7};
  return io;
}

const at::Tensor& find(const NamedInputs& v, const std::string& name) {
  for (const auto& [n, t] : v)
    if (n == name) return t;
  throw std::runtime_error("no " + name);
}

TEST(Feeds, SamplesGoToInputIdsAndTheRestIsDerived) {
  ModelIO io = lm_io({"attention_mask", "input_ids", "token_type_ids", "position_ids"});
  io.inputs[0].dtype = at::kFloat;  // a float mask: converted
  Batch b;
  b.x = at::arange(6, at::kLong).reshape({2, 3});
  NamedInputs f = feeds(io, b, at::kCPU);
  ASSERT_EQ(f.size(), 4u);
  EXPECT_TRUE(at::equal(find(f, "input_ids"), b.x));
  EXPECT_TRUE(at::equal(find(f, "attention_mask"), at::ones({2, 3}, at::kFloat)));
  EXPECT_TRUE(at::equal(find(f, "token_type_ids"), at::zeros({2, 3}, at::kLong)));
  EXPECT_TRUE(at::equal(find(f, "position_ids")[1], at::arange(3, at::kLong)));
  // A given mask wins; int32 inputs get int32.
  ModelIO io32 = lm_io({"input_ids", "attention_mask"}, at::kInt);
  b.inputs = {{"attention_mask", at::tensor({1, 1, 0, 1, 0, 0}, at::kLong).reshape({2, 3})}};
  f = feeds(io32, b, at::kCPU);
  EXPECT_EQ(find(f, "input_ids").scalar_type(), at::kInt);
  EXPECT_EQ(find(f, "attention_mask").sum().item<int64_t>(), 3);
}

TEST(Feeds, WhatCannotBeFedIsOneLineNamingTheInput) {
  Batch b;
  b.x = at::zeros({2, 3}, at::kLong);
  std::string e = error_of([&] { feeds(lm_io({"input_ids", "past_key_values"}), b, at::kCPU); });
  EXPECT_TRUE(has(e, "the model's input 'past_key_values' has no data")) << e;
  b.inputs = {{"colour", at::zeros({2, 3})}};
  e = error_of([&] { feeds(lm_io({"input_ids"}), b, at::kCPU); });
  EXPECT_TRUE(has(e, "gives input 'colour', which the model does not take (its inputs: input_ids)"))
      << e;
  // An attention mask the model does not take is kept for the loss, not fed.
  b.inputs = {{"attention_mask", at::ones({2, 3}, at::kLong)}};
  EXPECT_EQ(feeds(lm_io({"input_ids"}), b, at::kCPU).size(), 1u);
  b.x_input = "ids";
  e = error_of([&] { feeds(lm_io({"input_ids"}), b, at::kCPU); });
  EXPECT_TRUE(has(e, "goes to input 'ids', which the model does not have")) << e;
}

TEST(Objective, CausalLmIsNextTokenCrossEntropyOverTheMaskedTokens) {
  at::manual_seed(0);
  Batch b;
  b.x = at::randint(0, 7, {2, 5}, at::kLong);
  at::Tensor mask = at::tensor({1, 1, 1, 1, 1, 1, 1, 1, 0, 0}, at::kLong).reshape({2, 5});
  b.inputs = {{"attention_mask", mask}};
  at::Tensor out = at::randn({2, 5, 7});
  Objective obj(LossOptions{}, lm_io({"input_ids"}));
  Objective::Targets t = obj.targets(out, b);
  EXPECT_EQ(obj.kind(), Loss::kCausalLm);  // auto: no labels, logits [B, T, V]
  // Row 0 predicts tokens 1..4, row 1 tokens 1..2 (3 and 4 are padding): 6 targets.
  ASSERT_EQ(t.labels.size(0), 6);
  double want = 0;
  at::Tensor lp = at::log_softmax(out, 2);
  for (int64_t r = 0; r < 2; ++r)
    for (int64_t p = 0; p + 1 < 5; ++p)
      if (mask[r][p + 1].item<int64_t>()) want -= lp[r][p][b.x[r][p + 1]].item<double>();
  EXPECT_NEAR(obj.loss(t).item<double>(), want / 6, 1e-5);
}

TEST(Objective, AutoPicksClassificationOrTokenClassification) {
  Batch b;
  b.x = at::zeros({3, 4}, at::kLong);
  b.y = at::tensor({0, 2, 1}, at::kLong);
  Objective cls(LossOptions{}, lm_io({"input_ids"}));
  at::Tensor logits = at::randn({3, 3});
  EXPECT_NEAR(cls.loss(cls.targets(logits, b)).item<double>(),
              at::cross_entropy_loss(logits, b.y).item<double>(), 1e-6);
  EXPECT_EQ(cls.kind(), Loss::kCrossEntropy);
  // Per-token labels with -100 and padding left out.
  b.y = at::tensor({1, -100, 2, 0, 1, 1, 1, 1, 0, 0, 0, 0}, at::kLong).reshape({3, 4});
  b.inputs = {{"attention_mask", at::tensor({1, 1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1}).reshape({3, 4})}};
  Objective tok(LossOptions{}, lm_io({"input_ids"}));
  Objective::Targets t = tok.targets(at::randn({3, 4, 3}), b);
  EXPECT_EQ(tok.kind(), Loss::kTokenClassification);
  EXPECT_EQ(t.labels.size(0), 9);
  // Labels beyond the outputs, and labels per token for a per-sample output.
  b.y = at::tensor({0, 5, 1}, at::kLong);
  b.inputs.clear();
  Objective again(LossOptions{}, lm_io({"input_ids"}));
  std::string e = error_of([&] { again.targets(at::randn({3, 3}), b); });
  EXPECT_TRUE(has(e, "the model has 3 outputs per sample, but the data has label 5")) << e;
  b.y = at::zeros({3, 4}, at::kLong);
  Objective per_token(LossOptions{}, lm_io({"input_ids"}));
  e = error_of([&] { per_token.targets(at::randn({3, 3}), b); });
  EXPECT_TRUE(has(e, "is not per token")) << e;
}

TEST(Objective, MaskedLmPicksDeterministicallyAsBertDoes) {
  LossOptions o;
  o.loss = Loss::kMaskedLm;
  o.mask_token = 6;
  o.mask_prob = 0.3;
  Objective obj(o, lm_io({"input_ids"}));
  Batch b;
  b.x = at::randint(0, 6, {64, 32}, at::kLong);  // no ID is 6: a 6 after prepare is a mask
  Batch b1 = b, b2 = b, b3 = b;
  obj.prepare(b1, 5);
  obj.prepare(b2, 5);
  obj.prepare(b3, 6);
  EXPECT_TRUE(at::equal(b1.x, b2.x) && at::equal(b1.y, b2.y));
  EXPECT_FALSE(at::equal(b1.y, b3.y));
  at::Tensor picked = b1.y.ne(-100);
  const double share = picked.to(at::kDouble).mean().item<double>();
  EXPECT_NEAR(share, 0.3, 0.03);
  EXPECT_TRUE(at::equal(b1.y.masked_select(picked), b.x.masked_select(picked)));
  const double masked =
      b1.x.eq(6).logical_and(picked).sum().item<double>() / picked.sum().item<double>();
  EXPECT_NEAR(masked, 0.8, 0.05);
  EXPECT_TRUE(
      at::equal(b1.x.masked_select(picked.logical_not()), b.x.masked_select(picked.logical_not())));
  Objective::Targets t = obj.targets(at::randn({64, 32, 7}), b1);
  EXPECT_EQ(t.labels.size(0), picked.sum().item<int64_t>());
  // Options checked.
  LossOptions no_token;
  no_token.loss = Loss::kMaskedLm;
  std::string e = error_of([&] { Objective x(no_token, lm_io({"input_ids"})); });
  EXPECT_TRUE(has(e, "masked-lm needs the mask token's ID")) << e;
  EXPECT_EQ(parse_loss("causal-lm"), Loss::kCausalLm);
  e = error_of([] { parse_loss("ppl"); });
  EXPECT_TRUE(has(e, "unknown loss 'ppl'")) << e;
}

}  // namespace
}  // namespace lopper
