// lopper's own CUDA kernels, ATen-facing (internal). Every argument check is here
// (sparse_cuda.cpp); the kernels take plain parameter structs (sparse_gemv.h).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

#include "kernels/cuda/library.h"
#include "kernels/cuda/sparse_gemv.h"

namespace lopper::kernels::cuda {

/// Waits for the current device's work (timing kernel candidates on a GPU).
void synchronize();

/// "GPU <name> sm_<major><minor>" of CUDA device `index` (keys the kernel-choice cache).
std::string device_name(int index);

/// An unstructured-sparse weight for skinny batches on the GPU: CSR with 16-bit column indices,
/// values, x, bias and y in one dtype (fp32, fp16 or bf16).
class SparseWeightCuda : public PackedLinear {
 public:
  /// True when w ([n, k], k <= 65536) can be packed.
  static bool fits(const at::Tensor& w);

  /// Packs w [n, k] and bias [n] (optional) from any device into `dtype` on `device`.
  SparseWeightCuda(const at::Tensor& w, const at::Tensor& bias, at::ScalarType dtype,
                   at::Device device);

  /// y [m, n] = x [m, k] . w^T + bias for x on the weight's device in its dtype (rows with a
  /// contiguous inner dim); batches over 16 rows run 16 at a time.
  at::Tensor linear(const at::Tensor& x) const override;

  int64_t nonzeros() const { return nnz_; }
  /// The packed arrays (on the device): row offsets (int32), column indices (int16 bits of the
  /// uint16 index), values; each row zero-padded to a multiple of kVec entries.
  const at::Tensor& row_ptr() const { return ptr_; }
  const at::Tensor& col() const { return col_; }
  const at::Tensor& values() const { return val_; }

 private:
  at::Tensor ptr_, col_, val_, bias_;
  int64_t n_ = 0, k_ = 0, nnz_ = 0;
  at::ScalarType dtype_;
};

}  // namespace lopper::kernels::cuda
