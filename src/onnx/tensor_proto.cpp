#include "onnx/tensor_proto.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <utility>
#include <vector>

#include "lopper/error.h"
#include "lopper/files.h"
#include "lopper/onnx_io.h"

namespace lopper::onnx {
namespace fs = std::filesystem;
using ir::DType;

namespace {

// ONNX's element types and ATen's, one to one.
constexpr std::pair<DType, c10::ScalarType> kScalarTypes[] = {
    {DType::kFloat, at::kFloat},
    {DType::kUInt8, at::kByte},
    {DType::kInt8, at::kChar},
    {DType::kUInt16, at::kUInt16},
    {DType::kInt16, at::kShort},
    {DType::kInt32, at::kInt},
    {DType::kInt64, at::kLong},
    {DType::kBool, at::kBool},
    {DType::kFloat16, at::kHalf},
    {DType::kDouble, at::kDouble},
    {DType::kUInt32, at::kUInt32},
    {DType::kUInt64, at::kUInt64},
    {DType::kComplex64, at::kComplexFloat},
    {DType::kComplex128, at::kComplexDouble},
    {DType::kBFloat16, at::kBFloat16},
    {DType::kFloat8E4M3FN, at::kFloat8_e4m3fn},
    {DType::kFloat8E4M3FNUZ, at::kFloat8_e4m3fnuz},
    {DType::kFloat8E5M2, at::kFloat8_e5m2},
    {DType::kFloat8E5M2FNUZ, at::kFloat8_e5m2fnuz},
};

}  // namespace

c10::ScalarType to_scalar_type(DType t) {
  for (const auto& [d, s] : kScalarTypes)
    if (d == t) return s;
  throw Error(detail::concat("[onnx] tensors of type ", ir::dtype_name(t), " (",
                             static_cast<int>(t), ") are not supported"));
}

DType to_dtype(c10::ScalarType t) {
  for (const auto& [d, s] : kScalarTypes)
    if (s == t) return d;
  throw Error(detail::concat("[onnx] ATen type ", c10::toString(t), " has no ONNX type"));
}

namespace {

// Largest tensor we accept: well past any real model, small enough that sizes never overflow.
constexpr int64_t kMaxElements = int64_t(1) << 40;

std::vector<int64_t> checked_dims(const google::protobuf::RepeatedField<int64_t>& dims,
                                  const std::string& what, int64_t* numel) {
  std::vector<int64_t> out(dims.begin(), dims.end());
  int64_t n = 1;
  for (int64_t d : out) {
    LOPPER_CHECK(d >= 0, "[import] ", what, ": negative dimension ", d);
    LOPPER_CHECK(d == 0 || n <= kMaxElements / d, "[import] ", what, ": too many elements");
    n *= d;
  }
  *numel = n;
  return out;
}

// Resolves an external-data location inside base_dir, refusing anything that escapes it.
std::string resolve_external(const std::string& base_dir, const std::string& location,
                             const std::string& what) {
  LOPPER_CHECK(!base_dir.empty(), "[import] ", what,
               ": external data is not allowed for a model read from memory");
  LOPPER_CHECK(!location.empty(), "[import] ", what, ": external data without a location");
  LOPPER_CHECK(location.find('\0') == std::string::npos, "[import] ", what,
               ": external data location contains a NUL byte");
  LOPPER_CHECK(
      location[0] != '/' && location[0] != '\\' && !(location.size() > 1 && location[1] == ':'),
      "[import] ", what, ": external data location '", location,
      "' is an absolute path (refused: data must stay inside the model's folder)");
  size_t start = 0;
  while (start <= location.size()) {
    size_t end = location.find_first_of("/\\", start);
    if (end == std::string::npos) end = location.size();
    LOPPER_CHECK(location.compare(start, end - start, "..") != 0, "[import] ", what,
                 ": external data location '", location, "' leaves the model's folder (refused)");
    start = end + 1;
  }
  std::error_code ec;
  fs::path base = fs::weakly_canonical(fs::path(base_dir), ec);
  LOPPER_CHECK(!ec, "[import] ", what, ": cannot resolve model folder '", base_dir, "'");
  fs::path full = fs::weakly_canonical(base / location, ec);
  LOPPER_CHECK(!ec, "[import] ", what, ": cannot resolve external data '", location, "'");
  auto b = base.string(), f = full.string();
  if (b.empty() || b.back() != '/') b += '/';
  LOPPER_CHECK(f.compare(0, b.size(), b) == 0, "[import] ", what, ": external data '", location,
               "' resolves outside the model's folder (refused)");
  return f;
}

// Reads the tensor's bytes from its external file. Everything is checked (location, length, the
// file's size) before the tensor is allocated, so a small model cannot make us allocate a huge one.
at::Tensor read_external(const lopper_onnx::TensorProto& p, const ExternalDataContext& ctx,
                         const std::string& what, const std::vector<int64_t>& dims,
                         at::ScalarType type, size_t nbytes) {
  std::string location;
  int64_t offset = 0, length = -1;
  for (const auto& kv : p.external_data()) {
    const std::string& k = kv.key();
    auto parse_int = [&](const std::string& v) {
      LOPPER_CHECK(v.empty() || v[0] != '-', "[import] ", what, ": external data ", k, " '", v,
                   "' is negative");
      LOPPER_CHECK(
          !v.empty() && v.find_first_not_of("0123456789") == std::string::npos && v.size() < 19,
          "[import] ", what, ": external data ", k, " '", v, "' is not a number");
      return static_cast<int64_t>(std::stoll(v));
    };
    if (k == "location")
      location = kv.value();
    else if (k == "offset")
      offset = parse_int(kv.value());
    else if (k == "length")
      length = parse_int(kv.value());
  }
  std::string path = resolve_external(ctx.base_dir, location, what);
  if (length >= 0)
    LOPPER_CHECK(static_cast<size_t>(length) == nbytes, "[import] ", what,
                 ": external data length ", length, " does not match its shape and type (", nbytes,
                 " bytes)");
  // Never blocks: a FIFO or a device is refused before anything is read from it.
  int fd = open_regular_file(path, "[import] " + what + ": external data");
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    throw Error(detail::concat("[import] ", what, ": cannot read external data '", location, "'"));
  }
  if (ctx.files) ctx.files->insert(path);
  if (static_cast<uint64_t>(offset) > static_cast<uint64_t>(st.st_size) ||
      nbytes > static_cast<uint64_t>(st.st_size) - static_cast<uint64_t>(offset)) {
    ::close(fd);
    throw Error(detail::concat("[import] ", what, ": external data '", location, "' has ",
                               st.st_size, " bytes, but the tensor needs ", nbytes,
                               " bytes at offset ", offset));
  }
  if (nbytes > 0) {
    auto& taken = ctx.ranges[path];
    const uint64_t begin = uint64_t(offset), end = begin + nbytes;
    auto next = taken.lower_bound(begin);
    const bool again = next != taken.end() && next->first == begin && next->second.first == end &&
                       next->second.second == what;  // re-read
    const std::string* other = nullptr;
    if (!again && next != taken.end() && next->first < end) other = &next->second.second;
    if (!other && next != taken.begin() && std::prev(next)->second.first > begin)
      other = &std::prev(next)->second.second;
    if (other) {
      ::close(fd);
      throw Error(detail::concat("[import] ", what, ": its external data (bytes ", begin, " to ",
                                 end, " of '", location, "') overlaps that of ", *other,
                                 " (refused: each tensor needs bytes of its own)"));
    }
    if (!again) taken.emplace(begin, std::make_pair(end, what));
  }
  // NOTE: one file is mapped; the tensors of another (a model split over several files) are read
  // into memory as usual.
  if (ctx.copy_to && (!ctx.mapped || path == ctx.mapped_source)) {
    if (!ctx.mapped) {
      ::close(fd);
      const std::string to = ctx.copy_to();
      std::error_code ec;
      std::filesystem::copy_file(path, to, std::filesystem::copy_options::overwrite_existing, ec);
      LOPPER_CHECK(!ec, "[import] cannot copy external data '", location, "' to '", to,
                   "': ", ec.message());
      ctx.mapped = std::make_shared<MappedData>(to, size_t(st.st_size));
      ctx.mapped_source = path;
    } else {
      ::close(fd);
    }
    if (offset % int64_t(c10::elementSize(type)) == 0) {
      std::shared_ptr<MappedData> keep = ctx.mapped;
      return at::from_blob(
          ctx.mapped->data() + offset, dims, [keep](void*) {}, at::TensorOptions().dtype(type));
    }
    fd = open_regular_file(ctx.mapped->path(), "[import] " + what + ": external data");
  }
  at::Tensor t;
  try {
    t = at::empty(dims, at::TensorOptions().dtype(type));
  } catch (...) {
    ::close(fd);
    throw;
  }
  size_t done = 0;
  auto* out = static_cast<char*>(t.data_ptr());
  while (done < nbytes) {
    ssize_t r = ::pread(fd, out + done, nbytes - done, offset + static_cast<off_t>(done));
    if (r <= 0) {
      ::close(fd);
      throw Error(
          detail::concat("[import] ", what, ": cannot read external data '", location, "'"));
    }
    done += static_cast<size_t>(r);
  }
  ::close(fd);
  return t;
}

template <typename Src, typename Dst>
void copy_typed(const google::protobuf::RepeatedField<Src>& src, at::Tensor& t) {
  auto* d = static_cast<Dst*>(t.data_ptr());
  for (int i = 0; i < src.size(); ++i) d[i] = static_cast<Dst>(src.Get(i));
}

// `take_raw` (p itself, or null): adopt its raw bytes instead of copying them.
at::Tensor tensor_from_proto(const lopper_onnx::TensorProto& p, const ExternalDataContext& ctx,
                             const std::string& what, lopper_onnx::TensorProto* take_raw);

}  // namespace

