// What an nn.Module needs to shrink in place from its pruned export (lopper.prune_structured and
// lopper.prune_to_target(structured=True); python/lopper/_structured.py applies it).
#pragma once

#include <ATen/core/Tensor.h>
#include <pybind11/pybind11.h>

#include <string>
#include <utility>
#include <vector>

#include "lopper/executor.h"
#include "lopper/graph.h"
#include "lopper/structured.h"

namespace lopper::python {

struct Shrunk {
  /// Per name of the module's parameters and buffers whose initializer changed shape: the pruned
  /// graph's value under that name.
  std::vector<std::pair<std::string, at::Tensor>> values;
  std::vector<at::Tensor> before, after;  // the graph's outputs on the example, before and after
  /// Names read by layers that shrank differently (the graph gave a reader its own copy), and
  /// names the pruned graph no longer has: the module cannot hold either.
  std::vector<std::string> diverged, gone;
};

/// `inputs` (the example's tensors in the export's input order) as the graph's named inputs.
/// Throws lopper::Error when their count differs from the graph's.
NamedTensors example_feeds(const ir::Model& model, const std::vector<at::Tensor>& inputs);

/// Shrunk's values, diverged and gone names: `after` compared with `before` for the parameters and
/// buffers `names` (no run).
Shrunk shrunk_names(const ir::Model& before, const ir::Model& after,
                    const std::vector<std::string>& names);

/// Compares `after` with `before` for the parameters and buffers `names` and runs `after` on
/// `feeds` on `device`, and `before` too unless `run_before` is false (Shrunk::before is empty
/// then: a caller that prunes the same model again has its outputs already). Call with the GIL
/// released.
Shrunk shrunk_values(const ir::Model& before, const ir::Model& after,
                     const std::vector<std::string>& names, const NamedTensors& feeds,
                     const std::string& device, bool run_before = true);

/// The outputs of one run of `model` on `feeds` on `device`, every node as it is on ATen (no
/// fusion, no prepacked copies, no kernel timing): what a check of a module against its graph
/// runs. Call with the GIL released.
std::vector<at::Tensor> check_run(const ir::Model& model, const NamedTensors& feeds,
                                  const std::string& device);

/// (values {name: tensor}, before, after, diverged, gone), as _structured._shrink_in_place takes
/// them.
pybind11::tuple to_python(Shrunk&& s);

/// (parameter, axis, why) tuples (_structured._fixed) as FixedAxis.
std::vector<FixedAxis> fixed_arg(const pybind11::handle& fixed);

}  // namespace lopper::python
