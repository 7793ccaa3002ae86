// The sparse kernels, written once over a vector type and compiled once per ISA (internal): the
// including file defines LOPPER_SPARSE_ISA (0 scalar, 1 AVX2 + FMA, 2 AVX-512) and LOPPER_OPS_NAME,
// and is compiled with the matching -m flags. Everything here has internal linkage.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/cpu/bf16_bits.h"
#include "kernels/cpu/sparse_isa.h"
#include "kernels/cpu/vec_impl.h"

namespace lopper::kernels::cpu {
namespace {

// --- cols: yt = W . xt, vectorised along the columns -------------------------------------------
//
// One panel = NV vectors of columns for one block row: R x NV accumulators, U copies of them for
// consecutive blocks when there are too few to hide the FMA latency. Per block and input, the
// panel's NV vectors of xt are loaded once and used by all R outputs.

template <int R, int C, int NV, int U, bool kMask>
inline void cols_panel(const SpView& s, int64_t br, const float* xt, int64_t ldx, float* yt,
                       int64_t ldy, int64_t y_row0, int tail, const Epilogue& e) {
  using T = Wide;
  using V = typename T::V;
  V acc[U][R][NV];
  LOPPER_UNROLL for (int u = 0; u < U; ++u) LOPPER_UNROLL for (int r = 0; r < R; ++r)
      LOPPER_UNROLL for (int v = 0; v < NV; ++v) acc[u][r][v] = T::zero();
  const int32_t j1 = s.ptr[br + 1];
  int32_t j = s.ptr[br];
  auto block = [&](int u, int32_t jj) __attribute__((always_inline)) {
    const float* xb = xt + int64_t(s.col[jj]) * ldx;
    const float* wb = s.val + int64_t(jj) * (R * C);
    LOPPER_UNROLL for (int c = 0; c < C; ++c) {
      V xv[NV];
      LOPPER_UNROLL for (int v = 0; v < NV; ++v) {
        if constexpr (kMask) {
          xv[v] = v == NV - 1 ? T::loadm(xb + c * ldx + v * T::W, tail)
                              : T::load(xb + c * ldx + v * T::W);
        } else {
          xv[v] = T::load(xb + c * ldx + v * T::W);
        }
      }
      LOPPER_UNROLL for (int r = 0; r < R; ++r) {
        V wv = T::set1(wb[c * R + r]);
        LOPPER_UNROLL for (int v = 0; v < NV; ++v) acc[u][r][v] = T::fma(wv, xv[v], acc[u][r][v]);
      }
    }
  };
  for (; j + U <= j1; j += U) LOPPER_UNROLL for (int u = 0; u < U; ++u) block(u, j + u);
  for (; j < j1; ++j) block(0, j);
  LOPPER_UNROLL for (int u = 1; u < U; ++u) LOPPER_UNROLL for (int r = 0; r < R; ++r)
      LOPPER_UNROLL for (int v = 0; v < NV; ++v) acc[0][r][v] = T::add(acc[0][r][v], acc[u][r][v]);
  const int64_t n0 = br * R;
  const int nr = s.n - n0 < R ? int(s.n - n0) : R;
  for (int r = 0; r < nr; ++r) {
    V b = T::set1(e.bias ? e.bias[n0 + r] : 0.f);
    float* dst = yt + (n0 + r - y_row0) * ldy;
    LOPPER_UNROLL for (int v = 0; v < NV; ++v) {
      V o = activate<T>(T::add(acc[0][r][v], b), e);
      if constexpr (kMask) {
        if (v == NV - 1) {
          T::storem(dst + v * T::W, o, tail);
          continue;
        }
      }
      T::store(dst + v * T::W, o);
    }
  }
}

// Columns per panel: as many accumulators as the register file holds with room for the loads.
template <int R>
constexpr int panel_vectors() {
  constexpr int regs = LOPPER_SPARSE_ISA > 1 ? 16 : (LOPPER_SPARSE_ISA > 0 ? 8 : 4);
  return R >= regs ? 1 : (regs / R > 4 ? 4 : regs / R);
}

// One panel of NV vectors for every block row in [br0, br1).
template <int R, int C, int NV, bool kMask>
void cols_rows(const SpView& s, int64_t br0, int64_t br1, const float* xt, int64_t ldx, float* yt,
               int64_t ldy, int64_t y_row0, int tail, const Epilogue& e) {
  constexpr int U = R * NV >= 4 ? 1 : 4 / (R * NV);
  for (int64_t br = br0; br < br1; ++br)
    cols_panel<R, C, NV, U, kMask>(s, br, xt, ldx, yt, ldy, y_row0, tail, e);
}

template <int R, int C>
void cols_rc(const SpView& s, int64_t br0, int64_t br1, const float* xt, int64_t ldx, int64_t ncols,
             float* yt, int64_t ldy, int64_t y_row0, const Epilogue& e) {
  constexpr int NV = panel_vectors<R>();
  constexpr int64_t W = Wide::W;
  int64_t p = 0;
  // NOTE: panels outside, block rows inside, so that a panel of xt stays in cache while every
  // output row reads it.
  for (; p + NV * W <= ncols; p += NV * W)
    cols_rows<R, C, NV, false>(s, br0, br1, xt + p, ldx, yt + p, ldy, y_row0, 0, e);
  const int64_t rem = ncols - p;
  if (rem == 0) return;
  // The rest in one panel of just enough vectors, the last one masked when partial: one pass over
  // the weights instead of one per vector.
  const int nv = int((rem + W - 1) / W), tail = int(rem - (nv - 1) * W);
  const bool mask = tail != W;
  auto run = [&](auto nv_c) {
    constexpr int kNv = decltype(nv_c)::value;
    if constexpr (kNv <= NV) {
      if (mask)
        cols_rows<R, C, kNv, true>(s, br0, br1, xt + p, ldx, yt + p, ldy, y_row0, tail, e);
      else
        cols_rows<R, C, kNv, false>(s, br0, br1, xt + p, ldx, yt + p, ldy, y_row0, tail, e);
    }
  };
  switch (nv) {
    case 1:
      return run(std::integral_constant<int, 1>{});
    case 2:
      return run(std::integral_constant<int, 2>{});
    case 3:
      return run(std::integral_constant<int, 3>{});
    default:
      return run(std::integral_constant<int, 4>{});
  }
}

void cols(const SpView& s, int64_t br0, int64_t br1, const float* xt, int64_t ldx, int64_t ncols,
          float* yt, int64_t ldy, int64_t y_row0, const Epilogue& e) {
  if (s.r == 1 && s.c == 1) return cols_rc<1, 1>(s, br0, br1, xt, ldx, ncols, yt, ldy, y_row0, e);
  if (s.r == 1 && s.c == 4) return cols_rc<1, 4>(s, br0, br1, xt, ldx, ncols, yt, ldy, y_row0, e);
  if (s.r == 4 && s.c == 1) return cols_rc<4, 1>(s, br0, br1, xt, ldx, ncols, yt, ldy, y_row0, e);
  if (s.r == 8 && s.c == 1) return cols_rc<8, 1>(s, br0, br1, xt, ldx, ncols, yt, ldy, y_row0, e);
  __builtin_trap();  // sparse.cpp only packs the formats above
}

// --- rows: y = x . W^T, vectorised along the R outputs of a block ------------------------------

#if LOPPER_SPARSE_ISA > 0
template <int R>
struct RowVec;
template <>
struct RowVec<4> : V4 {};
template <>
struct RowVec<8> : V8 {};
#else
template <int R>
struct RowVec : Scalar {};  // one output at a time: the loops below run R times over W = 1
#endif

// MR rows of x for one block row: MR x (R / W) accumulators, U copies for short tiles.
template <int R, int MR, int U>
inline void rows_tile(const SpView& s, int64_t br, const float* x, int64_t ldx, float* y,
                      int64_t ldy, const Epilogue& e) {
  using T = RowVec<R>;
  using V = typename T::V;
  constexpr int NW = R / T::W;
  V acc[U][MR][NW];
  LOPPER_UNROLL for (int u = 0; u < U; ++u) LOPPER_UNROLL for (int m = 0; m < MR; ++m)
      LOPPER_UNROLL for (int w = 0; w < NW; ++w) acc[u][m][w] = T::zero();
  const int32_t j1 = s.ptr[br + 1];
  int32_t j = s.ptr[br];
  auto block = [&](int u, int32_t jj) __attribute__((always_inline)) {
    const float* wb = s.val + int64_t(jj) * R;
    const int64_t k = s.col[jj];
    V wv[NW];
    LOPPER_UNROLL for (int w = 0; w < NW; ++w) wv[w] = T::load(wb + w * T::W);
    LOPPER_UNROLL for (int m = 0; m < MR; ++m) {
      V xv = T::set1(x[m * ldx + k]);
      LOPPER_UNROLL for (int w = 0; w < NW; ++w) acc[u][m][w] = T::fma(wv[w], xv, acc[u][m][w]);
    }
  };
  for (; j + U <= j1; j += U) LOPPER_UNROLL for (int u = 0; u < U; ++u) block(u, j + u);
  for (; j < j1; ++j) block(0, j);
  LOPPER_UNROLL for (int u = 1; u < U; ++u) LOPPER_UNROLL for (int m = 0; m < MR; ++m)
      LOPPER_UNROLL for (int w = 0; w < NW; ++w) acc[0][m][w] = T::add(acc[0][m][w], acc[u][m][w]);
  const int64_t n0 = br * R;
  const int nr = s.n - n0 < R ? int(s.n - n0) : R;
  // The caller pads the bias to whole blocks.
  V b[NW];
  LOPPER_UNROLL for (int w = 0; w < NW; ++w) b[w] =
      e.bias ? T::load(e.bias + n0 + w * T::W) : T::zero();
  for (int m = 0; m < MR; ++m) {
    float* dst = y + m * ldy + n0;
    if (nr == R) {
      LOPPER_UNROLL for (int w = 0; w < NW; ++w)
          T::store(dst + w * T::W, activate<T>(T::add(acc[0][m][w], b[w]), e));
    } else {
      float tmp[R];
      LOPPER_UNROLL for (int w = 0; w < NW; ++w)
          T::store(tmp + w * T::W, activate<T>(T::add(acc[0][m][w], b[w]), e));
      std::memcpy(dst, tmp, sizeof(float) * nr);
    }
  }
}

template <int R>
void rows_r(const SpView& s, int64_t br0, int64_t br1, const float* x, int64_t ldx, int64_t rows,
            float* y, int64_t ldy, const Epilogue& e) {
  constexpr int MR = LOPPER_SPARSE_ISA > 1 ? 8 : 4;
  int64_t m = 0;
  // NOTE: tiles of rows outside, so a block row's weights are read once per MR rows of x.
  for (; m + MR <= rows; m += MR)
    for (int64_t br = br0; br < br1; ++br)
      rows_tile<R, MR, 1>(s, br, x + m * ldx, ldx, y + m * ldy, ldy, e);
  for (; m < rows; ++m)
    for (int64_t br = br0; br < br1; ++br)
      rows_tile<R, 1, 4>(s, br, x + m * ldx, ldx, y + m * ldy, ldy, e);
}

void rows(const SpView& s, int64_t br0, int64_t br1, const float* x, int64_t ldx, int64_t nrows,
          float* y, int64_t ldy, const Epilogue& e) {
  if (s.c == 1 && s.r == 4) return rows_r<4>(s, br0, br1, x, ldx, nrows, y, ldy, e);
  if (s.c == 1 && s.r == 8) return rows_r<8>(s, br0, br1, x, ldx, nrows, y, ldy, e);
  __builtin_trap();
}

// --- gather: plain CSR, vectorised along an output's nonzeros ----------------------------------

inline float activate_scalar(float v, const Epilogue& e) { return activate<Scalar>(v, e); }

void gather(const SpView& s, int64_t n0, int64_t n1, const float* x, int64_t ldx, int64_t nrows,
            float* y, int64_t ldy, const Epilogue& e) {
  constexpr int MR = 4;
  for (int64_t m0 = 0; m0 < nrows; m0 += MR) {
    const int mr = nrows - m0 < MR ? int(nrows - m0) : MR;
    const float* xr = x + m0 * ldx;
    for (int64_t n = n0; n < n1; ++n) {
      const int32_t j0 = s.ptr[n], j1 = s.ptr[n + 1];
      float sum[MR] = {0, 0, 0, 0};
#if LOPPER_SPARSE_ISA > 1
      __m512 acc[MR];
      for (int m = 0; m < MR; ++m) acc[m] = _mm512_setzero_ps();
      int32_t j = j0;
      for (; j + 16 <= j1; j += 16) {
        __m512i idx = _mm512_loadu_si512(s.col + j);
        __m512 w = _mm512_loadu_ps(s.val + j);
        for (int m = 0; m < mr; ++m)
          acc[m] = _mm512_fmadd_ps(w, _mm512_i32gather_ps(idx, xr + m * ldx, 4), acc[m]);
      }
      if (j < j1) {
        __mmask16 k = static_cast<__mmask16>((1u << (j1 - j)) - 1u);
        __m512i idx = _mm512_maskz_loadu_epi32(k, s.col + j);
        __m512 w = _mm512_maskz_loadu_ps(k, s.val + j);
        for (int m = 0; m < mr; ++m)
          acc[m] = _mm512_fmadd_ps(
              w, _mm512_mask_i32gather_ps(_mm512_setzero_ps(), k, idx, xr + m * ldx, 4), acc[m]);
      }
      for (int m = 0; m < mr; ++m) sum[m] = _mm512_reduce_add_ps(acc[m]);
#elif LOPPER_SPARSE_ISA > 0
      __m256 acc[MR];
      for (int m = 0; m < MR; ++m) acc[m] = _mm256_setzero_ps();
      int32_t j = j0;
      for (; j + 8 <= j1; j += 8) {
        __m256i idx = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s.col + j));
        __m256 w = _mm256_loadu_ps(s.val + j);
        for (int m = 0; m < mr; ++m)
          acc[m] = _mm256_fmadd_ps(w, _mm256_i32gather_ps(xr + m * ldx, idx, 4), acc[m]);
      }
      if (j < j1) {
        __m256i k = V8::lanes(j1 - j);
        __m256i idx = _mm256_maskload_epi32(s.col + j, k);
        __m256 w = _mm256_maskload_ps(s.val + j, k);
        for (int m = 0; m < mr; ++m)
          acc[m] = _mm256_fmadd_ps(w,
                                   _mm256_mask_i32gather_ps(_mm256_setzero_ps(), xr + m * ldx, idx,
                                                            _mm256_castsi256_ps(k), 4),
                                   acc[m]);
      }
      for (int m = 0; m < mr; ++m) {
        __m128 h = _mm_add_ps(_mm256_castps256_ps128(acc[m]), _mm256_extractf128_ps(acc[m], 1));
        h = _mm_add_ps(h, _mm_movehl_ps(h, h));
        h = _mm_add_ss(h, _mm_movehdup_ps(h));
        sum[m] = _mm_cvtss_f32(h);
      }
#else
      for (int32_t j = j0; j < j1; ++j)
        for (int m = 0; m < mr; ++m) sum[m] += s.val[j] * xr[m * ldx + s.col[j]];
#endif
      const float b = e.bias ? e.bias[n] : 0.f;
      for (int m = 0; m < mr; ++m) y[(m0 + m) * ldy + n] = activate_scalar(sum[m] + b, e);
    }
  }
}