at::Tensor tensor_from_proto(const lopper_onnx::TensorProto& p, const ExternalDataContext& ctx,
                             const std::string& what) {
  return tensor_from_proto(p, ctx, what, nullptr);
}

at::Tensor take_tensor_from_proto(lopper_onnx::TensorProto& p, const ExternalDataContext& ctx,
                                  const std::string& what) {
  return tensor_from_proto(p, ctx, what, &p);
}

namespace {

at::Tensor tensor_from_proto(const lopper_onnx::TensorProto& p, const ExternalDataContext& ctx,
                             const std::string& what, lopper_onnx::TensorProto* take_raw) {
  LOPPER_CHECK(!p.has_segment(), "[import] ", what, ": segmented tensors are not supported");
  auto dt = static_cast<DType>(p.data_type());
  LOPPER_CHECK(p.data_type() != 0, "[import] ", what, ": tensor has no data type");
  LOPPER_CHECK(dt != DType::kString, "[import] ", what, ": string tensors are not supported");
  at::ScalarType st;
  try {
    st = to_scalar_type(dt);
  } catch (const Error& e) {
    throw Error(detail::concat("[import] ", what, ": type ", ir::dtype_name(dt), " (",
                               p.data_type(), ") is not supported"));
  }
  int64_t numel = 0;
  auto dims = checked_dims(p.dims(), what, &numel);
  size_t elem = c10::elementSize(st);
  size_t nbytes = static_cast<size_t>(numel) * elem;
  // NOTE: the tensor is allocated only once its bytes are known to be present: dims alone may ask
  // for terabytes (found by bench/fuzz).
  auto allocate = [&] { return at::empty(dims, at::TensorOptions().dtype(st)); };

  if (p.data_location() == lopper_onnx::TensorProto::EXTERNAL) {
    if (nbytes == 0) return allocate();
    return read_external(p, ctx, what, dims, st, nbytes);
  }
  if (p.has_raw_data()) {
    LOPPER_CHECK(p.raw_data().size() == nbytes, "[import] ", what, ": raw data has ",
                 p.raw_data().size(), " bytes, but shape and type need ", nbytes);
    if (take_raw && nbytes >= 4096) {
      // NOTE: the tensor adopts the parsed bytes instead of copying them: a model's weights are
      // held once, not twice, while it loads (bench/prune_speed.py measures the peak).
      auto* owner = new std::string(std::move(*take_raw->mutable_raw_data()));
      take_raw->clear_raw_data();
      return at::from_blob(
          owner->data(), dims, [owner](void*) { delete owner; }, at::TensorOptions().dtype(st));
    }
    at::Tensor t = allocate();
    if (nbytes) std::memcpy(t.data_ptr(), p.raw_data().data(), nbytes);
    return t;
  }
  at::Tensor t;
  // The typed field's values (a complex element: two, its real and imaginary parts), checked
  // against the shape, then copied in as `Dst`s.
  const int64_t per = dt == DType::kComplex64 || dt == DType::kComplex128 ? 2 : 1;
  auto fill = [&]<typename Dst, typename Src>(const google::protobuf::RepeatedField<Src>& field,
                                              Dst) {
    LOPPER_CHECK(field.size() == per * numel, "[import] ", what, ": has ", field.size(),
                 " values, but its shape needs ", per * numel);
    t = allocate();
    copy_typed<Src, Dst>(field, t);
  };
  // An integer field's values as the element's bits: the low 8, 16, 32 or 64 of each (float16
  // and bfloat16 travel as their bit patterns in int32_data).
  auto fill_bits = [&](const auto& field) {
    switch (elem) {
      case 1:
        return fill(field, uint8_t{});
      case 2:
        return fill(field, uint16_t{});
      case 4:
        return fill(field, uint32_t{});
      default:
        return fill(field, uint64_t{});
    }
  };
  switch (dt) {
    case DType::kFloat:
    case DType::kComplex64:
      fill(p.float_data(), float{});
      break;
    case DType::kDouble:
    case DType::kComplex128:
      fill(p.double_data(), double{});
      break;
    case DType::kInt64:
      fill(p.int64_data(), int64_t{});
      break;
    case DType::kUInt32:
    case DType::kUInt64:
      fill_bits(p.uint64_data());
      break;
    case DType::kInt32:
    case DType::kInt16:
    case DType::kUInt16:
    case DType::kFloat16:
    case DType::kBFloat16:
    case DType::kInt8:
    case DType::kUInt8:
    case DType::kBool:
    case DType::kFloat8E4M3FN:
    case DType::kFloat8E4M3FNUZ:
    case DType::kFloat8E5M2:
    case DType::kFloat8E5M2FNUZ:
      fill_bits(p.int32_data());
      break;
    default:
      throw Error(detail::concat("[import] ", what, ": unsupported tensor type"));
  }
  return t;
}

}  // namespace

