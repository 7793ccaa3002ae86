// Losses on a model's output, shared by calibration (grad/taylor pruning) and training.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

namespace lopper {

/// Mean cross-entropy between a classifier's output [B, C] (or [B, ...], flattened) and int64
/// labels [B]. `out_op` is the op that produced the output: after a Softmax the output is taken as
/// probabilities, after a LogSoftmax as log-probabilities, otherwise as logits. Throws
/// lopper::Error ("[loss] ...") when a label is not below the number of outputs or the batch sizes
/// disagree.
at::Tensor classification_loss(const at::Tensor& out, const at::Tensor& labels,
                               const std::string& out_op = "");

}  // namespace lopper
