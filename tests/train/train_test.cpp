// Training: the pruning schedules land where they say, checkpoints resume to the same weights,
// regularisers shrink what they target, evaluation counts right; and `lopper train`/`eval` on the
// command line, bad input included. (Step-for-step parity with PyTorch:
// tests/python/check_training.py.)
#include "lopper/train.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "lopper/data.h"
#include "lopper/error.h"
#include "lopper/executor.h"
#include "lopper/npy.h"
#include "lopper/onnx_io.h"
#include "test_models.h"
#include "train/loss_scaler.h"

namespace fs = std::filesystem;
using namespace lopper;
using namespace lopper::test;

namespace {

// 64 random 1x28x28 samples with labels 0-9, as npy files in `tmp`; returns the spec.
std::string npy_data(const test::TempDir& tmp, int64_t n = 64) {
  return random_npy_data(tmp, n, 11);
}

std::unique_ptr<DataLoader> loader(const std::string& spec, int64_t batch = 4) {
  LoaderOptions lo;
  lo.batch_size = batch;
  lo.seed = 5;
  return std::make_unique<DataLoader>(open_dataset(spec), lo);
}

// `epochs` at lr 0.01, pruning by l1 (global) on the AGP ramp from epoch 0 to `end` to `amount`.
TrainOptions agp_l1(int64_t epochs, double amount, int64_t end) {
  TrainOptions o;
  o.epochs = epochs;
  o.lr = 0.01;
  o.schedule = PruneSchedule::kAgp;
  o.prune.criterion = "l1";
  o.prune.scope = PruneScope::kGlobal;
  o.prune.amount = PruneAmount{amount, false};
  o.start_epoch = 0;
  o.end_epoch = end;
  return o;
}

// Two iterative rounds of one epoch each at lr 0.01 (what the round prunes is the test's).
TrainOptions two_rounds() {
  TrainOptions o;
  o.epochs = 2;
  o.lr = 0.01;
  o.schedule = PruneSchedule::kIterative;
  o.rounds = 2;
  o.epochs_per_round = 1;
  return o;
}

}  // namespace

TEST(TrainSchedule, AgpFollowsTheCubicRamp) {
  EXPECT_DOUBLE_EQ(agp_sparsity(0, 0.8, 0, 0, 3), 0);
  EXPECT_NEAR(agp_sparsity(0, 0.8, 1, 0, 3), 0.8 * (1 - std::pow(2.0 / 3, 3)), 1e-12);
  EXPECT_DOUBLE_EQ(agp_sparsity(0.1, 0.8, 5, 0, 3), 0.8);
  test::TempDir tmp;
  std::string data = npy_data(tmp);
  ir::Model m = onnx::load_model(fixture("mlp.ts.onnx"));
  TrainOptions o = agp_l1(4, 0.8, 3);
  auto dl = loader(data);
  TrainResult r = train(m, *dl, o);
  ASSERT_EQ(r.epochs.size(), 4u);
  // Pruned at the start of epochs 1, 2, 3 (0-based) to the ramp's value there.
  EXPECT_NEAR(r.epochs[0].sparsity, 0.0, 1e-9);
  EXPECT_NEAR(r.epochs[1].sparsity, agp_sparsity(0, 0.8, 1, 0, 3), 1e-4);
  EXPECT_NEAR(r.epochs[2].sparsity, agp_sparsity(0, 0.8, 2, 0, 3), 1e-4);
  EXPECT_NEAR(r.epochs[3].sparsity, 0.8, 1e-4);
  EXPECT_NEAR(prunable_sparsity(m), 0.8, 1e-4);
  EXPECT_EQ(r.notes.size(), 3u);
}

TEST(TrainSchedule, TiedWeightsFollowThePrunePolicy) {
  // The schedule's prune() leaves a tied weight alone (allow_tied off): the ramp reaches its
  // target on the weights it prunes, not by emptying them to make up for the tie.
  test::TempDir tmp;
  std::string data = npy_data(tmp, 16);
  for (bool allow : {false, true}) {
    ir::Model m = tied_classifier();
    TrainOptions o = agp_l1(3, 0.6, 2);
    o.prune.allow_tied = allow;
    TrainResult r = train(m, *loader(data), o);
    ASSERT_EQ(r.epochs.size(), 3u);
    EXPECT_NEAR(r.epochs.back().sparsity, 0.6, 1e-3) << allow;
    const at::Tensor& w1 = init(m, "w1");
    const at::Tensor& e = init(m, "E");
    const double w1_sparsity =
        1.0 - double(w1.count_nonzero().item<int64_t>()) / double(w1.numel());
    if (allow) {
      EXPECT_NEAR(prunable_sparsity(m), 0.6, 1e-3);
    } else {
      EXPECT_NEAR(w1_sparsity, 0.6, 1e-3);
      EXPECT_EQ(e.count_nonzero().item<int64_t>(), e.numel());
    }
  }
}

