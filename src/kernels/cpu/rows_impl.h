// Row-wise kernels (rows_isa.h), written once over the vector types of vec_impl.h and compiled per
// ISA by rows_scalar.cpp, rows_avx2.cpp and rows_avx512.cpp, which define LOPPER_SPARSE_ISA,
// LOPPER_ROWS_OPS_NAME and LOPPER_ROWS_OPS_LABEL.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <type_traits>

#include "kernels/cpu/bf16_bits.h"
#include "kernels/cpu/rows_isa.h"
#include "kernels/cpu/vec_impl.h"

namespace lopper::kernels::cpu {
namespace {

// Softmax of each row in three passes over it (it stays in L1): the largest scaled value, the
// exponentials of the scaled values minus it (stored) and their sum, then the products by the
// sum's reciprocal. NaN anywhere in a row makes the row NaN (as ATen's): its exponential is NaN,
// and so the sum and every product by its reciprocal, whatever the largest value came out as. A
// row of -inf only is NaN (0 / 0, as ATen's). exp_of clamps at -87.3: a value that far below the
// row's largest gets e^-87.3 (1e-38) instead of 0.

// The largest of scale * x[j] for j < n (NaN possible where x has one): scale times x's largest
// (smallest for a negative scale), equal to the largest product, as rounding is monotonic.
template <class T>
float scaled_row_max(const float* x, int64_t n, float scale) {
  using V = typename T::V;
  constexpr int W = T::W;
  const bool up = !(scale < 0);
  const float start =
      up ? -std::numeric_limits<float>::infinity() : std::numeric_limits<float>::infinity();
  V m = T::set1(start);
  int64_t j = 0;
  if (up)
    for (; j + W <= n; j += W) m = T::max(m, T::load(x + j));
  else
    for (; j + W <= n; j += W) m = T::min(m, T::load(x + j));
  float e = j > 0 ? (up ? T::hmax(m) : -T::hmax(T::sub(T::zero(), m))) : start;
  for (; j < n; ++j) e = up ? std::max(e, x[j]) : std::min(e, x[j]);
  return e * scale;
}

// y[j] = e^(scale x[j] - mx) for j < n; returns their sum.
template <class T>
float exp_row(const float* x, float* y, int64_t n, float scale, float mx) {
  using V = typename T::V;
  constexpr int W = T::W;
  const V s = T::set1(scale), neg = T::set1(-mx);
  V sum = T::zero();
  int64_t j = 0;
  for (; j + W <= n; j += W) {
    const V e = T::exp(T::fma(T::load(x + j), s, neg));
    T::store(y + j, e);
    sum = T::add(sum, e);
  }
  float total = T::hsum(sum);
  if (j < n) {
    const int left = int(n - j);
    const V e = T::exp(T::fma(T::loadm(x + j, left), s, neg));
    float lane[W];
    T::store(lane, e);
    for (int i = 0; i < left; ++i) total += lane[i];
    T::storem(y + j, e, left);
  }
  return total;
}

template <class T>
void softmax_rows(const float* x, float* y, int64_t r0, int64_t r1, int64_t n, float scale) {
  using V = typename T::V;
  constexpr int W = T::W;
  for (int64_t r = r0; r < r1; ++r) {
    const float* xr = x + r * n;
    float* yr = y + r * n;
    const float total = exp_row<T>(xr, yr, n, scale, scaled_row_max<T>(xr, n, scale));
    const V inv = T::set1(1.f / total);
    int64_t j = 0;
    for (; j + W <= n; j += W) T::store(yr + j, T::mul(T::load(yr + j), inv));
    if (j < n) T::storem(yr + j, T::mul(T::loadm(yr + j, int(n - j)), inv), int(n - j));
  }
}

// --- attention: a block of query rows of one head ----------------------------------------------
//
// The head's keys packed as kp [d][skp] (keys along the rows, zero past sk), its values as vp
// [sk][dvp] and the block's queries as qp [r][d], all float32 (bf16 widened as they are packed):
// the products then read whole vectors of contiguous floats whatever the strides of the head
// views (a fused QKV projection's). Scores s [r][skp]: tiles of MR query rows x NC vectors of
// keys, MR x NC sums in registers over d; softmax in place; y: tiles of MR rows x NC vectors of
// dv, sums over the keys.

template <bool kBf16>
inline float attn_at(const void* base, int64_t i) {
  if constexpr (kBf16)
    return Scalar::load_bf16(static_cast<const uint16_t*>(base) + i);
  else
    return static_cast<const float*>(base)[i];
}

// dst[i][j] = src[i * rs + j * cs] for i < rows, j < cols; dst rows ldd apart, zero from cols to
// ldd. The loop along the smaller stride is the inner one.
template <bool kBf16>
void attn_pack(const void* src, int64_t rs, int64_t cs, int64_t rows, int64_t cols, float* dst,
               int64_t ldd) {
  if (std::abs(cs) <= std::abs(rs)) {
    for (int64_t i = 0; i < rows; ++i) {
      float* d = dst + i * ldd;
      for (int64_t j = 0; j < cols; ++j) d[j] = attn_at<kBf16>(src, i * rs + j * cs);
    }
  } else {
    for (int64_t j = 0; j < cols; ++j)
      for (int64_t i = 0; i < rows; ++i) dst[i * ldd + j] = attn_at<kBf16>(src, i * rs + j * cs);
  }
  for (int64_t i = 0; i < rows; ++i) std::fill(dst + i * ldd + cols, dst + (i + 1) * ldd, 0.f);
}

// c[m][0, NC*W) = sum over k < kn of a[m * lda + k] * b[k * ldb + (0, NC*W)], m < MR; the last
// vector's store masked to `tail` lanes (W: whole).
template <class T, int MR, int NC>
inline void attn_tile(const float* a, int64_t lda, const float* b, int64_t ldb, int64_t kn,
                      float* c, int64_t ldc, int tail) {
  using V = typename T::V;
  V acc[MR][NC];
  LOPPER_UNROLL for (int m = 0; m < MR; ++m) LOPPER_UNROLL for (int n = 0; n < NC; ++n) acc[m][n] =
      T::zero();
  for (int64_t k = 0; k < kn; ++k) {
    V bv[NC];
    LOPPER_UNROLL for (int n = 0; n < NC; ++n) bv[n] = T::load(b + k * ldb + n * T::W);
    LOPPER_UNROLL for (int m = 0; m < MR; ++m) {
      const V av = T::set1(a[m * lda + k]);
      LOPPER_UNROLL for (int n = 0; n < NC; ++n) acc[m][n] = T::fma(av, bv[n], acc[m][n]);
    }
  }
  LOPPER_UNROLL for (int m = 0; m < MR; ++m) LOPPER_UNROLL for (int n = 0; n < NC; ++n) {
    if (n == NC - 1 && tail != T::W)
      T::storem(c + m * ldc + n * T::W, acc[m][n], tail);
    else
      T::store(c + m * ldc + n * T::W, acc[m][n]);
  }
}

// Calls tile(m0, j0, mr, nc, tail) for the tiles of up to MR rows x NC vectors of W columns that
// cover rows x cols, mr and nc as std::integral_constant (the tile's rows and vectors), the last
// vector `tail` lanes wide (W: whole).
template <int MR, int NC, int W, class Tile>
void for_each_tile(int64_t rows, int64_t cols, Tile&& tile) {
  for (int64_t m0 = 0; m0 < rows; m0 += MR) {
    const int mr = int(std::min<int64_t>(MR, rows - m0));
    for (int64_t j0 = 0; j0 < cols; j0 += NC * W) {
      const int64_t left = cols - j0;
      const int nc = int(std::min<int64_t>(NC, (left + W - 1) / W));
      const int tail = int(std::min<int64_t>(W, left - int64_t(nc - 1) * W));
      auto run = [&](auto mr_c, auto nc_c) { tile(m0, j0, mr_c, nc_c, tail); };
      auto by_nc = [&](auto mr_c) {
        switch (nc) {
          case 1:
            return run(mr_c, std::integral_constant<int, 1>{});
          case 2:
            if constexpr (NC >= 2) return run(mr_c, std::integral_constant<int, 2>{});
            break;
          case 3:
            if constexpr (NC >= 3) return run(mr_c, std::integral_constant<int, 3>{});
            break;
          default:
            if constexpr (NC >= 4) return run(mr_c, std::integral_constant<int, 4>{});
            break;
        }
      };
      switch (mr) {
        case 1:
          by_nc(std::integral_constant<int, 1>{});
          break;
        case 2:
          by_nc(std::integral_constant<int, 2>{});
          break;
        case 3:
          by_nc(std::integral_constant<int, 3>{});
          break;
        case 4:
          by_nc(std::integral_constant<int, 4>{});
          break;
        case 5:
          if constexpr (MR >= 5) by_nc(std::integral_constant<int, 5>{});
          break;
        default:
          if constexpr (MR >= 6) by_nc(std::integral_constant<int, 6>{});
          break;
      }
    }
  }
}

// c [rows][cols] = a [rows][kn] . b [kn][cols (whole vectors, b's rows padded)], cols stored up to
// `cols` only.
template <class T>
void attn_product(const float* a, int64_t lda, const float* b, int64_t ldb, int64_t kn,
                  int64_t rows, int64_t cols, float* c, int64_t ldc) {
  constexpr int W = T::W, MR = W >= 16 ? 6 : 4, NC = W >= 16 ? 4 : (W >= 8 ? 2 : 4);
  for_each_tile<MR, NC, W>(rows, cols, [&](int64_t m0, int64_t j0, auto mr, auto nc, int tail) {
    attn_tile<T, decltype(mr)::value, decltype(nc)::value>(a + m0 * lda, lda, b + j0, ldb, kn,
                                                           c + m0 * ldc + j0, ldc, tail);
  });
}

// W consecutive values at p as floats: float32 as they are, bfloat16 widened (exactly).
template <bool kBf16>
inline Wide::V attn_load(const void* p) {
  if constexpr (kBf16)
    return Wide::load_bf16(static_cast<const uint16_t*>(p));
  else
    return Wide::load(static_cast<const float*>(p));
}

// dst[i][0, cols) = src row i (rows rs elements apart, contiguous), zero from cols to ldd.
template <bool kBf16>
void attn_pack_rows(const void* src, int64_t rs, int64_t rows, int64_t cols, float* dst,
                    int64_t ldd) {
  constexpr int64_t W = Wide::W, bytes = kBf16 ? 2 : 4;
  const auto* base = static_cast<const char*>(src);
  for (int64_t i = 0; i < rows; ++i) {
    const char* row = base + i * rs * bytes;
    float* d = dst + i * ldd;
    int64_t j = 0;
    for (; j + W <= cols; j += W) Wide::store(d + j, attn_load<kBf16>(row + j * bytes));
    for (; j < cols; ++j) d[j] = attn_at<kBf16>(row, j);
    std::fill(d + cols, d + ldd, 0.f);
  }
}

// kp [d][skp] from keys k [sk][d] with contiguous rows (kt's columns ldk apart): W x W tiles
// transposed in registers, the edges one by one, zero from sk to skp.
template <bool kBf16, class T = Wide>
void attn_pack_keys(const void* k, int64_t ldk, int64_t sk, int64_t d, float* kp, int64_t skp) {
  constexpr int W = T::W, bytes = kBf16 ? 2 : 4;
  const auto* base = static_cast<const char*>(k);
  // The tiles' extent (none for the scalar table, whose edges are everything).
  const int64_t sk_w = W > 1 ? sk / W * W : 0, d_w = W > 1 ? d / W * W : 0;
  if constexpr (W > 1) {
    typename T::V r[W];
    for (int64_t j0 = 0; j0 < sk_w; j0 += W)
      for (int64_t c0 = 0; c0 < d_w; c0 += W) {
        LOPPER_UNROLL for (int i = 0; i < W; ++i) r[i] =
            attn_load<kBf16>(base + ((j0 + i) * ldk + c0) * bytes);
        T::transpose(r);
        LOPPER_UNROLL for (int i = 0; i < W; ++i) T::store(kp + (c0 + i) * skp + j0, r[i]);
      }
  }
  for (int64_t c = 0; c < d; ++c) {
    for (int64_t j = c < d_w ? sk_w : 0; j < sk; ++j)
      kp[c * skp + j] = attn_at<kBf16>(k, j * ldk + c);
    std::fill(kp + c * skp + sk, kp + (c + 1) * skp, 0.f);
  }
}

template <class T, bool kBf16>
void attention_block(const AttnView& a, int64_t h, int64_t r0, int64_t r, float* scratch) {
  constexpr int64_t W = T::W;
  const int64_t skp = attn_round(a.sk), dvp = attn_round(a.dv);
  float* kp = scratch;                  // [d][skp]
  float* vp = kp + a.d * skp;           // [sk][dvp]
  float* qp = vp + a.sk * dvp;          // [r][d]
  float* s = qp + attn_round(r * a.d);  // [r][skp]
  const auto* kt = static_cast<const char*>(a.kt) + (kBf16 ? 2 : 4) * h * a.kt_hs;
  const auto* v = static_cast<const char*>(a.v) + (kBf16 ? 2 : 4) * h * a.v_hs;
  const auto* q = static_cast<const char*>(a.q) + (kBf16 ? 2 : 4) * (h * a.q_hs + r0 * a.q_rs);
  // NOTE: views with contiguous rows are read in place (float32 queries; float32 values whose rows
  // are whole vectors), packed a vector at a time, or transposed by tiles (keys); the rest value
  // by value. The packing took a third of the time of a BERT head (128 keys of 64) when done value
  // by value.
  const float* qa = qp;
  int64_t ldq = a.d;
  if (!kBf16 && a.q_cs == 1)
    qa = reinterpret_cast<const float*>(q), ldq = a.q_rs;
  else if (a.q_cs == 1)
    attn_pack_rows<kBf16>(q, a.q_rs, r, a.d, qp, a.d);
  else
    attn_pack<kBf16>(q, a.q_rs, a.q_cs, r, a.d, qp, a.d);
  if (a.kt_rs == 1)
    attn_pack_keys<kBf16>(kt, a.kt_cs, a.sk, a.d, kp, skp);
  else
    attn_pack<kBf16>(kt, a.kt_rs, a.kt_cs, a.d, a.sk, kp, skp);
  const float* va = vp;
  int64_t ldv = dvp;
  if (!kBf16 && a.v_cs == 1 && a.dv % W == 0)
    va = reinterpret_cast<const float*>(v), ldv = a.v_rs;
  else if (a.v_cs == 1)
    attn_pack_rows<kBf16>(v, a.v_rs, a.sk, a.dv, vp, dvp);
  else
    attn_pack<kBf16>(v, a.v_rs, a.v_cs, a.sk, a.dv, vp, dvp);
  attn_product<T>(qa, ldq, kp, skp, a.d, r, skp, s, skp);
  for (int64_t m = 0; m < r; ++m) softmax_rows<T>(s + m * skp, s + m * skp, 0, 1, a.sk, a.scale);
  attn_product<T>(s, skp, va, ldv, a.sk, r, a.dv, a.y + h * a.y_hs + r0 * a.y_rs, a.y_rs);
}

// y[h] = q[h] kt[h] (RowsIsaOps::product): kt packed by rows (its columns contiguous: a product
// with v), by tiles (its rows contiguous: the keys of a product with K^T) or value by value.
template <class T, bool kBf16>
void product_head(const AttnView& a, int64_t h, float* scratch) {
  const int64_t np = attn_round(a.sk);
  float* bp = scratch;        // [d][np]
  float* ap = bp + a.d * np;  // [sq][d]
  const auto* kt = static_cast<const char*>(a.kt) + (kBf16 ? 2 : 4) * h * a.kt_hs;
  const auto* q = static_cast<const char*>(a.q) + (kBf16 ? 2 : 4) * h * a.q_hs;
  const float* qa = ap;
  int64_t ldq = a.d;
  if (!kBf16 && a.q_cs == 1)
    qa = reinterpret_cast<const float*>(q), ldq = a.q_rs;
  else if (a.q_cs == 1)
    attn_pack_rows<kBf16>(q, a.q_rs, a.sq, a.d, ap, a.d);
  else
    attn_pack<kBf16>(q, a.q_rs, a.q_cs, a.sq, a.d, ap, a.d);
  if (a.kt_cs == 1)
    attn_pack_rows<kBf16>(kt, a.kt_rs, a.d, a.sk, bp, np);
  else if (a.kt_rs == 1)
    attn_pack_keys<kBf16>(kt, a.kt_cs, a.sk, a.d, bp, np);
  else
    attn_pack<kBf16>(kt, a.kt_rs, a.kt_cs, a.d, a.sk, bp, np);
  attn_product<T>(qa, ldq, bp, np, a.d, a.sq, a.sk, a.y + h * a.y_hs, a.y_rs);
}

#if LOPPER_SPARSE_ISA > 1
// --- attention on the bfloat16 dot product -----------------------------------------------------
//
// bf16 queries, keys and values multiplied two products per lane by vdpbf16ps, sums in float32
// (half the FMA-port instructions of widening them): the keys packed as kp [d/2][skp] of 32-bit
// pairs (dimensions 2p and 2p + 1 of a key), the values as vp [sk/2][dvp] (keys 2i and 2i + 1 of
// a column), the queries' pairs broadcast from their rows. The softmaxed scores are rounded to
// bf16 in place (as ATen's flash attention rounds them for the product with v) and their pairs of
// keys broadcast.
#pragma GCC push_options
#pragma GCC target("avx512bw,avx512bf16")

// c[m][0, NC*16) = sum over p < pn of the pair a[m * lda + 2p, +1] . the pairs b[p * ldb + (0,
// NC*16)], m < MR; the last vector's store masked to `tail` lanes. C float (the sums) or uint16_t
// (the sums rounded to bfloat16, as to_bf16 rounds).
template <int MR, int NC, class C>
inline void dot_tile(const uint16_t* a, int64_t lda, const uint32_t* b, int64_t ldb, int64_t pn,
                     C* c, int64_t ldc, int tail) {
  __m512 acc[MR][NC];
  LOPPER_UNROLL for (int m = 0; m < MR; ++m) LOPPER_UNROLL for (int n = 0; n < NC; ++n) acc[m][n] =
      _mm512_setzero_ps();
  for (int64_t p = 0; p < pn; ++p) {
    __m512i bv[NC];
    LOPPER_UNROLL for (int n = 0; n < NC; ++n) bv[n] = _mm512_loadu_si512(b + p * ldb + n * 16);
    LOPPER_UNROLL for (int m = 0; m < MR; ++m) {
      const __m512bh av = (__m512bh)_mm512_set1_epi32(int(bf16_pair(a + m * lda + 2 * p)));
      LOPPER_UNROLL for (int n = 0; n < NC; ++n) acc[m][n] =
          _mm512_dpbf16_ps(acc[m][n], av, (__m512bh)bv[n]);
    }
  }
  LOPPER_UNROLL for (int m = 0; m < MR; ++m) LOPPER_UNROLL for (int n = 0; n < NC; ++n) {
    const bool part = n == NC - 1 && tail != 16;
    if constexpr (std::is_same_v<C, float>) {
      if (part)
        _mm512_mask_storeu_ps(c + m * ldc + n * 16, __mmask16((1u << tail) - 1), acc[m][n]);
      else
        _mm512_storeu_ps(c + m * ldc + n * 16, acc[m][n]);
    } else {
      const __m256i bits = Wide::bf16_bits(acc[m][n]);
      if (part)
        _mm256_mask_storeu_epi16(c + m * ldc + n * 16, __mmask16((1u << tail) - 1), bits);
      else
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(c + m * ldc + n * 16), bits);
    }
  }
}

// c [rows][cols] = a [rows][2 pn] . b [pn][cols (whole vectors of pairs)], cols stored up to cols.
template <class C>
void dot_product(const uint16_t* a, int64_t lda, const uint32_t* b, int64_t ldb, int64_t pn,
                 int64_t rows, int64_t cols, C* c, int64_t ldc) {
  for_each_tile<6, 4, 16>(rows, cols, [&](int64_t m0, int64_t j0, auto mr, auto nc, int tail) {
    dot_tile<decltype(mr)::value, decltype(nc)::value>(a + m0 * lda, lda, b + j0, ldb, pn,
                                                       c + m0 * ldc + j0, ldc, tail);
  });
}

void attention_dot_block(const AttnView& a, int64_t h, int64_t r0, int64_t r, float* scratch) {
  const int64_t skp = attn_round(a.sk), dvp = attn_round(a.dv);
  const int64_t d2 = (a.d + 1) / 2, sk2 = (a.sk + 1) / 2;
  auto* kp = reinterpret_cast<uint32_t*>(scratch);               // [d2][skp]
  uint32_t* vp = kp + d2 * skp;                                  // [sk2][dvp]
  auto* qp = reinterpret_cast<uint16_t*>(vp + sk2 * dvp);        // [r][2 d2]
  float* s = reinterpret_cast<float*>(qp) + attn_round(r * d2);  // [r][skp]
  const auto* kt = static_cast<const uint16_t*>(a.kt) + h * a.kt_hs;
  const auto* v = static_cast<const uint16_t*>(a.v) + h * a.v_hs;
  const auto* q = static_cast<const uint16_t*>(a.q) + h * a.q_hs + r0 * a.q_rs;
  auto at = [](const uint16_t* base, int64_t i) { return uint32_t(base[i]); };
  // Queries: their rows in place when each holds its d values side by side, d even.
  const uint16_t* qa = q;
  int64_t ldq = a.q_rs;
  if (a.q_cs != 1 || a.d % 2 != 0) {
    for (int64_t m = 0; m < r; ++m)
      for (int64_t c = 0; c < 2 * d2; ++c)
        qp[m * 2 * d2 + c] = c < a.d ? q[m * a.q_rs + c * a.q_cs] : uint16_t(0);
    qa = qp, ldq = 2 * d2;
  }
  // Keys: with each key's d values side by side (d even, pairs 4-byte aligned), kp is the
  // transpose of the [sk][d2] matrix of pairs, by the float32 tiles (the bits move unchanged).
  if (a.kt_rs == 1 && a.d % 2 == 0 && a.kt_cs % 2 == 0 &&
      reinterpret_cast<uintptr_t>(kt) % 4 == 0) {
    attn_pack_keys<false>(reinterpret_cast<const float*>(kt), a.kt_cs / 2, a.sk, d2,
                          reinterpret_cast<float*>(kp), skp);
  } else {
    for (int64_t p = 0; p < d2; ++p) {
      for (int64_t j = 0; j < a.sk; ++j) {
        const uint32_t lo = at(kt, 2 * p * a.kt_rs + j * a.kt_cs);
        const uint32_t hi = 2 * p + 1 < a.d ? at(kt, (2 * p + 1) * a.kt_rs + j * a.kt_cs) : 0u;
        kp[p * skp + j] = lo | hi << 16;
      }
      std::fill(kp + p * skp + a.sk, kp + (p + 1) * skp, 0u);
    }
  }
  // Values: rows 2i and 2i + 1 interleaved 16 bits at a time, 32 columns per two vectors.
  if (a.v_cs == 1) {
    const __m512i first = _mm512_setr_epi32(
        0x200000, 0x210001, 0x220002, 0x230003, 0x240004, 0x250005, 0x260006, 0x270007, 0x280008,
        0x290009, 0x2a000a, 0x2b000b, 0x2c000c, 0x2d000d, 0x2e000e, 0x2f000f);
    const __m512i second = _mm512_add_epi16(first, _mm512_set1_epi16(16));
    for (int64_t i = 0; i < sk2; ++i) {
      const uint16_t* r_even = v + 2 * i * a.v_rs;
      const bool odd = 2 * i + 1 < a.sk;
      const uint16_t* r_odd = v + (2 * i + 1) * a.v_rs;
      uint32_t* dst = vp + i * dvp;
      for (int64_t c0 = 0; c0 < dvp; c0 += 32) {
        const int64_t left = std::min<int64_t>(32, a.dv - c0);
        const __mmask32 mk = left <= 0 ? 0 : (left >= 32 ? ~__mmask32(0) : (1u << left) - 1);
        const __m512i e = _mm512_maskz_loadu_epi16(mk, r_even + c0);
        const __m512i o = odd ? _mm512_maskz_loadu_epi16(mk, r_odd + c0) : _mm512_setzero_si512();
        _mm512_storeu_si512(dst + c0, _mm512_permutex2var_epi16(e, first, o));
        if (c0 + 16 < dvp)
          _mm512_storeu_si512(dst + c0 + 16, _mm512_permutex2var_epi16(e, second, o));
      }
    }
  } else {
    for (int64_t i = 0; i < sk2; ++i)
      for (int64_t c = 0; c < dvp; ++c) {
        const uint32_t lo = c < a.dv ? at(v, 2 * i * a.v_rs + c * a.v_cs) : 0u;
        const uint32_t hi =
            c < a.dv && 2 * i + 1 < a.sk ? at(v, (2 * i + 1) * a.v_rs + c * a.v_cs) : 0u;
        vp[i * dvp + c] = lo | hi << 16;
      }
  }
  dot_product(qa, ldq, kp, skp, d2, r, skp, s, skp);
  for (int64_t m = 0; m < r; ++m) {
    float* row = s + m * skp;
    // softmax_rows' exponentials, then their products by the sum's reciprocal rounded to bf16 into
    // the row's first half, forwards (a vector's 32 bytes land at or before the 64 it was read
    // from); zero to the end of the last pair.
    const float total =
        exp_row<Wide>(row, row, a.sk, a.scale, scaled_row_max<Wide>(row, a.sk, a.scale));
    const __m512 inv = _mm512_set1_ps(1.f / total);
    auto* out = reinterpret_cast<uint16_t*>(row);
    int64_t j = 0;
    for (; j + 16 <= a.sk; j += 16)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + j),
                          Wide::bf16_bits(_mm512_mul_ps(_mm512_loadu_ps(row + j), inv)));
    if (j < a.sk) {
      const __mmask16 mk = __mmask16((1u << (a.sk - j)) - 1);
      _mm256_mask_storeu_epi16(
          out + j, mk, Wide::bf16_bits(_mm512_mul_ps(_mm512_maskz_loadu_ps(mk, row + j), inv)));
    }
    if (a.sk % 2 != 0) out[a.sk] = 0;
  }
  dot_product(reinterpret_cast<const uint16_t*>(s), 2 * skp, vp, dvp, sk2, r, a.dv,
              a.y16 + h * a.y_hs + r0 * a.y_rs, a.y_rs);
}

