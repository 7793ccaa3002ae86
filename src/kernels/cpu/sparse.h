// Sparse weight x dense activation on the CPU (internal): a weight packed once in CSR or block-CSR,
// run by one of three kernels on the widest ISA the CPU has (AVX-512, AVX2 + FMA, or plain C++),
// multi-threaded on ATen's pool, with the bias and a simple activation fused.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/cpu/sparse_isa.h"

namespace lopper::kernels::cpu {

enum class Isa { kScalar, kAvx2, kAvx512 };

/// Of one table of kernels per instruction set, the one for `isa`.
template <typename Ops>
const Ops& for_isa(Isa isa, const Ops& avx512, const Ops& avx2, const Ops& scalar) {
  return isa == Isa::kAvx512 ? avx512 : isa == Isa::kAvx2 ? avx2 : scalar;
}
/// The ISA the kernels run with: the widest this CPU supports, or the one LOPPER_ISA names
/// (scalar | avx2 | avx512). Throws lopper::Error for an unknown name or one the CPU lacks.
Isa active_isa();
bool isa_supported(Isa isa);
/// Whether the CPU has the bfloat16 dot product the bitmask kernel uses for bfloat16 weights and
/// activations (AVX512_BF16 and AVX512_VBMI2; AVX512_DQ, which every such CPU has, for the
/// rounding check of the convolutions' bf16 outputs), and the active ISA is AVX-512.
bool bf16_dot_supported(Isa isa);
const char* isa_name(Isa isa);

/// A block of r consecutive outputs x c consecutive inputs. The kernels take 1x1 (CSR), 1x4, 4x1
/// and 8x1.
struct BlockShape {
  int r = 1, c = 1;
  std::string str() const { return std::to_string(r) + "x" + std::to_string(c); }
};
const std::vector<BlockShape>& kernel_block_shapes();

/// cols: along the batch rows (or pixels), the x tile transposed in cache; any block shape.
/// rows: along the r outputs of a block (4x1, 8x1), x read as it is.
/// gather: along each output's nonzeros, x gathered (CSR only).
/// dot: each output's nonzeros one by one, four partial sums (CSR only).
enum class Algo { kCols, kRows, kGather, kDot };
const char* algo_name(Algo a);

struct Activation {
  enum Kind {
    kNone,
    kRelu,
    kClip,
    kLeaky,
    kHardSwish,
    kHardSigmoid,
    kSigmoid,
    kSilu,
    kGelu
  } kind = kNone;
  float lo = 0, hi = 0, alpha = 0, beta = 0;  // as in Epilogue
};
/// The kernels' output stage for `a` and a bias of the outputs (or null).
Epilogue to_epilogue(const Activation& a, const float* bias);

/// The number of values of `w` that are not zero (neither +0 nor -0), as at::count_nonzero: for a
/// contiguous float32 or bfloat16 CPU tensor by the threads, a word at a time (ATen's takes ~1 s
/// per GB, counted twice per layer at load), otherwise by ATen.
int64_t count_nonzero(const at::Tensor& w);

/// Stored values when w [n, k] is packed in blocks of `b` (every block with a nonzero).
int64_t stored_values(const at::Tensor& w, BlockShape b);

class SparseWeight {
 public:
  /// Packs a float32 CPU weight w [n, k] (rows are outputs) and its bias [n] (optional); with
  /// `bf16_pairs`, also its blocks as pairs of inputs in bfloat16 for linear_bf16 (blocks of 1x1,
  /// 1x4, 4x1 or 8x1; values rounded to bfloat16, exact for a weight that was bfloat16).
  SparseWeight(const at::Tensor& w, BlockShape b, const at::Tensor& bias = {},
               bool bf16_pairs = false);

  int64_t n() const { return n_; }
  int64_t k() const { return k_; }
  BlockShape block() const { return block_; }
  int64_t nonzeros() const { return nonzeros_; }
  int64_t stored() const { return static_cast<int64_t>(val_.size()); }
  bool supports(Algo a) const;

