// Feeding a model batches and judging its output: shared by calibration (grad/taylor pruning),
// sensitivity, training and evaluation.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "lopper/data.h"
#include "lopper/graph.h"
#include "lopper/loss.h"

namespace lopper {

class Executor;

/// What feeding a model batches needs from it: its data inputs (name, dims with -1 where dynamic
/// and the batch first, dtype), the op that writes the first output (see Objective::loss) and
/// that output's dims (-1 where dynamic; empty when unknown).
struct ModelIO {
  struct Input {
    std::string name;
    std::vector<int64_t> dims;
    at::ScalarType dtype = at::kFloat;
  };
  std::vector<Input> inputs;
  std::string out_op;
  std::vector<int64_t> out_dims;
};
/// Throws lopper::Error ("[data] ...") when the model has no input to feed.
ModelIO model_io(const ir::Model& model);
/// The inputs' names, comma-separated ("input_ids, attention_mask"), for messages.
std::string input_names(const ModelIO& io);

/// The model's inputs for batch `b`, in their dtypes, on `device`. The samples go to
/// b.x_input, else to input_ids when the model has it, else to the first input the batch does not
/// name; named inputs go by name; attention_mask (ones), token_type_ids (zeros) and position_ids
/// (0, 1, ...) are made when the data lacks them. An attention_mask the model does not take is
/// left out (the loss still reads it). Throws lopper::Error ("[data] ...") naming the input for
/// one the data gives that the model does not take, one the model needs that the data does not
/// give, or a shape that does not fit.
NamedInputs feeds(const ModelIO& io, const Batch& b, const at::Device& device);

/// The loss of LossOptions on a model's first output, and what it counts as right.
class Objective {
 public:
  /// Throws lopper::Error on bad options (check_loss_options).
  Objective(const LossOptions& o, const ModelIO& io);

  /// Masked LM: picks tokens of b.x (where its attention mask is 1), replaces them as BERT does
  /// and sets b.y to their IDs (-100 elsewhere); which ones is a function of (seed, step). Nothing
  /// for the other losses. Throws lopper::Error when the samples are not token IDs [B, T].
  void prepare(Batch& b, int64_t step) const;

  /// What the loss compares: float logits [M, C] and their int64 labels [M], one row per counted
  /// sample (classification) or token (language models, token classification).
  struct Targets {
    at::Tensor logits, labels;
  };
  /// The targets of output `out` (the model's first output, batch first) on batch `b`. Loss::kAuto
  /// is resolved on the first call, from b.y and out's shape. Throws lopper::Error ("[loss] ...")
  /// when they do not fit each other (batch sizes, a label beyond the outputs, no labels).
  Targets targets(const at::Tensor& out, const Batch& b);
  /// Mean loss over the targets (cross-entropy, or mse against one-hot labels); after a Softmax
  /// the output is taken as probabilities, after a LogSoftmax as log-probabilities.
  at::Tensor loss(const Targets& t) const;
  /// Top-1 hits among the targets.
  static int64_t correct(const Targets& t);
  /// The same as a 0-d int64 tensor on the logits' device (no wait for a GPU).
  static at::Tensor correct_count(const Targets& t);

  /// The loss in use (kAuto until the first targets()).
  Loss kind() const { return kind_; }

 private:
  LossOptions o_;
  Loss kind_;
  std::string out_op_;
  int64_t vocab_ = -1;  // the output's last dim when static
};

}  // namespace lopper
