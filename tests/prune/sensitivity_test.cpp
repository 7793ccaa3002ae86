// Sensitivity analysis: each point is what pruning that one layer (or group) with `lopper prune`
// and evaluating the result gives; amount 0 is the unpruned model; costs are the pruned model's;
// the JSON round-trips; bad input is one line with no output.
#include "lopper/sensitivity.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <regex>

#include "cli_refusals.h"
#include "lopper/analysis.h"
#include "lopper/data.h"
#include "lopper/error.h"
#include "lopper/npy.h"
#include "lopper/onnx_io.h"
#include "lopper/train.h"
#include "test_models.h"

namespace fs = std::filesystem;
using namespace lopper;
using namespace lopper::test;

namespace {

// 32 random 1x28x28 samples with labels 0-9, as npy files in `tmp`; returns the spec.
std::string npy_data(const test::TempDir& tmp) { return test::random_npy_data(tmp, 32, 21); }

std::unique_ptr<DataLoader> loader(const std::string& spec) {
  LoaderOptions lo;
  lo.batch_size = 4;  // the fixtures' fixed batch
  lo.shuffle = false;
  return std::make_unique<DataLoader>(open_dataset(spec), lo);
}

std::string escape(const std::string& s) {
  return std::regex_replace(s, std::regex(R"([.^$|()\[\]{}*+?\\/])"), R"(\$&)");
}

}  // namespace

TEST(Sensitivity, EachPointIsThatLayerPrunedAlone) {
  test::TempDir tmp;
  const std::string data = npy_data(tmp);
  const ir::Model model = onnx::load_model(fixture("small_cnn.preserve.onnx"));
  SensitivityOptions o;
  o.amounts = {0.0, 0.5, 0.9};
  o.eval_batches = 8;  // all 32 samples
  // The progress: the plan first (step 0, the whole count), then every evaluated batch.
  int64_t calls = 0, last_total = 0, planned = -1, points = 0;
  std::string plan;
  o.progress = [&](int64_t done, int64_t total, const std::string& what) {
    if (done == 0) {
      EXPECT_EQ(calls, 0);
      plan = what, planned = total;
      return;
    }
    EXPECT_EQ(done, ++calls);
    EXPECT_NE(what.find(": batch "), std::string::npos) << what;
    points += what.find(" @ ") != std::string::npos;
    last_total = total;
  };
  auto dl = loader(data);
  const SensitivityResult r = sensitivity(model, *dl, o);
  EXPECT_EQ(r.unit, "weight");
  EXPECT_EQ(r.samples, 32);
  ASSERT_EQ(r.layers.size(), prunable_weights(model.graph).size());
  EXPECT_EQ(calls, int64_t((1 + r.layers.size() * 3) * 8));  // the unpruned model, each point
  EXPECT_EQ(points, int64_t(r.layers.size() * 3 * 8));
  EXPECT_EQ(last_total, calls);
  EXPECT_EQ(planned, calls);
  EXPECT_NE(plan.find(std::to_string(r.layers.size()) + " layers x 3 amounts"), std::string::npos)
      << plan;

  const EvalResult base = evaluate(model, *loader(data));
  EXPECT_NEAR(r.loss, base.loss, 1e-5);
  EXPECT_DOUBLE_EQ(r.top1, base.top1);
  const auto shapes = resolve_input_shapes(model, {}, 1);
  int moved = 0;  // layers whose 90% point changed the loss: the pruning took effect
  for (const auto& l : r.layers) {
    ASSERT_EQ(l.points.size(), 3u);
    moved += std::abs(l.points[2].loss - r.loss) > 1e-4;
    EXPECT_DOUBLE_EQ(l.points[0].loss, r.loss) << l.name;  // amount 0: the model as it is
    EXPECT_EQ(l.points[0].params, r.params);
    EXPECT_LT(l.points[1].removed, l.points[2].removed);
    for (size_t i = 1; i < 3; ++i) {
      const SensitivityPoint& p = l.points[i];
      EXPECT_NEAR(p.removed, p.amount, 1.0 / double(l.params)) << l.name;
      // The same layer pruned by `prune` with a one-rule recipe, then evaluated like `lopper eval`.
      ir::Model pruned = model;
      PruneRecipe rc =
          parse_prune_recipe("rules:\n  - {match: '^" + escape(l.weight) +
                                 "$', method: l1, amount: " + std::to_string(p.amount) + "}\n",
                             "test");
      prune(pruned, rc);
      const EvalResult e = evaluate(pruned, *loader(data));
      EXPECT_NEAR(p.loss, e.loss, 1e-4 * std::max(1.0, e.loss)) << l.name << " @ " << p.amount;
      EXPECT_DOUBLE_EQ(p.top1, e.top1) << l.name << " @ " << p.amount;
      const EffectiveCost c = effective_cost(pruned, shapes);
      EXPECT_EQ(p.params, c.params) << l.name;
      EXPECT_NEAR(double(p.macs), double(c.macs), 2.0) << l.name;
    }
  }
  EXPECT_EQ(moved, int(r.layers.size()));
  // The JSON round-trips; anything else is refused naming its source.
  const SensitivityResult back = parse_sensitivity(sensitivity_json(r), "s.json");
  ASSERT_EQ(back.layers.size(), r.layers.size());
  EXPECT_EQ(back.layers[1].weight, r.layers[1].weight);
  EXPECT_DOUBLE_EQ(back.layers[1].points[2].loss, r.layers[1].points[2].loss);
  EXPECT_EQ(back.layers[1].points[2].macs, r.layers[1].points[2].macs);
  EXPECT_EQ(back.macs, r.macs);
  for (const char* bad : {"{", "{}", R"({"format": "lopper.sensitivity/1", "unit": "weight"})"}) {
    try {
      parse_sensitivity(bad, "bad.json");
      ADD_FAILURE() << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("bad.json"), std::string::npos) << e.what();
    }
  }
}

