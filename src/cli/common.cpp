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

std::pair<std::string, at::Tensor> parse_input_spec(const std::string& spec) {
  size_t eq = spec.rfind('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == spec.size())
    throw UsageError("[run] --input expects NAME=FILE, got '" + spec + "'");
  std::string name = spec.substr(0, eq), file = spec.substr(eq + 1);
  auto ends = [&](const char* s) {
    std::string e(s);
    return file.size() >= e.size() && file.compare(file.size() - e.size(), e.size(), e) == 0;
  };
  if (ends(".npy")) return {name, load_npy(file)};
  if (ends(".pb")) return {name, onnx::load_tensor_pb(file)};
  throw UsageError("[run] input file '" + file + "' must be .npy or .pb");
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

std::string safe_file_name(const std::string& name) {
  std::string out;
  for (char c : name)
    out += (isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_') ? c : '_';
  if (out.empty() || out[0] == '.') out = "_" + out;
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

int64_t fixed_batch_size(const ir::Model& model) {
  for (const auto& v : model.graph.inputs) {
    if (model.graph.find_initializer(v.name)) continue;
    if (!v.type.dims.empty() && v.type.dims[0].is_static() && v.type.dims[0].value > 0)
      return v.type.dims[0].value;
    return 0;
  }
  return 0;
}

int64_t model_file_bytes(const std::string& path, const ir::Model& model) {
  std::error_code ec;
  auto n = std::filesystem::file_size(path, ec);
  if (ec) return 0;
  int64_t total = int64_t(n);
  for (const auto& f : model.external_files) {
    auto m = std::filesystem::file_size(f, ec);
    if (!ec) total += int64_t(m);
  }
  return total;
}

int64_t staged_model_bytes(const OutputFiles& files, const std::string& path) {
  return files.staged_bytes(path) + files.staged_bytes(path + ".data");
}

void add_data_inputs(OutputFiles& files, const std::string& spec) {
  const size_t colon = spec.find(':');
  if (colon == std::string::npos) return;
  std::string rest = spec.substr(colon + 1);
  for (size_t i = 0; i <= rest.size();) {
    size_t j = rest.find(',', i);
    if (j == std::string::npos) j = rest.size();
    std::string entry = rest.substr(i, j - i);
    size_t eq = entry.find('=');  // NAME=FILE (npy:, tokens:)
    files.input(eq == std::string::npos ? entry : entry.substr(eq + 1));
    i = j + 1;
  }
}

void warn_about_model(const ir::Model& m, const std::string& path) {
  for (const auto& w : load_warnings(m))
    std::cerr << "lopper: warning: " << path << ": " << w << "\n";
}

ir::Model load_input_model(OutputFiles& files, const std::string& path) {
  files.input(path);
  ir::Model m = onnx::load_model(path);
  for (const auto& f : m.external_files) files.input(f);
  warn_about_model(m, path);
  return m;
}

void add_threads_option(CLI::App* cmd, int& threads) {
  const int most = max_threads();  // executor.h: why there is a bound
  cmd->add_option("--threads", threads,
                  fmt::format("intra-op threads, 0..{} (0, the default: the idle CPUs)", most))
      ->check(CLI::Validator(
          [most](std::string& v) -> std::string {
            int n = 0;
            size_t used = 0;
            try {
              n = std::stoi(v, &used);
            } catch (const std::exception&) {
              used = 0;
            }
            if (used == 0 || used != v.size() || n < 0 || n > most)
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

ExecOptions exec_options(const std::string& device, const std::string& precision) {
  ExecOptions eo;
  eo.device = device;
  eo.precision = parse_flag([&] { return parse_precision(precision); });
  check_device_flag(device);
  return eo;
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

LoaderOptions DataFlags::loader(const ir::Model& model, bool& fixed_batch) const {
  LOPPER_CHECK(batch_size > 0, "[data] --batch-size must be > 0, got ", batch_size);
  LoaderOptions lo;
  lo.batch_size = batch_size;
  int64_t fixed = fixed_batch_size(model);
  fixed_batch = fixed > 0;
  if (fixed_batch) lo.batch_size = fixed;
  if (!normalize.empty()) parse_normalize(normalize, lo);
  if (!resize.empty()) parse_resize(resize, lo);
  return lo;
}

LoaderOptions DataFlags::loader(const ir::Model& model) const {
  bool fixed = false;
  return loader(model, fixed);
}

std::shared_ptr<Dataset> DataFlags::dataset() const { return open_dataset(data, split); }

LossOptions DataFlags::loss_options(uint64_t seed) const {
  LossOptions o;
  o.loss = parse_flag([&] { return parse_loss(loss); });
  o.mask_token = mask_token;
  o.mask_prob = mask_prob;
  o.seed = seed;
  parse_flag([&] { check_loss_options(o); });
  return o;
}

bool DataFlags::one_split() const {
  return data.rfind("npy:", 0) == 0 || data.rfind("tokens:", 0) == 0;
}

}  // namespace lopper::cli
