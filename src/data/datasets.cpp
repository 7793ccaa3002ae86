// Datasets held in memory as tensors (IDX, CIFAR-10 binary, NPY) and open_dataset().
#include <ATen/ATen.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iomanip>
#include <sstream>

#include "data/images.h"
#include "lopper/data.h"
#include "lopper/error.h"
#include "util/files.h"
#include "util/npy.h"

namespace lopper {
namespace fs = std::filesystem;

namespace data {
std::string no_such(const std::string& spec, const std::string& path) {
  return detail::concat("[data] ", spec, ": '", path, "': no such file or directory");
}
}  // namespace data

namespace {

constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";

// Samples x [N, ...] of any numeric dtype and labels y int64 [N], in memory. uint8 samples are
// pixels: get() scales them to [0, 1]; any other dtype is only converted to float32.
class TensorDataset : public Dataset {
 public:
  TensorDataset(std::string name, at::Tensor x, at::Tensor y)
      : name_(std::move(name)), x_(std::move(x)), y_(std::move(y)) {
    num_classes_ = y_.max().item<int64_t>() + 1;
  }
  int64_t size() const override { return x_.size(0); }
  std::vector<int64_t> sample_shape() const override { return x_.sizes().slice(1).vec(); }
  int64_t num_classes() const override { return num_classes_; }
  std::string name() const override { return name_; }

  void get(const std::vector<int64_t>& indices, at::Tensor& x, at::Tensor& y) const override {
    for (int64_t i : indices)
      LOPPER_CHECK(i >= 0 && i < size(), "[data] ", name_, ": sample ", i, " is out of range [0, ",
                   size(), ")");
    // NOTE: plain loops, no ATen kernels: this runs on the loader thread, and an ATen kernel there
    // starts an OpenMP team of its own; with more OpenMP threads than cores libgomp stops spinning
    // and the training threads sleep and wake at every step.
    if ((x_.scalar_type() == at::kByte || x_.scalar_type() == at::kFloat) &&
        y_.scalar_type() == at::kLong && x_.is_contiguous() && y_.is_contiguous()) {
      int64_t per = x_.numel() / std::max<int64_t>(1, size()), n = int64_t(indices.size());
      std::vector<int64_t> shape = x_.sizes().vec();
      shape[0] = n;
      x = at::empty(shape, at::kFloat);
      y = at::empty({n}, at::kLong);
      float* xo = x.data_ptr<float>();
      int64_t* yo = y.data_ptr<int64_t>();
      const int64_t* yi = y_.const_data_ptr<int64_t>();
      for (int64_t b = 0; b < n; ++b) {
        int64_t i = indices[b];
        yo[b] = yi[i];
        float* dst = xo + b * per;
        if (x_.scalar_type() == at::kByte) {
          // NOTE: divide by 255 (not multiply by 1/255): bit for bit what ToTensor() gives.
          const uint8_t* src = x_.const_data_ptr<uint8_t>() + i * per;
          for (int64_t k = 0; k < per; ++k) dst[k] = float(src[k]) / 255.0f;
        } else {
          std::memcpy(dst, x_.const_data_ptr<float>() + i * per, size_t(per) * sizeof(float));
        }
      }
      return;
    }
    at::Tensor idx = at::tensor(at::IntArrayRef(indices), at::kLong);
    x = x_.index_select(0, idx).to(at::kFloat);
    if (x_.scalar_type() == at::kByte) x.div_(255);
    y = y_.index_select(0, idx);
  }

 private:
  std::string name_;
  at::Tensor x_, y_;
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

std::shared_ptr<Dataset> open_npy(const std::string& spec, const std::string& files) {
  size_t comma = files.find(',');
  LOPPER_CHECK(comma != std::string::npos && comma > 0 && comma + 1 < files.size() &&
                   files.find(',', comma + 1) == std::string::npos,
               "[data] '", spec, "': expected npy:X.npy,Y.npy (samples, labels)");
  std::string xp = files.substr(0, comma), yp = files.substr(comma + 1);
  auto load = [&](const std::string& p) {
    std::error_code ec;
    LOPPER_CHECK(fs::exists(p, ec), data::no_such(spec, p));
    try {
      return load_npy(p);
    } catch (const Error& e) {
      throw Error(detail::concat("[data] ", spec, ": ", e.what()));
    }
  };
  at::Tensor x = load(xp), y = load(yp);
  auto numeric = [](at::ScalarType t) {
    return at::isFloatingType(t) || at::isIntegralType(t, /*includeBool=*/false);
  };
  LOPPER_CHECK(numeric(x.scalar_type()), "[data] ", spec, ": '", xp, "' holds ",
               c10::toString(x.scalar_type()), ", not numbers");
  LOPPER_CHECK(x.dim() >= 2, "[data] ", spec, ": '", xp, "' has shape ", x.sizes(),
               "; samples must be [N, ...]");
  LOPPER_CHECK(at::isIntegralType(y.scalar_type(), /*includeBool=*/false) && y.dim() == 1,
               "[data] ", spec, ": labels '", yp, "' must be integers [N], got ",
               c10::toString(y.scalar_type()), " ", y.sizes());
  LOPPER_CHECK(x.size(0) == y.size(0), "[data] ", spec, ": '", xp, "' has ", x.size(0),
               " samples, but '", yp, "' has ", y.size(0), " labels");
  LOPPER_CHECK(x.size(0) > 0, "[data] ", spec, ": '", xp, "' holds no samples");
  y = y.to(at::kLong);
  if ((y < 0).any().item<bool>()) {
    int64_t i = (y < 0).nonzero()[0][0].item<int64_t>();
    throw Error(detail::concat("[data] ", spec, ": '", yp, "': label ", y[i].item<int64_t>(),
                               " at index ", i, " is negative"));
  }
  return std::make_shared<TensorDataset>(spec, x, y);
}

}  // namespace

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
  bool known = kind == "idx" || kind == "cifar10" || kind == "folder" || kind == "npy";
  LOPPER_CHECK(known && colon != std::string::npos, "[data] unknown dataset '", spec,
               "': expected fashion-mnist, idx:DIR, cifar10:DIR, folder:DIR or npy:X.npy,Y.npy");
  LOPPER_CHECK(
      !rest.empty(), "[data] '", spec, "' names no ",
      kind == "npy" ? "files: expected npy:X.npy,Y.npy" : "folder: expected " + kind + ":DIR");
  if (kind == "idx") return open_idx(spec, rest, split);
  if (kind == "cifar10") return open_cifar10(spec, rest, split);
  if (kind == "folder") return data::open_folder(spec, rest, split);
  return open_npy(spec, rest);
}

}  // namespace lopper