int64_t sparse_budget_for(size_t model_bytes) {
  constexpr int64_t kFloor = int64_t(1) << 28;
  constexpr uint64_t kRatio = 1024;
  uint64_t b = static_cast<uint64_t>(model_bytes);
  if (b > (uint64_t(1) << 44) / kRatio) return int64_t(1) << 44;
  return std::max<int64_t>(kFloor, static_cast<int64_t>(b * kRatio));
}

at::Tensor tensor_from_sparse_proto(const lopper_onnx::SparseTensorProto& p,
                                    const ExternalDataContext& ctx, const std::string& what) {
  int64_t numel = 0;
  auto dims = checked_dims(p.dims(), what, &numel);
  at::Tensor values = tensor_from_proto(p.values(), ctx, what + " (values)");
  at::Tensor indices = tensor_from_proto(p.indices(), ctx, what + " (indices)");
  LOPPER_CHECK(values.dim() == 1, "[import] ", what, ": sparse values must be 1-D");
  int64_t nnz = values.size(0);
  LOPPER_CHECK(indices.scalar_type() == at::kLong, "[import] ", what,
               ": sparse indices must be int64");
  // NOTE: the dense form is not backed by bytes in the file; it draws on a model-wide budget
  // (found by bench/fuzz: a 57-byte model asked for 64 GiB of zeros).
  const int64_t elem = static_cast<int64_t>(values.element_size());
  const int64_t dense_bytes = numel * elem;  // numel <= 2^40, elem <= 16
  LOPPER_CHECK(dense_bytes <= ctx.sparse_budget, "[import] ", what, ": dense form of ", dense_bytes,
               " bytes is too large for a model of this size (sparse tensors may "
               "expand to at most 1024 times the model's size, or 256 MiB)");
  ctx.sparse_budget -= dense_bytes;
  at::Tensor dense = at::zeros(dims, values.options());
  if (nnz == 0) return dense;
  at::Tensor linear;
  if (indices.dim() == 1) {
    LOPPER_CHECK(indices.size(0) == nnz, "[import] ", what, ": ", indices.size(0), " indices for ",
                 nnz, " values");
    linear = indices;
  } else {
    int64_t rank = static_cast<int64_t>(dims.size());
    LOPPER_CHECK(indices.dim() == 2 && indices.size(0) == nnz && indices.size(1) == rank,
                 "[import] ", what, ": sparse indices must be [", nnz, "] or [", nnz, ", ", rank,
                 "]");
    auto acc = indices.accessor<int64_t, 2>();
    linear = at::empty({nnz}, at::kLong);
    auto* l = linear.data_ptr<int64_t>();
    for (int64_t i = 0; i < nnz; ++i) {
      int64_t off = 0;
      for (int64_t d = 0; d < rank; ++d) {
        int64_t v = acc[i][d];
        LOPPER_CHECK(v >= 0 && v < dims[d], "[import] ", what, ": sparse index ", v,
                     " out of range for dimension ", d, " of size ", dims[d]);
        off = off * dims[d] + v;
      }
      l[i] = off;
    }
  }
  const int64_t* l = linear.data_ptr<int64_t>();
  for (int64_t i = 0; i < nnz; ++i)
    LOPPER_CHECK(l[i] >= 0 && l[i] < numel, "[import] ", what, ": sparse index ", l[i],
                 " out of range (", numel, " elements)");
  // A byte copy per value: works for every element type (ATen's index_put_ lacks some, e.g. the
  // unsigned and float8 types); a repeated index keeps the last value, as index_put_ would.
  auto* dst = static_cast<char*>(dense.data_ptr());
  const auto* src = static_cast<const char*>(values.data_ptr());
  for (int64_t i = 0; i < nnz; ++i) std::memcpy(dst + l[i] * elem, src + i * elem, elem);
  return dense;
}

