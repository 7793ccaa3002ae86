// The distillation term (lopper/train.h: distillation_kl, distillation_mix) against a computation
// written out in double and against ATen's kl_div (what torch.nn.functional.kl_div calls), values
// and gradients.
#include "lopper/train.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>

#include "lopper/error.h"
#include "test_util.h"

namespace lopper {
namespace {

// T^2 * mean over rows of sum_c p_t (log p_t - log p_s), in double, loop by loop.
double by_hand(const at::Tensor& s, const at::Tensor& t, double T) {
  const at::Tensor sd = s.to(at::kDouble).contiguous(), td = t.to(at::kDouble).contiguous();
  const int64_t m = sd.size(0), c = sd.size(1);
  double total = 0;
  for (int64_t i = 0; i < m; ++i) {
    double zs = 0, zt = 0;
    for (int64_t j = 0; j < c; ++j) {
      zs += std::exp(sd[i][j].item<double>() / T);
      zt += std::exp(td[i][j].item<double>() / T);
    }
    for (int64_t j = 0; j < c; ++j) {
      const double ps = std::exp(sd[i][j].item<double>() / T) / zs;
      const double pt = std::exp(td[i][j].item<double>() / T) / zt;
      total += pt * (std::log(pt) - std::log(ps));
    }
  }
  return total / double(m) * T * T;
}

TEST(Distill, KlEqualsTheDefinitionForClassifiersAndTokens) {
  at::manual_seed(3);
  // A classifier's rows [8, 10], and a language model's tokens [2 x 5, 17] with the padded
  // positions left out as the trainer leaves them (rows of the mask only).
  const at::Tensor s = at::randn({8, 10}) * 3, t = at::randn({8, 10}) * 3;
  const at::Tensor ls = at::randn({2, 5, 17}), lt = at::randn({2, 5, 17});
  const at::Tensor mask = at::tensor({1, 1, 1, 0, 0, 1, 1, 1, 1, 1}, at::kLong).to(at::kBool);
  const at::Tensor rs = ls.reshape({10, 17}).index({mask}), rt = lt.reshape({10, 17}).index({mask});
  for (double T : {1.0, 2.0, 4.0}) {
    EXPECT_NEAR(distillation_kl(s, t, T).item<double>(), by_hand(s, t, T), 1e-5) << T;
    EXPECT_NEAR(distillation_kl(rs, rt, T).item<double>(), by_hand(rs, rt, T), 1e-5) << T;
  }
  // Equal logits: nothing to learn.
  EXPECT_NEAR(distillation_kl(s, s.clone(), 2.0).item<double>(), 0.0, 1e-6);
  // A teacher probability of 0 adds nothing (no NaN).
  at::Tensor t_inf = t.clone();
  t_inf.index_put_({0, 0}, -INFINITY);
  EXPECT_TRUE(std::isfinite(distillation_kl(s, t_inf, 1.0).item<double>()));
}

TEST(Distill, GradientsEqualKlDivs) {
  at::manual_seed(4);
  const at::Tensor t = at::randn({6, 9});
  for (double T : {1.0, 3.0}) {
    at::Tensor s1 = at::randn({6, 9}).set_requires_grad(true);
    at::Tensor s2 = s1.detach().clone().set_requires_grad(true);
    distillation_kl(s1, t, T).backward();
    // torch.nn.functional.kl_div(log_softmax(s / T), softmax(t / T), reduction="batchmean") * T^2
    const at::Tensor ref =
        at::kl_div(at::log_softmax(s2 / T, 1), at::softmax(t / T, 1), at::Reduction::Sum) / 6.0 *
        (T * T);
    ref.backward();
    EXPECT_NEAR(distillation_kl(s1.detach(), t, T).item<double>(), ref.item<double>(), 1e-5);
    EXPECT_LE(test::relative_max_diff(s1.grad(), s2.grad()), 1e-5) << T;
  }
}

DistillOptions opts(double alpha, double temperature) {
  DistillOptions o;
  o.alpha = alpha;
  o.temperature = temperature;
  return o;
}

TEST(Distill, MixAndBadOptions) {
  const at::Tensor task = at::tensor(2.0), kl = at::tensor(4.0);
  EXPECT_DOUBLE_EQ(distillation_mix(task, kl, opts(0.25, 1.0)).item<double>(), 0.75 * 2 + 0.25 * 4);
  EXPECT_DOUBLE_EQ(distillation_mix(task, kl, opts(1.0, 1.0)).item<double>(), 4.0);
  EXPECT_NE(test::error_of([] { check_distill_options(opts(1.5, 1.0)); }).find("must be in [0, 1]"),
            std::string::npos);
  EXPECT_NE(test::error_of([] { check_distill_options(opts(0.5, 0.0)); }).find("must be > 0"),
            std::string::npos);
  EXPECT_NE(test::error_of([] { check_distill_options(opts(0.5, NAN)); }).find("must be > 0"),
            std::string::npos);
  EXPECT_NE(test::error_of([] {
              DistillOptions o;
              o.state_weight = -1;
              check_distill_options(o);
            }).find("distill_state_weight must be >= 0"),
            std::string::npos);
  EXPECT_NE(test::error_of([] {
              DistillOptions o;
              o.states.push_back({"a", "b"});
              check_distill_options(o);
            }).find("needs a teacher"),
            std::string::npos);
  EXPECT_NE(test::error_of([] {
              distillation_kl(at::zeros({2, 3}), at::zeros({2, 4}), 1.0);
            }).find("are not the student's"),
            std::string::npos);
}

}  // namespace
}  // namespace lopper
