// Reading and writing ONNX files. Models are untrusted input: every size is checked against the
// bytes present, and external data must stay inside the model's folder.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "lopper/graph.h"

namespace lopper {
class OutputFiles;  // lopper/files.h
}

namespace lopper::onnx {

/// Reads an ONNX model. External data is resolved relative to the model's folder.
ir::Model load_model(const std::string& path);

/// A model's external data, copied and mapped into memory (LoadOptions::external_copy): the
/// initializers are views of the copy, read from disk as they are used, written back to it by the
/// kernel when changed, and dropped from memory by release(). What bounds a big model's memory.
class MappedData {
 public:
  MappedData(const std::string& path, size_t size);  // maps `path` (shared, writable)
  ~MappedData();
  MappedData(const MappedData&) = delete;
  MappedData& operator=(const MappedData&) = delete;

  const std::string& path() const { return path_; }
  /// The offset in the file of the bytes `t` views, or -1 when it views none of it.
  int64_t offset_of(const at::Tensor& t) const;
  /// Drops the pages in memory (the data stays in the file; the next read brings them back).
  void release() const;
  char* data() const { return static_cast<char*>(base_); }
  size_t size() const { return size_; }

 private:
  std::string path_;
  void* base_ = nullptr;
  size_t size_ = 0;
};

/// When `t` views a live MappedData, drops the pages of its bytes from memory (they stay in the
/// file); otherwise does nothing. For a pass over every weight of a mapped model (counting zeros)
/// that must not leave the whole model resident.
void drop_pages(const at::Tensor& t);

struct LoadOptions {
  /// Where to copy the model's one external data file (asked when the model turns out to have
  /// one): the copy is mapped and the initializers stored there view it (MappedData) instead of
  /// being read into memory; writing to them writes the copy, never the model's own file. Unset:
  /// external data is read as usual, as is the data of any other file of a model split over
  /// several.
  std::function<std::string()> external_copy;
};

/// load_model() with options; `mapped` receives the mapping (null when nothing was mapped: the
/// model has no external data).
ir::Model load_model(const std::string& path, const LoadOptions& opts,
                     std::shared_ptr<MappedData>* mapped);

/// Parses an ONNX model from memory. `base_dir` is where external data lives; when empty, a model
/// that references external data is refused.
ir::Model parse_model(const void* data, size_t size, const std::string& base_dir = "");

/// parse_model() of a graph whose initializers `initializers` (name -> value, in order, after
/// those the bytes hold) come as tensors: a caller that holds the weights (a module's parameters)
/// hands them over without serializing them. They are copied, never written through.
ir::Model parse_model(const void* data, size_t size,
                      const std::vector<std::pair<std::string, at::Tensor>>& initializers);

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
  /// Initializers that still view this mapped external data (LoadOptions::external_copy) are
  /// written as references to it, under the name `mapped_location` (the data file's final name,
  /// beside the model); the others are written inside the model.
  std::shared_ptr<const MappedData> mapped;
  std::string mapped_location;
};

/// Writes a model. The file (and its external data) is written to a temporary name in the same
/// folder and renamed, so a failure never leaves a partial model.
void save_model(const ir::Model& model, const std::string& path, const SaveOptions& opts = {});

/// save_model() as part of a command's outputs: the model (and "<path>.data") are staged in
/// `files` and appear only when the caller commits them. An external data file that is one of
/// `files`' inputs (another model's data) is refused.
void save_model(const ir::Model& model, const std::string& path, const SaveOptions& opts,
                OutputFiles& files);

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
