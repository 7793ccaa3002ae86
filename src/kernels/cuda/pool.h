// 2-D max pooling on the GPU (internal, plain C++: included by the .cu kernel and by its
// ATen-facing API, pool_cuda.cpp). Values only: ATen's CUDA max_pool2d always writes int64 argmax
// indices as well, which inference never reads (on ResNet-50's 3x3/2 pool of a [64, 64, 112, 112]
// map, the indices are as many bytes as the output twice over).
#pragma once

#include <cstdint>

#include "kernels/cuda/sparse_gemv.h"  // DType, built()

namespace lopper::kernels::cuda {

struct MaxPool2dParams {
  DType dtype = DType::kFloat32;  // of x and y alike
  bool channels_last = false;     // x and y NHWC in memory, else NCHW; both dense
  int64_t n = 0, c = 0, h = 0, w = 0, oh = 0, ow = 0;
  int kh = 1, kw = 1, sh = 1, sw = 1, ph = 0, pw = 0, dh = 1, dw = 1;
  const void* x = nullptr;
  void* y = nullptr;
};

/// y[n, c, oy, ox] = max over the taps (oy * sh - ph + i * dh, ox * sw - pw + j * dw) that lie
/// inside x; taps outside are skipped (padding never wins; a window with no tap inside gives
/// -inf). NaN propagates. Launches on `stream` (a cudaStream_t); throws lopper::Error on a CUDA
/// error.
void launch_max_pool2d(const MaxPool2dParams& p, void* stream);

}  // namespace lopper::kernels::cuda