// wanda and sparsegpt: each point is that one layer pruned by prune_calibrated() with a one-rule
// recipe (its inputs are the unpruned model's: the layers before it stay), then evaluated; the
// layers' inputs are collected first, and the progress counts those batches too.
TEST(Sensitivity, CalibratedPointsArePruneCalibratedOnThatLayerAlone) {
  test::TempDir tmp;
  const std::string data = npy_data(tmp);
  const ir::Model model = onnx::load_model(fixture("small_cnn.preserve.onnx"));
  for (const char* method : {"wanda", "sparsegpt"}) {
    SCOPED_TRACE(method);
    SensitivityOptions o;
    o.criterion = method;
    o.amounts = {0.5, 0.9};
    o.eval_batches = 8;
    o.calib_batches = 6;
    int64_t calls = 0, calibration = 0, last_total = 0;
    o.progress = [&](int64_t done, int64_t total, const std::string& what) {
      if (done == 0) {  // the plan
        EXPECT_NE(what.find("after 6 calibration batches"), std::string::npos) << what;
        return;
      }
      EXPECT_EQ(done, ++calls);
      calibration += what.rfind("calibration", 0) == 0;
      last_total = total;
    };
    const SensitivityResult r = sensitivity(model, *loader(data), o);
    EXPECT_EQ(r.method, method);
    ASSERT_EQ(r.layers.size(), prunable_weights(model.graph).size());
    EXPECT_TRUE(r.skipped.empty());
    EXPECT_EQ(calibration, 6);
    EXPECT_EQ(last_total, calls);
    EXPECT_EQ(calls, 6 + int64_t((1 + r.layers.size() * 2) * 8));
    for (const auto& l : r.layers) {
      for (const auto& p : l.points) {
        ir::Model pruned = model;
        PruneRecipe rc = parse_prune_recipe("rules:\n  - {match: '^" + escape(l.weight) +
                                                "$', method: " + method +
                                                ", amount: " + std::to_string(p.amount) + "}\n",
                                            "test");
        CalibrationOptions co;
        co.batches = 6;
        auto dl = loader(data);
        prune_calibrated(pruned, rc, *dl, co);
        const EvalResult e = evaluate(pruned, *loader(data));
        EXPECT_NEAR(p.loss, e.loss, 1e-4 * std::max(1.0, e.loss)) << l.name << " @ " << p.amount;
        EXPECT_NEAR(p.top1, e.top1, 1.0 / 32 + 1e-9) << l.name << " @ " << p.amount;
        EXPECT_NEAR(p.removed, p.amount, 0.5 / 9 + 1e-9) << l.name;  // per row: the Conv's 9
      }
    }
  }
}

