// The sparse GEMV kernel: one warp per output row. Each lane reads kVec consecutive values and
// kVec indices with one vector load each (the warp reads 32 x kVec entries, coalesced), gathers x,
// and accumulates in fp32 for every batch row at once; a shuffle reduction ends the row. The
// loop is unrolled twice so each lane keeps two weight loads in flight: at 90% sparsity a row of
// 8192 inputs is ~7 steps, bound by memory latency more than by bandwidth.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernels/cuda/convert.cuh"
#include "kernels/cuda/sparse_gemv.h"
#include "lopper/error.h"

namespace lopper::kernels::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;

// kVec values from an address aligned to kVec elements, as floats.
__device__ __forceinline__ void load_vals(const float* v, float w[kVec]) {
  const float4 q = __ldg(reinterpret_cast<const float4*>(v));
  w[0] = q.x, w[1] = q.y, w[2] = q.z, w[3] = q.w;
}
__device__ __forceinline__ void load_vals(const __half* v, float w[kVec]) {
  const uint2 q = __ldg(reinterpret_cast<const uint2*>(v));
  const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&q.x));
  const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&q.y));
  w[0] = a.x, w[1] = a.y, w[2] = b.x, w[3] = b.y;
}
__device__ __forceinline__ void load_vals(const __nv_bfloat16* v, float w[kVec]) {
  const uint2 q = __ldg(reinterpret_cast<const uint2*>(v));
  const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&q.x));
  const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&q.y));
  w[0] = a.x, w[1] = a.y, w[2] = b.x, w[3] = b.y;
}
// kVec 16-bit column indices (little-endian: the first in the low half of each word).
__device__ __forceinline__ void load_cols(const uint16_t* c, uint32_t col[kVec]) {
  const uint2 q = __ldg(reinterpret_cast<const uint2*>(c));
  col[0] = q.x & 0xffffu, col[1] = q.x >> 16, col[2] = q.y & 0xffffu, col[3] = q.y >> 16;
}
static_assert(kVec == 4, "load_vals and load_cols read 4 entries");

// M: the batch rows rounded up to a power of two (registers), `m` the real count.
template <typename T, int M>
__global__ void __launch_bounds__(kWarpsPerBlock * 32) sparse_gemv_kernel(SparseGemvParams p) {
  const int lane = threadIdx.x & 31;
  const int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (row >= p.n) return;
  const T* val = static_cast<const T*>(p.val);
  const T* x = static_cast<const T*>(p.x);
  float acc[M];
#pragma unroll
  for (int m = 0; m < M; ++m) acc[m] = 0.f;
  const int32_t j1 = p.row_ptr[row + 1];
#pragma unroll 2
  for (int32_t j = p.row_ptr[row] + lane * kVec; j < j1; j += 32 * kVec) {
    float w[kVec];
    uint32_t c[kVec];
    load_vals(val + j, w);
    load_cols(p.col + j, c);
#pragma unroll
    for (int v = 0; v < kVec; ++v)
#pragma unroll
      for (int m = 0; m < M; ++m)
        if (m < p.m) acc[m] += w[v] * to_float(__ldg(x + m * p.ldx + c[v]));
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
  for_dtype(p.dtype, [&](auto t) { launch_typed<decltype(t)>(p, s); });
  check_launch("sparse gemv");
}

}  // namespace lopper::kernels::cuda