  /// y [m, n] = act(x [m, k] . w^T + bias), x 2-D float32 with contiguous rows.
  at::Tensor linear(const at::Tensor& x, Algo algo, Activation act, Isa isa) const;
  /// The same into y [m, n] (contiguous rows, any row stride).
  void linear_into(const at::Tensor& x, at::Tensor& y, Algo algo, Activation act, Isa isa) const;
  /// y [b, n, l] = act(w . x[b] + bias) for x [b, k, l] (an NCHW activation or im2col columns).
  at::Tensor cols_batched(const at::Tensor& x, Activation act, Isa isa) const;
  /// Whether linear_bf16 runs: packed with bf16_pairs and bf16_dot_supported(isa).
  bool runs_bf16(Isa isa) const;
  /// y [m, n] (bfloat16) = act(x [m, k] . w^T + bias) for bfloat16 x, by the cols kernel on the
  /// CPU's bfloat16 dot product (products summed in float32, y rounded once). Needs runs_bf16.
  at::Tensor linear_bf16(const at::Tensor& x, Activation act, Isa isa) const;

 private:
  SpView view() const;
  PairView pair_view() const;
  void pack_pairs();
  /// Block-row boundaries splitting the stored blocks into `parts` near-equal shares.
  std::vector<int64_t> split_rows(int64_t parts) const;

  int64_t n_ = 0, k_ = 0, nonzeros_ = 0;
  BlockShape block_;
  std::vector<int32_t> ptr_, col_;
  std::vector<float> val_, bias_;  // bias_ padded with zeros to whole blocks (empty: no bias)
  std::vector<int32_t> pair_ptr_, pair_idx_;  // PairView (empty: not packed)
  std::vector<uint32_t> pair_val_;
};

/// A weight packed by bitmask for a few rows of x at a time (the decode regime): per output row one
/// bit per weight and the kept values, float32 or bfloat16 (as the weight is given), so that at
/// 50% a float32 weight moves 2.125 bytes per weight instead of 4 (CSR: 4). Rows whose every
/// chunk of 16 holds 8 values (2:4, 4:8) are addressed without counting. Rows are stored in tiles
/// of 4 (one stream of values for the 4 rows a kernel works at once: the CPU's prefetchers keep up
/// with it where 4 short streams leave DRAM's bandwidth unused), except for the AVX-512 kernels,
/// which take a row per tile. A weight can be packed in panels of 16 rows (tile 16), in the order
/// of DenseGemv's panels with the zeros left out: per pair of inputs a 32-bit mask and the kept
/// values, expanded to what one vdpbf16ps (bfloat16) or two FMAs (float32) multiply; a bfloat16
/// 2:4 weight in panels holds per 4 inputs each row's pattern and its two values, no mask.
class MaskedWeight {
 public:
  /// Packs w [n, k] (float32 or bfloat16, CPU; rows are outputs) and its bias [n] (optional) in
  /// tiles of `tile` rows (1, 4, or 16 for panels; 0: what `isa` takes best: panels for a
  /// bfloat16 2:4 weight where takes_panels(isa, true), else 4 unless it is AVX-512).
  MaskedWeight(const at::Tensor& w, const at::Tensor& bias = {}, int tile = 0,
               Isa isa = active_isa());

  int64_t n() const { return view_.n; }
  int64_t k() const { return view_.k; }
  int64_t nonzeros() const { return nonzeros_; }
  bool bf16() const { return view_.bf16; }
  bool fixed() const { return view_.fixed > 0; }
  /// Every 4 inputs keep exactly 2 (2:4).
  bool pairs() const { return view_.pairs; }
  int tile() const { return view_.tile; }
  /// Whether `isa` has a vectorised kernel for panels (tile 16): bfloat16 ones on the CPU's
  /// bfloat16 dot product, float32 ones (AVX-512).
  static bool takes_panels(Isa isa, bool bf16);
  /// Whether `isa`'s kernels take this packing (AVX-512: a row per tile or panels; panels run
  /// anywhere, on the bfloat16 dot product where the CPU has it, else by a plain loop).
  bool runs_on(Isa isa) const { return view_.tile != 4 || isa != Isa::kAvx512; }
  /// What a product reads of the weight: masks, offsets and values.
  int64_t bytes() const;