// NOTE: kept scalar on purpose: vectorised, this loop becomes the gather kernel above.
__attribute__((optimize("no-tree-vectorize"))) void dot(const SpView& s, int64_t n0, int64_t n1,
                                                        const float* x, int64_t ldx, int64_t nrows,
                                                        float* y, int64_t ldy, const Epilogue& e) {
  for (int64_t m = 0; m < nrows; ++m) {
    const float* xr = x + m * ldx;
    for (int64_t n = n0; n < n1; ++n) {
      const int32_t j1 = s.ptr[n + 1];
      int32_t j = s.ptr[n];
      float a0 = 0, a1 = 0, a2 = 0, a3 = 0;
      for (; j + 4 <= j1; j += 4) {
        a0 += s.val[j] * xr[s.col[j]];
        a1 += s.val[j + 1] * xr[s.col[j + 1]];
        a2 += s.val[j + 2] * xr[s.col[j + 2]];
        a3 += s.val[j + 3] * xr[s.col[j + 3]];
      }
      for (; j < j1; ++j) a0 += s.val[j] * xr[s.col[j]];
      y[m * ldy + n] = activate_scalar((a0 + a1) + (a2 + a3) + (e.bias ? e.bias[n] : 0.f), e);
    }
  }
}

// --- masked: bitmask-packed weights times a few rows of x (batch-1 to 16 decoding) -------------
//
// Per output row and chunk of 16 inputs, the chunk's kept values are read packed and spread to
// their lanes by the chunk's mask (AVX-512: an expand; AVX2: a permutation from a table, 8 lanes
// at a time; scalar: bit by bit), then multiplied by x's chunk: a weight costs 1/8 byte of mask
// plus its value only when kept. R output rows are worked at once so that their chains of packed
// offsets overlap; x's chunk is loaded once for the R rows.

inline uint32_t popcount16(uint32_t m) { return static_cast<uint32_t>(__builtin_popcount(m)); }

// How far ahead of each row's values masked_bf16 prefetches (measured on the decode benchmark;
// the float32 kernel, reading twice the bytes per instruction, is faster without). 1024 -> 2048
// once the values were expanded in registers: the 8-layer LLaMA step at 50%, bf16, 28.4-31.9 ->
// 23.9-25.7 ms (4096: 24.9-25.3; AMD EPYC Zen 4, 2 threads).
constexpr int kPrefetchBytes = 2048;

#if LOPPER_SPARSE_ISA > 1
template <bool kBf16>
inline __m512 masked_values(const void* val, int64_t at, __mmask16 m) {
  if constexpr (kBf16) {
    return _mm512_maskz_expand_ps(m, V16::load_bf16(static_cast<const uint16_t*>(val) + at));
  } else {
    return _mm512_maskz_expand_ps(m, _mm512_loadu_ps(static_cast<const float*>(val) + at));
  }
}

