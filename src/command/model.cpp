// The requests that read one model and say what it is, run it or write it again (inspect, run,
// convert), and what every request that reads a model or a dataset shares.
#include <ATen/ATen.h>

#include <filesystem>
#include <map>

#include "lopper/command.h"
#include "lopper/error.h"
#include "lopper/npy.h"
#include "lopper/onnx_io.h"
#include "rules.h"

namespace lopper {

using command::as_usage;
using command::opt;

LoaderOptions DataSpec::loader(const ir::Model& model, bool& fixed_batch) const {
  if (batch_size <= 0)
    throw Error(detail::concat("[data] ", opt("batch_size"), " must be > 0, got ", batch_size));
  LoaderOptions lo;
  lo.batch_size = batch_size;
  const int64_t fixed = fixed_batch_size(model);
  fixed_batch = fixed > 0;
  if (fixed_batch) lo.batch_size = fixed;
  if (!normalize.empty()) parse_normalize(normalize, lo);
  if (!resize.empty()) parse_resize(resize, lo);
  return lo;
}

LoaderOptions DataSpec::loader(const ir::Model& model) const {
  bool fixed = false;
  return loader(model, fixed);
}

LoaderOptions DataSpec::eval_loader(const ir::Model& model) const {
  bool fixed = false;
  LoaderOptions lo = loader(model, fixed);
  lo.shuffle = false;
  lo.drop_last = fixed;
  return lo;
}

std::shared_ptr<Dataset> DataSpec::dataset() const { return open_dataset(data, split); }

LossOptions DataSpec::loss_options(uint64_t seed) const {
  LossOptions o;
  o.loss = as_usage([&] { return parse_loss(loss); });
  o.mask_token = mask_token;
  o.mask_prob = mask_prob;
  o.seed = seed;
  as_usage([&] { check_loss_options(o); });
  return o;
}

bool DataSpec::one_split() const {
  return data.rfind("npy:", 0) == 0 || data.rfind("tokens:", 0) == 0;
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

int64_t fixed_batch_size(const ir::Model& model) {
  for (const auto& v : model.graph.inputs) {
    if (model.graph.find_initializer(v.name)) continue;
    if (!v.type.dims.empty() && v.type.dims[0].is_static() && v.type.dims[0].value > 0)
      return v.type.dims[0].value;
    return 0;
  }
  return 0;
}

namespace command {
void say_warnings(const ir::Model& m, const std::string& path, const Warn& warn) {
  if (!warn) return;
  for (const auto& w : load_warnings(m)) warn(path + ": " + w);
}
}  // namespace command

ir::Model load_input_model(OutputFiles& files, const std::string& path, const Warn& warn) {
  files.input(path);
  ir::Model m = onnx::load_model(path);
  for (const auto& f : m.external_files) files.input(f);
  command::say_warnings(m, path, warn);
  return m;
}

ExecOptions exec_options(const std::string& device, const std::string& precision) {
  ExecOptions eo;
  eo.device = device;
  eo.precision = as_usage([&] { return parse_precision(precision); });
  (void)check_device(device);
  return eo;
}

InspectResult InspectRequest::run() const {
  ir::Model m = onnx::load_model(model);
  InspectResult r;
  r.cost = analyze(m, resolve_input_shapes(m, input_shapes));
  r.file_bytes = model_file_bytes(model, m);
  // A weight several layers read (stored once by the exporter): each layer is marked.
  std::map<std::string, int> readers;
  for (const auto& l : r.cost.layers) ++readers[l.weight];
  for (const auto& l : r.cost.layers) r.shared.push_back(readers[l.weight] > 1);
  return r;
}

namespace {
std::string safe_file_name(const std::string& name) {
  std::string out;
  for (char c : name)
    out += (isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_') ? c : '_';
  if (out.empty() || out[0] == '.') out = "_" + out;
  return out;
}

bool ends_with(const std::string& s, const std::string& end) {
  return s.size() >= end.size() && s.compare(s.size() - end.size(), end.size(), end) == 0;
}
}  // namespace

std::vector<RunOutput> RunRequest::run() const {
  OutputFiles files("run");
  ir::Model m = load_input_model(files, model, warn);
  NamedTensors feeds;
  for (const auto& [name, file] : inputs) {
    files.input(file);
    if (ends_with(file, ".npy"))
      feeds.emplace_back(name, load_npy(file));
    else if (ends_with(file, ".pb"))
      feeds.emplace_back(name, onnx::load_tensor_pb(file));
    else
      throw UsageError("[run] input file '" + file + "' must be .npy or .pb");
  }
  // The folder is checked (and made, if new) before the run; each output is declared then, so a
  // name that is an input or not a regular file is refused before any is written.
  files.folder(out, opt("out"));
  Executor exec(m, exec_options(device, precision));
  std::vector<RunOutput> r;
  for (const auto& n : exec.output_names()) {
    r.push_back({n, (std::filesystem::path(out) / (safe_file_name(n) + ".npy")).string(), {}});
    files.declare(r.back().path, "output '" + n + "'");
  }
  auto outs = exec.run(feeds);
  for (size_t i = 0; i < outs.size(); ++i) {
    files.write(r[i].path, npy_bytes(outs[i]));
    r[i].shape = outs[i].sizes().vec();
  }
  files.commit();
  return r;
}

void ConvertRequest::validate() const {
  if (sparse_initializers && dense)
    throw UsageError("[convert] " + opt("sparse_initializers") + " does not go with " +
                     opt("dense") + ": one storage for the initializers");
}

ConvertResult ConvertRequest::run() const {
  validate();
  // What it reads (the model and its external data), then what it writes: an output that is
  // an input — another name for the model, or the data file the model reads — is refused.
  OutputFiles files("convert");
  files.input(model);
  files.declare(out, opt("out"));
  if (external_data) files.declare(out + ".data", opt("external_data") + " (" + out + ".data)");
  ir::Model m = load_input_model(files, model, warn);
  onnx::SaveOptions so;
  so.sparse = sparse_initializers
                  ? onnx::SaveOptions::Sparse::kAll
                  : (dense ? onnx::SaveOptions::Sparse::kNone : onnx::SaveOptions::Sparse::kKeep);
  so.external_data = external_data;
  onnx::save_model(m, out, so, files);
  ConvertResult r;
  r.written_bytes = staged_model_bytes(files, out);
  files.commit();
  r.model_bytes = model_file_bytes(model, m);
  return r;
}

}  // namespace lopper
