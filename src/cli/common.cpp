#include "cli/common.h"

#include <filesystem>

#include <ATen/ATen.h>

#include "lopper/error.h"
#include "lopper/npy.h"
#include "lopper/onnx_io.h"

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
  return {name, out};
}

std::map<std::string, std::vector<int64_t>> parse_shape_overrides(const std::vector<std::string>& specs) {
  std::map<std::string, std::vector<int64_t>> out;
  for (const auto& s : specs) {
    auto [name, dims] = parse_shape_spec(s);
    out[name] = dims;
  }
  return out;
}

std::string safe_file_name(const std::string& name) {
  std::string out;
  for (char c : name) out += (isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_') ? c : '_';
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

size_t name_column_width(const std::vector<std::string>& names, size_t min) {
  size_t w = min;
  for (const auto& n : names) w = std::max(w, n.size());
  return std::min<size_t>(w, 48);
}

std::string fit_name(const std::string& name, size_t width) {
  return name.size() > width ? "…" + name.substr(name.size() - width + 1) : name;
}

int64_t fixed_batch_size(const ir::Model& model) {
  for (const auto& v : model.graph.inputs) {
    if (model.graph.find_initializer(v.name)) continue;
    if (!v.type.dims.empty() && v.type.dims[0].is_static() && v.type.dims[0].value > 0)
      return v.type.dims[0].value;
    return 0;
  }
  return 0;
}

void refuse_to_overwrite(const std::string& cmd, const std::string& model, const std::string& out) {
  std::error_code ec;
  if (std::filesystem::exists(out) && std::filesystem::equivalent(model, out, ec))
    throw UsageError("[" + cmd + "] -o names the input model; lopper never overwrites its input");
}

int64_t model_file_bytes(const std::string& path) {
  std::error_code ec;
  auto n = std::filesystem::file_size(path, ec);
  if (ec) return 0;
  int64_t total = int64_t(n);
  if (std::filesystem::exists(path + ".data", ec))
    total += int64_t(std::filesystem::file_size(path + ".data", ec));
  return total;
}

ExecOptions exec_options(const std::string& device, const std::string& precision) {
  ExecOptions eo;
  eo.device = device;
  eo.precision = parse_precision(precision);
  return eo;
}

void DataFlags::add(CLI::App* cmd, const std::string& default_split) {
  split = default_split;
  cmd->add_option("--data", data,
                  "fashion-mnist | idx:DIR | cifar10:DIR | folder:DIR | npy:X.npy,Y.npy")
      ->required();
  cmd->add_option("--split", split, "train | test (default " + default_split + ")");
  cmd->add_option("--batch-size", batch_size,
                  "samples per batch (default 64; a model with a fixed batch dim sets it)");
  cmd->add_option("--normalize", normalize,
                  "subtract MEAN, divide by STD after scaling pixels to [0, 1] (one value or one "
                  "per channel: M1,M2,M3,S1,S2,S3)");
  cmd->add_option("--resize", resize, "resize images to HxW");
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

}  // namespace lopper::cli
