// lopper.sensitivity and lopper.prune_to_target's C++ half: the sweep and the target on a model
// exported from the user's nn.Module, as `lopper sensitivity` and `lopper prune --target-*` make
// them, with their reports (table, JSON, HTML page). python/lopper/_analysis.py hands over the
// export (a callable, called once the arguments and the data are checked) and applies a target's
// keep-masks with torch.nn.utils.prune (after copying the new values of the weights a sparsegpt
// target updated, as lopper.prune does). The GIL is released while lopper works; progress and
// Ctrl-C reach Python between steps.
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
#include <type_traits>
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
#include "lopper/onnx_io.h"
#include "lopper/prune.h"
#include "lopper/report.h"
#include "lopper/sensitivity.h"
#include "lopper/structured.h"
#include "lopper/target.h"
#include "lopper/train.h"
#include "shrink.h"

namespace py = pybind11;

namespace lopper::python {
namespace {

using Shapes = std::map<std::string, std::vector<int64_t>>;

// --- Arguments ---------------------------------------------------------------------------------

template <typename T>
T arg(py::handle h, const char* op, const char* what, const char* kind) {
  // NOTE: a bool is an int to pybind11; as an amount, a count or a size it is a mistake.
  if (PyBool_Check(h.ptr()) && !std::is_same<T, bool>::value)
    throw py::type_error(fmt::format("[{}] {} must be {}, got bool", op, what, kind));
  try {
    return h.cast<T>();
  } catch (const py::cast_error&) {
    // An int of the right type but out of range (a negative seed, 2**64) is a bad value.
    if (PyLong_Check(h.ptr()) && !PyBool_Check(h.ptr()))
      throw UsageError(fmt::format("[{}] {} must be {}, got {}", op, what, kind,
                                   py::str(h).cast<std::string>()));
    throw py::type_error(fmt::format("[{}] {} must be {}, got {}", op, what, kind, type_name(h)));
  }
}

bool flag(py::handle h, const char* op, const char* what) {
  if (!PyBool_Check(h.ptr()))
    throw py::type_error(fmt::format("[{}] {} must be a bool, got {}", op, what, type_name(h)));
  return h.ptr() == Py_True;
}

std::vector<double> amounts_arg(py::handle h) {
  if (py::isinstance<py::str>(h) || !py::hasattr(h, "__iter__"))
    throw py::type_error("[sensitivity] amounts must be a list of floats in [0, 1), got " +
                         type_name(h));
  std::vector<double> out;
  for (auto a : h) out.push_back(arg<double>(a, "sensitivity", "every amount", "a float"));
  return out;
}

}  // namespace

namespace {

// An optional int argument (None: nullopt); a bool is a mistake.
std::optional<int64_t> optional_int(py::handle h, const char* op, const char* what) {
  if (h.is_none()) return std::nullopt;
  return arg<int64_t>(h, op, what, "an int");
}

// wanda and sparsegpt's one-shot arguments, as lopper.sensitivity and lopper.prune_to_target take
// them (None: the library's default), refused with a method that does not read them, as the CLI's
// --calib-batches, --block-size and --dampening are. `reads_inputs`: the method reads the layers'
// inputs (wanda, sparsegpt); `solves`: it is sparsegpt.
// The sweep's batches: the first `eval_batches` of `data`; for wanda and sparsegpt
// (`reads_inputs`) also the first `calib_batches` (None: enough for the papers' 128 samples,
// counted in batches of the first one's size, as lopper.prune reads them), on which the sweep
// collects the layers' inputs. Fewer when the iterable ends first.
std::unique_ptr<DataLoader> sweep_loader(py::handle data, int64_t eval_batches, bool reads_inputs,
                                         std::optional<int64_t> calib_batches) {
  if (!reads_inputs) return loader_arg(data, eval_batches);
  if (!py::hasattr(data, "__iter__"))
    throw py::type_error("[sensitivity] data must be an iterable of batches, got " +
                         type_name(data));
  std::vector<Batch> batches;
  int64_t want = std::max<int64_t>(eval_batches, calib_batches.value_or(1));
  for (auto item : data) {
    batches.push_back(to_batch(item, batches.size()));
    if (!calib_batches && batches.size() == 1) {
      const Batch& b = batches.front();
      const int64_t size = std::max<int64_t>(b.x.dim() > 0 ? b.x.size(0) : 0, 1);
      constexpr int64_t samples = CalibrationOptions::kLayerInputSamples;
      want = std::max<int64_t>(eval_batches, (samples + size - 1) / size);
    }
    if (int64_t(batches.size()) >= want) break;
  }
  return as_usage([&] { return std::make_unique<DataLoader>(std::move(batches), "data"); });
}

// progress(label, done, total, what) in Python, with the GIL held; Ctrl-C stops the work there.
void call_progress(const py::object& progress, const char* label, int64_t done, int64_t total,
                   const std::string& what) {
  py::gil_scoped_acquire gil;
  progress(label, done, total, what);
  // NOTE: Ctrl-C reaches Python only when it runs: let it stop the work here.
  if (PyErr_CheckSignals() != 0) throw py::error_already_set();
}

// The module's export, from the callable _analysis.py hands over: (ONNX bytes, the names of the
// module's parameters as the export names them).
struct Export {
  py::bytes bytes;
  std::set<std::string> params;
};

Export call_export(const py::object& fn) {
  py::tuple t = fn();
  Export e;
  e.bytes = t[0].cast<py::bytes>();
  for (auto n : t[1]) e.params.insert(n.cast<std::string>());
  return e;
}

ir::Model parse(const py::bytes& b) {
  return onnx::parse_model(PyBytes_AS_STRING(b.ptr()), size_t(PyBytes_GET_SIZE(b.ptr())));
}

// Writes a report page; a file that cannot be written is an OSError, as open() raises.
// --- lopper.sensitivity ------------------------------------------------------------------------

struct Sensitivity {
  SensitivityResult r;
  // What save_html measures: the export, at the example's shapes, on the device of the sweep.
  std::shared_ptr<const ir::Model> model;
  Shapes shapes;
  std::string device, name, command;
  int64_t file_bytes = 0;
};

// The arguments lopper.sensitivity and lopper.prune_to_target share, into their request (`op`
// names the call in messages).
template <typename Request>
void one_shot_args(Request& req, const char* op, const py::object& round_to,
                   const py::object& exclude, const py::object& allow_tied,
                   const py::object& calib_batches, const py::object& block_size,
                   const py::object& dampening, const py::object& device, const py::object& data) {
  req.round_to = arg<int64_t>(round_to, op, "round_to", "an int");
  if (!exclude.is_none()) req.exclude = arg<std::string>(exclude, op, "exclude", "a str");
  req.allow_tied = flag(allow_tied, op, "allow_tied");
  req.batches = optional_int(calib_batches, op, "calib_batches");
  req.block_size = optional_int(block_size, op, "block_size");
  if (!dampening.is_none()) req.dampening = arg<double>(dampening, op, "dampening", "a float");
  req.device = arg<std::string>(device, op, "device", "a str");
  req.data = !data.is_none();
}

std::shared_ptr<Sensitivity> sensitivity_call(
    const py::object& export_fn, const py::object& data, const py::object& structured_arg,
    const py::object& method, const py::object& amounts, const py::object& eval_batches,
    const py::object& round_to, const py::object& exclude, const py::object& seed,
    const py::object& allow_tied_arg, const py::object& loss, const py::object& mask_token,
    const py::object& device, const std::vector<std::vector<int64_t>>& example,
    const py::object& progress, const std::string& name, const std::string& command,
    const py::object& fixed, const py::object& calib_batches, const py::object& block_size,
    const py::object& dampening) {
  SensitivityRequest req;
  // True: channel groups; a str: "channel", "block" or "channel,block" (the request checks it).
  if (py::isinstance<py::str>(structured_arg))
    req.structured = structured_arg.cast<std::string>();
  else if (flag(structured_arg, "sensitivity", "structured"))
    req.structured = "channel";
  if (!method.is_none()) req.criterion = arg<std::string>(method, "sensitivity", "method", "a str");
  if (!amounts.is_none()) req.amounts = amounts_arg(amounts);
  req.eval_batches = arg<int64_t>(eval_batches, "sensitivity", "eval_batches", "an int");
  one_shot_args(req, "sensitivity", round_to, exclude, allow_tied_arg, calib_batches, block_size,
                dampening, device, data);
  if (!seed.is_none()) req.seed = arg<uint64_t>(seed, "sensitivity", "seed", "an int >= 0");
  req.data_hint = " (an iterable of batches: tensors, (samples, labels) or dicts of named inputs)";
  const SensitivityJob job = as_usage([&] { return req.validate(); });
  SensitivityOptions so = job.options;
  so.fixed = fixed_arg(fixed);
  const bool reads_inputs = job.reads_inputs;
  (void)check_device(so.device);
  so.loss = calibration_arg(loss, mask_token, so.eval_batches, device, so.seed).loss;
  std::unique_ptr<DataLoader> loader =
      sweep_loader(data, so.eval_batches, reads_inputs, req.batches);
  // NOTE: calib_batches is "at most", as lopper.prune's: an iterable that ends first gives fewer.
  if (req.batches) so.calib_batches = std::min<int64_t>(*req.batches, loader->batches_per_epoch());
  if (!progress.is_none())
    so.progress = [&progress](int64_t done, int64_t total, const std::string& what) {
      call_progress(progress, "sensitivity", done, total, what);
    };

  Export e = call_export(export_fn);
  auto out = std::make_shared<Sensitivity>();
  out->device = so.device;
  out->name = name;
  out->command = command;
  out->file_bytes = int64_t(PyBytes_GET_SIZE(e.bytes.ptr()));
  {
    py::gil_scoped_release nogil;
    auto model = std::make_shared<ir::Model>(parse(e.bytes));
    so.input_shapes = out->shapes = input_shapes(*model, example);
    exclude_also(so.exclude, constants_regex(*model, e.params));
    out->r = pythonic([&] { return sensitivity(*model, *loader, so); });
    out->model = std::move(model);
  }
  return out;
}

void sensitivity_html(const Sensitivity& s, const std::string& path) {
  if (!s.model)
    throw UsageError(
        "[sensitivity] a sweep over the experts (structured='expert') has no export "
        "to draw a page of: print it, or write report.to_dict()");
  HtmlReport rep("sensitivity", "Sensitivity of " + s.name, s.command);
  std::string warning;
  {
    py::gil_scoped_release nogil;
    ReportMeasure how;
    how.device = s.device;
    how.shapes = s.shapes;
    const ModelCost cost = analyze(*s.model, resolve_input_shapes(*s.model, s.shapes, 1));
    ReportModel m = measure_report_model("model", *s.model, cost, how);
    m.file_bytes = s.file_bytes;
    set_accuracy(m, s.r.top1, s.r.loss, s.r.samples, "the data, the sweep's own batches");
    warning = m.latency_warning;
    rep.add_model(m, cost);
    rep.add_sensitivity(s.r);
  }
  if (!warning.empty()) warn("[sensitivity] " + warning);
  write_page(rep, path);
}

// --- lopper.prune_to_target --------------------------------------------------------------------

struct Target : PrunedExport {  // the exports before and after, for save_html
  TargetReport r;
  bool structured = false;
  double value = 0;
  std::shared_ptr<Sensitivity> sens;   // the data it used (given, or measured on `data`)
  std::optional<EvalResult> measured;  // the pruned export on the sweep's batches (data given)
  /// The export before on `data`, when the sensitivity was given (its sweep's batches are not
  /// these); else the sweep's own measurement is the model before.
  std::optional<EvalResult> base;
  std::vector<std::string> warnings;
  double top1_base() const { return base ? base->top1 : sens->r.top1; }
};

// The report as `lopper prune --target-*` writes it in OUT.report.json, without the files.
nlohmann::json target_json(const Target& t) {
  nlohmann::json j = to_json(t.r, t.sens != nullptr);
  j["target"]["value"] = t.value;
  if (t.r.kind == TargetKind::kLatency) j["target"]["device"] = t.device;
  if (t.sens && t.measured) {
    j["target"]["loss"]["measured"] = t.measured->loss;
    j["target"]["loss"]["top1_base"] = t.top1_base();
    j["target"]["loss"]["top1_measured"] = t.measured->top1;
  }
  j["structured"] = t.structured;
  put_costs(j, t.before, t.after);
  j["nonzero_before"] = t.before.nonzero;
  j["nonzero"] = t.after.nonzero;
  return j;
}

std::string target_text(const Target& t) {
  return to_table(t.r, t.structured, t.sens != nullptr) + "\n" +
         target_summary(t.r, t.value, t.sens ? &t.sens->r : nullptr,
                        t.measured ? &*t.measured : nullptr, t.before, t.after);
}

py::tuple target_call(const py::object& export_fn, const py::object& macs, const py::object& params,
                      const py::object& latency_ms, const py::object& structured_arg,
                      const py::object& data, const py::object& sensitivity_arg,
                      const py::object& method, const py::object& round_to,
                      const py::object& exclude, const py::object& allow_tied_arg,
                      const py::object& eval_batches_arg, const py::object& loss,
                      const py::object& mask_token, const py::object& device,
                      const std::vector<std::vector<int64_t>>& example, const py::object& progress,
                      const std::string& name, const std::string& command, const py::object& fixed,
                      const std::vector<at::Tensor>& inputs, const py::object& calib_batches,
                      const py::object& block_size, const py::object& dampening) {
  const bool structured = flag(structured_arg, "prune", "structured");
  TargetRequest req;
  if (!macs.is_none()) req.target_macs = arg<double>(macs, "prune", "macs", "a float");
  if (!params.is_none()) req.target_params = arg<double>(params, "prune", "params", "a float");
  if (!latency_ms.is_none())
    req.target_latency_ms = arg<double>(latency_ms, "prune", "latency_ms", "a float");
  if (structured) req.structured = "channel";
  if (!method.is_none()) req.criterion = arg<std::string>(method, "prune", "method", "a str");
  one_shot_args(req, "prune", round_to, exclude, allow_tied_arg, calib_batches, block_size,
                dampening, device, data);
  req.eval_batches = arg<int64_t>(eval_batches_arg, "prune", "eval_batches", "an int");
  req.data_hint = " (an iterable of batches)";
  const TargetJob job = as_usage([&] { return req.validate(); });
  TargetOptions t = job.options;
  t.fixed = fixed_arg(fixed);
  const bool calibrated = job.reads_inputs;
  (void)check_device(t.device);
  const int64_t eval_batches = *req.eval_batches;
  const LossOptions loss_options = calibration_arg(loss, mask_token, eval_batches, device, 0).loss;
  std::shared_ptr<Sensitivity> sens;
  if (!sensitivity_arg.is_none()) {
    if (!py::isinstance<Sensitivity>(sensitivity_arg))
      throw py::type_error(
          "[prune] sensitivity must be a SensitivityReport (what lopper.sensitivity returns), "
          "got " +
          type_name(sensitivity_arg));
    sens = sensitivity_arg.cast<std::shared_ptr<Sensitivity>>();
    const std::string unit = structured ? "channel" : "weight";
    if (sens->r.unit != unit)
      throw UsageError("[prune] the sensitivity is per " +
                       std::string(sens->r.unit == "channel" ? "channel group" : sens->r.unit) +
                       ": " +
                       (structured ? "measure it with lopper.sensitivity(..., structured=True)"
                                   : "measure it with lopper.sensitivity(..., structured=False)"));
    // NOTE: prune_to_target() checks this too, but after the export (a RuntimeError there).
    if (calibrated && sens->r.method != t.criterion)
      throw UsageError("[prune] the sensitivity was measured with method " + sens->r.method +
                       ", the target prunes with " + t.criterion +
                       ": measure it with lopper.sensitivity(..., method=\"" + t.criterion + "\")");
  }
  // wanda, sparsegpt: the calibration batches, as lopper.prune reads them (at most calib_batches,
  // default the papers' 128 samples; a smaller last batch left out). The sweep (without
  // sensitivity) collects the layers' inputs on the same first batches.
  std::unique_ptr<DataLoader> calib;
  if (calibrated) {
    // NOTE: an iterator (a generator, itertools.cycle) would hand the sweep the batches after the
    // calibration's, not the same ones.
    if (!sens && PyIter_Check(data.ptr()))
      throw UsageError("[prune] a target with method " + t.criterion +
                       " reads data twice (the calibration, then the sweep): give a list or a "
                       "DataLoader, not an iterator (" +
                       type_name(data) + ")");
    calib = calibration_loader(data, req.batches);
    t.calibration = calibration_arg(loss, mask_token, calib->batches_per_epoch(), device, 0);
    t.calibration_data = calib.get();
    as_usage([&] { check_calibration(*calib, t.calibration); });
    if (!progress.is_none())
      t.calibration.on_pass = [&progress](int64_t pass, int64_t of, const std::string& what) {
        call_progress(progress, "calibrate", pass, of, what);  // as the pass starts
      };
  }
  std::unique_ptr<DataLoader> loader;  // the sweep's batches, then the pruned export measured
  // With a sensitivity given, the data measures the module before and after (as the CLI's
  // --sensitivity FILE with --data does); wanda's and sparsegpt's are their calibration only.
  const bool sens_given = sens != nullptr;
  if (!data.is_none() && !(sens_given && calibrated))
    loader = calibrated ? sweep_loader(data, eval_batches, true, calib->batches_per_epoch())
                        : loader_arg(data, eval_batches);
  auto out = std::make_shared<Target>();
  if (!progress.is_none())
    t.progress = [&progress](const std::string& what, int64_t done, int64_t total) {
      call_progress(progress, "target", done, total, what);
    };

  Export e = call_export(export_fn);
  out->structured = structured;
  out->value = t.value;
  out->device = t.device;
  out->name = name;
  out->command = command;
  out->file_bytes = int64_t(PyBytes_GET_SIZE(e.bytes.ptr()));
  std::vector<std::pair<std::string, at::Tensor>> masks, values;
  Shrunk shrunk;
  {
    py::gil_scoped_release nogil;
    ir::Model model = parse(e.bytes);
    t.input_shapes = out->shapes = input_shapes(model, example);
    exclude_also(t.exclude, constants_regex(model, e.params));
    if (sens) {
      // The sweep must be of this module's export: the weights it names are its prunable ones.
      std::set<std::string> weights;
      for (const auto& w : prunable_weights(model.graph)) weights.insert(w.weight);
      for (const auto& l : sens->r.layers)
        if (!l.weight.empty() && !weights.count(l.weight))
          throw UsageError("[prune] the sensitivity is of another module (it names a weight '" +
                           l.weight + "' that this one lacks): measure it on this one");
    }
    auto before = std::make_shared<ir::Model>(model);  // shares the tensors: the target replaces
    if (loader && !sens) {
      SensitivityOptions so = sensitivity_options(t);
      so.eval_batches = eval_batches;
      if (calibrated) so.calib_batches = calib->batches_per_epoch();
      so.loss = loss_options;
      if (t.progress)
        so.progress = [&progress](int64_t done, int64_t total, const std::string& what) {
          call_progress(progress, "sensitivity", done, total, what);
        };
      sens = std::make_shared<Sensitivity>();
      sens->r = pythonic([&] { return sensitivity(model, *loader, so); });
      sens->model = before;
      sens->shapes = out->shapes;
      sens->device = t.device;
      sens->name = name;
      sens->command = command;
      sens->file_bytes = out->file_bytes;
    }
    t.sensitivity = sens ? &sens->r : nullptr;
    EvalOptions eo;
    eo.device = t.device;
    eo.max_batches = eval_batches;
    eo.loss = loss_options;
    // The module before, on the data, when the sweep was not measured on it.
    if (loader && sens_given) out->base = pythonic([&] { return evaluate(model, *loader, eo); });
    const auto shapes = resolve_input_shapes(model, t.input_shapes, 1);
    out->before = analyze(model, shapes);
    out->r = pythonic([&] { return prune_to_target(model, t); });
    out->after = analyze(model, shapes);
    if (loader && sens) {
      out->measured = pythonic([&] { return evaluate(model, *loader, eo); });
    }
    if (structured) {
      const std::vector<std::string> names(e.params.begin(), e.params.end());
      shrunk = shrunk_values(*before, model, names, example_feeds(model, inputs), t.device);
    }
    for (const auto& u : out->r.units) {
      if (u.weight.empty()) continue;
      const ir::Initializer* w = model.graph.find_initializer(u.weight);
      LOPPER_ASSERT(w, "no initializer '", u.weight, "' after pruning to a target");
      masks.emplace_back(u.weight, w->value.ne(0));
      // sparsegpt updates the weights it keeps: their new values, as lopper.prune hands them.
      const ir::Initializer* was = before->graph.find_initializer(u.weight);
      LOPPER_ASSERT(was, "no initializer '", u.weight, "' before pruning to a target");
      if (kept_changed(was->value, w->value)) values.emplace_back(u.weight, w->value);
    }
    out->model_before = std::move(before);
    out->model_after = std::make_shared<ir::Model>(std::move(model));
  }
  out->sens = sens;
  const TargetReport& r = out->r;
  if (r.kind == TargetKind::kLatency && r.measured > r.target)
    out->warnings.push_back(fmt::format(
        "measured {:.3f} ms, over the target {:.3f} ms (latency is noisy: measure again)",
        r.measured, r.target));
  out->warnings.insert(out->warnings.end(), r.warnings.begin(), r.warnings.end());
  const nlohmann::json j = to_json(r, false);
  if (j["target"].contains("latency_warning"))
    out->warnings.push_back(j["target"]["latency_warning"].get<std::string>());
  if (structured) return py::make_tuple(to_python(std::move(shrunk)), py::dict(), out);
  py::dict mask_dict, value_dict;
  for (auto& [weight, mask] : masks) mask_dict[py::str(weight)] = py::cast(std::move(mask));
  for (auto& [weight, value] : values) value_dict[py::str(weight)] = py::cast(std::move(value));
  return py::make_tuple(mask_dict, value_dict, out);
}

void target_html(const Target& t, const std::string& path) {
  PageParts parts;
  parts.accuracy = [&](ReportModel& mb, ReportModel& ma) {
    if (!t.sens || !t.measured) return;
    const std::string data = "the data, the sweep's own batches";
    if (t.base)
      set_accuracy(mb, t.base->top1, t.base->loss, t.base->samples, data);
    else
      set_accuracy(mb, t.sens->r.top1, t.sens->r.loss, t.sens->r.samples, data);
    set_accuracy(ma, t.measured->top1, t.measured->loss, t.measured->samples, data);
  };
  parts.sections = [&](HtmlReport& rep, const ReportModel& mb, const ReportModel& ma) {
    if (mb.top1 >= 0 && t.before.nonzero > 0) {
      const std::string x = "share of the nonzero parameters removed", y = "top-1";
      const std::string intro =
          "The model before and after pruning; with sensitivity data, also every point of the "
          "sweep (one layer or group pruned alone), on its own evaluation batches.";
      rep.add_tradeoff(x, y, intro, {"before", {{0.0, mb.top1, ""}}, false, "reference"});
      rep.add_tradeoff(x, y, intro,
                       {"after",
                        {{1.0 - double(t.after.nonzero) / double(t.before.nonzero), ma.top1, ""}},
                        false,
                        "result"});
    }
    std::vector<std::pair<std::string, double>> chosen;
    for (const auto& u : t.r.units) chosen.emplace_back(u.label(), u.amount);
    rep.add_target(target_json(t)["target"], chosen);
    if (t.sens) rep.add_sensitivity(t.sens->r);
  };
  write_pruning_page(t, parts, path);
}

py::object optional_float(bool has, double v) {
  return has ? py::object(py::float_(v)) : py::none();
}

}  // namespace

py::object sensitivity_report(SensitivityResult r, const std::string& name,
                              const std::string& command) {
  auto out = std::make_shared<Sensitivity>();
  out->r = std::move(r);
  out->name = name;
  out->command = command;
  return py::cast(out);
}

void bind_analysis(py::module_& m) {
  py::class_<SensitivityPoint>(m, "SensitivityPoint",
                               R"(One point of a sensitivity curve: the module with one layer (or
channel group) alone pruned to `amount`, evaluated on the sweep's batches.)")
      .def_readonly("amount", &SensitivityPoint::amount, "The share asked to be removed (float).")
      .def_readonly("removed", &SensitivityPoint::removed,
                    "The share actually removed (float; rounding, round_to and weights already "
                    "zero make it differ).")
      .def_readonly("loss", &SensitivityPoint::loss, "The mean loss on the batches (float).")
      .def_readonly("top1", &SensitivityPoint::top1, "The top-1 accuracy (float in [0, 1]).")
      .def_readonly("params", &SensitivityPoint::params,
                    "The module's nonzero parameters with only this layer pruned (int).")
      .def_readonly("macs", &SensitivityPoint::macs,
                    "Its MACs at the example's shapes, sparsity counted (int).")
      .def("__repr__", [](const SensitivityPoint& p) {
        return fmt::format("SensitivityPoint(amount={:g}, loss={:.4f}, top1={:.4f})", p.amount,
                           p.loss, p.top1);
      });

  py::class_<LayerSensitivity>(m, "SensitivityLayer",
                               R"(The sensitivity curve of one layer (or channel group): one
SensitivityPoint per amount, in the order asked.)")
      .def_readonly("name", &LayerSensitivity::name,
                    "The layer's node in the export, or \"group N: first layer\" (str).")
      .def_property_readonly("label", &LayerSensitivity::label,
                             "What tables show: the parameter's name, else `name` (str).")
      .def_readonly("param", &LayerSensitivity::param,
                    "Single weights: the PyTorch parameter (str, e.g. \"fc1.weight\"; \"\" when "
                    "unknown).")
      .def_readonly("weight", &LayerSensitivity::weight,
                    "Single weights: the weight's initializer in the export (str).")
      .def_readonly("group", &LayerSensitivity::group,
                    "Channel groups: the group's id (int; -1 for single weights).")
      .def_readonly("block", &LayerSensitivity::block,
                    "A residual block: its index (int; -1 otherwise); one point, amount 1.")
      .def_readonly("layers", &LayerSensitivity::layers,
                    "The export's layers that are pruned together (list of str).")
      .def_readonly("params", &LayerSensitivity::params,
                    "The layer's (or group's layers') weights, dense (int).")
      .def_readonly("macs", &LayerSensitivity::macs, "Their MACs, dense (int).")
      .def_readonly("points", &LayerSensitivity::points, "One SensitivityPoint per amount.")
      .def("__repr__", [](const LayerSensitivity& l) {
        return fmt::format("SensitivityLayer({}, points={})",
                           py::repr(py::str(l.label())).cast<std::string>(), l.points.size());
      });

  py::class_<Sensitivity, std::shared_ptr<Sensitivity>>(m, "SensitivityReport",
                                                        R"(What lopper.sensitivity measured: the
unpruned module's loss and top-1 on the sweep's batches, and per layer (or channel group) the
same with that layer alone pruned to each amount.

str(report) is the table `lopper sensitivity` prints; report.to_dict() the JSON it writes with -o
(what lopper.prune_to_target(sensitivity=...) reads); report.save_html(path) its --report page.)")
      .def_property_readonly(
          "unit", [](const Sensitivity& s) { return s.r.unit; },
          "\"weight\" (each layer's weights), \"channel\" (channel groups, structured=True), "
          "\"block\" or \"channel+block\" (residual blocks).")
      .def_property_readonly(
          "method", [](const Sensitivity& s) { return s.r.method; },
          "The criterion that ranked the weights or channels (str).")
      .def_property_readonly(
          "loss", [](const Sensitivity& s) { return s.r.loss; },
          "The unpruned module's mean loss on the sweep's batches (float).")
      .def_property_readonly(
          "top1", [](const Sensitivity& s) { return s.r.top1; },
          "Its top-1 accuracy there (float in [0, 1]).")
      .def_property_readonly(
          "samples", [](const Sensitivity& s) { return s.r.samples; },
          "The samples evaluated at each point (int).")
      .def_property_readonly(
          "params", [](const Sensitivity& s) { return s.r.params; },
          "The unpruned module's nonzero parameters (int).")
      .def_property_readonly(
          "macs", [](const Sensitivity& s) { return s.r.macs; },
          "Its MACs at the example's shapes (int).")
      .def_property_readonly(
          "layers", [](const Sensitivity& s) { return s.r.layers; },
          "One SensitivityLayer per layer (or channel group) analysed, in the model's order.")
      .def_property_readonly(
          "skipped", [](const Sensitivity& s) { return s.r.skipped; },
          "wanda, sparsegpt: the layers that could not be analysed, each with why (list of str, "
          "e.g. \"lm_head.weight: the calibration data never reached it\"); empty otherwise.")
      .def(
          "to_dict",
          [](const Sensitivity& s) {
            return py::module_::import("json").attr("loads")(sensitivity_json(s.r));
          },
          "The sweep as `lopper sensitivity -o FILE` writes it (a dict, format "
          "\"lopper.sensitivity/1\").")
      .def(
          "save_html",
          [](const Sensitivity& s, const py::object& path) { sensitivity_html(s, path_of(path)); },
          py::arg("path"),
          R"(Writes the page `lopper sensitivity --report` writes: one self-contained HTML file
(the data and Chart.js inlined) with the curves, the accuracy-sparsity trade-off and the module's
layers, its latency measured now on the sweep's device at the example's shapes.

Args:
    path (str or os.PathLike): the file; written to a temporary file in the same folder and
        renamed, so a failure leaves nothing behind.

Raises:
    OSError: the file cannot be written (no such folder, a folder of that name, ...).)")
      .def("__str__", [](const Sensitivity& s) { return to_table(s.r); })
      .def("__repr__", [](const Sensitivity& s) {
        return fmt::format("SensitivityReport(unit='{}', layers={}, loss={:.4f}, top1={:.4f})",
                           s.r.unit, s.r.layers.size(), s.r.loss, s.r.top1);
      });

  py::class_<TargetUnit>(m, "TargetLayer", R"(The amount pruning to a target chose for one layer
(or channel group).)")
      .def_readonly("name", &TargetUnit::name,
                    "The layer's node in the export, or \"group N: first layer\" (str).")
      .def_property_readonly("label", &TargetUnit::label,
                             "What tables show: the parameter's name, else `name` (str).")
      .def_readonly("param", &TargetUnit::param,
                    "The PyTorch parameter (str, e.g. \"fc1.weight\"; \"\" when unknown).")
      .def_readonly("weight", &TargetUnit::weight, "The weight's initializer in the export (str).")
      .def_readonly("group", &TargetUnit::group,
                    "Channel groups: the group's id (int; -1 for single weights).")
      .def_readonly("layers", &TargetUnit::layers, "The export's layers it prunes (list of str).")
      .def_readonly("amount", &TargetUnit::amount,
                    "The share of its weights (channels) removed (float in [0, 1]).")
      .def_readonly("est_loss_increase", &TargetUnit::est_loss_increase,
                    "With sensitivity data: the loss increase the amount is estimated to cost "
                    "(float; 0 without).")
      .def("__repr__", [](const TargetUnit& u) {
        return fmt::format("TargetLayer({}, amount={:.4f})",
                           py::repr(py::str(u.label())).cast<std::string>(), u.amount);
      });

  py::class_<Target, std::shared_ptr<Target>>(m, "TargetReport",
                                              R"(What lopper.prune_to_target did: the amount chosen
per layer, the target and how it was met, the module's parameters and MACs before and after.

str(report) is what `lopper prune --target-*` prints; report.to_dict() the JSON it writes beside
the model (without the file entries); report.save_html(path) its --report page.)")
      .def_property_readonly(
          "kind", [](const Target& t) { return std::string(target_name(t.r.kind)); },
          "\"params\", \"macs\" or \"latency-ms\".")
      .def_property_readonly(
          "value", [](const Target& t) { return t.value; },
          "The target as asked (float: the share kept, or milliseconds).")
      .def_property_readonly(
          "goal", [](const Target& t) { return t.r.target; },
          "The target in its unit (float: nonzero parameters, MACs or ms).")
      .def_property_readonly(
          "before", [](const Target& t) { return t.r.before; },
          "The unpruned module's cost in that unit (float).")
      .def_property_readonly(
          "predicted", [](const Target& t) { return t.r.predicted; },
          "The pruned module's cost as the search predicted it (float).")
      .def_property_readonly(
          "measured", [](const Target& t) { return t.r.measured; },
          "The pruned module's cost as measured (float).")
      .def_property_readonly(
          "estimator", [](const Target& t) { return t.r.estimator; },
          "What chose the amounts: \"sensitivity\", \"lamp\" or \"global channel ranking\".")
      .def_property_readonly(
          "rounds", [](const Target& t) { return t.r.rounds; },
          "Allocations until the measurement met the target (int).")
      .def_property_readonly(
          "layers", [](const Target& t) { return t.r.units; },
          "One TargetLayer per layer (or group) the target could prune.")
      .def_property_readonly(
          "sensitivity", [](const Target& t) { return t.sens; },
          "The SensitivityReport the amounts were chosen from (given, or measured on `data`); "
          "None without.")
      .def_property_readonly(
          "base_loss",
          [](const Target& t) { return optional_float(t.sens != nullptr, t.r.base_loss); },
          "With sensitivity data: the unpruned module's loss (float; None without).")
      .def_property_readonly(
          "predicted_loss",
          [](const Target& t) { return optional_float(t.sens != nullptr, t.r.predicted_loss); },
          "With sensitivity data: the loss estimated from the curves (float; None without).")
      .def_property_readonly(
          "measured_loss",
          [](const Target& t) {
            return optional_float(t.measured.has_value(), t.measured ? t.measured->loss : 0);
          },
          "With data: the pruned module's loss on the sweep's batches (float; None without).")
      .def_property_readonly(
          "measured_top1",
          [](const Target& t) {
            return optional_float(t.measured.has_value(), t.measured ? t.measured->top1 : 0);
          },
          "With data: the pruned module's top-1 there (float; None without).")
      .def_property_readonly(
          "params_before", [](const Target& t) { return t.before.params; },
          "The module's parameters (int; BatchNorm statistics not counted).")
      .def_property_readonly(
          "nonzero_before", [](const Target& t) { return t.before.nonzero; },
          "Its nonzero parameters before (int).")
      .def_property_readonly(
          "nonzero", [](const Target& t) { return t.after.nonzero; },
          "Its nonzero parameters after (int).")
      .def_property_readonly(
          "macs_before", [](const Target& t) { return t.before.macs; },
          "MACs of one call on the example inputs, before (int; dense).")
      .def_property_readonly(
          "macs", [](const Target& t) { return t.after.macs; }, "The same after (int; dense).")
      .def_property_readonly(
          "warnings", [](const Target& t) { return t.warnings; },
          "What deserves a look (list of str): a latency over the target, latency measurements "
          "with a wide spread.")
      .def(
          "to_dict", [](const Target& t) { return json_to_python(target_json(t)); },
          "The report as `lopper prune --target-*` writes it in OUT.report.json (a dict).")
      .def(
          "save_html",
          [](const Target& t, const py::object& path) { target_html(t, path_of(path)); },
          py::arg("path"),
          R"(Writes the page `lopper prune --target-* --report` writes: one self-contained HTML
file (the data and Chart.js inlined) with the module before and after (parameters, MACs,
latency measured now on the target's device at the example's shapes; top-1 and loss when data
was given), the amount chosen per layer and the target's figures, and the sensitivity curves.

Args:
    path (str or os.PathLike): the file; written to a temporary file in the same folder and
        renamed, so a failure leaves nothing behind.

Raises:
    OSError: the file cannot be written (no such folder, a folder of that name, ...).)")
      .def("__str__", &target_text)
      .def("__repr__", [](const Target& t) {
        return fmt::format("TargetReport(kind='{}', goal={:.6g}, measured={:.6g}, layers={})",
                           target_name(t.r.kind), t.r.target, t.r.measured, t.r.units.size());
      });

  m.def("_sensitivity", &sensitivity_call, py::arg("export"), py::arg("data"), py::kw_only(),
        py::arg("structured") = false, py::arg("method") = py::none(),
        py::arg("amounts") = py::none(), py::arg("eval_batches") = 16, py::arg("round_to") = 1,
        py::arg("exclude") = py::none(), py::arg("seed") = py::none(),
        py::arg("allow_tied") = false, py::arg("loss") = py::str("auto"),
        py::arg("mask_token") = py::none(), py::arg("device") = py::str("cpu"),
        py::arg("example") = std::vector<std::vector<int64_t>>{}, py::arg("progress") = py::none(),
        py::arg("name") = "module", py::arg("command") = "lopper.sensitivity",
        py::arg("fixed") = py::list(), py::arg("calib_batches") = py::none(),
        py::arg("block_size") = py::none(), py::arg("dampening") = py::none(),
        R"(The sweep of lopper.sensitivity (its arguments, the same names). `export()` is called
once the arguments and the data are checked and returns (ONNX bytes, the module's parameter
names); `example` holds the example's input shapes in the export's input order; `progress` is
called as progress(label, done, total, what). Internal.)");

  m.def("_prune_to_target", &target_call, py::arg("export"), py::kw_only(),
        py::arg("macs") = py::none(), py::arg("params") = py::none(),
        py::arg("latency_ms") = py::none(), py::arg("structured") = false,
        py::arg("data") = py::none(), py::arg("sensitivity") = py::none(),
        py::arg("method") = py::none(), py::arg("round_to") = 1, py::arg("exclude") = py::none(),
        py::arg("allow_tied") = false, py::arg("eval_batches") = 16,
        py::arg("loss") = py::str("auto"), py::arg("mask_token") = py::none(),
        py::arg("device") = py::str("cpu"),
        py::arg("example") = std::vector<std::vector<int64_t>>{}, py::arg("progress") = py::none(),
        py::arg("name") = "module", py::arg("command") = "lopper.prune_to_target",
        py::arg("fixed") = py::list(), py::arg("inputs") = std::vector<at::Tensor>{},
        py::arg("calib_batches") = py::none(), py::arg("block_size") = py::none(),
        py::arg("dampening") = py::none(),
        R"(Prunes the export to a target as lopper.prune_to_target says (its arguments, the same
names) and returns ({weight initializer: bool keep-mask}, {weight initializer: its new value} for
those whose kept entries changed (sparsegpt), TargetReport) for the layers the target could prune;
structured, (what _structured._shrink_in_place takes, {}, TargetReport), `inputs` being
the example's tensors and `fixed` as _prune_structured_onnx's. `export`, `example` and `progress` as _sensitivity's. Internal.)");
}

}  // namespace lopper::python
