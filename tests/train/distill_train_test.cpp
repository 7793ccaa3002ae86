// Distillation in the trainer (TrainOptions::distill): the KL it reports is the KL over the rows
// the task counts (every sample; a language model's tokens with padding left out), alpha = 1
// learns from token IDs alone, states compare intermediate tensors, and a teacher or state that
// does not fit is one line, the model untouched; `lopper finetune --teacher` on the command line.
// (Step-for-step parity with a PyTorch loop: tests/python/check_training.py.)
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "lopper/data.h"
#include "lopper/error.h"
#include "lopper/executor.h"
#include "lopper/npy.h"
#include "lopper/onnx_io.h"
#include "lopper/prune.h"
#include "lopper/train.h"
#include "test_models.h"
#include "train/loss.h"

namespace fs = std::filesystem;
using namespace lopper;
using namespace lopper::test;

namespace {

std::unique_ptr<DataLoader> loader(const std::string& spec, int64_t batch) {
  LoaderOptions lo;
  lo.batch_size = batch;
  lo.seed = 5;
  return std::make_unique<DataLoader>(open_dataset(spec), lo);
}

ir::Model pruned(const std::string& fixture_name, double amount) {
  ir::Model m = onnx::load_model(fixture(fixture_name));
  PruneOptions po;
  po.criterion = "l1";
  po.amount = PruneAmount{amount, false};
  po.scope = PruneScope::kLocal;
  prune(m, po);
  return m;
}

// One step at a learning rate too small to move a weight: the epoch's KL is the KL of the
// models as given.
TrainOptions frozen_epoch(const ir::Model& teacher, double alpha, double temperature) {
  TrainOptions o;
  o.epochs = 1;
  o.lr = 1e-12;
  o.momentum = 0;
  o.distill.teacher = std::make_shared<ir::Model>(teacher);
  o.distill.alpha = alpha;
  o.distill.temperature = temperature;
  return o;
}

// The first output of `m` on `feeds` (inference).
at::Tensor output(const ir::Model& m, const NamedTensors& feeds) {
  Executor ex(m);
  return ex.run(feeds).at(0);
}

int64_t parameter_count(const ir::Model& m) {
  int64_t n = 0;
  for (const auto& i : m.graph.initializers) n += i.value.numel();
  return n;
}

bool same_initializers(const ir::Model& a, const ir::Model& b) {
  for (const auto& i : a.graph.initializers) {
    const ir::Initializer* j = b.graph.find_initializer(i.name);
    if (!j || !at::equal(i.value, j->value)) return false;
  }
  return true;
}

}  // namespace

// A classifier: every sample is a row. The student (mlp, 80% pruned) and a teacher of another
// architecture (the small CNN), T = 2.
TEST(TrainDistill, KlIsOverEverySampleOfAClassifier) {
  TempDir tmp;
  const std::string data = random_npy_data(tmp, 64, 11);
  ir::Model student = pruned("mlp.ts.onnx", 0.8);
  const ir::Model teacher = onnx::load_model(fixture("small_cnn.preserve.onnx"));
  // What the trainer should report: KL over all 64 rows, computed here from both models' outputs.
  at::Tensor xs = load_npy(tmp / "x.npy");
  std::vector<at::Tensor> so, to;
  for (int64_t i = 0; i < 64; i += 4) {
    const NamedTensors in = {{"input", xs.slice(0, i, i + 4)}};
    so.push_back(output(student, in));
    to.push_back(output(teacher, in));
  }
  const double want = distillation_kl(at::cat(so), at::cat(to), 2.0).item<double>();
  ir::Model before = student;
  auto dl = loader(data, 4);
  TrainResult r = train(student, *dl, frozen_epoch(teacher, 0.7, 2.0));
  ASSERT_EQ(r.epochs.size(), 1u);
  const EpochStats& e = r.epochs[0];
  EXPECT_TRUE(e.distilled);
  EXPECT_GT(want, 0.01);
  EXPECT_NEAR(e.distill_kl, want, 1e-4 * want + 1e-6);
  EXPECT_NEAR(e.loss, 0.3 * e.task_loss + 0.7 * e.distill_kl, 1e-5);
  EXPECT_FALSE(e.teacher_agreement);
  // The zeros held.
  for (const auto& w : prunable_weights(student.graph))
    EXPECT_TRUE(at::equal(init(student, w.weight).eq(0), init(before, w.weight).eq(0))) << w.weight;
}

