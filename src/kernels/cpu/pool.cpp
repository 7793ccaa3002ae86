#include "kernels/cpu/pool.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <limits>

namespace lopper::kernels::cpu {

at::Tensor max_pool2d_nhwc(const at::Tensor& x, at::IntArrayRef kernel, at::IntArrayRef stride,
                           at::IntArrayRef padding, at::IntArrayRef dilation) {
  const int64_t n = x.size(0), c = x.size(1), h = x.size(2), w = x.size(3);
  const int64_t kh = kernel[0], kw = kernel[1], sh = stride[0], sw = stride[1];
  const int64_t ph = padding[0], pw = padding[1], dh = dilation[0], dw = dilation[1];
  const int64_t oh = (h + 2 * ph - dh * (kh - 1) - 1) / sh + 1;
  const int64_t ow = (w + 2 * pw - dw * (kw - 1) - 1) / sw + 1;
  at::Tensor xc = x.contiguous(at::MemoryFormat::ChannelsLast);
  at::Tensor y = at::empty({n, c, std::max<int64_t>(oh, 0), std::max<int64_t>(ow, 0)},
                           x.options().memory_format(at::MemoryFormat::ChannelsLast));
  if (y.numel() == 0) return y;
  const float* in = xc.data_ptr<float>();
  float* out = y.data_ptr<float>();
  // One task per output row (n, oy): channels are contiguous, so the inner loop vectorizes.
  at::parallel_for(0, n * oh, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t b = r / oh, oy = r % oh;
      for (int64_t ox = 0; ox < ow; ++ox) {
        float* __restrict o = out + ((b * oh + oy) * ow + ox) * c;
        for (int64_t k = 0; k < c; ++k) o[k] = -std::numeric_limits<float>::infinity();
        for (int64_t i = 0; i < kh; ++i) {
          const int64_t iy = oy * sh - ph + i * dh;
          if (iy < 0 || iy >= h) continue;
          for (int64_t j = 0; j < kw; ++j) {
            const int64_t ix = ox * sw - pw + j * dw;
            if (ix < 0 || ix >= w) continue;
            const float* __restrict p = in + ((b * h + iy) * w + ix) * c;
            // (v != v) is NaN: it propagates, as in ONNX's reference; written so that it
            // vectorizes.
            for (int64_t k = 0; k < c; ++k) {
              const float v = p[k], m = o[k];
              const bool take = (v > m) | (v != v);
              o[k] = take ? v : m;
            }
          }
        }
      }
    }
  });
  return y;
}

}  // namespace lopper::kernels::cpu
