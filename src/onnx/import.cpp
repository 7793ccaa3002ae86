// ONNX ModelProto -> ir::Model.
#include <ATen/ATen.h>

#include <fcntl.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <filesystem>
#include <set>
#include <utility>

#include "lopper/error.h"
#include "lopper/files.h"
#include "lopper/onnx_io.h"
#include "onnx.pb.h"
#include "onnx/tensor_proto.h"

namespace lopper::onnx {
namespace {

using namespace lopper_onnx;

ir::TypeInfo convert_type(const TypeProto& t) {
  ir::TypeInfo out;
  if (t.has_tensor_type()) {
    const auto& tt = t.tensor_type();
    out.elem_type = static_cast<ir::DType>(tt.elem_type());
    out.has_shape = tt.has_shape();
    for (const auto& d : tt.shape().dim()) {
      ir::Dim dim;
      if (d.has_dim_value())
        dim.value = d.dim_value();
      else if (d.has_dim_param())
        dim.param = d.dim_param();
      out.dims.push_back(dim);
    }
    out.denotation = t.denotation();
  } else {
    out.raw = t.SerializeAsString();
    if (out.raw.empty()) out.raw = std::string(1, '\0');  // an empty TypeProto, kept as such
  }
  return out;
}

ir::ValueInfo convert_value_info(const ValueInfoProto& v) {
  ir::ValueInfo out;
  out.name = v.name();
  out.doc_string = v.doc_string();
  if (v.has_type()) out.type = convert_type(v.type());
  return out;
}

template <typename Repeated>
std::vector<std::pair<std::string, std::string>> convert_props(const Repeated& props) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& kv : props) out.emplace_back(kv.key(), kv.value());
  return out;
}

ir::Graph convert_graph(GraphProto& g, const ExternalDataContext& ctx, int depth);

ir::Attribute convert_attribute(AttributeProto& a, const ExternalDataContext& ctx,
                                const std::string& where, int depth) {
  ir::Attribute out;
  out.name = a.name();
  out.ref_attr_name = a.ref_attr_name();
  out.doc_string = a.doc_string();
  auto type = static_cast<ir::AttrType>(a.type());
  if (type == ir::AttrType::kUndefined) {  // IR version 1 models: infer from the field that is set
    const std::pair<bool, ir::AttrType> set[] = {{a.has_f(), ir::AttrType::kFloat},
                                                 {a.has_i(), ir::AttrType::kInt},
                                                 {a.has_s(), ir::AttrType::kString},
                                                 {a.has_t(), ir::AttrType::kTensor},
                                                 {a.has_g(), ir::AttrType::kGraph},
                                                 {a.floats_size() > 0, ir::AttrType::kFloats},
                                                 {a.ints_size() > 0, ir::AttrType::kInts},
                                                 {a.strings_size() > 0, ir::AttrType::kStrings},
                                                 {a.tensors_size() > 0, ir::AttrType::kTensors},
                                                 {a.graphs_size() > 0, ir::AttrType::kGraphs}};
    for (const auto& [is_set, t] : set)
      if (is_set) {
        type = t;
        break;
      }
  }
  out.type = type;
  std::string what = where + " attribute '" + a.name() + "'";
  switch (type) {
    case ir::AttrType::kFloat:
      out.f = a.f();
      break;
    case ir::AttrType::kInt:
      out.i = a.i();
      break;
    case ir::AttrType::kString:
      out.s = a.s();
      break;
    case ir::AttrType::kTensor:
      out.t = tensor_from_proto(a.t(), ctx, what);
      break;
    case ir::AttrType::kGraph:
      out.g = std::make_shared<ir::Graph>(convert_graph(*a.mutable_g(), ctx, depth + 1));
      break;
    case ir::AttrType::kFloats:
      out.floats.assign(a.floats().begin(), a.floats().end());
      break;
    case ir::AttrType::kInts:
      out.ints.assign(a.ints().begin(), a.ints().end());
      break;
    case ir::AttrType::kStrings:
      out.strings.assign(a.strings().begin(), a.strings().end());
      break;
    case ir::AttrType::kTensors:
      for (const auto& t : a.tensors()) out.tensors.push_back(tensor_from_proto(t, ctx, what));
      break;
    case ir::AttrType::kGraphs:
      for (auto& g : *a.mutable_graphs())
        out.graphs.push_back(std::make_shared<ir::Graph>(convert_graph(g, ctx, depth + 1)));
      break;
    default:  // sparse tensors, type protos, or an attribute that sets nothing: kept verbatim
      out.raw = a.SerializeAsString();
      break;
  }
  return out;
}

