// Datasets held in memory as tensors (IDX, CIFAR-10 binary, NPY) and open_dataset().
#include <ATen/ATen.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <iomanip>
#include <optional>
#include <set>
#include <sstream>

#include "data/images.h"
#include "lopper/data.h"
#include "lopper/error.h"
#include "lopper/files.h"
#include "lopper/npy.h"

namespace lopper {
namespace fs = std::filesystem;

namespace data {
std::string no_such(const std::string& spec, const std::string& path) {
  return detail::concat("[data] ", spec, ": '", path, "': no such file or directory");
}
}  // namespace data

namespace {

constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";

// Rows `indices` of a contiguous tensor [N, ...], copied with memcpy.
// NOTE: plain loops, no ATen kernels: this runs on the loader thread, and an ATen kernel there
// starts an OpenMP team of its own; with more OpenMP threads than cores libgomp stops spinning
// and the training threads sleep and wake at every step.
at::Tensor gather_rows(const at::Tensor& t, const std::vector<int64_t>& indices) {
  std::vector<int64_t> shape = t.sizes().vec();
  shape[0] = int64_t(indices.size());
  at::Tensor out = at::empty(shape, t.options());
  const size_t row = size_t(t.numel() / std::max<int64_t>(1, t.size(0))) * t.element_size();
  const char* src = static_cast<const char*>(t.const_data_ptr());
  char* dst = static_cast<char*>(out.data_ptr());
  for (size_t b = 0; b < indices.size(); ++b)
    std::memcpy(dst + b * row, src + size_t(indices[b]) * row, row);
  return out;
}

// Samples x [N, ...], labels y int64 [N] or [N, T] (or none), and further named inputs [N, ...],
// in memory. uint8 samples are pixels: get() scales them to [0, 1]; integer samples (token IDs)
// stay int64; any other dtype is converted to float32 when loaded.
class TensorDataset : public Dataset {
 public:
  TensorDataset(std::string name, at::Tensor x, at::Tensor y, NamedInputs inputs = {},
                std::string x_input = "", bool integer = false)
      : name_(std::move(name)),
        x_(std::move(x)),
        y_(std::move(y)),
        inputs_(std::move(inputs)),
        x_input_(std::move(x_input)),
        integer_(integer) {
    if (integer_)
      x_ = x_.to(at::kLong);
    else if (x_.scalar_type() != at::kByte)
      x_ = x_.to(at::kFloat);
    x_ = x_.contiguous();
    if (y_.defined()) y_ = y_.to(at::kLong).contiguous();
    for (auto& [name, t] : inputs_) t = t.contiguous();
    num_classes_ = y_.defined() && y_.numel() ? y_.max().item<int64_t>() + 1 : 0;
  }
  int64_t size() const override { return x_.size(0); }
  std::vector<int64_t> sample_shape() const override { return x_.sizes().slice(1).vec(); }
  int64_t num_classes() const override { return num_classes_; }
  std::string name() const override { return name_; }
  std::string sample_input() const override { return x_input_; }
  bool integer_samples() const override { return integer_; }
  bool has_labels() const override { return y_.defined(); }

  void get(const std::vector<int64_t>& indices, at::Tensor& x, at::Tensor& y) const override {
    for (int64_t i : indices)
      LOPPER_CHECK(i >= 0 && i < size(), "[data] ", name_, ": sample ", i, " is out of range [0, ",
                   size(), ")");
    y = y_.defined() ? gather_rows(y_, indices) : at::Tensor();
    if (x_.scalar_type() != at::kByte) {
      x = gather_rows(x_, indices);
      return;
    }
    int64_t per = x_.numel() / std::max<int64_t>(1, size()), n = int64_t(indices.size());
    std::vector<int64_t> shape = x_.sizes().vec();
    shape[0] = n;
    x = at::empty(shape, at::kFloat);
    float* xo = x.data_ptr<float>();
    for (int64_t b = 0; b < n; ++b) {
      // NOTE: divide by 255 (not multiply by 1/255): bit for bit what ToTensor() gives.
      const uint8_t* src = x_.const_data_ptr<uint8_t>() + indices[b] * per;
      float* dst = xo + b * per;
      for (int64_t k = 0; k < per; ++k) dst[k] = float(src[k]) / 255.0f;
    }
  }