#pragma GCC pop_options
#define LOPPER_ATTENTION_DOT attention_dot_block
#else
#define LOPPER_ATTENTION_DOT nullptr
#endif

// --- layer norm of rows ------------------------------------------------------------------------
//
// Three passes over a row while it is in L1: the mean, the variance as the mean of the squared
// deviations (two passes: no cancellation), then the normalised, scaled and shifted values. NaN or
// an infinity in a row makes the row NaN, as ATen's.
// The variance of a row of n floats about its mean (two accumulators, then one, as the mean's
// sum), then y = (row - mean) / sqrt(var + eps) * g + b (b may be null), stored as E (bf16:
// rounded once). Shared by the layer norms, so that a fused one gives the plain one's bits.
template <class T, class E>
void normalize_row(const float* row, E* y, int64_t n, float mean, const float* g, const float* b,
                   float eps) {
  using V = typename T::V;
  constexpr int64_t W = T::W;
  const int64_t nw = n / W * W;
  const V vm = T::set1(mean);
  V s0 = T::zero(), s1 = T::zero();
  int64_t j = 0;
  for (; j + 2 * W <= nw; j += 2 * W) {
    const V d0 = T::sub(T::load(row + j), vm), d1 = T::sub(T::load(row + j + W), vm);
    s0 = T::fma(d0, d0, s0), s1 = T::fma(d1, d1, s1);
  }
  for (; j < nw; j += W) {
    const V d = T::sub(T::load(row + j), vm);
    s0 = T::fma(d, d, s0);
  }
  float var = T::hsum(T::add(s0, s1));
  for (j = nw; j < n; ++j) var += (row[j] - mean) * (row[j] - mean);
  const float rstd = 1.f / std::sqrt(var / float(n) + eps);
  const V vr = T::set1(rstd);
  for (j = 0; j < nw; j += W) {
    const V v = T::mul(T::sub(T::load(row + j), vm), vr);
    const V o = b ? T::fma(v, T::load(g + j), T::load(b + j)) : T::mul(v, T::load(g + j));
    if constexpr (std::is_same_v<E, uint16_t>)
      T::store_bf16(y + j, o);
    else
      T::store(y + j, o);
  }
  for (j = nw; j < n; ++j) {
    const float v = (row[j] - mean) * rstd;
    const float o = b ? std::fma(v, g[j], b[j]) : v * g[j];
    if constexpr (std::is_same_v<E, uint16_t>)
      y[j] = to_bf16(o);
    else
      y[j] = o;
  }
}