TEST(TrainSchedule, IterativePrunesTheSameShareEachRound) {
  test::TempDir tmp;
  std::string data = npy_data(tmp);
  for (const char* method : {"l1", "taylor"}) {
    ir::Model m = onnx::load_model(fixture("mlp.ts.onnx"));
    TrainOptions o = two_rounds();
    o.prune.criterion = method;
    o.prune.scope = PruneScope::kGlobal;
    o.prune.amount = PruneAmount{0.75, false};
    auto dl = loader(data);
    TrainResult r = train(m, *dl, o);
    EXPECT_NEAR(r.epochs[0].sparsity, 0.5, 1e-4) << method;  // 1 - 0.25^(1/2)
    EXPECT_NEAR(r.epochs[1].sparsity, 0.75, 1e-4) << method;
  }
}

TEST(TrainCheckpoint, ResumingGivesTheSameWeights) {
  test::TempDir tmp;
  std::string data = npy_data(tmp);
  TrainOptions o;
  o.epochs = 3;
  o.lr = 0.02;
  o.optimizer = Optimizer::kAdam;
  ir::Model straight = onnx::load_model(fixture("small_cnn.preserve.onnx"));
  auto dl = loader(data);
  train(straight, *dl, o);

  ir::Model first = onnx::load_model(fixture("small_cnn.preserve.onnx"));
  TrainOptions two = o;
  two.epochs = 2;
  two.checkpoint_dir = tmp / "ckpt";
  dl = loader(data);
  train(first, *dl, two);
  // DIR/epoch-N/ per checkpoint, DIR/latest names the newest; the older one and every temporary
  // are gone.
  ASSERT_TRUE(fs::exists(tmp / "ckpt/epoch-2/model.onnx"));
  EXPECT_EQ(test::slurp(tmp / "ckpt/latest"), "epoch-2\n");
  EXPECT_TRUE(fs::exists(tmp / "ckpt/.lopper-checkpoint"));
  size_t entries = 0;
  for (const auto& e : fs::directory_iterator(tmp / "ckpt")) entries += e.exists();
  EXPECT_EQ(entries, 3u);  // .lopper-checkpoint, latest, epoch-2

  ir::Model resumed = onnx::load_model(fixture("small_cnn.preserve.onnx"));
  TrainOptions rest = o;
  rest.resume = tmp / "ckpt";
  dl = loader(data);
  TrainResult r = train(resumed, *dl, rest);
  ASSERT_EQ(r.epochs.size(), 1u);
  EXPECT_EQ(r.epochs[0].epoch, 3);
  for (const auto& init : straight.graph.initializers) {
    const ir::Initializer* other = resumed.graph.find_initializer(init.name);
    ASSERT_NE(other, nullptr) << init.name;
    EXPECT_TRUE(at::allclose(init.value, other->value, 1e-6, 1e-7)) << init.name;
  }
  // A checkpoint written with another optimiser is refused.
  rest.optimizer = Optimizer::kSgd;
  dl = loader(data);
  ir::Model again = onnx::load_model(fixture("small_cnn.preserve.onnx"));
  EXPECT_THROW(train(again, *dl, rest), Error);
}

