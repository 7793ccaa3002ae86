// lopper._lopper: the extension module behind the Python package (python/lopper/__init__.py).
#include <c10/util/Exception.h>
#include <pybind11/pybind11.h>

#include <exception>

#include "bindings.h"
#include "lopper/error.h"

namespace py = pybind11;

PYBIND11_MODULE(_lopper, m) {
  m.doc() = "lopper's C++ core (the package's public names are re-exported by lopper/__init__.py)";
  m.attr("__version__") = LOPPER_VERSION;

  // lopper's two kinds of failure as Python's: a bad argument (UsageError) is a ValueError, a bad
  // model or file (Error) a RuntimeError; each carries lopper's one line. ATen's own errors lose
  // their C++ backtrace.
  py::register_local_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const lopper::UsageError& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const lopper::Error& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
    } catch (const lopper::InternalError& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
    } catch (const c10::Error& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what_without_backtrace());
    }
  });

  lopper::python::bind_session(m);
  lopper::python::bind_prune(m);
  lopper::python::bind_structured(m);
  lopper::python::bind_experts(m);  // after bind_structured: its groups are ChannelGroups
  lopper::python::bind_analysis(m);
  lopper::python::bind_distill(m);
}
