// Sparse kernels as candidates for a layer that multiplies by a constant weight (internal):
// Gemm, MatMul and FusedMatMul (gemm.cpp), pointwise and im2col convolutions (conv.cpp).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "exec/onednn.h"
#include "kernels/cpu/sparse.h"

namespace lopper::ops {

/// One way to run y = act(x . w^T + b) sparsely: a packed format and a kernel.
struct SparseCandidate {
  std::string name;  // "csr-gather", "bcsr8x1-rows", "bitmask", ...
  std::shared_ptr<const kernels::cpu::SparseWeight> weight;
  kernels::cpu::Algo algo = kernels::cpu::Algo::kCols;
  /// Or the bitmask format (float32 or bfloat16 values), for a few rows of x at a time.
  std::shared_ptr<const kernels::cpu::MaskedWeight> masked;
  /// A float32 format of a bfloat16 layer's weight: x is widened to float32 before the kernel
  /// and y rounded back to bfloat16 after (run_sparse_linear, run_sparse_cols).
  bool widened = false;
  /// The bfloat16 cols kernel (SparseWeight::linear_bf16) on `weight`'s pairs.
  bool pairs = false;
};

/// Every (format, kernel) pair worth timing for w [N, K] (float32) and its bias: CSR always, a
/// block format when its blocks are nearly full (the weight was pruned in that pattern), and the
/// bitmask format for products of a few rows (`rows` <= 16, every algo allowed); a bfloat16 `w`
/// gets the bitmask format in bfloat16 and the others widened to float32 (`widened`), and, for
/// products of more rows (`rows` > 16) on a CPU with the bfloat16 dot product, every block format's
/// cols kernel in bfloat16 (`pairs`). Empty when
/// the weight is too dense for a sparse kernel to win, or when LOPPER_SPARSE=off. `algos` restricts
/// the kernels (e.g. only kCols for im2col columns).
std::vector<SparseCandidate> sparse_candidates(const at::Tensor& w, const at::Tensor& bias,
                                               std::vector<kernels::cpu::Algo> algos = {},
                                               int64_t rows = 0);

/// The activation the kernels fuse for `post` (kNone when they cannot: run_* applies it after).
kernels::cpu::Activation fused_activation(const onednn::PostOp& post);
/// y as it leaves a kernel that fused `fused` (fused_activation(post)): `post` applied by ATen
/// when the kernel could not fuse it, else y itself.
at::Tensor finish_activation(at::Tensor y, const onednn::PostOp& post,
                             const kernels::cpu::Activation& fused);

/// y [M, N] = post(x [M, K] . w^T + b).
at::Tensor run_sparse_linear(const SparseCandidate& s, const at::Tensor& x,
                             const onednn::PostOp& post);
/// y [B, N, L] = post(w . x[b] + b) for x [B, K, L].
at::Tensor run_sparse_cols(const SparseCandidate& s, const at::Tensor& x,
                           const onednn::PostOp& post);

}  // namespace lopper::ops