TEST(TrainRegularisers, ShrinkWhatTheyTarget) {
  test::TempDir tmp;
  std::string data = npy_data(tmp);
  auto run = [&](double l1, double bn_l1, double group) {
    ir::Model m = onnx::load_model(fixture("small_cnn.preserve.onnx"));
    TrainOptions o;
    o.epochs = 2;
    o.lr = 0.02;
    o.l1 = l1;
    o.bn_l1 = bn_l1;
    o.group_lasso = group;
    auto dl = loader(data);
    train(m, *dl, o);
    return m;
  };
  auto sum_abs = [](const ir::Model& m, const std::string& name) {
    return m.graph.find_initializer(name)->value.abs().sum().item<double>();
  };
  ir::Model plain = run(0, 0, 0), l1 = run(1e-3, 0, 0), bn = run(0, 1e-2, 0), gl = run(0, 0, 1e-2);
  EXPECT_LT(sum_abs(l1, "9.weight"), sum_abs(plain, "9.weight"));
  EXPECT_LT(sum_abs(bn, "1.weight"), sum_abs(plain, "1.weight"));  // BatchNorm gamma
  EXPECT_NEAR(sum_abs(bn, "9.weight"), sum_abs(plain, "9.weight"),
              0.05 * sum_abs(plain, "9.weight"));  // bn-l1 leaves the weights mostly alone
  auto row_norms = [](const ir::Model& m) {
    return m.graph.find_initializer("9.weight")->value.norm(2, {1}).sum().item<double>();
  };
  EXPECT_LT(row_norms(gl), row_norms(plain));
}

TEST(TrainEval, CountsTopOneTopFiveAndPerClass) {
  test::TempDir tmp;
  std::string data = npy_data(tmp, 40);
  ir::Model m = onnx::load_model(fixture("mlp.ts.onnx"));
  LoaderOptions lo;
  lo.batch_size = 4;
  lo.shuffle = false;
  DataLoader dl(open_dataset(data), lo);
  EvalResult r = evaluate(m, dl);
  EXPECT_EQ(r.samples, 40);
  EXPECT_GE(r.top5, r.top1);
  int64_t counted = 0;
  double hits = 0;
  for (size_t c = 0; c < r.per_class.size(); ++c) {
    counted += r.per_class_count[c];
    if (r.per_class_count[c]) hits += r.per_class[c] * double(r.per_class_count[c]);
  }
  EXPECT_EQ(counted, 40);
  EXPECT_NEAR(hits / 40, r.top1, 1e-9);
}

// The module buffers lopper.export_onnx lists in the metadata (RoPE's inv_freq) are not trained, as
// PyTorch's optimisers do not see them; a list that is not JSON is one line.
TEST(TrainBuffers, TheMetadataListIsNotTrained) {
  test::TempDir tmp;
  const std::string data = npy_data(tmp);
  ir::Model m = onnx::load_model(fixture("mlp.ts.onnx"));
  const ir::Model before = m;
  m.metadata_props.push_back({"lopper.buffers", R"(["3.weight", "3.bias"])"});
  TrainOptions o;
  o.epochs = 1;
  auto dl = loader(data);
  train(m, *dl, o);
  EXPECT_TRUE(at::equal(init(m, "3.weight"), init(before, "3.weight")));
  EXPECT_TRUE(at::equal(init(m, "3.bias"), init(before, "3.bias")));
  EXPECT_FALSE(at::equal(init(m, "1.weight"), init(before, "1.weight")));
  EXPECT_FALSE(at::equal(init(m, "5.weight"), init(before, "5.weight")));
  ir::Model bad = before;
  bad.metadata_props.push_back({"lopper.buffers", "3.weight"});
  auto dl2 = loader(data);
  EXPECT_NE(error_of([&] {
              train(bad, *dl2, o);
            }).find("the model's metadata 'lopper.buffers' is not a JSON list of names"),
            std::string::npos);
}

TEST(TrainCli, TrainsFinetunesAndEvaluates) {
  test::TempDir tmp;
  std::string data = npy_data(tmp);
  std::string out = tmp / "t.onnx";
  auto r = lopper_cli("train " + fixture("mlp.ts.onnx") + " --data " + data + " -o " + out +
                      " --epochs 2 --schedule agp --prune-method l1 --prune-amount 0.5"
                      " --start-epoch 0 --end-epoch 1");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(lines(r.err), 4) << r.err;  // header, a pruning event, one line per epoch
  EXPECT_EQ(r.err.find('\r'), std::string::npos);
  auto j = nlohmann::json::parse(slurp(out + ".train.json"));
  EXPECT_NEAR(j["sparsity"].get<double>(), 0.5, 1e-3);
  EXPECT_EQ(j["epochs"].size(), 2u);
  auto f = lopper_cli("finetune " + out + " --data " + data + " -o " + (tmp / "f.onnx"));
  ASSERT_EQ(f.code, 0) << f.err;
  auto fj = nlohmann::json::parse(slurp(tmp / "f.onnx.train.json"));
  EXPECT_EQ(fj["epochs"].size(), 3u);  // finetune's default
  EXPECT_NEAR(fj["epochs"][0]["lr"].get<double>(), 0.001, 1e-12);
  EXPECT_NEAR(fj["sparsity"].get<double>(), 0.5, 1e-3);  // the zeros held
  auto e = lopper_cli("eval " + (tmp / "f.onnx") + " --data " + data + " --json");
  ASSERT_EQ(e.code, 0) << e.err;
  auto ej = nlohmann::json::parse(e.out);
  EXPECT_EQ(ej["samples"].get<int64_t>(), 64);
  EXPECT_GE(ej["top1"].get<double>(), 0.0);
  EXPECT_EQ(ej["per_class"].size(), 10u);
}