void tensor_meta_to_proto(const at::Tensor& t, lopper_onnx::TensorProto* p) {
  p->set_data_type(static_cast<int32_t>(to_dtype(t.scalar_type())));
  p->clear_dims();
  for (int64_t d : t.sizes()) p->add_dims(d);
}

void tensor_to_proto(const at::Tensor& t, lopper_onnx::TensorProto* p) {
  at::Tensor c = t.detach().cpu().contiguous();
  tensor_meta_to_proto(c, p);
  p->set_raw_data(std::string(static_cast<const char*>(c.data_ptr()), c.nbytes()));
}

void tensor_to_sparse_proto(const at::Tensor& t, const std::string& name,
                            lopper_onnx::SparseTensorProto* p) {
  at::Tensor c = t.detach().cpu().contiguous();
  at::Tensor flat = c.view({-1});
  // NOTE: ATen's nonzero lacks the float8 types (found by bench/fuzz: a float8 sparse initializer
  // could be read but not written back); their bytes tell zero from nonzero (-0.0 is kept as a
  // value, bit for bit).
  at::Tensor idx =
      (at::isFloat8Type(c.scalar_type()) ? flat.view(at::kByte) : flat).nonzero().view({-1});
  at::Tensor vals = flat.index_select(0, idx);
  p->clear_dims();
  for (int64_t d : c.sizes()) p->add_dims(d);
  tensor_to_proto(vals, p->mutable_values());
  p->mutable_values()->set_name(name);
  tensor_to_proto(idx, p->mutable_indices());
}