  /// y [m, n] = act(x [m, k] . w^T + bias) for x float32 or bfloat16, y of x's type: products
  /// summed in float32 (bfloat16 weights and x: by the CPU's bfloat16 dot product where it has one,
  /// else x widened to float32 first).
  at::Tensor linear(const at::Tensor& x, Activation act, Isa isa) const;

 private:
  MaskView view_;
  int64_t nonzeros_ = 0;
  std::vector<uint16_t> mask_;
  std::vector<uint32_t> pmask_;  // tile 16: the panels' masks
  std::vector<int64_t> off_;
  std::vector<float> val_;       // float32 values (+32 readable past the end)
  std::vector<uint16_t> val16_;  // bfloat16 values (+32)
  std::vector<float> bias_;

  /// Row boundaries (whole tiles) splitting the outputs into `parts` of near-equal work.
  std::vector<int64_t> split_rows(int64_t parts) const;
  /// Packs the panels (tile 16) of a bfloat16 weight (w16) or a float32 one (w32).
  void pack_panels(const uint32_t* w32, const uint16_t* w16);
  /// y for panels (tile 16): bfloat16 on the bfloat16 dot product where `isa` has it and x is
  /// bfloat16, float32 on its AVX-512 kernel, else by a plain loop summing in float32.
  at::Tensor linear_panels(const at::Tensor& x, Activation act, Isa isa) const;
};

/// A dense float32 weight [n, k] for products of a few rows of x (a classifier at batch 1, a
/// decoded token), lopper's GEMV: packed once in panels of the ISA's vector width of outputs
/// ([n / W][k][W], the last panel's missing outputs zero), each read once for up to 4 rows of x as
/// one run of memory, the panels split between the threads.
/// NOTE: against four rows of w [n, k] read side by side (four streams, each prefetched 2 KB
/// ahead), the one stream took alexnet (its three classifier layers: 234 MB of weights from
/// memory) to 0.94x and mobilenet_v3_small to 0.93x the time, batch 1, 2 threads.
class DenseGemv {
 public:
  /// w [n, k] float32, or bfloat16 where takes_bf16(isa): then packed in pairs of inputs, each
  /// 32-bit word the two bf16 weights one vdpbf16ps multiplies ([n / 16][ceil(k / 2)][16]).
  DenseGemv(const at::Tensor& w, Isa isa);
  /// Whether `isa` runs a bfloat16 weight (the CPU's bfloat16 dot product, bf16_dot_supported).
  static bool takes_bf16(Isa isa);
  /// y [m, n] = act(x [m, k] . w^T + bias): x of the weight's type (rows strided or not), y of
  /// x's (bf16: sums in float32, rounded once), bias [n] float32, of the weight's type or
  /// undefined; on the ISA the weight was packed for.
  at::Tensor linear(const at::Tensor& x, const at::Tensor& bias, Activation act) const;

 private:
  Isa isa_;
  bool bf16_ = false;
  int64_t n_, k_;
  at::Tensor panels_;  // [n / W][k][W] float32, or [n / 16][ceil(k / 2)][16] int32 (bf16 pairs)
};

/// x in the standard (contiguous) layout. A channels-last 4-D float32 tensor (what lopper's
/// convolutions write) is copied by cache-blocked transposes of 64 pixels at a time, split between
/// the threads; ATen's strided copy reads it one channel stride at a time. Any other tensor:
/// x.contiguous().
at::Tensor standard_layout(const at::Tensor& x, Isa isa = active_isa());

/// x channels-last (what lopper's convolutions read): an image of a few planes, float32 or bf16, by
/// few_channels_last (bf16.h); a 4-D float32 CPU tensor in the standard layout by the same
/// transposes (an image's c rows of 64 pixels at a time, out as 64 pixels of c channels); any
/// other tensor: x.contiguous(ChannelsLast).
at::Tensor channels_last_layout(const at::Tensor& x, Isa isa = active_isa());
/// A convolution's residual for its output `y`: of y's type (float32, or bfloat16 for a kernel
/// that writes bf16 rows), channels-last; undefined when `residual` is. Throws lopper::Error when
/// its shape is not y's.
at::Tensor residual_for(const at::Tensor& residual, const at::Tensor& y);

}  // namespace lopper::kernels::cpu
