// Calibration for grad/taylor: saliencies accumulate over batches as documented (grad: the mean of
// |dL/dw|, taylor: the sum of |w * dL/dw|), from a real exported model on .npy data.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "lopper/data.h"
#include "lopper/error.h"
#include "lopper/npy.h"
#include "lopper/onnx_io.h"
#include "lopper/prune.h"
#include "test_util.h"

using namespace lopper;

namespace {

Saliency calibrate(const ir::Model& m, const at::Tensor& x, const at::Tensor& y,
                   const test::TempDir& tmp, const std::string& stem, int64_t batches) {
  std::string xs = tmp / (stem + "_x.npy"), ys = tmp / (stem + "_y.npy");
  save_npy(x, xs);
  save_npy(y, ys);
  LoaderOptions lo;
  lo.batch_size = 4;  // the fixture's fixed batch
  lo.shuffle = false;
  DataLoader loader(open_dataset("npy:" + xs + "," + ys), lo);
  CalibrationOptions co;
  co.batches = batches;
  int64_t calls = 0;
  co.progress = [&](int64_t b, int64_t of, double) {
    EXPECT_EQ(b, ++calls);
    EXPECT_EQ(of, batches);
  };
  Saliency s = compute_saliency(m, loader, co);
  EXPECT_EQ(calls, batches);
  return s;
}

}  // namespace

TEST(PruneCalibration, SaliencyAccumulatesOverBatches) {
  ir::Model m = onnx::load_model(test::fixture("mlp.ts.onnx"));
  test::TempDir tmp;
  at::manual_seed(4);
  at::Tensor x = at::rand({8, 1, 28, 28});
  at::Tensor y = at::randint(0, 10, {8}, at::kLong);
  Saliency both = calibrate(m, x, y, tmp, "both", 2);
  Saliency first = calibrate(m, x.slice(0, 0, 4), y.slice(0, 0, 4), tmp, "first", 1);
  Saliency second = calibrate(m, x.slice(0, 4), y.slice(0, 4), tmp, "second", 1);
  EXPECT_EQ(both.batches, 2);
  EXPECT_EQ(both.samples, 8);
  ASSERT_EQ(both.scores.at("grad").size(), 3u);  // the three Gemm weights, not the biases
  for (const auto& [name, g] : both.scores.at("grad")) {
    at::Tensor want_g = (first.scores.at("grad").at(name) + second.scores.at("grad").at(name)) / 2;
    at::Tensor want_t = first.scores.at("taylor").at(name) + second.scores.at("taylor").at(name);
    EXPECT_TRUE(at::allclose(g, want_g, 1e-5, 1e-8)) << name;
    EXPECT_TRUE(at::allclose(both.scores.at("taylor").at(name), want_t, 1e-5, 1e-8)) << name;
    EXPECT_GT(g.count_nonzero().item<int64_t>(), 0) << name;
    // taylor is |w * g| per batch: zero where the weight is zero.
    const ir::Initializer* w = m.graph.find_initializer(name);
    ASSERT_NE(w, nullptr);
    EXPECT_TRUE(at::allclose(first.scores.at("taylor").at(name),
                             (w->value * first.scores.at("grad").at(name)).abs(), 1e-5, 1e-8))
        << name;
  }
  EXPECT_NEAR(both.loss, (first.loss + second.loss) / 2, 1e-5);
}

TEST(PruneCalibration, LabelsBeyondTheOutputsAreAnError) {
  ir::Model m = onnx::load_model(test::fixture("mlp.ts.onnx"));
  test::TempDir tmp;
  at::Tensor y = at::full({4}, 12, at::kLong);  // the model has 10 outputs
  try {
    calibrate(m, at::rand({4, 1, 28, 28}), y, tmp, "bad", 1);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("label 12"), std::string::npos) << e.what();
  }
}
