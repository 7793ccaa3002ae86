// The sparse GEMV kernel: one warp per output row. The lanes walk the row's nonzeros 32 apart
// (coalesced reads of values and indices), gather x, and accumulate in fp32 for every batch row
// at once; a shuffle reduction ends the row.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernels/cuda/sparse_gemv.h"
#include "lopper/error.h"

namespace lopper::kernels::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// M: the batch rows rounded up to a power of two (registers), `m` the real count.
template <typename T, int M>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    sparse_gemv_kernel(SparseGemvParams p) {
  const int lane = threadIdx.x & 31;
  const int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (row >= p.n) return;
  const T* val = static_cast<const T*>(p.val);
  const T* x = static_cast<const T*>(p.x);
  float acc[M];
#pragma unroll
  for (int m = 0; m < M; ++m) acc[m] = 0.f;
  const int32_t j1 = p.row_ptr[row + 1];
  for (int32_t j = p.row_ptr[row] + lane; j < j1; j += 32) {
    const float w = to_float(val[j]);
    const int64_t c = p.col[j];
#pragma unroll
    for (int m = 0; m < M; ++m)
      if (m < p.m) acc[m] += w * to_float(__ldg(x + m * p.ldx + c));
  }
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) acc[m] += __shfl_xor_sync(0xffffffffu, acc[m], off);
  if (lane == 0) {
    const float b = p.bias ? to_float(static_cast<const T*>(p.bias)[row]) : 0.f;
    T* y = static_cast<T*>(p.y);
#pragma unroll
    for (int m = 0; m < M; ++m)
      if (m < p.m) y[m * p.ldy + row] = from_float<T>(acc[m] + b);
  }
}

template <typename T>
void launch_typed(const SparseGemvParams& p, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((p.n + kWarpsPerBlock - 1) / kWarpsPerBlock));
  const dim3 block(kWarpsPerBlock * 32);
  if (p.m <= 1) {
    sparse_gemv_kernel<T, 1><<<grid, block, 0, stream>>>(p);
  } else if (p.m <= 2) {
    sparse_gemv_kernel<T, 2><<<grid, block, 0, stream>>>(p);
  } else if (p.m <= 4) {
    sparse_gemv_kernel<T, 4><<<grid, block, 0, stream>>>(p);
  } else if (p.m <= 8) {
    sparse_gemv_kernel<T, 8><<<grid, block, 0, stream>>>(p);
  } else {
    sparse_gemv_kernel<T, 16><<<grid, block, 0, stream>>>(p);
  }
}

}  // namespace

bool built() { return true; }

void launch_sparse_gemv(const SparseGemvParams& p, void* stream) {
  LOPPER_CHECK(p.m >= 1 && p.m <= kMaxRows, "[cuda] sparse gemv takes 1..", kMaxRows,
               " batch rows, got ", p.m);
  if (p.n == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  switch (p.dtype) {
    case DType::kFloat16: launch_typed<__half>(p, s); break;
    case DType::kBFloat16: launch_typed<__nv_bfloat16>(p, s); break;
    default: launch_typed<float>(p, s); break;
  }
  const cudaError_t err = cudaGetLastError();
  LOPPER_CHECK(err == cudaSuccess, "[cuda] sparse gemv launch failed: ", cudaGetErrorString(err));
}

}  // namespace lopper::kernels::cuda
