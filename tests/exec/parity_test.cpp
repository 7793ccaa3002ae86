// Parity with PyTorch on real models: every model tests/fixtures/make_models.py exported (both
// exporters, BatchNorm folded and kept) runs in lopper with max |diff| <= 1e-4 * max |reference|,
// and import -> export -> import is stable.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "lopper/executor.h"
#include "lopper/onnx_io.h"
#include "test_models.h"

namespace fs = std::filesystem;
using namespace lopper;

namespace {

std::vector<std::string> fixture_models() {
  std::vector<std::string> out;
  if (!fs::exists(test::fixtures_dir())) return out;
  for (const auto& e : fs::directory_iterator(test::fixtures_dir())) {
    std::string f = e.path().filename().string();
    if (f.size() > 5 && f.substr(f.size() - 5) == ".onnx") out.push_back(f.substr(0, f.size() - 5));
  }
  std::sort(out.begin(), out.end());
  return out;
}

class Parity : public ::testing::TestWithParam<std::string> {};

TEST_P(Parity, MatchesPyTorch) {
  configure_threads(0);
  const std::string stem = GetParam();  // e.g. resnet18.dynamo
  test::FixtureCase c = test::load_fixture(stem);
  ASSERT_FALSE(c.want.empty()) << "no metadata for " << stem;
  const ir::Model& model = c.model;
  const NamedTensors& feeds = c.feeds;
  Executor exec(model);
  auto outs = exec.run(feeds);
  ASSERT_GE(outs.size(), c.want.size());
  for (size_t k = 0; k < c.want.size(); ++k) {
    const at::Tensor& want = c.want[k];
    ASSERT_EQ(outs[k].sizes(), want.sizes()) << stem << " output " << k;
    double rel = test::relative_max_diff(outs[k], want);
    EXPECT_LE(rel, 1e-4) << stem << " output " << k << ": max|diff|/max|ref| = " << rel;
  }

  // Import -> export -> import is the identity: the second export is byte for byte the first,
  // and the outputs agree to rounding: each executor picks its kernels by timing them, and BLAS and
  // oneDNN sum a 25088-long dot product (vgg's first linear layer) in different orders (seen:
  // 1.1e-6 relative).
  std::string bytes = onnx::serialize_model(model);
  ir::Model again = onnx::parse_model(bytes.data(), bytes.size(), test::fixtures_dir());
  EXPECT_EQ(onnx::serialize_model(again), bytes) << stem << ": export is not stable";
  Executor exec2(again);
  auto outs2 = exec2.run(feeds);
  ASSERT_EQ(outs2.size(), outs.size());
  for (size_t k = 0; k < outs.size(); ++k)
    EXPECT_LE(test::relative_max_diff(outs2[k], outs[k]), 1e-5)
        << stem << ": output " << k << " changed after export";
}

INSTANTIATE_TEST_SUITE_P(Models, Parity, ::testing::ValuesIn(fixture_models()),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (char& ch : s)
                             if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return s;
                         });

TEST(ParityFixtures, Present) {
  // The models must be there (made by the 'fixtures' ctest step), or parity silently tests nothing.
  EXPECT_GE(fixture_models().size(), 20u)
      << "run tests/fixtures/make_models.py " << test::fixtures_dir();
}

}  // namespace
