// The per-ISA entry points of lopper's row-wise kernels (internal): each of rows_scalar.cpp,
// rows_avx2.cpp and rows_avx512.cpp compiles rows_impl.h with its own target flags and exports one
// table of these; rows.cpp picks the table of the active ISA.
// NOTE: plain C++ only across this boundary, as for sparse_isa.h.
#pragma once

#include <cstdint>

namespace lopper::kernels::cpu {

/// One attention, y[h] = softmax(scale * q[h] kt[h]) v[h] for heads h: q [sq, d], kt [d, sk],
/// v [sk, dv] of each head at element strides (any; float32, or bfloat16's bits when bf16), y
/// [sq, dv] float32 with rows y_rs apart.
struct AttnView {
  const void *q = nullptr, *kt = nullptr, *v = nullptr;
  float* y = nullptr;
  // attention_dot: y in bfloat16 (rounded once), y_hs and y_rs its strides
  uint16_t* y16 = nullptr;
  bool bf16 = false;
  int64_t sq = 0, sk = 0, d = 0, dv = 0;
  int64_t q_hs = 0, q_rs = 0, q_cs = 0;     // head, row (query), column (d)
  int64_t kt_hs = 0, kt_rs = 0, kt_cs = 0;  // head, row (d), column (key)
  int64_t v_hs = 0, v_rs = 0, v_cs = 0;     // head, row (key), column (dv)
  int64_t y_hs = 0, y_rs = 0;
  float scale = 1.f;
};

struct RowsIsaOps {
  const char* name;
  /// y[r] = softmax(scale * x[r]) for rows [r0, r1) of n floats (contiguous rows; y may be x).
  void (*softmax)(const float* x, float* y, int64_t r0, int64_t r1, int64_t n, float scale);
  /// Query rows [r0, r0 + r) of head h of `a`, in `scratch` (attention_scratch(a, r) floats,
  /// aligned to 64 bytes): the head's keys packed, the block's scores computed, softmaxed and
  /// multiplied by v in registers and L1/L2.
  void (*attention)(const AttnView& a, int64_t h, int64_t r0, int64_t r, float* scratch);
  /// As attention for bfloat16 q, k and v, by the CPU's bfloat16 dot product (AVX512_BF16), the
  /// softmaxed scores rounded to bfloat16 for the product with v, and y written to y16; null
  /// where the table's ISA has none. Call it only where bf16_dot_supported().
  void (*attention_dot)(const AttnView& a, int64_t h, int64_t r0, int64_t r, float* scratch);
  /// y[r] = (x[r] - mean) / sqrt(var + eps) * gamma + beta for rows [r0, r1) of n floats
  /// (contiguous rows; y may be x; beta may be null): mean and variance in two passes.
  void (*layer_norm)(const float* x, float* y, int64_t r0, int64_t r1, int64_t n,
                     const float* gamma, const float* beta, float eps);
  /// y[h] = q[h] kt[h] for head h of `a` (its v and scale unused; all sq rows at once, a few), in
  /// `scratch` (product_scratch(a) floats, aligned to 64 bytes): kt packed as float32, the rows
  /// multiplied from L1/L2.
  void (*product)(const AttnView& a, int64_t h, float* scratch);
  /// y[r] = layer_norm(x[r] + res[r]) for rows [r0, r1) of n values, float32 or (`bf16`) bf16's
  /// bits (contiguous rows): the sum rounded to the type first (the Add's result) and stored to
  /// `sum` where it is not null; the arithmetic as layer_norm's, bf16's result rounded once;
  /// `row` n floats of scratch.
  void (*add_layer_norm)(const void* x, const void* res, void* y, void* sum, int64_t r0, int64_t r1,
                         int64_t n, const float* gamma, const float* beta, float eps, bool bf16,
                         float* row);
};

/// Rows of the attention's packed keys, values and scores: whole lines (and whole vectors of
/// every ISA).
inline int64_t attn_round(int64_t n) { return (n + 15) / 16 * 16; }
/// The floats `attention` needs for blocks of up to r query rows.
inline int64_t attention_scratch(const AttnView& a, int64_t r) {
  return a.d * attn_round(a.sk) + a.sk * attn_round(a.dv) + attn_round(r * a.d) +
         r * attn_round(a.sk);
}

/// The floats `product` needs.
inline int64_t product_scratch(const AttnView& a) {
  return a.d * attn_round(a.sk) + attn_round(a.sq * a.d);
}

extern const RowsIsaOps kRowsScalarOps;
extern const RowsIsaOps kRowsAvx2Ops;
extern const RowsIsaOps kRowsAvx512Ops;

}  // namespace lopper::kernels::cpu
