// TensorProto <-> at::Tensor, shared by import and export (internal).
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

#include "onnx.pb.h"

namespace lopper::onnx {

/// Where external data may be read from; empty base_dir refuses external data.
struct ExternalDataContext {
  std::string base_dir;
};

/// Converts a TensorProto to a CPU tensor, checking every size against the bytes present.
/// `what` names the tensor in errors ("initializer 'w'").
at::Tensor tensor_from_proto(const lopper_onnx::TensorProto& p, const ExternalDataContext& ctx,
                             const std::string& what);

/// Converts a SparseTensorProto to a dense CPU tensor.
at::Tensor tensor_from_sparse_proto(const lopper_onnx::SparseTensorProto& p,
                                    const ExternalDataContext& ctx, const std::string& what);

/// Fills `p` (dims, data_type, raw_data) from a tensor; name is left to the caller.
void tensor_to_proto(const at::Tensor& t, lopper_onnx::TensorProto* p);

/// Fills a SparseTensorProto (COO, linear int64 indices) holding t's nonzeros.
void tensor_to_sparse_proto(const at::Tensor& t, const std::string& name,
                            lopper_onnx::SparseTensorProto* p);

}  // namespace lopper::onnx