template <class T>
void layer_norm_rows(const float* x, float* y, int64_t r0, int64_t r1, int64_t n, const float* g,
                     const float* b, float eps) {
  using V = typename T::V;
  constexpr int64_t W = T::W;
  const int64_t nw = n / W * W;
  for (int64_t r = r0; r < r1; ++r) {
    const float* xr = x + r * n;
    V s0 = T::zero(), s1 = T::zero();
    int64_t j = 0;
    for (; j + 2 * W <= nw; j += 2 * W)
      s0 = T::add(s0, T::load(xr + j)), s1 = T::add(s1, T::load(xr + j + W));
    for (; j < nw; j += W) s0 = T::add(s0, T::load(xr + j));
    float sum = T::hsum(T::add(s0, s1));
    for (j = nw; j < n; ++j) sum += xr[j];
    normalize_row<T>(xr, y + r * n, n, sum / float(n), g, b, eps);
  }
}

// y[r] = layer_norm(x[r] + res[r]) for rows [r0, r1) of n values, float32 or (kBf16) bf16 bits:
// the sum rounded to the type and stored to `sum` where given, widened into `row` (n floats)
// while its mean is summed; the variance from `row`; y normalised from it and stored (bf16:
// rounded once). Three passes over a row in L1, where an Add and a layer norm make seven.
template <class T, bool kBf16>
void add_layer_norm_rows(const void* x, const void* res, void* y, void* sum, int64_t r0, int64_t r1,
                         int64_t n, const float* g, const float* b, float eps, float* row) {
  using V = typename T::V;
  using E = std::conditional_t<kBf16, uint16_t, float>;
  constexpr int64_t W = T::W;
  const int64_t nw = n / W * W;
  auto load = [](const E* p) {
    if constexpr (kBf16)
      return T::load_bf16(p);
    else
      return T::load(p);
  };
  auto scalar = [](const E* p, int64_t j) {
    if constexpr (kBf16)
      return from_bf16(p[j]);
    else
      return p[j];
  };
  for (int64_t r = r0; r < r1; ++r) {
    const E* xr = static_cast<const E*>(x) + r * n;
    const E* rr = static_cast<const E*>(res) + r * n;
    E* yr = static_cast<E*>(y) + r * n;
    E* sr = sum ? static_cast<E*>(sum) + r * n : nullptr;
    // the sum at j, as the Add writes it, into row and (where asked) sum
    auto add_at = [&](int64_t j) __attribute__((always_inline)) {
      V v = T::add(load(xr + j), load(rr + j));
      if constexpr (kBf16) {  // the Add's bf16 result: rounded, as a float exactly
        v = T::round_bf16(v);
        if (sr) T::store_bf16(sr + j, v);  // (exact: nothing left to round)
      } else if (sr) {
        T::store(sr + j, v);
      }
      T::store(row + j, v);
      return v;
    };
    // NOTE: the sums in layer_norm_rows' order (two accumulators, then one), so that the result is
    // the unfused nodes' to the bit.
    V s0 = T::zero(), s1 = T::zero();
    int64_t j = 0;
    for (; j + 2 * W <= nw; j += 2 * W) s0 = T::add(s0, add_at(j)), s1 = T::add(s1, add_at(j + W));
    for (; j < nw; j += W) s0 = T::add(s0, add_at(j));
    float total = T::hsum(T::add(s0, s1));
    for (j = nw; j < n; ++j) {
      float v = scalar(xr, j) + scalar(rr, j);
      if constexpr (kBf16) {
        const uint16_t bits = to_bf16(v);
        if (sr) sr[j] = bits;
        v = from_bf16(bits);
      } else if (sr) {
        sr[j] = v;
      }
      row[j] = v;
      total += v;
    }
    normalize_row<T>(row, yr, n, total / float(n), g, b, eps);
  }
}

}  // namespace