// A language model: position t predicts token t + 1, so a row counts where the token after it is
// not padding; padded positions add nothing to the KL.
TEST(TrainDistill, KlLeavesOutALanguageModelsPadding) {
  TempDir tmp;
  at::manual_seed(2);
  const at::Tensor ids = at::randint(0, 1000, {4, 16}, at::kLong);
  at::Tensor mask = at::ones({4, 16}, at::kLong);
  mask.index_put_({1, at::indexing::Slice(10)}, 0);
  mask.index_put_({3, at::indexing::Slice(4)}, 0);
  save_npy(ids, tmp / "ids.npy");
  save_npy(mask, tmp / "mask.npy");
  const std::string data = "tokens:" + (tmp / "ids.npy") + ",mask=" + (tmp / "mask.npy");
  ir::Model student = pruned("llama.dynamo.onnx", 0.5);
  const ir::Model teacher = onnx::load_model(fixture("llama.dynamo.onnx"));
  std::vector<at::Tensor> so, to;
  for (int64_t i = 0; i < 4; i += 2) {
    const NamedTensors in = {{"input_ids", ids.slice(0, i, i + 2)},
                             {"attention_mask", mask.slice(0, i, i + 2)}};
    so.push_back(output(student, in).slice(1, 0, 15));
    to.push_back(output(teacher, in).slice(1, 0, 15));
  }
  const at::Tensor counted = mask.slice(1, 1).reshape({-1}).ne(0);
  const at::Tensor s = at::cat(so).reshape({-1, 1000}).index({counted});
  const at::Tensor t = at::cat(to).reshape({-1, 1000}).index({counted});
  ASSERT_EQ(s.size(0), 4 * 15 - 6 - 12);
  const double want = distillation_kl(s, t, 1.0).item<double>();
  // With the padded rows counted too it would differ: the check below can tell.
  const double with_padding =
      distillation_kl(at::cat(so).reshape({-1, 1000}), at::cat(to).reshape({-1, 1000}), 1.0)
          .item<double>();
  ASSERT_GT(std::abs(with_padding - want), 1e-3 * want);
  auto dl = loader(data, 2);
  TrainResult r = train(student, *dl, frozen_epoch(teacher, 0.5, 1.0));
  EXPECT_NEAR(r.epochs[0].distill_kl, want, 1e-4 * want + 1e-6);
  EXPECT_TRUE(std::isfinite(r.epochs[0].task_loss));
}

// alpha = 1 on token IDs alone (no labels): the KL goes down over the epochs.
TEST(TrainDistill, AlphaOneOnTokenIdsLowersTheKl) {
  TempDir tmp;
  at::manual_seed(4);
  save_npy(at::randint(0, 1000, {16, 16}, at::kLong), tmp / "ids.npy");
  ir::Model student = pruned("llama.dynamo.onnx", 0.6);
  TrainOptions o;
  o.epochs = 4;
  o.optimizer = Optimizer::kAdam;
  o.lr = 3e-3;
  o.distill.teacher = std::make_shared<ir::Model>(onnx::load_model(fixture("llama.dynamo.onnx")));
  o.distill.alpha = 1;
  auto dl = loader("tokens:" + (tmp / "ids.npy"), 2);
  TrainResult r = train(student, *dl, o);
  ASSERT_EQ(r.epochs.size(), 4u);
  EXPECT_GT(r.epochs[0].distill_kl, 0);
  EXPECT_LT(r.epochs[3].distill_kl, 0.5 * r.epochs[0].distill_kl);
  EXPECT_NEAR(r.epochs[3].loss, r.epochs[3].distill_kl, 1e-9);  // the task is shown, not trained
}

// A classifier's data without labels: distilled alone, its accuracy is the agreement with the
// teacher; with alpha < 1 it needs labels.
TEST(TrainDistill, UnlabelledSamplesAgreeWithTheTeacher) {
  TempDir tmp;
  random_npy_data(tmp, 32, 3);
  const std::string data = "npy:input=" + (tmp / "x.npy");
  const ir::Model teacher = onnx::load_model(fixture("mlp.ts.onnx"));
  ir::Model student = teacher;  // the teacher itself: full agreement, no divergence
  auto dl = loader(data, 4);
  TrainResult r = train(student, *dl, frozen_epoch(teacher, 1.0, 1.0));
  EXPECT_TRUE(r.epochs[0].teacher_agreement);
  EXPECT_DOUBLE_EQ(r.epochs[0].accuracy, 1.0);
  EXPECT_NEAR(r.epochs[0].distill_kl, 0.0, 1e-6);
  EXPECT_TRUE(std::isnan(r.epochs[0].task_loss));
  auto dl2 = loader(data, 4);
  EXPECT_NE(error_of([&] {
              train(student, *dl2, frozen_epoch(teacher, 0.5, 1.0));
            }).find("the data has no labels: distil from the teacher alone (distill_alpha 1)"),
            std::string::npos);
}

