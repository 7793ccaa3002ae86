// Training the ONNX graph itself through the executor under autograd: fine-tuning with pruning
// masks held, sparsity regularisers (L1, BatchNorm-γ L1, group lasso), progressive pruning
// (iterative rounds, Zhu & Gupta's AGP), evaluation, and data parallelism over c10d.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "lopper/graph.h"
#include "lopper/loss.h"
#include "lopper/prune.h"
#include "lopper/structured.h"

namespace lopper {

class DataLoader;
class Distributed;

enum class PruneSchedule { kNone, kIterative, kAgp };
/// The optimiser's update rule (PyTorch's SGD, Adam, AdamW).
enum class Optimizer { kSgd, kAdam, kAdamW };
/// How the learning rate moves per epoch.
enum class LrSchedule { kConstant, kStep, kCosine };

/// "sgd" | "adam" | "adamw"; throws lopper::Error on anything else.
Optimizer parse_optimizer(const std::string& s);
const char* optimizer_name(Optimizer o);  // "sgd", "adam", "adamw" (as checkpoints store it)
/// "constant" | "step" | "cosine"; throws lopper::Error on anything else.
LrSchedule parse_lr_schedule(const std::string& s);
const char* lr_schedule_name(LrSchedule s);

/// Knowledge distillation (Hinton et al. 2015): a teacher, usually the dense model the student was
/// pruned from, runs in inference mode on every batch, and the student learns from its logits
///   (1 - alpha) * task + alpha * T^2 * KL(softmax(teacher / T) || softmax(student / T))
///   + state_weight * sum over `states` of MSE(student tensor, teacher tensor)
/// over the rows the task counts (samples; tokens for language models, padding and unlabelled
/// positions left out). alpha = 1 needs no labels.
struct DistillOptions {
  /// The teacher: the same inputs as the student (names and types) and a first output of the same
  /// shape. Null: no distillation.
  std::shared_ptr<const ir::Model> teacher;
  double alpha = 0.5;        // in [0, 1]
  double temperature = 1.0;  // > 0
  /// Intermediate tensors compared by mean squared error, where their shapes match: a value that
  /// a node of the student writes, and one of the teacher's.
  struct State {
    std::string student, teacher;
  };
  std::vector<State> states;
  double state_weight = 1.0;  // >= 0
};

/// Throws lopper::Error naming the first option out of range (alpha outside [0, 1], a temperature
/// <= 0, a negative state weight, states without a teacher).
void check_distill_options(const DistillOptions& o);

/// T^2 * KL(softmax(teacher / T) || softmax(student / T)), the mean over the rows: student and
/// teacher logits [M, C] of the same shape, one row per counted sample or token (a language
/// model's padding and unlabelled positions left out by the caller). The T^2 keeps the gradient's
/// scale independent of T. A teacher probability of 0 (a logit of -inf) adds nothing.
/// Differentiable in `student`; the teacher's gradient is not taken. Throws lopper::Error when the
/// shapes differ.
at::Tensor distillation_kl(const at::Tensor& student, const at::Tensor& teacher,
                           double temperature);

/// (1 - o.alpha) * task + o.alpha * kl: the two terms mixed.
at::Tensor distillation_mix(const at::Tensor& task, const at::Tensor& kl, const DistillOptions& o);

struct TrainOptions {
  int64_t epochs = 10;
  Optimizer optimizer = Optimizer::kSgd;  // PyTorch's semantics and defaults
  double lr = 0.01;
  double momentum = 0.9;  // sgd
  bool nesterov = false;  // sgd
  double weight_decay = 0;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;   // adam, adamw
  LrSchedule lr_schedule = LrSchedule::kConstant;  // per epoch
  int64_t lr_step_epochs = 0;  // step: multiply by lr_gamma every this many epochs (0: epochs/3)
  double lr_gamma = 0.1;
  double warmup_epochs = 0;  // linear warmup, per step, from ~0 to lr
  double grad_clip = 0;      // clip the global gradient norm to this (0: off)
  LossOptions loss;          // lopper/loss.h: classification, language models, token classification
  uint64_t seed = 0;         // shuffling and random pruning
  std::string device = "cpu";
  /// kFloat | kBFloat16 | kHalf (CUDA), as ExecOptions::precision (parse_precision reads "fp32",
  /// "bf16", "fp16"): mixed precision through ATen's autocast — matmuls and convolutions run in 16
  /// bits, the weights, optimiser state and loss stay fp32. fp16 scales the loss dynamically
  /// (PyTorch's GradScaler policy) and skips steps whose gradients overflow.
  at::ScalarType precision = at::kFloat;
  /// Float initializers whose name matches are not trained (regex (prune.h: regex_error); empty:
  /// none).
  std::string freeze;
  /// Learn from a teacher's outputs as well as (or, alpha = 1, instead of) the labels.
  DistillOptions distill;