template <int M, int R, bool kBf16, bool kFixed>
inline void masked_block(const MaskView& w, int64_t r, const float* x, int64_t ldx, float* y,
                         int64_t ldy, const Epilogue& e) {
  __m512 acc[R][M];
  LOPPER_UNROLL for (int i = 0; i < R; ++i) LOPPER_UNROLL for (int b = 0; b < M; ++b) acc[i][b] =
      _mm512_setzero_ps();
  int64_t at[R];
  const uint16_t* mk[R];
  LOPPER_UNROLL for (int i = 0; i < R; ++i) {
    at[i] = w.off[r + i];
    mk[i] = w.mask + (r + i) * w.chunks;
  }
  const int64_t full = w.k / 16;
  auto chunk = [&](int64_t c, __mmask16 xm) __attribute__((always_inline)) {
    __m512 wv[R];
    LOPPER_UNROLL for (int i = 0; i < R; ++i) {
      const uint32_t m = mk[i][c];
      wv[i] = masked_values<kBf16>(w.val, at[i], static_cast<__mmask16>(m));
      at[i] += kFixed ? w.fixed : popcount16(m);
    }
    LOPPER_UNROLL for (int b = 0; b < M; ++b) {
      const __m512 xv = _mm512_maskz_loadu_ps(xm, x + b * ldx + c * 16);
      LOPPER_UNROLL for (int i = 0; i < R; ++i) acc[i][b] = _mm512_fmadd_ps(wv[i], xv, acc[i][b]);
    }
  };
  for (int64_t c = 0; c < full; ++c) chunk(c, static_cast<__mmask16>(0xffff));
  if (full < w.chunks) chunk(full, static_cast<__mmask16>((1u << (w.k - full * 16)) - 1u));
  LOPPER_UNROLL for (int i = 0; i < R; ++i) {
    const float bias = e.bias ? e.bias[r + i] : 0.f;
    LOPPER_UNROLL for (int b = 0; b < M; ++b) y[b * ldy + r + i] =
        activate_scalar(_mm512_reduce_add_ps(acc[i][b]) + bias, e);
  }
}
#elif LOPPER_SPARSE_ISA > 0
// NOTE: on AVX2 the kernel is bound by instructions, not memory (a 2-core Zen 3 streams the dense
// weight faster than it can spread the packed one), so each 8 inputs cost a handful: their mask
// byte read as it is stored, one table entry, one load and one shuffle (a blend for float32).

struct ExpandTables {
  // Any pattern, float32: per 8-bit mask, the packed value each lane takes (low 3 bits, for a
  // cross-lane permutation) or, sign bit set, zero (for a blend).
  int8_t perm[256][8];
  // Any pattern, bfloat16: the 8 packed values in both 128-bit halves (one broadcast load); a byte
  // shuffle moves each to the high 16 bits of its lane (bfloat16 widened to float32 for free) and
  // zeroes the others (index 0x80). The high half's values start after the low nibble's count.
  uint8_t bf16[256][32];
  // 2:4 (every nibble keeps 2, so 4 values per 8 inputs, in a fixed place): the half's 4 values in
  // both 128-bit halves; the low one takes values 0-1, the high one 2-3. float32: the 4 values of
  // the 8 inputs; bfloat16: the 8 values of 16 inputs, [h] for inputs 8h..8h+7.
  uint8_t f32_24[256][32];
  uint8_t bf16_24[2][256][32];
};
constexpr ExpandTables make_expand_tables() {
  ExpandTables t{};
  for (int m = 0; m < 256; ++m) {
    for (int j = 0, p = 0; j < 8; ++j) t.perm[m][j] = (m >> j) & 1 ? int8_t(p++) : int8_t(-128);
    for (int h = 0; h < 2; ++h) {  // 128-bit half h: lanes 4h..4h+3, nibble h of m
      const int nib = (m >> (4 * h)) & 15;
      int q = h ? __builtin_popcount(m & 15) : 0, q24 = 2 * h;
      for (int j = 0; j < 4; ++j) {
        const bool kept = (nib >> j) & 1;
        uint8_t* b = &t.bf16[m][16 * h + 4 * j];
        uint8_t* f = &t.f32_24[m][16 * h + 4 * j];
        b[0] = b[1] = 0x80;
        for (int x = 0; x < 4; ++x) f[x] = kept ? uint8_t(4 * q24 + x) : uint8_t(0x80);
        for (int g = 0; g < 2; ++g) {
          uint8_t* b24 = &t.bf16_24[g][m][16 * h + 4 * j];
          b24[0] = b24[1] = 0x80;
          b24[2] = kept ? uint8_t(2 * (4 * g + q24)) : uint8_t(0x80);
          b24[3] = kept ? uint8_t(2 * (4 * g + q24) + 1) : uint8_t(0x80);
        }
        b[2] = kept ? uint8_t(2 * q) : uint8_t(0x80);
        b[3] = kept ? uint8_t(2 * q + 1) : uint8_t(0x80);
        q += kept, q24 += kept;
      }
    }
  }
  return t;
}
alignas(64) constexpr ExpandTables kExpand = make_expand_tables();

inline __m256i table32(const uint8_t (&t)[256][32], uint32_t m8) {
  return _mm256_load_si256(reinterpret_cast<const __m256i*>(t[m8]));
}
inline __m256i broadcast16(const void* p) {
  return _mm256_broadcastsi128_si256(_mm_loadu_si128(static_cast<const __m128i*>(p)));
}

inline float hsum8(__m256 a) {
  const __m128 q = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  const __m128 d = _mm_add_ps(q, _mm_movehl_ps(q, q));
  return _mm_cvtss_f32(_mm_add_ss(d, _mm_movehdup_ps(d)));
}

// The 8 weights of 8 inputs whose mask byte is m8 and whose packed values start at p.
inline __m256 expand_f32(const float* p, uint32_t m8) {
  const __m256i idx =
      _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(kExpand.perm[m8])));
  return _mm256_blendv_ps(_mm256_permutevar8x32_ps(_mm256_loadu_ps(p), idx), _mm256_setzero_ps(),
                          _mm256_castsi256_ps(idx));
}
inline __m256 expand_bf16(const uint16_t* p, uint32_t m8) {
  return _mm256_castsi256_ps(_mm256_shuffle_epi8(broadcast16(p), table32(kExpand.bf16, m8)));
}

// One row's 16 weights at a chunk: w0 for inputs 0-7 (mask byte m0), w1 for 8-15 (m1). Counted,
// the values start at val + at, and at moves past those taken; 2:4, they start at val + at24.
template <bool kBf16, bool k24>
inline void spread_chunk(const void* val, int64_t& at, int64_t at24, uint32_t m0, uint32_t m1,
                         __m256& w0, __m256& w1) {
  const auto* v32 = static_cast<const float*>(val);
  const auto* v16 = static_cast<const uint16_t*>(val);
  if constexpr (k24 && kBf16) {
    const __m256i v = broadcast16(v16 + at24);
    w0 = _mm256_castsi256_ps(_mm256_shuffle_epi8(v, table32(kExpand.bf16_24[0], m0)));
    w1 = _mm256_castsi256_ps(_mm256_shuffle_epi8(v, table32(kExpand.bf16_24[1], m1)));
  } else if constexpr (k24) {
    const float* p = v32 + at24;
    w0 = _mm256_castsi256_ps(_mm256_shuffle_epi8(broadcast16(p), table32(kExpand.f32_24, m0)));
    w1 = _mm256_castsi256_ps(_mm256_shuffle_epi8(broadcast16(p + 4), table32(kExpand.f32_24, m1)));
  } else if constexpr (kBf16) {
    w0 = expand_bf16(v16 + at, m0);
    at += popcount16(m0);
    w1 = expand_bf16(v16 + at, m1);
    at += popcount16(m1);
  } else {
    w0 = expand_f32(v32 + at, m0);
    at += popcount16(m0);
    w1 = expand_f32(v32 + at, m1);
    at += popcount16(m1);
  }
}

// acc[i][b] += the R rows' weights (w0: inputs 0-7 of the chunk, w1: 8-15) times x's rows b < M
// at the chunk (ldx floats apart; n of its 16 inputs valid).
template <int M, int R>
inline void multiply_chunk(__m256 (&acc)[R][M], const __m256 (&w0)[R], const __m256 (&w1)[R],
                           const float* x, int64_t ldx, int n) {
  LOPPER_UNROLL for (int b = 0; b < M; ++b) {
    const float* xp = x + b * ldx;
    const __m256 x0 = n == 16 ? _mm256_loadu_ps(xp) : V8::loadm(xp, n);
    const __m256 x1 = n == 16 ? _mm256_loadu_ps(xp + 8) : V8::loadm(xp + 8, n - 8);
    LOPPER_UNROLL for (int i = 0; i < R; ++i) acc[i][b] =
        _mm256_fmadd_ps(w1[i], x1, _mm256_fmadd_ps(w0[i], x0, acc[i][b]));
  }
}

template <int M, int R, bool kBf16, bool k24>
inline void masked_block(const MaskView& w, int64_t r, const float* x, int64_t ldx, float* y,
                         int64_t ldy, const Epilogue& e) {
  __m256 acc[R][M];
  LOPPER_UNROLL for (int i = 0; i < R; ++i) LOPPER_UNROLL for (int b = 0; b < M; ++b) acc[i][b] =
      _mm256_setzero_ps();
  int64_t at[R];
  const uint8_t* mk[R];  // the masks as bytes: byte 2c + h holds inputs 16c + 8h .. + 7
  LOPPER_UNROLL for (int i = 0; i < R; ++i) {
    at[i] = w.off[r + i];
    mk[i] = reinterpret_cast<const uint8_t*>(w.mask + (r + i) * w.chunks);
  }
  // One chunk of 16 inputs: two halves of 8 per row; `n` inputs of x are valid (16: all).
  auto chunk = [&](int64_t c, int n) __attribute__((always_inline)) {
    __m256 w0[R], w1[R];
    LOPPER_UNROLL for (int i = 0; i < R; ++i) {
      spread_chunk<kBf16, k24>(w.val, at[i], at[i] + 8 * c, mk[i][2 * c], mk[i][2 * c + 1], w0[i],
                               w1[i]);
    }
    multiply_chunk<M, R>(acc, w0, w1, x + c * 16, ldx, n);
  };
  const int64_t full = w.k / 16;
  for (int64_t c = 0; c < full; ++c) chunk(c, 16);
  if (full < w.chunks) chunk(full, int(w.k - full * 16));
  LOPPER_UNROLL for (int i = 0; i < R; ++i) {
    const float bias = e.bias ? e.bias[r + i] : 0.f;
    LOPPER_UNROLL for (int b = 0; b < M; ++b) y[b * ldy + r + i] =
        activate_scalar(hsum8(acc[i][b]) + bias, e);
  }
}

