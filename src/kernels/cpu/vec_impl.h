// Vector types over which the CPU kernels are written once and compiled per ISA (internal): the
// including file defines LOPPER_SPARSE_ISA (0 scalar, 1 AVX2 + FMA, 2 AVX-512) and is compiled with
// the matching -m flags. Everything here has internal linkage.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/bf16_bits.h"
#include "kernels/cpu/epilogue.h"

#if LOPPER_SPARSE_ISA > 0
#include <immintrin.h>
#endif

// NOTE: GCC 12's own AVX-512 headers (max, min, gathers, reductions, masked stores) start from
// deliberately undefined vectors and trip these warnings in every kernel built on these types.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#define LOPPER_UNROLL _Pragma("GCC unroll 16")
// For loops of up to 32 iterations that must vanish whole (an array of accumulators kept in
// registers: LOPPER_UNROLL's 16 left 24 of them an array on the stack).
#define LOPPER_UNROLL_ALL _Pragma("GCC unroll 32")

namespace lopper::kernels::cpu {
namespace {

// --- Vector types ------------------------------------------------------------------------------

struct Scalar {
  using V = float;
  using I = int32_t;
  static constexpr int W = 1;
  static I load_index(const int32_t* p) { return *p; }
  static V permute(I, V v) { return v; }  // one lane: lane 0 is the only index
  template <int IMM>
  static V permute_in_lanes(V v) {
    return v;
  }
  static V zero() { return 0.f; }
  static V set1(float a) { return a; }
  static V load(const float* p) { return *p; }
  // W bfloat16 values (their bits) widened to float, exactly.
  static V load_bf16(const uint16_t* p) {
    const uint32_t bits = uint32_t(*p) << 16;
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
  }
  // W values rounded to bfloat16 at p (to_bf16: to nearest even, NaN a quiet NaN).
  static void store_bf16(uint16_t* p, V v) { *p = to_bf16(v); }
  // v rounded to bfloat16 as store_bf16 rounds it, as a float (exactly the bf16 value).
  static V round_bf16(V v) {
    const uint16_t bits = to_bf16(v);
    return load_bf16(&bits);
  }
  static V loadm(const float* p, int n) { return n > 0 ? *p : 0.f; }
  static void store(float* p, V v) { *p = v; }
  static void storem(float* p, V v, int n) {
    if (n > 0) *p = v;
  }
  // p[2i] = a[i], p[2i + 1] = b[i]: the 2W floats of a and b interleaved.
  static void store_zip(float* p, V a, V b) { p[0] = a, p[1] = b; }
  static V fma(V a, V b, V c) { return a * b + c; }
  static V add(V a, V b) { return a + b; }
  static V sub(V a, V b) { return a - b; }
  static V mul(V a, V b) { return a * b; }
  static V max(V a, V b) { return a > b ? a : b; }
  static V min(V a, V b) { return a < b ? a : b; }
  // The larger of m and v, NaN when either is (ONNX's MaxPool propagates NaN).
  static V max_nan(V m, V v) { return (v > m || v != v) ? v : m; }
  static V div(V a, V b) { return a / b; }
  static V exp(V x) { return std::exp(x); }
  static float hsum(V v) { return v; }
  static float hmax(V v) { return v; }
};

#if LOPPER_SPARSE_ISA > 0
struct V4 {  // 4 floats (SSE registers, FMA3)
  using V = __m128;
  static constexpr int W = 4;
  static V zero() { return _mm_setzero_ps(); }
  static V set1(float a) { return _mm_set1_ps(a); }
  static V load(const float* p) { return _mm_loadu_ps(p); }
  static void store(float* p, V v) { _mm_storeu_ps(p, v); }
  static void store_zip(float* p, V a, V b) {
    _mm_storeu_ps(p, _mm_unpacklo_ps(a, b));
    _mm_storeu_ps(p + 4, _mm_unpackhi_ps(a, b));
  }
  static V fma(V a, V b, V c) { return _mm_fmadd_ps(a, b, c); }
  static V add(V a, V b) { return _mm_add_ps(a, b); }
  static V sub(V a, V b) { return _mm_sub_ps(a, b); }
  static V mul(V a, V b) { return _mm_mul_ps(a, b); }
  static V max(V a, V b) { return _mm_max_ps(a, b); }
  static V min(V a, V b) { return _mm_min_ps(a, b); }
  static V div(V a, V b) { return _mm_div_ps(a, b); }
  static V round(V x) { return _mm_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static V pow2(V n) {  // 2^n for integral n in [-126, 128] (128: +Inf)
    return _mm_castsi128_ps(
        _mm_slli_epi32(_mm_add_epi32(_mm_cvtps_epi32(n), _mm_set1_epi32(127)), 23));
  }
  static V times_pow2(V p, V n) { return mul(p, pow2(n)); }  // p 2^n, n as pow2's
  static V exp(V x);
};

struct V8 {  // 8 floats (AVX2 + FMA3)
  using V = __m256;
  using I = __m256i;  // lane indices
  static constexpr int W = 8;
  static I load_index(const int32_t* p) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  }
  static V permute(I idx, V v) { return _mm256_permutevar8x32_ps(v, idx); }  // lane l: v[idx[l]]
  // Within each 128-bit lane of 4 floats, element j = element (IMM >> 2j) & 3 (vpermilps).
  template <int IMM>
  static V permute_in_lanes(V v) {
    return _mm256_permute_ps(v, IMM);
  }
  static __m256i lanes(int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  static V zero() { return _mm256_setzero_ps(); }
  static V set1(float a) { return _mm256_set1_ps(a); }
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static V load_bf16(const uint16_t* p) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  // The 8 values' bfloat16 bits (to_bf16's rounding), one in the low half of each 32-bit lane.
  static __m256i bf16_lanes(V v) {
    const __m256i u = _mm256_castps_si256(v);
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i r = _mm256_srli_epi32(
        _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7FFF)), odd), 16);
    return _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7FC0),
                              _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
  }
  static void store_bf16(uint16_t* p, V v) {
    const __m256i r = bf16_lanes(v);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                     _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1)));
  }
  // v rounded as store_bf16 rounds it, as a float (exactly the bf16 value).
  static V round_bf16(V v) { return _mm256_castsi256_ps(_mm256_slli_epi32(bf16_lanes(v), 16)); }
  static V loadm(const float* p, int n) { return _mm256_maskload_ps(p, lanes(n)); }
  static void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  static void storem(float* p, V v, int n) { _mm256_maskstore_ps(p, lanes(n), v); }
  static void store_zip(float* p, V a, V b) {
    const V lo = _mm256_unpacklo_ps(a, b), hi = _mm256_unpackhi_ps(a, b);  // per 128-bit lane
    _mm256_storeu_ps(p, _mm256_permute2f128_ps(lo, hi, 0x20));
    _mm256_storeu_ps(p + 8, _mm256_permute2f128_ps(lo, hi, 0x31));
  }
  // r[i][j] -> r[j][i] for the 8 x 8 floats of r[0..8).
  static void transpose(V* r) {
    V t[8], u[8];
    for (int i = 0; i < 4; ++i) {
      t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
      t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 2; ++i) {
      u[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
      u[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0xee);
      u[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
      u[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xee);
    }
    for (int j = 0; j < 4; ++j) {
      r[j] = _mm256_permute2f128_ps(u[j], u[4 + j], 0x20);
      r[4 + j] = _mm256_permute2f128_ps(u[j], u[4 + j], 0x31);
    }
  }
  // The even lanes of a then b: a0 a2 a4 a6 b0 b2 b4 b6 (a stride-2 row's every other column).
  static V even(V a, V b) {
    const V t = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0));  // a0 a2 b0 b2 | a4 a6 b4 b6
    return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(t), _MM_SHUFFLE(3, 1, 2, 0)));
  }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static V sub(V a, V b) { return _mm256_sub_ps(a, b); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V max(V a, V b) { return _mm256_max_ps(a, b); }
  static V min(V a, V b) { return _mm256_min_ps(a, b); }
  static V max_nan(V m, V v) {
    const V take = _mm256_or_ps(_mm256_cmp_ps(v, m, _CMP_GT_OQ), _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    return _mm256_blendv_ps(m, v, take);
  }
  static V div(V a, V b) { return _mm256_div_ps(a, b); }
  static float hsum(V v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static float hmax(V v) {  // a NaN lane may or may not come out
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static V round(V x) { return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static V pow2(V n) {
    return _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
  }
  static V times_pow2(V p, V n) { return mul(p, pow2(n)); }
  static V exp(V x);
};
#endif

#if LOPPER_SPARSE_ISA > 1
struct V16 {        // 16 floats (AVX-512F)
  using Half = V8;  // 8 of them (a ymm register, 16-31 too with AVX-512VL)
  using V = __m512;
  using I = __m512i;                                              // lane indices
  static __m256 lower(V v) { return _mm512_castps512_ps256(v); }  // lanes 0-7, no instruction
  static constexpr int W = 16;
  static I load_index(const int32_t* p) { return _mm512_loadu_si512(p); }
  static V permute(I idx, V v) { return _mm512_permutexvar_ps(idx, v); }  // lane l: v[idx[l]]
  template <int IMM>
  static V permute_in_lanes(V v) {
    return _mm512_permute_ps(v, IMM);
  }
  // 128-bit lane j of the result: lane (IMM >> 2j) & 3 of v (vshuff32x4).
  template <int IMM>
  static V shuffle_lanes(V v) {
    return _mm512_shuffle_f32x4(v, v, IMM);
  }
  static __mmask16 lanes(int n) { return static_cast<__mmask16>((1u << n) - 1u); }
  static V zero() { return _mm512_setzero_ps(); }
  static V set1(float a) { return _mm512_set1_ps(a); }
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static V load_bf16(const uint16_t* p) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  // The 16 values rounded to bfloat16 as to_bf16 rounds them (ties to even, a subnormal kept, a
  // NaN 0x7FC0 as c10::BFloat16's), not by vcvtneps2bf16, which takes a subnormal as zero.
  static __m256i bf16_bits(V v) { return _mm512_cvtepi32_epi16(bf16_lanes(v)); }
  // The same bits, one in the low half of each 32-bit lane.
  static __m512i bf16_lanes(V v) {
    const __m512i u = _mm512_castps_si512(v);
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i r = _mm512_srli_epi32(
        _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7FFF)), odd), 16);
    return _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q),
                                 _mm512_set1_epi32(0x7FC0));
  }
  static void store_bf16(uint16_t* p, V v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), bf16_bits(v));
  }
  // v rounded as bf16_bits rounds it, as a float (its low 16 bits zero), in registers.
  static V round_bf16(V v) { return _mm512_castsi512_ps(_mm512_slli_epi32(bf16_lanes(v), 16)); }
  static V loadm(const float* p, int n) { return _mm512_maskz_loadu_ps(lanes(n), p); }
  static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  static void storem(float* p, V v, int n) { _mm512_mask_storeu_ps(p, lanes(n), v); }
  static void store_zip(float* p, V a, V b) {
    const __m512i lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const __m512i hi = _mm512_add_epi32(lo, _mm512_set1_epi32(8));
    _mm512_storeu_ps(p, _mm512_permutex2var_ps(a, lo, b));
    _mm512_storeu_ps(p + 16, _mm512_permutex2var_ps(a, hi, b));
  }
  // r[i][j] -> r[j][i] for the 16 x 16 floats of r[0..16).
  static void transpose(V* r) {
    V t[16];
    for (int i = 0; i < 8; ++i) {  // per 128-bit lane: rows 2i, 2i+1 interleaved
      t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
      t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    auto lo = [](V a, V b) {
      return _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(a), _mm512_castps_pd(b)));
    };
    auto hi = [](V a, V b) {
      return _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(a), _mm512_castps_pd(b)));
    };
    for (int i = 0; i < 4; ++i) {  // r[4i + j], lane L: rows 4i..4i+3 at column 4L + j
      r[4 * i] = lo(t[4 * i], t[4 * i + 2]);
      r[4 * i + 1] = hi(t[4 * i], t[4 * i + 2]);
      r[4 * i + 2] = lo(t[4 * i + 1], t[4 * i + 3]);
      r[4 * i + 3] = hi(t[4 * i + 1], t[4 * i + 3]);
    }
    for (int j = 0; j < 4; ++j) {
      t[j] = _mm512_shuffle_f32x4(r[j], r[4 + j], 0x88);
      t[4 + j] = _mm512_shuffle_f32x4(r[j], r[4 + j], 0xdd);
      t[8 + j] = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0x88);
      t[12 + j] = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0xdd);
    }
    for (int j = 0; j < 4; ++j) {
      r[j] = _mm512_shuffle_f32x4(t[j], t[8 + j], 0x88);
      r[8 + j] = _mm512_shuffle_f32x4(t[j], t[8 + j], 0xdd);
      r[4 + j] = _mm512_shuffle_f32x4(t[4 + j], t[12 + j], 0x88);
      r[12 + j] = _mm512_shuffle_f32x4(t[4 + j], t[12 + j], 0xdd);
    }
  }
  // The even lanes of a then b: a0 a2 ... a14 b0 b2 ... b14.
  static V even(V a, V b) {
    const __m512i idx =
        _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    return _mm512_permutex2var_ps(a, idx, b);
  }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static V sub(V a, V b) { return _mm512_sub_ps(a, b); }
  static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V max(V a, V b) { return _mm512_max_ps(a, b); }
  static V min(V a, V b) { return _mm512_min_ps(a, b); }
  static V max_nan(V m, V v) {
    const __mmask16 take =
        _mm512_cmp_ps_mask(v, m, _CMP_GT_OQ) | _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    return _mm512_mask_blend_ps(take, m, v);
  }
  static V div(V a, V b) { return _mm512_div_ps(a, b); }
  static float hsum(V v) { return _mm512_reduce_add_ps(v); }
  static float hmax(V v) { return _mm512_reduce_max_ps(v); }  // a NaN lane may or may not come out
  static V round(V x) {
    return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  static V pow2(V n) {
    return _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23));
  }
  // p 2^n (vscalefps: one instruction for pow2's three and the product, rounded alike)
  static V times_pow2(V p, V n) { return _mm512_scalef_ps(p, n); }
  static V exp(V x);
};
using Wide = V16;  // the widest vector: columns of `cols`
#elif LOPPER_SPARSE_ISA > 0
using Wide = V8;
#else
using Wide = Scalar;
#endif

