// The transforms of Winograd's F(4x4, 3x3) convolution in NHWC (conv_isa.h's wino_input and
// wino_output; kernels/cpu/winograd.h), written once over the vector types of vec_impl.h and
// compiled per ISA with conv_impl.h. The channels are the vector lanes: a tile's 6x6 input window
// is 36 vectors of channels, transformed by adds and multiplies by small constants.
//
//   Y = A^T [(G g G^T) . (B^T d B)] A,  d: a 6x6 input window, g: a 3x3 kernel, Y: 4x4 outputs,
//   with the interpolation points 0, 1, -1, 2, -2 and infinity (Lavin and Gray, 2016):
//   B^T = [4 0 -5 0 1 0; 0 -4 -4 1 1 0; 0 4 -4 -1 1 0; 0 -2 -1 2 1 0; 0 2 -1 -2 1 0; 0 4 0 -5 0 1]
//   A^T = [1 1 1 1 1 0; 0 1 -1 2 -2 0; 0 1 1 4 4 0; 0 1 -1 8 -8 1]
#pragma once

#include <algorithm>
#include <cstdint>

#include "kernels/cpu/conv_isa.h"
#include "kernels/cpu/vec_impl.h"

namespace lopper::kernels::cpu {
namespace {

template <class T>
struct Wino {
  using V = typename T::V;
  static constexpr int kTile = 4, kAlpha = 6;

  // o = B^T d for six vectors d (a column or a row of a window).
  static void bt(const V* d, V* o) {
    const V four = T::set1(4.f), mfive = T::set1(-5.f), mfour = T::set1(-4.f), two = T::set1(2.f);
    o[0] = T::fma(four, d[0], T::fma(mfive, d[2], d[4]));
    o[1] = T::fma(mfour, T::add(d[1], d[2]), T::add(d[3], d[4]));
    o[2] = T::fma(four, T::sub(d[1], d[2]), T::sub(d[4], d[3]));
    o[3] = T::fma(two, T::sub(d[3], d[1]), T::sub(d[4], d[2]));
    o[4] = T::fma(two, T::sub(d[1], d[3]), T::sub(d[4], d[2]));
    o[5] = T::fma(four, d[1], T::fma(mfive, d[3], d[5]));
  }