// Intermediate states: the MSE between the hidden activations of a pruned student and the dense
// teacher goes down as the student learns them (alpha 0: the task and the state only).
TEST(TrainDistill, StatesPullIntermediateTensors) {
  TempDir tmp;
  const std::string data = random_npy_data(tmp, 64, 11);
  ir::Model student = pruned("mlp.ts.onnx", 0.8);
  TrainOptions o;
  o.epochs = 3;
  o.optimizer = Optimizer::kAdam;
  o.lr = 1e-3;
  o.distill.teacher = std::make_shared<ir::Model>(onnx::load_model(fixture("mlp.ts.onnx")));
  o.distill.alpha = 0;
  o.distill.states = {{"/2/Relu_output_0", "/2/Relu_output_0"}};
  o.distill.state_weight = 10;
  auto dl = loader(data, 4);
  TrainResult r = train(student, *dl, o);
  EXPECT_GT(r.epochs[0].distill_state, 0);
  EXPECT_LT(r.epochs[2].distill_state, 0.7 * r.epochs[0].distill_state);
  EXPECT_NEAR(r.epochs[2].loss, r.epochs[2].task_loss + 10 * r.epochs[2].distill_state,
              1e-5 * r.epochs[2].loss);
}

// Pruning while distilling: AGP's ramp on the weights, and an iterative structured schedule whose
// student shrinks under a teacher that stays whole.
TEST(TrainDistill, SchedulesPruneWhileDistilling) {
  TempDir tmp;
  const std::string data = random_npy_data(tmp, 32, 11);
  {
    ir::Model m = onnx::load_model(fixture("mlp.ts.onnx"));
    TrainOptions o = frozen_epoch(m, 0.5, 2.0);
    o.epochs = 3;
    o.lr = 0.01;
    o.schedule = PruneSchedule::kAgp;
    o.prune.criterion = "l1";
    o.prune.amount = PruneAmount{0.8, false};
    o.start_epoch = 0;
    o.end_epoch = 2;
    auto dl = loader(data, 4);
    TrainResult r = train(m, *dl, o);
    EXPECT_NEAR(r.epochs.back().sparsity, 0.8, 1e-3);
    // The student starts as the teacher and drifts a little on the task; pruned, it is far off.
    EXPECT_LT(r.epochs[0].distill_kl, 0.5 * r.epochs[2].distill_kl);
  }
  {
    ir::Model m = onnx::load_model(fixture("small_cnn.preserve.onnx"));
    const ir::Model dense = m;
    TrainOptions o = frozen_epoch(dense, 0.5, 1.0);
    o.epochs = 2;
    o.lr = 0.01;
    o.schedule = PruneSchedule::kIterative;
    o.rounds = 2;
    o.epochs_per_round = 1;
    o.prune.amount = PruneAmount{0.5, false};
    o.structured_schedule = true;
    o.structured.criterion = "l1";
    auto dl = loader(data, 4);
    TrainResult r = train(m, *dl, o);
    EXPECT_LT(parameter_count(m), parameter_count(dense) * 3 / 4);
    for (const auto& e : r.epochs) EXPECT_GT(e.distill_kl, 1e-4);
  }
}

// A teacher or a state that does not fit: one line naming it, the student left as it was.
TEST(TrainDistill, ATeacherThatDoesNotFitIsOneLine) {
  TempDir tmp;
  const std::string data = random_npy_data(tmp, 16, 11);
  const ir::Model mlp = onnx::load_model(fixture("mlp.ts.onnx"));
  // The mlp with 5 outputs instead of 10: declared, or found on the first batch.
  ir::Model five = mlp;
  for (auto& i : five.graph.initializers)
    if (i.name == "5.weight" || i.name == "5.bias") i.value = i.value.slice(0, 0, 5).clone();
  five.graph.outputs[0].type.dims.back().value = 5;
  ir::Model five_undeclared = five;
  five_undeclared.graph.outputs[0].type.dims.clear();
  struct Case {
    std::string what;
    ir::Model teacher;
    std::vector<DistillOptions::State> states;
    std::string needle;
  };
  const std::vector<Case> cases = {
      {"inputs",
       onnx::load_model(fixture("llama.dynamo.onnx")),
       {},
       "the teacher's inputs (input_ids, attention_mask) are not the student's (input)"},
      {"output", five, {}, "the teacher's output [4, 5] is not the student's [4, 10]"},
      {"output found on a batch",
       five_undeclared,
       {},
       "the teacher's output [4, 5] is not the student's [4, 10] on the same batch"},
      {"student state",
       mlp,
       {{"nope", "/2/Relu_output_0"}},
       "distill_state 'nope=/2/Relu_output_0': no node of the student writes 'nope'"},
      {"teacher state",
       mlp,
       {{"/2/Relu_output_0", "nope"}},
       "no node of the teacher writes 'nope'"},
      {"state shape",
       mlp,
       {{"/2/Relu_output_0", "/4/Relu_output_0"}},
       "the student's tensor is [4, 256], the teacher's [4, 128]"},
  };
  for (const auto& c : cases) {
    ir::Model student = mlp;
    TrainOptions o = frozen_epoch(c.teacher, 0.5, 1.0);
    o.distill.states = c.states;
    auto dl = loader(data, 4);
    bool usage = false;
    const std::string err = error_of([&] {
      try {
        train(student, *dl, o);
      } catch (const UsageError&) {
        usage = true;
        throw;
      }
    });
    EXPECT_NE(err.find(c.needle), std::string::npos) << c.what << ": " << err;
    EXPECT_TRUE(usage) << c.what;
    EXPECT_EQ(err.find('\n'), std::string::npos) << c.what;
    EXPECT_TRUE(same_initializers(student, mlp)) << c.what;
  }
}

