// The max-pooling kernel. Channels-last: one thread per output pixel and 16-byte vector of
// channels (4 fp32 or 8 fp16/bf16), so a warp reads whole rows of channels at each tap, coalesced;
// channel counts that are not a multiple of the vector, and NCHW, take one element per thread in
// the output's memory order. No indices are written.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/cuda/convert.cuh"
#include "kernels/cuda/pool.h"
#include "lopper/error.h"

namespace lopper::kernels::cuda {
namespace {

constexpr int kThreads = 256;

// NaN wins, as in ATen and ONNX's reference.
__device__ __forceinline__ float max_nan(float m, float v) { return (v > m || isnan(v)) ? v : m; }

// Channels-last, V = 16 / sizeof(T) channels per thread; c is a multiple of V and x, y are
// 16-byte aligned.
template <typename T>
__global__ void __launch_bounds__(kThreads) max_pool_nhwc_vec(MaxPool2dParams p) {
  constexpr int V = 16 / sizeof(T);
  const int64_t cv = p.c / V;
  const int64_t total = p.n * p.oh * p.ow * cv;
  const T* x = static_cast<const T*>(p.x);
  T* y = static_cast<T*>(p.y);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t v = i % cv;
    int64_t r = i / cv;
    const int64_t ox = r % p.ow;
    r /= p.ow;
    const int64_t oy = r % p.oh;
    const int64_t n = r / p.oh;
    float m[V];
#pragma unroll
    for (int e = 0; e < V; ++e) m[e] = -INFINITY;
    const int64_t y0 = oy * p.sh - p.ph, x0 = ox * p.sw - p.pw;
    for (int a = 0; a < p.kh; ++a) {
      const int64_t iy = y0 + int64_t(a) * p.dh;
      if (iy < 0 || iy >= p.h) continue;
      const T* row = x + ((n * p.h + iy) * p.w) * p.c + v * V;
      for (int b = 0; b < p.kw; ++b) {
        const int64_t ix = x0 + int64_t(b) * p.dw;
        if (ix < 0 || ix >= p.w) continue;
        const uint4 q = __ldg(reinterpret_cast<const uint4*>(row + ix * p.c));
        const T* t = reinterpret_cast<const T*>(&q);
#pragma unroll
        for (int e = 0; e < V; ++e) m[e] = max_nan(m[e], to_float(t[e]));
      }
    }
    uint4 out;
    T* o = reinterpret_cast<T*>(&out);
#pragma unroll
    for (int e = 0; e < V; ++e) o[e] = from_float<T>(m[e]);
    *reinterpret_cast<uint4*>(y + ((n * p.oh + oy) * p.ow + ox) * p.c + v * V) = out;
  }
}

// One output element per thread, in the output's memory order (NCHW or NHWC).
template <typename T, bool kChannelsLast>
__global__ void __launch_bounds__(kThreads) max_pool_scalar(MaxPool2dParams p) {
  const int64_t total = p.n * p.c * p.oh * p.ow;
  const T* x = static_cast<const T*>(p.x);
  T* y = static_cast<T*>(p.y);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    int64_t r = i, c, ox, oy;
    if (kChannelsLast) {
      c = r % p.c, r /= p.c;
      ox = r % p.ow, r /= p.ow;
      oy = r % p.oh, r /= p.oh;
    } else {
      ox = r % p.ow, r /= p.ow;
      oy = r % p.oh, r /= p.oh;
      c = r % p.c, r /= p.c;
    }
    const int64_t n = r;
    // Element (n, c, iy, ix) of x.
    const int64_t sx = kChannelsLast ? p.c : 1;
    const int64_t base = kChannelsLast ? n * p.h * p.w * p.c + c : (n * p.c + c) * p.h * p.w;
    float m = -INFINITY;
    const int64_t y0 = oy * p.sh - p.ph, x0 = ox * p.sw - p.pw;
    for (int a = 0; a < p.kh; ++a) {
      const int64_t iy = y0 + int64_t(a) * p.dh;
      if (iy < 0 || iy >= p.h) continue;
      for (int b = 0; b < p.kw; ++b) {
        const int64_t ix = x0 + int64_t(b) * p.dw;
        if (ix < 0 || ix >= p.w) continue;
        m = max_nan(m, to_float(__ldg(x + base + (iy * p.w) * sx + ix * sx)));
      }
    }
    y[i] = from_float<T>(m);
  }
}

template <typename T>
void launch_typed(const MaxPool2dParams& p, cudaStream_t stream) {
  constexpr int V = 16 / sizeof(T);
  const bool vec = p.channels_last && p.c % V == 0 && reinterpret_cast<uintptr_t>(p.x) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(p.y) % 16 == 0;
  const int64_t work = p.n * p.oh * p.ow * (vec ? p.c / V : p.c);
  // Grid-stride loops: enough blocks to fill the GPU several times over, no more.
  const int64_t blocks = std::min<int64_t>((work + kThreads - 1) / kThreads, 65536);
  if (vec)
    max_pool_nhwc_vec<T><<<blocks, kThreads, 0, stream>>>(p);
  else if (p.channels_last)
    max_pool_scalar<T, true><<<blocks, kThreads, 0, stream>>>(p);
  else
    max_pool_scalar<T, false><<<blocks, kThreads, 0, stream>>>(p);
}

}  // namespace

void launch_max_pool2d(const MaxPool2dParams& p, void* stream) {
  if (p.n * p.c * p.oh * p.ow == 0) return;
  const auto s = static_cast<cudaStream_t>(stream);
  for_dtype(p.dtype, [&](auto t) { launch_typed<decltype(t)>(p, s); });
  check_launch("max pool");
}

}  // namespace lopper::kernels::cuda
