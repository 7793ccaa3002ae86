// Dense direct and depthwise convolution in NHWC, written once over the vector types of vec_impl.h
// and compiled per ISA (internal; plain C++). Work in progress for issue 22: not yet called by the
// executor.
//
// y[n, oy, ox, k] = act(bias[k] + residual[n, oy, ox, k] +
//                       sum_{kh, kw, c} x[n, oy*sh - ph + kh*dh, ox*sw - pw + kw*dw, c] * w[k, c,
//                       kh, kw])
//
// Pixels are `x_stride` / `y_stride` / `r_stride` floats apart (at least the channel count), so a
// producer can write its channels into a slice of a wider buffer (Concat in place). The weight is
// packed once into blocks of NB output channels: [K/NB][KH][KW][C][NB], the last block padded with
// zeros. The microkernel keeps MR output pixels x NB channels in registers and streams the taps;
// pixels whose taps all fall inside the input (the interior) take it MR at a time, the border
// pixels one at a time with their taps checked.
#pragma once

#include <algorithm>
#include <cstdint>

#include "kernels/cpu/vec_impl.h"

namespace lopper::kernels::cpu {

struct ConvShape {
  int64_t n = 1, h = 1, w = 1, c = 1;  // input, NHWC
  int64_t oh = 1, ow = 1, k = 1;       // output rows, columns and channels
  int64_t kh = 1, kw = 1, sh = 1, sw = 1, ph = 0, pw = 0, dh = 1, dw = 1;
  int64_t x_stride = 0, y_stride = 0, r_stride = 0;  // floats between pixels (0: c, k, k)
};

namespace {

template <class T>
struct ConvTraits {
  static constexpr int kNB = 2 * T::W;             // output channels per block: two vectors
  static constexpr int kMR = T::W >= 16 ? 12 : 6;  // output pixels per microkernel call
};

inline int64_t conv_blocks(const ConvShape& s, int nb) { return (s.k + nb - 1) / nb; }

// The output columns [lo, hi] whose every tap falls inside the input; lo > hi when none does.
struct Interior {
  int64_t lo, hi;
};
inline Interior interior_columns(const ConvShape& s) {
  const int64_t last = s.w - 1 + s.pw - (s.kw - 1) * s.dw;  // ox * sw <= last
  return {(s.pw + s.sw - 1) / s.sw, last < 0 ? -1 : std::min<int64_t>(s.ow - 1, last / s.sw)};
}

// act(v + residual) into the `valid` channels at yp (v holds the bias already); rp: the residual's
// channels at the same place, or null.
template <class T>
inline void store_out(typename T::V v, int valid, float* yp, const float* rp, const Epilogue& e) {
  if (rp) v = T::add(v, T::loadm(rp, valid));
  v = activate<T>(v, e);
  if (valid == T::W)
    T::store(yp, v);
  else
    T::storem(yp, v, valid);
}

// w [K][C][KH][KW] (ONNX's OIHW) -> [K/NB][KH][KW][C][NB], zero padded.
inline void conv_pack(const float* w, const ConvShape& s, int nb, float* out) {
  const int64_t blocks = conv_blocks(s, nb);
  for (int64_t b = 0; b < blocks; ++b)
    for (int64_t i = 0; i < s.kh; ++i)
      for (int64_t j = 0; j < s.kw; ++j)
        for (int64_t c = 0; c < s.c; ++c)
          for (int64_t r = 0; r < nb; ++r) {
            const int64_t k = b * nb + r;
            *out++ = k < s.k ? w[((k * s.c + c) * s.kh + i) * s.kw + j] : 0.f;
          }
}

// MR pixels starting at output column ox0 of row (n, oy), channels of block b; when kChecked,
// taps outside the input are skipped (then MR is 1).
template <class T, int MR, bool kChecked>
inline void conv_micro(const float* x, const float* wb, float* y, const float* res,
                       const ConvShape& s, int64_t n, int64_t oy, int64_t ox0, int64_t kbase,
                       const Epilogue& e) {
  using V = typename T::V;
  constexpr int W = T::W, NB = 2 * W;
  const int64_t xs = s.x_stride, ys = s.y_stride, rs = s.r_stride;
  V acc[MR][2];
  LOPPER_UNROLL
  for (int m = 0; m < MR; ++m) acc[m][0] = acc[m][1] = T::zero();
  for (int64_t i = 0; i < s.kh; ++i) {
    const int64_t iy = oy * s.sh - s.ph + i * s.dh;
    if (iy < 0 || iy >= s.h) continue;
    const float* xrow = x + (n * s.h + iy) * s.w * xs;
    for (int64_t j = 0; j < s.kw; ++j) {
      const int64_t ix0 = ox0 * s.sw - s.pw + j * s.dw;
      if (kChecked && (ix0 < 0 || ix0 >= s.w)) continue;
      const float* xp = xrow + ix0 * xs;
      const float* wp = wb + (i * s.kw + j) * s.c * NB;
      for (int64_t c = 0; c < s.c; ++c) {
        const V w0 = T::load(wp + c * NB), w1 = T::load(wp + c * NB + W);
        LOPPER_UNROLL
        for (int m = 0; m < MR; ++m) {
          const V xb = T::set1(xp[m * s.sw * xs + c]);
          acc[m][0] = T::fma(xb, w0, acc[m][0]);
          acc[m][1] = T::fma(xb, w1, acc[m][1]);
        }
      }
    }
  }
  const int64_t left = s.k - kbase;  // valid channels of this block (may exceed NB)
  const int n0 = int(std::min<int64_t>(W, left)), n1 = int(std::clamp<int64_t>(left - W, 0, W));
  const V b0 = e.bias ? T::loadm(e.bias + kbase, n0) : T::zero();
  const V b1 = e.bias ? T::loadm(e.bias + kbase + W, n1) : T::zero();
  LOPPER_UNROLL
  for (int m = 0; m < MR; ++m) {
    const int64_t pix = (n * s.oh + oy) * s.ow + ox0 + m;
    float* yp = y + pix * ys + kbase;
    const float* rp = res ? res + pix * rs + kbase : nullptr;
    store_out<T>(T::add(acc[m][0], b0), n0, yp, rp, e);
    store_out<T>(T::add(acc[m][1], b1), n1, yp + W, rp ? rp + W : nullptr, e);
  }
}

// Output rows [row_begin, row_end) of the n*oh rows, every channel block.
template <class T>
void conv_rows(const float* x, const float* packed, float* y, const float* res, const ConvShape& s0,
               const Epilogue& e, int64_t row_begin, int64_t row_end) {
  constexpr int NB = ConvTraits<T>::kNB, MR = ConvTraits<T>::kMR;
  ConvShape s = s0;
  if (s.x_stride == 0) s.x_stride = s.c;
  if (s.y_stride == 0) s.y_stride = s.k;
  if (s.r_stride == 0) s.r_stride = s.k;
  auto [lo, hi] = interior_columns(s);
  if (lo > hi) lo = hi = -1;  // no interior
  const int64_t blocks = conv_blocks(s, NB);
  const int64_t wblock = s.kh * s.kw * s.c * NB;
  for (int64_t row = row_begin; row < row_end; ++row) {
    const int64_t n = row / s.oh, oy = row % s.oh;
    for (int64_t b = 0; b < blocks; ++b) {
      const float* wb = packed + b * wblock;
      const int64_t kbase = b * NB;
      int64_t ox = 0;
      const int64_t left_end = lo < 0 ? s.ow : lo;
      for (; ox < left_end; ++ox) conv_micro<T, 1, true>(x, wb, y, res, s, n, oy, ox, kbase, e);
      if (lo >= 0) {
        for (; ox + MR <= hi + 1; ox += MR)
          conv_micro<T, MR, false>(x, wb, y, res, s, n, oy, ox, kbase, e);
        for (; ox <= hi; ++ox) conv_micro<T, 1, false>(x, wb, y, res, s, n, oy, ox, kbase, e);
        for (; ox < s.ow; ++ox) conv_micro<T, 1, true>(x, wb, y, res, s, n, oy, ox, kbase, e);
      }
    }
  }
}

// Depthwise (group = channels, one output per channel), same layout and epilogue: w [C][1][KH][KW]
// is packed as [KH][KW][Cpad] with Cpad the channels rounded up to the vector width, zero padded.
inline int64_t dw_padded(int64_t c, int width) { return (c + width - 1) / width * width; }

inline void dw_pack(const float* w, const ConvShape& s, int width, float* out) {
  const int64_t cp = dw_padded(s.c, width);
  for (int64_t i = 0; i < s.kh; ++i)
    for (int64_t j = 0; j < s.kw; ++j)
      for (int64_t c = 0; c < cp; ++c) *out++ = c < s.c ? w[(c * s.kh + i) * s.kw + j] : 0.f;
}

// act(v + bias + residual) into the `valid` channels of one pixel from channel c.
template <class T>
inline void dw_finish(typename T::V v, int64_t c, int valid, float* yp, const float* rp,
                      const Epilogue& e) {
  if (e.bias) v = T::add(v, T::loadm(e.bias + c, valid));
  store_out<T>(v, valid, yp + c, rp ? rp + c : nullptr, e);
}

// Output rows [row_begin, row_end): interior pixels four at a time, the others (borders, the last
// few) one at a time with the taps inside the input only; channels a vector at a time.
template <class T>
void dw_rows(const float* x, const float* packed, float* y, const float* res, const ConvShape& s0,
             const Epilogue& e, int64_t row_begin, int64_t row_end) {
  using V = typename T::V;
  constexpr int W = T::W;
  ConvShape s = s0;
  if (s.x_stride == 0) s.x_stride = s.c;
  if (s.y_stride == 0) s.y_stride = s.c;
  if (s.r_stride == 0) s.r_stride = s.c;
  const int64_t cp = dw_padded(s.c, W);
  for (int64_t row = row_begin; row < row_end; ++row) {
    const int64_t n = row / s.oh, oy = row % s.oh;
    int64_t i0 = 0, i1 = s.kh;  // taps whose input row exists
    while (i0 < s.kh && oy * s.sh - s.ph + i0 * s.dh < 0) ++i0;
    while (i1 > i0 && oy * s.sh - s.ph + (i1 - 1) * s.dh >= s.h) --i1;
    // Interior columns (every tap inside) kOB at a time: each weight vector loaded once for kOB
    // pixels.
    constexpr int kOB = 4;
    const auto [lo, hi] = interior_columns(s);
    int64_t blocked_end = lo;  // [lo, blocked_end) done here
    for (int64_t ox = lo; ox + kOB <= hi + 1; ox += kOB, blocked_end = ox) {
      const int64_t pix = (n * s.oh + oy) * s.ow + ox;
      for (int64_t c = 0; c < cp; c += W) {
        const int valid = int(std::min<int64_t>(W, s.c - c));
        V a[kOB];
        LOPPER_UNROLL
        for (int m = 0; m < kOB; ++m) a[m] = T::zero();
        for (int64_t i = i0; i < i1; ++i) {
          const float* xr = x + (n * s.h + oy * s.sh - s.ph + i * s.dh) * s.w * s.x_stride;
          for (int64_t j = 0; j < s.kw; ++j) {
            const float* xp = xr + (ox * s.sw - s.pw + j * s.dw) * s.x_stride + c;
            const V wv = T::load(packed + (i * s.kw + j) * cp + c);
            LOPPER_UNROLL
            for (int m = 0; m < kOB; ++m) {
              const float* xm = xp + m * s.sw * s.x_stride;
              a[m] = T::fma(valid == W ? T::load(xm) : T::loadm(xm, valid), wv, a[m]);
            }
          }
        }
        LOPPER_UNROLL
        for (int m = 0; m < kOB; ++m)
          dw_finish<T>(a[m], c, valid, y + (pix + m) * s.y_stride,
                       res ? res + (pix + m) * s.r_stride : nullptr, e);
      }
    }
    for (int64_t ox = 0; ox < s.ow; ++ox) {
      if (ox >= lo && ox < blocked_end) continue;
      int64_t j0 = 0, j1 = s.kw;
      while (j0 < s.kw && ox * s.sw - s.pw + j0 * s.dw < 0) ++j0;
      while (j1 > j0 && ox * s.sw - s.pw + (j1 - 1) * s.dw >= s.w) --j1;
      const int64_t pix = (n * s.oh + oy) * s.ow + ox;
      float* yp = y + pix * s.y_stride;
      const float* rp = res ? res + pix * s.r_stride : nullptr;
      for (int64_t c = 0; c < cp; c += W) {
        const int valid = int(std::min<int64_t>(W, s.c - c));
        V a = T::zero();
        for (int64_t i = i0; i < i1; ++i) {
          const float* xr = x + (n * s.h + oy * s.sh - s.ph + i * s.dh) * s.w * s.x_stride;
          for (int64_t j = j0; j < j1; ++j) {
            const float* xp = xr + (ox * s.sw - s.pw + j * s.dw) * s.x_stride + c;
            a = T::fma(valid == W ? T::load(xp) : T::loadm(xp, valid),
                       T::load(packed + (i * s.kw + j) * cp + c), a);
          }
        }
        dw_finish<T>(a, c, valid, yp, rp, e);
      }
    }
  }
}

}  // namespace
}  // namespace lopper::kernels::cpu
