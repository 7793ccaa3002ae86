#include "common.h"

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <thread>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "lopper/analysis.h"
#include "lopper/error.h"
#include "lopper/memory.h"
#include "lopper/npy.h"
#include "lopper/onnx_io.h"
#include "lopper/structured.h"

namespace lopper::cli {

std::pair<std::string, std::string> parse_input_spec(const std::string& spec) {
  size_t eq = spec.rfind('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == spec.size())
    throw UsageError("[run] --input expects NAME=FILE, got '" + spec + "'");
  return {spec.substr(0, eq), spec.substr(eq + 1)};
}

std::pair<std::string, std::vector<int64_t>> parse_shape_spec(const std::string& spec) {
  size_t eq = spec.rfind('=');
  std::string name = eq == std::string::npos ? "" : spec.substr(0, eq);
  std::string dims = eq == std::string::npos ? spec : spec.substr(eq + 1);
  std::vector<int64_t> out;
  size_t i = 0;
  while (i <= dims.size()) {
    size_t j = dims.find_first_of("x,", i);
    if (j == std::string::npos) j = dims.size();
    std::string d = dims.substr(i, j - i);
    if (d.empty() || d.find_first_not_of("0123456789") != std::string::npos || d.size() > 12)
      throw UsageError("[shape] bad shape '" + spec + "' (expected NAME=1x3x224x224)");
    out.push_back(std::stoll(d));
    i = j + 1;
  }
  // Refused before any work when even one byte per element would not fit.
  double values = tensor_bytes(out, 1);
  if (exceeds_memory(values))
    throw UsageError(detail::concat(
        "[shape] --shape ", spec, " asks for ",
        values < 1e18 ? fmt::format("{:.0f}", values) : fmt::format("{:.3g}", values),
        " values: at least ", human_bytes(values), ", more than this machine's memory (",
        human_bytes(static_cast<double>(memory_bytes())), ")"));
  return {name, out};
}

std::map<std::string, std::vector<int64_t>> parse_shape_overrides(
    const std::vector<std::string>& specs) {
  std::map<std::string, std::vector<int64_t>> out;
  for (const auto& s : specs) {
    auto [name, dims] = parse_shape_spec(s);
    out[name] = dims;
  }
  return out;
}

std::string shape_string(at::IntArrayRef shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += 'x';
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

}  // namespace lopper::cli

namespace lopper::cli {

void warn_about_model(const ir::Model& m, const std::string& path) {
  for (const auto& w : load_warnings(m)) warn(path + ": " + w);
}

void warn(const std::string& what) { std::cerr << "lopper: warning: " << what << "\n"; }

ir::Model load_input_model(OutputFiles& files, const std::string& path) {
  return lopper::load_input_model(files, path, warn);
}

namespace {

template <typename Parse>
auto whole(const std::string& s, Parse parse) -> std::optional<decltype(parse(s, nullptr))> {
  size_t used = 0;
  try {
    auto v = parse(s, &used);
    if (used == s.size()) return v;
  } catch (const std::exception&) {
  }
  return std::nullopt;
}

}  // namespace

std::optional<int> whole_int(const std::string& s) {
  return whole(s, [](const std::string& t, size_t* used) { return std::stoi(t, used); });
}

std::optional<double> whole_double(const std::string& s) {
  return whole(s, [](const std::string& t, size_t* used) { return std::stod(t, used); });
}

void add_threads_option(CLI::App* cmd, int& threads) {
  const int most = max_threads();  // executor.h: why there is a bound
  cmd->add_option("--threads", threads,
                  fmt::format("intra-op threads, 0..{} (0, the default: the idle CPUs)", most))
      ->check(CLI::Validator(
          [most](std::string& v) -> std::string {
            const std::optional<int> n = whole_int(v);
            if (!n || *n < 0 || *n > most)
              return fmt::format(
                  "must be 0..{} (0: the default; at most 4x the {} hardware threads), got '{}'",
                  most, std::thread::hardware_concurrency(), v);
            return "";
          },
          "INT in [0 - " + std::to_string(most) + "]", "threads"));
}

CLI::App* model_command(CLI::App& app, const std::string& name, const std::string& help,
                        std::string& model) {
  CLI::App* cmd = app.add_subcommand(name, help);
  cmd->add_option("model", model, "the ONNX model")->required();
  return cmd;
}

std::string flag_of(const std::string& option) {
  // The options whose flag is not their name with dashes.
  static const std::map<std::string, std::string> flags = {
      {"criterion", "--method"},
      {"prune.criterion", "--prune-method"},
      {"structured.criterion", "--prune-method"},
      {"structured_schedule", "--prune-structured"},
      {"prune.allow_tied", "--allow-tied"},
      {"every_epochs", "--every"},
      {"batches", "--calib-batches"},
      {"input_shapes", "--shape"},
      {"target_latency", "--target-latency-ms"},
      {"match", "match"},  // a recipe rule's key, not a flag
  };
  if (auto it = flags.find(option); it != flags.end()) return it->second;
  std::string flag = "--" + option;
  for (char& ch : flag)
    if (ch == '_' || ch == '.') ch = '-';
  return flag;
}

std::string library_name(const CLI::Option& flag) {
  std::string name = flag.get_name();
  if (name == "--method") return "criterion";
  if (name == "--calib-batches") return "batches";
  if (name == "--shape") return "input_shapes";
  if (name.rfind("--", 0) == 0) name = name.substr(2);
  for (char& ch : name)
    if (ch == '-') ch = '_';
  return name;
}

CriterionInfo weight_criterion(const std::string& name) {
  return parse_flag([&] { return weight_criterion_info(name); });
}

CriterionInfo channel_criterion(const std::string& name) {
  return parse_flag([&] { return channel_criterion_info(name.empty() ? "l1" : name); });
}

std::string data_methods() { return criterion_names(weight_criteria(), " and ", true); }

std::string method_help() {
  std::string s = "what ranks the weights (or --recipe):";
  for (const auto& c : weight_criteria()) s += "\n  " + c.name + ": " + c.summary;
  return s;
}

void check_device_flag(const std::string& device) { (void)check_device(device); }

void load_cuda_if_asked(const CLI::App& command) {
  const CLI::Option* device = command.get_option_no_throw("--device");
  // A library that cannot be loaded is reported where the device is checked.
  if (device != nullptr && device->count() > 0 && device->as<std::string>().rfind("cuda", 0) == 0)
    (void)load_cuda();
}

std::vector<CLI::Option*> DataFlags::add(CLI::App* cmd, const std::string& default_split,
                                         const std::string& purpose, int64_t default_batch_size) {
  split = default_split;
  batch_size = default_batch_size;
  const std::string specs =
      "fashion-mnist | idx:DIR | cifar10:DIR | folder:DIR | npy:X.npy,Y.npy | "
      "npy:NAME=F.npy,...[,labels=Y.npy] | tokens:IDS.npy[,labels=Y.npy][,mask=M.npy][,pad=ID]";
  std::vector<CLI::Option*> added;
  added.push_back(
      cmd->add_option("--data", data, purpose.empty() ? specs : purpose + ": " + specs));
  if (purpose.empty()) added.back()->required();
  added.push_back(
      cmd->add_option("--split", split, "train | test (default " + default_split + ")"));
  added.push_back(cmd->add_option(
      "--batch-size", batch_size,
      fmt::format("samples per batch (default {}; a model with a fixed batch dim sets it)",
                  default_batch_size)));
  added.push_back(cmd->add_option(
      "--normalize", normalize,
      "subtract MEAN, divide by STD after scaling pixels to [0, 1] (one value or one per "
      "channel: M1,M2,M3,S1,S2,S3)"));
  added.push_back(cmd->add_option("--resize", resize, "resize images to HxW"));
  added.push_back(cmd->add_option(
      "--loss", loss,
      "auto (default: from the labels and the output) | cross-entropy | mse | causal-lm | "
      "masked-lm | token-classification"));
  added.push_back(
      cmd->add_option("--mask-token", mask_token, "masked-lm: the mask token's ID ([MASK])"));
  added.push_back(cmd->add_option("--mask-prob", mask_prob,
                                  "masked-lm: share of the tokens masked and predicted (0.15)"));
  return added;
}

}  // namespace lopper::cli