  // o = A^T m for six vectors m.
  static void at(const V* m, V* o) {
    const V a = T::add(m[1], m[2]), b = T::sub(m[1], m[2]);
    const V c = T::add(m[3], m[4]), d = T::sub(m[3], m[4]);
    o[0] = T::add(T::add(m[0], a), c);
    o[1] = T::fma(T::set1(2.f), d, b);
    o[2] = T::fma(T::set1(4.f), c, a);
    o[3] = T::add(T::fma(T::set1(8.f), d, b), m[5]);
  }
};

// n <= W values at p as a vector (the lanes past n zero): float32, or bfloat16 widened (exactly).
template <class T>
inline typename T::V load_n(const float* p, int n) {
  return n == T::W ? T::load(p) : T::loadm(p, n);
}
template <class T>
inline typename T::V load_n(const uint16_t* p, int n) {
  if (n == T::W) return T::load_bf16(p);
  uint16_t part[T::W] = {};
  std::copy(p, p + n, part);
  return T::load_bf16(part);
}

// The first n lanes of v to p: float32, or rounded to bfloat16 (to_bf16).
template <class T>
inline void store_n(float* p, typename T::V v, int n) {
  if (n == T::W)
    T::store(p, v);
  else
    T::storem(p, v, n);
}
template <class T>
inline void store_n(uint16_t* p, typename T::V v, int n) {
  if (n == T::W) return T::store_bf16(p, v);
  uint16_t part[T::W];
  T::store_bf16(part, v);
  std::copy(part, part + n, p);
}

// The output tiles of s: rows and columns of 4x4 tiles.
struct WinoTiles {
  int64_t rows, cols;
  explicit WinoTiles(const ConvShape& s) : rows((s.oh + 3) / 4), cols((s.ow + 3) / 4) {}
};

template <class T, class E>
void wino_input_tiles(const E* x, const ConvShape& s, int64_t t0, int64_t nt, float* v,
                      int64_t ldv) {
  using V = typename T::V;
  using F = Wino<T>;
  constexpr int W = T::W, A = F::kAlpha;
  const int64_t xs = s.x_stride ? s.x_stride : s.c, per_pos = nt * ldv;
  const WinoTiles tl(s);
  for (int64_t t = 0; t < nt; ++t) {
    const int64_t tile = t0 + t, img = tile / (tl.rows * tl.cols);
    const int64_t iy0 = tile / tl.cols % tl.rows * F::kTile - s.ph;
    const int64_t ix0 = tile % tl.cols * F::kTile - s.pw;
    const bool inside = iy0 >= 0 && ix0 >= 0 && iy0 + A <= s.h && ix0 + A <= s.w;
    const E* base = x + img * s.h * s.w * xs;
    float* vt = v + t * ldv;
    for (int64_t c = 0; c < s.c; c += W) {
      const int n = int(std::min<int64_t>(W, s.c - c));
      V d[A][A];
      LOPPER_UNROLL
      for (int i = 0; i < A; ++i) {
        const int64_t iy = iy0 + i;
        LOPPER_UNROLL
        for (int j = 0; j < A; ++j) {
          const int64_t ix = ix0 + j;
          if (inside || (iy >= 0 && iy < s.h && ix >= 0 && ix < s.w)) {
            d[i][j] = load_n<T>(base + (iy * s.w + ix) * xs + c, n);
          } else {
            d[i][j] = T::zero();
          }
        }
      }
      V cols[A][A];  // B^T d, column by column (cols[j] holds column j)
      LOPPER_UNROLL
      for (int j = 0; j < A; ++j) {
        V col[A];
        LOPPER_UNROLL
        for (int i = 0; i < A; ++i) col[i] = d[i][j];
        F::bt(col, cols[j]);
      }
      LOPPER_UNROLL
      for (int i = 0; i < A; ++i) {  // row i of B^T d, times B
        V row[A], o[A];
        LOPPER_UNROLL
        for (int j = 0; j < A; ++j) row[j] = cols[j][i];
        F::bt(row, o);
        LOPPER_UNROLL
        for (int j = 0; j < A; ++j) T::store(vt + (i * A + j) * per_pos + c, o[j]);
      }
    }
  }
}

template <class T, class E>
void wino_output_tiles(const float* m, int64_t ldm, const ConvShape& s, int64_t t0, int64_t nt,
                       int64_t k0, int64_t k1, E* y, const E* res, const Epilogue& e) {
  using V = typename T::V;
  using F = Wino<T>;
  constexpr int W = T::W, A = F::kAlpha, R = F::kTile;
  const int64_t ys = s.y_stride ? s.y_stride : s.k, rs = s.r_stride ? s.r_stride : s.k;
  const int64_t per_pos = nt * ldm;
  const WinoTiles tl(s);
  for (int64_t t = 0; t < nt; ++t) {
    const int64_t tile = t0 + t, img = tile / (tl.rows * tl.cols);
    const int64_t oy0 = tile / tl.cols % tl.rows * R, ox0 = tile % tl.cols * R;
    const int rows = int(std::min<int64_t>(R, s.oh - oy0));
    const int cols = int(std::min<int64_t>(R, s.ow - ox0));
    const float* mt = m + t * ldm;
    for (int64_t k = k0; k < k1; k += W) {
      const int n = int(std::min<int64_t>(W, k1 - k));
      V half[R][A];  // A^T m, column by column
      LOPPER_UNROLL
      for (int j = 0; j < A; ++j) {
        V col[A], o[R];
        LOPPER_UNROLL
        for (int i = 0; i < A; ++i) col[i] = T::load(mt + (i * A + j) * per_pos + k);
        F::at(col, o);
        LOPPER_UNROLL
        for (int r = 0; r < R; ++r) half[r][j] = o[r];
      }
      const V b = e.bias ? T::loadm(e.bias + k, n) : T::zero();
      for (int r = 0; r < rows; ++r) {
        V o[R];
        F::at(half[r], o);
        const int64_t pix0 = (img * s.oh + oy0 + r) * s.ow + ox0;
        for (int q = 0; q < cols; ++q) {
          V val = T::add(o[q], b);
          if (res) val = T::add(val, load_n<T>(res + (pix0 + q) * rs + k, n));
          store_n<T>(y + (pix0 + q) * ys + k, activate<T>(val, e), n);
        }
      }
    }
  }
}

}  // namespace
}  // namespace lopper::kernels::cpu