TEST(Sensitivity, ChannelGroupsShrinkTheModelPerPoint) {
  test::TempDir tmp;
  const std::string data = npy_data(tmp);
  const ir::Model model = onnx::load_model(fixture("small_cnn.preserve.onnx"));
  SensitivityOptions o;
  o.structured = true;
  o.amounts = {0.25, 0.5};
  o.eval_batches = 8;
  const SensitivityResult r = sensitivity(model, *loader(data), o);
  EXPECT_EQ(r.unit, "channel");
  const StructuredReport groups = channel_groups(model);
  int64_t prunable = 0;
  for (const auto& g : groups.groups) prunable += g.blocked.empty();
  ASSERT_EQ(int64_t(r.layers.size()), prunable);
  const auto shapes = resolve_input_shapes(model, {}, 1);
  for (const auto& l : r.layers) {
    ASSERT_GE(l.group, 0);
    EXPECT_GT(l.macs, 0) << l.name;
    for (const auto& p : l.points) {
      StructuredOptions so;
      so.group_amounts = {{l.group, p.amount}};
      ir::Model pruned = model;
      const StructuredReport pr = prune_structured(pruned, so);
      const auto& g = pr.groups.at(size_t(l.group));
      EXPECT_NEAR(p.removed, 1.0 - double(g.size_after) / double(g.size_before), 1e-12);
      EXPECT_GT(p.removed, 0) << l.name;
      for (const auto& other : pr.groups)  // only this group shrank
        if (other.id != l.group) EXPECT_EQ(other.size_after, other.size_before) << l.name;
      const EvalResult e = evaluate(pruned, *loader(data));
      EXPECT_NEAR(p.loss, e.loss, 1e-4 * std::max(1.0, e.loss)) << l.name;
      EXPECT_DOUBLE_EQ(p.top1, e.top1) << l.name;
      const EffectiveCost c = effective_cost(pruned, shapes);
      EXPECT_EQ(p.params, c.params);
      EXPECT_EQ(p.macs, c.macs);
      EXPECT_LT(p.macs, r.macs);
    }
  }
}

TEST(SensitivityCli, PrintsWritesAndRefusesBadInput) {
  test::TempDir tmp;
  const std::string data = npy_data(tmp);
  const std::string in = fixture("small_cnn.preserve.onnx"), out = tmp / "s.json";
  auto ok = lopper_cli("sensitivity " + in + " --data " + data +
                       " --amounts 0.5,0.9 --eval-batches 2 -o " + out);
  ASSERT_EQ(ok.code, 0) << ok.err;
  EXPECT_NE(ok.out.find("top-1 with one layer pruned alone"), std::string::npos) << ok.out;
  EXPECT_NE(ok.err.find("sensitivity"), std::string::npos);  // progress
  const SensitivityResult r = parse_sensitivity(test::slurp(out), out);
  EXPECT_EQ(r.samples, 8);
  EXPECT_EQ(r.layers.front().points.size(), 2u);
  auto js = lopper_cli("sensitivity " + in + " --data " + data +
                       " --structured channel --method l2 --amounts 0.5 --eval-batches 1 --json");
  ASSERT_EQ(js.code, 0) << js.err;
  EXPECT_EQ(parse_sensitivity(js.out, "stdout").unit, "channel");

  const std::vector<test::BadCase> cases = {
      {"--amounts 0.5,abc", 2, "'abc' is not a number"},
      {"--amounts 1.5", 2, "every amount must be in [0, 1)"},
      {"--amounts ''", 2, "lists no amount"},
      {"--eval-batches 0", 2, "--eval-batches must be > 0"},
      {"--structured rows", 2, "--structured takes channel"},
      {"--structured channel --allow-tied", 2, "--allow-tied is for single weights"},
      {"--method taylor", 2, "--method must be l1, random, wanda or sparsegpt"},
      {"--method wanda --structured channel", 2, "unknown structured method 'wanda'"},
      {"--method wanda --calib-batches 9", 1, "has 8 batches, --calib-batches asks for 9"},
      {"--method sparsegpt --dampening 0", 2, "--dampening must be > 0"},
      {"--calib-batches 2", 2, "--calib-batches is for --method wanda and sparsegpt"},
      {"--method wanda --block-size 64", 2, "--block-size is for --method sparsegpt, not wanda"},
      {"--structured channel --method taylor", 2, "taylor and activation would calibrate again"},
      {"--method nope", 2, "nope"},
      {"--exclude 'Conv|Gemm'", 1, "no prunable layer"},
      {"--device cuda:7", 1, "CUDA"},
  };
  const std::string target = tmp / "bad.json";
  test::expect_refused("sensitivity " + in + " --data " + data + " -o " + target, cases, {target});
  auto missing = lopper_cli("sensitivity " + in + " --data npy:" + (tmp / "none.npy") + "," +
                            (tmp / "none.npy"));
  EXPECT_EQ(missing.code, 1);
  auto same = lopper_cli("sensitivity " + in + " --data " + data + " -o " + in);
  EXPECT_EQ(same.code, 2) << same.err;
}
