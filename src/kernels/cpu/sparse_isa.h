// The per-ISA entry points of the sparse kernels (internal). Each of sparse_scalar.cpp,
// sparse_avx2.cpp and sparse_avx512.cpp compiles sparse_impl.h with its own target flags and
// exports one table of these; sparse.cpp picks the table at run time from the CPU's flags.
// NOTE: plain C++ only (no ATen, no standard-library templates across this boundary): a function
// compiled with AVX-512 flags and emitted as a weak symbol could otherwise be picked by the linker
// for every caller and fault on a CPU without AVX-512.
#pragma once

#include <cstdint>

#include "kernels/cpu/epilogue.h"

namespace lopper::kernels::cpu {

/// A packed sparse weight W [n, k] in block-CSR: block rows of `r` outputs, blocks of r x c
/// weights starting at input `col[j]` (a multiple of c), values of block j at val[j*r*c], stored
/// input-major ([c][r]). r = c = 1 is plain CSR.
struct SpView {
  int r = 1, c = 1;
  int64_t n = 0, k = 0;
  const int32_t* ptr = nullptr;  // [n/r rounded up + 1] offsets into col (in blocks)
  const int32_t* col = nullptr;
  const float* val = nullptr;
};

/// A packed sparse weight's block rows as pairs of inputs, for the bfloat16 dot product (which
/// sums the products of two inputs per lane): each block row's inputs in order (a block of c
/// columns gives c of them), taken two at a time. Pair j reads inputs idx[2j] and idx[2j + 1]
/// and holds, for each output i of its block row, both bfloat16 weights in val[j * r + i] (the
/// first in the low 16 bits). An odd count's last input is paired with input k, weight 0: xt has a
/// row k of zeros (a real input times 0 would turn an infinite input's Inf into NaN).
struct PairView {
  int r = 1;
  int64_t n = 0, k = 0;
  const int32_t* ptr = nullptr;   // [n/r rounded up + 1] offsets into idx (in pairs)
  const int32_t* idx = nullptr;   // [pairs][2]
  const uint32_t* val = nullptr;  // [pairs][r]
};

/// A weight W [n, k] packed by bitmask: per output row, one 16-bit mask per 16 inputs (bit j of
/// chunk c: input 16c + j is kept) and the kept values packed in order, float32 or bfloat16 (the
/// high half of a float32). Rows are stored in tiles of `tile` rows (1 or 4; the last tile padded
/// with empty rows): tile t's masks are mask[(t * chunks + c) * tile + i] for its row t * tile + i,
/// and its values start off[t] values into val, chunk by chunk and, within a chunk, row by row, so
/// that the rows of a tile are read as one stream. A tile of 1 is a row per tile (off[r]). val is
/// readable 32 values past its end (the kernels load whole vectors). `fixed` > 0: every full chunk
/// of every row holds exactly that many values (2:4 holds 8), so with a row per tile, row r's chunk
/// c starts at off[r] + c * fixed. `pairs`: every 4 inputs within k hold exactly 2 (2:4), so each
/// row holds half of a chunk's inputs: row i of tile t has chunk c's values at off[t] + 8 * tile *
/// c + 8 * i (in a last chunk of q inputs: q / 2 * i), those of inputs 8h..8h+7 4h further on.
/// The last tile's padding rows of a fixed or pairs weight repeat the last row's masks (values 0).
/// Tiles of 16 rows (bfloat16) are panels with masks of their own (pmask, below).
struct MaskView {
  int64_t n = 0, k = 0, chunks = 0;  // chunks = ceil(k / 16)
  int tile = 1;                      // rows per tile: 1, 4, or 16 (pmask)
  const uint16_t* mask = nullptr;    // [ceil(n / tile)][chunks][tile]
  const int64_t* off = nullptr;      // [ceil(n / tile) + 1]
  const void* val = nullptr;         // float32, or uint16 bfloat16 when bf16
  bool bf16 = false;
  int fixed = 0;
  bool pairs = false;
  /// Tiles of 16 rows (panels; mask is null): per pair of inputs s one 32-bit mask pmask[t *
  /// ceil(k / 2) + s] and the tile's kept values step by step in the mask's bit order from off[t].
  /// bfloat16: bit 2i + j, row 16t + i keeps input 2s + j, so that a step's values expand to the
  /// 16 words of two bf16 one vdpbf16ps multiplies; float32: bit 16j + i, a vector of 16 rows'
  /// values per input. With `pairs` (2:4),
  /// per 4 inputs g instead: the 64-bit word pmask[2 (t * k / 4 + g)] (low half first) holds the
  /// pattern of each row (kPairOf's index, 4 bits; row i's at bit 32 (i % 2) + 4 (i / 2)), and
  /// the 32 values from off[t] + 32 g are the two kept weights of row i at 2i, 2i + 1.
  const uint32_t* pmask = nullptr;
};

/// The 6 ways 2 of 4 inputs are kept (2:4), by index: the two inputs in order.
constexpr int kPairOf[6][2] = {{0, 1}, {0, 2}, {0, 3}, {1, 2}, {1, 3}, {2, 3}};

struct SparseIsaOps {
  const char* name;
  /// yt[n - y_row0][0, ncols) = act(W[n, :] . xt[:, 0, ncols) + bias) for the outputs of block
  /// rows [br0, br1). xt has a row per input (rows up to k rounded up to c), ldx floats apart;
  /// vectorised along the columns (batch rows or pixels).
  void (*cols)(const SpView& w, int64_t br0, int64_t br1, const float* xt, int64_t ldx,
               int64_t ncols, float* yt, int64_t ldy, int64_t y_row0, const Epilogue& e);
  /// y[m][n] = act(x[m, :] . W[n, :] + bias) for m < rows and the outputs of block rows
  /// [br0, br1); x and y row-major. Vectorised along the r outputs of a block (r = 4 or 8, c = 1).
  void (*rows)(const SpView& w, int64_t br0, int64_t br1, const float* x, int64_t ldx, int64_t rows,
               float* y, int64_t ldy, const Epilogue& e);
  /// As rows, for plain CSR: vectorised along each output's nonzeros, gathering x.
  void (*gather)(const SpView& w, int64_t n0, int64_t n1, const float* x, int64_t ldx, int64_t rows,
                 float* y, int64_t ldy, const Epilogue& e);
  /// As gather, with scalar loads and four partial sums per output (no vector gathers, which are
  /// slow on some CPUs).
  void (*dot)(const SpView& w, int64_t n0, int64_t n1, const float* x, int64_t ldx, int64_t rows,
              float* y, int64_t ldy, const Epilogue& e);
  /// y[m][r] = act(x[m, :] . W[r, :] + bias[r]) for m < rows (at most 16) and the outputs
  /// [r0, r1) of a bitmask-packed W (r0 and r1 whole tiles, or r1 = n); x (float32, rows ldx
  /// apart) is read only where W has a value. The AVX-512 table takes tiles of 1 row only.
  void (*masked)(const MaskView& w, int64_t r0, int64_t r1, const float* x, int64_t ldx,
                 int64_t rows, float* y, int64_t ldy, const Epilogue& e);
  /// As masked, for bfloat16 weights and bfloat16 x (uint16 bits), products summed in float32 by
  /// the CPU's bfloat16 dot product (AVX512_BF16 with AVX512_VBMI2's 16-bit expand); null where
  /// the table's ISA has none. Call it only where bf16_dot_supported().
  void (*masked_bf16)(const MaskView& w, int64_t r0, int64_t r1, const uint16_t* x, int64_t ldx,
                      int64_t rows, float* y, int64_t ldy, const Epilogue& e);
  /// dst[j][i] = src[i][j] for i < rows, j < cols.
  void (*transpose)(const float* src, int64_t rows, int64_t cols, int64_t lds, float* dst,
                    int64_t ldd);
  /// As cols, for bfloat16 xt (uint16 bits; ncols a multiple of 32; k + 1 rows, the last zero)
  /// and a weight in pairs, two products per lane summed in float32 by vdpbf16ps; yt bfloat16,
  /// rounded as to_bf16 rounds (ties to even, a subnormal kept). With transpose16, null where the
  /// table's ISA has none. Call them only where bf16_dot_supported().
  void (*cols_bf16)(const PairView& w, int64_t br0, int64_t br1, const uint16_t* xt, int64_t ldx,
                    int64_t ncols, uint16_t* yt, int64_t ldy, int64_t y_row0, const Epilogue& e);
  /// dst[j][i] = src[i][j] for i < rows, j < cols, of 16-bit values.
  void (*transpose16)(const uint16_t* src, int64_t rows, int64_t cols, int64_t lds, uint16_t* dst,
                      int64_t ldd);
  /// The outputs of a dense_panels panel: the table's vector width.
  int64_t panel_width;
  /// y[m][r] = act(x[m, :k] . w[r, :k] + bias[r]) for m < rows and the outputs r < n of panels
  /// [q0, q1) of a dense w packed in panels ([n / panel_width][k][panel_width], DenseGemv), read
  /// once for up to 4 rows of x (x and y row-major).
  void (*dense_panels)(const float* p, int64_t k, int64_t q0, int64_t q1, const float* x,
                       int64_t ldx, int64_t rows, float* y, int64_t ldy, int64_t n,
                       const Epilogue& e);
  /// As dense_panels, for a bfloat16 w packed in pairs of inputs ([n / 16][ceil(k / 2)][16]
  /// 32-bit words, each the bf16 weights of inputs 2j and 2j + 1 of one output, the second zero
  /// past an odd k) and bfloat16 x and y (uint16 bits; y rounded as to_bf16 rounds), products
  /// summed in float32 by vdpbf16ps. Null where the table's ISA has none; call it only where
  /// bf16_dot_supported().
  void (*dense_panels_bf16)(const uint32_t* p, int64_t k, int64_t q0, int64_t q1, const uint16_t* x,
                            int64_t ldx, int64_t rows, uint16_t* y, int64_t ldy, int64_t n,
                            const Epilogue& e);
  /// y[m][r] = act(x[m, :k] . W[r, :k] + bias[r]) for m < rows and the rows of tiles [t0, t1) of
  /// a W packed in panels of 16 rows (MaskView::pmask), float32 x and y, by a plain loop (every
  /// ISA).
  void (*masked_panels)(const MaskView& w, int64_t t0, int64_t t1, const float* x, int64_t ldx,
                        int64_t rows, float* y, int64_t ldy, const Epilogue& e);
  /// As masked_panels, for a float32 W, vectorised (each panel read once for up to 4 rows of x).
  /// Null where the table's ISA has none.
  void (*masked_panels_f32)(const MaskView& w, int64_t t0, int64_t t1, const float* x, int64_t ldx,
                            int64_t rows, float* y, int64_t ldy, const Epilogue& e);
  /// As masked_panels, for bfloat16 x and y (uint16 bits; y
  /// rounded as to_bf16 rounds), each panel read once for up to 4 rows of x, products summed in
  /// float32 by vdpbf16ps. Null where the table's ISA has none; call it only where
  /// bf16_dot_supported().
  void (*masked_panels_bf16)(const MaskView& w, int64_t t0, int64_t t1, const uint16_t* x,
                             int64_t ldx, int64_t rows, uint16_t* y, int64_t ldy,
                             const Epilogue& e);
};

extern const SparseIsaOps kScalarOps;
extern const SparseIsaOps kAvx2Ops;
extern const SparseIsaOps kAvx512Ops;

}  // namespace lopper::kernels::cpu
