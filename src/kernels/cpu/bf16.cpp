#include "kernels/cpu/bf16.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

namespace lopper::kernels::cpu {

// NOTE: plain loops the compiler vectorises, one build per ISA.
__attribute__((target_clones("arch=x86-64-v4", "avx2", "default"))) void widen_span(
    const uint16_t* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = from_bf16(x[i]);
}

namespace {

__attribute__((target_clones("arch=x86-64-v4", "avx2", "default"))) void narrow_portable(
    const float* x, uint16_t* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = to_bf16(x[i]);
}

// NOTE: the CPU's own conversion (vcvtneps2bf16, AVX512_BF16), 16 values an instruction: 2.5x the
// portable loop's rate. It rounds to nearest even as to_bf16 does, but takes a subnormal input as
// zero and keeps a NaN's sign and payload: a vector with either goes through to_bf16 instead, so
// the result is to_bf16's bit for bit.
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) void narrow_native(const float* x,
                                                                                   uint16_t* y,
                                                                                   int64_t n) {
  const __m512 smallest = _mm512_set1_ps(1.17549435e-38f);  // FLT_MIN, the smallest normal
  const __m512 zero = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    const __m512 a = _mm512_abs_ps(v);
    // subnormal (0 < |v| < FLT_MIN) or NaN (unordered with itself)
    const __mmask16 odd =
        _mm512_mask_cmp_ps_mask(_mm512_cmp_ps_mask(a, zero, _CMP_NEQ_OQ), a, smallest, _CMP_LT_OQ) |
        _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    if (odd) {
      for (int64_t j = i; j < i + 16; ++j) y[j] = to_bf16(x[j]);
      continue;
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + i), (__m256i)_mm512_cvtneps_pbh(v));
  }
  for (; i < n; ++i) y[i] = to_bf16(x[i]);
}

}  // namespace

void narrow_span(const float* x, uint16_t* y, int64_t n) {
  static const bool native = __builtin_cpu_supports("avx512bf16") &&
                             __builtin_cpu_supports("avx512bw") &&
                             __builtin_cpu_supports("avx512vl");
  if (native)
    narrow_native(x, y, n);
  else
    narrow_portable(x, y, n);
}

namespace {

__attribute__((target_clones("arch=x86-64-v4", "avx2", "default"))) void relu_span(uint16_t* y,
                                                                                   int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t v = y[i];
    // negative (sign bit) and not NaN (exponent all ones, mantissa nonzero) -> +0
    y[i] = (v & 0x8000u) && (v & 0x7FFFu) <= 0x7F80u ? uint16_t(0) : v;
  }
}

// A value of y is a bf16 already: it is kept bit for bit or becomes a bound's rounding, chosen
// per element without a rounding in the loop, so the loop vectorises.
__attribute__((target_clones("arch=x86-64-v4", "avx2", "default"))) void clamp_span(uint16_t* y,
                                                                                    int64_t n,
                                                                                    float lo,
                                                                                    float hi) {
  const uint16_t lo_bits = to_bf16(lo), hi_bits = to_bf16(hi);
  for (int64_t i = 0; i < n; ++i) {
    const float v = from_bf16(y[i]);
    y[i] = v < lo ? lo_bits : v > hi ? hi_bits : y[i];  // NaN: both false, kept
  }
}

// Whether t's elements fill its storage span without gaps or overlap, in some order of its dims
// (contiguous, channels-last, ...): then an elementwise pass over the span converts it in place of
// the layout.
bool dense(const at::Tensor& t) { return t.is_non_overlapping_and_dense(); }

constexpr int64_t kGrain = 1 << 15;

}  // namespace

at::Tensor widen_bf16(const at::Tensor& x) {
  if (!x.defined() || x.scalar_type() != at::kBFloat16) return x;
  if (!x.device().is_cpu() || !dense(x)) return x.to(at::kFloat);
  at::Tensor y = at::empty_strided(x.sizes(), x.strides(), x.options().dtype(at::kFloat));
  const auto* xp = reinterpret_cast<const uint16_t*>(x.data_ptr());
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, x.numel(), kGrain,
                   [&](int64_t b, int64_t e) { widen_span(xp + b, yp + b, e - b); });
  return y;
}

