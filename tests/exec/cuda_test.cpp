// The executor on a GPU: every fixture model (tests/fixtures/make_models.py: PyTorch's own outputs
// recorded beside it) runs on CUDA in fp32 and bf16 and agrees with PyTorch's CPU outputs;
// inference under autograd (what training runs) gives the same outputs as inference mode. Skips
// without a GPU.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdlib>

#include "lopper/executor.h"
#include "test_models.h"

using namespace lopper;

namespace {

using Case = test::FixtureCase;
using test::load_fixture;

// The models that exercise the GPU's op coverage: convolutions with BatchNorm kept and folded,
// depthwise, concat, attention, LayerNorm, GELU, embeddings, int64 shape arithmetic.
const char* const kModels[] = {"mlp.ts",         "small_cnn.ts",    "small_cnn.preserve",
                               "resnet18.ts",    "resnet18.dynamo", "mobilenet_v2.ts",
                               "densenet121.ts", "vit_b_16.ts",     "bert.ts",
                               "gpt2.ts",        "gpt2.dynamo"};

TEST(ExecutorCuda, FixturesMatchPyTorchInFp32AndBf16) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA GPU here";
  int ran = 0;
  for (const char* stem : kModels) {
    Case c = load_fixture(stem);
    if (c.want.empty()) continue;  // not exported on this machine (make_models.py --only)
    for (at::ScalarType precision : {at::kFloat, at::kBFloat16}) {
      ExecOptions o;
      o.device = "cuda";
      o.precision = precision;
      std::cout << "[cuda] " << stem << " " << at::toString(precision) << "..." << std::endl;
      Executor exec(c.model, o);
      auto outs = exec.run(c.feeds);
      outs = exec.run(c.feeds);  // the second run uses the kernels the first one chose
      ASSERT_GE(outs.size(), c.want.size()) << stem;
      for (size_t k = 0; k < c.want.size(); ++k) {
        ASSERT_EQ(outs[k].device().type(), at::kCUDA) << stem;
        ASSERT_EQ(outs[k].sizes(), c.want[k].sizes()) << stem << " output " << k;
        const double rel = test::relative_max_diff(outs[k].cpu(), c.want[k]);
        // fp32: cuDNN's convolutions take TF32 by ATen's default (10-bit mantissas, fp32 sums);
        // bf16: 8-bit mantissas through the whole depth of the model.
        const double tol = precision == at::kFloat ? 1e-2 : 1.5e-1;
        std::cout << "[cuda] " << stem << " " << at::toString(precision) << " output " << k
                  << ": max|diff|/max|ref| = " << rel << "\n";
        EXPECT_LE(rel, tol) << stem << " " << at::toString(precision) << " output " << k;
      }
      ++ran;
    }
  }
  EXPECT_GT(ran, 0) << "no fixture model found in " << test::fixtures_dir();
}

// Each form of a convolution on the GPU (cuDNN as given, channels-last, channels-last with the
// residual add and ReLU fused), forced on every layer in turn, agrees with PyTorch: the timed
// choice may pick any of them per layer.
TEST(ExecutorCuda, EveryConvolutionFormMatchesPyTorch) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA GPU here";
  int ran = 0;
  for (const char* stem : {"resnet18.ts", "mobilenet_v2.ts", "densenet121.ts"}) {
    Case c = load_fixture(stem);
    if (c.want.empty()) continue;
    for (const char* form : {"cudnn", "cudnn-nhwc", "cudnn-nhwc-fused,cudnn-nhwc"})
      for (at::ScalarType precision : {at::kFloat, at::kBFloat16}) {
        ::setenv("LOPPER_FORCE_KERNEL", form, 1);
        ExecOptions o;
        o.device = "cuda";
        o.precision = precision;
        Executor exec(c.model, o);
        auto outs = exec.run(c.feeds);
        ::unsetenv("LOPPER_FORCE_KERNEL");
        const double rel = test::relative_max_diff(outs.at(0).cpu(), c.want.at(0));
        std::cout << "[cuda] " << stem << " " << form << " " << at::toString(precision)
                  << ": max|diff|/max|ref| = " << rel << "\n";
        EXPECT_LE(rel, precision == at::kFloat ? 1e-2 : 1.5e-1) << stem << " " << form;
        ++ran;
      }
  }
  EXPECT_GT(ran, 0) << "no fixture model found in " << test::fixtures_dir();
}

TEST(ExecutorCuda, AutogradForwardMatchesInference) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA GPU here";
  Case c = load_fixture("small_cnn.preserve");
  if (c.want.empty()) GTEST_SKIP() << "no small_cnn.preserve fixture";
  ExecOptions infer;
  infer.device = "cuda";
  ExecOptions grad = infer;
  grad.autograd = true;
  Executor a(c.model, infer), b(c.model, grad);
  auto ya = a.run(c.feeds);
  auto yb = b.run(c.feeds);
  ASSERT_EQ(ya.size(), yb.size());
  for (size_t k = 0; k < ya.size(); ++k) {
    EXPECT_TRUE(yb[k].requires_grad() || !at::isFloatingType(yb[k].scalar_type()));
    EXPECT_LE(test::relative_max_diff(ya[k].cpu(), yb[k].detach().cpu()), 1e-2);
  }
  // The gradient reaches every float initializer on the GPU.
  yb[0].to(at::kFloat).square().sum().backward();
  int with_grad = 0;
  for (const auto& [name, p] : b.parameters())
    if (p.requires_grad()) {
      ASSERT_TRUE(p.grad().defined()) << name;
      EXPECT_EQ(p.grad().device().type(), at::kCUDA) << name;
      EXPECT_TRUE(p.grad().isfinite().all().item<bool>()) << name;
      ++with_grad;
    }
  EXPECT_GT(with_grad, 0);
}

}  // namespace