TEST(TrainDistillCli, FinetuneWithATeacherShowsTheTermsApart) {
  TempDir tmp;
  const std::string data = random_npy_data(tmp, 64, 11);
  const std::string student = tmp / "s.onnx", out = tmp / "o.onnx";
  onnx::save_model(pruned("mlp.ts.onnx", 0.8), student);
  auto r = lopper_cli("finetune " + student + " --data " + data + " -o " + out + " --teacher " +
                      fixture("mlp.ts.onnx") +
                      " --distill-alpha 0.7 --distill-temperature 2 --epochs 2 --no-eval"
                      " --distill-state /2/Relu_output_0=/2/Relu_output_0");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("distilled from " + fixture("mlp.ts.onnx") + " (alpha 0.7, temperature 2)"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("epoch 2/2  loss "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(", kl "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(", state "), std::string::npos) << r.err;
  auto j = nlohmann::json::parse(slurp(out + ".train.json"));
  EXPECT_EQ(j["distill"]["alpha"].get<double>(), 0.7);
  const auto& e = j["epochs"][1];
  EXPECT_GT(e["distill_kl"].get<double>(), 0);
  EXPECT_GT(e["distill_state"].get<double>(), 0);
  EXPECT_NEAR(e["loss"].get<double>(),
              0.3 * e["task_loss"].get<double>() + 0.7 * e["distill_kl"].get<double>() +
                  e["distill_state"].get<double>(),
              1e-5);
  EXPECT_NEAR(j["sparsity"].get<double>(), 0.8, 1e-3);
}

TEST(TrainDistillCli, BadInputIsOneLineAndNoOutput) {
  TempDir tmp;
  const std::string data = random_npy_data(tmp, 16, 11);
  const std::string in = fixture("mlp.ts.onnx"), out = tmp / "t.onnx";
  const std::string teacher = " --teacher " + in;
  struct Case {
    std::string args;
    int code;
    std::string needle;
  } cases[] = {
      {teacher + " --distill-alpha 1.5", 2, "--distill-alpha must be in [0, 1], got 1.5"},
      {teacher + " --distill-alpha -0.1", 2, "--distill-alpha must be in [0, 1]"},
      {teacher + " --distill-temperature 0", 2, "--distill-temperature must be > 0, got 0"},
      {teacher + " --distill-state-weight -1", 2, "--distill-state-weight must be >= 0"},
      {teacher + " --distill-state a", 2, "--distill-state takes STUDENT_TENSOR=TEACHER_TENSOR"},
      {teacher + " --distill-state a=b=c", 2, "--distill-state takes"},
      {" --distill-alpha 0.5", 2, "need --teacher DENSE.onnx"},
      {" --distill-state a=b", 2, "need --teacher"},
      {" --teacher " + (tmp / "missing.onnx"), 1, "missing.onnx"},
      {" --teacher " + fixture("llama.dynamo.onnx"), 2, "the --teacher's inputs"},
      {teacher + " --distill-state nope=/2/Relu_output_0", 2,
       "--distill-state 'nope=/2/Relu_output_0': no node of the student writes 'nope'"},
      {teacher + " --distill-state /2/Relu_output_0=/4/Relu_output_0", 2,
       "the student's tensor is [4, 256], the teacher's [4, 128]"},
  };
  for (const auto& c : cases) {
    auto r = lopper_cli("finetune " + in + " -o " + out + " --data " + data + c.args);
    EXPECT_EQ(r.code, c.code) << c.args << ": " << r.err;
    EXPECT_NE(r.err.find(c.needle), std::string::npos) << c.args << ": " << r.err;
    EXPECT_EQ(r.err.find("lopper: "), r.err.rfind("lopper: ")) << c.args << ": " << r.err;
    EXPECT_FALSE(fs::exists(out)) << c.args;
    EXPECT_FALSE(fs::exists(out + ".train.json")) << c.args;
  }
}