bool relu_bf16_(const at::Tensor& y) {
  if (!y.defined() || y.scalar_type() != at::kBFloat16 || !y.device().is_cpu() || !dense(y))
    return false;
  auto* p = reinterpret_cast<uint16_t*>(y.data_ptr());
  at::parallel_for(0, y.numel(), kGrain, [&](int64_t b, int64_t e) { relu_span(p + b, e - b); });
  return true;
}

bool clamp_bf16_(const at::Tensor& y, float lo, float hi) {
  if (!y.defined() || y.scalar_type() != at::kBFloat16 || !y.device().is_cpu() || !dense(y))
    return false;
  auto* p = reinterpret_cast<uint16_t*>(y.data_ptr());
  at::parallel_for(0, y.numel(), kGrain,
                   [&](int64_t b, int64_t e) { clamp_span(p + b, e - b, lo, hi); });
  return true;
}

namespace {

// y[p][c] = x[c][p] for pixels p0 <= p < p1 of C planes of hw values: an image's few channels
// (a first layer's RGB) from planes to channels-last, T 16 or 32 bits.
template <int C, class T>
__attribute__((always_inline)) inline void interleave(const T* x, int64_t hw, T* y, int64_t p0,
                                                      int64_t p1) {
  for (int64_t p = p0; p < p1; ++p)
    for (int c = 0; c < C; ++c) y[p * C + c] = x[c * hw + p];
}

template <class T>
void interleave_any(const T* x, int64_t c, int64_t hw, T* y, int64_t p0, int64_t p1) {
  switch (c) {
    case 1:
      return interleave<1>(x, hw, y, p0, p1);
    case 2:
      return interleave<2>(x, hw, y, p0, p1);
    case 3:
      return interleave<3>(x, hw, y, p0, p1);
    default:
      return interleave<4>(x, hw, y, p0, p1);
  }
}

__attribute__((target_clones("arch=x86-64-v4", "avx2", "default"))) void interleave16(
    const uint16_t* x, int64_t c, int64_t hw, uint16_t* y, int64_t p0, int64_t p1) {
  interleave_any(x, c, hw, y, p0, p1);
}

__attribute__((target_clones("arch=x86-64-v4", "avx2", "default"))) void interleave32(
    const uint32_t* x, int64_t c, int64_t hw, uint32_t* y, int64_t p0, int64_t p1) {
  interleave_any(x, c, hw, y, p0, p1);
}

}  // namespace

at::Tensor few_channels_last(const at::Tensor& x) {
  if (!x.defined() || x.dim() != 4 || !x.device().is_cpu() || !x.is_contiguous() ||
      x.size(1) > kFewChannels || x.size(1) < 1 ||
      (x.scalar_type() != at::kFloat && x.scalar_type() != at::kBFloat16))
    return {};
  at::Tensor y = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::ChannelsLast));
  const int64_t c = x.size(1), hw = x.size(2) * x.size(3), per_image = c * hw;
  const bool wide = x.scalar_type() == at::kFloat;
  const auto* src = static_cast<const char*>(x.data_ptr());
  auto* dst = static_cast<char*>(y.data_ptr());
  for (int64_t i = 0; i < x.size(0); ++i) {
    const int64_t at_image = i * per_image * x.element_size();
    at::parallel_for(0, hw, kGrain / c, [&](int64_t p0, int64_t p1) {
      if (wide)
        interleave32(reinterpret_cast<const uint32_t*>(src + at_image), c, hw,
                     reinterpret_cast<uint32_t*>(dst + at_image), p0, p1);
      else
        interleave16(reinterpret_cast<const uint16_t*>(src + at_image), c, hw,
                     reinterpret_cast<uint16_t*>(dst + at_image), p0, p1);
    });
  }
  return y;
}

at::Tensor narrow_to_bf16(const at::Tensor& y) {
  if (!y.defined() || y.scalar_type() != at::kFloat) return y;
  if (!y.device().is_cpu() || !dense(y)) return y.to(at::kBFloat16);
  at::Tensor x = at::empty_strided(y.sizes(), y.strides(), y.options().dtype(at::kBFloat16));
  const float* yp = y.data_ptr<float>();
  auto* xp = reinterpret_cast<uint16_t*>(x.data_ptr());
  at::parallel_for(0, y.numel(), kGrain,
                   [&](int64_t b, int64_t e) { narrow_span(yp + b, xp + b, e - b); });
  return x;
}

}  // namespace lopper::kernels::cpu
