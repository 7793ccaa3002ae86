// The Python module's parts: one bind_<concern> per binding file, each called once from
// module.cpp's PYBIND11_MODULE.
#pragma once

#include <pybind11/pybind11.h>

#include <string>

namespace lopper {
struct SensitivityResult;  // lopper/sensitivity.h
}

namespace lopper::python {

/// lopper.InferenceSession and lopper.NodeArg (session.cpp).
void bind_session(pybind11::module_& m);
/// lopper.PruneReport, lopper.PruneLayerReport and _prune_onnx, behind lopper.prune (prune.cpp).
void bind_prune(pybind11::module_& m);
/// lopper.StructuredReport and _prune_structured_onnx, behind lopper.prune_structured
/// (structured.cpp).
void bind_structured(pybind11::module_& m);
/// lopper.SensitivityReport, lopper.TargetReport and their C++ halves, behind lopper.sensitivity
/// and lopper.prune_to_target (analysis.cpp).
void bind_analysis(pybind11::module_& m);
/// A lopper.SensitivityReport of curves measured without an export (experts.cpp's sweep over the
/// experts; analysis.cpp): `name` and `command` as the report's; save_html refuses it.
pybind11::object sensitivity_report(SensitivityResult r, const std::string& name,
                                    const std::string& command);
/// lopper.ExpertReport and the C++ half of lopper.prune_structured(..., unit="expert")
/// (experts.cpp).
void bind_experts(pybind11::module_& m);
/// lopper.distillation_loss (distill.cpp).
void bind_distill(pybind11::module_& m);

}  // namespace lopper::python
