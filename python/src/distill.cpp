// lopper.distillation_loss: the trainer's distillation term (lopper/train.h: distillation_kl) for a
// PyTorch user's own training loop, differentiable through autograd.
#include <ATen/ATen.h>
#include <pybind11/pybind11.h>
#include <torch/csrc/autograd/python_variable.h>

#include <string>

#include "bindings.h"
#include "convert.h"
#include "lopper/error.h"
#include "lopper/train.h"

namespace py = pybind11;

namespace lopper::python {
namespace {

// A tensor argument as it is (still in autograd's graph); a TypeError otherwise.
at::Tensor logits_arg(const py::handle& h, const char* what) {
  if (!THPVariable_Check(h.ptr()))
    throw py::type_error(std::string("[distill] ") + what + " must be a torch.Tensor, got " +
                         type_name(h));
  return THPVariable_Unpack(h.ptr());
}

std::string dims(const at::Tensor& t) { return detail::concat(t.sizes()); }

at::Tensor distillation_loss(const py::handle& student_h, const py::handle& teacher_h,
                             double temperature, const py::handle& mask_h) {
  const at::Tensor student = logits_arg(student_h, "student_logits");
  const at::Tensor teacher = logits_arg(teacher_h, "teacher_logits");
  if (!student.is_floating_point() || !teacher.is_floating_point())
    throw UsageError("[distill] the logits must be floating point, got " +
                     std::string(at::toString(student.scalar_type())) + " and " +
                     at::toString(teacher.scalar_type()));
  if (student.dim() < 1 || student.sizes() != teacher.sizes())
    throw UsageError("[distill] teacher_logits " + dims(teacher) + " must have the shape of " +
                     "student_logits " + dims(student) + " ([..., classes])");
  if (student.device() != teacher.device())
    throw UsageError("[distill] student_logits are on " + student.device().str() +
                     ", teacher_logits on " + teacher.device().str());
  DistillOptions o;
  o.temperature = temperature;
  as_usage([&] { check_distill_options(o); });
  const int64_t classes = student.size(-1);
  at::Tensor s = student.reshape({-1, classes}), t = teacher.reshape({-1, classes});
  if (!mask_h.is_none()) {
    const at::Tensor mask = logits_arg(mask_h, "mask");
    const auto rows = student.sizes().slice(0, student.dim() - 1);
    if (mask.sizes() != rows)
      throw UsageError("[distill] mask " + dims(mask) + " must have the logits' leading shape " +
                       detail::concat(rows) + " (one value per row)");
    const at::Tensor keep = mask.reshape({-1}).to(student.device()).ne(0).nonzero().squeeze(1);
    s = s.index_select(0, keep);
    t = t.index_select(0, keep);
  }
  return pythonic([&] { return distillation_kl(s, t, temperature); });
}

}  // namespace

void bind_distill(py::module_& m) {
  m.def(
      "distillation_loss",
      [](const py::handle& student, const py::handle& teacher, double temperature,
         const py::handle& mask) {
        return py::reinterpret_steal<py::object>(
            THPVariable_Wrap(distillation_loss(student, teacher, temperature, mask)));
      },
      py::arg("student_logits"), py::arg("teacher_logits"), py::kw_only(),
      py::arg("temperature") = 1.0, py::arg("mask") = py::none(),
      R"(Knowledge distillation's loss, as lopper's trainer computes it (--teacher):

    T^2 * KL(softmax(teacher_logits / T) || softmax(student_logits / T))

averaged over the rows: the logits are [..., classes], every leading position a row (a sample, or
a token of a language model). `mask` (the leading shape; nonzero = counted) leaves rows out, such
as padding. The teacher's side takes no gradient; the result is a 0-d tensor that backward()
differentiates in student_logits. Mix it with the task loss as you like, e.g.
(1 - alpha) * cross_entropy + alpha * distillation_loss(...). ValueError for logits of different
shapes or devices, a mask of the wrong shape or a temperature <= 0.)");
}

}  // namespace lopper::python