ir::Graph convert_graph(GraphProto& g, const ExternalDataContext& ctx, int depth) {
  LOPPER_CHECK(depth < 64, "[import] subgraphs nested too deeply");
  ir::Graph out;
  out.name = g.name();
  out.doc_string = g.doc_string();
  out.metadata_props = convert_props(g.metadata_props());
  for (const auto& v : g.input()) out.inputs.push_back(convert_value_info(v));
  for (const auto& v : g.output()) out.outputs.push_back(convert_value_info(v));
  for (const auto& v : g.value_info()) out.value_info.push_back(convert_value_info(v));
  for (auto& t : *g.mutable_initializer()) {
    LOPPER_CHECK(!t.name().empty(), "[import] graph '", g.name(), "' has an unnamed initializer");
    out.initializers.push_back({t.name(),
                                take_tensor_from_proto(t, ctx, "initializer '" + t.name() + "'"),
                                t.doc_string(), false});
  }
  for (const auto& s : g.sparse_initializer()) {
    const std::string& name = s.values().name();
    LOPPER_CHECK(!name.empty(), "[import] graph '", g.name(),
                 "' has an unnamed sparse initializer");
    out.initializers.push_back(
        {name, tensor_from_sparse_proto(s, ctx, "sparse initializer '" + name + "'"),
         s.values().doc_string(), true});
  }
  for (auto& n : *g.mutable_node()) {
    ir::Node node;
    node.name = n.name();
    node.op_type = n.op_type();
    node.domain = n.domain() == "ai.onnx" ? "" : n.domain();
    node.doc_string = n.doc_string();
    node.inputs.assign(n.input().begin(), n.input().end());
    node.outputs.assign(n.output().begin(), n.output().end());
    node.metadata_props = convert_props(n.metadata_props());
    LOPPER_CHECK(!node.op_type.empty(), "[import] node '", node.name, "' has no op type");
    std::string where = "node '" + node.label() + "'";
    for (auto& a : *n.mutable_attribute())
      node.attrs.push_back(convert_attribute(a, ctx, where, depth));
    out.nodes.push_back(std::move(node));
  }
  return out;
}

}  // namespace

namespace {

// The model's own fields; its graph's initializers take over the parsed bytes (`m` is consumed).
ir::Model convert_model(ModelProto& m, size_t size, const std::string& base_dir,
                        const LoadOptions& opts = {}, std::shared_ptr<MappedData>* mapped = nullptr,
                        std::vector<ir::Initializer> extra = {}) {
  LOPPER_CHECK(m.has_graph(), "[import] not an ONNX model (no graph)");
  LOPPER_CHECK(m.ir_version() > 0, "[import] not an ONNX model (no IR version)");
  ExternalDataContext ctx{base_dir};
  ctx.copy_to = opts.external_copy;
  ctx.sparse_budget = sparse_budget_for(size);
  std::set<std::string> external;
  ctx.files = &external;
  ir::Model out;
  out.ir_version = m.ir_version();
  for (const auto& o : m.opset_import()) out.opset_import.push_back({o.domain(), o.version()});
  out.producer_name = m.producer_name();
  out.producer_version = m.producer_version();
  out.domain = m.domain();
  out.model_version = m.model_version();
  out.doc_string = m.doc_string();
  out.metadata_props = convert_props(m.metadata_props());
  for (const auto& f : m.functions()) out.functions.push_back(f.SerializeAsString());
  for (const auto& t : m.training_info()) out.training_info.push_back(t.SerializeAsString());
  out.graph = convert_graph(*m.mutable_graph(), ctx, 0);
  for (auto& t : extra) out.graph.initializers.push_back(std::move(t));
  out.external_files.assign(external.begin(), external.end());
  if (out.opset_import.empty()) out.opset_import.push_back({"", 1});  // as ONNX specifies
  ir::validate(out);
  if (mapped) *mapped = ctx.mapped;
  return out;
}

constexpr const char* kTooBig =
    "[import] model is over 2 GB; ONNX stores weights of such models as external data";
constexpr const char* kCorrupt =
    "[import] not a valid ONNX model (protobuf parse failed: truncated or corrupt)";

// read(2) on a file, for protobuf's stream parser.
class FdInput : public google::protobuf::io::CopyingInputStream {
 public:
  explicit FdInput(int fd) : fd_(fd) {}
  int Read(void* buffer, int size) override {
    for (;;) {
      ssize_t n = ::read(fd_, buffer, static_cast<size_t>(size));
      if (n >= 0) return static_cast<int>(n);
      if (errno != EINTR) return -1;
    }
  }

