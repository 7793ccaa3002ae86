// The per-ISA entry points of lopper's NHWC kernels: dense and depthwise convolution, max pooling,
// per-channel affine (internal). Each of
// conv_scalar.cpp, conv_avx2.cpp and conv_avx512.cpp compiles conv_impl.h with its own target flags
// and exports one table of these; conv.cpp picks the table of the active ISA.
// NOTE: plain C++ only across this boundary, as for sparse_isa.h.
#pragma once

#include <cstdint>

#include "kernels/cpu/epilogue.h"

namespace lopper::kernels::cpu {

/// A 2-D convolution of NHWC data:
///   y[n, oy, ox, k] = act(bias[k] + residual[n, oy, ox, k] +
///                         sum x[n, oy*sh - ph + i*dh, ox*sw - pw + j*dw, c] * w[k, c, i, j])
/// over the taps (i, j) and the input channels c (dense), or c = k alone (depthwise: one input
/// channel per output, c == k). Pixels are `x_stride` / `y_stride` / `r_stride` floats apart (at
/// least the channel count; 0 means exactly it), so a producer can write into a slice of a wider
/// buffer (Concat in place).
struct ConvShape {
  int64_t n = 1, h = 1, w = 1, c = 1;  // input, NHWC
  int64_t oh = 1, ow = 1, k = 1;       // output rows, columns and channels
  int64_t kh = 1, kw = 1, sh = 1, sw = 1, ph = 0, pw = 0, dh = 1, dw = 1;
  int64_t x_stride = 0, y_stride = 0, r_stride = 0;
  /// Floats between a pixel's input channels: 1 (channels-last), or the plane's size for planar
  /// input (NCHW, one image: x_stride 1), which the dense kernel reads (a network's first layer).
  int64_t c_stride = 1;
};

/// The most kernel rows a depthwise convolution of these kernels has (the taps rows of an output
/// row are located in an array of this size).
constexpr int64_t kDwMaxTaps = 64;

/// The taps [begin, end) of a window that fall inside an axis of `size` inputs: tap t reads input
/// start + t * dil (start: the output's index times the stride, less the padding).
struct Taps {
  int64_t begin, end;
};
inline Taps taps_inside(int64_t start, int64_t taps, int64_t dil, int64_t size) {
  int64_t b = 0, e = taps;
  while (b < taps && start + b * dil < 0) ++b;
  while (e > b && start + (e - 1) * dil >= size) --e;
  return {b, e};
}

/// The order of a dense convolution's tiles: pixel-major (each group of pixels through every
/// block of output channels while its input is in L1) when the weight is small enough to stay in
/// L2 beside the activations, else block-major (each block's weights reused by every pixel).
inline bool conv_pixel_major(const ConvShape& s) {
  return s.kh * s.kw * s.c * s.k * int64_t(sizeof(float)) <= (256 << 10);
}

struct ConvIsaOps {
  const char* name;
  /// Floats of the packed weight w [k][c or 1][kh][kw] (ONNX's OIHW).
  int64_t (*packed_size)(const ConvShape& s, bool depthwise);
  void (*pack)(const float* w, const ConvShape& s, bool depthwise, float* packed);
  /// The independent pieces of work of one convolution (the threads split them). Dense: blocks of
  /// `block_vectors` vectors of `width` output channels (the last block fewer) x groups of
  /// pixels, in the order conv_pixel_major gives; a tile costs as many vectors as its block has.
  /// Depthwise: output rows x chunks of a few vectors of channels, or on small maps under a 5x5
  /// kernel, images x vectors of channels.
  int64_t (*tiles)(const ConvShape& s, bool depthwise);
  /// Computes tiles [t0, t1) of y (residual: null or r_stride floats per pixel), any padding.
  void (*run)(const float* x, const float* packed, float* y, const float* residual,
              const ConvShape& s, bool depthwise, const Epilogue& e, int64_t t0, int64_t t1);
  int width, block_vectors;  // floats per vector; vectors per dense block (see tiles)
  /// One output row of a depthwise convolution, channels [c0, c1) (whole vectors; c1 at most the
  /// channels rounded up to `width`): rows[i] is the input row read by kernel row i, for the rows
  /// [i0, i1) inside the input (the others are not read); yrow and rrow (null: none) the output
  /// row and its residual. s.n, s.h, s.oh and s.ph are not read.
  void (*dw_row)(const float* const* rows, const float* packed, float* yrow, const float* rrow,
                 const ConvShape& s, const Epilogue& e, int64_t i0, int64_t i1, int64_t c0,
                 int64_t c1);
  /// Winograd F(4x4, 3x3) (kernels/cpu/winograd.h), tiles [t0, t0 + nt) of the 4x4 output tiles
  /// of s (3x3, stride 1, no dilation; numbered over images, tile rows and tile columns). The
  /// input transform writes the tiles' 6x6 transformed windows of input channels [0, s.c) (the
  /// input read unpadded, zeros outside): v[pos][t][c], pos in [0, 36), tiles ldv floats apart,
  /// positions nt * ldv (ldv >= s.c rounded up to the vector width; the channels past s.c zero).
  /// x is float32, or bfloat16 (uint16 bits, widened as read) where `bf16`.
  void (*wino_input)(const void* x, bool bf16, const ConvShape& s, int64_t t0, int64_t nt, float* v,
                     int64_t ldv);
  /// The output transform: y's 4x4 tiles [t0, t0 + nt), channels [k0, k1), from the products
  /// m[pos][t][k] (tiles ldm floats apart, positions nt * ldm), plus bias, residual (null or
  /// r_stride values per pixel) and activation; a tile's pixels past the map's edge not stored.
  /// y and the residual float32, or bfloat16 where `bf16` (y rounded once, after the activation).
  void (*wino_output)(const float* m, int64_t ldm, const ConvShape& s, int64_t t0, int64_t nt,
                      int64_t k0, int64_t k1, void* y, const void* residual, bool bf16,
                      const Epilogue& e);
  /// The products of a grouped Winograd convolution for a block of nt tiles, groups [q0, q1):
  /// m[pos][t][q * gk + k] = sum_c v[pos][t][q * gc + c] * U[pos][q][c][k] for the 36 positions,
  /// U[pos][q] packed by `pack` as a 1x1 weight of gc -> gk channels, `per` floats each, in
  /// [pos][groups] order; v's and m's tiles ldv and ldm floats apart, their positions nt times
  /// that. One call for what would be 36 x groups calls of `run` (RegNet's 16 channels a group:
  /// a product of 8 tiles is 128 multiply-adds a vector, as few as a call's own overheads).
  void (*wino_products)(const float* v, int64_t ldv, const float* packed, int64_t per,
                        int64_t groups, float* m, int64_t ldm, int64_t nt, int64_t gc, int64_t gk,
                        int64_t q0, int64_t q1);
  /// Max pooling (s.k == s.c; padding never wins; NaN propagates) of output rows [row0, row1).
  void (*max_pool)(const float* x, float* y, const ConvShape& s, int64_t row0, int64_t row1);
  /// y = act(x * scale[k] + e.bias[k]) for the c channels k of pixels [p0, p1), x's pixels ldx
  /// floats apart and y's ldy (inference BatchNormalization and its activation in one pass, of one
  /// tensor or of the inputs of a channel concatenation into their slices of its output).
  void (*channel_affine)(const float* x, int64_t ldx, float* y, int64_t ldy, const float* scale,
                         int64_t c, int64_t p0, int64_t p1, const Epilogue& e);
  /// y[p * 2c + 2j] = a[p * lda + j], y[p * 2c + 2j + 1] = b[p * ldb + j] for the c channels j
  /// of pixels [p0, p1): two tensors' channels interleaved (the channel shuffle of two groups).
  void (*interleave)(const float* a, int64_t lda, const float* b, int64_t ldb, float* y, int64_t c,
                     int64_t p0, int64_t p1);
  /// Narrow groups: a grouped convolution of g channels a group in and out, with whole groups in
  /// each vector of output channels (the input vector permuted once per input channel of a
  /// group). Whether this table runs groups of g (g > 1, dividing the vector width, at most 8).
  bool (*narrow_takes)(int64_t g);
  /// Floats of the packed weight of s (s.c: g, the channels a group; s.k: all output channels).
  int64_t (*narrow_packed_size)(const ConvShape& s);
  /// w [k][g][kh][kw] (ONNX's OIHW of the grouped convolution) -> packed, for s as above.
  void (*narrow_pack)(const float* w, const ConvShape& s, float* packed);
  /// Its tiles: output rows x vectors of output channels.
  int64_t (*narrow_tiles)(const ConvShape& s);
  /// Tiles [t0, t1) of y, x and y with s.k channels a pixel (s.x_stride, s.y_stride and s.r_stride
  /// as for run), g channels a group.
  void (*narrow_run)(const float* x, const float* packed, float* y, const float* residual,
                     const ConvShape& s, int64_t g, const Epilogue& e, int64_t t0, int64_t t1);
  /// One output row of it, vectors [v0, v1) of output channels: rows[i] the input row of kernel
  /// row i for i in [i0, i1), yrow and rrow (null: none) the output row and its residual, as for
  /// dw_row (s.n, s.h, s.oh and s.ph are not read).
  void (*narrow_row)(const float* const* rows, const float* packed, float* yrow, const float* rrow,
                     const ConvShape& s, int64_t g, const Epilogue& e, int64_t i0, int64_t i1,
                     int64_t v0, int64_t v1);
  /// A dense convolution of a planar input (a network's first layer) vectorised over output
  /// pixels: the output channels a pass for s.k of them, 0 where this ISA has no such kernel.
  int (*planar_group)(int64_t k);  /// w [k][c][kh][kw] (ONNX's OIHW) -> packed, kg channels a pass:
                                   /// (k rounded up to kg) x c x kh
  /// x kw floats.
  void (*planar_pack)(const float* w, const ConvShape& s, int kg, float* packed);
  /// Output rows [r0, r1) of its s.n * s.oh rows: x is s.n images of s.c planes (s.c_stride floats
  /// each, rows s.w floats), y channels-last (s.y_stride floats a pixel); s.sw 1 or 2.
  void (*planar_rows)(const float* x, const float* packed, int kg, float* y, const ConvShape& s,
                      const Epilogue& e, int64_t r0, int64_t r1);
  /// A dense convolution (s.c even; any kernel, stride, padding and dilation) of bfloat16 pixels
  /// (uint16 bits, s.x_stride values apart) by the CPU's bfloat16 dot product: the weight w
  /// [k][c][kh][kw] packed by pack_pairs in pairs of input channels rounded to bfloat16
  /// (pairs_packed_size words), tiles as run's (tiles(s, false)). y float32, or, where y is null,
  /// bfloat16 into y16 (rounded once after the residual and the activation, as to_bf16 rounds); the
  /// residual (or none) float32 or, in r16, bfloat16.
  /// Null where the table's ISA has none; call run_pairs only where bf16_dot_supported().
  int64_t (*pairs_packed_size)(const ConvShape& s);
  void (*pack_pairs)(const float* w, const ConvShape& s, uint32_t* packed);
  void (*run_pairs)(const uint16_t* x, const uint32_t* packed, float* y, uint16_t* y16,
                    const float* residual, const uint16_t* r16, const ConvShape& s,
                    const Epilogue& e, int64_t t0, int64_t t1);
  /// The narrow-group row (narrow_row) on bf16 rows by the bfloat16 dot product, groups of 2, 4
  /// or 8 channels: the weight w [k][g][kh][kw] (s.c: g, s.k: all channels) packed in bf16 pairs
  /// of a group's input channels (narrow_pairs_size words); the output row bfloat16, rounded once
  /// after the bias and activation; no residual. Null where run_pairs is.
  int64_t (*narrow_pairs_size)(const ConvShape& s);
  void (*narrow_pack_pairs)(const float* w, const ConvShape& s, uint32_t* packed);
  void (*narrow_row_pairs)(const uint16_t* const* rows, const uint32_t* packed, uint16_t* yrow,
                           const ConvShape& s, int64_t g, const Epilogue& e, int64_t i0, int64_t i1,
                           int64_t v0, int64_t v1);
  /// A planar first layer (planar_rows) of bfloat16 planes by the bfloat16 dot product, a kernel
  /// row's taps in pairs: the weight w [k][c][kh][kw] packed by planar_pack_pairs
  /// (planar_pairs_size words, rounded to bf16); output rows [r0, r1) of y16, bf16 channels-last,
  /// rounded once after the bias and activation; any stride, padding and kernel, s.dw 1, no
  /// residual. Null where run_pairs is.
  int64_t (*planar_pairs_size)(const ConvShape& s);
  void (*planar_pack_pairs)(const float* w, const ConvShape& s, uint32_t* packed);
  void (*planar_pairs_rows)(const uint16_t* x, const uint32_t* packed, uint16_t* y16,
                            const ConvShape& s, const Epilogue& e, int64_t r0, int64_t r1);
};

extern const ConvIsaOps kConvScalarOps;
extern const ConvIsaOps kConvAvx2Ops;
extern const ConvIsaOps kConvAvx512Ops;

}  // namespace lopper::kernels::cpu
