// lopper.prune's C++ half: prunes a model exported from the user's nn.Module (its ONNX bytes) as
// `lopper prune` does — every criterion, local or global, N:M, rows, columns, blocks, recipes,
// gradient criteria on the user's batches, wanda, sparsegpt and OWL calibrated block by block on
// them — and hands back one keep-mask per pruned weight (what the CLI writes: weight != 0), the new
// values of the weights whose kept entries changed (sparsegpt updates them), and the report.
// python/lopper/_prune.py exports the module, copies the values into the parameters and applies
// the masks with torch.nn.utils.prune. The GIL is released while lopper works.
#include <ATen/ATen.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "bindings.h"
#include "convert.h"
#include "lopper/analysis.h"
#include "lopper/command.h"
#include "lopper/data.h"
#include "lopper/error.h"
#include "lopper/executor.h"
#include "lopper/graph.h"
#include "lopper/loss.h"
#include "lopper/onnx_io.h"
#include "lopper/prune.h"
#include "lopper/report.h"

namespace py = pybind11;

namespace lopper::python {
namespace {

py::list shared_of(const PruneLayerReport& l) {
  py::list out;
  for (const auto& u : l.shared) {
    py::dict d;
    d["node"] = u.node;
    d["op"] = u.op;
    d["use"] = u.use;
    d["module"] = u.module;
    out.append(d);
  }
  return out;
}

// --- The call --------------------------------------------------------------------------------

// The library's defaults (the papers': Wanda, SparseGPT, OWL), as lopper.prune's signature has
// them.
const int64_t kBlockSize = PruneLayerOptions{}.block_size;
const double kDampening = PruneLayerOptions{}.dampening;
const double kOwlM = OwlOptions{}.m;
constexpr int64_t kCalibSamples = CalibrationOptions::kLayerInputSamples;

// lopper.prune's arguments as the library's request: an argument left at its default is not
// given (the one-shot arguments have the papers' values as defaults: only others are given).
PruneRequest prune_request(const py::object& method, const py::object& amount,
                           const py::object& threshold, const py::object& scope,
                           const py::object& pattern, const py::object& norm,
                           const py::object& seed, const py::object& exclude, bool skip_first_last,
                           bool allow_tied, const py::object& recipe, bool have_data,
                           const std::optional<int64_t>& calib_batches,
                           const py::object& block_size, const py::object& dampening,
                           const py::object& owl_lambda, const py::object& owl_m, bool sequential) {
  PruneRequest r;
  r.criterion = optional_arg<std::string>(method, "method", "a str");
  if (!r.criterion && recipe.is_none()) r.criterion = "l1";  // lopper.prune's default
  if (!amount.is_none()) r.amount = to_amount(amount);
  r.threshold = optional_arg<double>(threshold, "threshold", "a float");
  if (const std::string s = string_arg(scope, "scope"); s != "local") r.scope = s;
  r.pattern = optional_arg<std::string>(pattern, "pattern", "a str");
  r.norm = optional_arg<int>(norm, "norm", "1 or 2");
  r.seed = optional_arg<uint64_t>(seed, "seed", "an int >= 0");
  r.exclude = optional_arg<std::string>(exclude, "exclude", "a str");
  r.skip_first_last = skip_first_last;
  r.allow_tied = allow_tied;
  if (!recipe.is_none()) r.recipe = [recipe] { return recipe_arg(recipe); };
  // NOTE: a bool is an int to pybind11; as a block size it is a mistake.
  if (PyBool_Check(block_size.ptr()))
    throw py::type_error("[prune] block_size must be an int, got bool");
  r.block_size = optional_arg<int64_t>(block_size, "block_size", "an int");
  if (r.block_size == kBlockSize) r.block_size.reset();
  r.dampening = optional_arg<double>(dampening, "dampening", "a float");
  if (r.dampening == kDampening) r.dampening.reset();
  r.owl_lambda = optional_arg<double>(owl_lambda, "owl_lambda", "a float");
  r.owl_m = optional_arg<double>(owl_m, "owl_m", "a float");
  if (r.owl_m == kOwlM) r.owl_m.reset();
  r.one_pass = !sequential;
  r.batches = calib_batches;
  r.data = have_data;
  if (have_data) r.data_options.push_back("data");
  if (calib_batches) r.data_options.push_back("batches");
  r.data_hint = " (an iterable of batches)";
  return r;
}

// lopper.prune's calib_batches: None or an int (a bool is a mistake, not a count).
std::optional<int64_t> calib_batches_of(const py::object& calib_batches) {
  if (PyBool_Check(calib_batches.ptr()))
    throw py::type_error("[prune] calib_batches must be an int, got bool");
  return optional_arg<int64_t>(calib_batches, "calib_batches", "an int");
}

}  // namespace

// The calibration batches of wanda, sparsegpt and OWL, as the CLI reads them: `limit` batches
// (without one, enough for the papers' 128 samples, counted in batches of the first one's size),
// and a last batch smaller than the first left out (the CLI's drop_last: a torch DataLoader's
// remainder) when others are there. Also lopper.prune_to_target's (analysis.cpp).
// The items chosen, each also converted into `batches` (the conversion reads every item once).
py::list calibration_items(py::handle data, std::optional<int64_t> limit,
                           std::vector<Batch>& batches) {
  if (!py::hasattr(data, "__iter__"))
    throw py::type_error("[prune] data must be an iterable of batches, got " + type_name(data));
  auto samples = [](const Batch& b) { return b.x.dim() > 0 ? b.x.size(0) : int64_t(0); };
  py::list items;
  int64_t want = limit.value_or(0);
  bool ended = true;  // the iterable ran out before `want` batches
  for (auto item : data) {
    batches.push_back(to_batch(item, batches.size()));
    items.append(item);
    if (!limit && batches.size() == 1) {
      const int64_t b = std::max<int64_t>(samples(batches.front()), 1);
      want = (kCalibSamples + b - 1) / b;
    }
    if (int64_t(batches.size()) == want) {
      ended = false;
      break;
    }
  }
  if (ended && batches.size() > 1 && samples(batches.back()) < samples(batches.front())) {
    items.attr("pop")();
    batches.pop_back();
  }
  return items;
}

py::list calibration_items(py::handle data, std::optional<int64_t> limit) {
  std::vector<Batch> batches;
  return calibration_items(data, limit, batches);
}

std::unique_ptr<DataLoader> calibration_loader(py::handle data, std::optional<int64_t> limit) {
  std::vector<Batch> batches;
  (void)calibration_items(data, limit, batches);
  return as_usage([&] { return std::make_unique<DataLoader>(std::move(batches), "data"); });
}

namespace {

// lopper.prune's report: the library's, and what save_html measures.
struct ModulePruneReport : PruneReport, PrunedExport {};

constexpr const char* kNotParameter =
    "not a parameter of the module (a buffer or a constant of the export)";

}  // namespace

// Whether pruning changed the weights it kept (sparsegpt's update), not only zeroed some: `after`
// differs from `before` where it is nonzero. Also lopper.prune_to_target's (analysis.cpp).
bool kept_changed(const at::Tensor& before, const at::Tensor& after) {
  if (!before.sizes().equals(after.sizes()) || before.scalar_type() != after.scalar_type())
    return true;
  const at::Tensor b = before.to(after.device());
  return !at::equal(after, at::where(after.ne(0), b, at::zeros_like(b)));
}

namespace {

py::tuple prune_onnx(const py::bytes& model_bytes, const py::object& method,
                     const py::object& amount, const py::object& threshold, const py::object& scope,
                     const py::object& pattern, const py::object& norm, const py::object& seed,
                     const py::object& exclude, bool skip_first_last, bool allow_tied,
                     const py::object& recipe, const py::object& data, const py::object& loss,
                     const py::object& mask_token, const py::object& calib_batches_arg,
                     const py::object& device, const py::object& block_size,
                     const py::object& dampening, const py::object& owl_lambda,
                     const py::object& owl_m, bool sequential,
                     const std::vector<std::string>& parameters, const py::object& progress,
                     const std::vector<std::vector<int64_t>>& example, const std::string& name,
                     const std::string& command) {
  const std::optional<int64_t> calib_batches = calib_batches_of(calib_batches_arg);
  const PruneRequest request = prune_request(
      method, amount, threshold, scope, pattern, norm, seed, exclude, skip_first_last, allow_tied,
      recipe, !data.is_none(), calib_batches, block_size, dampening, owl_lambda, owl_m, sequential);
  PruneJob job = as_usage([&] { return request.validate(); });
  CalibrationOptions calib = calibration_arg(loss, mask_token, calib_batches.value_or(32), device,
                                             request.seed.value_or(0));
  calib.sequential = sequential;
  std::unique_ptr<DataLoader> loader;
  if (job.reads_inputs) {
    loader = calibration_loader(data, calib_batches);
    // NOTE: prune_calibrated() needs every batch it is told of; the user's iterable may hold
    // fewer than asked, as grad's "at most calib_batches" has it.
    calib.batches = loader->batches_per_epoch();
  } else if (job.needs_data) {
    loader = loader_arg(data, calib.batches);
  }
  if (!progress.is_none()) {
    calib.progress = progress_arg(progress);
    calib.on_pass = [progress](int64_t pass, int64_t of, const std::string& what) {
      py::gil_scoped_acquire gil;
      progress(pass, of, what);  // as the pass starts: the block being calibrated
      // NOTE: Ctrl-C reaches Python only when it runs: let it stop the work here.
      if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    };
  }
  const std::set<std::string> params(parameters.begin(), parameters.end());

  const char* bytes = PyBytes_AS_STRING(model_bytes.ptr());
  const size_t size = size_t(PyBytes_GET_SIZE(model_bytes.ptr()));
  ModulePruneReport report;
  std::vector<std::pair<std::string, at::Tensor>> masks, values;
  {
    py::gil_scoped_release nogil;
    ir::Model model = onnx::parse_model(bytes, size);
    report.shapes = input_shapes(model, example);
    const auto shapes = resolve_input_shapes(model, report.shapes, 1);
    report.before = analyze(model, shapes);
    auto before = std::make_shared<const ir::Model>(model);  // shares the tensors
    // Weights the module does not hold as parameters (torch.nn.utils.prune masks parameters only)
    // are left alone, with the reason in their row.
    std::set<std::string> constants;
    for (const auto& w : prunable_weights(model.graph))
      if (!params.count(w.weight)) constants.insert(w.weight);
    if (const std::string anchored = constants_regex(model, params); !anchored.empty()) {
      if (job.options) {
        exclude_also(job.options->exclude, anchored);
      } else {
        PruneRule skip;
        skip.match = anchored;
        skip.skip = true;
        skip.where = "(parameters only)";
        job.recipe->rules.insert(job.recipe->rules.begin(), skip);
      }
    }
    if (job.reads_inputs) {
      // NOTE: not as_usage: what prune_calibrated() throws past the options' checks is mostly the
      // model's or the data's doing (batches the model cannot take, a singular Hessian).
      static_cast<PruneReport&>(report) =
          pythonic([&] { return job.run(model, loader.get(), calib); });
    } else {
      // NOTE: the options were checked above, so what prune() still refuses is options that do
      // not fit this model (a count past a layer's size, a pattern that no layer's shape divides,
      // an exclude that leaves no layer): the arguments' doing, as torch's ValueError for an
      // amount past a tensor's size. (A gradient calibration's failure is the data's: kept.)
      std::optional<Saliency> saliency;
      if (job.needs_data) saliency = compute_saliency(model, *loader, calib);
      const Saliency* sal = saliency ? &*saliency : nullptr;
      static_cast<PruneReport&>(report) = as_usage([&] {
        return job.options ? prune(model, *job.options, sal) : prune(model, *job.recipe, sal);
      });
    }
    report.after = analyze(model, shapes);
    for (auto& l : report.layers) {
      if (constants.count(l.weight)) {
        l.skipped = kNotParameter;
        l.rule.clear();
        continue;
      }
      if (!l.skipped.empty()) continue;
      const ir::Initializer* w = model.graph.find_initializer(l.weight);
      LOPPER_ASSERT(w, "no initializer '", l.weight, "' after pruning");
      masks.emplace_back(l.weight, w->value.ne(0));
      const ir::Initializer* was = before->graph.find_initializer(l.weight);
      LOPPER_ASSERT(was, "no initializer '", l.weight, "' before pruning");
      if (kept_changed(was->value, w->value)) values.emplace_back(l.weight, w->value);
    }
    report.model_before = std::move(before);
    report.model_after = std::make_shared<const ir::Model>(std::move(model));
    report.device = calib.device;
    report.file_bytes = int64_t(size);
  }
  report.name = name;
  report.command = command;
  py::dict out;
  for (auto& [name, mask] : masks) out[py::str(name)] = py::cast(std::move(mask));
  py::dict changed;
  for (auto& [name, value] : values) changed[py::str(name)] = py::cast(std::move(value));
  return py::make_tuple(out, changed, report);
}

// lopper.prune's one-shot path for a model it runs block by block (python/lopper/_blocks.py):
// the Python runner runs the module's own blocks and hands each layer's input on; every rule,
// criterion and the solver are prune_calibrated()'s. After each segment its pruned weights go to
// the runner (apply(masks, values)) before it runs the segment again; the layer model then drops
// its copies, so that memory stays at the module's plus one block's.
class PyRunner final : public CalibrationRunner {
 public:
  PyRunner(py::object runner, ir::Model& layers, std::vector<ModuleLayer> originals)
      : runner_(std::move(runner)), layers_(layers) {
    for (auto& l : originals) original_[l.param] = std::move(l.weight);
    for (const auto& n : layers.graph.nodes)
      if (n.op_type != "Gather") weight_of_[n.name] = n.inputs[1];
  }