// How far ahead of a tile's values the tiled kernel prefetches (measured on a 2-core Zen 3: with
// 2 KB the two cores read 4-row tiles of a 50% float32 weight from DRAM 1.2x faster than without).
constexpr int kTilePrefetchBytes = 2048;

// A tile of 4 rows (MaskView::tile == 4) times M rows of x: the tile's values are one stream, read
// in order (chunk by chunk, row by row) and prefetched ahead; its masks for a chunk are 8 bytes in
// a row (byte 8c + 2i + h: row i, inputs 16c + 8h .. + 7).
template <int M, bool kBf16, bool k24>
inline void masked_tile(const MaskView& w, int64_t r, const float* x, int64_t ldx, float* y,
                        int64_t ldy, const Epilogue& e) {
  constexpr int R = 4;
  __m256 acc[R][M];
  LOPPER_UNROLL for (int i = 0; i < R; ++i) LOPPER_UNROLL for (int b = 0; b < M; ++b) acc[i][b] =
      _mm256_setzero_ps();
  const int64_t t = r / R;
  const auto* mk = reinterpret_cast<const uint8_t*>(w.mask + t * w.chunks * R);
  // The next value of the tile (2:4: the chunk's first, half of each row's inputs per chunk).
  int64_t at = w.off[t];
  auto chunk = [&](int64_t c, int n) __attribute__((always_inline)) {
    if constexpr (k24) at = w.off[t] + 32 * c;
    if constexpr (kBf16) {
      const auto* v16 = static_cast<const uint16_t*>(w.val);
      _mm_prefetch(reinterpret_cast<const char*>(v16 + at) + kTilePrefetchBytes, _MM_HINT_T0);
    } else {
      const auto* v32 = static_cast<const float*>(w.val);
      const char* p = reinterpret_cast<const char*>(v32 + at) + kTilePrefetchBytes;
      _mm_prefetch(p, _MM_HINT_T0);
      _mm_prefetch(p + 64, _MM_HINT_T0);
    }
    __m256 w0[R], w1[R];
    LOPPER_UNROLL for (int i = 0; i < R; ++i) {
      spread_chunk<kBf16, k24>(w.val, at, at + n / 2 * i, mk[8 * c + 2 * i], mk[8 * c + 2 * i + 1],
                               w0[i], w1[i]);
    }
    multiply_chunk<M, R>(acc, w0, w1, x + c * 16, ldx, n);
  };
  const int64_t full = w.k / 16;
  for (int64_t c = 0; c < full; ++c) chunk(c, 16);
  if (full < w.chunks) chunk(full, int(w.k - full * 16));
  LOPPER_UNROLL for (int i = 0; i < R; ++i) {
    if (r + i >= w.n) break;  // the last tile's padding
    const float bias = e.bias ? e.bias[r + i] : 0.f;
    LOPPER_UNROLL for (int b = 0; b < M; ++b) y[b * ldy + r + i] =
        activate_scalar(hsum8(acc[i][b]) + bias, e);
  }
}

// Tiles of 4 rows, x's rows 4, 2 and 1 at a time (a tile's values are read again from the cache
// for each group of x's rows).
template <bool kBf16, bool k24>
void masked_tiles(const MaskView& w, int64_t r0, int64_t r1, const float* x, int64_t ldx,
                  int64_t rows, float* y, int64_t ldy, const Epilogue& e) {
  for (int64_t r = r0; r < r1; r += 4) {
    int64_t m = 0;
    for (; m + 4 <= rows; m += 4)
      masked_tile<4, kBf16, k24>(w, r, x + m * ldx, ldx, y + m * ldy, ldy, e);
    if (rows - m >= 2)
      masked_tile<2, kBf16, k24>(w, r, x + m * ldx, ldx, y + m * ldy, ldy, e), m += 2;
    if (rows - m >= 1) masked_tile<1, kBf16, k24>(w, r, x + m * ldx, ldx, y + m * ldy, ldy, e);
  }
}
#else
template <int M, int R, bool kBf16, bool kFixed>
inline void masked_block(const MaskView& w, int64_t r, const float* x, int64_t ldx, float* y,
                         int64_t ldy, const Epilogue& e) {
  for (int i = 0; i < R; ++i) {
    float acc[M] = {};
    // Row r + i is row q of its tile: per chunk, the values of the tile's rows before it are
    // skipped, then its own are read.
    const int64_t q = (r + i) % w.tile;
    int64_t at = w.off[(r + i) / w.tile];
    const uint16_t* mk = w.mask + (r + i) / w.tile * w.chunks * w.tile;
    for (int64_t c = 0; c < w.chunks; ++c) {
      for (int64_t p = 0; p < q; ++p) at += popcount16(mk[c * w.tile + p]);
      for (uint32_t m = mk[c * w.tile + q]; m != 0; m &= m - 1) {
        const int64_t j = c * 16 + __builtin_ctz(m);
        float v;
        if constexpr (kBf16) {
          const uint32_t bits = uint32_t(static_cast<const uint16_t*>(w.val)[at]) << 16;
          std::memcpy(&v, &bits, sizeof v);
        } else {
          v = static_cast<const float*>(w.val)[at];
        }
        ++at;
        for (int b = 0; b < M; ++b) acc[b] += v * x[b * ldx + j];
      }
      for (int64_t p = q + 1; p < w.tile; ++p) at += popcount16(mk[c * w.tile + p]);
    }
    const float bias = e.bias ? e.bias[r + i] : 0.f;
    for (int b = 0; b < M; ++b) y[b * ldy + r + i] = activate_scalar(acc[b] + bias, e);
  }
}
#endif

// R output rows at a time: enough independent accumulators for the FMA latency, few enough for
// the register file (R x M accumulators).
template <int M, bool kBf16, bool kFixed>
void masked_m(const MaskView& w, int64_t r0, int64_t r1, const float* x, int64_t ldx, float* y,
              int64_t ldy, const Epilogue& e) {
  constexpr int R = LOPPER_SPARSE_ISA == 0 ? 1 : (M <= 4 ? 4 : (M <= 8 ? 2 : 1));
  int64_t r = r0;
  for (; r + R <= r1; r += R) masked_block<M, R, kBf16, kFixed>(w, r, x, ldx, y, ldy, e);
  for (; r < r1; ++r) masked_block<M, 1, kBf16, kFixed>(w, r, x, ldx, y, ldy, e);
}

template <bool kBf16, bool kFixed>
void masked_dtype(const MaskView& w, int64_t r0, int64_t r1, const float* x, int64_t ldx,
                  int64_t rows, float* y, int64_t ldy, const Epilogue& e) {
  // Rows of x in groups the templates cover: 16, 8, 4, 2, 1.
  int64_t m = 0;
  for (; m + 16 <= rows; m += 16)
    masked_m<16, kBf16, kFixed>(w, r0, r1, x + m * ldx, ldx, y + m * ldy, ldy, e);
  if (rows - m >= 8)
    masked_m<8, kBf16, kFixed>(w, r0, r1, x + m * ldx, ldx, y + m * ldy, ldy, e), m += 8;
  if (rows - m >= 4)
    masked_m<4, kBf16, kFixed>(w, r0, r1, x + m * ldx, ldx, y + m * ldy, ldy, e), m += 4;
  if (rows - m >= 2)
    masked_m<2, kBf16, kFixed>(w, r0, r1, x + m * ldx, ldx, y + m * ldy, ldy, e), m += 2;
  if (rows - m >= 1) masked_m<1, kBf16, kFixed>(w, r0, r1, x + m * ldx, ldx, y + m * ldy, ldy, e);
}

void masked(const MaskView& w, int64_t r0, int64_t r1, const float* x, int64_t ldx, int64_t rows,
            float* y, int64_t ldy, const Epilogue& e) {
#if LOPPER_SPARSE_ISA == 1
  // NOTE: AVX2 addresses 2:4 by its nibbles (each keeps 2), not by the count per chunk.
  const bool fixed = w.pairs;
  if (w.tile == 4) {
    if (w.bf16)
      fixed ? masked_tiles<true, true>(w, r0, r1, x, ldx, rows, y, ldy, e)
            : masked_tiles<true, false>(w, r0, r1, x, ldx, rows, y, ldy, e);
    else
      fixed ? masked_tiles<false, true>(w, r0, r1, x, ldx, rows, y, ldy, e)
            : masked_tiles<false, false>(w, r0, r1, x, ldx, rows, y, ldy, e);
    return;
  }
#else
  const bool fixed = w.fixed > 0;
#endif
  if (w.bf16)
    fixed ? masked_dtype<true, true>(w, r0, r1, x, ldx, rows, y, ldy, e)
          : masked_dtype<true, false>(w, r0, r1, x, ldx, rows, y, ldy, e);
  else
    fixed ? masked_dtype<false, true>(w, r0, r1, x, ldx, rows, y, ldy, e)
          : masked_dtype<false, false>(w, r0, r1, x, ldx, rows, y, ldy, e);
}

#if LOPPER_SPARSE_ISA > 1
// --- masked_bf16: bfloat16 weights and x, by the CPU's bfloat16 dot product -------------------
//
// Two chunks (32 inputs) at a time: their kept values are expanded as 16-bit lanes straight from
// the packed bfloat16 (VBMI2), and one vdpbf16ps multiplies them by 32 inputs of x and adds pairs
// into 16 float32 sums: one shuffle and one FMA-port instruction per 32 weights.
#pragma GCC push_options
#pragma GCC target("avx512bw,avx512vbmi2,avx512bf16")