// AGP with a block pattern: every pruning event removes whole 8x1 blocks (ranked across layers,
// the default global scope), and training keeps them whole.
TEST(TrainCli, AgpWithABlockPatternKeepsWholeBlocks) {
  test::TempDir tmp;
  std::string out = tmp / "t.onnx";
  auto r =
      lopper_cli("train " + fixture("mlp.ts.onnx") + " --data " + npy_data(tmp) + " -o " + out +
                 " --epochs 3 --schedule agp --prune-method l1 --prune-amount 0.8"
                 " --prune-pattern block:8x1 --start-epoch 0 --end-epoch 2");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("l1 global"), std::string::npos) << r.err;
  auto j = nlohmann::json::parse(slurp(out + ".train.json"));
  EXPECT_NEAR(j["sparsity"].get<double>(), 0.8, 2e-3);
  ir::Model m = onnx::load_model(out);
  for (std::string name : {"1.weight", "3.weight", "5.weight"}) {
    at::Tensor zero = m.graph.find_initializer(name)->value.eq(0);  // Gemm transB=1: [N, K]
    for (int64_t i = 0; i < zero.size(0); i += 8) {
      at::Tensor stripe = zero.slice(0, i, i + 8);
      EXPECT_TRUE(at::equal(stripe.all(0), stripe.any(0))) << name << " rows " << i;
    }
  }
}

TEST(TrainCli, BadInputIsOneLineAndNoOutput) {
  test::TempDir tmp;
  std::string data = npy_data(tmp);
  std::string in = fixture("mlp.ts.onnx"), out = tmp / "t.onnx";
  struct Case {
    std::string args;
    int code;
    std::string needle;
  } cases[] = {
      {"--data " + data + " --epochs 0", 2, "--epochs must be > 0"},
      {"--data " + data + " --lr -1", 2, "--lr must be > 0"},
      {"--data " + data + " --optimizer rmsprop", 2, "unknown optimizer"},
      {"--data " + data + " --lr-schedule linear", 2, "unknown --lr-schedule"},
      {"--data " + data + " --schedule agp", 2, "needs --prune-method"},
      {"--data " + data + " --prune-structured channel", 2, "need --schedule"},
      {"--data " + data + " --allow-tied", 2, "--allow-tied need --schedule"},
      {"--data " + data +
           " --schedule agp --prune-method l1 --prune-amount 0.5 --end-epoch 1"
           " --prune-structured rows",
       2, "--prune-structured takes channel or head"},
      {"--data " + data +
           " --schedule agp --prune-method abs --prune-amount 0.5 --end-epoch 1"
           " --prune-structured channel",
       2, "unknown structured method"},
      {"--data " + data + " --schedule wavy --prune-method l1 --prune-amount 0.5", 2,
       "unknown --schedule"},
      {"--data " + data + " --schedule agp --prune-method l1 --prune-amount 1.5", 2, "amount"},
      {"--data " + data + " --schedule agp --prune-method l1 --prune-amount 0.5 --end-epoch 20", 2,
       "--end-epoch"},
      {"--data " + data +
           " --schedule agp --prune-method l1 --prune-amount 0.5 --end-epoch 2"
           " --every soon",
       2, "--every"},
      {"--data " + data + " --schedule iterative --prune-method l1 --prune-amount 0.5", 2,
       "--rounds"},
      {"--data " + data + " --prune-method l1", 2, "--schedule"},
      {"--data " + data + " --resume " + (tmp / "nothing"), 1, "not a checkpoint"},
      {"--data cifar10:" + (tmp / "none"), 1, "no such file"},
      {"--data " + data + " --freeze '('", 1, "--freeze"},
      {"--data " + data + " --precision fp8", 2, "bad precision 'fp8'"},
      {"--data " + data + " --precision fp16", 2, "fp16 needs a CUDA device"},
  };
  for (const auto& c : cases) {
    auto r = lopper_cli("train " + in + " -o " + out + " " + c.args);
    EXPECT_EQ(r.code, c.code) << c.args << ": " << r.err;
    EXPECT_NE(r.err.find(c.needle), std::string::npos) << c.args << ": " << r.err;
    EXPECT_EQ(r.err.find("lopper: "), r.err.rfind("lopper: ")) << c.args << ": " << r.err;
    EXPECT_FALSE(fs::exists(out)) << c.args;
  }
  auto same = lopper_cli("train " + in + " -o " + in + " --data " + data);
  EXPECT_EQ(same.code, 2) << same.err;
  auto ev = lopper_cli("eval " + in + " --data cifar10:" + (tmp / "none"));
  EXPECT_EQ(ev.code, 1);
  EXPECT_EQ(lines(ev.err), 1) << ev.err;
}