  void collect(const CalibrationSegment& s, const std::vector<std::string>& watched,
               const Observe& observe) override {
    py::gil_scoped_acquire gil;
    py::cpp_function see(
        [&observe](const std::string& layer, const at::Tensor& x) { observe(layer, x); });
    runner_.attr("collect")(s.name, s.block, s.layers, watched, see);
    check_signals();
  }

  void advance(const CalibrationSegment& s) override {
    apply(s.layers);
    py::gil_scoped_acquire gil;
    runner_.attr("advance")(s.name, s.block);
    check_signals();
  }

  // Hands the runner the pruned weights of `layers` not handed yet: {parameter: keep-mask} and
  // {parameter: new value} where the kept entries changed (sparsegpt).
  void apply(const std::vector<std::string>& layers) {
    py::gil_scoped_acquire gil;
    py::dict masks, values;
    for (const auto& layer : layers) {
      const std::string& w = weight_of_.at(layer);
      if (!applied_.insert(w).second) continue;
      ir::Initializer* init = layers_.graph.find_initializer(w);
      LOPPER_ASSERT(init, "no initializer '", w, "' in the layer model");
      const at::Tensor& was = original_.at(w);
      if (init->value.is_same(was)) continue;  // left alone
      masks[py::str(w)] = py::cast(init->value.ne(0));
      if (kept_changed(was, init->value)) values[py::str(w)] = py::cast(init->value);
      init->value = was;  // the runner holds the new values now
    }
    if (!masks.empty()) runner_.attr("apply")(masks, values);
  }

