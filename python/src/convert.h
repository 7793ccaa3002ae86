// What the bindings share: Python arguments and batches converted to lopper's types, with the
// package's errors (a TypeError for a wrong type, lopper's UsageError -> ValueError for a bad
// value; module.cpp translates lopper's errors).
#pragma once

#include <ATen/core/Tensor.h>
#include <pybind11/pybind11.h>

#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "lopper/analysis.h"
#include "lopper/command.h"
#include "lopper/data.h"
#include "lopper/error.h"
#include "lopper/graph.h"
#include "lopper/loss.h"
#include "lopper/prune.h"
#include "lopper/report.h"

namespace lopper::python {

/// The Python type's name of `h`, for messages.
std::string type_name(pybind11::handle h);

/// The Python argument that sets the library's option `option` (marked LOPPER_OPTION in its
/// messages): "criterion" -> "method", "batches" -> "calib_batches", the others as they are.
std::string python_option(const std::string& option);

// Runs `f`, turning lopper's errors into usage errors: what it checks is the caller's arguments
// (ValueError in Python, module.cpp). Options are named as the Python arguments (python_option).
template <typename F>
auto as_usage(F&& f) {
  return with_option_names(std::forward<F>(f), python_option, /*all_usage=*/true);
}

// Runs `f`; lopper's errors keep their kind (UsageError: ValueError, Error: RuntimeError) and name
// options as the Python arguments do (python_option).
template <typename F>
auto pythonic(F&& f) {
  return with_option_names(std::forward<F>(f), python_option, /*all_usage=*/false);
}

/// torch.nn.utils.prune's `amount`: an int is a count, a float a fraction.
PruneAmount to_amount(pybind11::handle a);

template <typename T>
std::optional<T> optional_arg(pybind11::handle h, const char* what, const char* kind) {
  if (h.is_none()) return std::nullopt;
  try {
    return h.cast<T>();
  } catch (const pybind11::cast_error&) {
    // An int of the right type but out of range (a negative seed, 2**64) is a bad value.
    if (PyLong_Check(h.ptr()) && !PyBool_Check(h.ptr()))
      throw UsageError(std::string("[prune] ") + what + " must be " + kind + ", got " +
                       pybind11::str(h).cast<std::string>());
    throw pybind11::type_error(std::string("[prune] ") + what + " must be " + kind + ", got " +
                               type_name(h));
  }
}

/// `h` as a str; a TypeError naming `what` otherwise.
std::string string_arg(pybind11::handle h, const char* what);

/// os.fsdecode(p): a str or an os.PathLike as a path.
std::string path_of(pybind11::handle p);

/// One item of the user's data: a tensor of samples, (samples, labels), or a mapping of named
/// inputs (and "labels"), as torch DataLoaders and transformers' collators give them.
Batch to_batch(pybind11::handle item, size_t i);

/// Calibration options from lopper.prune's arguments of the same names (loss, mask_token,
/// calib_batches, device); `seed` picks masked-LM's tokens.
CalibrationOptions calibration_arg(pybind11::handle loss, pybind11::handle mask_token,
                                   int64_t calib_batches, pybind11::handle device, uint64_t seed);

/// The first `limit` batches of the iterable `data` (it may be endless) as a DataLoader.
std::unique_ptr<DataLoader> loader_arg(pybind11::handle data, int64_t limit);

/// A Python callable progress(done, total, loss) as lopper's callback: called with the GIL held,
/// and Ctrl-C (a pending signal) stops the work there.
std::function<void(int64_t, int64_t, double)> progress_arg(const pybind11::object& progress);

/// The example's input shapes (in the export's input order) by the graph's input names; empty
/// (dynamic dims then default to 1) when their count differs from the graph's inputs.
std::map<std::string, std::vector<int64_t>> input_shapes(
    const ir::Model& model, const std::vector<std::vector<int64_t>>& example);

/// The names of the export's prunable weights that are not in `params` (constants of the export,
/// buffers), as one anchored regex that matches them literally ("" when there are none).
std::string constants_regex(const ir::Model& model, const std::set<std::string>& params);
/// Adds `regex` to `exclude` (an alternative).
void exclude_also(std::string& exclude, const std::string& regex);

/// What a pruning report's save_html measures: the export before and after pruning (sharing the
/// tensors pruning left alone), the example's input shapes and the device lopper ran on; the page's
/// title names the module and shows the call.
struct PrunedExport {
  std::shared_ptr<const ir::Model> model_before, model_after;
  std::map<std::string, std::vector<int64_t>> shapes;
  ModelCost before, after;
  std::string device, name, command;
  int64_t file_bytes = 0;  // the unpruned export's
};

/// What a pruning page adds to its two columns (both called without the GIL): `accuracy` may set
/// the columns' accuracy before they are added, `sections` adds the page's own sections after.
struct PageParts {
  std::function<void(ReportModel& before, ReportModel& after)> accuracy;
  std::function<void(HtmlReport& page, const ReportModel& before, const ReportModel& after)>
      sections;
};

/// Writes the page `lopper prune ... --report FILE` writes for `e` (the module before and after,
/// measured now) with `parts`, to `path` (write_page); latency warnings are issued as Python
/// warnings.
void write_pruning_page(const PrunedExport& e, const PageParts& parts, const std::string& path);
/// The same with `notes` as its sections.
void write_pruning_page(const PrunedExport& e, const std::vector<std::string>& notes,
                        const std::string& path);

/// A report page's two summary columns, "before" and "after": the exports' costs and their latency
/// measured now as `how` says; `file_bytes` is the unpruned export's size. Latency warnings are
/// appended to `warnings` ("before: ..."). Call with the GIL released.
std::pair<ReportModel, ReportModel> measure_before_after(
    const ir::Model& before, const ir::Model& after, const ModelCost& cost_before,
    const ModelCost& cost_after, const ReportMeasure& how, int64_t file_bytes,
    std::vector<std::string>& warnings);

/// Writes the page to `path` (a temporary file, then a rename); an OSError, as open()'s, when it
/// cannot.
void write_page(const HtmlReport& rep, const std::string& path);

/// warnings.warn(text) (a UserWarning).
void warn(const std::string& text);

/// `j` as Python objects (dicts, lists, numbers, str).
pybind11::object json_to_python(const nlohmann::json& j);

/// A recipe argument: a dict (parsed as the YAML it is) or the path of a YAML file.
PruneRecipe recipe_arg(pybind11::handle recipe);

// lopper.prune's (prune.cpp), shared with lopper.sensitivity and lopper.prune_to_target: the
// calibration batches of wanda, sparsegpt and OWL (at most `limit`, default the papers' 128
// samples; a smaller last batch left out), and whether pruning changed the kept entries of a
// weight (sparsegpt's update), not only zeroed some.
std::unique_ptr<DataLoader> calibration_loader(pybind11::handle data, std::optional<int64_t> limit);
/// The items of `data` calibration_loader() reads, as they are (a list).
pybind11::list calibration_items(pybind11::handle data, std::optional<int64_t> limit);
bool kept_changed(const at::Tensor& before, const at::Tensor& after);

}  // namespace lopper::python
