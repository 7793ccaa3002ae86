// What an nn.Module needs to shrink in place from its pruned export (shrink.h).
#include "shrink.h"

#include <ATen/ATen.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <tuple>

#include "lopper/error.h"

namespace py = pybind11;

namespace lopper::python {

NamedTensors example_feeds(const ir::Model& model, const std::vector<at::Tensor>& inputs) {
  LOPPER_CHECK(inputs.size() == model.graph.inputs.size(), "[prune] the export takes ",
               model.graph.inputs.size(), " inputs, the example gives ", inputs.size());
  NamedTensors feeds;
  for (size_t i = 0; i < inputs.size(); ++i)
    feeds.emplace_back(model.graph.inputs[i].name, inputs[i]);
  return feeds;
}

Shrunk shrunk_names(const ir::Model& before, const ir::Model& after,
                    const std::vector<std::string>& names) {
  Shrunk s;
  for (const auto& name : names) {
    const ir::Initializer* was = before.graph.find_initializer(name);
    if (!was) continue;
    // A reader whose slice differs from another's got its own copy, NAME_pruned[_k].
    const std::string copy = name + "_pruned";
    for (const auto& i : after.graph.initializers)
      if (i.name.rfind(copy, 0) == 0 &&
          (i.name.size() == copy.size() || i.name[copy.size()] == '_'))
        s.diverged.push_back(name);
    const ir::Initializer* now = after.graph.find_initializer(name);
    if (!now)
      s.gone.push_back(name);
    else if (now->value.sizes() != was->value.sizes())
      s.values.emplace_back(name, now->value);
  }
  return s;
}

Shrunk shrunk_values(const ir::Model& before, const ir::Model& after,
                     const std::vector<std::string>& names, const NamedTensors& feeds,
                     const std::string& device, bool run_before) {
  Shrunk s = shrunk_names(before, after, names);
  if (run_before) s.before = check_run(before, feeds, device);
  s.after = check_run(after, feeds, device);
  return s;
}

std::vector<at::Tensor> check_run(const ir::Model& model, const NamedTensors& feeds,
                                  const std::string& device) {
  // One run, a check: every node as it is, on ATen, no copies, no kernel timing (which would
  // cost more than the run on a module's fresh weights).
  ExecOptions eo = shape_options();
  eo.device = device;
  return Executor(model, eo).run(feeds);
}

py::tuple to_python(Shrunk&& s) {
  py::dict values;
  for (auto& [name, t] : s.values) values[py::str(name)] = py::cast(std::move(t));
  return py::make_tuple(values, s.before, s.after, s.diverged, s.gone);
}

std::vector<FixedAxis> fixed_arg(const py::handle& fixed) {
  std::vector<FixedAxis> out;
  for (auto item : fixed) {
    auto t = item.cast<std::tuple<std::string, int64_t, std::string>>();
    out.push_back({std::get<0>(t), std::get<1>(t), std::get<2>(t)});
  }
  return out;
}

}  // namespace lopper::python