template <int M, int R>
inline void masked_bf16_block(const MaskView& w, int64_t r, const uint16_t* x, int64_t ldx,
                              float* y, int64_t ldy, const Epilogue& e) {
  __m512 acc[R][M];
  LOPPER_UNROLL for (int i = 0; i < R; ++i) LOPPER_UNROLL for (int b = 0; b < M; ++b) acc[i][b] =
      _mm512_setzero_ps();
  const uint16_t* val = static_cast<const uint16_t*>(w.val);
  int64_t at[R];
  const uint16_t* mk[R];
  LOPPER_UNROLL for (int i = 0; i < R; ++i) {
    at[i] = w.off[r + i];
    mk[i] = w.mask + (r + i) * w.chunks;
  }
  const int64_t pairs = (w.chunks + 1) / 2, full = w.k / 32;
  for (int64_t p = 0; p < pairs; ++p) {
    const bool whole = p < full;
    __m512i wv[R];
    LOPPER_UNROLL for (int i = 0; i < R; ++i) {
      const uint32_t lo = mk[i][2 * p], hi = 2 * p + 1 < w.chunks ? mk[i][2 * p + 1] : 0u;
      const __mmask32 m = lo | (hi << 16);
      // NOTE: a row's values are a short stream (2 KB for 2048 inputs at 50%), R of them read
      // at once: the hardware prefetcher alone leaves DRAM's bandwidth unused.
      _mm_prefetch(reinterpret_cast<const char*>(val + at[i]) + kPrefetchBytes, _MM_HINT_T0);
      // NOTE: loaded, then expanded in registers: the expand from memory is microcoded on AMD's
      // Zen 4 (the float32 kernels load first too).
      wv[i] = _mm512_maskz_expand_epi16(m, _mm512_loadu_si512(val + at[i]));
      at[i] += popcount16(lo) + popcount16(hi);
    }
    const __mmask32 xm =
        whole ? ~__mmask32(0) : static_cast<__mmask32>((uint64_t(1) << (w.k - p * 32)) - 1u);
    LOPPER_UNROLL for (int b = 0; b < M; ++b) {
      const __m512i xv = _mm512_maskz_loadu_epi16(xm, x + b * ldx + p * 32);
      LOPPER_UNROLL for (int i = 0; i < R; ++i) acc[i][b] =
          _mm512_dpbf16_ps(acc[i][b], (__m512bh)wv[i], (__m512bh)xv);
    }
  }
  LOPPER_UNROLL for (int i = 0; i < R; ++i) {
    const float bias = e.bias ? e.bias[r + i] : 0.f;
    LOPPER_UNROLL for (int b = 0; b < M; ++b) y[b * ldy + r + i] =
        activate_scalar(_mm512_reduce_add_ps(acc[i][b]) + bias, e);
  }
}

template <int M>
void masked_bf16_m(const MaskView& w, int64_t r0, int64_t r1, const uint16_t* x, int64_t ldx,
                   float* y, int64_t ldy, const Epilogue& e) {
  constexpr int R = M <= 4 ? 4 : (M <= 8 ? 2 : 1);
  int64_t r = r0;
  for (; r + R <= r1; r += R) masked_bf16_block<M, R>(w, r, x, ldx, y, ldy, e);
  for (; r < r1; ++r) masked_bf16_block<M, 1>(w, r, x, ldx, y, ldy, e);
}

void masked_bf16(const MaskView& w, int64_t r0, int64_t r1, const uint16_t* x, int64_t ldx,
                 int64_t rows, float* y, int64_t ldy, const Epilogue& e) {
  int64_t m = 0;
  for (; m + 16 <= rows; m += 16)
    masked_bf16_m<16>(w, r0, r1, x + m * ldx, ldx, y + m * ldy, ldy, e);
  if (rows - m >= 8) masked_bf16_m<8>(w, r0, r1, x + m * ldx, ldx, y + m * ldy, ldy, e), m += 8;
  if (rows - m >= 4) masked_bf16_m<4>(w, r0, r1, x + m * ldx, ldx, y + m * ldy, ldy, e), m += 4;
  if (rows - m >= 2) masked_bf16_m<2>(w, r0, r1, x + m * ldx, ldx, y + m * ldy, ldy, e), m += 2;
  if (rows - m >= 1) masked_bf16_m<1>(w, r0, r1, x + m * ldx, ldx, y + m * ldy, ldy, e);
}

#pragma GCC pop_options
#define LOPPER_MASKED_BF16 masked_bf16
#else
#define LOPPER_MASKED_BF16 nullptr
#endif

#if LOPPER_SPARSE_ISA > 0
// r[j][i] = r[i][j] for 8 vectors of 8 floats.
inline void transpose8x8_regs(__m256 r[8]) {
  __m256 t[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    r[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm256_permute2f128_ps(r[i], r[i + 4], 0x20);
    t[i + 4] = _mm256_permute2f128_ps(r[i], r[i + 4], 0x31);
  }
  for (int i = 0; i < 8; ++i) r[i] = t[i];
}

// dst[j][i] = src[i][j] for an 8 x 8 tile, in registers.
inline void transpose8x8(const float* src, int64_t lds, float* dst, int64_t ldd) {
  __m256 r[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(src + i * lds);
  transpose8x8_regs(r);
  for (int i = 0; i < 8; ++i) _mm256_storeu_ps(dst + i * ldd, r[i]);
}
#endif

// NOTE: 8 rows of the side with the longer rows at a time, each row read or written whole before
// the next 8. Those rows are often 4 KB apart (x [128, 3072], y [128, 3072]) and fall in one set
// of L1: taken a half line per 8x8 tile across all of them, every line left L1 between its halves
// (the output of 768 -> 3072 at 90%, 128 rows: 850 -> 600 us, AMD EPYC Zen 4, 2 threads).
void transpose(const float* src, int64_t rows, int64_t cols, int64_t lds, float* dst, int64_t ldd) {
#if LOPPER_SPARSE_ISA > 0
  const int64_t rows8 = rows / 8 * 8, cols8 = cols / 8 * 8;
  auto tile = [&](int64_t i, int64_t j) {
    transpose8x8(src + i * lds + j, lds, dst + j * ldd + i, ldd);
  };
  if (ldd > lds) {  // dst's rows: 8 at a time
    for (int64_t j0 = 0; j0 < cols8; j0 += 8)
      for (int64_t i0 = 0; i0 < rows8; i0 += 8) tile(i0, j0);
  } else {  // src's rows
    for (int64_t i0 = 0; i0 < rows8; i0 += 8)
      for (int64_t j0 = 0; j0 < cols8; j0 += 8) tile(i0, j0);
  }
  for (int64_t i = 0; i < rows; ++i)  // the edges
    for (int64_t j = i < rows8 ? cols8 : 0; j < cols; ++j) dst[j * ldd + i] = src[i * lds + j];
#else
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) dst[j * ldd + i] = src[i * lds + j];
#endif
}

#if LOPPER_SPARSE_ISA > 1
// --- cols_bf16: bfloat16 xt and weights in pairs, by the CPU's bfloat16 dot product ------------
//
// Per pair of inputs, their rows of xt are interleaved 16 bits at a time (unpacklo/hi_epi16: in
// each 128-bit lane, columns 0-3 and 4-7) and one vdpbf16ps per vector adds both products to 16
// float32 sums: per 2 weights and 32 columns, two loads, two shuffles and two FMA-port
// instructions, where the float32 kernel spends four loads and four FMAs. The sums come out
// permuted by the lanes; the output stage puts them back in column order.
#pragma GCC push_options
#pragma GCC target("avx512bw,avx512vbmi2,avx512bf16")

template <int R, int NV, int U>
inline void cols_bf16_panel(const PairView& w, int64_t br, const uint16_t* xt, int64_t ldx,
                            uint16_t* yt, int64_t ldy, int64_t y_row0, const Epilogue& e) {
  __m512 acc[U][R][NV][2];
  LOPPER_UNROLL for (int u = 0; u < U; ++u) LOPPER_UNROLL for (int r = 0; r < R; ++r)
      LOPPER_UNROLL for (int v = 0; v < NV; ++v) acc[u][r][v][0] = acc[u][r][v][1] =
          _mm512_setzero_ps();
  auto pair = [&](int u, int32_t j) __attribute__((always_inline)) {
    const uint16_t* x0 = xt + int64_t(w.idx[2 * j]) * ldx;
    const uint16_t* x1 = xt + int64_t(w.idx[2 * j + 1]) * ldx;
    __m512i lo[NV], hi[NV];
    LOPPER_UNROLL for (int v = 0; v < NV; ++v) {
      const __m512i a = _mm512_loadu_si512(x0 + 32 * v), b = _mm512_loadu_si512(x1 + 32 * v);
      lo[v] = _mm512_unpacklo_epi16(a, b);
      hi[v] = _mm512_unpackhi_epi16(a, b);
    }
    const uint32_t* wp = w.val + int64_t(j) * R;
    LOPPER_UNROLL for (int r = 0; r < R; ++r) {
      const __m512bh wv = (__m512bh)_mm512_set1_epi32(int(wp[r]));
      LOPPER_UNROLL for (int v = 0; v < NV; ++v) {
        acc[u][r][v][0] = _mm512_dpbf16_ps(acc[u][r][v][0], (__m512bh)lo[v], wv);
        acc[u][r][v][1] = _mm512_dpbf16_ps(acc[u][r][v][1], (__m512bh)hi[v], wv);
      }
    }
  };
  const int32_t j1 = w.ptr[br + 1];
  int32_t j = w.ptr[br];
  for (; j + U <= j1; j += U) LOPPER_UNROLL for (int u = 0; u < U; ++u) pair(u, j + u);
  for (; j < j1; ++j) pair(0, j);
  LOPPER_UNROLL for (int u = 1; u < U; ++u) LOPPER_UNROLL for (int r = 0; r < R; ++r)
      LOPPER_UNROLL for (int v = 0; v < NV; ++v) LOPPER_UNROLL for (int h = 0; h < 2; ++h)
          acc[0][r][v][h] = _mm512_add_ps(acc[0][r][v][h], acc[u][r][v][h]);
  // Sum i of the low half holds column 8 (i / 4) + i % 4, of the high half 8 (i / 4) + 4 + i % 4;
  // index 16 + i of the permutes is the high half's sum i.
  const __m512i first = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
  const __m512i second =
      _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
  const int64_t n0 = br * R;
  const int nr = w.n - n0 < R ? int(w.n - n0) : R;
  for (int r = 0; r < nr; ++r) {
    const __m512 b = _mm512_set1_ps(e.bias ? e.bias[n0 + r] : 0.f);
    uint16_t* dst = yt + (n0 + r - y_row0) * ldy;
    LOPPER_UNROLL for (int v = 0; v < NV; ++v) {
      const __m512 lo = acc[0][r][v][0], hi = acc[0][r][v][1];
      for (int h = 0; h < 2; ++h) {
        const __m512 sums = _mm512_permutex2var_ps(lo, h == 0 ? first : second, hi);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 32 * v + 16 * h),
                            Wide::bf16_bits(activate<Wide>(_mm512_add_ps(sums, b), e)));
      }
    }
  }
}