  // Joint training: penalties added to the loss.
  double l1 = 0;           // λ Σ|w| over the prunable weights
  double bn_l1 = 0;        // λ Σ|γ| over BatchNormalization scales (network slimming)
  double group_lasso = 0;  // λ Σ_c ||w_c||_2 over the channels c of the dependency graph's groups
                           // (all their weights: filters, next layers' inputs, norm scales); per
                           // output channel of each weight when the model has no group

  // Progressive pruning during training; `prune` holds method, final amount, scope, pattern.
  PruneSchedule schedule = PruneSchedule::kNone;
  PruneOptions prune;
  /// Structured schedules: each event removes whole channels (or heads) and the model shrinks
  /// while it trains; `prune.amount` is the final share of each group's channels (local) or of all
  /// (global), `structured` the unit, criterion, scope, round-to and exclude. The optimiser's
  /// state restarts after each removal.
  bool structured_schedule = false;
  StructuredOptions structured;
  int64_t rounds = 0, epochs_per_round = 0;  // iterative: epochs = rounds * epochs_per_round
  int64_t start_epoch = 0, end_epoch = 0;    // agp: the ramp, in epochs (end exclusive of training)
  int64_t every_epochs = 1;                  // agp: prune every this many epochs ...
  int64_t every_steps = 0;                   // ... or, when > 0, every this many steps

