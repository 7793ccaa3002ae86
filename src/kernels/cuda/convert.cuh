// What lopper's CUDA kernels share (internal; included by .cu files only): fp32 / fp16 / bf16 to
// and from float in device code, the launch by element type, the launch's error check.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernels/cuda/sparse_gemv.h"  // DType
#include "lopper/error.h"

namespace lopper::kernels::cuda {

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __half from_float<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

/// Calls f(T()) with T the element type of `dtype` (float, __half or __nv_bfloat16).
template <typename F>
void for_dtype(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kFloat16:
      f(__half());
      break;
    case DType::kBFloat16:
      f(__nv_bfloat16());
      break;
    default:
      f(float());
      break;
  }
}

/// Throws lopper::Error naming `what` when the last launch failed.
inline void check_launch(const char* what) {
  const cudaError_t err = cudaGetLastError();
  LOPPER_CHECK(err == cudaSuccess, "[cuda] ", what, " launch failed: ", cudaGetErrorString(err));
}

}  // namespace lopper::kernels::cuda