 private:
  static void check_signals() {
    // NOTE: Ctrl-C reaches Python only when it runs: let it stop the work here.
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
  }

  py::object runner_;
  ir::Model& layers_;
  std::map<std::string, at::Tensor> original_;
  std::unordered_map<std::string, std::string> weight_of_;
  std::set<std::string> applied_;
};

std::vector<ModuleLayer> module_layers(const py::list& layers) {
  std::vector<ModuleLayer> out;
  for (auto item : layers) {
    const py::dict d = item.cast<py::dict>();
    ModuleLayer l;
    l.name = d["name"].cast<std::string>();
    l.param = d["param"].cast<std::string>();
    l.op = d["op"].cast<std::string>();
    l.weight = THPVariable_Unpack(d["weight"].ptr()).detach();
    if (d.contains("strides")) l.strides = d["strides"].cast<std::vector<int64_t>>();
    if (d.contains("pads")) l.pads = d["pads"].cast<std::vector<int64_t>>();
    if (d.contains("dilations")) l.dilations = d["dilations"].cast<std::vector<int64_t>>();
    if (d.contains("group")) l.group = d["group"].cast<int64_t>();
    if (d.contains("embedding")) l.embedding = d["embedding"].cast<std::string>();
    out.push_back(std::move(l));
  }
  return out;
}

// Prunes the layers as lopper.prune says, without an export: by their weights alone, or calibrated
// by the runner (wanda, sparsegpt, OWL). None when a criterion ranks by gradients (lopper.prune
// then exports the module); else the report, the runner having applied every pruned weight.
py::object prune_layers(const py::list& layer_list, const py::object& runner,
                        const py::object& method, const py::object& amount,
                        const py::object& threshold, const py::object& scope,
                        const py::object& pattern, const py::object& norm, const py::object& seed,
                        const py::object& exclude, bool skip_first_last, bool allow_tied,
                        const py::object& recipe, const py::object& data,
                        const py::object& calib_batches_arg, const py::object& device,
                        const py::object& block_size, const py::object& dampening,
                        const py::object& owl_lambda, const py::object& owl_m, bool sequential,
                        const py::object& progress, int64_t module_params, const std::string& name,
                        const std::string& command) {
  const std::optional<int64_t> calib_batches = calib_batches_of(calib_batches_arg);
  const PruneRequest request = prune_request(
      method, amount, threshold, scope, pattern, norm, seed, exclude, skip_first_last, allow_tied,
      recipe, !data.is_none(), calib_batches, block_size, dampening, owl_lambda, owl_m, sequential);
  PruneJob job = as_usage([&] { return request.validate(); });
  if (job.gradients) return py::none();
  CalibrationOptions calib;
  calib.device = string_arg(device, "device");
  if (job.reads_inputs) {
    const py::list items = calibration_items(data, calib_batches);
    if (items.empty()) throw UsageError("[prune] data gave no calibration batch");
    calib.batches = int64_t(items.size());
    runner.attr("start")(items);
  }
  calib.sequential = sequential;
  if (!progress.is_none())
    calib.on_pass = [progress](int64_t pass, int64_t of, const std::string& what) {
      py::gil_scoped_acquire gil;
      progress(pass, of, what);  // as the pass starts: the block being calibrated
    };
  std::vector<ModuleLayer> layers = module_layers(layer_list);
  ir::Model model = as_usage([&] { return layer_model(layers); });
  PyRunner run(runner, model, std::move(layers));
  ModulePruneReport report;
  {
    py::gil_scoped_release nogil;
    if (job.reads_inputs) {
      static_cast<PruneReport&>(report) = pythonic([&] { return job.run(model, run, calib); });
    } else {
      // As prune_onnx: what prune() refuses past the options' checks is the arguments' doing.
      static_cast<PruneReport&>(report) = as_usage([&] { return job.run(model, nullptr, calib); });
    }
    std::vector<std::string> all;
    for (const auto& n : model.graph.nodes)
      if (n.op_type != "Gather") all.push_back(n.name);
    run.apply(all);
  }
  report.before.params = module_params;
  report.device = calib.device;
  report.name = name;
  report.command = command;
  return py::cast(std::move(report));
}

}  // namespace

void bind_prune(py::module_& m) {
  py::class_<PruneLayerReport>(m, "PruneLayerReport",
                               R"(How one prunable weight (a Conv, ConvTranspose, Gemm or MatMul
weight) was pruned: one row of PruneReport.layers.)")
      .def_readonly("name", &PruneLayerReport::name, "The layer's node name in the export (str).")
      .def_readonly("op", &PruneLayerReport::op, "Its ONNX op: Conv, ConvTranspose, Gemm, MatMul.")
      .def_readonly("weight", &PruneLayerReport::weight, "The weight's initializer name (str).")
      .def_readonly("param", &PruneLayerReport::param,
                    "The PyTorch parameter's name (str, e.g. \"fc1.weight\"; \"\" when unknown).")
      .def_readonly("shape", &PruneLayerReport::shape, "The weight's shape (list of int).")
      .def_readonly("params", &PruneLayerReport::params, "Its element count (int).")
      .def_readonly("nonzero_before", &PruneLayerReport::nonzero_before,
                    "Nonzero weights before pruning (int).")
      .def_readonly("nonzero", &PruneLayerReport::nonzero_after,
                    "Nonzero weights after pruning (int).")
      .def_property_readonly("sparsity", &PruneLayerReport::sparsity,
                             "The share of zeros after pruning (float in [0, 1]).")
      .def_readonly("method", &PruneLayerReport::method,
                    "How it was pruned (\"l1 global\", \"l1 2:4\", ...); \"\" when skipped.")
      .def_readonly("amount", &PruneLayerReport::amount, "The amount or threshold as given (str).")
      .def_readonly("skipped", &PruneLayerReport::skipped,
                    "Why the layer was left alone (str); \"\" when it was pruned.")
      .def_readonly("rule", &PruneLayerReport::rule,
                    "Recipes: the rule that chose its pruning (\"rules[1] (line 7)\", "
                    "\"defaults\").")
      .def_property_readonly("shared", &shared_of,
                             "The weight's other readers (list of dict: node, op, use, module): "
                             "another layer, or a tied embedding.")
      .def("__repr__", [](const PruneLayerReport& l) {
        return "PruneLayerReport(" + py::repr(py::str(l.label())).cast<std::string>() +
               ", sparsity=" + py::repr(py::float_(l.sparsity())).cast<std::string>() +
               (l.skipped.empty()
                    ? ""
                    : ", skipped=" + py::repr(py::str(l.skipped)).cast<std::string>()) +
               ")";
      });