// A loss that diverges stops the run with one error line naming the step, and nothing is written
// (on a GPU the loss is read some steps late; here, after each step).
TEST(TrainCli, ADivergingLossIsOneLineAndNoOutput) {
  test::TempDir tmp;
  std::string data = npy_data(tmp);
  std::string out = tmp / "t.onnx";
  auto r = lopper_cli("train " + fixture("mlp.ts.onnx") + " -o " + out + " --data " + data +
                      " --lr 1e30 --momentum 0.9 --epochs 3");
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("the loss is"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("(epoch 1, step "), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("lopper: "), r.err.rfind("lopper: ")) << r.err;  // one error line
  EXPECT_FALSE(fs::exists(out));
}

// Structured schedules remove channels between rounds: the model itself gets smaller while it
// trains, lands on the final amount per group, and still trains and runs after each removal.
TEST(TrainStructured, IterativeRoundsShrinkTheModel) {
  test::TempDir tmp;
  std::string data = npy_data(tmp);
  ir::Model m = onnx::load_model(fixture("small_cnn.preserve.onnx"));
  StructuredReport before = channel_groups(m);
  TrainOptions o = two_rounds();
  o.prune.amount = PruneAmount{0.5, false};
  o.structured_schedule = true;
  o.structured.criterion = "l2";
  o.group_lasso = 1e-3;
  std::vector<std::string> notes;
  TrainCallbacks cb;
  cb.note = [&](const std::string& s) { notes.push_back(s); };
  auto dl = loader(data);
  TrainResult r = train(m, *dl, o, cb);
  ASSERT_EQ(r.epochs.size(), 2u);
  EXPECT_EQ(notes.size(), 2u);  // one removal per round
  for (const auto& e : r.epochs) EXPECT_TRUE(std::isfinite(e.loss));
  StructuredReport after = channel_groups(m);
  ASSERT_EQ(after.groups.size(), before.groups.size());
  for (size_t g = 0; g < before.groups.size(); ++g) {
    if (!before.groups[g].blocked.empty()) continue;
    // round 1 keeps ceil-ish sqrt(0.5) of each group, round 2 lands on half of the original.
    EXPECT_EQ(after.groups[g].size_before, before.groups[g].size_before / 2) << g;
  }
  // The shrunk model, written and read back, still runs.
  onnx::save_model(m, tmp / "shrunk.onnx");
  auto ev = loader(data, 4);  // the fixture has a fixed batch of 4
  EvalResult res = evaluate(onnx::load_model(tmp / "shrunk.onnx"), *ev);
  EXPECT_EQ(res.samples, 64);
}

