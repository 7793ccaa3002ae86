// The Python module's parts: one bind_<concern> per binding file, each called once from
// module.cpp's PYBIND11_MODULE.
#pragma once

#include <pybind11/pybind11.h>

namespace lopper::python {

/// lopper.InferenceSession and lopper.NodeArg (session.cpp).
void bind_session(pybind11::module_& m);
/// lopper.PruneReport, lopper.PruneLayerReport and _prune_onnx, behind lopper.prune (prune.cpp).
void bind_prune(pybind11::module_& m);

}  // namespace lopper::python