  py::class_<ModulePruneReport>(m, "PruneReport", R"(What lopper.prune did: per layer and in total.

str(report) is the table `lopper prune` prints; report.to_dict() the JSON it writes beside the
model (without the file entries); report.save_html(path) its --report page.)")
      .def_readonly("layers", &PruneReport::layers,
                    "One PruneLayerReport per prunable weight, in the model's order.")
      .def_readonly("warnings", &PruneReport::warnings,
                    "What deserves a look (list of str): a tied weight left alone, an exclude "
                    "that matched nothing, a recipe rule that matched no layer.")
      .def_readonly("params", &PruneReport::params, "Weights of the prunable layers (int).")
      .def_readonly("nonzero_before", &PruneReport::nonzero_before,
                    "Their nonzero weights before pruning (int).")
      .def_readonly("nonzero", &PruneReport::nonzero_after,
                    "Their nonzero weights after pruning (int).")
      .def_property_readonly(
          "sparsity",
          [](const ModulePruneReport& r) {
            return r.params ? 1.0 - double(r.nonzero_after) / double(r.params) : 0.0;
          },
          "The share of zeros over the prunable layers after pruning (float in [0, 1]).")
      .def(
          "to_dict", [](const ModulePruneReport& r) { return json_to_python(to_json(r)); },
          "The report as `lopper prune` writes it in OUT.report.json (a dict).")
      .def_property_readonly(
          "params_before", [](const ModulePruneReport& r) { return r.before.params; },
          "The module's parameters (int; BatchNorm statistics not counted).")
      .def_property_readonly(
          "macs_before",
          [](const ModulePruneReport& r) -> py::object {
            if (!r.model_before) return py::none();
            return py::int_(r.before.macs);
          },
          "Multiply-accumulates of one call on the example inputs (int; dense: a sparse "
          "kernel computes fewer, see to_dict()); None when the module was pruned block by "
          "block, without an export.")
      .def(
          "save_html",
          [](const ModulePruneReport& r, const py::object& path) {
            write_pruning_page(r, r.warnings, path_of(path));
          },
          py::arg("path"),
          R"(Writes the page `lopper prune ... --report FILE` writes: the module before and after
(parameters, nonzeros, MACs, file size, latency measured now with lopper's executor and its sparse
kernels) and per-layer charts. Written to a temporary file and renamed; an OSError when the path
cannot be written. The report keeps both exports for this (deleting it frees them).)")
      .def(
          "_add_warning",
          [](ModulePruneReport& r, const std::string& w) { r.warnings.push_back(w); },
          py::arg("warning"), "Adds a line to warnings (lopper's own use).")
      .def("__str__", [](const ModulePruneReport& r) { return to_table(r); })
      .def("__repr__", [](const ModulePruneReport& r) {
        const double s = r.params ? 1.0 - double(r.nonzero_after) / double(r.params) : 0.0;
        return "PruneReport(layers=" + std::to_string(r.layers.size()) +
               ", params=" + std::to_string(r.params) +
               ", nonzero=" + std::to_string(r.nonzero_after) +
               ", sparsity=" + py::repr(py::float_(s)).cast<std::string>() + ")";
      });

