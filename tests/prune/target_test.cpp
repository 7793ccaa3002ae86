// Pruning to a target: the measured result meets the target (params, MACs; latency reported),
// amounts differ per layer (the point of a budget), sensitivity data steers them away from the
// layers that hurt, and bad targets are one line with no output.
#include "lopper/target.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <limits>

#include "cli_refusals.h"
#include "lopper/analysis.h"
#include "lopper/data.h"
#include "lopper/error.h"
#include "lopper/npy.h"
#include "lopper/onnx_io.h"
#include "lopper/report.h"
#include "lopper/sensitivity.h"
#include "lopper/train.h"
#include "test_models.h"

namespace fs = std::filesystem;
using namespace lopper;
using namespace lopper::test;

namespace {

// A sensitivity table made by hand: layer 0 hurts from the first amount, the others barely.
SensitivityResult fake_sensitivity(const ir::Model& model) {
  const auto shapes = resolve_input_shapes(model, {}, 1);
  const EffectiveCost base = effective_cost(model, shapes);
  const ModelCost cost = analyze(model, shapes);
  SensitivityResult s;
  s.unit = "weight";
  s.loss = 1.0;
  s.params = base.params, s.macs = base.macs, s.samples = 1;
  int i = 0;
  for (const auto& pw : prunable_weights(model.graph)) {
    LayerSensitivity l;
    l.name = pw.node->label();
    l.weight = pw.weight;
    l.layers = {l.name};
    const at::Tensor& w = model.graph.find_initializer(pw.weight)->value;
    l.params = w.numel();
    for (const auto& lc : cost.layers)
      if (lc.weight == pw.weight) l.macs += lc.macs;
    for (double a : {0.25, 0.5, 0.75, 0.95}) {
      SensitivityPoint p;
      p.amount = p.removed = a;
      p.loss = s.loss + (i == 0 ? 10.0 * a : 0.01 * a);
      p.params = s.params - int64_t(a * double(l.params));
      p.macs = s.macs - int64_t(a * double(l.macs));
      l.points.push_back(p);
    }
    s.layers.push_back(l);
    ++i;
  }
  return s;
}

double sparsity_of(const ir::Model& m, const std::string& w) {
  const at::Tensor& t = m.graph.find_initializer(w)->value;
  return 1.0 - double(t.count_nonzero().item<int64_t>()) / double(t.numel());
}

}  // namespace

TEST(PruneTarget, LampMeetsParamsAndMacsWithPerLayerAmounts) {
  const ir::Model model = onnx::load_model(fixture("mlp.ts.onnx"));
  const auto shapes = resolve_input_shapes(model, {}, 1);
  const EffectiveCost base = effective_cost(model, shapes);
  for (TargetKind kind : {TargetKind::kParams, TargetKind::kMacs}) {
    ir::Model m = model;
    TargetOptions o;
    o.kind = kind;
    o.value = 0.3;
    const TargetReport r = prune_to_target(m, o);
    EXPECT_EQ(r.estimator, "lamp");
    const EffectiveCost after = effective_cost(m, shapes);
    const double got = double(kind == TargetKind::kParams ? after.params : after.macs);
    const double was = double(kind == TargetKind::kParams ? base.params : base.macs);
    EXPECT_DOUBLE_EQ(r.measured, got);
    EXPECT_LE(got, 0.3 * was);
    EXPECT_GT(got, 0.3 * was - 0.01 * was);  // not far past it
    ASSERT_EQ(r.units.size(), 3u);
    // LAMP spreads the budget unevenly: the big first layer loses more than the classifier.
    EXPECT_GT(r.units[0].amount, r.units[2].amount + 0.1);
    for (const auto& u : r.units) EXPECT_NEAR(sparsity_of(m, u.weight), u.amount, 1e-9) << u.name;
  }
  // The source model was not touched.
  EXPECT_EQ(effective_cost(model, shapes).params, base.params);
}