  /// Checkpoint after every epoch into this folder (DIR/epoch-N/: model.onnx + state; DIR/latest
  /// names the newest); empty: none. The folder must be new, empty, or one lopper made
  /// (check_checkpoint_dir).
  std::string checkpoint_dir;
  /// Resume from a checkpoint folder written by an earlier run with the same options (the
  /// --checkpoint-dir folder, whose newest checkpoint is taken, or one epoch-N folder in it).
  std::string resume;
};

struct EpochStats {
  int64_t epoch = 0;  // 1-based
  double loss = 0;  // mean training loss (without the regularisers): the task and distillation mix
  /// Top-1 among the counted rows: against the labels, or, for data without labels, the share of
  /// rows where the student's top-1 is the teacher's (teacher_agreement true).
  double accuracy = 0;
  double samples_per_s = 0;
  double lr = 0;
  double sparsity = 0;  // of the prunable weights the schedule prunes (ties aside), after the epoch
  double seconds = 0;
  int64_t skipped_steps = 0;  // fp16: steps skipped because the gradients overflowed
  double loss_scale = 0;      // fp16: the loss scale after the epoch (0 otherwise)
  /// Distillation (distilled true): its terms apart, means over the counted rows. task_loss is NaN
  /// when the data has no labels (alpha = 1).
  bool distilled = false;
  double task_loss = 0, distill_kl = 0, distill_state = 0;
  bool teacher_agreement = false;
};

struct TrainResult {
  std::vector<EpochStats> epochs;
  std::vector<std::string> notes;  // pruning events ("epoch 3: pruned to 61.2% (agp)")
};

/// The running means of an epoch, after one of its steps.
struct StepStats {
  int64_t epoch = 0, step = 0, steps = 0;  // 1-based epoch and step; steps per epoch
  double loss = 0, accuracy = 0, lr = 0;   // as EpochStats' so far
  double task_loss = 0, distill_kl = 0, distill_state = 0;  // distillation: the terms apart
};

struct TrainCallbacks {
  /// Once, when every check has passed and the checkpoint folder is held, before the first step.
  std::function<void()> start;
  /// After every step with the epoch's running means.
  std::function<void(const StepStats&)> step;
  /// After every epoch.
  std::function<void(const EpochStats&)> epoch;
  /// A pruning event or a checkpoint: one line for the user.
  std::function<void(const std::string&)> note;
};

/// Throws lopper::Error naming the first option out of range or in conflict (what train() checks
/// before it starts).
void check_train_options(const TrainOptions& o);
/// Throws UsageError unless `dir` can hold lopper's checkpoints: a path that does not exist (in a
/// folder that does), an empty folder, or a folder lopper made (it holds .lopper-checkpoint).
/// A file, or a folder of someone else's files, is never replaced.
void check_checkpoint_dir(const std::string& dir);
/// The checkpoint `--resume DIR` reads: DIR/latest's epoch folder when DIR is a checkpoint folder,
/// else DIR itself.
std::string checkpoint_to_resume(const std::string& dir);

/// Trains `model`'s float initializers in place on `data` (BatchNorm running statistics updated
/// and written back; the module buffers that lopper.export_onnx lists in the model's metadata,
/// "lopper.buffers", left as they are, as PyTorch's optimisers leave them). Weights that are zero
/// when training starts, or that the schedule prunes, stay exactly zero: their gradients and
/// optimiser state are masked. With `dist` (world > 1), gradients are averaged over ranks after
/// every backward pass and every rank ends with the same weights; `data` must then be sharded
/// (LoaderOptions::rank/world). Throws lopper::Error on bad options, data that does not fit the
/// model, or a non-finite loss.
TrainResult train(ir::Model& model, DataLoader& data, const TrainOptions& opts,
                  const TrainCallbacks& cb = {}, Distributed* dist = nullptr);

struct EvalResult {
  int64_t samples = 0;            // samples (sequences for language models)
  std::string loss_kind;          // the loss that was measured (lopper/loss.h's names)
  double top1 = 0, top5 = 0;      // of the targets: samples, or tokens (language models, tokens)
  double loss = 0;                // mean over the targets
  int64_t tokens = 0;             // language models: the tokens predicted
  double perplexity = 0;          // language models: exp(loss); 0 otherwise
  std::vector<double> per_class;  // classifiers: accuracy of each class (NaN: no sample)
  std::vector<int64_t> per_class_count;
};

struct EvalOptions {
  std::string device = "cpu";
  at::ScalarType precision = at::kFloat;  // as ExecOptions::precision (fp32, bf16, fp16 on CUDA)
  int64_t max_batches = 0;                // > 0: the first this many batches only
  LossOptions loss;
  std::function<void(int64_t batch, int64_t of)> progress;
};

/// Evaluates `model` (inference, the executor's fast path) on the batches of `data`: the loss of
/// `o.loss`, top-1 and top-5 of its targets, per-class accuracy for classifiers, perplexity for
/// language models.
EvalResult evaluate(const ir::Model& model, DataLoader& data, const EvalOptions& o = {});

/// The prunable weights' sparsity (zeros / params), as `lopper inspect` counts it.
double prunable_sparsity(const ir::Model& model);

/// AGP's target sparsity at time t (Zhu & Gupta 2017): s_f + (s_i - s_f)(1 - (t - t0)/(t1 - t0))^3,
/// s_i before t0 and s_f from t1 on.
double agp_sparsity(double s_i, double s_f, double t, double t0, double t1);

}  // namespace lopper
