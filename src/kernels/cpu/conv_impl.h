// Dense direct and depthwise convolution in NHWC (conv_isa.h), written once over the vector types
// of vec_impl.h and compiled per ISA by conv_scalar.cpp, conv_avx2.cpp and conv_avx512.cpp, which
// define LOPPER_SPARSE_ISA, LOPPER_CONV_OPS_NAME and LOPPER_CONV_OPS_LABEL.
//
// The dense weight is packed once into blocks of NB output channels: [K/NB][KH][KW][C][NB], the
// last block only as many vectors wide as its channels need (zero padded to a whole vector). The
// microkernel keeps MR output pixels x NB channels in registers and streams the taps and input
// channels; every tap it reads is inside the input (a tile that touches the padding has its
// windows gathered first), and MR consecutive pixels may span rows (small images keep the
// registers full). A tile of work is MR pixels of one channel block, block-major (a thread's
// consecutive tiles reuse one block's weights) or pixel-major. The depthwise kernel reads the
// unpadded input: its interior pixels four at a time, the border pixels one at a time with their
// taps checked.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "kernels/cpu/bf16_bits.h"
#include "kernels/cpu/conv_isa.h"
#include "kernels/cpu/vec_impl.h"
#include "kernels/cpu/winograd_impl.h"

namespace lopper::kernels::cpu {

namespace {

// MR pixels x NV vectors of accumulators, with NV weight vectors and a broadcast beside them, fill
// the registers (AVX-512: 24 + 3 + 1 of 32; AVX2: 12 + 3 + 1 of 16); per input channel, NV + MR
// loads feed MR * NV FMAs, and the MR input pointers stay in general registers.
template <class T>
struct ConvTraits {
  static constexpr int kNV = 3;                   // vectors of output channels per block
  static constexpr int kNB = kNV * T::W;          // output channels per block
  static constexpr int kMR = T::W >= 16 ? 8 : 4;  // output pixels per microkernel call
};

inline int64_t conv_blocks(const ConvShape& s, int nb) { return (s.k + nb - 1) / nb; }

// The shape with its pixel strides made explicit (0: the channel count).
inline ConvShape with_strides(ConvShape s) {
  if (s.x_stride == 0) s.x_stride = s.c;
  if (s.y_stride == 0) s.y_stride = s.k;
  if (s.r_stride == 0) s.r_stride = s.k;
  return s;
}

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

// w [K][C][KH][KW] (ONNX's OIHW) -> [K/NB][KH][KW][C][NB], the last block [KH][KW][C][nv * W]
// with nv the vectors its channels need (a group of 16 channels is not stored 48 wide), zero
// padded.
inline void conv_pack(const float* w, const ConvShape& s, int nb, int width, float* out) {
  const int64_t blocks = conv_blocks(s, nb);
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t bw = std::min<int64_t>(nb, (s.k - b * nb + width - 1) / width * width);
    for (int64_t i = 0; i < s.kh; ++i)
      for (int64_t j = 0; j < s.kw; ++j)
        for (int64_t c = 0; c < s.c; ++c)
          for (int64_t r = 0; r < bw; ++r) {
            const int64_t k = b * nb + r;
            *out++ = k < s.k ? w[((k * s.c + c) * s.kh + i) * s.kw + j] : 0.f;
          }
  }
}

// MR output pixels x NV vectors of the channels of one block (packed NV vectors wide): the window
// of pixel m starts at px[m] (every tap inside the input, or the window gathered: a group of
// pixels may span rows and images); pixels [valid, MR) are computed
// (their px repeat a valid one) and not stored. `row` is the floats between input rows.
// PLANAR: the input is one image's planes (s.c_stride floats apart), read channel by channel.
// BORDER (not PLANAR): the tile touches the padding; px is not read, each tap of pixel m is
// located from border->at[m] and checked, a tap outside reading border->zeros (s.c zeros).
struct PixelAt {
  int64_t img, iy, ix;  // the image, the row and column of the window's first tap (maybe outside)
};
// Whether input row iy, column ix is inside the (unpadded) input.
inline bool tap_inside(const ConvShape& s, int64_t iy, int64_t ix) {
  return iy >= 0 && iy < s.h && ix >= 0 && ix < s.w;
}
struct BorderTile {
  const float* x;
  const PixelAt* at;
  const float* zeros;
};
// HALF (T with a Half): the block's last vector has at most half its lanes valid (24, 40, 72
// channels) and runs as a Half vector, its input the lower lanes of the broadcast.
template <class T, bool HALF>
struct MicroHalf {
  using H = T;  // unused
};
template <class T>
struct MicroHalf<T, true> {
  using H = typename T::Half;
};
template <class T, int MR, int NV, bool PLANAR, bool BORDER = false, bool HALF = false>
inline void conv_micro(const float* const* px, const float* wb, const ConvShape& s, int64_t row,
                       int valid, int64_t pix0, int64_t kbase, float* y, const float* res,
                       const Epilogue& e, const BorderTile* border = nullptr) {
  static_assert(!(PLANAR && BORDER));
  using V = typename T::V;
  using H = typename MicroHalf<T, HALF>::H;
  using HV = typename H::V;
  constexpr int W = T::W, BW = NV * W, NF = HALF ? NV - 1 : NV;  // NF: full vectors
  V acc[MR][NF > 0 ? NF : 1];
  HV hacc[MR];
  LOPPER_UNROLL
  for (int m = 0; m < MR; ++m) {
    LOPPER_UNROLL
    for (int v = 0; v < NF; ++v) acc[m][v] = T::zero();
    if constexpr (HALF) hacc[m] = H::zero();
  }
  // Without dilation and with packed pixels, a kernel row's taps x channels are one run of the
  // input (and of the packed weight): one loop over it (the 3-channel first layer: 9, not 3x3).
  const bool runs = !PLANAR && !BORDER && s.dw == 1 && s.x_stride == s.c;
  const int64_t cs = PLANAR ? s.c_stride : 1;
  const int64_t span = runs ? s.kw * s.c : s.c, taps = runs ? 1 : s.kw;
  for (int64_t i = 0; i < s.kh; ++i)
    for (int64_t j = 0; j < taps; ++j) {
      const int64_t off = i * s.dh * row + j * s.dw * s.x_stride;
      const float* wp = wb + (i * s.kw + j) * s.c * BW;
      const float* p[MR];
      if constexpr (BORDER) {
        LOPPER_UNROLL
        for (int m = 0; m < MR; ++m) {
          const PixelAt& a = border->at[m];
          const int64_t iy = a.iy + i * s.dh, ix = a.ix + j * s.dw;
          p[m] = tap_inside(s, iy, ix) ? border->x + ((a.img * s.h + iy) * s.w + ix) * s.x_stride
                                       : border->zeros;
        }
      } else {
        LOPPER_UNROLL
        for (int m = 0; m < MR; ++m) p[m] = px[m] + off;
      }
      for (int64_t c = 0; c < span; ++c) {
        V w[NF > 0 ? NF : 1];
        LOPPER_UNROLL
        for (int v = 0; v < NF; ++v) w[v] = T::load(wp + c * BW + v * W);
        HV wh;
        if constexpr (HALF) wh = H::load(wp + c * BW + NF * W);
        LOPPER_UNROLL
        for (int m = 0; m < MR; ++m) {
          const V xb = T::set1(p[m][c * cs]);
          LOPPER_UNROLL
          for (int v = 0; v < NF; ++v) acc[m][v] = T::fma(xb, w[v], acc[m][v]);
          if constexpr (HALF) hacc[m] = H::fma(T::lower(xb), wh, hacc[m]);
        }
      }
    }
  const int64_t left = s.k - kbase;  // valid channels of this block (may exceed NB)
  int n[NV];
  V b[NF > 0 ? NF : 1];
  LOPPER_UNROLL
  for (int v = 0; v < NV; ++v) n[v] = int(std::clamp<int64_t>(left - v * W, 0, W));
  LOPPER_UNROLL
  for (int v = 0; v < NF; ++v) b[v] = e.bias ? T::loadm(e.bias + kbase + v * W, n[v]) : T::zero();
  HV bh;
  if constexpr (HALF) bh = e.bias ? H::loadm(e.bias + kbase + NF * W, n[NF]) : H::zero();
  LOPPER_UNROLL
  for (int m = 0; m < MR; ++m) {
    if (m >= valid) break;
    const int64_t pix = pix0 + m;
    float* yp = y + pix * s.y_stride + kbase;
    const float* rp = res ? res + pix * s.r_stride + kbase : nullptr;
    LOPPER_UNROLL
    for (int v = 0; v < NF; ++v)
      store_out<T>(T::add(acc[m][v], b[v]), n[v], yp + v * W, rp ? rp + v * W : nullptr, e);
    if constexpr (HALF)
      store_out<H>(H::add(hacc[m], bh), n[NF], yp + NF * W, rp ? rp + NF * W : nullptr, e);
  }
}

// The input windows of the MR output pixels from pix0 (the dense kernels' tile; pixels past
// `valid` repeat the last valid one), x's element type E: each window's first tap in at[m], and,
// where no tap of any window falls in the padding, its address in px[m]. Returns whether one does
// (a border group: px is not set). The first pixel is located by division, the others by stepping
// along the row (divisions per pixel cost as much as the arithmetic of a 16-channel 1x1 layer);
// in a 1x1 layer of stride 1 without padding (the pointwise layers) output pixel p reads input
// pixel p, located without either and at not set (perf: 8% of a 32 -> 32 layer's time went to
// divisions and spilled cursors, per tile of 8 pixels x 32 multiply-adds).
template <class E, int MR>
inline bool locate_windows(const E* x, const ConvShape& s, int64_t pix0, int valid, const E** px,
                           PixelAt* at) {
  const bool padded = s.ph > 0 || s.pw > 0;
  if (s.kh == 1 && s.kw == 1 && s.sh == 1 && s.sw == 1 && !padded) {
    LOPPER_UNROLL
    for (int m = 0; m < MR; ++m) px[m] = x + (pix0 + std::min(m, valid - 1)) * s.x_stride;
    return false;
  }
  int64_t img = pix0 / (s.oh * s.ow), oy = pix0 / s.ow % s.oh, ox = pix0 % s.ow;
  bool border = false;
  for (int m = 0; m < MR; ++m) {
    const int64_t iy = oy * s.sh - s.ph, ix = ox * s.sw - s.pw;
    at[m] = {img, iy, ix};
    if (padded)
      border = border || iy < 0 || ix < 0 || iy + (s.kh - 1) * s.dh >= s.h ||
               ix + (s.kw - 1) * s.dw >= s.w;
    if (m + 1 >= valid) continue;  // the rest repeat the last valid pixel
    if (++ox == s.ow) {
      ox = 0;
      if (++oy == s.oh) oy = 0, ++img;
    }
  }
  if (!border)
    for (int m = 0; m < MR; ++m)
      px[m] = x + ((at[m].img * s.h + at[m].iy) * s.w + at[m].ix) * s.x_stride;
  return border;
}

// Tile t of a dense convolution: its block of output channels and its group of pixels, in the
// order conv_pixel_major gives (blocks and groups: their counts).
struct TileAt {
  int64_t block, group;
};
inline TileAt conv_tile_at(int64_t t, int64_t blocks, int64_t groups, bool pixel_major) {
  if (blocks == 1) return {0, t};
  return pixel_major ? TileAt{t % blocks, t / blocks} : TileAt{t / groups, t % groups};
}

// Output pixels per tile: kMR, or one fewer where that divides the pixels with less left over
// (a 7x7 map: 49 pixels in 7 groups of 7, not 7 groups of 8 with the last one 1/8 full).
template <class T>
int conv_mr(const ConvShape& s) {
  constexpr int MR = ConvTraits<T>::kMR;
  const int64_t pixels = s.n * s.oh * s.ow;
  auto waste = [&](int64_t mr) { return (pixels + mr - 1) / mr * mr - pixels; };
  return MR > 1 && waste(MR - 1) < waste(MR) ? MR - 1 : MR;
}

// The dense convolution's pieces of work: conv_mr output pixels (in order over images, rows and
// columns) x one block of channels.
template <class T>
int64_t conv_tile_count(const ConvShape& s) {
  const int64_t mr = conv_mr<T>(s);
  return conv_blocks(s, ConvTraits<T>::kNB) * ((s.n * s.oh * s.ow + mr - 1) / mr);
}

// The input window of the output pixel at `a`, gathered from the planes of a planar input into
// win as [kh][kw][c] (a tap outside the input: zeros), for a tile that touches the padding.
inline void conv_gather_planar(const float* x, const ConvShape& s, const PixelAt& a, float* win) {
  for (int64_t i = 0; i < s.kh; ++i) {
    const int64_t iy = a.iy + i * s.dh;
    for (int64_t j = 0; j < s.kw; ++j, win += s.c) {
      const int64_t ix = a.ix + j * s.dw;
      if (!tap_inside(s, iy, ix)) {
        std::fill(win, win + s.c, 0.f);
        continue;
      }
      const float* src = x + ((a.img * s.h + iy) * s.w + ix) * s.x_stride;
      for (int64_t c = 0; c < s.c; ++c) win[c] = src[c * s.c_stride];
    }
  }
}

// Tiles [t0, t1) of a dense convolution, in the order conv_pixel_major gives. The input is read
// unpadded: a tile whose pixels' taps all fall inside it runs the plain microkernel; one that
// touches the padding checks each tap of each pixel (a tap outside reads zeros), or, from a planar
// input (a few channels), has its windows gathered first.
// NOTE: a padded copy of the whole input cost RegNet's 112x112x64 stride-2 layer 12% of its time
// alone and more in the model, where the copy missed the caches twice.
template <class T, int MR, bool PLANAR>
void conv_tiles(const float* x, const float* packed, float* y, const float* res,
                const ConvShape& s0, const Epilogue& e, int64_t t0, int64_t t1) {
  constexpr int W = T::W, NB = ConvTraits<T>::kNB;
  const ConvShape s = with_strides(s0);
  const int64_t pixels = s.n * s.oh * s.ow, groups = (pixels + MR - 1) / MR;
  const int64_t blocks = conv_blocks(s, NB);
  const int64_t row = s.w * s.x_stride, wblock = s.kh * s.kw * s.c * NB;
  const bool pixel_major = conv_pixel_major(s);
  const bool padded = s.ph > 0 || s.pw > 0;
  // A border tile's zeros (s.c of them), or, from a planar input, its gathered windows
  // ([kh][kw][c] each, read as a packed input of 1 x kw pixels a row).
  thread_local std::vector<float> scratch;
  const int64_t win = s.kh * s.kw * s.c;
  const size_t need = size_t(PLANAR ? MR * win : s.c);
  if (padded && scratch.size() < need) scratch.assign(need, 0.f);
  ConvShape sg = s;
  sg.x_stride = s.c, sg.dh = sg.dw = 1, sg.c_stride = 1;
  const float* px[MR];
  PixelAt at[MR];
  const BorderTile border_tile{x, at, scratch.data()};
  bool border = false;   // whether the located group touches the padding
  int64_t located = -1;  // the group whose windows px (or at) holds
  for (int64_t t = t0; t < t1; ++t) {
    const auto [b, grp] = conv_tile_at(t, blocks, groups, pixel_major);
    const int64_t pix0 = grp * MR, kbase = b * NB;
    const int valid = int(std::min<int64_t>(MR, pixels - pix0));
    if (grp != located) {
      border = locate_windows<float, MR>(x, s, pix0, valid, px, at);
      if (border && PLANAR)
        for (int m = 0; m < MR; ++m) {
          if (m < valid) conv_gather_planar(x, s, at[m], scratch.data() + m * win);
          px[m] = scratch.data() + std::min(m, valid - 1) * win;
        }
      located = grp;
    }
    const float* wb = packed + b * wblock;
    static_assert(ConvTraits<T>::kNV == 3);
    const int64_t nv = (s.k - kbase + W - 1) / W;  // the last block: no vector of padding alone
    // A last vector at most half full runs as a Half vector (the pointwise layers' 24 and 72
    // outputs: 2 and 5 vectors, the last 8 of 16 lanes).
    const bool half = W == 16 && nv <= 3 && s.k - kbase - (nv - 1) * W <= W / 2;
    auto micro = [&](auto nvc) {
      constexpr int NV = decltype(nvc)::value;
      if constexpr (W == 16 && !PLANAR) {
        if (!border && half) {
          conv_micro<T, MR, NV, false, false, true>(px, wb, s, row, valid, pix0, kbase, y, res, e);
          return;
        }
      }
      if (!border)
        conv_micro<T, MR, NV, PLANAR>(px, wb, s, row, valid, pix0, kbase, y, res, e);
      else if constexpr (PLANAR)
        conv_micro<T, MR, NV, false>(px, wb, sg, s.kw * s.c, valid, pix0, kbase, y, res, e);
      else
        conv_micro<T, MR, NV, false, true>(px, wb, s, row, valid, pix0, kbase, y, res, e,
                                           &border_tile);
    };
    if (nv >= 3)
      micro(std::integral_constant<int, 3>{});
    else if (nv == 2)
      micro(std::integral_constant<int, 2>{});
    else
      micro(std::integral_constant<int, 1>{});
  }
}

// conv_isa.h's wino_products with MR pixels (tiles) per microkernel call.
template <class T, int MR>
void wino_products_mr(const float* v, int64_t ldv, const float* packed, int64_t per, int64_t groups,
                      float* m, int64_t ldm, int64_t nt, int64_t gc, int64_t gk, int64_t q0,
                      int64_t q1) {
  constexpr int W = T::W, NB = ConvTraits<T>::kNB, kPositions = 36;
  ConvShape s;  // one group's product: a row of nt pixels, gc -> gk channels
  s.w = s.ow = nt, s.c = gc, s.k = gk, s.x_stride = ldv, s.y_stride = ldm, s.r_stride = ldm;
  const Epilogue none{};
  const int64_t blocks = conv_blocks(s, NB);
  for (int64_t pos = 0; pos < kPositions; ++pos)
    for (int64_t q = q0; q < q1; ++q) {
      const float* base = v + pos * nt * ldv + q * gc;
      const float* wq = packed + (pos * groups + q) * per;
      float* y = m + pos * nt * ldm + q * gk;
      for (int64_t p0 = 0; p0 < nt; p0 += MR) {
        const int valid = int(std::min<int64_t>(MR, nt - p0));
        const float* px[MR];
        LOPPER_UNROLL
        for (int i = 0; i < MR; ++i) px[i] = base + (p0 + std::min(i, valid - 1)) * ldv;
        for (int64_t b = 0; b < blocks; ++b) {
          const int64_t kbase = b * NB, nv = (gk - kbase + W - 1) / W;
          const float* wb = wq + b * gc * NB;
          if (nv >= 3)
            conv_micro<T, MR, 3, false>(px, wb, s, 0, valid, p0, kbase, y, nullptr, none);
          else if (nv == 2)
            conv_micro<T, MR, 2, false>(px, wb, s, 0, valid, p0, kbase, y, nullptr, none);
          else
            conv_micro<T, MR, 1, false>(px, wb, s, 0, valid, p0, kbase, y, nullptr, none);
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

// Interior pixels [ox0, ox0 + OB) of one output row (taps rows [i0, i1), rows[i] the input row
// of tap row i) for a kernel KW wide, stride SW, no dilation: per kernel row the OB * SW + KW - 1
// input columns the OB pixels read are loaded once and shared by the taps (3x3 stride 1, OB 8: 10
// loads, not 24, for 24 FMAs). yrow / rrow: the output row and its residual (or null).
template <class T, int KW, int SW, int OB>
inline void dw_interior(const float* const* rows, const float* packed, float* yrow,
                        const float* rrow, const ConvShape& s, const Epilogue& e, int64_t i0,
                        int64_t i1, int64_t ox0, int64_t c0, int64_t c1) {
  using V = typename T::V;
  constexpr int W = T::W, NX = OB * SW + KW - 1;
  const int64_t cp = dw_padded(s.c, W), xs = s.x_stride;
  for (int64_t c = c0; c < c1; c += W) {
    const int valid = int(std::min<int64_t>(W, s.c - c));
    V a[OB];
    LOPPER_UNROLL
    for (int m = 0; m < OB; ++m) a[m] = T::zero();
    for (int64_t i = i0; i < i1; ++i) {
      const float* xp = rows[i] + (ox0 * SW - s.pw) * xs + c;
      V xv[NX];
      LOPPER_UNROLL
      for (int q = 0; q < NX; ++q)
        xv[q] = valid == W ? T::load(xp + q * xs) : T::loadm(xp + q * xs, valid);
      LOPPER_UNROLL
      for (int j = 0; j < KW; ++j) {
        const V wv = T::load(packed + (i * KW + j) * cp + c);
        LOPPER_UNROLL
        for (int m = 0; m < OB; ++m) a[m] = T::fma(xv[m * SW + j], wv, a[m]);
      }
    }
    LOPPER_UNROLL
    for (int m = 0; m < OB; ++m)
      dw_finish<T>(a[m], c, valid, yrow + (ox0 + m) * s.y_stride,
                   rrow ? rrow + (ox0 + m) * s.r_stride : nullptr, e);
  }
}

// The columns [lo, hi] of a row in groups: f(std::integral_constant<int, B>{}, ox) for B = OB
// columns from ox, OB at a time, then 4 (where OB > 4), 2 and 1. Returns the column after the last
// done (hi + 1; lo when there is none).
template <int OB, class F>
inline int64_t in_column_groups(int64_t lo, int64_t hi, F&& f) {
  int64_t ox = lo;
  for (; ox + OB <= hi + 1; ox += OB) f(std::integral_constant<int, OB>{}, ox);
  if constexpr (OB > 4) {
    if (ox + 4 <= hi + 1) f(std::integral_constant<int, 4>{}, ox), ox += 4;
  }
  if (ox + 2 <= hi + 1) f(std::integral_constant<int, 2>{}, ox), ox += 2;
  if (ox <= hi) f(std::integral_constant<int, 1>{}, ox++);
  return ox;
}

// Interior columns [lo, hi] of one output row by dw_interior: eight (four on AVX2) at a time,
// then four, two and one. Returns the column after the last done.
template <class T, int KW, int SW>
inline int64_t dw_interior_run(const float* const* rows, const float* packed, float* yrow,
                               const float* rrow, const ConvShape& s, const Epilogue& e, int64_t i0,
                               int64_t i1, int64_t lo, int64_t hi, int64_t c0, int64_t c1) {
  constexpr int OB = T::W >= 16 ? 8 : 4;
  return in_column_groups<OB>(lo, hi, [&](auto ob, int64_t ox) {
    dw_interior<T, KW, SW, decltype(ob)::value>(rows, packed, yrow, rrow, s, e, i0, i1, ox, c0, c1);
  });
}

// 3x3 interior pixels [ox0, ox0 + OB) of one output row, one vector of channels at c, the nine
// weight vectors in registers (w, zero for the taps rows outside the input: rows[i] is not read
// there). FULL: every lane a channel (plain loads).
template <class T, int SW, int OB, bool FULL>
inline void dw3_block(const float* const* rows, const typename T::V (&w)[3][3], float* yrow,
                      const float* rrow, const ConvShape& s, const Epilogue& e, int64_t i0,
                      int64_t i1, int64_t ox0, int64_t c, int valid) {
  using V = typename T::V;
  constexpr int NX = OB * SW + 2;
  const int64_t xs = s.x_stride;
  V a[OB];
  LOPPER_UNROLL
  for (int m = 0; m < OB; ++m) a[m] = T::zero();
  LOPPER_UNROLL
  for (int i = 0; i < 3; ++i) {
    if (i < i0 || i >= i1) continue;
    const float* xp = rows[i] + (ox0 * SW - s.pw) * xs + c;
    V xv[NX];
    LOPPER_UNROLL_ALL
    for (int q = 0; q < NX; ++q) xv[q] = FULL ? T::load(xp + q * xs) : T::loadm(xp + q * xs, valid);
    LOPPER_UNROLL
    for (int j = 0; j < 3; ++j) {
      LOPPER_UNROLL
      for (int m = 0; m < OB; ++m) a[m] = T::fma(xv[m * SW + j], w[i][j], a[m]);
    }
  }
  LOPPER_UNROLL
  for (int m = 0; m < OB; ++m)
    dw_finish<T>(a[m], c, valid, yrow + (ox0 + m) * s.y_stride,
                 rrow ? rrow + (ox0 + m) * s.r_stride : nullptr, e);
}

// 3x3 interior columns [lo, hi] of one output row: one vector of channels at a time along the
// whole row, its nine weight vectors loaded once into registers, then OB pixels at a time.
template <class T, int SW, bool FULL, int OB = 8>
inline void dw3_vector_run(const float* const* rows, const typename T::V (&w)[3][3], float* yrow,
                           const float* rrow, const ConvShape& s, const Epilogue& e, int64_t i0,
                           int64_t i1, int64_t lo, int64_t hi, int64_t c, int valid) {
  in_column_groups<OB>(lo, hi, [&](auto ob, int64_t ox) {
    dw3_block<T, SW, decltype(ob)::value, FULL>(rows, w, yrow, rrow, s, e, i0, i1, ox, c, valid);
  });
}

// The nine weight vectors of channels [c, c + T::W) of a 3x3 kernel packed cp channels a tap; zero
// for the taps rows outside [i0, i1).
template <class T>
inline void dw3_weights(const float* packed, int64_t cp, int64_t c, int64_t i0, int64_t i1,
                        typename T::V (&w)[3][3]) {
  LOPPER_UNROLL
  for (int i = 0; i < 3; ++i) LOPPER_UNROLL
  for (int j = 0; j < 3; ++j)
    w[i][j] = i >= i0 && i < i1 ? T::load(packed + (i * 3 + j) * cp + c) : T::zero();
}

// dw_interior_run for a 3x3 kernel on AVX-512 (32 registers: 9 weights, 8 accumulators, 10 input
// columns): channels [c0, c1) a vector at a time, each along the row's interior. 0.63-0.85x the
// time of dw_interior_run's order (every vector of channels per group of pixels, the weights
// loaded per tap) on MobileNet's 112^2 and 56^2 layers; the order alone, weights still loaded,
// was slower. Returns the column after the last done.
template <class T, int SW>
inline int64_t dw3_interior_run(const float* const* rows, const float* packed, float* yrow,
                                const float* rrow, const ConvShape& s, const Epilogue& e,
                                int64_t i0, int64_t i1, int64_t lo, int64_t hi, int64_t c0,
                                int64_t c1) {
  constexpr int W = T::W;
  const int64_t cp = dw_padded(s.c, W);
  for (int64_t c = c0; c < c1; c += W) {
    const int valid = int(std::min<int64_t>(W, s.c - c));
    // A last vector half full (24, 40, 72, 120 channels) as an 8-lane vector: two 256-bit FMAs
    // a cycle on a core that does one 512-bit (112^2 x 24, one thread: 0.84x the time).
    if constexpr (W == 16) {
      if (valid == 8) {
        using H = typename T::Half;
        typename H::V h[3][3];
        dw3_weights<H>(packed, cp, c, i0, i1, h);
        dw3_vector_run<H, SW, true>(rows, h, yrow, rrow, s, e, i0, i1, lo, hi, c, valid);
        continue;
      }
    }
    typename T::V w[3][3];
    dw3_weights<T>(packed, cp, c, i0, i1, w);
    if (valid == W)
      dw3_vector_run<T, SW, true>(rows, w, yrow, rrow, s, e, i0, i1, lo, hi, c, valid);
    else
      dw3_vector_run<T, SW, false>(rows, w, yrow, rrow, s, e, i0, i1, lo, hi, c, valid);
  }
  return std::max(lo, hi + 1);
}

// One output pixel (taps [i0, i1) x [j0, j1) inside the input, rows[i] the input row of tap row
// i), NV vectors of channels from c: NV independent sums (one alone waits on each FMA's latency,
// tap after tap: a 7x7 map under a 5x5 kernel has no interior run of four pixels, and ran at a
// quarter of the FMA rate).
template <class T, int NV>
inline void dw_pixel(const float* const* rows, const float* packed, float* yp, const float* rp,
                     const ConvShape& s, const Epilogue& e, int64_t ox, int64_t i0, int64_t i1,
                     int64_t j0, int64_t j1, int64_t c) {
  using V = typename T::V;
  constexpr int W = T::W;
  const int64_t cp = dw_padded(s.c, W);
  int valid[NV];
  V a[NV];
  LOPPER_UNROLL
  for (int v = 0; v < NV; ++v) {
    valid[v] = int(std::min<int64_t>(W, s.c - c - v * W));
    a[v] = T::zero();
  }
  const bool full = c + NV * W <= s.c;  // no vector past the channels: plain loads
  for (int64_t i = i0; i < i1; ++i) {
    for (int64_t j = j0; j < j1; ++j) {
      const float* xp = rows[i] + (ox * s.sw - s.pw + j * s.dw) * s.x_stride + c;
      const float* wp = packed + (i * s.kw + j) * cp + c;
      if (full) {
        LOPPER_UNROLL
        for (int v = 0; v < NV; ++v) a[v] = T::fma(T::load(xp + v * W), T::load(wp + v * W), a[v]);
      } else {
        LOPPER_UNROLL
        for (int v = 0; v < NV; ++v)
          a[v] = T::fma(T::loadm(xp + v * W, valid[v]), T::load(wp + v * W), a[v]);
      }
    }
  }
  LOPPER_UNROLL
  for (int v = 0; v < NV; ++v) dw_finish<T>(a[v], c + v * W, valid[v], yp, rp, e);
}

// The depthwise kernel's pieces of work: an output row x a chunk of channels, all of them, or
// kDwChunk vectors where the rows are few (a 7x7 map is 7 rows: too few for the threads to split
// evenly alone; on larger maps a chunk per row cost 1.3x in the model).
constexpr int kDwChunk = 4;
template <class T>
int64_t dw_chunk(const ConvShape& s) {
  return s.n * s.oh >= 16 ? dw_padded(s.c, T::W) : int64_t{kDwChunk} * T::W;
}
template <class T>
int64_t dw_chunks(const ConvShape& s) {
  return (dw_padded(s.c, T::W) + dw_chunk<T>(s) - 1) / dw_chunk<T>(s);
}

// Channels [c0, c1) of one output row: rows[i] is the input row of tap row i for i in [i0, i1)
// (the taps rows inside the input; the others are not read); yrow / rrow the output row and its
// residual (or null). Interior pixels four or eight at a time, the others (borders, the last few)
// one at a time with the taps inside the input only. s: the shape with its strides explicit.
template <class T>
void dw_row(const float* const* rows, const float* packed, float* yrow, const float* rrow,
            const ConvShape& s, const Epilogue& e, int64_t i0, int64_t i1, int64_t c0, int64_t c1) {
  using V = typename T::V;
  constexpr int W = T::W;
  // Interior columns (every tap inside) kOB at a time: each weight vector loaded once for kOB
  // pixels.
  constexpr int kOB = 4;
  const auto [lo, hi] = interior_columns(s);
  int64_t blocked_end = lo;  // [lo, blocked_end) done here
  // 3x3 and 5x5 without dilation (nearly every depthwise layer): the input columns shared by the
  // taps, kOB3 pixels at a time, then 4, 2 and 1 for the rest of the interior.
  if ((s.kw == 3 || s.kw == 5) && s.dw == 1 && (s.sw == 1 || s.sw == 2) && lo >= 0) {
    if (s.kw == 3 && s.kh == 3 && T::W >= 16)
      blocked_end =
          s.sw == 1
              ? dw3_interior_run<T, 1>(rows, packed, yrow, rrow, s, e, i0, i1, lo, hi, c0, c1)
              : dw3_interior_run<T, 2>(rows, packed, yrow, rrow, s, e, i0, i1, lo, hi, c0, c1);
    else if (s.kw == 3 && s.sw == 1)
      blocked_end =
          dw_interior_run<T, 3, 1>(rows, packed, yrow, rrow, s, e, i0, i1, lo, hi, c0, c1);
    else if (s.kw == 3)
      blocked_end =
          dw_interior_run<T, 3, 2>(rows, packed, yrow, rrow, s, e, i0, i1, lo, hi, c0, c1);
    else if (s.sw == 1)
      blocked_end =
          dw_interior_run<T, 5, 1>(rows, packed, yrow, rrow, s, e, i0, i1, lo, hi, c0, c1);
    else
      blocked_end =
          dw_interior_run<T, 5, 2>(rows, packed, yrow, rrow, s, e, i0, i1, lo, hi, c0, c1);
  }
  const int64_t cp = dw_padded(s.c, W);
  for (int64_t ox = blocked_end; ox + kOB <= hi + 1; ox += kOB, blocked_end = ox) {
    for (int64_t c = c0; c < c1; c += W) {
      const int valid = int(std::min<int64_t>(W, s.c - c));
      V a[kOB];
      LOPPER_UNROLL
      for (int m = 0; m < kOB; ++m) a[m] = T::zero();
      for (int64_t i = i0; i < i1; ++i) {
        for (int64_t j = 0; j < s.kw; ++j) {
          const float* xp = rows[i] + (ox * s.sw - s.pw + j * s.dw) * s.x_stride + c;
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
        dw_finish<T>(a[m], c, valid, yrow + (ox + m) * s.y_stride,
                     rrow ? rrow + (ox + m) * s.r_stride : nullptr, e);
    }
  }
  // The other pixels, four vectors of channels at once over all of them: those weights stay in
  // L1 from pixel to pixel (a 5x5 kernel's 1152 channels are 115 KB).
  for (int64_t c = c0; c < c1; c += 4 * W) {
    const int64_t nv = std::min<int64_t>(4, (c1 - c) / W);
    for (int64_t ox = 0; ox < s.ow; ++ox) {
      if (ox >= lo && ox < blocked_end) continue;
      const auto [j0, j1] = taps_inside(ox * s.sw - s.pw, s.kw, s.dw, s.w);
      float* yp = yrow + ox * s.y_stride;
      const float* rp = rrow ? rrow + ox * s.r_stride : nullptr;
      if (nv == 4)
        dw_pixel<T, 4>(rows, packed, yp, rp, s, e, ox, i0, i1, j0, j1, c);
      else if (nv == 3)
        dw_pixel<T, 3>(rows, packed, yp, rp, s, e, ox, i0, i1, j0, j1, c);
      else if (nv == 2)
        dw_pixel<T, 2>(rows, packed, yp, rp, s, e, ox, i0, i1, j0, j1, c);
      else
        dw_pixel<T, 1>(rows, packed, yp, rp, s, e, ox, i0, i1, j0, j1, c);
    }
  }
}

// Tiles [t0, t1) (row-major, then chunks of channels) of a depthwise convolution of the whole
// input: each output row's taps rows located, then dw_row.
template <class T>
void dw_rows(const float* x, const float* packed, float* y, const float* res, const ConvShape& s0,
             const Epilogue& e, int64_t t0, int64_t t1) {
  const ConvShape s = with_strides(s0);
  const int64_t cp = dw_padded(s.c, T::W), chunks = dw_chunks<T>(s), chunk = dw_chunk<T>(s);
  const float* rows[kDwMaxTaps];
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t row = t / chunks, c0 = t % chunks * chunk;
    const int64_t c1 = std::min(cp, c0 + chunk);
    const int64_t n = row / s.oh, oy = row % s.oh;
    const auto [i0, i1] =
        taps_inside(oy * s.sh - s.ph, s.kh, s.dh, s.h);  // taps whose input row exists
    for (int64_t i = i0; i < i1; ++i)
      rows[i] = x + (n * s.h + oy * s.sh - s.ph + i * s.dh) * s.w * s.x_stride;
    dw_row<T>(rows, packed, y + row * s.ow * s.y_stride,
              res ? res + row * s.ow * s.r_stride : nullptr, s, e, i0, i1, c0, c1);
  }
}

// Small maps (14x14, 7x7) under a 5x5 kernel have few interior runs of pixels: the depthwise
// kernel copies one vector of channels of one image, zero padded, into a buffer that stays in L1
// and runs every pixel as interior, OB at a time (the input columns loaded once per kernel row,
// shared by the taps), as ONNX Runtime's blocked layout does. A tile: one image x one vector of
// channels. (3x3 kernels keep rows: a thread reading whole pixel rows, as their producer wrote
// them, ran 1.5x faster in the model than a vector of channels of every pixel.)
constexpr int64_t kDwPlaneFloats = 6144;  // the buffer: 24 KB
template <class T>
bool dw_plane(const ConvShape& s) {
  return s.kh == s.kw && s.kw == 5 && s.dh == 1 && s.dw == 1 && s.sh == s.sw &&
         (s.sw == 1 || s.sw == 2) && s.oh * s.ow <= 256 &&
         (s.h + 2 * s.ph) * (s.w + 2 * s.pw) * T::W <= kDwPlaneFloats;
}

// OB pixels of output row oy from ox0, one vector of channels c: the buffer holds the padded
// plane [hp][wp][W]; wts: the packed weight at channel c (taps cp floats apart).
template <class T, int KW, int SW, int OB>
inline void dw_plane_block(const float* buf, int64_t wp, const float* wts, int64_t cp, float* yp,
                           int64_t y_stride, const float* rp, int64_t r_stride, int64_t c,
                           int valid, const Epilogue& e, int64_t oy, int64_t ox0) {
  using V = typename T::V;
  constexpr int W = T::W, NX = (OB - 1) * SW + KW;
  V a[OB];
  LOPPER_UNROLL
  for (int m = 0; m < OB; ++m) a[m] = T::zero();
  LOPPER_UNROLL
  for (int i = 0; i < KW; ++i) {
    const float* xr = buf + ((oy * SW + i) * wp + ox0 * SW) * W;
    V xv[NX];
    LOPPER_UNROLL
    for (int q = 0; q < NX; ++q) xv[q] = T::load(xr + q * W);
    LOPPER_UNROLL
    for (int j = 0; j < KW; ++j) {
      const V wv = T::load(wts + (i * KW + j) * cp);
      LOPPER_UNROLL
      for (int m = 0; m < OB; ++m) a[m] = T::fma(xv[m * SW + j], wv, a[m]);
    }
  }
  LOPPER_UNROLL
  for (int m = 0; m < OB; ++m)
    dw_finish<T>(a[m], c, valid, yp + (ox0 + m) * y_stride,
                 rp ? rp + (ox0 + m) * r_stride : nullptr, e);
}

template <class T, int KW, int SW>
void dw_plane_rows(const float* buf, int64_t wp, const float* wts, int64_t cp, float* y,
                   const float* res, const ConvShape& s, int64_t c, int valid, const Epilogue& e) {
  constexpr int OB = T::W >= 16 ? 8 : 4;
  for (int64_t oy = 0; oy < s.oh; ++oy) {
    float* yp = y + oy * s.ow * s.y_stride;
    const float* rp = res ? res + oy * s.ow * s.r_stride : nullptr;
    int64_t ox = 0;
    for (; ox + OB <= s.ow; ox += OB)
      dw_plane_block<T, KW, SW, OB>(buf, wp, wts, cp, yp, s.y_stride, rp, s.r_stride, c, valid, e,
                                    oy, ox);
    if (OB > 4 && ox + 4 <= s.ow) {
      dw_plane_block<T, KW, SW, 4>(buf, wp, wts, cp, yp, s.y_stride, rp, s.r_stride, c, valid, e,
                                   oy, ox);
      ox += 4;
    }
    if (ox + 2 <= s.ow) {
      dw_plane_block<T, KW, SW, 2>(buf, wp, wts, cp, yp, s.y_stride, rp, s.r_stride, c, valid, e,
                                   oy, ox);
      ox += 2;
    }
    if (ox < s.ow)
      dw_plane_block<T, KW, SW, 1>(buf, wp, wts, cp, yp, s.y_stride, rp, s.r_stride, c, valid, e,
                                   oy, ox);
  }
}

// Tiles [t0, t1) of the plane mode (image-major, then vectors of channels).
template <class T>
void dw_planes(const float* x, const float* packed, float* y, const float* res, const ConvShape& s0,
               const Epilogue& e, int64_t t0, int64_t t1) {
  constexpr int W = T::W;
  const ConvShape s = with_strides(s0);
  const int64_t cp = dw_padded(s.c, W), vecs = cp / W;
  const int64_t hp = s.h + 2 * s.ph, wp = s.w + 2 * s.pw;
  alignas(64) float buf[kDwPlaneFloats];
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t n = t / vecs, c = t % vecs * W;
    const int valid = int(std::min<int64_t>(W, s.c - c));
    // The padded plane: zero rows above and below, zero columns left and right.
    for (int64_t r = 0; r < hp; ++r) {
      float* br = buf + r * wp * W;
      const int64_t iy = r - s.ph;
      if (iy < 0 || iy >= s.h) {
        for (int64_t q = 0; q < wp; ++q) T::store(br + q * W, T::zero());
        continue;
      }
      for (int64_t q = 0; q < s.pw; ++q) T::store(br + q * W, T::zero());
      const float* xr = x + ((n * s.h + iy) * s.w) * s.x_stride + c;
      for (int64_t ix = 0; ix < s.w; ++ix)
        T::store(br + (s.pw + ix) * W, valid == W ? T::load(xr + ix * s.x_stride)
                                                  : T::loadm(xr + ix * s.x_stride, valid));
      for (int64_t q = s.pw + s.w; q < wp; ++q) T::store(br + q * W, T::zero());
    }
    float* yn = y + n * s.oh * s.ow * s.y_stride;
    const float* rn = res ? res + n * s.oh * s.ow * s.r_stride : nullptr;
    const float* wts = packed + c;
    if (s.sw == 1)
      dw_plane_rows<T, 5, 1>(buf, wp, wts, cp, yn, rn, s, c, valid, e);
    else
      dw_plane_rows<T, 5, 2>(buf, wp, wts, cp, yn, rn, s, c, valid, e);
  }
}

// Max pooling of output rows [row_begin, row_end) (s.k == s.c), the taps inside the input only.
template <class T>
void max_pool_rows(const float* x, float* y, const ConvShape& s0, int64_t row_begin,
                   int64_t row_end) {
  using V = typename T::V;
  constexpr int W = T::W;
  const ConvShape s = with_strides(s0);
  for (int64_t row = row_begin; row < row_end; ++row) {
    const int64_t n = row / s.oh, oy = row % s.oh;
    const auto [i0, i1] = taps_inside(oy * s.sh - s.ph, s.kh, s.dh, s.h);
    for (int64_t ox = 0; ox < s.ow; ++ox) {
      const auto [j0, j1] = taps_inside(ox * s.sw - s.pw, s.kw, s.dw, s.w);
      float* yp = y + ((n * s.oh + oy) * s.ow + ox) * s.y_stride;
      for (int64_t c = 0; c < s.c; c += W) {
        const int valid = int(std::min<int64_t>(W, s.c - c));
        V m = T::set1(-__builtin_inff());
        for (int64_t i = i0; i < i1; ++i) {
          const float* xr = x + (n * s.h + oy * s.sh - s.ph + i * s.dh) * s.w * s.x_stride + c;
          for (int64_t j = j0; j < j1; ++j) {
            const float* xp = xr + (ox * s.sw - s.pw + j * s.dw) * s.x_stride;
            m = T::max_nan(m, valid == W ? T::load(xp) : T::loadm(xp, valid));
          }
        }
        if (valid == W)
          T::store(yp + c, m);
        else
          T::storem(yp + c, m, valid);
      }
    }
  }
}

// y = act(x * scale + e.bias) per channel, pixels [p0, p1) of c channels, x's pixels ldx floats
// apart, y's ldy.
template <class T>
void affine_pixels(const float* x, int64_t ldx, float* y, int64_t ldy, const float* scale,
                   int64_t c, int64_t p0, int64_t p1, const Epilogue& e) {
  constexpr int W = T::W;
  for (int64_t p = p0; p < p1; ++p) {
    const float* xp = x + p * ldx;
    float* yp = y + p * ldy;
    int64_t k = 0;
    for (; k + W <= c; k += W)
      T::store(yp + k,
               activate<T>(T::fma(T::load(xp + k), T::load(scale + k), T::load(e.bias + k)), e));
    if (k < c) {
      const int n = int(c - k);
      T::storem(
          yp + k,
          activate<T>(T::fma(T::loadm(xp + k, n), T::loadm(scale + k, n), T::loadm(e.bias + k, n)),
                      e),
          n);
    }
  }
}

template <class T>
void interleave_pixels(const float* a, int64_t lda, const float* b, int64_t ldb, float* y,
                       int64_t c, int64_t p0, int64_t p1) {
  constexpr int W = T::W;
  for (int64_t p = p0; p < p1; ++p) {
    const float* ap = a + p * lda;
    const float* bp = b + p * ldb;
    float* yp = y + p * 2 * c;
    int64_t j = 0;
    for (; j + W <= c; j += W) T::store_zip(yp + 2 * j, T::load(ap + j), T::load(bp + j));
    for (; j < c; ++j) yp[2 * j] = ap[j], yp[2 * j + 1] = bp[j];
  }
}

// --- A planar first layer, vectorised over output pixels ---------------------------------------
// A network's first layer (3 input planes, 16-48 outputs, stride 2: MobileNet's and MnasNet's 24
// or 32, EfficientNet's 48) has too few input channels for the tile kernel's broadcasts to pay:
// per tap it broadcasts each of MR pixels' input and fills 24 of 32 lanes with 24 outputs. Here a
// vector holds W consecutive output pixels of one channel: per tap, one load of W inputs (the even
// columns of 2W at stride 2) feeds KG multiply-adds, one per output channel, each by that
// channel's weight broadcast from memory, every lane useful; KG accumulators of W pixels,
// transposed in registers to channels-last. Each (channel, kernel row) of input is copied with its
// padding first, so no tap is checked.

// Output channels a pass for k of them: the fewest multiply-adds counting the per-tap load (3),
// among KG = 3, 2 or 1 times kPlanarStep channels (the accumulators fit the registers: AVX-512's
// 32 hold 24, AVX2's 16 hold 12).
template <class T>
constexpr int kPlanarStep = T::W >= 16 ? 8 : 4;
template <class T>
int planar_group(int64_t k) {
  int best = 0;
  int64_t cost = 0;
  for (int m = 3; m >= 1; --m) {
    const int kg = m * kPlanarStep<T>;
    const int64_t c = (k + kg - 1) / kg * (kg + 3);
    if (best == 0 || c < cost) best = kg, cost = c;
  }
  return best;
}

// y's row (`ow` pixels, ys floats apart) channels [k0, k0 + kg) from the taps: tap t reads its
// inputs from taps[t] (S floats a pixel) and its KG weights from wts[t].
// NOTE: unrolled whole (LOPPER_UNROLL_ALL: with 16, 24 accumulators were an array on the stack, 2x
// slower), and each tap's weights at one pointer (from a shared base, wts[t] + k0 + k, GCC kept the
// offsets in general registers).
template <class T, int KG, int S>
void planar_row_pass(const float* const* taps, const float* const* wts, int64_t ntaps, int64_t k0,
                     int kg, int64_t ow, const Epilogue& e, float* yrow, int64_t ys) {
  using V = typename T::V;
  constexpr int W = T::W;
  for (int64_t ox0 = 0; ox0 < ow; ox0 += W) {
    V acc[KG];
    LOPPER_UNROLL_ALL
    for (int k = 0; k < KG; ++k) acc[k] = T::zero();
    for (int64_t t = 0; t < ntaps; ++t) {
      const float* p = taps[t] + S * ox0;
      V v;
      if constexpr (S == 2)
        v = T::even(T::load(p), T::load(p + W));
      else
        v = T::load(p);
      const float* wp = wts[t];
      LOPPER_UNROLL_ALL
      for (int k = 0; k < KG; ++k) acc[k] = T::fma(v, T::set1(wp[k]), acc[k]);
    }
    const int n = int(std::min<int64_t>(W, ow - ox0));
    float* yp = yrow + ox0 * ys + k0;
    // W channels at a time: activated, transposed to W pixels' channels, stored pixel by pixel.
    LOPPER_UNROLL
    for (int c0 = 0; c0 < KG; c0 += W) {
      if (c0 >= kg) break;
      V r[W];
      LOPPER_UNROLL
      for (int j = 0; j < W; ++j) {
        if (c0 + j < KG) {
          const V b = e.bias ? T::set1(e.bias[k0 + c0 + j]) : T::zero();
          r[j] = activate<T>(T::add(acc[c0 + j], b), e);
        } else {
          r[j] = T::zero();
        }
      }
      T::transpose(r);
      const int nc = std::min(W, kg - c0);
      for (int l = 0; l < n; ++l) {
        if (nc == W)
          T::store(yp + l * ys + c0, r[l]);
        else
          T::storem(yp + l * ys + c0, r[l], nc);
      }
    }
  }
}

// w [k][c][kh][kw] (ONNX's OIHW) -> [k / kg][c][kh][kw][kg], zeros past k: each pass's weights of
// a tap together.
inline void planar_pack(const float* w, const ConvShape& s, int kg, float* out) {
  const int64_t taps = s.c * s.kh * s.kw, passes = (s.k + kg - 1) / kg;
  for (int64_t p = 0; p < passes; ++p)
    for (int64_t t = 0; t < taps; ++t)
      for (int64_t r = 0; r < kg; ++r) {
        const int64_t k = p * kg + r;
        *out++ = k < s.k ? w[k * taps + t] : 0.f;
      }
}

// Output rows [r0, r1) of the s.n * s.oh rows of y (channels-last, s.y_stride floats a pixel; 0:
// s.k) from x's planes (image after image, s.c planes of s.c_stride floats each, rows s.w floats);
// packed by planar_pack for kg; s.sw 1 or 2.
template <class T>
void conv_planar_rows(const float* x, const float* packed, int kg, float* y, const ConvShape& s0,
                      const Epilogue& e, int64_t r0, int64_t r1) {
  constexpr int W = T::W;
  const ConvShape s = with_strides(s0);
  const int64_t owp = (s.ow + W - 1) / W * W;
  // A padded input row: pw zeros, the row, zeros up to what the last vector of taps reads.
  const int64_t len = (s.kw - 1) * s.dw + s.sw * owp + W;
  thread_local std::vector<float> rows;
  thread_local std::vector<const float*> taps, wts;
  rows.resize(static_cast<size_t>(s.c * s.kh * len));
  taps.resize(static_cast<size_t>(s.c * s.kh * s.kw));
  wts.resize(taps.size());
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t img = r / s.oh, oy = r % s.oh;
    int64_t ntaps = 0;
    for (int64_t c = 0; c < s.c; ++c)
      for (int64_t i = 0; i < s.kh; ++i) {
        const int64_t iy = oy * s.sh - s.ph + i * s.dh;
        if (iy < 0 || iy >= s.h) continue;  // a padding row adds nothing
        float* row = rows.data() + (c * s.kh + i) * len;
        const float* src = x + (img * s.c + c) * s.c_stride + iy * s.w;
        const int64_t lead = std::min(s.pw, len), body = std::min(s.w, len - lead);
        std::fill(row, row + lead, 0.f);
        std::copy(src, src + body, row + lead);
        std::fill(row + lead + body, row + len, 0.f);
        for (int64_t j = 0; j < s.kw; ++j, ++ntaps) {
          taps[ntaps] = row + j * s.dw;
          wts[ntaps] = packed + ((c * s.kh + i) * s.kw + j) * kg;  // the first pass's
        }
      }
    float* yrow = y + (img * s.oh + oy) * s.ow * s.y_stride;
    const int64_t pass_floats = s.c * s.kh * s.kw * kg;
    for (int64_t k0 = 0; k0 < s.k; k0 += kg) {
      if (k0 > 0)
        for (int64_t t = 0; t < ntaps; ++t) wts[t] += pass_floats;
      const int n = int(std::min<int64_t>(kg, s.k - k0));
      constexpr int step = kPlanarStep<T>;
      auto pass = [&](auto kg_const) {
        constexpr int G = decltype(kg_const)::value;
        if (s.sw == 2)
          planar_row_pass<T, G, 2>(taps.data(), wts.data(), ntaps, k0, n, s.ow, e, yrow,
                                   s.y_stride);
        else
          planar_row_pass<T, G, 1>(taps.data(), wts.data(), ntaps, k0, n, s.ow, e, yrow,
                                   s.y_stride);
      };
      if (kg == 3 * step)
        pass(std::integral_constant<int, 3 * step>());
      else if (kg == 2 * step)
        pass(std::integral_constant<int, 2 * step>());
      else
        pass(std::integral_constant<int, step>());
    }
  }
}

// --- Narrow groups --------------------------------------------------------------------------
// A grouped convolution of g channels a group in and out (g < W, dividing W: a ResNeXt pruned to
// half has groups of 2, 4 and 8). The per-group dense kernel spends a whole vector on a group's g
// outputs (2 of 16 lanes at g = 2); here one vector holds W / g whole groups of outputs, and the
// input vector at the same channels is permuted once per input channel i of a group (lane o reads
// channel o - o % g + i), so that every lane does a useful multiply-add. Packed weight:
// [vector][kh][kw][i][W] (the lanes past k zero). A tile: one output row x one vector.
inline int64_t narrow_vectors(const ConvShape& s, int width) { return (s.k + width - 1) / width; }

inline void narrow_pack(const float* w, const ConvShape& s, int64_t g, int width, float* out) {
  for (int64_t v = 0; v < narrow_vectors(s, width); ++v)
    for (int64_t i = 0; i < s.kh; ++i)
      for (int64_t j = 0; j < s.kw; ++j)
        for (int64_t c = 0; c < g; ++c)
          for (int64_t l = 0; l < width; ++l) {
            const int64_t o = v * width + l;
            *out++ = o < s.k ? w[((o * g + c) * s.kh + i) * s.kw + j] : 0.f;
          }
}

// idx[i]: lane o reads input channel o - o % G + i (the i-th channel of its group).
template <class T, int G>
inline void narrow_indices(typename T::I* idx) {
  for (int i = 0; i < G; ++i) {
    int32_t lanes[T::W];
    for (int l = 0; l < T::W; ++l) lanes[l] = l - l % G + i;
    idx[i] = T::load_index(lanes);
  }
}

// Lane o of the result: channel i of the group of G that lane o belongs to, x[o - o % G + i].
// Groups of 2 or 4 lie inside the 128-bit lanes: an in-lane permute by an immediate (vpermilps, one
// cycle and no index register), else the cross-lane permute by idx[i].
template <class T, int G>
inline typename T::V group_channel(typename T::V xv, const typename T::I* idx, int i) {
  if constexpr (T::W >= 8 && G == 4) {
    switch (i) {
      case 0:
        return T::template permute_in_lanes<0x00>(xv);
      case 1:
        return T::template permute_in_lanes<0x55>(xv);
      case 2:
        return T::template permute_in_lanes<0xAA>(xv);
      default:
        return T::template permute_in_lanes<0xFF>(xv);
    }
  } else if constexpr (T::W >= 8 && G == 2) {
    return i == 0 ? T::template permute_in_lanes<0xA0>(xv) : T::template permute_in_lanes<0xF5>(xv);
  } else {
    return T::permute(idx[i], xv);
  }
}

// One output row x one vector of groups of G channels. K3S1: a 3x3 kernel of stride 1 without
// dilation (every grouped layer of a ResNeXt but a stage's first), where each input column of a
// kernel row is loaded and permuted once and serves the three output pixels that read it (OB + 2
// columns for OB pixels, not 3 * OB); otherwise each pixel's taps in turn.
template <class T, int G, int OB, bool K3S1>
void narrow_row(const float* const* rows, const float* packed, float* yrow, const float* rrow,
                const ConvShape& s, const Epilogue& e, int64_t i0, int64_t i1, int64_t v) {
  constexpr int W = T::W;
  using V = typename T::V;
  typename T::I idx[G];
  narrow_indices<T, G>(idx);
  const int64_t c0 = v * W;
  const int valid = int(std::min<int64_t>(W, s.k - c0));
  const V bias = e.bias ? T::loadm(e.bias + c0, valid) : T::zero();
  const float* wv0 = packed + v * s.kh * s.kw * G * W;
  auto load_x = [&](const float* p) { return valid == W ? T::load(p) : T::loadm(p, valid); };
  for (int64_t ox0 = 0; ox0 < s.ow; ox0 += OB) {
    const int np = int(std::min<int64_t>(OB, s.ow - ox0));
    V acc[OB];
    LOPPER_UNROLL
    for (int m = 0; m < OB; ++m) acc[m] = bias;
    for (int64_t ky = i0; ky < i1; ++ky) {
      const float* xrow = rows[ky] + c0;
      const float* wk = wv0 + ky * s.kw * G * W;
      if constexpr (K3S1) {
        // Groups of up to 4: the kernel row's 3G weight vectors held in registers (beside OB
        // accumulators and G permuted columns), not loaded again for each column.
        constexpr int kHeld = G <= 4 ? 3 * G : 1;
        V wr[kHeld];
        if constexpr (G <= 4) {
          LOPPER_UNROLL
          for (int q = 0; q < 3 * G; ++q) wr[q] = T::load(wk + q * W);
        }
        LOPPER_UNROLL
        for (int cc = 0; cc < OB + 2; ++cc) {
          const int64_t ix = ox0 - s.pw + cc;
          if (ix < 0 || ix >= s.w) continue;
          const V xv = load_x(xrow + ix * s.x_stride);
          V p[G];
          if constexpr (G == 8 && T::W == 16) {
            const V a = T::template shuffle_lanes<0xA0>(xv),
                    b = T::template shuffle_lanes<0xF5>(xv);
            LOPPER_UNROLL
            for (int i = 0; i < 4; ++i) {
              p[i] = group_channel<T, 4>(a, idx, i);
              p[4 + i] = group_channel<T, 4>(b, idx, i);
            }
          } else {
            LOPPER_UNROLL
            for (int i = 0; i < G; ++i) p[i] = group_channel<T, G>(xv, idx, i);
          }
          LOPPER_UNROLL
          for (int kx = 0; kx < 3; ++kx) {
            const int m = cc - kx;  // the output pixel that reads this column through tap kx
            if (m < 0 || m >= OB) continue;
            LOPPER_UNROLL
            for (int i = 0; i < G; ++i) {
              if constexpr (G <= 4)
                acc[m] = T::fma(p[i], wr[kx * G + i], acc[m]);
              else
                acc[m] = T::fma(p[i], T::load(wk + (kx * G + i) * W), acc[m]);
            }
          }
        }
      } else {
        for (int64_t kx = 0; kx < s.kw; ++kx) {
          V wv[G];
          LOPPER_UNROLL
          for (int i = 0; i < G; ++i) wv[i] = T::load(wk + (kx * G + i) * W);
          const int64_t ix0 = ox0 * s.sw - s.pw + kx * s.dw;
          LOPPER_UNROLL
          for (int m = 0; m < OB; ++m) {
            const int64_t ix = ix0 + m * s.sw;
            if (m >= np || ix < 0 || ix >= s.w) continue;
            const V xv = load_x(xrow + ix * s.x_stride);
            LOPPER_UNROLL
            for (int i = 0; i < G; ++i)
              acc[m] = T::fma(group_channel<T, G>(xv, idx, i), wv[i], acc[m]);
          }
        }
      }
    }
    for (int m = 0; m < np; ++m) {
      const int64_t px = ox0 + m;
      store_out<T>(acc[m], valid, yrow + px * s.y_stride + c0,
                   rrow ? rrow + px * s.r_stride + c0 : nullptr, e);
    }
  }
}

// One output row x vector of groups of g channels, for g in {G, 2G, ...} up to 8 that the vector
// holds whole (the 3x3 stride-1 path where it applies); false for any other g.
template <class T, int G, int OB>
bool narrow_row_of(int64_t g, bool s1_3x3, const float* const* rows, const float* packed,
                   float* yrow, const float* rrow, const ConvShape& s, const Epilogue& e,
                   int64_t i0, int64_t i1, int64_t v) {
  if constexpr (G < T::W) {
    if (g == G) {
      if (s1_3x3)
        narrow_row<T, G, OB, true>(rows, packed, yrow, rrow, s, e, i0, i1, v);
      else
        narrow_row<T, G, OB, false>(rows, packed, yrow, rrow, s, e, i0, i1, v);
      return true;
    }
  }
  if constexpr (G < 8)
    return narrow_row_of<T, 2 * G, OB>(g, s1_3x3, rows, packed, yrow, rrow, s, e, i0, i1, v);
  return false;
}

// Vectors [v0, v1) of one output row (s: the shape with its strides explicit).
template <class T>
void narrow_vectors_of_row(const float* const* rows, const float* packed, float* yrow,
                           const float* rrow, const ConvShape& s, int64_t g, const Epilogue& e,
                           int64_t i0, int64_t i1, int64_t v0, int64_t v1) {
  constexpr int OB = T::W >= 16 ? 8 : 4;  // accumulators beside G weights and G indices
  const bool s1_3x3 = s.kh == 3 && s.kw == 3 && s.sh == 1 && s.sw == 1 && s.dh == 1 && s.dw == 1;
  for (int64_t v = v0; v < v1; ++v)
    narrow_row_of<T, 2, OB>(g, s1_3x3, rows, packed, yrow, rrow, s, e, i0, i1, v);
}

template <class T>
void narrow_tiles(const float* x, const float* packed, float* y, const float* res,
                  const ConvShape& s0, int64_t g, const Epilogue& e, int64_t t0, int64_t t1) {
  const ConvShape s = with_strides(s0);
  const int64_t nv = narrow_vectors(s, T::W);
  const float* rows[kDwMaxTaps];
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t row = t / nv, v = t % nv, img = row / s.oh, oy = row % s.oh;
    const auto [i0, i1] = taps_inside(oy * s.sh - s.ph, s.kh, s.dh, s.h);
    for (int64_t i = i0; i < i1; ++i)
      rows[i] = x + (img * s.h + oy * s.sh - s.ph + i * s.dh) * s.w * s.x_stride;
    narrow_vectors_of_row<T>(rows, packed, y + row * s.ow * s.y_stride,
                             res ? res + row * s.ow * s.r_stride : nullptr, s, g, e, i0, i1, v,
                             v + 1);
  }
}

#if LOPPER_SPARSE_ISA > 1
// --- dense convolution of bfloat16 pixels on the bfloat16 dot product ------------------------
//
// The dense kernel's tiles (MR pixels x a block of NV vectors of output channels), the input
// channels taken in pairs: a pixel's two bf16 channels broadcast as one 32-bit word, the weight
// packed as [blocks][kh][kw][c / 2][NB] words of two bf16 (channels 2p, 2p + 1), and one
// vdpbf16ps per vector adds both products: half the FMA-port instructions and broadcasts of the
// float32 kernel on widened rows.
inline int64_t pairs_packed_size(const ConvShape& s) {
  constexpr int NB = ConvTraits<Wide>::kNB;
  return conv_blocks(s, NB) * NB * s.kh * s.kw * (s.c / 2);
}

inline void pack_pairs(const float* w, const ConvShape& s, uint32_t* packed) {
  constexpr int NB = ConvTraits<Wide>::kNB;
  const int64_t pairs = s.c / 2;
  auto at = [&](int64_t k, int64_t c, int64_t i, int64_t j) {
    return uint32_t(to_bf16(w[((k * s.c + c) * s.kh + i) * s.kw + j]));
  };
  for (int64_t b = 0; b < conv_blocks(s, NB); ++b)
    for (int64_t i = 0; i < s.kh; ++i)
      for (int64_t j = 0; j < s.kw; ++j)
        for (int64_t p = 0; p < pairs; ++p)
          for (int64_t o = 0; o < NB; ++o) {
            const int64_t k = b * NB + o;
            *packed++ = k < s.k ? at(k, 2 * p, i, j) | at(k, 2 * p + 1, i, j) << 16 : 0u;
          }
}

#pragma GCC push_options
#pragma GCC target("avx512bw,avx512dq,avx512bf16")

// v rounded to bf16 as to_bf16 rounds (V16::bf16_bits), by vcvtneps2bf16 where that agrees: it
// rounds to nearest even as to_bf16 does but takes a subnormal as zero and keeps a NaN's sign and
// payload, so a vector holding either (vfpclassps: QNaN 0x01, denormal 0x20, SNaN 0x80) goes the
// long way.
inline __m256i round_bf16(__m512 v) {
  if (__builtin_expect(_mm512_fpclass_ps_mask(v, 0xA1) != 0, 0)) return Wide::bf16_bits(v);
  return (__m256i)_mm512_cvtneps_pbh(v);
}

// Where a tile's results go: float32 y or bf16 y16, a float32 or bf16 residual (or none).
struct PairOut {
  float* y;
  uint16_t* y16;
  const float* res;
  const uint16_t* r16;
};

// A border tile of bf16 pixels: each tap of pixel m located from at[m] and checked, one outside
// reading `zeros` (s.c of them).
struct PairBorder {
  const uint16_t* x;
  const PixelAt* at;
  const uint16_t* zeros;
};

// MR pixels x NV vectors of one block: pixel m's window starts at px[m] (every tap inside the
// input), or, with `border`, each tap is located and checked. `row`: the values between input
// rows.
template <int MR, int NV, bool BORDER>
inline void pair_micro(const uint16_t* const* px, const uint32_t* wb, int64_t row, int valid,
                       int64_t pix0, int64_t kbase, const PairOut& out, const ConvShape& s,
                       const Epilogue& e, const PairBorder* border) {
  using T = Wide;
  constexpr int NB = ConvTraits<T>::kNB;
  const int64_t pairs = s.c / 2;
  const int64_t left = s.k - kbase;
  int n[NV];
  // The sums start from the bias: one add less per output vector in the epilogue, which for a
  // 1x1 layer of few input channels is as long as the products. (The bias vectors are not kept
  // across the products: 24 sums, 3 weight vectors and a broadcast fill the 32 registers.)
  __m512 acc[MR][NV];
  LOPPER_UNROLL for (int v = 0; v < NV; ++v) {
    n[v] = int(std::clamp<int64_t>(left - v * 16, 0, 16));
    const __m512 b = e.bias ? T::loadm(e.bias + kbase + v * 16, n[v]) : T::zero();
    LOPPER_UNROLL for (int m = 0; m < MR; ++m) acc[m][v] = b;
  }
  // Without dilation and with packed pixels, a kernel row's taps x channels are one run of the
  // input and of the packed weight: one loop over it, as the float32 kernel's.
  const bool runs = !BORDER && s.dw == 1 && s.x_stride == s.c;
  const int64_t span = runs ? s.kw * pairs : pairs, taps = runs ? 1 : s.kw;
  for (int64_t i = 0; i < s.kh; ++i)
    for (int64_t j = 0; j < taps; ++j) {
      const uint32_t* wt = wb + (i * s.kw + j) * pairs * NB;
      const uint16_t* p[MR];
      LOPPER_UNROLL for (int m = 0; m < MR; ++m) {
        if constexpr (BORDER) {
          const PixelAt& a = border->at[m];
          const int64_t iy = a.iy + i * s.dh, ix = a.ix + j * s.dw;
          p[m] = tap_inside(s, iy, ix) ? border->x + ((a.img * s.h + iy) * s.w + ix) * s.x_stride
                                       : border->zeros;
        } else {
          p[m] = px[m] + i * s.dh * row + j * s.dw * s.x_stride;
        }
      }
      for (int64_t q = 0; q < span; ++q) {
        __m512bh w[NV];
        LOPPER_UNROLL for (int v = 0; v < NV; ++v) w[v] =
            (__m512bh)_mm512_loadu_si512(wt + q * NB + v * 16);
        LOPPER_UNROLL for (int m = 0; m < MR; ++m) {
          const __m512bh xb = (__m512bh)_mm512_set1_epi32(int(bf16_pair(p[m] + 2 * q)));
          LOPPER_UNROLL for (int v = 0; v < NV; ++v) acc[m][v] =
              _mm512_dpbf16_ps(acc[m][v], xb, w[v]);
        }
      }
    }
  LOPPER_UNROLL for (int m = 0; m < MR; ++m) {
    if (m >= valid) break;
    const int64_t pix = pix0 + m;
    const int64_t yo = pix * s.y_stride + kbase, ro = pix * s.r_stride + kbase;
    if (out.y != nullptr) {
      LOPPER_UNROLL for (int v = 0; v < NV; ++v) if (n[v] > 0) store_out<T>(
          acc[m][v], n[v], out.y + yo + v * 16, out.res ? out.res + ro + v * 16 : nullptr, e);
      continue;
    }
    __m512 o[NV];
    LOPPER_UNROLL for (int v = 0; v < NV; ++v) {
      const __mmask16 mk = __mmask16((1u << n[v]) - 1u);
      o[v] = acc[m][v];
      if (out.res) o[v] = T::add(o[v], _mm512_maskz_loadu_ps(mk, out.res + ro + v * 16));
      if (out.r16) {
        const __m512i r =
            _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mk, out.r16 + ro + v * 16));
        o[v] = T::add(o[v], _mm512_castsi512_ps(_mm512_slli_epi32(r, 16)));
      }
      o[v] = activate<T>(o[v], e);
    }
    int v0 = 0;
    // Two full vectors (32 channels) rounded by one vcvtne2ps2bf16 and stored as one 64-byte
    // row: half the conversions and stores (round_bf16's rule: a subnormal or NaN in either goes
    // the long way).
    if constexpr (NV >= 2) {
      if (n[1] == 16 &&
          __builtin_expect(
              (_mm512_fpclass_ps_mask(o[0], 0xA1) | _mm512_fpclass_ps_mask(o[1], 0xA1)) == 0, 1)) {
        _mm512_storeu_si512(out.y16 + yo, (__m512i)_mm512_cvtne2ps_pbh(o[1], o[0]));
        v0 = 2;
      }
    }
    LOPPER_UNROLL for (int v = 0; v < NV; ++v) {
      if (v < v0 || n[v] == 0) continue;
      _mm256_mask_storeu_epi16(out.y16 + yo + v * 16, __mmask16((1u << n[v]) - 1u),
                               round_bf16(o[v]));
    }
  }
}

// Tiles [t0, t1) of tiles(s, false) of a dense convolution of bf16 pixels (s.c even; any kernel,
// stride, padding and dilation), numbered as conv_tiles numbers them; the input read unpadded, as
// conv_tiles reads it.
template <int MR>
void pair_tiles(const uint16_t* x, const uint32_t* packed, const PairOut& out, const ConvShape& s0,
                const Epilogue& e, int64_t t0, int64_t t1) {
  constexpr int NB = ConvTraits<Wide>::kNB;
  const ConvShape s = with_strides(s0);
  const int64_t pixels = s.n * s.oh * s.ow, groups = (pixels + MR - 1) / MR;
  const int64_t blocks = conv_blocks(s, NB), wblock = s.kh * s.kw * (s.c / 2) * NB;
  const int64_t row = s.w * s.x_stride;
  const bool pixel_major = conv_pixel_major(s);
  thread_local std::vector<uint16_t> zeros;
  if (zeros.size() < size_t(s.c)) zeros.assign(size_t(s.c), 0);
  const uint16_t* px[MR];
  PixelAt at[MR];
  const PairBorder border_tile{x, at, zeros.data()};
  bool border = false;
  int64_t located = -1;
  for (int64_t t = t0; t < t1; ++t) {
    const auto [b, grp] = conv_tile_at(t, blocks, groups, pixel_major);
    const int64_t pix0 = grp * MR, kbase = b * NB;
    const int valid = int(std::min<int64_t>(MR, pixels - pix0));
    if (grp != located) {
      border = locate_windows<uint16_t, MR>(x, s, pix0, valid, px, at);
      located = grp;
    }
    const uint32_t* wb = packed + b * wblock;
    const int64_t nv = (s.k - kbase + 15) / 16;
    auto micro = [&](auto nvc) {
      constexpr int NV = decltype(nvc)::value;
      if (border)
        pair_micro<MR, NV, true>(px, wb, row, valid, pix0, kbase, out, s, e, &border_tile);
      else
        pair_micro<MR, NV, false>(px, wb, row, valid, pix0, kbase, out, s, e, nullptr);
    };
    if (nv >= 3)
      micro(std::integral_constant<int, 3>{});
    else if (nv == 2)
      micro(std::integral_constant<int, 2>{});
    else
      micro(std::integral_constant<int, 1>{});
  }
}

void run_pairs(const uint16_t* x, const uint32_t* packed, float* y, uint16_t* y16,
               const float* residual, const uint16_t* r16, const ConvShape& s, const Epilogue& e,
               int64_t t0, int64_t t1) {
  const PairOut out{y, y16, residual, r16};
  if (conv_mr<Wide>(s) == ConvTraits<Wide>::kMR)
    pair_tiles<ConvTraits<Wide>::kMR>(x, packed, out, s, e, t0, t1);
  else
    pair_tiles<ConvTraits<Wide>::kMR - 1>(x, packed, out, s, e, t0, t1);
}

// --- narrow groups of bfloat16 rows on the bfloat16 dot product ------------------------------
//
// The narrow-group kernel's row (groups of G = 2, 4 or 8 channels in and out, whole groups to a
// vector of 16 output channels) on bf16 input rows. The 16 input channels at a vector's channels
// are 8 words of two bf16; lane o (group o / G) takes word (o / G) * G / 2 + p for its group's pair
// p, one vpermd a pair: half the permutes and multiply-adds of the float32 kernel. Packed weight:
// [vector][kh][kw][p][16] words, lane o's pair (w[o][2p], w[o][2p + 1]) rounded to bf16. The
// output row bf16, rounded once after the bias and activation.
inline int64_t narrow_pairs_size(const ConvShape& s) {
  return narrow_vectors(s, 16) * s.kh * s.kw * (s.c / 2) * 16;
}

inline void narrow_pack_pairs(const float* w, const ConvShape& s, uint32_t* out) {
  const int64_t g = s.c;
  for (int64_t v = 0; v < narrow_vectors(s, 16); ++v)
    for (int64_t i = 0; i < s.kh; ++i)
      for (int64_t j = 0; j < s.kw; ++j)
        for (int64_t p = 0; p < g / 2; ++p)
          for (int64_t l = 0; l < 16; ++l) {
            const int64_t o = v * 16 + l;
            auto at = [&](int64_t c) {
              return uint32_t(to_bf16(w[((o * g + c) * s.kh + i) * s.kw + j]));
            };
            *out++ = o < s.k ? at(2 * p) | at(2 * p + 1) << 16 : 0u;
          }
}

template <int G, int OB, bool K3S1>
void narrow_pairs_row(const uint16_t* const* rows, const uint32_t* packed, uint16_t* yrow,
                      const ConvShape& s, const Epilogue& e, int64_t i0, int64_t i1, int64_t v) {
  using T = Wide;
  constexpr int P = G / 2;
  __m512i idx[P];
  LOPPER_UNROLL for (int p = 0; p < P; ++p) {
    int32_t lanes[16];
    for (int l = 0; l < 16; ++l) lanes[l] = l / G * P + p;
    idx[p] = _mm512_loadu_si512(lanes);
  }
  const int64_t c0 = v * 16;
  const int valid = int(std::min<int64_t>(16, s.k - c0));
  const __mmask16 mk = __mmask16((1u << valid) - 1u);  // output lanes, and input channels
  const __m512 bias = e.bias ? _mm512_maskz_loadu_ps(mk, e.bias + c0) : T::zero();
  const uint32_t* wv0 = packed + v * s.kh * s.kw * P * 16;
  auto load_x = [&](const uint16_t* p) {
    return _mm512_castsi256_si512(_mm256_maskz_loadu_epi16(mk, p));
  };
  for (int64_t ox0 = 0; ox0 < s.ow; ox0 += OB) {
    const int np = int(std::min<int64_t>(OB, s.ow - ox0));
    __m512 acc[OB];
    LOPPER_UNROLL for (int m = 0; m < OB; ++m) acc[m] = bias;
    for (int64_t ky = i0; ky < i1; ++ky) {
      const uint16_t* xrow = rows[ky] + c0;
      const uint32_t* wk = wv0 + ky * s.kw * P * 16;
      if constexpr (K3S1) {
        __m512bh wr[3 * P];
        LOPPER_UNROLL for (int q = 0; q < 3 * P; ++q) wr[q] =
            (__m512bh)_mm512_loadu_si512(wk + q * 16);
        LOPPER_UNROLL for (int cc = 0; cc < OB + 2; ++cc) {
          const int64_t ix = ox0 - s.pw + cc;
          if (ix < 0 || ix >= s.w) continue;
          const __m512i xv = load_x(xrow + ix * s.x_stride);
          __m512bh pp[P];
          LOPPER_UNROLL for (int p = 0; p < P; ++p) pp[p] =
              (__m512bh)_mm512_permutexvar_epi32(idx[p], xv);
          LOPPER_UNROLL for (int kx = 0; kx < 3; ++kx) {
            const int m = cc - kx;  // the output pixel that reads this column through tap kx
            if (m < 0 || m >= OB) continue;
            LOPPER_UNROLL for (int p = 0; p < P; ++p) acc[m] =
                _mm512_dpbf16_ps(acc[m], pp[p], wr[kx * P + p]);
          }
        }
      } else {
        for (int64_t kx = 0; kx < s.kw; ++kx) {
          __m512bh wv[P];
          LOPPER_UNROLL for (int p = 0; p < P; ++p) wv[p] =
              (__m512bh)_mm512_loadu_si512(wk + (kx * P + p) * 16);
          const int64_t ix0 = ox0 * s.sw - s.pw + kx * s.dw;
          LOPPER_UNROLL for (int m = 0; m < OB; ++m) {
            const int64_t ix = ix0 + m * s.sw;
            if (m >= np || ix < 0 || ix >= s.w) continue;
            const __m512i xv = load_x(xrow + ix * s.x_stride);
            LOPPER_UNROLL for (int p = 0; p < P; ++p) acc[m] =
                _mm512_dpbf16_ps(acc[m], (__m512bh)_mm512_permutexvar_epi32(idx[p], xv), wv[p]);
          }
        }
      }
    }
    for (int m = 0; m < np; ++m)
      _mm256_mask_storeu_epi16(yrow + (ox0 + m) * s.y_stride + c0, mk,
                               round_bf16(activate<T>(acc[m], e)));
  }
}

template <int G>
void narrow_pairs_vectors(const uint16_t* const* rows, const uint32_t* packed, uint16_t* yrow,
                          const ConvShape& s, const Epilogue& e, int64_t i0, int64_t i1, int64_t v0,
                          int64_t v1) {
  const bool s1_3x3 = s.kh == 3 && s.kw == 3 && s.sh == 1 && s.sw == 1 && s.dh == 1 && s.dw == 1;
  for (int64_t v = v0; v < v1; ++v) {
    if (s1_3x3)
      narrow_pairs_row<G, 8, true>(rows, packed, yrow, s, e, i0, i1, v);
    else
      narrow_pairs_row<G, 8, false>(rows, packed, yrow, s, e, i0, i1, v);
  }
}

void narrow_row_pairs(const uint16_t* const* rows, const uint32_t* packed, uint16_t* yrow,
                      const ConvShape& s0, int64_t g, const Epilogue& e, int64_t i0, int64_t i1,
                      int64_t v0, int64_t v1) {
  const ConvShape s = with_strides(s0);
  if (g == 2)
    narrow_pairs_vectors<2>(rows, packed, yrow, s, e, i0, i1, v0, v1);
  else if (g == 4)
    narrow_pairs_vectors<4>(rows, packed, yrow, s, e, i0, i1, v0, v1);
  else if (g == 8)
    narrow_pairs_vectors<8>(rows, packed, yrow, s, e, i0, i1, v0, v1);
}

// --- a planar first layer of bfloat16 planes on the bfloat16 dot product ----------------------
//
// A network's first layer (3 planes in, a bf16 model's input) has too few channels to pair: here
// a kernel row's taps are paired instead. Along a padded input row, taps j and j + 1 of output
// pixel ox are the two adjacent bf16 at sw * ox + j: one 32-bit word, broadcast as is, whatever
// the stride. A (plane, kernel row) gives (kw + 1) / 2 words a pixel, the last of an odd kw with
// its second half zeroed (its weight is zero, but the value there belongs to the next tap of a
// neighbour, and an infinity times zero would make the sum NaN). Tiles of MR pixels x NV vectors of
// a block of 32 output channels, weight packed [block][plane][kernel row][pair][32] words; 3x3:
// 18 vdpbf16ps a pixel and vector for 27 products (7x7: 84 for 147), against 27 float32 FMAs, and
// the output rounded to bf16 in the kernel.
constexpr int kPlanarPairsBlock = 32;

inline int64_t planar_pairs_size(const ConvShape& s) {
  const int64_t blocks = (s.k + kPlanarPairsBlock - 1) / kPlanarPairsBlock;
  return blocks * s.c * s.kh * ((s.kw + 1) / 2) * kPlanarPairsBlock;
}

inline void planar_pack_pairs(const float* w, const ConvShape& s, uint32_t* out) {
  const int64_t blocks = (s.k + kPlanarPairsBlock - 1) / kPlanarPairsBlock, jp = (s.kw + 1) / 2;
  auto at = [&](int64_t k, int64_t c, int64_t i, int64_t j) {
    return k < s.k && j < s.kw ? uint32_t(to_bf16(w[((k * s.c + c) * s.kh + i) * s.kw + j])) : 0u;
  };
  for (int64_t b = 0; b < blocks; ++b)
    for (int64_t c = 0; c < s.c; ++c)
      for (int64_t i = 0; i < s.kh; ++i)
        for (int64_t p = 0; p < jp; ++p)
          for (int64_t o = 0; o < kPlanarPairsBlock; ++o) {
            const int64_t k = b * kPlanarPairsBlock + o;
            *out++ = at(k, c, i, 2 * p) | at(k, c, i, 2 * p + 1) << 16;
          }
}

// MR pixels from ox0 of one output row x NV vectors from output channel kbase: rows[r] the padded
// input rows (nr of them, each the weights' (plane, kernel row) wrow[r]), yp the row's first pixel.
template <int MR, int NV>
inline void planar_pairs_tile(const uint16_t* const* rows, const uint32_t* const* wrow, int64_t nr,
                              int64_t jp, bool odd, int64_t ox0, int valid, int64_t kbase,
                              uint16_t* yp, const ConvShape& s, const Epilogue& e) {
  using T = Wide;
  const int64_t left = s.k - kbase;
  __m512 acc[MR][NV];
  LOPPER_UNROLL for (int v = 0; v < NV; ++v) {
    const int n = int(std::clamp<int64_t>(left - v * 16, 0, 16));
    const __m512 b = e.bias ? T::loadm(e.bias + kbase + v * 16, n) : T::zero();
    LOPPER_UNROLL for (int m = 0; m < MR; ++m) acc[m][v] = b;
  }
  const __m512i low = _mm512_set1_epi32(0xFFFF);
  for (int64_t r = 0; r < nr; ++r) {
    const uint16_t* row = rows[r] + s.sw * ox0;
    const uint32_t* wr = wrow[r];
    for (int64_t p = 0; p < jp; ++p) {
      __m512bh w[NV];
      LOPPER_UNROLL for (int v = 0; v < NV; ++v) w[v] =
          (__m512bh)_mm512_loadu_si512(wr + p * kPlanarPairsBlock + v * 16);
      const bool half = odd && p == jp - 1;
      LOPPER_UNROLL for (int m = 0; m < MR; ++m) {
        __m512i xw = _mm512_set1_epi32(int(bf16_pair(row + s.sw * m + 2 * p)));
        if (half) xw = _mm512_and_si512(xw, low);
        LOPPER_UNROLL for (int v = 0; v < NV; ++v) acc[m][v] =
            _mm512_dpbf16_ps(acc[m][v], (__m512bh)xw, w[v]);
      }
    }
  }
  LOPPER_UNROLL for (int m = 0; m < MR; ++m) {
    if (m >= valid) break;
    LOPPER_UNROLL for (int v = 0; v < NV; ++v) {
      const int n = int(std::clamp<int64_t>(left - v * 16, 0, 16));
      if (n == 0) continue;
      _mm256_mask_storeu_epi16(yp + (ox0 + m) * s.y_stride + kbase + v * 16,
                               __mmask16((1u << n) - 1u), round_bf16(activate<T>(acc[m][v], e)));
    }
  }
}

// Output rows [r0, r1) of the s.n * s.oh rows of y16 (bf16 channels-last, s.y_stride values a
// pixel) from x16's bf16 planes (image after image, s.c planes of s.c_stride values, rows s.w
// values), packed by planar_pack_pairs; any stride, kernel and padding, dilation in rows only
// (s.dw 1). Each (plane, kernel row) of an output row is copied with its padding first.
void planar_pairs_rows(const uint16_t* x, const uint32_t* packed, uint16_t* y, const ConvShape& s0,
                       const Epilogue& e, int64_t r0, int64_t r1) {
  constexpr int MR = 8;
  const ConvShape s = with_strides(s0);
  const int64_t jp = (s.kw + 1) / 2, owp = (s.ow + MR - 1) / MR * MR;
  const int64_t len = s.sw * (owp - 1) + 2 * jp;  // the last tile's last word's end
  const int64_t per_block = s.c * s.kh * jp * kPlanarPairsBlock;
  thread_local std::vector<uint16_t> buf;
  buf.resize(static_cast<size_t>(s.c * s.kh * len));
  const uint16_t* rows[4 * kDwMaxTaps];
  const uint32_t* wrow[4 * kDwMaxTaps];
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t img = r / s.oh, oy = r % s.oh;
    int64_t nr = 0;
    for (int64_t c = 0; c < s.c; ++c)
      for (int64_t i = 0; i < s.kh; ++i) {
        const int64_t iy = oy * s.sh - s.ph + i * s.dh;
        if (iy < 0 || iy >= s.h) continue;  // a padding row adds nothing
        uint16_t* row = buf.data() + (c * s.kh + i) * len;
        const uint16_t* src = x + (img * s.c + c) * s.c_stride + iy * s.w;
        const int64_t lead = std::min(s.pw, len), body = std::min(s.w, len - lead);
        std::fill(row, row + lead, uint16_t(0));
        std::copy(src, src + body, row + lead);
        std::fill(row + lead + body, row + len, uint16_t(0));
        rows[nr] = row;
        wrow[nr++] = packed + (c * s.kh + i) * jp * kPlanarPairsBlock;
      }
    uint16_t* yrow = y + r * s.ow * s.y_stride;
    for (int64_t kbase = 0; kbase < s.k; kbase += kPlanarPairsBlock) {
      if (kbase > 0)
        for (int64_t q = 0; q < nr; ++q) wrow[q] += per_block;
      const bool two = s.k - kbase > 16;
      for (int64_t ox0 = 0; ox0 < s.ow; ox0 += MR) {
        const int valid = int(std::min<int64_t>(MR, s.ow - ox0));
        if (two)
          planar_pairs_tile<MR, 2>(rows, wrow, nr, jp, s.kw % 2 == 1, ox0, valid, kbase, yrow, s,
                                   e);
        else
          planar_pairs_tile<MR, 1>(rows, wrow, nr, jp, s.kw % 2 == 1, ox0, valid, kbase, yrow, s,
                                   e);
      }
    }
  }
}