template <int R, int NV>
void cols_bf16_rows(const PairView& w, int64_t br0, int64_t br1, const uint16_t* xt, int64_t ldx,
                    uint16_t* yt, int64_t ldy, int64_t y_row0, const Epilogue& e) {
  // Sums enough for the FMA latency (vdpbf16ps: 6 cycles on Zen 4) with two FMA-port instructions
  // per pair and vector.
  constexpr int U = 2 * R * NV >= 8 ? 1 : 8 / (2 * R * NV);
  for (int64_t br = br0; br < br1; ++br)
    cols_bf16_panel<R, NV, U>(w, br, xt, ldx, yt, ldy, y_row0, e);
}

template <int R>
void cols_bf16_r(const PairView& w, int64_t br0, int64_t br1, const uint16_t* xt, int64_t ldx,
                 int64_t ncols, uint16_t* yt, int64_t ldy, int64_t y_row0, const Epilogue& e) {
  // Two vectors of 32 columns per panel, 4 x 2 x R sums; one with 8 outputs (16 sums).
  constexpr int NV = R >= 8 ? 1 : 2;
  int64_t p = 0;
  for (; p + 32 * NV <= ncols; p += 32 * NV)
    cols_bf16_rows<R, NV>(w, br0, br1, xt + p, ldx, yt + p, ldy, y_row0, e);
  if (p < ncols) cols_bf16_rows<R, 1>(w, br0, br1, xt + p, ldx, yt + p, ldy, y_row0, e);
}

void cols_bf16(const PairView& w, int64_t br0, int64_t br1, const uint16_t* xt, int64_t ldx,
               int64_t ncols, uint16_t* yt, int64_t ldy, int64_t y_row0, const Epilogue& e) {
  if (w.r == 1) return cols_bf16_r<1>(w, br0, br1, xt, ldx, ncols, yt, ldy, y_row0, e);
  if (w.r == 4) return cols_bf16_r<4>(w, br0, br1, xt, ldx, ncols, yt, ldy, y_row0, e);
  if (w.r == 8) return cols_bf16_r<8>(w, br0, br1, xt, ldx, ncols, yt, ldy, y_row0, e);
  __builtin_trap();  // sparse.cpp only packs the shapes above
}

// dst[j][i] = src[i][j] for an 8 x 8 tile of 16-bit values, in registers.
inline void transpose16_8x8(const uint16_t* src, int64_t lds, uint16_t* dst, int64_t ldd) {
  __m128i r[8], a[8];
  for (int i = 0; i < 8; ++i)
    r[i] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i * lds));
  for (int i = 0; i < 8; i += 2) {
    a[i] = _mm_unpacklo_epi16(r[i], r[i + 1]);
    a[i + 1] = _mm_unpackhi_epi16(r[i], r[i + 1]);
  }
  // a[2q] holds columns 0-3 of rows 2q and 2q + 1 interleaved, a[2q + 1] columns 4-7.
  for (int h = 0; h < 2; ++h) {
    const __m128i b0 = _mm_unpacklo_epi32(a[h], a[h + 2]), b1 = _mm_unpackhi_epi32(a[h], a[h + 2]);
    const __m128i b2 = _mm_unpacklo_epi32(a[h + 4], a[h + 6]);
    const __m128i b3 = _mm_unpackhi_epi32(a[h + 4], a[h + 6]);
    uint16_t* d = dst + 4 * h * ldd;
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d), _mm_unpacklo_epi64(b0, b2));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + ldd), _mm_unpackhi_epi64(b0, b2));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + 2 * ldd), _mm_unpacklo_epi64(b1, b3));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + 3 * ldd), _mm_unpackhi_epi64(b1, b3));
  }
}

// In 8 x 8 tiles, 8 rows of the side with the longer rows at a time (as transpose).
void transpose16(const uint16_t* src, int64_t rows, int64_t cols, int64_t lds, uint16_t* dst,
                 int64_t ldd) {
  const int64_t rows8 = rows / 8 * 8, cols8 = cols / 8 * 8;
  auto tile = [&](int64_t i, int64_t j) {
    transpose16_8x8(src + i * lds + j, lds, dst + j * ldd + i, ldd);
  };
  if (ldd > lds) {
    for (int64_t j0 = 0; j0 < cols8; j0 += 8)
      for (int64_t i0 = 0; i0 < rows8; i0 += 8) tile(i0, j0);
  } else {
    for (int64_t i0 = 0; i0 < rows8; i0 += 8)
      for (int64_t j0 = 0; j0 < cols8; j0 += 8) tile(i0, j0);
  }
  for (int64_t i = 0; i < rows; ++i)  // the edges
    for (int64_t j = i < rows8 ? cols8 : 0; j < cols; ++j) dst[j * ldd + i] = src[i * lds + j];
}

#pragma GCC pop_options
#define LOPPER_COLS_BF16 cols_bf16, transpose16
#else
#define LOPPER_COLS_BF16 nullptr, nullptr
#endif

// --- dense_panels: a dense W times a few rows of x (a product of one token or one image) -------

// MX rows of x through the panels [q0, q1) of W (each [k][W]: k steps of a vector of W outputs),
// U partial sums a row along k; a panel is one run of memory, x's values broadcast.
template <int MX>
void dense_panels_mx(const float* p, int64_t k, int64_t q0, int64_t q1, const float* x, int64_t ldx,
                     float* y, int64_t ldy, int64_t n, const Epilogue& e) {
  using T = Wide;
  using V = typename T::V;
  constexpr int64_t W = T::W;
  constexpr int U = MX == 1 ? 4 : 2;
  for (int64_t q = q0; q < q1; ++q) {
    const float* b = p + q * k * W;
    V acc[MX][U];
    LOPPER_UNROLL for (int m = 0; m < MX; ++m) LOPPER_UNROLL for (int u = 0; u < U; ++u) acc[m][u] =
        T::zero();
    int64_t j = 0;
    for (; j + U <= k; j += U) {
      LOPPER_UNROLL for (int u = 0; u < U; ++u) {
        const V wv = T::load(b + (j + u) * W);
        LOPPER_UNROLL for (int m = 0; m < MX; ++m) acc[m][u] =
            T::fma(wv, T::set1(x[m * ldx + j + u]), acc[m][u]);
      }
    }
    for (; j < k; ++j) {
      const V wv = T::load(b + j * W);
      LOPPER_UNROLL for (int m = 0; m < MX; ++m) acc[m][0] =
          T::fma(wv, T::set1(x[m * ldx + j]), acc[m][0]);
    }
    const int64_t o = q * W;
    const int valid = int(std::min<int64_t>(W, n - o));
    const V bias = !e.bias      ? T::zero()
                   : valid == W ? T::load(e.bias + o)
                                : T::loadm(e.bias + o, valid);
    LOPPER_UNROLL for (int m = 0; m < MX; ++m) {
      V sum = acc[m][0];
      LOPPER_UNROLL for (int u = 1; u < U; ++u) sum = T::add(sum, acc[m][u]);
      const V out = activate<T>(T::add(sum, bias), e);
      if (valid == W)
        T::store(y + m * ldy + o, out);
      else
        T::storem(y + m * ldy + o, out, valid);
    }
  }
}

// The widest product of rows of x the registers hold: 4 rows x 2 sums with AVX-512's 32
// registers, 2 x 2 with AVX2's 16.
constexpr int kDenseMaxRows = Wide::W >= 16 ? 4 : Wide::W >= 8 ? 2 : 1;

void dense_panels(const float* p, int64_t k, int64_t q0, int64_t q1, const float* x, int64_t ldx,
                  int64_t rows, float* y, int64_t ldy, int64_t n, const Epilogue& e) {
  for (int64_t m = 0; m < rows; m += kDenseMaxRows) {
    const int64_t mx = std::min<int64_t>(kDenseMaxRows, rows - m);
    const float* xm = x + m * ldx;
    float* ym = y + m * ldy;
    if (mx == 4)
      dense_panels_mx<kDenseMaxRows >= 4 ? 4 : 1>(p, k, q0, q1, xm, ldx, ym, ldy, n, e);
    else if (mx == 3)
      dense_panels_mx<kDenseMaxRows >= 3 ? 3 : 1>(p, k, q0, q1, xm, ldx, ym, ldy, n, e);
    else if (mx == 2)
      dense_panels_mx<kDenseMaxRows >= 2 ? 2 : 1>(p, k, q0, q1, xm, ldx, ym, ldy, n, e);
    else
      dense_panels_mx<1>(p, k, q0, q1, xm, ldx, ym, ldy, n, e);
  }
}

