// Knowledge distillation's loss term (Hinton et al. 2015): the student's logits pulled towards the
// dense teacher's, softened by a temperature. Internal header: the trainer's
// TrainOptions::distill and the Python package's lopper.distillation_loss use it.
#pragma once

#include <ATen/core/Tensor.h>

#include "lopper/train.h"

namespace lopper {

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

}  // namespace lopper
