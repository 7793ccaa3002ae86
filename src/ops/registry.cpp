#include <ATen/ATen.h>

#include "lopper/memory.h"
#include "lopper/onnx_io.h"
#include "ops/op.h"

namespace lopper::ops {

const ir::Attribute* AttrReader::find(const char* name, ir::AttrType type) const {
  const ir::Attribute* a = node_->attr(name);
  if (!a) return nullptr;
  if (a->type != type)
    fail("attribute '", name, "' has type ", static_cast<int>(a->type), ", expected ",
         static_cast<int>(type));
  return a;
}

int64_t AttrReader::attr_int(const char* name) const {
  const auto* a = find(name, ir::AttrType::kInt);
  if (!a) fail("missing required attribute '", name, "'");
  return a->i;
}
int64_t AttrReader::attr_int(const char* name, int64_t def) const {
  const auto* a = find(name, ir::AttrType::kInt);
  return a ? a->i : def;
}
float AttrReader::attr_float(const char* name, float def) const {
  const auto* a = find(name, ir::AttrType::kFloat);
  return a ? a->f : def;
}
std::string AttrReader::attr_string(const char* name, const std::string& def) const {
  const auto* a = find(name, ir::AttrType::kString);
  return a ? a->s : def;
}
std::vector<int64_t> AttrReader::attr_ints(const char* name, std::vector<int64_t> def) const {
  const auto* a = find(name, ir::AttrType::kInts);
  return a ? a->ints : def;
}
std::vector<float> AttrReader::attr_floats(const char* name, std::vector<float> def) const {
  const auto* a = find(name, ir::AttrType::kFloats);
  return a ? a->floats : def;
}
std::vector<std::string> AttrReader::attr_strings(const char* name) const {
  const auto* a = find(name, ir::AttrType::kStrings);
  return a ? a->strings : std::vector<std::string>{};
}
at::Tensor AttrReader::attr_tensor(const char* name) const {
  const auto* a = find(name, ir::AttrType::kTensor);
  if (!a) fail("missing required attribute '", name, "'");
  return a->t;
}
const ir::Graph& AttrReader::attr_graph(const char* name) const {
  const auto* a = find(name, ir::AttrType::kGraph);
  if (!a || !a->g) fail("missing required graph attribute '", name, "'");
  return *a->g;
}

const OpTable& OpTable::global() {
  static const OpTable table = [] {
    OpTable t;
    register_elementwise(t);
    register_activation(t);
    register_reduce(t);
    register_shape(t);
    register_tensor(t);
    register_conv(t);
    register_gemm(t);
    register_norm(t);
    register_pool(t);
    register_resize(t);
    register_attention(t);
    register_random(t);
    register_detection(t);
    register_control(t);
    register_rnn(t);
    register_loss(t);
    register_quant(t);
    register_signal(t);
    return t;
  }();
  return table;
}

static std::string key_of(const std::string& domain, const std::string& op) {
  return (domain == "ai.onnx" ? std::string() : domain) + "::" + op;
}

void OpTable::add(OpDef def) {
  std::string k = key_of(def.domain, def.op_type);
  LOPPER_ASSERT(!ops_.count(k), "op registered twice: ", k);
  ops_.emplace(k, std::move(def));
}

void OpTable::add_onnx(std::initializer_list<OnnxOp> ops) {
  for (const OnnxOp& op : ops) {
    OpDef def{"", op.op_type, op.forward};
    def.channels = op.channels;
    def.shape = op.shape;
    def.shape_operands = op.shape_operands;
    add(std::move(def));
  }
}

void OpTable::set_channels(std::initializer_list<const char*> op_types, ChannelRule rule) {
  for (const char* op : op_types) {
    auto it = ops_.find(key_of("", op));
    LOPPER_ASSERT(it != ops_.end(), "channel rule for an op that is not registered: ", op);
    it->second.channels = rule;
  }
}

void OpTable::set_shape_rule(std::initializer_list<const char*> op_types, ShapeRule rule) {
  for (const char* op : op_types) {
    auto it = ops_.find(key_of("", op));
    LOPPER_ASSERT(it != ops_.end(), "shape rule for an op that is not registered: ", op);
    it->second.shape = rule;
  }
}

void OpTable::set_shape_operands(std::initializer_list<const char*> op_types,
                                 std::vector<size_t> inputs) {
  for (const char* op : op_types) {
    auto it = ops_.find(key_of("", op));
    LOPPER_ASSERT(it != ops_.end(), "shape operands for an op that is not registered: ", op);
    it->second.shape_operands = inputs;
  }
}

const OpDef* OpTable::find(const std::string& domain, const std::string& op_type) const {
  auto it = ops_.find(key_of(domain, op_type));
  return it == ops_.end() ? nullptr : &it->second;
}

std::vector<const OpDef*> OpTable::all() const {
  std::vector<const OpDef*> out;
  for (const auto& [k, v] : ops_) out.push_back(&v);
  std::sort(out.begin(), out.end(), [](const OpDef* a, const OpDef* b) {
    return std::tie(a->domain, a->op_type) < std::tie(b->domain, b->op_type);
  });
  return out;
}

std::vector<int64_t> to_int_vector(const at::Tensor& t) {
  at::Tensor c = t.detach().to(at::kCPU).to(at::kLong).contiguous().view({-1});
  const int64_t* p = c.data_ptr<int64_t>();
  return std::vector<int64_t>(p, p + c.numel());
}

int64_t scalar_int(const OpContext& c, size_t i, const char* what) {
  const at::Tensor& t = c.input(i);
  c.check(t.numel() == 1, what, " must be a scalar, got shape ", t.sizes());
  return to_int_vector(t)[0];
}

double to_double(const at::Tensor& t) {
  return t.detach().to(at::kCPU).to(at::kDouble).view({-1})[0].item<double>();
}

int64_t normalize_axis(const AttrReader& ctx, int64_t axis, int64_t rank) {
  int64_t r = rank == 0 ? 1 : rank;
  ctx.check(axis >= -r && axis < r, "axis ", axis, " out of range for rank ", rank);
  return axis < 0 ? axis + r : axis;
}

at::ScalarType scalar_type_of(const AttrReader& ctx, int64_t onnx_type) {
  try {
    return onnx::to_scalar_type(static_cast<ir::DType>(onnx_type));
  } catch (const Error&) {
    ctx.fail("unsupported data type ", onnx_type);
  }
}

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

void check_output_fits(const AttrReader& ctx, const std::vector<int64_t>& shape,
                       at::ScalarType type) {
  double bytes = tensor_bytes(shape, c10::elementSize(type));
  if (!exceeds_memory(bytes)) return;
  const ir::Node& n = ctx.node();
  throw Error(memory_message(detail::concat("[exec] node '", n.label(), "' (", n.op_type,
                                            "): output ", dims_string(shape)),
                             bytes));
}

}  // namespace lopper::ops