// Group lasso over the dependency graph's groups: the penalty reaches every weight of a group —
// a filter's row and the next layer's input column alike.
TEST(TrainStructured, GroupLassoShrinksWholeGroups) {
  test::TempDir tmp;
  std::string data = npy_data(tmp);
  auto run = [&](double group) {
    ir::Model m = onnx::load_model(fixture("small_cnn.preserve.onnx"));
    TrainOptions o;
    o.epochs = 2;
    o.lr = 0.02;
    o.group_lasso = group;
    auto dl = loader(data);
    train(m, *dl, o);
    return m;
  };
  ir::Model plain = run(0), gl = run(5e-2);
  // 11.weight [10, 64]: its columns belong to the group of 9.weight's rows (the hidden neurons).
  auto col_norms = [](const ir::Model& m) {
    return m.graph.find_initializer("11.weight")->value.norm(2, {0}).sum().item<double>();
  };
  EXPECT_LT(col_norms(gl), 0.9 * col_norms(plain));
}

// Mixed precision: bf16 autocast trains on the CPU, lands near the fp32 run without matching it
// bit for bit (the matmuls really ran in bf16), and keeps the weights fp32. fp16 needs a GPU.
TEST(TrainPrecision, Bf16AutocastTrainsNearFp32) {
  test::TempDir tmp;
  std::string data = npy_data(tmp);
  auto run = [&](const std::string& precision) {
    ir::Model m = onnx::load_model(fixture("small_cnn.preserve.onnx"));
    TrainOptions o;
    o.epochs = 2;
    o.lr = 0.02;
    o.precision = parse_precision(precision);
    auto dl = loader(data);
    TrainResult r = train(m, *dl, o);
    EXPECT_EQ(r.epochs.back().skipped_steps, 0);
    EXPECT_EQ(r.epochs.back().loss_scale, 0.0);  // no loss scaling outside fp16
    return m;
  };
  ir::Model before = onnx::load_model(fixture("small_cnn.preserve.onnx"));
  ir::Model f32 = run("fp32"), b16 = run("bf16");
  for (const char* name : {"0.weight", "4.weight", "9.weight"}) {
    const at::Tensor& w0 = before.graph.find_initializer(name)->value;
    const at::Tensor& a = f32.graph.find_initializer(name)->value;
    const at::Tensor& b = b16.graph.find_initializer(name)->value;
    EXPECT_EQ(b.scalar_type(), at::kFloat) << name;
    const double moved = (a - w0).norm().item<double>();
    const double apart = (a - b).norm().item<double>();
    EXPECT_GT(moved, 0) << name;
    EXPECT_GT(apart, 0) << name << ": bf16 gave the fp32 result bit for bit";
    EXPECT_LT(apart, 0.25 * moved) << name << ": bf16 training went elsewhere";
  }
  ir::Model m = onnx::load_model(fixture("small_cnn.preserve.onnx"));
  TrainOptions o;
  o.precision = at::kHalf;
  auto dl = loader(data);
  try {
    train(m, *dl, o);
    ADD_FAILURE() << "fp16 on the CPU was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fp16 needs a CUDA device"), std::string::npos);
  }
  o.precision = at::kDouble;
  EXPECT_THROW(train(m, *dl, o), Error);
}

// fp16's loss scaler: a step with an inf or NaN gradient is refused and halves the scale; clean
// steps unscale the gradients and double the scale after 2000 in a row.
TEST(TrainPrecision, LossScalerSkipsOverflowAndGrows) {
  amp::LossScaler s;
  s.scale = 1024;
  std::vector<at::Tensor> g = {at::full({3}, 2048.0f), at::full({2, 2}, 512.0f)};
  ASSERT_TRUE(s.unscale(g));
  EXPECT_TRUE(at::equal(g[0], at::full({3}, 2.0f)));
  EXPECT_TRUE(at::equal(g[1], at::full({2, 2}, 0.5f)));
  EXPECT_EQ(s.clean, 1);
  for (float bad : {INFINITY, -INFINITY, NAN}) {
    std::vector<at::Tensor> h = {at::ones({4}), at::tensor({1.0f, bad})};
    const double before = s.scale;
    EXPECT_FALSE(s.unscale(h));
    EXPECT_EQ(s.scale, before / 2);
    EXPECT_EQ(s.clean, 0);
  }
  EXPECT_EQ(s.skipped, 3);
  const double before = s.scale;
  for (int64_t i = 0; i < amp::LossScaler::kGrowthInterval; ++i) {
    std::vector<at::Tensor> h = {at::ones({2})};
    ASSERT_TRUE(s.unscale(h));
  }
  EXPECT_EQ(s.scale, before * 2);
}