TEST(PruneTarget, ANonFiniteWeightIsNamedAndEmptiesNoLayer) {
  // One NaN and one Inf in the first layer: the target warns once, naming the weight; LAMP's
  // ranking stays defined (the non-finite values rank largest), so no layer is emptied.
  ir::Model m = onnx::load_model(fixture("mlp.ts.onnx"));
  const PrunableWeight first = prunable_weights(m.graph).front();
  ir::Initializer* w = m.graph.find_initializer(first.weight);
  w->value = w->value.clone();
  w->value.view(-1)[3] = std::numeric_limits<float>::quiet_NaN();
  w->value.view(-1)[7] = std::numeric_limits<float>::infinity();
  TargetOptions o;
  o.kind = TargetKind::kParams;
  o.value = 0.5;
  const TargetReport r = prune_to_target(m, o);
  ASSERT_EQ(r.warnings.size(), 1u);
  EXPECT_NE(r.warnings[0].find("'" + first.weight + "' holds 2 non-finite values"),
            std::string::npos)
      << r.warnings[0];
  for (const auto& u : r.units) EXPECT_LT(u.amount, 0.95) << u.name;
  const at::Tensor after = m.graph.find_initializer(first.weight)->value.view(-1);
  EXPECT_TRUE(std::isnan(after[3].item<float>()));
  EXPECT_TRUE(std::isinf(after[7].item<float>()));
  EXPECT_EQ(to_json(r, false)["target"]["warnings"].size(), 1u);
}

TEST(PruneTarget, SensitivitySparesTheLayerThatHurts) {
  const ir::Model model = onnx::load_model(fixture("mlp.ts.onnx"));
  const SensitivityResult s = fake_sensitivity(model);
  ir::Model m = model;
  TargetOptions o;
  o.kind = TargetKind::kParams;
  o.value = 0.5;
  o.sensitivity = &s;
  const TargetReport r = prune_to_target(m, o);
  EXPECT_EQ(r.estimator, "sensitivity");
  EXPECT_LE(r.measured, r.target);
  EXPECT_DOUBLE_EQ(r.measured, double(effective_cost(m, resolve_input_shapes(m, {}, 1)).params));
  ASSERT_EQ(r.units.size(), 3u);
  // Layer 0 costs 1000x more loss per share removed: the others go nearly as far as the data
  // goes (the last fine steps may be handed back where layer 0's coarse steps overshoot).
  EXPECT_LT(r.units[0].amount, 0.5);
  EXPECT_GT(r.units[1].amount, 0.8);
  EXPECT_GT(r.units[2].amount, 0.8);
  // Uniform pruning to the same parameter count would lose more by the same estimate.
  const double uniform =
      0.5 * double(s.params) / double(s.layers[0].params + s.layers[1].params + s.layers[2].params);
  EXPECT_LT(r.predicted_loss - r.base_loss, 10.0 * uniform);
  EXPECT_GT(r.predicted_loss, r.base_loss);
  // More than the data covers cannot be promised.
  ir::Model m2 = model;
  o.value = 0.01;
  EXPECT_THROW(prune_to_target(m2, o), Error);
  // Data from another model is refused.
  ir::Model other = onnx::load_model(fixture("small_cnn.preserve.onnx"));
  o.value = 0.5;
  EXPECT_THROW(prune_to_target(other, o), Error);
}

TEST(PruneTarget, StructuredMacsShrinkTheModel) {
  const ir::Model model = onnx::load_model(fixture("small_cnn.preserve.onnx"));
  const auto shapes = resolve_input_shapes(model, {}, 1);
  ir::Model m = model;
  TargetOptions o;
  o.structured = true;
  o.kind = TargetKind::kMacs;
  o.value = 0.5;
  const TargetReport r = prune_to_target(m, o);
  EXPECT_EQ(r.estimator, "global channel ranking");
  const ModelCost before = analyze(model, shapes), after = analyze(m, shapes);
  EXPECT_LE(double(after.macs), 0.5 * double(before.macs));
  EXPECT_GT(double(after.macs), 0.35 * double(before.macs));
  EXPECT_LT(after.params, before.params);  // really smaller, not zeros
  EXPECT_EQ(after.params, after.nonzero);
  EXPECT_FALSE(r.units.empty());
}