// --- masked_panels: a bfloat16 W in panels of 16 rows times float32 x, by a plain loop -----------
//
// For x not in bfloat16 or a CPU without the bfloat16 dot product (masked_panels_bf16 below is the
// fast path). Every weight of a step multiplies, a zero one too, as a dense product's would (an
// infinite input times a pruned weight is NaN in both).
void masked_panels(const MaskView& w, int64_t t0, int64_t t1, const float* x, int64_t ldx,
                   int64_t rows, float* y, int64_t ldy, const Epilogue& e) {
  constexpr int64_t W = 16;
  const int64_t k = w.k, steps = (k + 1) / 2;
  const auto* val = static_cast<const uint16_t*>(w.val);
  const bool pairs = w.pairs && w.bf16;  // float32 panels are bitmasks, 2:4 or not
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t valid = std::min<int64_t>(W, w.n - t * W);
    for (int64_t m = 0; m < rows; ++m) {
      float acc[W] = {};
      int64_t at = w.off[t];
      if (pairs) {  // 2:4: per 4 inputs each row's two kept ones
        for (int64_t g = 0; g < k / 4; ++g) {
          const uint32_t* ids = w.pmask + 2 * (t * (k / 4) + g);
          const float* xg = x + m * ldx + 4 * g;
          for (int64_t i = 0; i < W; ++i) {
            const int* kept = kPairOf[(ids[i % 2] >> (4 * (i / 2))) & 15u];
            acc[i] += from_bf16(val[at + 2 * i]) * xg[kept[0]] +
                      from_bf16(val[at + 2 * i + 1]) * xg[kept[1]];
          }
          at += 32;
        }
      }
      for (int64_t s = 0; !pairs && w.bf16 && s < steps; ++s) {
        const uint32_t bits = w.pmask[t * steps + s];
        for (int64_t i = 0; i < W; ++i)
          for (int64_t j = 0; j < 2 && 2 * s + j < k; ++j) {
            const float v = (bits >> (2 * i + j)) & 1u ? from_bf16(val[at++]) : 0.f;
            acc[i] += v * x[m * ldx + 2 * s + j];
          }
      }
      const auto* v32 = static_cast<const float*>(w.val);
      for (int64_t s = 0; !w.bf16 && s < steps; ++s) {
        const uint32_t bits = w.pmask[t * steps + s];
        for (int64_t j = 0; j < 2 && 2 * s + j < k; ++j)
          for (int64_t i = 0; i < W; ++i) {
            const float v = (bits >> (16 * j + i)) & 1u ? v32[at++] : 0.f;
            acc[i] += v * x[m * ldx + 2 * s + j];
          }
      }
      for (int64_t i = 0; i < valid; ++i)
        y[m * ldy + t * W + i] = activate_scalar(acc[i] + (e.bias ? e.bias[t * W + i] : 0.f), e);
    }
  }
}

#if LOPPER_SPARSE_ISA > 1
// f(std::integral_constant<int, MX>{}, m) for rows m .. m + MX - 1 of x, 4 rows at a time.
template <class F>
inline void four_rows_at_a_time(int64_t rows, F&& f) {
  for (int64_t m = 0; m < rows; m += 4) {
    switch (std::min<int64_t>(4, rows - m)) {
      case 4:
        f(std::integral_constant<int, 4>{}, m);
        break;
      case 3:
        f(std::integral_constant<int, 3>{}, m);
        break;
      case 2:
        f(std::integral_constant<int, 2>{}, m);
        break;
      default:
        f(std::integral_constant<int, 1>{}, m);
    }
  }
}

// MX rows' U partial sums of one panel, set to zero.
template <int MX, int U>
__attribute__((always_inline)) inline void zero_sums(__m512 (&acc)[MX][U]) {
  LOPPER_UNROLL for (int m = 0; m < MX; ++m) LOPPER_UNROLL for (int u = 0; u < U; ++u) acc[m][u] =
      _mm512_setzero_ps();
}

// The 16 outputs from o (of n) of MX rows of x: each row's U partial sums added, the bias added and
// activated; store(m, vm, v) writes row m's vector v (vm: its lanes within n).
template <int MX, int U, class Store>
inline void finish_panel(__m512 (&acc)[MX][U], int64_t o, int64_t n, const Epilogue& e,
                         Store&& store) {
  const int valid = int(std::min<int64_t>(16, n - o));
  const __mmask16 vm = static_cast<__mmask16>((1u << valid) - 1u);
  const __m512 bias = e.bias ? _mm512_maskz_loadu_ps(vm, e.bias + o) : _mm512_setzero_ps();
  LOPPER_UNROLL for (int m = 0; m < MX; ++m) {
    __m512 sum = acc[m][0];
    LOPPER_UNROLL for (int u = 1; u < U; ++u) sum = _mm512_add_ps(sum, acc[m][u]);
    store(m, vm, activate<V16>(_mm512_add_ps(sum, bias), e));
  }
}

// --- masked_panels_f32: a bitmask-packed float32 W in panels of 16 rows -------------------------
//
// Per input, the 16 rows' kept values expanded to a vector (vexpandps) and multiplied by x's input
// broadcast: two runs of memory per panel read in order, as the bf16 panels.
template <int MX>
void masked_panels_f32_mx(const MaskView& w, int64_t t0, int64_t t1, const float* x, int64_t ldx,
                          float* y, int64_t ldy, const Epilogue& e) {
  constexpr int64_t W = 16;
  constexpr int U = MX == 1 ? 4 : 2;
  const int64_t k = w.k, steps = (k + 1) / 2, whole = k / 2;
  const auto* val = static_cast<const float*>(w.val);
  for (int64_t t = t0; t < t1; ++t) {
    const uint32_t* mk = w.pmask + t * steps;
    int64_t at = w.off[t];
    __m512 acc[MX][U];
    zero_sums(acc);
    auto step = [&](int u, int64_t s, bool tail) __attribute__((always_inline)) {
      const uint32_t bits = mk[s], lo = bits & 0xffffu, hi = bits >> 16;
      const __m512 v0 =
          _mm512_maskz_expand_ps(static_cast<__mmask16>(lo), _mm512_loadu_ps(val + at));
      at += __builtin_popcount(lo);
      const __m512 v1 =
          _mm512_maskz_expand_ps(static_cast<__mmask16>(hi), _mm512_loadu_ps(val + at));
      at += __builtin_popcount(hi);
      LOPPER_UNROLL for (int m = 0; m < MX; ++m) {
        const float* xm = x + m * ldx + 2 * s;
        acc[m][u] = _mm512_fmadd_ps(v0, _mm512_set1_ps(xm[0]), acc[m][u]);
        if (!tail) acc[m][u] = _mm512_fmadd_ps(v1, _mm512_set1_ps(xm[1]), acc[m][u]);
      }
    };
    int64_t s = 0;
    for (; s + U <= whole; s += U) LOPPER_UNROLL for (int u = 0; u < U; ++u) step(u, s + u, false);
    for (; s < steps; ++s) step(0, s, s >= whole);
    const int64_t o = t * W;
    finish_panel(acc, o, w.n, e, [&](int m, __mmask16 vm, __m512 v) {
      _mm512_mask_storeu_ps(y + m * ldy + o, vm, v);
    });
  }
}

void masked_panels_f32(const MaskView& w, int64_t t0, int64_t t1, const float* x, int64_t ldx,
                       int64_t rows, float* y, int64_t ldy, const Epilogue& e) {
  four_rows_at_a_time(rows, [&](auto mx, int64_t m) {
    masked_panels_f32_mx<decltype(mx)::value>(w, t0, t1, x + m * ldx, ldx, y + m * ldy, ldy, e);
  });
}
#define LOPPER_MASKED_PANELS_F32 masked_panels_f32
#else
#define LOPPER_MASKED_PANELS_F32 nullptr
#endif

#if LOPPER_SPARSE_ISA > 1
// --- dense_panels_bf16: a dense bfloat16 W times a few bfloat16 rows of x, by vdpbf16ps ---------
//
// A panel is [ceil(k / 2)][16] 32-bit words, each two bf16 weights of consecutive inputs for one
// output: per pair of inputs one 64-byte load, and per row of x one broadcast of its two inputs
// (a 32-bit word) and one vdpbf16ps adding both products to 16 float32 sums. Half the bytes of the
// float32 panels for the same outputs: at batch 1 the product is the weight's read.
#pragma GCC push_options
#pragma GCC target("avx512bw,avx512bf16")

// Row m of x's inputs 2j and 2j + 1 as one 32-bit word (the second zero past an odd k).
inline int32_t x_pair(const uint16_t* x, int64_t j, int64_t k) {
  if (2 * j + 1 < k) {
    int32_t v;
    std::memcpy(&v, x + 2 * j, sizeof(v));
    return v;
  }
  return int32_t(x[2 * j]);
}

// acc[m][u] += wv times row m of x's inputs 2j and 2j + 1, for MX rows (tail: the last pair, whose
// second input is zero past an odd k).
template <int MX, int U>
__attribute__((always_inline)) inline void multiply_pair(__m512 (&acc)[MX][U], int u, __m512bh wv,
                                                         const uint16_t* x, int64_t ldx, int64_t j,
                                                         int64_t k, bool tail) {
  LOPPER_UNROLL for (int m = 0; m < MX; ++m) {
    int32_t xv;
    if (tail) {
      xv = x_pair(x + m * ldx, j, k);
    } else {
      std::memcpy(&xv, x + m * ldx + 2 * j, sizeof(xv));
    }
    acc[m][u] = _mm512_dpbf16_ps(acc[m][u], wv, (__m512bh)_mm512_set1_epi32(xv));
  }
}