 private:
  int fd_;
};

}  // namespace

ir::Model parse_model(const void* data, size_t size, const std::string& base_dir) {
  LOPPER_CHECK(size <= static_cast<size_t>(INT_MAX), kTooBig);
  ModelProto m;
  LOPPER_CHECK(m.ParseFromArray(data, static_cast<int>(size)), kCorrupt);
  return convert_model(m, size, base_dir);
}

ir::Model parse_model(const void* data, size_t size,
                      const std::vector<std::pair<std::string, at::Tensor>>& initializers) {
  LOPPER_CHECK(size <= static_cast<size_t>(INT_MAX), kTooBig);
  std::vector<ir::Initializer> extra;
  extra.reserve(initializers.size());
  for (const auto& [name, t] : initializers) {
    LOPPER_CHECK(t.defined() && !t.requires_grad() && t.layout() == at::kStrided,
                 "[import] initializer '", name, "' is not a dense tensor without gradient");
    // NOTE: a copy: the caller's tensors (a module's parameters) are never written through.
    extra.push_back({name, t.to(at::kCPU).contiguous().clone(), "", false});
  }
  ModelProto m;
  LOPPER_CHECK(m.ParseFromArray(data, static_cast<int>(size)), kCorrupt);
  return convert_model(m, size, "", {}, nullptr, std::move(extra));
}

ir::Model load_model(const std::string& path) { return load_model(path, {}, nullptr); }

ir::Model load_model(const std::string& path, const LoadOptions& opts,
                     std::shared_ptr<MappedData>* mapped) {
  std::string dir = std::filesystem::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  // NOTE: parsed straight from the file, never read into one buffer first: with the initializers
  // adopting the parsed bytes, a model's weights are in memory once while it loads.
  // Never blocks: a FIFO or a device is refused before anything is read from it.
  const int fd = open_regular_file(path, "[io]");
  struct stat st {};
  ::fstat(fd, &st);
  struct FdCloser {
    int fd;
    ~FdCloser() { ::close(fd); }
  } closer{fd};
  size_t size = static_cast<size_t>(st.st_size);
  try {
    LOPPER_CHECK(size <= static_cast<size_t>(INT_MAX), kTooBig);
    ModelProto m;
    {
      FdInput in(fd);
      google::protobuf::io::CopyingInputStreamAdaptor stream(&in, 1 << 20);
      LOPPER_CHECK(m.ParseFromZeroCopyStream(&stream), kCorrupt);
    }
    return convert_model(m, size, dir, opts, mapped);
  } catch (const Error& e) {
    throw Error(detail::concat(e.what(), " (", path, ")"));
  }
}

at::Tensor load_tensor_pb(const std::string& path) {
  std::string bytes = read_file(path);
  TensorProto t;
  LOPPER_CHECK(t.ParseFromString(bytes), "[import] '", path, "' is not a TensorProto file");
  std::string dir = std::filesystem::path(path).parent_path().string();
  return tensor_from_proto(t, {dir.empty() ? "." : dir}, "tensor file '" + path + "'");
}

}  // namespace lopper::onnx
