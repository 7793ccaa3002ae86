// Helpers shared by the subcommands.
#pragma once

#include <ATen/core/Tensor.h>

#include <CLI/CLI.hpp>

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
#include <string>
#include <utility>
#include <vector>

namespace lopper::cli {

/// The flag that sets a library option ("round_to" -> "--round-to", "criterion" -> "--method").
std::string flag_of(const std::string& option);

/// The library option a flag sets, the inverse of flag_of ("--calib-batches" -> "batches").
std::string library_name(const CLI::Option& flag);

/// Runs `parse`, which reads flag values with the library's parsers: a lopper::Error it throws is
/// about the user's flag, so it becomes a UsageError (exit code 2).
template <typename F>
auto parse_flag(F&& parse) -> decltype(parse()) {
  try {
    return parse();
  } catch (const UsageError& e) {
    throw UsageError(e.render(flag_of));
  } catch (const Error& e) {
    throw UsageError(e.render(flag_of));
  }
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

/// "NAME=FILE" -> (NAME, tensor from .npy or TensorProto .pb).
std::pair<std::string, at::Tensor> parse_input_spec(const std::string& spec);
/// "NAME=1x3x224x224" -> (NAME, dims).
std::pair<std::string, std::vector<int64_t>> parse_shape_spec(const std::string& spec);
/// Every --shape NAME=DIMS given, by input name ("" when the name is left out).
std::map<std::string, std::vector<int64_t>> parse_shape_overrides(
    const std::vector<std::string>& specs);
/// A value name made safe as a file name ('/' and other odd characters become '_').
std::string safe_file_name(const std::string& name);
std::string shape_string(at::IntArrayRef shape);
/// The model's fixed batch size: the first dim of its first real input when that dim is static and
/// positive, else 0 (dynamic).
int64_t fixed_batch_size(const ir::Model& model);
/// Bytes of the model file at `path` plus the external data files `model` was read from (0 when
/// the file cannot be read).
int64_t model_file_bytes(const std::string& path, const ir::Model& model);
/// Bytes of a model staged in `files` (the model and "<path>.data").
int64_t staged_model_bytes(const OutputFiles& files, const std::string& path);
/// The files a --data SPEC reads (npy:X.npy,Y.npy: both), as inputs of `files`.
void add_data_inputs(OutputFiles& files, const std::string& spec);
/// One warning line on stderr for what in `m` makes its figures another model's than the one a
/// user deploys (BatchNormalization in training mode).
void warn_about_model(const ir::Model& m, const std::string& path);
/// Loads the model at `path` (warn_about_model); it and its external data files become inputs of
/// `files`.
ir::Model load_input_model(OutputFiles& files, const std::string& path);
/// Adds --threads to `cmd`: intra-op threads, 0 (the default) = configure_threads' choice, at most
/// max_threads(); anything else is a usage error. Every command that runs a model has it and calls
/// configure_threads(threads) before its work.
void add_threads_option(CLI::App* cmd, int& threads);
/// The executor's options for --device and --precision (parsed; errors name the bad value).
ExecOptions exec_options(const std::string& device, const std::string& precision);

/// The data options of every command that reads a dataset: --data, --split, --batch-size,
/// --normalize, --resize.
struct DataFlags {
  std::string data, split, normalize, resize, loss = "auto";
  int64_t batch_size = 64;
  int64_t mask_token = -1;
  double mask_prob = 0.15;
  /// Adds the options to `cmd`, --data first (the options added, in that order). `purpose`: what
  /// the data is for, when --data is optional ("" makes it required).
  std::vector<CLI::Option*> add(CLI::App* cmd, const std::string& default_split,
                                const std::string& purpose = "", int64_t default_batch_size = 64);
  bool given() const { return !data.empty(); }
  /// Loader options for `model` (a fixed batch dim wins over --batch-size).
  LoaderOptions loader(const ir::Model& model, bool& fixed_batch) const;
  LoaderOptions loader(const ir::Model& model) const;
  /// The dataset --data and --split name.
  std::shared_ptr<Dataset> dataset() const;
  /// --loss, --mask-token and --mask-prob, checked (UsageError naming the flag); `seed` picks the
  /// masked tokens.
  LossOptions loss_options(uint64_t seed = 0) const;
  /// Whether the data is one split only (npy:, tokens:): --split does not apply.
  bool one_split() const;
};

}  // namespace lopper::cli