#pragma GCC pop_options
#define LOPPER_CONV_PAIRS                                                         \
  pairs_packed_size, pack_pairs, run_pairs, narrow_pairs_size, narrow_pack_pairs, \
      narrow_row_pairs, planar_pairs_size, planar_pack_pairs, planar_pairs_rows
#else
#define LOPPER_CONV_PAIRS \
  nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr
#endif

}  // namespace

extern const ConvIsaOps LOPPER_CONV_OPS_NAME;
const ConvIsaOps LOPPER_CONV_OPS_NAME = {
    LOPPER_CONV_OPS_LABEL,
    [](const ConvShape& s, bool depthwise) -> int64_t {
      using T = Wide;
      constexpr int NB = ConvTraits<T>::kNB;
      return depthwise ? dw_padded(s.c, T::W) * s.kh * s.kw
                       : conv_blocks(s, NB) * NB * s.kh * s.kw * s.c;
    },
    [](const float* w, const ConvShape& s, bool depthwise, float* packed) {
      if (depthwise)
        dw_pack(w, s, Wide::W, packed);
      else
        conv_pack(w, s, ConvTraits<Wide>::kNB, Wide::W, packed);
    },
    [](const ConvShape& s, bool depthwise) -> int64_t {
      if (!depthwise) return conv_tile_count<Wide>(s);
      return dw_plane<Wide>(s) ? s.n * dw_padded(s.c, Wide::W) / Wide::W
                               : s.n * s.oh * dw_chunks<Wide>(s);
    },
    [](const float* x, const float* packed, float* y, const float* residual, const ConvShape& s,
       bool depthwise, const Epilogue& e, int64_t t0, int64_t t1) {
      if (depthwise && dw_plane<Wide>(s))
        dw_planes<Wide>(x, packed, y, residual, s, e, t0, t1);
      else if (depthwise)
        dw_rows<Wide>(x, packed, y, residual, s, e, t0, t1);
      else if (conv_mr<Wide>(s) == ConvTraits<Wide>::kMR && s.c_stride > 1)
        conv_tiles<Wide, ConvTraits<Wide>::kMR, true>(x, packed, y, residual, s, e, t0, t1);
      else if (conv_mr<Wide>(s) == ConvTraits<Wide>::kMR)
        conv_tiles<Wide, ConvTraits<Wide>::kMR, false>(x, packed, y, residual, s, e, t0, t1);
      else if (s.c_stride > 1)
        conv_tiles<Wide, ConvTraits<Wide>::kMR - 1, true>(x, packed, y, residual, s, e, t0, t1);
      else
        conv_tiles<Wide, ConvTraits<Wide>::kMR - 1, false>(x, packed, y, residual, s, e, t0, t1);
    },
    Wide::W,
    ConvTraits<Wide>::kNV,
    [](const float* const* rows, const float* packed, float* yrow, const float* rrow,
       const ConvShape& s, const Epilogue& e, int64_t i0, int64_t i1, int64_t c0,
       int64_t c1) { dw_row<Wide>(rows, packed, yrow, rrow, with_strides(s), e, i0, i1, c0, c1); },
    [](const void* x, bool bf16, const ConvShape& s, int64_t t0, int64_t nt, float* v,
       int64_t ldv) {
      if (bf16)
        wino_input_tiles<Wide>(static_cast<const uint16_t*>(x), s, t0, nt, v, ldv);
      else
        wino_input_tiles<Wide>(static_cast<const float*>(x), s, t0, nt, v, ldv);
    },
    [](const float* m, int64_t ldm, const ConvShape& s, int64_t t0, int64_t nt, int64_t k0,
       int64_t k1, void* y, const void* residual, bool bf16, const Epilogue& e) {
      if (bf16)
        wino_output_tiles<Wide>(m, ldm, s, t0, nt, k0, k1, static_cast<uint16_t*>(y),
                                static_cast<const uint16_t*>(residual), e);
      else
        wino_output_tiles<Wide>(m, ldm, s, t0, nt, k0, k1, static_cast<float*>(y),
                                static_cast<const float*>(residual), e);
    },
    [](const float* v, int64_t ldv, const float* packed, int64_t per, int64_t groups, float* m,
       int64_t ldm, int64_t nt, int64_t gc, int64_t gk, int64_t q0, int64_t q1) {
      ConvShape s;
      s.w = s.ow = nt;
      if (conv_mr<Wide>(s) == ConvTraits<Wide>::kMR)
        wino_products_mr<Wide, ConvTraits<Wide>::kMR>(v, ldv, packed, per, groups, m, ldm, nt, gc,
                                                      gk, q0, q1);
      else
        wino_products_mr<Wide, ConvTraits<Wide>::kMR - 1>(v, ldv, packed, per, groups, m, ldm, nt,
                                                          gc, gk, q0, q1);
    },
    [](const float* x, float* y, const ConvShape& s, int64_t row0, int64_t row1) {
      max_pool_rows<Wide>(x, y, s, row0, row1);
    },
    [](const float* x, int64_t ldx, float* y, int64_t ldy, const float* scale, int64_t c,
       int64_t p0, int64_t p1,
       const Epilogue& e) { affine_pixels<Wide>(x, ldx, y, ldy, scale, c, p0, p1, e); },
    [](const float* a, int64_t lda, const float* b, int64_t ldb, float* y, int64_t c, int64_t p0,
       int64_t p1) { interleave_pixels<Wide>(a, lda, b, ldb, y, c, p0, p1); },
    [](int64_t g) { return g > 1 && g < Wide::W && Wide::W % g == 0 && g <= 8; },
    [](const ConvShape& s) { return narrow_vectors(s, Wide::W) * s.kh * s.kw * s.c * Wide::W; },
    [](const float* w, const ConvShape& s, float* packed) {
      narrow_pack(w, s, s.c, Wide::W, packed);
    },
    [](const ConvShape& s) { return s.n * s.oh * narrow_vectors(s, Wide::W); },
    [](const float* x, const float* packed, float* y, const float* residual, const ConvShape& s,
       int64_t g, const Epilogue& e, int64_t t0,
       int64_t t1) { narrow_tiles<Wide>(x, packed, y, residual, s, g, e, t0, t1); },
    [](const float* const* rows, const float* packed, float* yrow, const float* rrow,
       const ConvShape& s, int64_t g, const Epilogue& e, int64_t i0, int64_t i1, int64_t v0,
       int64_t v1) {
      narrow_vectors_of_row<Wide>(rows, packed, yrow, rrow, with_strides(s), g, e, i0, i1, v0, v1);
    },
    [](int64_t k) { return Wide::W >= 8 ? planar_group<Wide>(k) : 0; },
    planar_pack,
    [](const float* x, const float* packed, int kg, float* y, const ConvShape& s, const Epilogue& e,
       int64_t r0, int64_t r1) {
      if constexpr (Wide::W >= 8) conv_planar_rows<Wide>(x, packed, kg, y, s, e, r0, r1);
    },
    LOPPER_CONV_PAIRS};

}  // namespace lopper::kernels::cpu
