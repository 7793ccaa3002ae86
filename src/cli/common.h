// Helpers shared by the subcommands.
#pragma once

#include <ATen/core/Tensor.h>

#include <CLI/CLI.hpp>

#include "lopper/data.h"
#include "lopper/executor.h"
#include "lopper/graph.h"

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace lopper::cli {

/// "NAME=FILE" -> (NAME, tensor from .npy or TensorProto .pb).
std::pair<std::string, at::Tensor> parse_input_spec(const std::string& spec);
/// "NAME=1x3x224x224" -> (NAME, dims).
std::pair<std::string, std::vector<int64_t>> parse_shape_spec(const std::string& spec);
/// Every --shape NAME=DIMS given, by input name ("" when the name is left out).
std::map<std::string, std::vector<int64_t>> parse_shape_overrides(const std::vector<std::string>& specs);
/// A value name made safe as a file name ('/' and other odd characters become '_').
std::string safe_file_name(const std::string& name);
std::string shape_string(at::IntArrayRef shape);
/// Width of a table's layer-name column: the longest name, at least `min`, at most 48.
size_t name_column_width(const std::vector<std::string>& names, size_t min);
/// The model's fixed batch size: the first dim of its first real input when that dim is static and
/// positive, else 0 (dynamic).
int64_t fixed_batch_size(const ir::Model& model);
/// Bytes of a model file plus its external data file ("<path>.data"), 0 when it cannot be read.
int64_t model_file_bytes(const std::string& path);
/// Throws UsageError "[CMD] -o names the input model; ..." when `out` is the file `model`.
void refuse_to_overwrite(const std::string& cmd, const std::string& model, const std::string& out);
/// The executor's options for --device and --precision (parsed; errors name the bad value).
ExecOptions exec_options(const std::string& device, const std::string& precision);
/// `name` cut to `width` from the left ("…" + its end) when longer.
std::string fit_name(const std::string& name, size_t width);

/// Data options shared by train, eval and sensitivity: --data (required), --split, --batch-size,
/// --normalize, --resize.
struct DataFlags {
  std::string data, split, normalize, resize;
  int64_t batch_size = 64;
  void add(CLI::App* cmd, const std::string& default_split);
  /// Loader options for `model` (a fixed batch dim wins over --batch-size).
  LoaderOptions loader(const ir::Model& model, bool& fixed_batch) const;
};

}  // namespace lopper::cli
