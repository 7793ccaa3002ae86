// lopper.prune_structured(model, ..., unit="expert")'s C++ half (lopper/experts.h): the arguments'
// rules, the calibration batches read from `data`, the per-layer statistics and choice of the
// experts to remove, and the report (lopper.ExpertReport). python/lopper/_experts.py walks the
// model, hooks its MoE layers, hands each batch's routing over and removes what this chooses.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "bindings.h"
#include "convert.h"
#include "lopper/error.h"
#include "lopper/experts.h"
#include "lopper/report.h"
#include "lopper/sensitivity.h"

namespace py = pybind11;

namespace lopper::python {
namespace {

// What lopper.prune_structured(..., unit="expert") returns: the library's report, and what its
// page's header shows.
struct ExpertPruneReport {
  ExpertReport r;
  std::string name, command;
};

ExpertRequest request_of(const py::object& method, const py::object& amount, const py::object& seed,
                         bool data, const std::vector<std::string>& channel_options) {
  ExpertRequest req;
  if (!method.is_none()) req.criterion = string_arg(method, "method");
  if (!amount.is_none()) req.amount = to_amount(amount);
  if (PyBool_Check(seed.ptr())) throw py::type_error("[prune] seed must be an int >= 0, got bool");
  req.seed = optional_arg<uint64_t>(seed, "seed", "an int >= 0");
  req.data = data;
  req.channel_options = channel_options;
  req.data_hint = " (an iterable of batches)";
  return req;
}

ExpertLayer layer_of(const py::handle& item) {
  const py::dict d = item.cast<py::dict>();
  ExpertLayer l;
  l.name = d["name"].cast<std::string>();
  l.experts = d["experts"].cast<int64_t>();
  l.top_k = d["top_k"].cast<int64_t>();
  l.params_per_expert = d["params_per_expert"].cast<int64_t>();
  return l;
}

// The first `limit` items of `data`, each checked as a calibration batch (a tensor, (samples,
// labels), or a mapping of named inputs), as they are.
py::list calibration_batches(const py::object& data, const py::object& limit_arg) {
  if (PyBool_Check(limit_arg.ptr()))
    throw py::type_error("[prune] calib_batches must be an int, got bool");
  const auto limit = optional_arg<int64_t>(limit_arg, "calib_batches", "an int");
  if (limit && *limit < 1)
    throw UsageError("[prune] calib_batches must be >= 1, got " + std::to_string(*limit));
  if (!py::hasattr(data, "__iter__"))
    throw py::type_error("[prune] data must be an iterable of batches, got " + type_name(data));
  py::list items;
  size_t i = 0;
  for (auto item : data) {
    (void)to_batch(item, i++);
    items.append(item);
    if (limit && int64_t(items.size()) == *limit) break;
  }
  if (items.empty()) throw UsageError("[prune] data gave no calibration batch");
  return items;
}

// Tensors from Python (torch's own caster would take a tensor subclass or fail on anything else
// without saying which argument).
at::Tensor tensor_arg(const py::handle& h, const char* what) {
  if (h.is_none()) return {};
  if (!THPVariable_Check(h.ptr()))
    throw py::type_error(std::string("[prune] experts: ") + what + " must be a tensor, got " +
                         type_name(h));
  return THPVariable_Unpack(h.ptr()).detach();
}

// lopper.sensitivity(model, ..., structured="expert")'s C++ half: the library's sweep, and its
// evaluation batches as lopper reads batches (the labels and attention mask the loss reads).
struct ExpertSweepCall {
  std::unique_ptr<ExpertSweep> sweep;
  std::vector<Batch> eval;
};

ExpertSweepRequest sweep_request(const py::object& method, const py::object& amounts,
                                 const py::object& eval_batches, const py::object& seed,
                                 const py::object& loss, const py::object& calib_batches, bool data,
                                 const std::vector<std::string>& other_options) {
  ExpertSweepRequest req;
  if (!method.is_none()) req.criterion = string_arg(method, "method");
  if (!amounts.is_none()) {
    if (py::isinstance<py::str>(amounts) || !py::hasattr(amounts, "__iter__"))
      throw py::type_error("[sensitivity] amounts must be a list of floats in [0, 1), got " +
                           type_name(amounts));
    std::vector<double> out;
    for (auto a : amounts) {
      if (PyBool_Check(a.ptr()) || py::isinstance<py::str>(a))
        throw py::type_error("[sensitivity] every amount must be a float, got " + type_name(a));
      try {
        out.push_back(a.cast<double>());
      } catch (const py::cast_error&) {
        throw py::type_error("[sensitivity] every amount must be a float, got " + type_name(a));
      }
    }
    req.amounts = std::move(out);
  }
  if (PyBool_Check(eval_batches.ptr()))
    throw py::type_error("[sensitivity] eval_batches must be an int, got bool");
  req.eval_batches = optional_arg<int64_t>(eval_batches, "eval_batches", "an int");
  if (PyBool_Check(seed.ptr()))
    throw py::type_error("[sensitivity] seed must be an int >= 0, got bool");
  req.seed = optional_arg<uint64_t>(seed, "seed", "an int >= 0");
  if (!loss.is_none()) req.loss = string_arg(loss, "loss");
  if (PyBool_Check(calib_batches.ptr()))
    throw py::type_error("[sensitivity] calib_batches must be an int, got bool");
  req.calib_batches = optional_arg<int64_t>(calib_batches, "calib_batches", "an int");
  req.data = data;
  req.other_options = other_options;
  req.data_hint = " (an iterable of token batches)";
  return req;
}

void write_expert_page(const ExpertPruneReport& s, const std::string& path) {
  HtmlReport page("prune", "Pruning " + s.name, s.command);
  const ExpertReport& r = s.r;
  auto column = [&](const char* label, bool after) {
    ReportModel m;
    m.label = label;
    m.params = m.nonzero = after ? r.params_after : r.params_before;
    m.measured = "parameters of the module (expert pruning runs in place, without an export)";
    ModelCost cost;
    cost.params = cost.nonzero = m.params;
    for (size_t i = 0; i < r.structured.groups.size(); ++i) {
      const ChannelGroupReport& g = r.structured.groups[i];
      LayerCost l;
      l.name = g.layers.at(0);
      l.op = "MoE";
      const int64_t experts = after ? g.size_after : g.size_before;
      l.params = l.nonzero = experts * r.params_per_expert.at(i);
      cost.layers.push_back(l);
    }
    page.add_model(m, cost);
  };
  column("before", false);
  column("after", true);
  for (const auto& g : r.structured.groups) {
    std::string removed;
    for (int64_t i : g.removed) removed += (removed.empty() ? "" : ", ") + std::to_string(i);
    page.add_note(fmt::format("{}: {} of {} experts kept by {} (removed: {})", g.layers.at(0),
                              g.size_after, g.size_before, r.criterion,
                              removed.empty() ? "none" : removed));
  }
  for (const auto& w : r.structured.warnings) page.add_note(w);
  write_page(page, path);
}

}  // namespace

void bind_experts(py::module_& m) {
  py::class_<ExpertPruneReport>(m, "ExpertReport",
                                R"(What lopper.prune_structured(model, ..., unit="expert") did: one
group per MoE layer (kind "expert": the layer's experts before and after, the indices of those
removed, the mean score), each layer's scores per expert, and the model's parameters before and
after. The fields StructuredReport has, with the same meaning; str(report) is a table,
report.to_dict() its JSON, report.save_html(path) a page.)")
      .def_property_readonly(
          "groups", [](const ExpertPruneReport& s) { return s.r.structured.groups; },
          "One ChannelGroup per MoE layer (kind \"expert\", layers [the MoE block's name], "
          "size_before/size_after in experts, removed: the experts' indices; list).")
      .def_property_readonly(
          "barriers", [](const ExpertPruneReport&) { return std::vector<std::string>{}; },
          "Always empty (every MoE layer found is pruned alike; list of str).")
      .def_property_readonly(
          "warnings", [](const ExpertPruneReport& s) { return s.r.structured.warnings; },
          "What deserves a look (list of str): experts no calibration token reached.")
      .def_property_readonly(
          "method", [](const ExpertPruneReport& s) { return s.r.criterion; },
          "What ranked the experts (str).")
      .def_property_readonly(
          "scores",
          [](const ExpertPruneReport& s) {
            std::map<std::string, std::vector<double>> out;
            for (size_t i = 0; i < s.r.structured.groups.size(); ++i)
              out[s.r.structured.groups[i].layers.at(0)] = s.r.scores.at(i);
            return out;
          },
          "{MoE layer: each expert's score, by its index before pruning} (dict of lists of "
          "float): REAP's saliency, tokens routed (frequency), mean output norm (activation) or "
          "the random draw.")
      .def_property_readonly(
          "experts_before",
          [](const ExpertPruneReport& s) { return s.r.structured.channels_before; },
          "Experts over all MoE layers, before (int).")
      .def_property_readonly(
          "experts", [](const ExpertPruneReport& s) { return s.r.structured.channels_after; },
          "The same after (int).")
      .def_property_readonly(
          "params_before", [](const ExpertPruneReport& s) { return s.r.params_before; },
          "The model's parameters before (int).")
      .def_property_readonly(
          "params", [](const ExpertPruneReport& s) { return s.r.params_after; },
          "Its parameters after (int).")
      .def(
          "to_dict",
          [](const ExpertPruneReport& s) {
            nlohmann::json j = to_json(s.r);
            j["structured"] = "expert";
            j["scope"] = "local";
            return json_to_python(j);
          },
          "The report as JSON (a dict): StructuredReport's fields, experts_before/experts for "
          "its channel counts, each group's scores and tokens.")
      .def(
          "save_html",
          [](const ExpertPruneReport& s, const py::object& path) {
            write_expert_page(s, path_of(path));
          },
          py::arg("path"),
          R"(Writes an HTML page of the pruning: the model's parameters before and after, the
experts per MoE layer, which were removed. Written to a temporary file and renamed; an OSError when
the path cannot be written.)")
      .def("__str__", [](const ExpertPruneReport& s) { return to_table(s.r); })
      .def("__repr__", [](const ExpertPruneReport& s) {
        return fmt::format(
            "ExpertReport(method='{}', layers={}, experts={} -> {}, params={} -> {})",
            s.r.criterion, s.r.structured.groups.size(), s.r.structured.channels_before,
            s.r.structured.channels_after, s.r.params_before, s.r.params_after);
      });

  py::class_<ExpertPruning>(m, "_ExpertPruning",
                            R"(Internal: one expert pruning (lopper/experts.h's ExpertPruning),
driven by python/lopper/_experts.py.)")
      .def(py::init([](const py::list& layers, const py::object& method, const py::object& amount,
                       const py::object& seed, bool data,
                       const std::vector<std::string>& channel_options) {
             const ExpertOptions o = as_usage([&] {
               return request_of(method, amount, seed, data, channel_options).validate();
             });
             std::vector<ExpertLayer> ls;
             for (auto item : layers) ls.push_back(layer_of(item));
             return as_usage([&] { return std::make_unique<ExpertPruning>(o, std::move(ls)); });
           }),
           py::arg("layers"), py::kw_only(), py::arg("method"), py::arg("amount"),
           py::arg("seed") = py::none(), py::arg("data") = false,
           py::arg("channel_options") = std::vector<std::string>{},
           R"(Checks the arguments and the layers ([{name, experts, top_k, params_per_expert}])
before any work: a ValueError for what cannot be pruned so.)")
      .def_property_readonly("needs_data",
                             [](const ExpertPruning& p) { return p.criterion().needs_data; })
      .def_property_readonly("needs_norms",
                             [](const ExpertPruning& p) { return p.criterion().needs_norms; })
      .def(
          "drop",
          [](const ExpertPruning& p, const std::string& name) { return p.drop(p.index(name)); },
          py::arg("layer"), "How many experts the layer loses.")
      .def(
          "observe",
          [](ExpertPruning& p, const std::string& name, const py::object& indices,
             const py::object& weights, const py::object& norms) {
            const at::Tensor i = tensor_arg(indices, "indices"), w = tensor_arg(weights, "weights"),
                             n = tensor_arg(norms, "norms");
            const size_t layer = p.index(name);
            py::gil_scoped_release nogil;
            p.observe(layer, i, w, n);
          },
          py::arg("layer"), py::arg("indices"), py::arg("weights"), py::arg("norms") = py::none(),
          "One batch's routing in the layer: top-k indices [T, k], weights [T, k], and the "
          "routed tokens' expert output norms [T, k] (None when the method reads none).")
      .def(
          "choose",
          [](ExpertPruning& p, const std::string& name) {
            const ExpertChoice& c = p.choose(p.index(name));
            return py::make_tuple(c.kept, c.removed);
          },
          py::arg("layer"), "(kept, removed): the layer's experts, by index, ascending.")
      .def(
          "report",
          [](const ExpertPruning& p, int64_t params_before, int64_t params_after,
             const std::string& name, const std::string& command) {
            ExpertPruneReport r;
            r.r = p.report();
            r.r.params_before = params_before;
            r.r.params_after = params_after;
            r.name = name;
            r.command = command;
            return r;
          },
          py::arg("params_before"), py::arg("params_after"), py::arg("name"), py::arg("command"));

  py::class_<ExpertSweepCall>(m, "_ExpertSweep",
                              R"(Internal: one sweep over the experts (lopper/experts.h's
ExpertSweep), driven by python/lopper/_experts.py.)")
      .def(py::init([](const py::list& layers, const py::object& method, const py::object& amounts,
                       const py::object& eval_batches, const py::object& seed,
                       const py::object& loss, const py::object& calib_batches, bool data,
                       const std::vector<std::string>& other_options) {
             const ExpertSweepOptions o = as_usage([&] {
               return sweep_request(method, amounts, eval_batches, seed, loss, calib_batches, data,
                                    other_options)
                   .validate();
             });
             std::vector<ExpertLayer> ls;
             for (auto item : layers) ls.push_back(layer_of(item));
             auto call = std::make_unique<ExpertSweepCall>();
             call->sweep =
                 as_usage([&] { return std::make_unique<ExpertSweep>(o, std::move(ls)); });
             return call;
           }),
           py::arg("layers"), py::kw_only(), py::arg("method"), py::arg("amounts"),
           py::arg("eval_batches"), py::arg("seed") = py::none(), py::arg("loss") = py::none(),
           py::arg("calib_batches") = py::none(), py::arg("data") = false,
           py::arg("other_options") = std::vector<std::string>{},
           R"(Checks the arguments and the layers ([{name, experts, top_k, params_per_expert}])
before any work: a ValueError for what cannot be swept so.)")
      .def_property_readonly(
          "needs_data", [](const ExpertSweepCall& c) { return c.sweep->criterion().needs_data; })
      .def_property_readonly(
          "needs_norms", [](const ExpertSweepCall& c) { return c.sweep->criterion().needs_norms; })
      .def_property_readonly("method",
                             [](const ExpertSweepCall& c) { return c.sweep->criterion().name; })
      .def_property_readonly(
          "amounts", [](const ExpertSweepCall& c) { return c.sweep->amounts(); },
          "The amounts swept, in order (the defaults the layers can take).")
      .def_property_readonly(
          "eval_batches", [](const ExpertSweepCall& c) { return c.eval.size(); },
          "The evaluation batches held (set_eval).")
      .def(
          "observe",
          [](ExpertSweepCall& c, const std::string& name, const py::object& indices,
             const py::object& weights, const py::object& norms) {
            const at::Tensor i = tensor_arg(indices, "indices"), w = tensor_arg(weights, "weights"),
                             n = tensor_arg(norms, "norms");
            const size_t layer = c.sweep->index(name);
            py::gil_scoped_release nogil;
            c.sweep->observe(layer, i, w, n);
          },
          py::arg("layer"), py::arg("indices"), py::arg("weights"), py::arg("norms") = py::none(),
          "One calibration batch's routing in the layer, on the unpruned model (as "
          "_ExpertPruning.observe).")
      .def(
          "choice",
          [](ExpertSweepCall& c, const std::string& name, size_t j) {
            const ExpertChoice e = c.sweep->choice(c.sweep->index(name), j);
            return py::make_tuple(e.kept, e.removed);
          },
          py::arg("layer"), py::arg("amount"),
          "(kept, removed) at amounts[amount]: the layer's experts, by index, ascending.")
      .def(
          "needs_run",
          [](ExpertSweepCall& c, const std::string& name, size_t j) {
            return c.sweep->needs_run(c.sweep->index(name), j);
          },
          py::arg("layer"), py::arg("amount"),
          "False when the point removes no expert or the same as an earlier amount.")
      .def(
          "set_eval",
          [](ExpertSweepCall& c, const py::list& items) {
            c.eval.clear();
            for (auto item : items) c.eval.push_back(to_batch(item, c.eval.size()));
          },
          py::arg("items"), "The evaluation batches, as given (their labels read by the loss).")
      .def(
          "evaluate",
          [](ExpertSweepCall& c, size_t k, const py::object& logits) {
            const at::Tensor t = tensor_arg(logits, "logits");
            if (k >= c.eval.size()) throw py::index_error("[sensitivity] no evaluation batch");
            py::gil_scoped_release nogil;
            pythonic([&] { c.sweep->evaluate(t, c.eval[k]); });
          },
          py::arg("batch"), py::arg("logits"),
          "The model's logits [B, T, V] on evaluation batch `batch`, for the point measured.")
      .def(
          "end_base", [](ExpertSweepCall& c, int64_t params) { c.sweep->end_base(params); },
          py::arg("params"))
      .def(
          "end_point",
          [](ExpertSweepCall& c, const std::string& name, size_t j, std::optional<int64_t> params) {
            c.sweep->end_point(c.sweep->index(name), j, params);
          },
          py::arg("layer"), py::arg("amount"), py::arg("params"))
      .def(
          "report",
          [](const ExpertSweepCall& c, const std::string& name, const std::string& command) {
            return sensitivity_report(c.sweep->result(), name, command);
          },
          py::arg("name"), py::arg("command"), "The curves, as a lopper.SensitivityReport.");

