#include "kernels/cpu/pool.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <vector>

#include "kernels/cpu/bf16.h"
#include "kernels/cpu/conv.h"
#include "kernels/cpu/conv_isa.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/sparse.h"

// NOTE: GCC 12's own AVX-512 headers start from deliberately undefined vectors (as vec_impl.h).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace lopper::kernels::cpu {

namespace {

// Max pooling of bfloat16 output rows [row0, row1): each tap's channels widened to float (exact),
// compared, and the winner's bits stored back (exact too; a NaN stays the same NaN).
// NOTE: plain loops the compiler vectorises, one build per ISA: the kernel of CPUs without
// AVX-512 BW (max_pool_bf16_rows_avx512 below otherwise).
__attribute__((target_clones("arch=x86-64-v4", "avx2", "default"))) void max_pool_bf16_rows(
    const uint16_t* x, uint16_t* y, const ConvShape& s, int64_t row0, int64_t row1) {
  constexpr int64_t kChunk = 64;
  float m[kChunk];
  for (int64_t row = row0; row < row1; ++row) {
    const int64_t n = row / s.oh, oy = row % s.oh;
    const auto [i0, i1] = taps_inside(oy * s.sh - s.ph, s.kh, s.dh, s.h);
    for (int64_t ox = 0; ox < s.ow; ++ox) {
      const auto [j0, j1] = taps_inside(ox * s.sw - s.pw, s.kw, s.dw, s.w);
      uint16_t* yp = y + ((n * s.oh + oy) * s.ow + ox) * s.c;
      for (int64_t c0 = 0; c0 < s.c; c0 += kChunk) {
        const int64_t kn = std::min(kChunk, s.c - c0);
        for (int64_t k = 0; k < kn; ++k) m[k] = -__builtin_inff();
        for (int64_t i = i0; i < i1; ++i) {
          const uint16_t* xr = x + (n * s.h + oy * s.sh - s.ph + i * s.dh) * s.w * s.c + c0;
          for (int64_t j = j0; j < j1; ++j) {
            const uint16_t* xp = xr + (ox * s.sw - s.pw + j * s.dw) * s.c;
            for (int64_t k = 0; k < kn; ++k) {
              const float v = from_bf16(xp[k]);
              m[k] = (v > m[k] || v != v) ? v : m[k];
            }
          }
        }
        for (int64_t k = 0; k < kn; ++k) yp[c0 + k] = uint16_t(std::bit_cast<uint32_t>(m[k]) >> 16);
      }
    }
  }
}

// The same with AVX-512 (BW for the 16-bit lanes): 64 channels a step held in four vectors across
// the window's taps, each tap's 16 channels widened by a zero-extend and a shift, the winner kept
// by a compare mask (greater, or NaN: the loop above's rule, so the same NaN wins), and its top 16
// bits stored. GCC's build of the loop above kept the 64 maxima in memory between taps: ResNet's
// 3x3/2 pool of 112x112x64 took 0.11 ms in the model against OpenVINO's 0.06.
// A layer of fewer channels (what structured pruning leaves: DenseNet's 32 after its first layer)
// runs as few vectors as they fill: with four for 32 channels, half the loads and compares were
// of masked-off lanes.
template <int kVectors>
__attribute__((target("avx512f,avx512bw,avx512vl"))) void max_pool_bf16_rows_avx512(
    const uint16_t* x, uint16_t* y, const ConvShape& s, int64_t row0, int64_t row1) {
  for (int64_t row = row0; row < row1; ++row) {
    const int64_t n = row / s.oh, oy = row % s.oh;
    const auto [i0, i1] = taps_inside(oy * s.sh - s.ph, s.kh, s.dh, s.h);
    for (int64_t ox = 0; ox < s.ow; ++ox) {
      const auto [j0, j1] = taps_inside(ox * s.sw - s.pw, s.kw, s.dw, s.w);
      uint16_t* yp = y + ((n * s.oh + oy) * s.ow + ox) * s.c;
      for (int64_t c0 = 0; c0 < s.c; c0 += 16 * kVectors) {
        __mmask16 lanes[kVectors];
        __m512 m[kVectors];
        for (int v = 0; v < kVectors; ++v) {
          const int64_t left = std::clamp<int64_t>(s.c - c0 - 16 * v, 0, 16);
          lanes[v] = static_cast<__mmask16>((1u << left) - 1u);
          m[v] = _mm512_set1_ps(-__builtin_inff());
        }
        for (int64_t i = i0; i < i1; ++i) {
          const uint16_t* xr = x + (n * s.h + oy * s.sh - s.ph + i * s.dh) * s.w * s.c + c0;
          for (int64_t j = j0; j < j1; ++j) {
            const uint16_t* xp = xr + (ox * s.sw - s.pw + j * s.dw) * s.c;
            for (int v = 0; v < kVectors; ++v) {
              const __m256i h = _mm256_maskz_loadu_epi16(lanes[v], xp + 16 * v);
              const __m512 val =
                  _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
              const __mmask16 take = _mm512_cmp_ps_mask(val, m[v], _CMP_GT_OQ) |
                                     _mm512_cmp_ps_mask(val, val, _CMP_UNORD_Q);
              m[v] = _mm512_mask_mov_ps(m[v], take, val);
            }
          }
        }
        for (int v = 0; v < kVectors; ++v)
          _mm256_mask_storeu_epi16(
              yp + c0 + 16 * v, lanes[v],
              _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(m[v]), 16)));
      }
    }
  }
}

bool avx512bw() {
  static const bool has = isa_supported(Isa::kAvx512) && __builtin_cpu_supports("avx512bw");
  return has;
}

}  // namespace