  m.def("_prune_layers", &prune_layers, py::arg("layers"), py::arg("runner"), py::kw_only(),
        py::arg("method") = py::none(), py::arg("amount") = py::none(),
        py::arg("threshold") = py::none(), py::arg("scope") = py::str("local"),
        py::arg("pattern") = py::none(), py::arg("norm") = py::none(), py::arg("seed") = py::none(),
        py::arg("exclude") = py::none(), py::arg("skip_first_last") = false,
        py::arg("allow_tied") = false, py::arg("recipe") = py::none(), py::arg("data") = py::none(),
        py::arg("calib_batches") = py::none(), py::arg("device") = py::str("cpu"),
        py::arg("block_size") = py::int_(kBlockSize), py::arg("dampening") = py::float_(kDampening),
        py::arg("owl_lambda") = py::none(), py::arg("owl_m") = py::float_(kOwlM),
        py::arg("sequential") = true, py::arg("progress") = py::none(),
        py::arg("module_params") = 0, py::arg("name") = "module",
        py::arg("command") = "lopper.prune",
        R"(Pruning of `layers` (dicts: name, param, op, weight, and
strides/pads/dilations/group for a Conv, embedding for a tied weight), calibrated by `runner`:
runner.start(items) takes the calibration items of `data` lopper reads (wanda, sparsegpt, OWL);
runner.collect(segment, block, layers, watched, observe) runs a segment on every calibration batch
calling observe(layer, input) for each watched layer's input; runner.apply(masks, values) takes
the pruned weights ({param: keep-mask}, {param: new value}); runner.advance(segment, block) runs
the pruned segment again. Criteria of the weights alone prune without the runner's passes. Returns
None when a criterion ranks by gradients (grad, taylor: they need the export), else the
PruneReport. Internal:
lopper.prune's path for a module it runs block by block.)");