  m.def(
      "_parse_sensitivity",
      [](const std::string& text, const std::string& source) {
        return sensitivity_report(pythonic([&] { return parse_sensitivity(text, source); }), "",
                                  "");
      },
      py::arg("text"), py::arg("source") = "sensitivity",
      "Internal: a SensitivityReport of sensitivity_json's text (what `lopper prune "
      "--sensitivity FILE` reads), as parse_sensitivity reads it.");
  m.def(
      "_check_expert_sweep",
      [](const py::object& method, const py::object& amounts, const py::object& eval_batches,
         const py::object& seed, const py::object& loss, const py::object& calib_batches, bool data,
         const std::vector<std::string>& other_options) {
        (void)as_usage([&] {
          return sweep_request(method, amounts, eval_batches, seed, loss, calib_batches, data,
                               other_options)
              .validate();
        });
      },
      py::kw_only(), py::arg("method"), py::arg("amounts"), py::arg("eval_batches"),
      py::arg("seed") = py::none(), py::arg("loss") = py::none(),
      py::arg("calib_batches") = py::none(), py::arg("data") = false,
      py::arg("other_options") = std::vector<std::string>{},
      "Internal: a ValueError or TypeError for arguments structured=\"expert\" does not take.");
  m.def(
      "_check_experts",
      [](const py::object& method, const py::object& amount, const py::object& seed, bool data,
         const std::vector<std::string>& channel_options) {
        (void)as_usage(
            [&] { return request_of(method, amount, seed, data, channel_options).validate(); });
      },
      py::kw_only(), py::arg("method"), py::arg("amount"), py::arg("seed") = py::none(),
      py::arg("data") = false, py::arg("channel_options") = std::vector<std::string>{},
      "Internal: a ValueError or TypeError for arguments unit=\"expert\" does not take.");
  m.def("_expert_batches", &calibration_batches, py::arg("data"), py::arg("calib_batches"),
        "Internal: the first calib_batches items of data, each checked as a calibration batch.");
}

}  // namespace lopper::python
