// SparseGPT (Frantar & Alistarh 2023): prune a layer's weight one column block at a time, choosing
// by the inverse Hessian of its inputs and updating the weights still to come so that the layer's
// output on the calibration inputs changes least (optimal brain surgeon, made cheap by sharing one
// Cholesky factor across rows). Internal header.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

namespace lopper {

struct SparseGptOptions {
  double amount = 0.5;       // unstructured: the fraction of each block's nonzero weights removed
  int64_t n = 0, m = 0;      // N:M (n > 0): keep n of every m consecutive columns of a row
  int64_t block_size = 128;  // columns pruned together (the lazy batch update)
  double dampening = 0.01;   // added to H's diagonal, as a fraction of its mean
};

struct SparseGptResult {
  at::Tensor weight;     // [rows, cols] float32, the pruned and updated weight
  double error = 0;      // sum over rows and columns of (w - q)^2 / [H^-1]_ii^2 / 2
  double dampening = 0;  // the dampening the factorisation needed (o.dampening or more)
};

/// How many of a column block's `alive` weights SparseGPT prunes at `amount` (a fraction, rounded
/// half to even): what the solver removes per block, and what a target counts ahead of it.
int64_t sparsegpt_block_count(double amount, int64_t alive);

/// What SparseGPT reads of a layer's Hessian: the same for every layer of the same inputs (a
/// transformer's q, k and v; gate and up), so computed once for them.
struct SparseGptFactor {
  at::Tensor hinv;       // [cols, cols] float32, upper triangular: hinv^T hinv = (H + damp)^-1
  at::Tensor dead;       // [cols] bool: the inputs no calibration token set (H_ii = 0)
  double dampening = 0;  // the dampening the factorisation needed
};

/// The factor of `gram` ([cols, cols], X^T X; worked on in place when the caller moves it in and
/// holds no other reference) under `dampening` (a fraction of the diagonal's mean), raised
/// tenfold, twice, while H + dampening is not positive definite; then it throws lopper::Error
/// naming `where`, as it does for a Hessian with NaN or Inf.
SparseGptFactor sparsegpt_factor(at::Tensor gram, double dampening, const std::string& where);

/// Prunes `w` ([rows, cols]) with a factor of its inputs' Hessian (o.dampening is the factor's).
SparseGptResult sparsegpt(const at::Tensor& w, const SparseGptFactor& f, const SparseGptOptions& o);

/// Prunes `w` ([rows, cols]: outputs by inputs) given `gram` ([cols, cols], X^T X over the
/// calibration inputs; worked on in place when the caller moves it in and holds no other
/// reference). Weights that are zero already stay zero and the amount counts from the
/// others; the inputs no calibration token ever set (a zero on H's diagonal) get their weights
/// zeroed, as the reference does. When H + dampening is not positive definite the dampening is
/// raised tenfold, twice; then it throws lopper::Error naming `where`.
SparseGptResult sparsegpt(const at::Tensor& w, at::Tensor gram, const SparseGptOptions& o,
                          const std::string& where);

}  // namespace lopper
