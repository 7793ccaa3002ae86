// Losses on a model's output, shared by calibration (grad/taylor pruning) and training.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "lopper/graph.h"

namespace lopper {

class Executor;

/// What feeding a classifier batches needs from a model: the graph input they go to, its dims
/// (-1 where dynamic; the first is the batch), and the op that writes the first output (for
/// classification_loss).
struct ModelIO {
  std::string input;
  std::vector<int64_t> dims;
  std::string out_op;
};
/// Throws lopper::Error ("[data] ...") when the model has no input to feed.
ModelIO model_io(const ir::Model& model, const Executor& ex);

/// Mean cross-entropy between a classifier's output [B, C] (or [B, ...], flattened) and int64
/// labels [B]. `out_op` is the op that produced the output: after a Softmax the output is taken as
/// probabilities, after a LogSoftmax as log-probabilities, otherwise as logits. Throws
/// lopper::Error ("[loss] ...") when a label is not below the number of outputs or the batch sizes
/// disagree.
at::Tensor classification_loss(const at::Tensor& out, const at::Tensor& labels,
                               const std::string& out_op = "");

}  // namespace lopper
