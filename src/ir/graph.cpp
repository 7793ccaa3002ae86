#include "lopper/graph.h"

#include <ATen/ATen.h>

#include <queue>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "lopper/error.h"

namespace lopper {
namespace detail {
void assert_fail(const char* cond, const char* file, int line, const std::string& msg) {
  throw InternalError(concat("internal error (a lopper bug): ", cond, " at ", file, ":", line,
                             msg.empty() ? "" : ": ", msg));
}
}  // namespace detail

namespace ir {

const char* dtype_name(DType t) {
  static constexpr std::pair<DType, const char*> kNames[] = {
      {DType::kFloat, "float32"},
      {DType::kUInt8, "uint8"},
      {DType::kInt8, "int8"},
      {DType::kUInt16, "uint16"},
      {DType::kInt16, "int16"},
      {DType::kInt32, "int32"},
      {DType::kInt64, "int64"},
      {DType::kString, "string"},
      {DType::kBool, "bool"},
      {DType::kFloat16, "float16"},
      {DType::kDouble, "float64"},
      {DType::kUInt32, "uint32"},
      {DType::kUInt64, "uint64"},
      {DType::kComplex64, "complex64"},
      {DType::kComplex128, "complex128"},
      {DType::kBFloat16, "bfloat16"},
      {DType::kFloat8E4M3FN, "float8e4m3fn"},
      {DType::kFloat8E4M3FNUZ, "float8e4m3fnuz"},
      {DType::kFloat8E5M2, "float8e5m2"},
      {DType::kFloat8E5M2FNUZ, "float8e5m2fnuz"},
      {DType::kUInt4, "uint4"},
      {DType::kInt4, "int4"},
      {DType::kFloat4E2M1, "float4e2m1"},
  };
  for (const auto& [d, name] : kNames)
    if (d == t) return name;
  return "undefined";
}

const Attribute* Node::attr(const std::string& key) const {
  for (const auto& a : attrs)
    if (a.name == key) return &a;
  return nullptr;
}

std::string Node::label() const {
  if (!name.empty()) return name;
  for (const auto& o : outputs)
    if (!o.empty()) return op_type + "->" + o;
  return op_type;
}

const Initializer* Graph::find_initializer(const std::string& key) const {
  for (const auto& t : initializers)
    if (t.name == key) return &t;
  return nullptr;
}

Initializer* Graph::find_initializer(const std::string& key) {
  for (auto& t : initializers)
    if (t.name == key) return &t;
  return nullptr;
}

std::vector<const ValueInfo*> Graph::real_inputs() const {
  std::unordered_set<std::string> init;
  for (const auto& t : initializers) init.insert(t.name);
  std::vector<const ValueInfo*> out;
  for (const auto& v : inputs)
    if (!init.count(v.name)) out.push_back(&v);
  return out;
}

// Names a node reads, including those its subgraphs read from the enclosing scope.
static void collect_reads(const Node& n, std::vector<std::string>& out) {
  for (const auto& i : n.inputs)
    if (!i.empty()) out.push_back(i);
  for (const auto& a : n.attrs) {
    std::vector<const Graph*> subs;
    if (a.g) subs.push_back(a.g.get());
    for (const auto& g : a.graphs) subs.push_back(g.get());
    for (const Graph* g : subs) {
      std::unordered_set<std::string> local;
      for (const auto& v : g->inputs) local.insert(v.name);
      for (const auto& t : g->initializers) local.insert(t.name);
      for (const auto& sn : g->nodes)
        for (const auto& o : sn.outputs) local.insert(o);
      for (const auto& sn : g->nodes) {
        std::vector<std::string> inner;
        collect_reads(sn, inner);
        for (auto& r : inner)
          if (!local.count(r)) out.push_back(r);
      }
    }
  }
}

namespace {

Attribute attr_of(const std::string& name, AttrType type) {
  Attribute a;
  a.name = name;
  a.type = type;
  return a;
}

}  // namespace

Attribute int_attr(const std::string& name, int64_t v) {
  Attribute a = attr_of(name, AttrType::kInt);
  a.i = v;
  return a;
}

Attribute float_attr(const std::string& name, float v) {
  Attribute a = attr_of(name, AttrType::kFloat);
  a.f = v;
  return a;
}

Attribute string_attr(const std::string& name, const std::string& v) {
  Attribute a = attr_of(name, AttrType::kString);
  a.s = v;
  return a;
}

Attribute ints_attr(const std::string& name, std::vector<int64_t> v) {
  Attribute a = attr_of(name, AttrType::kInts);
  a.ints = std::move(v);
  return a;
}

at::Tensor constant_value(const Node& n) {
  for (const auto& a : n.attrs) {
    if (a.name == "value" && a.type == AttrType::kTensor) return a.t;
    if (a.name == "value_float") return at::scalar_tensor(a.f, at::kFloat);
    if (a.name == "value_int") return at::scalar_tensor(a.i, at::kLong);
    if (a.name == "value_floats") return at::tensor(a.floats, at::kFloat);
    if (a.name == "value_ints") return at::tensor(a.ints, at::kLong);
  }
  return {};
}

std::vector<std::string> node_reads(const Node& node) {
  std::vector<std::string> out;
  collect_reads(node, out);
  return out;
}

std::vector<size_t> Graph::topological_order(const std::vector<std::string>& outer_scope) const {
  std::unordered_set<std::string> available(outer_scope.begin(), outer_scope.end());
  for (const auto& v : inputs) available.insert(v.name);
  for (const auto& t : initializers) available.insert(t.name);

  std::unordered_map<std::string, size_t> producer;
  for (size_t i = 0; i < nodes.size(); ++i)
    for (const auto& o : nodes[i].outputs) {
      if (o.empty()) continue;
      LOPPER_CHECK(!producer.count(o), "[graph] value '", o, "' is produced twice (node '",
                   nodes[i].label(), "')");
      producer[o] = i;
    }

  std::vector<size_t> pending(nodes.size(), 0);
  std::vector<std::vector<size_t>> users(nodes.size());
  for (size_t i = 0; i < nodes.size(); ++i) {
    std::vector<std::string> reads;
    collect_reads(nodes[i], reads);
    std::unordered_set<size_t> deps;
    for (const auto& r : reads) {
      auto it = producer.find(r);
      if (it != producer.end()) {
        if (it->second != i) deps.insert(it->second);
        continue;
      }
      LOPPER_CHECK(available.count(r), "[graph] node '", nodes[i].label(), "' reads '", r,
                   "', which nothing produces");
    }
    pending[i] = deps.size();
    for (size_t d : deps) users[d].push_back(i);
  }
  // Kahn's algorithm, taking ready nodes in file order so that the order is stable.
  std::priority_queue<size_t, std::vector<size_t>, std::greater<size_t>> ready;
  for (size_t i = 0; i < nodes.size(); ++i)
    if (pending[i] == 0) ready.push(i);
  std::vector<size_t> order;
  order.reserve(nodes.size());
  while (!ready.empty()) {
    size_t i = ready.top();
    ready.pop();
    order.push_back(i);
    for (size_t u : users[i])
      if (--pending[u] == 0) ready.push(u);
  }
  LOPPER_CHECK(order.size() == nodes.size(), "[graph] the graph '", name, "' has a cycle");
  return order;
}

}  // namespace ir

int64_t ir::Model::opset(const std::string& d) const {
  auto norm = [](const std::string& s) { return s == "ai.onnx" ? std::string() : s; };
  for (const auto& o : opset_import)
    if (norm(o.domain) == norm(d)) return o.version;
  return 0;
}

}  // namespace lopper