// e^x for a vector type with round and pow2: x = n ln2 + r, |r| <= ln2/2, e^r by its degree-6
// Taylor polynomial (relative error below 2e-7 over the range), times 2^n. Inputs are clamped to
// [-87.3, 88.8]: below, e^x and 2^n are normal floats; at the top n = 128 makes 2^n +Inf, so that
// e^x overflows to +Inf as std::exp does (from x = 88.38 on, 0.34 short of where float itself
// overflows) and SiLU(-Inf) is -Inf / Inf = NaN, as in ATen. NaN stays NaN (max/min return the
// second operand, x, when it is NaN).
template <class T>
inline typename T::V exp_of(typename T::V x) {
  using V = typename T::V;
  x = T::min(T::set1(88.8f), x);
  x = T::max(T::set1(-87.3f), x);
  const V n = T::round(T::mul(x, T::set1(1.44269504088896341f)));
  // r = x - n ln2, ln2 in two parts so that n * hi is exact
  V r = T::fma(n, T::set1(-0.693359375f), x);
  r = T::fma(n, T::set1(2.12194440e-4f), r);
  V p = T::set1(1.f / 720);
  p = T::fma(p, r, T::set1(1.f / 120));
  p = T::fma(p, r, T::set1(1.f / 24));
  p = T::fma(p, r, T::set1(1.f / 6));
  p = T::fma(p, r, T::set1(0.5f));
  p = T::fma(p, r, T::set1(1.f));
  p = T::fma(p, r, T::set1(1.f));
  return T::times_pow2(p, n);
}
#if LOPPER_SPARSE_ISA > 0
inline V4::V V4::exp(V x) { return exp_of<V4>(x); }
inline V8::V V8::exp(V x) { return exp_of<V8>(x); }
#endif
#if LOPPER_SPARSE_ISA > 1
inline V16::V V16::exp(V x) { return exp_of<V16>(x); }
#endif