// A ResNet's residual Adds tie channel groups together and its convolutions share MACs between
// neighbouring groups, so the groups' savings do not add up; channel counts of 16 to 64 make the
// measured MACs jump. The allocation must still land on the target, not past it by a channel
// step's worth (it failed outright with "could not meet" before the rounds bisected and stepped
// back).
TEST(PruneTarget, StructuredSensitivityLandsOnTheTargetOfAResNet) {
  test::TempDir tmp;
  const std::string data = random_npy_data(tmp, 32, 5);
  const ir::Model model = onnx::load_model(example("resnet_fmnist.onnx"));
  LoaderOptions lo;
  lo.batch_size = 16;
  lo.shuffle = false;
  DataLoader dl(open_dataset(data), lo);
  SensitivityOptions so;
  so.structured = true;
  so.eval_batches = 2;
  const SensitivityResult s = sensitivity(model, dl, so);
  ASSERT_GE(s.layers.size(), 4u);
  const auto shapes = resolve_input_shapes(model, {}, 1);
  for (double value : {0.5, 0.7}) {
    ir::Model m = model;
    TargetOptions o;
    o.structured = true;
    o.kind = TargetKind::kMacs;
    o.value = value;
    o.sensitivity = &s;
    const TargetReport r = prune_to_target(m, o);
    const double macs = double(analyze(m, shapes).macs);
    EXPECT_DOUBLE_EQ(r.measured, macs);
    EXPECT_LE(macs, r.target) << value;
    EXPECT_GT(macs, 0.97 * r.target) << value;  // not a channel step's worth past it
  }
}

// wanda and sparsegpt: the amounts come from their own sensitivity curves, the costs the search
// measures are those the criterion's own counts give (per row, per column block), and the model
// is what prune_calibrated() makes of the chosen amounts (target_recipe()).
TEST(PruneTarget, CalibratedCriteriaPruneByTheirOwnCurvesAndCounts) {
  test::TempDir tmp;
  const std::string data = random_npy_data(tmp, 32, 21);
  const ir::Model model = onnx::load_model(fixture("small_cnn.preserve.onnx"));
  const auto shapes = resolve_input_shapes(model, {}, 1);
  auto loader = [&] {
    LoaderOptions lo;
    lo.batch_size = 4;  // the fixture's fixed batch
    lo.shuffle = false;
    return std::make_unique<DataLoader>(open_dataset(data), lo);
  };
  for (const char* method : {"wanda", "sparsegpt"}) {
    SCOPED_TRACE(method);
    TargetOptions o;
    o.kind = TargetKind::kParams;
    o.value = 0.5;
    o.criterion = method;
    SensitivityOptions so = sensitivity_options(o);
    so.eval_batches = 2;
    so.calib_batches = 4;
    const SensitivityResult s = sensitivity(model, *loader(), so);
    EXPECT_EQ(s.method, method);
    o.sensitivity = &s;
    auto calib = loader();
    o.calibration_data = calib.get();
    o.calibration.batches = 4;
    ir::Model m = model;
    const TargetReport r = prune_to_target(m, o);
    const EffectiveCost after = effective_cost(m, shapes);
    EXPECT_DOUBLE_EQ(r.measured, double(after.params));
    EXPECT_LE(r.measured, r.target);
    EXPECT_GE(r.measured, 0.98 * r.target);
    // The model is the recipe of the chosen amounts, pruned by the criterion.
    PruneLayerOptions how;
    how.criterion = method;
    const PruneRecipe rc = target_recipe(r, how);
    EXPECT_FALSE(rc.rules.empty());
    ir::Model want = model;
    auto again = loader();
    prune_calibrated(want, rc, *again, o.calibration);
    for (const auto& u : r.units)
      EXPECT_TRUE(m.graph.find_initializer(u.weight)->value.equal(
          want.graph.find_initializer(u.weight)->value))
          << u.name;
    // sparsegpt moved the weights it kept: not a mask of the original.
    if (std::string(method) == "sparsegpt") {
      const auto& u = r.units.front();
      const at::Tensor& w0 = model.graph.find_initializer(u.weight)->value;
      const at::Tensor& w1 = m.graph.find_initializer(u.weight)->value;
      if (u.amount > 0) EXPECT_FALSE(w1.equal(w0 * w1.ne(0))) << u.name;
    }
    // What it needs: its own curves, calibration data.
    ir::Model untouched = model;
    TargetOptions bad = o;
    bad.sensitivity = nullptr;
    EXPECT_THROW(prune_to_target(untouched, bad), Error);
    bad = o;
    bad.calibration_data = nullptr;
    EXPECT_THROW(prune_to_target(untouched, bad), Error);
    bad = o;
    bad.calibration.batches = 9;  // the data has 8
    EXPECT_THROW(prune_to_target(untouched, bad), Error);
    bad = o;
    bad.criterion = std::string(method) == "wanda" ? "sparsegpt" : "wanda";
    EXPECT_THROW(prune_to_target(untouched, bad), Error);  // curves of another criterion
    bad.criterion = "taylor";
    EXPECT_THROW(prune_to_target(untouched, bad), Error);
    bad.criterion = "l1";  // l1 amounts from another criterion's curves
    EXPECT_THROW(prune_to_target(untouched, bad), Error);
    EXPECT_EQ(effective_cost(untouched, shapes).params, effective_cost(model, shapes).params);
  }
}

