// Reading and writing ONNX files. Models are untrusted input: every size is checked against the
// bytes present, and external data must stay inside the model's folder.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "lopper/graph.h"

namespace lopper {}

namespace lopper::onnx {

/// Reads an ONNX model. External data is resolved relative to the model's folder.
ir::Model load_model(const std::string& path);

/// Parses an ONNX model from memory. `base_dir` is where external data lives; when empty, a model
/// that references external data is refused.
ir::Model parse_model(const void* data, size_t size, const std::string& base_dir = "");

struct SaveOptions {
  enum class Sparse { kKeep, kAll, kNone };
  /// kKeep writes tensors that came as sparse_initializer the same way; kAll stores every
  /// initializer that is smaller that way (values + int64 indices: past 2/3 zeros for fp32) as
  /// sparse_initializer; kNone stores all dense.
  Sparse sparse = Sparse::kKeep;
  /// Write initializers to "<model file>.data" beside the model. Forced on when the initializers
  /// would push the model past protobuf's 2 GB limit.
  bool external_data = false;
  /// Tensors smaller than this stay inside the model when writing external data.
  size_t external_min_bytes = 1024;
};

/// Writes a model. The file (and its external data) is written to a temporary name in the same
/// folder and renamed, so a failure never leaves a partial model.
void save_model(const ir::Model& model, const std::string& path, const SaveOptions& opts = {});

/// Serializes a model to bytes (no external data).
std::string serialize_model(const ir::Model& model);

/// Reads one serialized TensorProto (the format of ONNX's test_data_set_*/input_*.pb files).
at::Tensor load_tensor_pb(const std::string& path);
/// Writes one TensorProto file.
void save_tensor_pb(const at::Tensor& t, const std::string& path, const std::string& name = "");

/// ONNX element type <-> ATen scalar type. Throws lopper::Error for types ATen cannot hold.
c10::ScalarType to_scalar_type(ir::DType t);
ir::DType to_dtype(c10::ScalarType t);

}  // namespace lopper::onnx
