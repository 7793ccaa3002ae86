// Unstructured-sparse weight x skinny activation on the GPU (internal, plain C++: included by the
// .cu kernel and by its ATen-facing API). y[m][n] = sum_k W[n][k] * x[m][k] + bias[n] for m < 16.
// The weight is CSR with 16-bit column indices: a nonzero costs 4 bytes in fp16/bf16 (6 in fp32),
// and the kernel reads each nonzero once — the LLM-decode shape is bound by reading the weight.
#pragma once

#include <cstdint>

namespace lopper::kernels::cuda {

enum class DType : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

/// The most batch rows one launch takes.
constexpr int kMaxRows = 16;

/// Every row's entries start at a multiple of kVec and number a multiple of kVec (zero-padded):
/// the kernel loads kVec values and kVec indices at a time.
constexpr int kVec = 4;

struct SparseGemvParams {
  DType dtype = DType::kFloat32;     // of values, x, bias and y alike
  int64_t n = 0, k = 0, m = 0;       // outputs, inputs (<= 65536), batch rows (1..kMaxRows)
  const int32_t* row_ptr = nullptr;  // [n + 1], multiples of kVec
  const uint16_t* col = nullptr;     // [stored], 8-byte aligned
  const void* val = nullptr;         // [stored], 8-byte (16-bit types) or 16-byte (fp32) aligned
  const void* x = nullptr;           // [m][ldx]
  int64_t ldx = 0;
  const void* bias = nullptr;  // [n] or null
  void* y = nullptr;           // [m][ldy]
  int64_t ldy = 0;
};

/// True when the .cu kernels were compiled (nvcc found); else stub/no_nvcc.cpp stands in.
bool built();

/// Launches on `stream` (a cudaStream_t); throws lopper::Error on a CUDA error.
void launch_sparse_gemv(const SparseGemvParams& p, void* stream);

}  // namespace lopper::kernels::cuda