  NamedInputs get_inputs(const std::vector<int64_t>& indices) const override {
    NamedInputs out;
    for (const auto& [name, t] : inputs_) out.emplace_back(name, gather_rows(t, indices));
    return out;
  }

 private:
  std::string name_;
  at::Tensor x_, y_;
  NamedInputs inputs_;
  std::string x_input_;
  bool integer_ = false;
  int64_t num_classes_ = 0;
};

void check_dir(const std::string& spec, const std::string& dir) {
  std::error_code ec;
  LOPPER_CHECK(fs::exists(dir, ec), data::no_such(spec, dir));
  LOPPER_CHECK(fs::is_directory(dir, ec), "[data] ", spec, ": '", dir, "' is not a folder");
}

std::string hex32(uint32_t v) {
  std::ostringstream os;
  os << "0x" << std::hex << std::setw(8) << std::setfill('0') << v;
  return os.str();
}

uint32_t big_endian32(const std::string& b, size_t off) {
  auto u = [&](size_t i) { return uint32_t(static_cast<unsigned char>(b[off + i])); };
  return u(0) << 24 | u(1) << 16 | u(2) << 8 | u(3);
}

// A whole file, gunzipped when it is gzip: zlib's gzread passes a plain file through unchanged.
std::string read_maybe_gz(const std::string& spec, const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  LOPPER_CHECK(f, "[data] ", spec, ": cannot open '", path, "': ", std::strerror(errno));
  gzbuffer(f, 1 << 20);
  std::string out;
  std::vector<char> chunk(1 << 20);
  int n;
  while ((n = gzread(f, chunk.data(), static_cast<unsigned>(chunk.size()))) > 0)
    out.append(chunk.data(), n);
  int err = Z_OK;
  std::string msg = gzerror(f, &err);
  // gzclose reports Z_BUF_ERROR when the file ended in the middle of a gzip stream.
  int closed = gzclose(f);
  if (msg.rfind(path + ": ", 0) == 0) msg.erase(0, path.size() + 2);  // zlib names the file too
  LOPPER_CHECK(n == 0 && (err == Z_OK || err == Z_BUF_ERROR) && closed == Z_OK, "[data] ", spec,
               ": '", path, "' is corrupt or truncated (zlib: ",
               err != Z_OK ? msg : std::string("unexpected end of file"), ")");
  return out;
}

// An IDX file: images (magic 0x803, [N, H, W] uint8) as [N, 1, H, W], or labels (0x801, [N]).
at::Tensor parse_idx(const std::string& spec, const std::string& path, const std::string& bytes,
                     bool images) {
  const uint32_t magic = images ? 0x00000803 : 0x00000801;
  const size_t ndims = images ? 3 : 1, header = 4 + 4 * ndims;
  const char* what = images ? "IDX image file (idx3-ubyte)" : "IDX label file (idx1-ubyte)";
  uint32_t m = bytes.size() >= 4 ? big_endian32(bytes, 0) : 0;
  LOPPER_CHECK(bytes.size() < 4 || m == magic, "[data] ", spec, ": '", path, "' is not an ", what,
               ": magic number ", hex32(m), ", expected ", hex32(magic));
  LOPPER_CHECK(bytes.size() >= header, "[data] ", spec, ": '", path, "' is too short (",
               bytes.size(), " bytes) for an ", what);
  std::vector<int64_t> dims;
  unsigned __int128 need = 1;  // 128 bits: three 32-bit dims cannot overflow it
  for (size_t i = 0; i < ndims; ++i) {
    dims.push_back(big_endian32(bytes, 4 + 4 * i));
    need *= uint64_t(dims.back());
  }
  std::ostringstream dims_s;
  for (size_t i = 0; i < ndims; ++i) dims_s << (i ? "x" : "") << dims[i];
  size_t have = bytes.size() - header;
  LOPPER_CHECK(need == have, "[data] ", spec, ": '", path, "' ",
               need > have ? "is truncated" : "has trailing bytes", ": its header (", dims_s.str(),
               ") needs ", uint64_t(std::min<unsigned __int128>(need, UINT64_MAX)),
               " data bytes, the file has ", have);
  LOPPER_CHECK(!images || (dims[1] > 0 && dims[2] > 0), "[data] ", spec, ": '", path,
               "' has images of size ", dims[1], "x", dims[2]);
  if (images) dims.insert(dims.begin() + 1, 1);
  at::Tensor t = at::empty(dims, at::kByte);
  if (have) std::memcpy(t.data_ptr(), bytes.data() + header, have);
  return t;
}

std::shared_ptr<Dataset> open_idx(const std::string& spec, const std::string& dir,
                                  const std::string& split) {
  check_dir(spec, dir);
  std::string prefix = split == "train" ? "train" : "t10k";
  auto find = [&](const std::string& stem) {
    std::string p = (fs::path(dir) / stem).string();
    std::error_code ec;
    if (fs::is_regular_file(p, ec)) return p;
    if (fs::is_regular_file(p + ".gz", ec)) return p + ".gz";
    throw Error(data::no_such(spec, p + "[.gz]"));
  };
  std::string images = find(prefix + "-images-idx3-ubyte");
  std::string labels = find(prefix + "-labels-idx1-ubyte");
  at::Tensor x = parse_idx(spec, images, read_maybe_gz(spec, images), true);
  at::Tensor y = parse_idx(spec, labels, read_maybe_gz(spec, labels), false);
  LOPPER_CHECK(x.size(0) == y.size(0), "[data] ", spec, ": '", images, "' has ", x.size(0),
               " images, but '", labels, "' has ", y.size(0), " labels");
  LOPPER_CHECK(x.size(0) > 0, "[data] ", spec, ": '", images, "' holds no images");
  return std::make_shared<TensorDataset>(spec + " (" + split + ")", x, y.to(at::kLong));
}

std::shared_ptr<Dataset> open_cifar10(const std::string& spec, std::string dir,
                                      const std::string& split) {
  constexpr int64_t kRecord = 1 + 3 * 32 * 32;
  check_dir(spec, dir);
  // The official archive unpacks to cifar-10-batches-bin/; accept its parent too.
  std::error_code ec;
  if (fs::is_directory(fs::path(dir) / "cifar-10-batches-bin", ec))
    dir = (fs::path(dir) / "cifar-10-batches-bin").string();
  std::vector<std::string> files;
  if (split == "train")
    for (int i = 1; i <= 5; ++i) files.push_back("data_batch_" + std::to_string(i) + ".bin");
  else
    files.push_back("test_batch.bin");
  std::vector<at::Tensor> parts;
  for (const std::string& f : files) {
    std::string path = (fs::path(dir) / f).string();
    LOPPER_CHECK(fs::is_regular_file(path, ec), data::no_such(spec, path));
    std::string bytes = read_file(path);
    LOPPER_CHECK(!bytes.empty() && bytes.size() % kRecord == 0, "[data] ", spec, ": '", path,
                 "' has ", bytes.size(), " bytes, not a whole number of ", kRecord,
                 "-byte CIFAR-10 records");
    at::Tensor t = at::empty({int64_t(bytes.size()) / kRecord, kRecord}, at::kByte);
    std::memcpy(t.data_ptr(), bytes.data(), bytes.size());
    at::Tensor labels = t.select(1, 0);
    if ((labels >= 10).any().item<bool>()) {
      int64_t r = (labels >= 10).nonzero()[0][0].item<int64_t>();
      throw Error(detail::concat("[data] ", spec, ": '", path, "': record ", r, " has label ",
                                 labels[r].item<int64_t>(), "; CIFAR-10 labels are 0-9"));
    }
    parts.push_back(t);
  }
  at::Tensor all = parts.size() == 1 ? parts[0] : at::cat(parts);
  at::Tensor y = all.select(1, 0).to(at::kLong);
  // Each record's image is 1024 red, 1024 green, 1024 blue bytes, rows in order: CHW already.
  at::Tensor x = all.slice(1, 1).reshape({-1, 3, 32, 32}).contiguous();
  return std::make_shared<TensorDataset>(spec + " (" + split + ")", x, y);
}

at::Tensor load_data_npy(const std::string& spec, const std::string& p) {
  std::error_code ec;
  LOPPER_CHECK(!p.empty(), "[data] '", spec, "': an entry names no file");
  LOPPER_CHECK(fs::exists(p, ec), data::no_such(spec, p));
  at::Tensor t;
  try {
    t = load_npy(p);
  } catch (const Error& e) {
    throw Error(detail::concat("[data] ", spec, ": ", e.what()));
  }
  const at::ScalarType st = t.scalar_type();
  LOPPER_CHECK(at::isFloatingType(st) || at::isIntegralType(st, /*includeBool=*/true), "[data] ",
               spec, ": '", p, "' holds ", c10::toString(st), ", not numbers");
  LOPPER_CHECK(t.dim() >= 1, "[data] ", spec, ": '", p, "' is a scalar; data must be [N, ...]");
  return t;
}

bool is_integer(const at::Tensor& t) {
  return at::isIntegralType(t.scalar_type(), /*includeBool=*/true);
}

// Labels [N] (classes: >= 0) or [N, T] (per token: >= 0, or -100 for "not counted").
at::Tensor check_labels(const std::string& spec, const std::string& path, at::Tensor y,
                        const std::string& samples, int64_t n, int64_t tokens) {
  LOPPER_CHECK(is_integer(y) && (y.dim() == 1 || y.dim() == 2), "[data] ", spec, ": labels '", path,
               "' must be integers [N] or [N, T], got ", c10::toString(y.scalar_type()), " ",
               y.sizes());
  LOPPER_CHECK(y.size(0) == n, "[data] ", spec, ": '", samples, "' has ", n, " samples, but '",
               path, "' has ", y.size(0), " labels");
  LOPPER_CHECK(y.dim() == 1 || tokens < 0 || y.size(1) == tokens, "[data] ", spec, ": labels '",
               path, "' are ", y.sizes(), ", but the sequences have ", tokens, " tokens");
  y = y.to(at::kLong);
  at::Tensor bad = y.dim() == 1 ? y < 0 : (y < 0).logical_and(y != -100);
  if (bad.any().item<bool>()) {
    at::Tensor at_ = bad.nonzero()[0];
    int64_t i = at_[0].item<int64_t>();
    throw Error(detail::concat("[data] ", spec, ": '", path, "': label ",
                               y.dim() == 1 ? y[i].item<int64_t>() : y[i][at_[1]].item<int64_t>(),
                               " at index ", i, " is negative",
                               y.dim() == 2 ? " (only -100, not counted, may be)" : ""));
  }
  return y;
}

// NAME=VALUE entries after a spec's kind (npy:, tokens:), in order; a bare entry has no name.
std::vector<std::pair<std::string, std::string>> entries(const std::string& rest) {
  std::vector<std::pair<std::string, std::string>> out;
  size_t start = 0;
  for (;;) {
    size_t comma = rest.find(',', start);
    std::string e = rest.substr(start, comma - start);
    size_t eq = e.find('=');
    if (eq == std::string::npos)
      out.emplace_back("", e);
    else
      out.emplace_back(e.substr(0, eq), e.substr(eq + 1));
    if (comma == std::string::npos) return out;
    start = comma + 1;
  }
}

std::shared_ptr<Dataset> open_npy(const std::string& spec, const std::string& files) {
  auto parts = entries(files);
  const bool named =
      std::any_of(parts.begin(), parts.end(), [](auto& e) { return !e.first.empty(); });
  if (!named) {
    LOPPER_CHECK(
        parts.size() == 2 && !parts[0].second.empty() && !parts[1].second.empty(), "[data] '", spec,
        "': expected npy:X.npy,Y.npy (samples, labels) or npy:NAME=F.npy,...,labels=Y.npy");
    const std::string &xp = parts[0].second, &yp = parts[1].second;
    at::Tensor x = load_data_npy(spec, xp), y = load_data_npy(spec, yp);
    LOPPER_CHECK(x.dim() >= 2, "[data] ", spec, ": '", xp, "' has shape ", x.sizes(),
                 "; samples must be [N, ...]");
    LOPPER_CHECK(x.size(0) > 0, "[data] ", spec, ": '", xp, "' holds no samples");
    LOPPER_CHECK(is_integer(y) && y.dim() == 1, "[data] ", spec, ": labels '", yp,
                 "' must be integers [N], got ", c10::toString(y.scalar_type()), " ", y.sizes());
    y = check_labels(spec, yp, y, xp, x.size(0), -1);
    const bool integer = is_integer(x) && x.scalar_type() != at::kByte;
    return std::make_shared<TensorDataset>(spec, x, y, NamedInputs{}, "", integer);
  }
  // Named: one file per model input, and labels.
  NamedInputs inputs;
  at::Tensor y;
  std::string y_path, first_path;
  std::set<std::string> seen;
  for (const auto& [name, path] : parts) {
    LOPPER_CHECK(!name.empty(), "[data] '", spec, "': '", path,
                 "' has no name: give every file as NAME=F.npy (a model input's name, or labels)");
    LOPPER_CHECK(seen.insert(name).second, "[data] '", spec, "': '", name, "' is given twice");
    at::Tensor t = load_data_npy(spec, path);
    if (name == "labels") {
      y = t, y_path = path;
      continue;
    }
    LOPPER_CHECK(inputs.empty() || t.size(0) == inputs[0].second.size(0), "[data] ", spec, ": '",
                 path, "' has ", t.size(0), " samples, but '", first_path, "' has ",
                 inputs[0].second.size(0));
    if (inputs.empty()) first_path = path;
    inputs.emplace_back(name, t);
  }
  LOPPER_CHECK(!inputs.empty(), "[data] '", spec, "' names no model input, only labels");
  const int64_t n = inputs[0].second.size(0);
  LOPPER_CHECK(n > 0, "[data] ", spec, ": '", first_path, "' holds no samples");
  if (y.defined())
    y = check_labels(spec, y_path, y, first_path, n,
                     inputs[0].second.dim() >= 2 ? inputs[0].second.size(1) : -1);
  // The first input is the samples (what fits a model input's shape); the rest go by name.
  auto [x_name, x] = inputs[0];
  inputs.erase(inputs.begin());
  for (auto& [name, t] : inputs)
    if (is_integer(t)) t = t.to(at::kLong);
  const bool integer = is_integer(x) && x.scalar_type() != at::kByte;
  return std::make_shared<TensorDataset>(spec, x, y, std::move(inputs), x_name, integer);
}

std::shared_ptr<Dataset> open_tokens(const std::string& spec, const std::string& rest) {
  auto parts = entries(rest);
  LOPPER_CHECK(parts[0].first.empty() && !parts[0].second.empty(), "[data] '", spec,
               "': expected tokens:IDS.npy[,labels=Y.npy][,mask=M.npy][,pad=ID][,input=NAME]"
               "[,NAME=F.npy]");
  const std::string ids_path = parts[0].second;
  at::Tensor ids = load_data_npy(spec, ids_path);
  LOPPER_CHECK(is_integer(ids) && ids.scalar_type() != at::kBool && ids.dim() == 2, "[data] ", spec,
               ": token IDs '", ids_path, "' must be integers [N, T], got ",
               c10::toString(ids.scalar_type()), " ", ids.sizes());
  const int64_t n = ids.size(0), t = ids.size(1);
  LOPPER_CHECK(n > 0 && t > 0, "[data] ", spec, ": '", ids_path, "' holds no tokens (", ids.sizes(),
               ")");
  ids = ids.to(at::kLong);
  if ((ids < 0).any().item<bool>())
    throw Error(detail::concat("[data] ", spec, ": '", ids_path, "': token ID ",
                               ids.min().item<int64_t>(), " is negative"));
  at::Tensor y, mask;
  std::string x_input = "input_ids";
  bool input_given = false;
  std::optional<int64_t> pad;
  NamedInputs inputs;
  std::set<std::string> seen;
  for (size_t i = 1; i < parts.size(); ++i) {
    const auto& [key, value] = parts[i];
    LOPPER_CHECK(!key.empty(), "[data] '", spec, "': '", value,
                 "' has no name (labels=, mask=, pad=, input= or a model input's NAME=)");
    LOPPER_CHECK(seen.insert(key).second, "[data] '", spec, "': '", key, "' is given twice");
    if (key == "labels") {
      y = check_labels(spec, value, load_data_npy(spec, value), ids_path, n, t);
    } else if (key == "pad") {
      int64_t v = 0;
      auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
      LOPPER_CHECK(ec == std::errc() && end == value.data() + value.size() && v >= 0, "[data] '",
                   spec, "': pad must be a token ID (an integer >= 0), got '", value, "'");
      pad = v;
    } else if (key == "input") {
      LOPPER_CHECK(!value.empty(), "[data] '", spec, "': input= names no model input");
      x_input = value, input_given = true;
    } else {
      at::Tensor v = load_data_npy(spec, value);
      LOPPER_CHECK(v.size(0) == n && (v.dim() < 2 || v.size(1) == t), "[data] ", spec, ": '", value,
                   "' is ", v.sizes(), ", but the token IDs are ", ids.sizes());
      if (is_integer(v)) v = v.to(at::kLong);
      if (key == "mask") {
        LOPPER_CHECK(v.dim() == 2 && is_integer(v), "[data] ", spec, ": the mask '", value,
                     "' must be integers [N, T] (1: a token, 0: padding), got ",
                     c10::toString(v.scalar_type()), " ", v.sizes());
        mask = v;
      } else {
        inputs.emplace_back(key, v);
      }
    }
  }
  LOPPER_CHECK(!(mask.defined() && pad), "[data] '", spec,
               "' gives both mask= and pad=: the mask comes from one of them");
  if (pad) mask = ids.ne(*pad).to(at::kLong);
  if (mask.defined()) inputs.emplace(inputs.begin(), "attention_mask", mask);
  // NOTE: without input=, the IDs go to input_ids when the model has it, else to its first
  // input: sample_input() is "" then, and the feeding code picks input_ids first.
  if (!input_given) x_input.clear();
  return std::make_shared<TensorDataset>(spec, ids, y, std::move(inputs), x_input, true);
}

}  // namespace

NamedInputs Dataset::get_inputs(const std::vector<int64_t>&) const { return {}; }

void Dataset::get_resized(const std::vector<int64_t>& indices, int64_t h, int64_t w, at::Tensor& x,
                          at::Tensor& y) const {
  get(indices, x, y);
  LOPPER_CHECK(x.dim() == 4, "[data] ", name(), ": resize needs image samples [C, H, W], got ",
               at::IntArrayRef(sample_shape()));
  x = data::resize_images(x, h, w);
}

std::shared_ptr<Dataset> open_dataset(const std::string& spec, const std::string& split) {
  LOPPER_CHECK(split == "train" || split == "test", "[data] split must be 'train' or 'test', got '",
               split, "'");
  if (spec == "fashion-mnist") {
    std::error_code ec;
    LOPPER_CHECK(fs::is_directory(kFashionMnistDir, ec), data::no_such(spec, kFashionMnistDir),
                 " (Debian's dataset-fashion-mnist package)");
    return open_idx(spec, kFashionMnistDir, split);
  }
  size_t colon = spec.find(':');
  std::string kind = spec.substr(0, colon);
  std::string rest = colon == std::string::npos ? "" : spec.substr(colon + 1);
  bool known =
      kind == "idx" || kind == "cifar10" || kind == "folder" || kind == "npy" || kind == "tokens";
  LOPPER_CHECK(known && colon != std::string::npos, "[data] unknown dataset '", spec,
               "': expected fashion-mnist, idx:DIR, cifar10:DIR, folder:DIR, npy:X.npy,Y.npy or "
               "tokens:IDS.npy");
  LOPPER_CHECK(!rest.empty(), "[data] '", spec, "' names no ",
               kind == "npy"      ? "files: expected npy:X.npy,Y.npy"
               : kind == "tokens" ? "file: expected tokens:IDS.npy"
                                  : "folder: expected " + kind + ":DIR");
  if (kind == "idx") return open_idx(spec, rest, split);
  if (kind == "cifar10") return open_cifar10(spec, rest, split);
  if (kind == "folder") return data::open_folder(spec, rest, split);
  if (kind == "tokens") return open_tokens(spec, rest);
  return open_npy(spec, rest);
}

}  // namespace lopper
