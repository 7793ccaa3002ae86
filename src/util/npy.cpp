#include "lopper/npy.h"

#include <ATen/ATen.h>

#include <cstring>

#include "lopper/error.h"
#include "lopper/files.h"

namespace lopper {
namespace {

struct NpyType {
  const char* descr;
  at::ScalarType type;
};
constexpr NpyType kTypes[] = {
    {"<f4", at::kFloat},        {"<f8", at::kDouble},
    {"<f2", at::kHalf},         {"<i8", at::kLong},
    {"<i4", at::kInt},          {"<i2", at::kShort},
    {"|i1", at::kChar},         {"|u1", at::kByte},
    {"|b1", at::kBool},         {"<u2", at::kUInt16},
    {"<u4", at::kUInt32},       {"<u8", at::kUInt64},
    {"<c8", at::kComplexFloat}, {"<c16", at::kComplexDouble},
};

// Finds `'key': value` in the header dict and returns the value text (up to the next ',' at depth 0
// or the closing brace).
std::string dict_value(const std::string& header, const std::string& key, const std::string& path) {
  size_t k = header.find("'" + key + "'");
  LOPPER_CHECK(k != std::string::npos, "[npy] '", path, "': header has no '", key, "'");
  size_t colon = header.find(':', k);
  LOPPER_CHECK(colon != std::string::npos, "[npy] '", path, "': malformed header");
  size_t i = colon + 1;
  while (i < header.size() && header[i] == ' ') ++i;
  size_t start = i;
  int depth = 0;
  for (; i < header.size(); ++i) {
    char c = header[i];
    if (c == '(' || c == '[')
      ++depth;
    else if (c == ')' || c == ']')
      --depth;
    else if ((c == ',' || c == '}') && depth == 0)
      break;
  }
  return header.substr(start, i - start);
}

}  // namespace

at::Tensor parse_npy(const std::string& bytes, const std::string& path) {
  LOPPER_CHECK(bytes.size() >= 10 && std::memcmp(bytes.data(), "\x93NUMPY", 6) == 0, "[npy] '",
               path, "' is not a .npy file");
  int major = static_cast<unsigned char>(bytes[6]);
  size_t header_len, offset;
  if (major == 1) {
    header_len = static_cast<unsigned char>(bytes[8]) | static_cast<unsigned char>(bytes[9]) << 8;
    offset = 10;
  } else {
    LOPPER_CHECK((major == 2 || major == 3) && bytes.size() >= 12, "[npy] '", path,
                 "': unsupported .npy version ", major);
    header_len = 0;
    for (int i = 0; i < 4; ++i)
      header_len |= size_t(static_cast<unsigned char>(bytes[8 + i])) << (8 * i);
    offset = 12;
  }
  LOPPER_CHECK(offset + header_len <= bytes.size(), "[npy] '", path, "': truncated header");
  std::string header = bytes.substr(offset, header_len);
  std::string descr = dict_value(header, "descr", path);
  std::string order = dict_value(header, "fortran_order", path);
  std::string shape_s = dict_value(header, "shape", path);
  LOPPER_CHECK(order == "False", "[npy] '", path, "': Fortran-order arrays are not supported");
  LOPPER_CHECK(descr.size() >= 2, "[npy] '", path, "': malformed dtype");
  descr = descr.substr(1, descr.size() - 2);
  if (descr == "<b1" || descr == "=b1") descr = "|b1";
  if (descr == "<i1") descr = "|i1";
  if (descr == "<u1") descr = "|u1";
  at::ScalarType type = at::kFloat;
  bool found = false;
  for (const auto& t : kTypes)
    if (descr == t.descr) type = t.type, found = true;
  LOPPER_CHECK(found, "[npy] '", path, "': unsupported dtype '", descr, "'");
  LOPPER_CHECK(shape_s.size() >= 2 && shape_s.front() == '(' && shape_s.back() == ')', "[npy] '",
               path, "': malformed shape");
  std::vector<int64_t> shape;
  std::string inner = shape_s.substr(1, shape_s.size() - 2);
  size_t i = 0;
  int64_t numel = 1;
  while (i < inner.size()) {
    while (i < inner.size() && (inner[i] == ' ' || inner[i] == ',')) ++i;
    if (i >= inner.size()) break;
    size_t j = i;
    while (j < inner.size() && isdigit(static_cast<unsigned char>(inner[j]))) ++j;
    LOPPER_CHECK(j > i && j - i < 13, "[npy] '", path, "': malformed shape '", shape_s, "'");
    int64_t d = std::stoll(inner.substr(i, j - i));
    LOPPER_CHECK(d == 0 || numel <= (int64_t(1) << 40) / d, "[npy] '", path, "': too large");
    numel *= d;
    shape.push_back(d);
    i = j;
  }
  size_t data_off = offset + header_len;
  size_t nbytes = static_cast<size_t>(numel) * c10::elementSize(type);
  LOPPER_CHECK(bytes.size() - data_off == nbytes, "[npy] '", path, "': has ",
               bytes.size() - data_off, " data bytes, shape ", shape_s, " needs ", nbytes);
  at::Tensor t = at::empty(shape, at::TensorOptions().dtype(type));
  if (nbytes) std::memcpy(t.data_ptr(), bytes.data() + data_off, nbytes);
  return t;
}

at::Tensor load_npy(const std::string& path) { return parse_npy(read_file(path), path); }

void save_npy(const at::Tensor& tensor, const std::string& path) {
  write_file_atomic(path, npy_bytes(tensor));
}

std::string npy_bytes(const at::Tensor& tensor) {
  at::Tensor t = tensor.detach().cpu().contiguous();
  const char* descr = nullptr;
  for (const auto& k : kTypes)
    if (k.type == t.scalar_type()) descr = k.descr;
  if (t.scalar_type() == at::kBFloat16) {
    t = t.to(at::kFloat);
    descr = "<f4";
  }
  LOPPER_CHECK(descr, "[npy] cannot write ", c10::toString(t.scalar_type()), " to .npy");
  std::string shape = "(";
  for (int64_t d : t.sizes()) shape += std::to_string(d) + ",";
  if (t.dim() > 1) shape.pop_back();
  shape += ")";
  std::string header =
      "{'descr': '" + std::string(descr) + "', 'fortran_order': False, 'shape': " + shape + ", }";
  size_t total = 10 + header.size() + 1;
  header += std::string((64 - total % 64) % 64, ' ') + "\n";
  std::string out = "\x93NUMPY";
  out += '\x01';
  out += '\x00';
  out += static_cast<char>(header.size() & 0xff);
  out += static_cast<char>(header.size() >> 8);
  out += header;
  out.append(static_cast<const char*>(t.data_ptr()), t.nbytes());
  return out;
}

}  // namespace lopper
