// TensorProto <-> at::Tensor, shared by import and export (internal).
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <map>
#include <set>
#include <string>

#include "lopper/onnx_io.h"
#include "onnx.pb.h"

namespace lopper::onnx {

/// Where external data may be read from; empty base_dir refuses external data.
struct ExternalDataContext {
  std::string base_dir;
  /// Bytes that sparse tensors may still expand to, model-wide: a sparse tensor's dims are not
  /// backed by bytes in the file, so without a budget a few bytes could ask for terabytes of zeros.
  /// parse_model sets it from the model's size; tensor_from_sparse_proto spends it.
  mutable int64_t sparse_budget = int64_t(1) << 28;
  /// When set, every external data file read is added here (resolved paths).
  std::set<std::string>* files = nullptr;
  /// LoadOptions::external_copy: where the external data file is copied and mapped.
  std::function<std::string()> copy_to;
  mutable std::shared_ptr<MappedData> mapped;  // the mapping of copy_to, once made
  mutable std::string mapped_source;           // the external data file it copies
  /// The byte ranges read so far, per external data file: offset -> (end, tensor), so that two
  /// tensors whose bytes overlap are refused (pruning one would change the other).
  mutable std::map<std::string, std::map<uint64_t, std::pair<uint64_t, std::string>>> ranges;
};

/// The sparse budget of a model of `model_bytes` bytes: 256 MiB, or 1024 times the model's size
/// (a 99.9%-sparse tensor in COO form expands ~333 times) when that is larger.
int64_t sparse_budget_for(size_t model_bytes);

/// Converts a TensorProto to a CPU tensor, checking every size against the bytes present.
/// `what` names the tensor in errors ("initializer 'w'").
at::Tensor tensor_from_proto(const lopper_onnx::TensorProto& p, const ExternalDataContext& ctx,
                             const std::string& what);
/// The same, but a large tensor takes over p's raw_data buffer instead of copying it (p's raw data
/// is left empty).
at::Tensor take_tensor_from_proto(lopper_onnx::TensorProto& p, const ExternalDataContext& ctx,
                                  const std::string& what);
/// Fills `p`'s dims and data_type from a tensor, no data.
void tensor_meta_to_proto(const at::Tensor& t, lopper_onnx::TensorProto* p);

/// Converts a SparseTensorProto to a dense CPU tensor.
at::Tensor tensor_from_sparse_proto(const lopper_onnx::SparseTensorProto& p,
                                    const ExternalDataContext& ctx, const std::string& what);

/// Fills `p` (dims, data_type, raw_data) from a tensor; name is left to the caller.
void tensor_to_proto(const at::Tensor& t, lopper_onnx::TensorProto* p);

/// Fills a SparseTensorProto (COO, linear int64 indices) holding t's nonzeros.
void tensor_to_sparse_proto(const at::Tensor& t, const std::string& name,
                            lopper_onnx::SparseTensorProto* p);

}  // namespace lopper::onnx