TEST(PruneTargetCli, TargetsFromTheCommandLine) {
  test::TempDir tmp;
  const std::string in = fixture("small_cnn.preserve.onnx"), out = tmp / "p.onnx";
  const std::string data = random_npy_data(tmp, 16, 3);

  // NOTE: the CLI's default thread count follows the machine's load; the loss compared below to
  // this process's evaluate() is a float32 sum, so both run with this process's threads. Each
  // process times its own kernel choices, and two kernels round differently (Winograd's 3x3 by
  // about 1e-6 of the values): the losses agree to 1e-5, not to the last bit.
  const std::string threads = " --threads " + std::to_string(at::get_num_threads());
  auto macs =
      lopper_cli("prune " + in + " -o " + out + " --target-macs 0.6 --structured channel --data " +
                 data + " --eval-batches 2 --json" + threads);
  ASSERT_EQ(macs.code, 0) << macs.err;
  auto j = nlohmann::json::parse(macs.out);
  EXPECT_EQ(j["target"]["estimator"], "sensitivity");
  EXPECT_LE(j["macs"].get<double>(), 0.6 * j["macs_before"].get<double>());
  EXPECT_DOUBLE_EQ(j["target"]["measured"].get<double>(), j["macs"].get<double>());
  EXPECT_TRUE(j["target"].contains("loss"));
  EXPECT_TRUE(fs::exists(out + ".report.json"));
  {  // the loss measured after pruning is the pruned model's on the sensitivity's 2 batches
    LoaderOptions lo;
    lo.batch_size = 4;  // the fixture's fixed batch
    lo.shuffle = false;
    DataLoader dl(open_dataset(data), lo);
    const EvalResult e = evaluate(onnx::load_model(out), dl, EvalOptions{"cpu", at::kFloat, 2});
    EXPECT_EQ(e.samples, 8);
    EXPECT_NEAR(j["target"]["loss"]["measured"].get<double>(), e.loss, 1e-5 * std::abs(e.loss));
    EXPECT_NEAR(j["target"]["loss"]["top1_measured"].get<double>(), e.top1, 1e-12);
  }

  auto sens = lopper_cli("sensitivity " + in + " --data " + data + " --eval-batches 2 -o " +
                         (tmp / "s.json"));
  ASSERT_EQ(sens.code, 0) << sens.err;
  // wanda from the command line: its own sweep on --data, then pruned by it on the same data.
  auto wanda = lopper_cli("prune " + in + " -o " + (tmp / "w.onnx") +
                          " --target-params 0.5 --method wanda --calib-batches 4 --batch-size 4 "
                          "--eval-batches 2 --json --data " +
                          data + threads);
  ASSERT_EQ(wanda.code, 0) << wanda.err;
  auto jw = nlohmann::json::parse(wanda.out);
  EXPECT_LE(jw["nonzero"].get<double>(), 0.5 * jw["nonzero_before"].get<double>() + 1);
  EXPECT_TRUE(jw["target"].contains("loss"));
  auto params = lopper_cli("prune " + in + " -o " + (tmp / "q.onnx") +
                           " --target-params 0.5 --sensitivity " + (tmp / "s.json"));
  ASSERT_EQ(params.code, 0) << params.err;
  EXPECT_NE(params.out.find("estimator: sensitivity"), std::string::npos) << params.out;
  EXPECT_NE(params.out.find("measured"), std::string::npos);

  auto lat = lopper_cli("prune " + in + " -o " + (tmp / "l.onnx") +
                        " --target-latency-ms 1000 --structured channel --json");
  ASSERT_EQ(lat.code, 0) << lat.err;  // already within 1 s: nothing to prune
  auto jl = nlohmann::json::parse(lat.out);
  EXPECT_EQ(jl["target"]["kind"], "latency-ms");
  EXPECT_GT(jl["target"]["before"].get<double>(), 0);

  std::ofstream(tmp / "bad.json") << "{ nope";
  const std::vector<test::BadCase> cases = {
      // Out of range: usage errors, as lopper.prune_to_target's ValueError.
      {"--target-macs 1.5", 2, "in (0, 1)"},
      {"--target-params 0", 2, "in (0, 1)"},
      {"--target-latency-ms -2", 2, "must be > 0"},
      {"--target-macs 0.5 --target-params 0.5", 2, "give one target"},
      {"--target-macs 0.5 --amount 0.3", 2, "drop --amount"},
      {"--target-macs 0.5 --recipe x.yaml", 2, "drop --recipe"},
      {"--target-macs 0.5 --method random", 2, "does not go with it"},
      {"--target-macs 0.5 --method wanda", 2, "give --data SPEC"},
      {"--target-macs 0.5 --calib-batches 4 --data " + data, 2,
       "--calib-batches is for a target with --method wanda and sparsegpt"},
      {"--target-macs 0.5 --method wanda --batch-size 4 --data " + data, 1,
       "fewer than the 32 asked"},
      {"--target-macs 0.5 --method wanda --calib-batches 2 --batch-size 4 --sensitivity " +
           (tmp / "s.json") + " --data " + data,
       1, "the sensitivity data was measured with l1"},
      {"--target-macs 0.5 --owl-lambda 0.1", 2, "drop --owl-lambda"},
      {"--target-macs 0.5 --method wanda --block-size 64 --data " + data, 2,
       "--block-size is for a target with --method sparsegpt"},
      {"--target-macs 0.5 --structured head", 2,
       "takes channel, block or channel,block, got 'head'"},
      {"--target-macs 0.5 --sensitivity " + (tmp / "bad.json"), 1, "bad.json"},
      {"--target-macs 0.5 --sensitivity " + (tmp / "none.json"), 1, "none.json"},
      {"--target-macs 0.5 --structured channel --sensitivity " + (tmp / "s.json"), 1,
       "sensitivity data is per weight"},
      {"--target-params 0.01 --sensitivity " + (tmp / "s.json"), 1, "cannot reach"},
      {"--eval-batches 3 --method l1 --amount 0.5", 2, "is for --target"},
  };
  const std::string target = tmp / "never.onnx";
  test::expect_refused("prune " + in + " -o " + target, cases, {target});
  // The sweep from a file with --data: the data measures the model before and after (the
  // report's top-1 and loss), it is no longer refused.
  auto r = lopper_cli("prune " + in + " -o " + target + " --target-macs 0.5 --sensitivity " +
                      (tmp / "s.json") + " --data " + data + " --eval-batches 2 --json");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto measured = nlohmann::json::parse(r.out);
  EXPECT_TRUE(measured["target"]["loss"].contains("top1_measured")) << r.out;
  EXPECT_TRUE(measured["target"]["loss"].contains("top1_base")) << r.out;
}