// GELU, x / 2 * erfc(-x / sqrt(2)), with erfc(a) for a = |x| / sqrt(2) >= 0 by the Chebyshev fit
// of Numerical Recipes (erfcc: t e^(-a^2 + P(t)), t = 1 / (1 + a / 2), relative error below
// 1.2e-7 everywhere, so the negative tail keeps its digits). Written without a select, as
// min(x, 0) / 2 * E + max(x, 0) * (1 - E / 2): x = +Inf gives +Inf, -Inf gives NaN (0 * -Inf, as
// ATen's double kernel), NaN stays NaN. ATen's float32 kernel is off by 17% at x = -5.
template <class T>
__attribute__((always_inline)) inline typename T::V gelu(typename T::V x) {
  using V = typename T::V;
  const V lo = T::min(T::zero(), x), hi = T::max(T::zero(), x);
  const V a = T::mul(T::sub(hi, lo), T::set1(0.70710678118654752f));
  const V t = T::div(T::set1(1.f), T::fma(a, T::set1(0.5f), T::set1(1.f)));
  constexpr float kP[] = {0.17087277f,  -0.82215223f, 1.48851587f, -1.13520398f, 0.27886807f,
                          -0.18628806f, 0.09678418f,  0.37409196f, 1.00002368f,  -1.26551223f};
  V p = T::set1(kP[0]);
  LOPPER_UNROLL for (int i = 1; i < 10; ++i) p = T::fma(p, t, T::set1(kP[i]));
  const V e = T::mul(t, T::exp(T::fma(T::sub(T::zero(), a), a, p)));
  return T::fma(T::mul(lo, T::set1(0.5f)), e, T::mul(hi, T::fma(e, T::set1(-0.5f), T::set1(1.f))));
}

