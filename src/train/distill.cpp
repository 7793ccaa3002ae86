// Knowledge distillation's loss term and its options (lopper/train.h: DistillOptions).
#include "lopper/train.h"

#include <ATen/ATen.h>

#include <cmath>

#include "lopper/error.h"

namespace lopper {

void check_distill_options(const DistillOptions& o) {
  LOPPER_CHECK(std::isfinite(o.alpha) && o.alpha >= 0 && o.alpha <= 1,
               "[train] " LOPPER_OPTION("distill_alpha") " must be in [0, 1], got ", o.alpha);
  LOPPER_CHECK(std::isfinite(o.temperature) && o.temperature > 0,
               "[train] " LOPPER_OPTION("distill_temperature") " must be > 0, got ", o.temperature);
  LOPPER_CHECK(std::isfinite(o.state_weight) && o.state_weight >= 0,
               "[train] " LOPPER_OPTION("distill_state_weight") " must be >= 0, got ",
               o.state_weight);
  LOPPER_CHECK(
      o.states.empty() || o.teacher,
      "[train] " LOPPER_OPTION("distill_state") " needs a teacher (" LOPPER_OPTION("teacher") ")");
  for (const auto& st : o.states)
    LOPPER_CHECK(!st.student.empty() && !st.teacher.empty(),
                 "[train] " LOPPER_OPTION("distill_state") " names a student tensor and a teacher "
                 "tensor (STUDENT=TEACHER), got '",
                 st.student, "=", st.teacher, "'");
}

at::Tensor distillation_kl(const at::Tensor& student, const at::Tensor& teacher,
                           double temperature) {
  LOPPER_CHECK(student.sizes() == teacher.sizes(), "[train] the teacher's logits ", teacher.sizes(),
               " are not the student's ", student.sizes());
  LOPPER_CHECK(student.dim() == 2, "[train] distillation compares logits [rows, classes], got ",
               student.sizes());
  if (student.size(0) == 0) return (student * 0).sum();  // no counted row: 0, still in the graph
  const at::Tensor ls = at::log_softmax(student.to(at::kFloat) / temperature, 1);
  const at::Tensor lt = at::log_softmax(teacher.detach().to(at::kFloat) / temperature, 1);
  const at::Tensor pt = lt.exp();
  // p_t * (log p_t - log p_s), 0 where p_t is 0 (its log is -inf: 0 * inf would be NaN).
  const at::Tensor terms = at::where(pt > 0, pt * (lt - ls), at::zeros_like(ls));
  return terms.sum() / double(student.size(0)) * (temperature * temperature);
}

at::Tensor distillation_mix(const at::Tensor& task, const at::Tensor& kl, const DistillOptions& o) {
  if (o.alpha >= 1) return kl;
  if (o.alpha <= 0) return task;
  return task * (1 - o.alpha) + kl * o.alpha;
}

}  // namespace lopper
