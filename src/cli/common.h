// Helpers shared by the subcommands.
#pragma once

#include <ATen/core/Tensor.h>

#include <CLI/CLI.hpp>

#include "lopper/command.h"
#include "lopper/data.h"
#include "lopper/error.h"
#include "lopper/executor.h"
#include "lopper/files.h"
#include "lopper/graph.h"
#include "lopper/loss.h"
#include "lopper/prune.h"
#include "lopper/report.h"

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace lopper::cli {

/// The flag that sets a library option ("round_to" -> "--round-to", "criterion" -> "--method").
std::string flag_of(const std::string& option);

/// The library option a flag sets, the inverse of flag_of ("--calib-batches" -> "batches").
std::string library_name(const CLI::Option& flag);

/// `s` read whole as an int (std::stoi) or a double (std::stod); nothing when it is no number or
/// has more after one.
std::optional<int> whole_int(const std::string& s);
std::optional<double> whole_double(const std::string& s);

/// Runs `parse`, which reads flag values with the library's parsers: a lopper::Error it throws is
/// about the user's flag, so it becomes a UsageError (exit code 2).
template <typename F>
auto parse_flag(F&& parse) -> decltype(parse()) {
  return with_option_names(std::forward<F>(parse), flag_of, /*all_usage=*/true);
}

/// A subcommand of `app` that reads one ONNX model: its first positional argument, into `model`.
CLI::App* model_command(CLI::App& app, const std::string& name, const std::string& help,
                        std::string& model);

/// The criterion --method names (src/prune/importance.h): ranking single weights, or channels
/// (empty: l1). An unknown name is a UsageError that lists the methods.
CriterionInfo weight_criterion(const std::string& name);
CriterionInfo channel_criterion(const std::string& name);
/// The weight criteria that rank by data, for messages: "grad, taylor, wanda and sparsegpt".
std::string data_methods();
/// --method's help: every weight criterion with its one-line summary.
std::string method_help();

/// Checks a --device value: a bad spelling is a UsageError (exit 2); a CUDA device that is not
/// there is an Error (exit 1).
void check_device_flag(const std::string& device);

/// Loads lopper's CUDA library when the command's --device names a GPU, before the command does
/// anything (lopper::load_cuda()); a CPU run never maps libtorch_cuda.
void load_cuda_if_asked(const CLI::App& command);

/// "NAME=FILE" -> (NAME, FILE).
std::pair<std::string, std::string> parse_input_spec(const std::string& spec);
/// "NAME=1x3x224x224" -> (NAME, dims).
std::pair<std::string, std::vector<int64_t>> parse_shape_spec(const std::string& spec);
/// Every --shape NAME=DIMS given, by input name ("" when the name is left out).
std::map<std::string, std::vector<int64_t>> parse_shape_overrides(
    const std::vector<std::string>& specs);
std::string shape_string(at::IntArrayRef shape);
/// One warning line on stderr for what in `m` makes its figures another model's than the one a
/// user deploys (BatchNormalization in training mode).
void warn_about_model(const ir::Model& m, const std::string& path);
/// Says a request's warning on stderr ("lopper: warning: ..."): the CLI's Warn.
void warn(const std::string& what);
/// Loads the model at `path` (warn_about_model); it and its external data files become inputs of
/// `files`.
ir::Model load_input_model(OutputFiles& files, const std::string& path);
/// Adds --threads to `cmd`: intra-op threads, 0 (the default) = configure_threads' choice, at most
/// max_threads(); anything else is a usage error. Every command that runs a model has it and calls
/// configure_threads(threads) before its work.
void add_threads_option(CLI::App* cmd, int& threads);
/// The data options of every command that reads a dataset: --data, --split, --batch-size,
/// --normalize, --resize, --loss, --mask-token, --mask-prob.
struct DataFlags : DataSpec {
  /// Adds the options to `cmd`, --data first (the options added, in that order). `purpose`: what
  /// the data is for, when --data is optional ("" makes it required).
  std::vector<CLI::Option*> add(CLI::App* cmd, const std::string& default_split,
                                const std::string& purpose = "", int64_t default_batch_size = 64);
};

}  // namespace lopper::cli