  m.def("_prune_onnx", &prune_onnx, py::arg("model"), py::kw_only(), py::arg("method") = py::none(),
        py::arg("amount") = py::none(), py::arg("threshold") = py::none(),
        py::arg("scope") = py::str("local"), py::arg("pattern") = py::none(),
        py::arg("norm") = py::none(), py::arg("seed") = py::none(), py::arg("exclude") = py::none(),
        py::arg("skip_first_last") = false, py::arg("allow_tied") = false,
        py::arg("recipe") = py::none(), py::arg("data") = py::none(),
        py::arg("loss") = py::str("auto"), py::arg("mask_token") = py::none(),
        py::arg("calib_batches") = py::none(), py::arg("device") = py::str("cpu"),
        py::arg("block_size") = py::int_(kBlockSize), py::arg("dampening") = py::float_(kDampening),
        py::arg("owl_lambda") = py::none(), py::arg("owl_m") = py::float_(kOwlM),
        py::arg("sequential") = true, py::arg("parameters") = std::vector<std::string>{},
        py::arg("progress") = py::none(), py::arg("example") = std::vector<std::vector<int64_t>>{},
        py::arg("name") = "module", py::arg("command") = "lopper.prune",
        R"(Prunes a serialized ONNX model as lopper.prune says (its arguments, the same names) and
returns ({weight initializer: bool keep-mask (weight != 0 after pruning)}, {weight initializer:
its new value} for the pruned weights whose kept entries changed (sparsegpt), PruneReport) for the
weights it pruned. Weights whose initializer is not in `parameters` are left alone.
`calib_batches` None: 32 batches (grad, taylor), or enough for 128 samples (wanda, sparsegpt,
OWL). `progress` is called as progress(batch, of, loss) after each gradient calibration batch and
as progress(pass, of, what) as each calibration pass of wanda, sparsegpt and OWL starts. Internal:
lopper.prune exports the module, copies the values and applies the masks.)");
}

}  // namespace lopper::python
