// The graph IR: what lopper holds of an ONNX model. Initializers are ATen tensors; everything the
// importer does not interpret (functions, opaque attribute types) is kept as serialized bytes so
// that import -> export loses nothing.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace lopper::ir {

/// ONNX TensorProto.DataType codes (the numbers are ONNX's).
enum class DType : int32_t {
  kUndefined = 0,
  kFloat = 1,
  kUInt8 = 2,
  kInt8 = 3,
  kUInt16 = 4,
  kInt16 = 5,
  kInt32 = 6,
  kInt64 = 7,
  kString = 8,
  kBool = 9,
  kFloat16 = 10,
  kDouble = 11,
  kUInt32 = 12,
  kUInt64 = 13,
  kComplex64 = 14,
  kComplex128 = 15,
  kBFloat16 = 16,
  kFloat8E4M3FN = 17,
  kFloat8E4M3FNUZ = 18,
  kFloat8E5M2 = 19,
  kFloat8E5M2FNUZ = 20,
  kUInt4 = 21,
  kInt4 = 22,
  kFloat4E2M1 = 23,
};
const char* dtype_name(DType t);

/// One dimension of a value's shape: a number, a symbol ("batch"), or unknown.
struct Dim {
  int64_t value = -1;  // >= 0 when static
  std::string param;   // symbolic name when dynamic
  bool is_static() const { return value >= 0; }
};

/// The type of a graph value. Tensor types are interpreted; other ONNX types (sequence, map,
/// optional) are kept as their serialized TypeProto in `raw`.
struct TypeInfo {
  DType elem_type = DType::kUndefined;
  bool has_shape = false;
  std::vector<Dim> dims;
  std::string denotation;
  std::string raw;  // non-empty for non-tensor types
  bool is_tensor() const { return raw.empty(); }
};

struct ValueInfo {
  std::string name;
  TypeInfo type;
  std::string doc_string;
};

struct Graph;

enum class AttrType : int32_t {  // ONNX AttributeProto.AttributeType codes
  kUndefined = 0,
  kFloat = 1,
  kInt = 2,
  kString = 3,
  kTensor = 4,
  kGraph = 5,
  kSparseTensor = 11,
  kTypeProto = 13,
  kFloats = 6,
  kInts = 7,
  kStrings = 8,
  kTensors = 9,
  kGraphs = 10,
  kSparseTensors = 12,
  kTypeProtos = 14,
};

struct Attribute {
  std::string name;
  AttrType type = AttrType::kUndefined;
  float f = 0;
  int64_t i = 0;
  std::string s;
  at::Tensor t;
  std::shared_ptr<Graph> g;
  std::vector<float> floats;
  std::vector<int64_t> ints;
  std::vector<std::string> strings;
  std::vector<at::Tensor> tensors;
  std::vector<std::shared_ptr<Graph>> graphs;
  std::string ref_attr_name;  // inside functions
  std::string doc_string;
  std::string raw;  // serialized AttributeProto for sparse-tensor and type-proto attributes
};

/// An attribute of one int, float or string, or of a list of ints.
Attribute int_attr(const std::string& name, int64_t v);
Attribute float_attr(const std::string& name, float v);
Attribute string_attr(const std::string& name, const std::string& v);
Attribute ints_attr(const std::string& name, std::vector<int64_t> v);

struct Node {
  std::string name;
  std::string op_type;
  std::string domain;                // "" is the default ONNX domain ("ai.onnx")
  std::vector<std::string> inputs;   // "" marks an omitted optional input
  std::vector<std::string> outputs;  // "" marks an omitted optional output
  std::vector<Attribute> attrs;
  std::string doc_string;
  std::vector<std::pair<std::string, std::string>> metadata_props;

  const Attribute* attr(const std::string& key) const;
  /// A printable name: the node's name, or "<op_type> #i" style fallback from its first output.
  std::string label() const;
};

struct Initializer {
  std::string name;
  at::Tensor value;  // CPU, contiguous
  std::string doc_string;
  bool sparse = false;  // stored as sparse_initializer in the file it came from
};

struct Graph {
  std::string name;
  std::string doc_string;
  std::vector<ValueInfo> inputs;
  std::vector<ValueInfo> outputs;
  std::vector<ValueInfo> value_info;
  std::vector<Node> nodes;
  std::vector<Initializer> initializers;
  std::vector<std::pair<std::string, std::string>> metadata_props;

  const Initializer* find_initializer(const std::string& name) const;
  Initializer* find_initializer(const std::string& name);
  /// Graph inputs that are not initializers (the ones a caller must feed).
  std::vector<const ValueInfo*> real_inputs() const;
  /// Indices of `nodes` in a topological order; throws lopper::Error on a cycle or on an input
  /// that no node, initializer, graph input or (for subgraphs) outer scope provides.
  std::vector<size_t> topological_order(const std::vector<std::string>& outer_scope = {}) const;
};

/// The value a Constant node holds (its `value`, `value_float(s)` or `value_int(s)` attribute);
/// undefined for any other form (sparse tensors, strings).
at::Tensor constant_value(const Node& n);

/// Every value name a node reads: its inputs, and what its subgraphs read from enclosing scopes.
std::vector<std::string> node_reads(const Node& node);

struct OpsetId {
  std::string domain;
  int64_t version = 0;
};

struct Model {
  int64_t ir_version = 0;
  std::vector<OpsetId> opset_import;
  std::string producer_name;
  std::string producer_version;
  std::string domain;
  int64_t model_version = 0;
  std::string doc_string;
  std::vector<std::pair<std::string, std::string>> metadata_props;
  std::vector<std::string> functions;      // serialized FunctionProto, kept verbatim
  std::vector<std::string> training_info;  // serialized TrainingInfoProto, kept verbatim
  Graph graph;
  /// The external data files its initializers were read from at import (resolved paths): inputs
  /// of any command that reads the model, never to be written over.
  std::vector<std::string> external_files;

  /// The opset version imported for `domain` ("" and "ai.onnx" are the same), 0 if none.
  int64_t opset(const std::string& domain = "") const;
};

/// The ai.onnx opset versions lopper reads: 1 to the newest of the onnx release its op table
/// follows (onnx 1.23: onnx.defs.onnx_opset_version()).
constexpr int64_t kMinOpset = 1;
constexpr int64_t kMaxOpset = 28;

/// Checks what every command relies on, once, at import; throws lopper::Error with one line
/// naming the thing: an ai.onnx opset outside [kMinOpset, kMaxOpset], an initializer defined twice
/// (or both dense and sparse), a value written by two nodes, a node output that shadows a graph
/// input or initializer, a node input that names no value (subgraphs see enclosing scopes), and a
/// cycle (naming the nodes on it).
void validate(const Model& model);

}  // namespace lopper::ir