// The 16 outputs from o (of n) of MX rows of x, finished (finish_panel), rounded to bf16 and
// stored.
template <int MX, int U>
inline void store_panel_bf16(__m512 (&acc)[MX][U], int64_t o, int64_t n, uint16_t* y, int64_t ldy,
                             const Epilogue& e) {
  finish_panel(acc, o, n, e, [&](int m, __mmask16 vm, __m512 v) {
    _mm256_mask_storeu_epi16(y + m * ldy + o, vm, V16::bf16_bits(v));
  });
}

template <int MX>
void dense_panels_bf16_mx(const uint32_t* p, int64_t k, int64_t q0, int64_t q1, const uint16_t* x,
                          int64_t ldx, uint16_t* y, int64_t ldy, int64_t n, const Epilogue& e) {
  constexpr int64_t W = 16;
  // Sums enough for vdpbf16ps's latency (6 cycles on Zen 4) at one load per step.
  constexpr int U = MX == 1 ? 4 : 2;
  const int64_t pairs = (k + 1) / 2, whole = k / 2;
  for (int64_t q = q0; q < q1; ++q) {
    const uint32_t* b = p + q * pairs * W;
    __m512 acc[MX][U];
    zero_sums(acc);
    auto step = [&](int u, int64_t j, bool tail) __attribute__((always_inline)) {
      multiply_pair(acc, u, (__m512bh)_mm512_loadu_si512(b + j * W), x, ldx, j, k, tail);
    };
    int64_t j = 0;
    for (; j + U <= whole; j += U) LOPPER_UNROLL for (int u = 0; u < U; ++u) step(u, j + u, false);
    for (; j < pairs; ++j) step(0, j, true);
    store_panel_bf16<MX, U>(acc, q * W, n, y, ldy, e);
  }
}

void dense_panels_bf16(const uint32_t* p, int64_t k, int64_t q0, int64_t q1, const uint16_t* x,
                       int64_t ldx, int64_t rows, uint16_t* y, int64_t ldy, int64_t n,
                       const Epilogue& e) {
  four_rows_at_a_time(rows, [&](auto mx, int64_t m) {
    dense_panels_bf16_mx<decltype(mx)::value>(p, k, q0, q1, x + m * ldx, ldx, y + m * ldy, ldy, n,
                                              e);
  });
}

// --- masked_panels_bf16: a bitmask-packed bfloat16 W in panels of 16 rows, by vdpbf16ps ----------
//
// The dense panels' order with the zeros left out: per pair of inputs, a 32-bit mask (bit 2i + j:
// row i of the panel keeps input 2s + j) and the kept values packed, expanded as 16-bit lanes
// (VBMI2) into the 16 words of two bf16 one vdpbf16ps multiplies by a broadcast pair of x. Each
// panel is two runs of memory read in order (its masks and its values), as the dense panels are
// one; the outputs come out a vector at a time, with no horizontal sum.
#pragma GCC push_options
#pragma GCC target("avx512bw,avx512vbmi2,avx512bf16")

template <int MX>
void masked_panels_bf16_mx(const MaskView& w, int64_t t0, int64_t t1, const uint16_t* x,
                           int64_t ldx, uint16_t* y, int64_t ldy, const Epilogue& e) {
  constexpr int64_t W = 16;
  // Sums enough for vdpbf16ps's latency (6 cycles on Zen 4).
  constexpr int U = MX == 1 ? 4 : 2;
  const int64_t k = w.k, steps = (k + 1) / 2, whole = k / 2;
  const auto* val = static_cast<const uint16_t*>(w.val);
  for (int64_t t = t0; t < t1; ++t) {
    const uint32_t* mk = w.pmask + t * steps;
    int64_t at = w.off[t];
    __m512 acc[MX][U];
    zero_sums(acc);
    auto step = [&](int u, int64_t s, bool tail) __attribute__((always_inline)) {
      const uint32_t bits = mk[s];
      __m512i packed = _mm512_loadu_si512(val + at);
      // NOTE: kept apart from the expand (GCC would fold the load into vpexpandw's memory form).
      // Without it, batch 1 4096 -> 4096 at 50%: 0.49-0.51 ms against 0.30-0.33 (AMD EPYC Zen 4,
      // three alternations); 4096 -> 11008 1.41-1.56 against 1.24-1.34.
      asm("" : "+v"(packed));
      const __m512bh wv = (__m512bh)_mm512_maskz_expand_epi16(bits, packed);
      at += __builtin_popcount(bits);
      multiply_pair(acc, u, wv, x, ldx, s, k, tail);
    };
    int64_t s = 0;
    for (; s + U <= whole; s += U) LOPPER_UNROLL for (int u = 0; u < U; ++u) step(u, s + u, false);
    for (; s < steps; ++s) step(0, s, s >= whole);
    store_panel_bf16<MX, U>(acc, t * W, w.n, y, ldy, e);
  }
}

// 2:4 panels: no mask to expand and no count to follow. Per 4 inputs, the 16 rows' patterns
// (4 bits each) select from a table in a register the bytes of x's 4 inputs each row multiplies
// (vpermd, then vpshufb of the 4 inputs broadcast), and the step's 32 values are one load.
template <int MX>
void pairs_panels_bf16_mx(const MaskView& w, int64_t t0, int64_t t1, const uint16_t* x, int64_t ldx,
                          uint16_t* y, int64_t ldy, const Epilogue& e) {
  constexpr int64_t W = 16;
  constexpr int U = MX == 1 ? 4 : 2;
  const int64_t groups = w.k / 4;
  // Pattern p's bytes of the 4 inputs (8 bytes, in both halves of each 128-bit lane): the first
  // kept input's 2 bytes, then the second's.
  alignas(64) uint32_t bytes[W] = {};
  for (int p = 0; p < 6; ++p) {
    const uint32_t a = 2u * uint32_t(kPairOf[p][0]), b = 2u * uint32_t(kPairOf[p][1]);
    bytes[p] = a | (a + 1) << 8 | b << 16 | (b + 1) << 24;
  }
  const __m512i table = _mm512_load_si512(bytes);
  // Row i's pattern: the 64-bit word broadcast, 32-bit lane i holds half i % 2; shifted by its
  // place, its low 4 bits (all vpermd reads) are the pattern.
  const __m512i shifts = _mm512_set_epi32(28, 28, 24, 24, 20, 20, 16, 16, 12, 12, 8, 8, 4, 4, 0, 0);
  const auto* val = static_cast<const uint16_t*>(w.val);
  for (int64_t t = t0; t < t1; ++t) {
    const uint32_t* ids = w.pmask + 2 * t * groups;
    const uint16_t* v = val + w.off[t];
    __m512 acc[MX][U];
    zero_sums(acc);
    auto step = [&](int u, int64_t g) __attribute__((always_inline)) {
      int64_t id;
      std::memcpy(&id, ids + 2 * g, sizeof(id));
      const __m512i pick =
          _mm512_permutexvar_epi32(_mm512_srlv_epi32(_mm512_set1_epi64(id), shifts), table);
      const __m512bh wv = (__m512bh)_mm512_loadu_si512(v + 32 * g);
      LOPPER_UNROLL for (int m = 0; m < MX; ++m) {
        int64_t xq;
        std::memcpy(&xq, x + m * ldx + 4 * g, sizeof(xq));
        const __m512i xv = _mm512_shuffle_epi8(_mm512_set1_epi64(xq), pick);
        acc[m][u] = _mm512_dpbf16_ps(acc[m][u], wv, (__m512bh)xv);
      }
    };
    int64_t g = 0;
    for (; g + U <= groups; g += U) LOPPER_UNROLL for (int u = 0; u < U; ++u) step(u, g + u);
    for (; g < groups; ++g) step(0, g);
    store_panel_bf16<MX, U>(acc, t * W, w.n, y, ldy, e);
  }
}

void masked_panels_bf16(const MaskView& w, int64_t t0, int64_t t1, const uint16_t* x, int64_t ldx,
                        int64_t rows, uint16_t* y, int64_t ldy, const Epilogue& e) {
  four_rows_at_a_time(rows, [&](auto mx, int64_t m) {
    constexpr int MX = decltype(mx)::value;
    if (w.pairs)
      pairs_panels_bf16_mx<MX>(w, t0, t1, x + m * ldx, ldx, y + m * ldy, ldy, e);
    else
      masked_panels_bf16_mx<MX>(w, t0, t1, x + m * ldx, ldx, y + m * ldy, ldy, e);
  });
}

#pragma GCC pop_options
#define LOPPER_DENSE_PANELS_BF16 dense_panels_bf16
#define LOPPER_MASKED_PANELS_BF16 masked_panels_bf16
#else
#define LOPPER_DENSE_PANELS_BF16 nullptr
#define LOPPER_MASKED_PANELS_BF16 nullptr
#endif

}  // namespace

extern const SparseIsaOps LOPPER_OPS_NAME;
const SparseIsaOps LOPPER_OPS_NAME = {LOPPER_OPS_LABEL,
                                      cols,
                                      rows,
                                      gather,
                                      dot,
                                      masked,
                                      LOPPER_MASKED_BF16,
                                      transpose,
                                      LOPPER_COLS_BF16,
                                      Wide::W,
                                      dense_panels,
                                      LOPPER_DENSE_PANELS_BF16,
                                      masked_panels,
                                      LOPPER_MASKED_PANELS_F32,
                                      LOPPER_MASKED_PANELS_BF16};

}  // namespace lopper::kernels::cpu