namespace {

// The live mappings, for drop_pages().
std::mutex mappings_mu;
std::vector<const MappedData*>& mappings() {
  static std::vector<const MappedData*> all;
  return all;
}

}  // namespace

void drop_pages(const at::Tensor& t) {
  std::lock_guard<std::mutex> lock(mappings_mu);
  for (const MappedData* m : mappings()) {
    const int64_t at = m->offset_of(t);
    if (at < 0) continue;
    // The whole pages inside the tensor's bytes (a page shared with a neighbour stays).
    const size_t page = size_t(::sysconf(_SC_PAGESIZE));
    const size_t begin = (size_t(at) + page - 1) / page * page,
                 end = (size_t(at) + t.nbytes()) / page * page;
    if (end > begin) ::madvise(m->data() + begin, end - begin, MADV_DONTNEED);
    return;
  }
}

MappedData::MappedData(const std::string& path, size_t size) : path_(path), size_(size) {
  if (size_ == 0) return;
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  LOPPER_CHECK(fd >= 0, "[import] cannot map '", path, "': ", std::strerror(errno));
  base_ = ::mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int err = errno;
  ::close(fd);
  if (base_ == MAP_FAILED) {
    base_ = nullptr;
    throw Error(detail::concat("[import] cannot map '", path, "': ", std::strerror(err)));
  }
  std::lock_guard<std::mutex> lock(mappings_mu);
  mappings().push_back(this);
}

MappedData::~MappedData() {
  {
    std::lock_guard<std::mutex> lock(mappings_mu);
    auto& all = mappings();
    all.erase(std::remove(all.begin(), all.end(), this), all.end());
  }
  if (base_) ::munmap(base_, size_);
}

int64_t MappedData::offset_of(const at::Tensor& t) const {
  if (!base_ || !t.defined() || !t.is_cpu()) return -1;
  const char* p = static_cast<const char*>(t.const_data_ptr());
  const char* b = static_cast<const char*>(base_);
  if (p < b || p + t.nbytes() > b + size_) return -1;
  return int64_t(p - b);
}

void MappedData::release() const {
  // NOTE: for a shared file mapping the pages' contents live on in the file (and the page cache):
  // the next read of a tensor maps them back.
  if (base_) ::madvise(base_, size_, MADV_DONTNEED);
}

}  // namespace lopper::onnx
