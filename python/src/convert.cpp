// What the bindings share (convert.h).
#include "convert.h"

#include <pybind11/stl.h>
#include <torch/csrc/autograd/python_variable.h>
#include <set>

#include "lopper/executor.h"
#include "lopper/onnx_io.h"

namespace py = pybind11;

namespace lopper::python {

std::string type_name(py::handle h) { return Py_TYPE(h.ptr())->tp_name; }

std::string python_option(const std::string& option) {
  if (option == "criterion") return "method";
  if (option == "batches") return "calib_batches";
  if (option == "one_pass") return "sequential=False";
  if (option == "distill_temperature") return "temperature";  // lopper.distillation_loss
  if (option == "target_params") return "params";
  if (option == "target_macs") return "macs";
  if (option == "target_latency" || option == "target_latency-ms") return "latency_ms";
  return option;
}

PruneAmount to_amount(py::handle a) {
  const std::string wanted =
      "[prune] amount must be a float (a fraction) or an int (a count), got ";
  if (PyBool_Check(a.ptr())) throw py::type_error(wanted + "bool");
  // A tensor or array is a number only when it is 0-d (float() also takes one element of more).
  if (py::hasattr(a, "ndim") && !PyLong_Check(a.ptr()) && !PyFloat_Check(a.ptr())) {
    const py::object ndim = a.attr("ndim");
    if (!PyLong_Check(ndim.ptr()) || ndim.cast<int64_t>() != 0)
      throw py::type_error(wanted + type_name(a) + " that is not 0-d");
  }
  PruneAmount out;
  // NOTE: as torch's numbers.Integral: an int, numpy's integers, anything with __index__ (a 0-d
  // integer tensor or array too). A float tensor or array has __index__ as well, which refuses it:
  // it is then a number through __float__, as float() takes it.
  if (PyIndex_Check(a.ptr()) && !PyFloat_Check(a.ptr())) {
    if (PyObject* i = PyNumber_Index(a.ptr())) {
      const auto index = py::reinterpret_steal<py::int_>(i);
      int overflow = 0;
      const long long v = PyLong_AsLongLongAndOverflow(index.ptr(), &overflow);
      if (overflow != 0)
        throw UsageError("[prune] amount " + py::str(index).cast<std::string>() +
                         " is not a count of weights (more than any model holds)");
      out.value = double(v);
      out.is_count = true;
      return out;
    }
    PyErr_Clear();
  }
  if (PyFloat_Check(a.ptr()) || py::hasattr(a, "__float__")) {
    out.value = PyFloat_AsDouble(a.ptr());
    if (PyErr_Occurred()) {
      PyErr_Clear();  // a tensor or array of several numbers: not a number
      throw py::type_error(wanted + type_name(a) + " that is not one number");
    }
    return out;
  }
  throw py::type_error(wanted + type_name(a));
}

std::string string_arg(py::handle h, const char* what) {
  if (!py::isinstance<py::str>(h))
    throw py::type_error(std::string("[prune] ") + what + " must be a str, got " + type_name(h));
  return h.cast<std::string>();
}

std::string path_of(py::handle p) {
  const auto path = py::module_::import("os").attr("fsdecode")(p).cast<std::string>();
  // NOTE: as open() refuses it: the C library would cut the path at the NUL ("victim\0.html"
  // would write "victim").
  if (path.find('\0') != std::string::npos)
    throw py::value_error("[io] the path " + py::repr(p).cast<std::string>() +
                          " holds an embedded null byte");
  return path;
}

// --- Calibration batches ---------------------------------------------------------------------

static at::Tensor batch_tensor(py::handle h, const std::string& where) {
  if (!THPVariable_Check(h.ptr()))
    throw py::type_error("[prune] data: " + where + " is a " + type_name(h) +
                         ", not a torch.Tensor");
  return THPVariable_Unpack(h.ptr()).detach();
}

// {input name: tensor, ..., "labels": tensor}: the samples are input_ids when given, else the first
// input.
static void from_mapping(py::handle m, Batch& b, const std::string& where) {
  py::object items = m.attr("items")();
  std::string first;
  for (auto kv : items) {
    auto pair = kv.cast<py::tuple>();
    if (!py::isinstance<py::str>(pair[0]))
      throw py::type_error("[prune] data: " + where + " has a key of type " + type_name(pair[0]) +
                           " (input names are str)");
    const auto name = pair[0].cast<std::string>();
    if (pair[1].is_none()) continue;
    at::Tensor t = batch_tensor(pair[1], where + "['" + name + "']");
    if (name == "labels") {
      b.y = t;
    } else {
      if (first.empty()) first = name;
      b.inputs.emplace_back(name, t);
    }
  }
  std::string x = first;
  for (const auto& [name, t] : b.inputs)
    if (name == "input_ids") x = name;
  if (x.empty()) throw UsageError("[prune] data: " + where + " names no model input");
  for (auto it = b.inputs.begin(); it != b.inputs.end(); ++it)
    if (it->first == x) {
      b.x = it->second;
      b.x_input = x;
      b.inputs.erase(it);
      break;
    }
}

Batch to_batch(py::handle item, size_t i) {
  const std::string where = "batch " + std::to_string(i);
  const py::object mapping = py::module_::import("collections.abc").attr("Mapping");
  Batch b;
  if (THPVariable_Check(item.ptr())) {
    b.x = batch_tensor(item, where);
  } else if (py::isinstance(item, mapping)) {
    from_mapping(item, b, where);
  } else if (py::isinstance<py::tuple>(item) || py::isinstance<py::list>(item)) {
    auto seq = item.cast<py::sequence>();
    if (seq.size() < 1 || seq.size() > 2)
      throw UsageError("[prune] data: " + where + " has " + std::to_string(seq.size()) +
                       " items; give (samples, labels), (samples,) or samples");
    const py::object samples = seq[0];
    if (py::isinstance(samples, mapping))
      from_mapping(samples, b, where + "[0]");
    else
      b.x = batch_tensor(samples, where + "[0]");
    const py::object labels = seq.size() == 2 ? py::object(seq[1]) : py::none();
    if (!labels.is_none()) {
      if (b.y.defined())
        throw UsageError("[prune] data: " + where +
                         " gives labels twice (in the mapping and beside it)");
      b.y = batch_tensor(labels, where + "[1]");
    }
  } else {
    throw py::type_error("[prune] data: " + where + " is a " + type_name(item) +
                         "; give tensors, (samples, labels) tuples or dicts of named inputs");
  }
  return b;
}

py::object json_to_python(const nlohmann::json& j) {
  return py::module_::import("json").attr("loads")(j.dump());
}

CalibrationOptions calibration_arg(py::handle loss, py::handle mask_token, int64_t calib_batches,
                                   py::handle device, uint64_t seed) {
  CalibrationOptions c;
  if (calib_batches < 1)
    throw UsageError("[prune] calib_batches must be >= 1, got " + std::to_string(calib_batches));
  c.batches = calib_batches;
  c.device = string_arg(device, "device");
  (void)check_device(c.device);  // a bad spec is a ValueError, CUDA without a GPU a RuntimeError
  c.loss.seed = seed;
  const std::string name = string_arg(loss, "loss");
  c.loss.loss = as_usage([&] { return parse_loss(name); });
  if (!mask_token.is_none())
    c.loss.mask_token = optional_arg<int64_t>(mask_token, "mask_token", "an int").value();
  as_usage([&] { check_loss_options(c.loss); });
  return c;
}

std::unique_ptr<DataLoader> loader_arg(py::handle data, int64_t limit) {
  if (!py::hasattr(data, "__iter__"))
    throw py::type_error("[prune] data must be an iterable of batches, got " + type_name(data));
  std::vector<Batch> batches;
  for (auto item : data) {
    batches.push_back(to_batch(item, batches.size()));
    if (int64_t(batches.size()) == limit) break;
  }
  return as_usage([&] { return std::make_unique<DataLoader>(std::move(batches), "data"); });
}

std::function<void(int64_t, int64_t, double)> progress_arg(const py::object& progress) {
  return [progress](int64_t done, int64_t total, double loss) {
    py::gil_scoped_acquire gil;
    progress(done, total, loss);
    // NOTE: Ctrl-C reaches Python only when it runs: let it stop the work here.
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
  };
}

std::map<std::string, std::vector<int64_t>> input_shapes(
    const ir::Model& model, const std::vector<std::vector<int64_t>>& example) {
  std::map<std::string, std::vector<int64_t>> out;
  std::vector<std::string> names;
  for (const auto& v : model.graph.inputs)
    if (!model.graph.find_initializer(v.name)) names.push_back(v.name);
  if (names.size() != example.size()) return out;  // dynamic dims default to 1
  for (size_t i = 0; i < names.size(); ++i) out[names[i]] = example[i];
  return out;
}

// The names of the export's weights that are not the module's parameters (constants), as one
// anchored regex: lopper leaves them out ("" when there are none).
std::string constants_regex(const ir::Model& model, const std::set<std::string>& params) {
  std::string any;
  for (const auto& w : prunable_weights(model.graph)) {
    if (params.count(w.weight)) continue;
    std::string escaped;
    for (char c : w.weight) {
      if (std::string("\\^$.|?*+()[]{}").find(c) != std::string::npos) escaped += '\\';
      escaped += c;
    }
    any += (any.empty() ? "" : "|") + escaped;
  }
  return any.empty() ? "" : "^(?:" + any + ")$";
}

void exclude_also(std::string& exclude, const std::string& regex) {
  if (regex.empty()) return;
  exclude = exclude.empty() ? regex : "(?:" + exclude + ")|" + regex;
}

std::pair<ReportModel, ReportModel> measure_before_after(
    const ir::Model& before, const ir::Model& after, const ModelCost& cost_before,
    const ModelCost& cost_after, const ReportMeasure& how, int64_t file_bytes,
    std::vector<std::string>& warnings) {
  ReportModel mb = measure_report_model("before", before, cost_before, how);
  ReportModel ma = measure_report_model("after", after, cost_after, how);
  mb.file_bytes = file_bytes;
  ma.file_bytes = int64_t(onnx::serialize_model(after).size());
  for (const ReportModel* m : {&mb, &ma})
    if (!m->latency_warning.empty()) warnings.push_back(m->label + ": " + m->latency_warning);
  return {std::move(mb), std::move(ma)};
}

void write_pruning_page(const PrunedExport& e, const PageParts& parts, const std::string& path) {
  if (!e.model_before || !e.model_after)
    throw Error(
        "[prune] this module was pruned in place, without an export: there is no page to "
        "write (export the pruned module to ONNX and run lopper inspect or bench on it)");
  HtmlReport rep("prune", "Pruning " + e.name, e.command);
  std::vector<std::string> warnings;
  {
    py::gil_scoped_release nogil;
    ReportMeasure how;
    how.device = e.device;
    how.shapes = e.shapes;
    auto [mb, ma] = measure_before_after(*e.model_before, *e.model_after, e.before, e.after, how,
                                         e.file_bytes, warnings);
    if (parts.accuracy) parts.accuracy(mb, ma);
    rep.add_model(mb, e.before);
    rep.add_model(ma, e.after);
    if (parts.sections) parts.sections(rep, mb, ma);
  }
  for (const auto& w : warnings) warn("[prune] " + w);
  write_page(rep, path);
}

void write_pruning_page(const PrunedExport& e, const std::vector<std::string>& notes,
                        const std::string& path) {
  PageParts parts;
  parts.sections = [&](HtmlReport& rep, const ReportModel&, const ReportModel&) {
    for (const auto& n : notes) rep.add_note(n);
  };
  write_pruning_page(e, parts, path);
}

void write_page(const HtmlReport& rep, const std::string& path) {
  try {
    rep.write(path);
  } catch (const Error& e) {
    PyErr_SetString(PyExc_OSError, e.what());
    throw py::error_already_set();
  }
}

void warn(const std::string& text) {
  if (PyErr_WarnEx(PyExc_UserWarning, text.c_str(), 1) != 0) throw py::error_already_set();
}

PruneRecipe recipe_arg(py::handle recipe) {
  const py::object mapping = py::module_::import("collections.abc").attr("Mapping");
  if (py::isinstance(recipe, mapping)) {
    // NOTE: JSON is YAML: the dict goes through the recipe parser as it is, so its errors and
    // checks are the YAML file's (line numbers count the indented JSON's lines).
    py::object text;
    try {
      text = py::module_::import("json").attr("dumps")(recipe, py::arg("indent") = 1);
    } catch (py::error_already_set& e) {
      // A dict that holds itself, nests deeper than Python recurses, or holds what is not a
      // plain value (a tensor): one line in lopper's words, not json's.
      const bool wrong_type = e.matches(PyExc_TypeError);
      std::string why = py::str(e.value()).cast<std::string>();
      why = why.substr(0, why.find('\n'));
      if (wrong_type) throw py::type_error("[prune] recipe: " + why);
      throw UsageError("[prune] recipe is not a tree of plain values (" + why + ")");
    }
    const auto yaml = text.cast<std::string>();
    return as_usage([&] { return parse_prune_recipe(yaml, "recipe"); });
  }
  if (py::isinstance<py::str>(recipe) || py::hasattr(recipe, "__fspath__")) {
    const std::string path = path_of(recipe);
    return as_usage([&] { return load_prune_recipe(path); });
  }
  throw py::type_error("[prune] recipe must be a dict or the path of a YAML file, got " +
                       type_name(recipe));
}

}  // namespace lopper::python