extern const RowsIsaOps LOPPER_ROWS_OPS_NAME;
const RowsIsaOps LOPPER_ROWS_OPS_NAME = {
    LOPPER_ROWS_OPS_LABEL,
    [](const float* x, float* y, int64_t r0, int64_t r1, int64_t n, float scale) {
      softmax_rows<Wide>(x, y, r0, r1, n, scale);
    },
    [](const AttnView& a, int64_t h, int64_t r0, int64_t r, float* scratch) {
      if (a.bf16)
        attention_block<Wide, true>(a, h, r0, r, scratch);
      else
        attention_block<Wide, false>(a, h, r0, r, scratch);
    },
    LOPPER_ATTENTION_DOT,
    layer_norm_rows<Wide>,
    [](const AttnView& a, int64_t h, float* scratch) {
      if (a.bf16)
        product_head<Wide, true>(a, h, scratch);
      else
        product_head<Wide, false>(a, h, scratch);
    },
    [](const void* x, const void* res, void* y, void* sum, int64_t r0, int64_t r1, int64_t n,
       const float* g, const float* b, float eps, bool bf16, float* row) {
      if (bf16)
        add_layer_norm_rows<Wide, true>(x, res, y, sum, r0, r1, n, g, b, eps, row);
      else
        add_layer_norm_rows<Wide, false>(x, res, y, sum, r0, r1, n, g, b, eps, row);
    }};

}  // namespace lopper::kernels::cpu