at::Tensor max_pool2d_nhwc(const at::Tensor& x, at::IntArrayRef kernel, at::IntArrayRef stride,
                           at::IntArrayRef pad_begin, at::IntArrayRef dilation,
                           at::IntArrayRef out_size, Isa isa) {
  const int64_t n = x.size(0), c = x.size(1), h = x.size(2), w = x.size(3);
  const int64_t kh = kernel[0], kw = kernel[1], sh = stride[0], sw = stride[1];
  const int64_t ph = pad_begin[0], pw = pad_begin[1], dh = dilation[0], dw = dilation[1];
  const int64_t oh = out_size[0], ow = out_size[1];
  at::Tensor xc = channels_last_layout(x);
  at::Tensor y = at::empty({n, c, std::max<int64_t>(oh, 0), std::max<int64_t>(ow, 0)},
                           x.options().memory_format(at::MemoryFormat::ChannelsLast));
  if (y.numel() == 0) return y;
  ConvShape s;
  s.n = n, s.c = s.k = c, s.h = h, s.w = w, s.oh = oh, s.ow = ow;
  s.kh = kh, s.kw = kw, s.sh = sh, s.sw = sw, s.ph = ph, s.pw = pw, s.dh = dh, s.dw = dw;
  if (x.scalar_type() == at::kBFloat16) {
    const auto* in = reinterpret_cast<const uint16_t*>(xc.data_ptr());
    auto* out = reinterpret_cast<uint16_t*>(y.data_ptr());
    const bool wide = isa == Isa::kAvx512 && avx512bw();
    parallel_steal(n * oh, steal_grain(n * oh), [&](int64_t begin, int64_t end) {
      if (wide && c <= 16)
        max_pool_bf16_rows_avx512<1>(in, out, s, begin, end);
      else if (wide && c <= 32)
        max_pool_bf16_rows_avx512<2>(in, out, s, begin, end);
      else if (wide && c <= 48)
        max_pool_bf16_rows_avx512<3>(in, out, s, begin, end);
      else if (wide)
        max_pool_bf16_rows_avx512<4>(in, out, s, begin, end);
      else
        max_pool_bf16_rows(in, out, s, begin, end);
    });
    return y;
  }
  const ConvIsaOps& ops = conv_isa_ops(isa);
  const float* in = xc.data_ptr<float>();
  float* out = y.data_ptr<float>();
  // One task per output row (n, oy); channels a vector at a time.
  parallel_steal(n * oh, steal_grain(n * oh),
                 [&](int64_t begin, int64_t end) { ops.max_pool(in, out, s, begin, end); });
  return y;
}

namespace {

inline float widen(float v) { return v; }
inline float widen(uint16_t v) { return from_bf16(v); }
inline void narrow(float v, float* out) { *out = v; }
inline void narrow(float v, uint16_t* out) { *out = to_bf16(v); }

template <class T>
void mean_over_pixels(const at::Tensor& x, at::Tensor& y) {
  const int64_t n = x.size(0), ch = x.size(1), rows = x.size(2), cols = x.size(3);
  const T* xp = reinterpret_cast<const T*>(x.data_ptr());
  T* yp = reinterpret_cast<T*>(y.data_ptr());
  constexpr int64_t kChunk = 64;  // channels per piece of work
  const int64_t chunks = (ch + kChunk - 1) / kChunk;
  // A large map of few channels (a squeeze-and-excitation block's early in a network: 112x112x32)
  // is one or two pieces: its rows are split into parts too, each summed on its own, the parts'
  // sums added after.
  const int64_t pieces = n * chunks, threads = at::get_num_threads();
  const int64_t parts = pieces < threads && rows * cols * ch >= (1 << 16)
                            ? std::min<int64_t>(rows, (2 * threads + pieces - 1) / pieces)
                            : 1;
  std::vector<double> sums(static_cast<size_t>(pieces * parts * kChunk));
  at::parallel_for(0, pieces * parts, 1, [&](int64_t t0, int64_t t1) {
    std::vector<float> row(kChunk);
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t piece = t / parts, part = t % parts;
      const int64_t img = piece / chunks, k0 = piece % chunks * kChunk;
      const int64_t kn = std::min(kChunk, ch - k0);
      double* total = sums.data() + t * kChunk;
      for (int64_t r = rows * part / parts; r < rows * (part + 1) / parts; ++r) {
        std::fill(row.begin(), row.end(), 0.f);
        const T* p = xp + ((img * rows + r) * cols) * ch + k0;
        for (int64_t q = 0; q < cols; ++q, p += ch)
          for (int64_t k = 0; k < kn; ++k) row[k] += widen(p[k]);
        for (int64_t k = 0; k < kn; ++k) total[k] += row[k];
      }
    }
  });
  for (int64_t piece = 0; piece < pieces; ++piece) {
    const int64_t img = piece / chunks, k0 = piece % chunks * kChunk;
    for (int64_t k = 0; k < std::min(kChunk, ch - k0); ++k) {
      double total = 0;
      for (int64_t part = 0; part < parts; ++part)
        total += sums[(piece * parts + part) * kChunk + k];
      narrow(static_cast<float>(total / double(rows * cols)), yp + img * ch + k0 + k);
    }
  }
}

}  // namespace

at::Tensor mean_over_pixels_nhwc(const at::Tensor& x) {
  at::Tensor y = at::empty({x.size(0), x.size(1), 1, 1}, x.options());
  if (x.scalar_type() == at::kBFloat16)
    mean_over_pixels<uint16_t>(x, y);
  else
    mean_over_pixels<float>(x, y);
  return y;
}

}  // namespace lopper::kernels::cpu