// NOTE: NaN stays NaN, as in the unfused op (ATen's and ONNX Runtime's): each max/min takes the
// value as its second operand, which every ISA's max and min return when either is NaN (x86's
// maxps/minps; Scalar's `a > b ? a : b`).
// NOTE: always inlined: the bf16 sparse kernel (compiled for AVX512_BF16 too) called it, one vector
// at a time, so GELU's chain of dependent steps could not overlap from one vector to the next (the
// 90% encoder in bf16: 18.7 -> 18.35 ms, AMD EPYC Zen 4).
template <class T>
__attribute__((always_inline)) inline typename T::V activate(typename T::V v, const Epilogue& e) {
  switch (e.act) {
    case Epilogue::kRelu:
      return T::max(T::zero(), v);
    case Epilogue::kClip:
      return T::min(T::set1(e.hi), T::max(T::set1(e.lo), v));
    case Epilogue::kLeaky:
      return T::add(T::max(T::zero(), v), T::mul(T::set1(e.alpha), T::min(T::zero(), v)));
    case Epilogue::kHardSwish: {
      const auto g =
          T::min(T::set1(1.f), T::max(T::zero(), T::fma(v, T::set1(1.f / 6), T::set1(0.5f))));
      return T::mul(v, g);
    }
    case Epilogue::kHardSigmoid:
      return T::min(T::set1(1.f), T::max(T::zero(), T::fma(v, T::set1(e.alpha), T::set1(e.beta))));
    case Epilogue::kSigmoid:
      return T::div(T::set1(1.f), T::add(T::set1(1.f), T::exp(T::sub(T::zero(), v))));
    case Epilogue::kSilu:
      return T::div(v, T::add(T::set1(1.f), T::exp(T::sub(T::zero(), v))));
    case Epilogue::kGelu:
      return gelu<T>(v);
    default:
      return v;
  }
}

}  // namespace
}  // namespace lopper::kernels::cpu
