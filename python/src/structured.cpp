// lopper.prune_structured's C++ half: prunes a model exported from the user's nn.Module (its ONNX
// bytes) as `lopper prune --structured channel|head` does, and hands back what the module needs to
// shrink in place: the new value of every parameter and buffer whose shape changed (the pruned
// graph's initializer of the same name), the pruned graph's outputs on the example inputs (the
// reference the shrunk module is checked against), and the report. python/lopper/_structured.py
// exports the module, applies the values and updates the modules' attributes. The GIL is released
// while lopper works.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "bindings.h"
#include "convert.h"
#include "lopper/analysis.h"
#include "lopper/command.h"
#include "lopper/data.h"
#include "lopper/depth.h"
#include "lopper/error.h"
#include "lopper/executor.h"
#include "lopper/graph.h"
#include "lopper/onnx_io.h"
#include "lopper/prune.h"
#include "lopper/report.h"
#include "lopper/structured.h"
#include "shrink.h"

namespace py = pybind11;

namespace lopper::python {
namespace {

// What lopper.prune_structured returns: the groups, the model's cost before and after, and what
// save_html measures.
struct StructuredPruneReport : PrunedExport {
  StructuredReport r;
  std::string unit, method, scope;
};

void structured_html(const StructuredPruneReport& s, const std::string& path) {
  std::vector<std::string> notes;
  for (const auto& b : s.r.barriers) notes.push_back("channels kept: " + b);
  notes.insert(notes.end(), s.r.warnings.begin(), s.r.warnings.end());
  write_pruning_page(s, notes, path);
}

nlohmann::json to_json(const StructuredPruneReport& s) {
  nlohmann::json j = lopper::to_json(s.r);
  j["structured"] = s.unit;
  j["method"] = s.method;
  j["scope"] = s.scope;
  put_costs(j, s.before, s.after);
  return j;
}

std::string to_text(const StructuredPruneReport& s) {
  std::string t = to_table(s.r) + cost_change(s.before, s.after);
  if (!s.r.barriers.empty()) {
    t += "barriers (channels kept):\n";
    for (const auto& b : s.r.barriers) t += "  " + b + "\n";
  }
  return t;
}

py::tuple prune_structured_onnx(
    const py::bytes& model_bytes, const std::string& unit, const py::object& method,
    const py::object& amount, const std::string& scope, double max_layer_amount, int64_t round_to,
    const py::object& exclude, const py::object& seed, const py::object& recipe,
    const py::object& data, const py::object& loss, const py::object& mask_token,
    int64_t calib_batches, const py::object& device, const std::vector<std::string>& parameters,
    const py::object& fixed, const std::map<int64_t, std::string>& kept,
    const std::vector<at::Tensor>& inputs, const py::object& progress, bool check_only,
    const std::string& name, const std::string& command,
    const std::vector<std::pair<std::string, at::Tensor>>& initializers) {
  StructuredRequest req;
  req.unit = unit;
  req.criterion = optional_arg<std::string>(method, "method", "a str");
  if (!amount.is_none()) req.amount = to_amount(amount);
  if (scope != "local") req.scope = scope;
  if (max_layer_amount != 0.9) req.max_layer_amount = max_layer_amount;  // the defaults: not given
  if (round_to != 1) req.round_to = round_to;
  req.exclude = optional_arg<std::string>(exclude, "exclude", "a str");
  req.seed = optional_arg<uint64_t>(seed, "seed", "an int >= 0");
  if (!recipe.is_none()) req.recipe = [recipe] { return recipe_arg(recipe); };
  req.data = !data.is_none();
  if (req.data) req.data_options.push_back("data");
  req.data_hint = " (an iterable of batches)";
  StructuredJob job = as_usage([&] { return req.validate(); });
  StructuredOptions& so = job.options;
  so.fixed = fixed_arg(fixed);
  so.kept_groups = kept;
  CalibrationOptions calib = calibration_arg(loss, mask_token, calib_batches, device, so.seed);
  if (check_only) return py::tuple();
  std::unique_ptr<DataLoader> loader;
  if (job.needs_data) loader = loader_arg(data, calib_batches);
  if (!progress.is_none()) calib.progress = progress_arg(progress);
  const char* bytes = PyBytes_AS_STRING(model_bytes.ptr());
  const size_t size = size_t(PyBytes_GET_SIZE(model_bytes.ptr()));
  StructuredPruneReport rep;
  rep.unit = unit, rep.method = so.criterion, rep.scope = scope;
  Shrunk shrunk;
  {
    py::gil_scoped_release nogil;
    ir::Model model = onnx::parse_model(bytes, size, initializers);
    const NamedTensors feeds = example_feeds(model, inputs);
    for (const auto& [name, t] : feeds) so.input_shapes[name] = t.sizes().vec();
    // NOTE: a report on a module counts what PyTorch counts for it: the export's own constants (a
    // zero bias the exporter gives each bias-free Conv: 4,800 values in resnet18) are not its
    // parameters (`parameters` names its buffers too: they shrink with it).
    const std::set<std::string> params(parameters.begin(), parameters.end());
    auto module_cost = [&](const ir::Model& m, ModelCost c) {
      if (params.empty()) return c;
      std::set<std::string> stats;  // BatchNorm's running statistics: buffers (as analyze())
      for (const auto& n : m.graph.nodes)
        if (n.op_type == "BatchNormalization" && n.domain.empty())
          for (size_t k = 3; k < n.inputs.size() && k < 5; ++k) stats.insert(n.inputs[k]);
      c.params = c.nonzero = 0;
      for (const auto& t : m.graph.initializers)
        if (params.count(t.name) && !stats.count(t.name) && t.value.is_floating_point()) {
          c.params += t.value.numel();
          c.nonzero += t.value.count_nonzero().item<int64_t>();
        }
      return c;
    };
    std::optional<Saliency> saliency;
    if (loader) saliency = structured_saliency(model, so, *loader, calib);
    // Shares the tensors: pruning replaces the ones it cuts.
    auto original = std::make_shared<const ir::Model>(model);
    // The analysis and the check that the shrunk graph runs are made on the example: their
    // outputs are what the module is checked against, their costs the report's.
    StructuredRuns runs;
    runs.feeds = feeds;
    so.runs = &runs;
    rep.r = prune_structured(model, so, saliency ? &*saliency : nullptr);
    shrunk = shrunk_names(*original, model, parameters);
    shrunk.before = std::move(runs.before);
    shrunk.after = std::move(runs.after);
    rep.before = module_cost(*original, std::move(runs.cost_before));
    rep.after = module_cost(model, std::move(runs.cost_after));
    rep.model_before = std::move(original);
    rep.model_after = std::make_shared<const ir::Model>(std::move(model));
    rep.shapes = so.input_shapes;
    rep.device = calib.device;
    rep.file_bytes = int64_t(size);
  }
  rep.name = name;
  rep.command = command;
  py::tuple t = to_python(std::move(shrunk));
  return py::make_tuple(t[0], t[1], t[2], t[3], t[4], rep);
}

std::vector<at::Tensor> run_export(const py::bytes& model_bytes,
                                   const std::vector<at::Tensor>& inputs,
                                   const std::string& device) {
  const char* bytes = PyBytes_AS_STRING(model_bytes.ptr());
  const size_t size = size_t(PyBytes_GET_SIZE(model_bytes.ptr()));
  py::gil_scoped_release nogil;
  const ir::Model model = onnx::parse_model(bytes, size);
  return check_run(model, example_feeds(model, inputs), device);
}

// lopper.prune_structured(unit="layer") on a transformers model, in place: which layers go (the
// scores python/lopper/_depth.py measured, or random ones), by the CLI's rules.
std::tuple<std::vector<size_t>, std::vector<std::string>, std::vector<double>> choose_layers(
    const py::object& scores, const std::vector<std::string>& names, const py::object& amount,
    const py::object& exclude, const py::object& seed) {
  const PruneAmount a = to_amount(amount);
  std::vector<double> s =
      scores.is_none()
          ? depth_random_scores(names.size(),
                                optional_arg<uint64_t>(seed, "seed", "an int >= 0").value_or(0))
          : scores.cast<std::vector<double>>();
  std::vector<std::vector<std::string>> each;
  for (const auto& n : names) each.push_back({n});
  const std::vector<std::string> blocked = as_usage([&] {
    return depth_excluded(each,
                          optional_arg<std::string>(exclude, "exclude", "a str").value_or(""));
  });
  if (std::none_of(blocked.begin(), blocked.end(), [](auto& b) { return b.empty(); }))
    throw py::value_error("[prune] exclude leaves none of the model's " +
                          std::to_string(names.size()) + " layers to remove");
  return {as_usage([&] {
            return choose_depth_units(s, blocked, a,
                                      "the model's " + std::to_string(names.size()) + " layers");
          }),
          blocked, s};
}

// The report of a structured pruning done in place without an export (layers, experts): one
// group per unit, the module's parameters before and after.
StructuredPruneReport report_in_place(const std::string& unit, const std::string& method,
                                      const std::vector<ChannelGroupReport>& groups,
                                      int64_t params_before, int64_t params_after,
                                      const std::vector<std::string>& warnings,
                                      const std::string& counted, const std::string& name,
                                      const std::string& command) {
  StructuredPruneReport rep;
  rep.unit = unit, rep.method = method, rep.scope = "local";
  rep.r.groups = groups;
  rep.r.warnings = warnings;
  rep.r.counted = counted;
  for (const auto& g : groups) {
    if (!g.blocked.empty()) continue;
    rep.r.channels_before += g.size_before;
    rep.r.channels_after += g.size_after;
  }
  rep.before.params = rep.before.nonzero = params_before;
  rep.after.params = rep.after.nonzero = params_after;
  rep.name = name, rep.command = command;
  return rep;
}

}  // namespace

void bind_structured(py::module_& m) {
  py::class_<ChannelGroupReport>(m, "ChannelGroup",
                                 R"(One channel group of lopper.prune_structured's report: channels
(or attention heads) that must go together, and what it lost.)")
      .def_readonly("id", &ChannelGroupReport::id, "The group's number (int).")
      .def_readonly("kind", &ChannelGroupReport::kind, "\"channel\" or \"head\".")
      .def_readonly("layers", &ChannelGroupReport::layers,
                    "The export's nodes that shrink with it (list of str).")
      .def_readonly("layer_params", &ChannelGroupReport::layer_params,
                    "Per layer, its weight's parameter name (\"\" for a node without one).")
      .def_readonly("size_before", &ChannelGroupReport::size_before, "Channels before (int).")
      .def_readonly("size_after", &ChannelGroupReport::size_after, "Channels after (int).")
      .def_readonly("removed", &ChannelGroupReport::removed,
                    "Indices of the removed channels (list of int).")
      .def_readonly("score", &ChannelGroupReport::score, "Mean importance of its channels (float).")
      .def_readonly("params", &ChannelGroupReport::params,
                    "Depth units (layers, blocks): the parameters that go with the unit (int; 0 "
                    "for channel groups).")
      .def_readonly("blocked", &ChannelGroupReport::blocked,
                    "Why it was kept whole (str; \"\" when it could be pruned).")
      .def("__repr__", [](const ChannelGroupReport& g) {
        return fmt::format("ChannelGroup(id={}, kind='{}', {} -> {}{})", g.id, g.kind,
                           g.size_before, g.size_after,
                           g.blocked.empty() ? "" : ", blocked='" + g.blocked + "'");
      });

  py::class_<StructuredPruneReport>(m, "StructuredReport",
                                    R"(What lopper.prune_structured did: per channel group, and the
module's parameters and MACs before and after. str(report) is the table
`lopper prune --structured` prints; report.to_dict() its JSON.)")
      .def_property_readonly(
          "groups", [](const StructuredPruneReport& s) { return s.r.groups; },
          "One ChannelGroup per group, pruned or kept (list).")
      .def_property_readonly(
          "barriers", [](const StructuredPruneReport& s) { return s.r.barriers; },
          "What kept channels whole (list of str): an op lopper cannot follow channels "
          "through, a graph output, a module that cannot change a size.")
      .def_property_readonly(
          "warnings", [](const StructuredPruneReport& s) { return s.r.warnings; },
          "What deserves a look (list of str).")
      .def_property_readonly(
          "params_before", [](const StructuredPruneReport& s) { return s.before.params; },
          "The module's parameters before (int; BatchNorm statistics not counted).")
      .def_property_readonly(
          "params", [](const StructuredPruneReport& s) { return s.after.params; },
          "Its parameters after (int).")
      .def_property_readonly(
          "macs_before", [](const StructuredPruneReport& s) { return s.before.macs; },
          "Multiply-accumulates of one call on the example inputs, before (int).")
      .def_property_readonly(
          "macs", [](const StructuredPruneReport& s) { return s.after.macs; },
          "The same after (int).")
      .def(
          "to_dict", [](const StructuredPruneReport& s) { return json_to_python(to_json(s)); },
          "The report as `lopper prune --structured` writes it in OUT.report.json (a dict).")
      .def(
          "save_html",
          [](const StructuredPruneReport& s, const py::object& path) {
            structured_html(s, path_of(path));
          },
          py::arg("path"),
          R"(Writes the page `lopper prune --structured ... --report FILE` writes: the module
before and after (parameters, MACs, file size, latency measured now on the device lopper ran on),
per-layer charts and the barriers. Written to a temporary file and renamed; an OSError when the
path cannot be written. The report keeps both exports for this (deleting it frees them).)")
      .def("__str__", &to_text)
      .def("__repr__", [](const StructuredPruneReport& s) {
        return fmt::format("StructuredReport(groups={}, params={} -> {}, macs={} -> {})",
                           s.r.groups.size(), s.before.params, s.after.params, s.before.macs,
                           s.after.macs);
      });

  py::class_<BlockInfluence>(m, "_BlockInfluence", "Block influence (lopper/depth.h). Internal.")
      .def(py::init<>())
      .def(
          "add",
          [](BlockInfluence& b, const at::Tensor& x, const at::Tensor& y, int64_t axis) {
            py::gil_scoped_release nogil;
            b.add(x.detach(), y.detach(), axis);
          },
          py::arg("x"), py::arg("y"), py::arg("axis") = -1)
      .def_property_readonly("value", &BlockInfluence::value)
      .def_property_readonly("vectors", &BlockInfluence::vectors);
  m.def("_choose_layers", &choose_layers, py::arg("scores"), py::arg("names"), py::arg("amount"),
        py::arg("exclude") = py::none(), py::arg("seed") = py::none(),
        R"((indices, blocked, scores): the indices of the layers to remove (ascending), `amount` of
those `exclude` leaves, lowest score first (`scores` None: the random criterion's, seeded), and
per layer "excluded" or "", and the scores. Internal.)");
  m.def(
      "_group",
      [](int64_t id, const std::string& kind, const std::vector<std::string>& layers,
         int64_t before, int64_t after, const std::vector<int64_t>& removed, double score,
         const std::string& blocked, int64_t params) {
        ChannelGroupReport g;
        g.id = id, g.kind = kind, g.layers = layers, g.layer_params = layers;
        g.size_before = before, g.size_after = after, g.removed = removed;
        g.score = score, g.blocked = blocked, g.params = params;
        return g;
      },
      py::arg("id"), py::arg("kind"), py::arg("layers"), py::arg("before"), py::arg("after"),
      py::arg("removed"), py::arg("score"), py::arg("blocked"), py::arg("params") = 0);
  m.def("_report_in_place", &report_in_place, py::arg("unit"), py::arg("method"), py::arg("groups"),
        py::arg("params_before"), py::arg("params_after"), py::arg("warnings"), py::arg("counted"),
        py::arg("name"), py::arg("command"),
        "A StructuredReport of pruning done in place, without an export. Internal.");
  m.def("_run_export", &run_export, py::arg("model"), py::arg("inputs"), py::arg("device") = "cpu",
        R"(The outputs of a serialized ONNX model on `inputs` (in the graph's input order), every
layer on ATen (no prepacking, no kernel timing). Internal: checks a module's export against the
module.)");
  m.def("_prune_structured_onnx", &prune_structured_onnx, py::arg("model"), py::kw_only(),
        py::arg("unit") = "channel", py::arg("method") = py::none(), py::arg("amount") = py::none(),
        py::arg("scope") = "local", py::arg("max_layer_amount") = 0.9, py::arg("round_to") = 1,
        py::arg("exclude") = py::none(), py::arg("seed") = py::none(),
        py::arg("recipe") = py::none(), py::arg("data") = py::none(),
        py::arg("loss") = py::str("auto"), py::arg("mask_token") = py::none(),
        py::arg("calib_batches") = 32, py::arg("device") = py::str("cpu"),
        py::arg("parameters") = std::vector<std::string>{}, py::arg("fixed") = py::list(),
        py::arg("kept") = std::map<int64_t, std::string>{},
        py::arg("inputs") = std::vector<at::Tensor>{}, py::arg("progress") = py::none(),
        py::arg("check_only") = false, py::arg("name") = "module",
        py::arg("command") = "lopper.prune_structured",
        py::arg("initializers") = std::vector<std::pair<std::string, at::Tensor>>{},
        R"(Prunes a serialized ONNX model's channels or heads as lopper.prune_structured says (its
arguments, the same names) and returns (values, before, after, diverged, gone,
StructuredReport): values {name: tensor} for each name of `parameters` whose initializer changed
shape, the graph's outputs on `inputs` (in the graph's input order) before and after pruning (the
runs the pruning makes anyway), the names read by several layers that shrank differently, and the
names the pruned graph no longer has. `fixed` lists (initializer, axis or -1, why) that must keep
their size; `kept` {group id: why} the groups kept whole. With `check_only`, only the arguments
are checked (and () returned), before any export. `initializers` [(name, tensor)]: initializers
the bytes leave out, handed over as tensors (copied). Internal: lopper.prune_structured exports
the module and applies the values.)");
}

}  // namespace lopper::python
