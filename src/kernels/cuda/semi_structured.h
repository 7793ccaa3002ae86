// 2:4 semi-structured sparsity on the GPU's sparse tensor cores (internal): a weight with at most
// two nonzeros in every four consecutive inputs is compressed to half its values plus metadata and
// multiplied by the linked libtorch's semi-structured ops — cuSPARSELt (_cslt_compress,
// _cslt_sparse_mm) or CUTLASS (_to_sparse_semi_structured, _sparse_semi_structured_mm). Only the
// arguments both PyTorch 2.11 and 2.14 share are passed.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "kernels/cuda/library.h"  // PackedLinear, SemiBackend, semi_name()

namespace lopper::kernels::cuda {

/// True when w [n, k] (any device) has at most 2 nonzeros in every group of 4 consecutive
/// inputs (k a multiple of 4) and at least one nonzero.
bool is_two_four(const at::Tensor& w);

/// True when the sparse tensor cores take w [n, k] in `dtype`: w is 2:4, dtype fp16 or bf16, and
/// k a multiple of 64 (the output count is padded to 32 inside).
bool semi_fits(const at::Tensor& w, at::ScalarType dtype);

/// True when this libtorch was compiled with `b` (cuSPARSELt is optional in a build).
bool semi_compiled(SemiBackend b);

/// A 2:4 weight compressed for one backend on one GPU.
class SemiStructuredWeight : public PackedLinear {
 public:
  /// Compresses w [n, k] and bias [n] (optional) from any device; throws lopper::Error when w
  /// does not fit or the backend refuses it (no such library, an unsupported GPU).
  SemiStructuredWeight(SemiBackend backend, const at::Tensor& w, const at::Tensor& bias,
                       at::ScalarType dtype, at::Device device);

  /// y [m, n] = x [m, k] . w^T + bias for x on the weight's device in its dtype. The batch is
  /// padded to a multiple of 8 rows when it is not one.
  at::Tensor linear(const at::Tensor& x) const override;

  SemiBackend backend() const { return backend_; }

 private:
  SemiBackend backend_;
  at::Tensor packed_, meta_, bias_;
  int64_t n_ = 0, n_pad_ = 0, k_ = 0;
  at::ScalarType dtype_;
  // cuSPARSELt's algorithm for each padded batch size, found by its own search (timed runs) on
  // the first product of that size, when batch, outputs and inputs are all >= kSearchMin: its
  // default algorithm is slower than cuBLAS on a Hopper.
  static constexpr int64_t kSearchMin = 2048;
  mutable std::mutex alg_mutex_;
  mutable std::map<int64_t, int64_t> alg_;
};

}  // namespace lopper::kernels::cuda
