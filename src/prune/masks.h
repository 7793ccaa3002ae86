// The mask primitives prune(), sensitivity and targets are made of (internal): which weights of
// a tensor, or of several ranked together, go. torch.nn.utils.prune's semantics where it has them.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "lopper/prune.h"

namespace lopper {

// --- Masks (true = keep). Each keeps the weights that are already zero at zero. ------------------

/// Removes the `k` smallest values of `scores` (|scores| when `absolute`; concatenated in order,
/// only where `alive`, or where the score is nonzero for an undefined `alive`), with
/// torch.topk(largest=False)'s choice among ties up to 2^24 alive scores and the first tied
/// entries beyond. One flag tensor per input, true = removed.
/// NOTE: finds the threshold by a radix select in two streaming passes, never a sort; masks.cpp.
std::vector<at::Tensor> smallest_k(const std::vector<at::Tensor>& scores,
                                   const std::vector<at::Tensor>& alive, int64_t k,
                                   bool absolute = false);
/// Per row of `scores` ([rows, cols], >= 0): removes round(amount x the row's `alive` count) of
/// its alive entries, the smallest first, ties in column order (Wanda's stable sort). A fraction
/// only. True = removed (the dead entries are flagged too).
at::Tensor smallest_per_row(const at::Tensor& scores, const at::Tensor& alive,
                            const PruneAmount& amount);
/// torch's l1_unstructured on one tensor, counted from its nonzero weights.
at::Tensor l1_mask(const at::Tensor& w, const PruneAmount& amount);
/// random_unstructured: `amount` of the nonzero weights, drawn with `gen`.
at::Tensor random_mask(const at::Tensor& w, const PruneAmount& amount, at::Generator& gen);
/// Keeps the n largest |w| (or, given, the n largest `score`) of every m consecutive weights along
/// the last dim (size % m == 0).
at::Tensor nm_mask(const at::Tensor& w, int64_t n, int64_t m, const at::Tensor& score = {});
/// ln_structured (norm 1 or 2) or random_structured (norm 0, with `gen`) along `dim`, counted from
/// the slices that still have a nonzero weight. Given a `score` (>= 0, w's shape), slices are
/// ranked by the sum of their scores instead.
at::Tensor channel_mask(const at::Tensor& w, int64_t dim, const PruneAmount& amount, int norm,
                        at::Generator* gen, const at::Tensor& score = {});

/// A weight for block_masks: its output and input axes, and optional scores (>= 0, w's shape).
struct BlockWeight {
  at::Tensor w;
  int64_t out_axis = 0, in_axis = 1;
  at::Tensor score;
};
/// PrunePattern::kBlock over `ws` ranked together (one tensor: local scope; several: global),
/// counted from the blocks that still have a nonzero weight: removes `amount` of them, the lowest
/// by mean |w| (norm 1), root mean square (norm 2) or mean score (where given), or at random
/// (norm 0, with `gen`). Throws, naming `where`, when the amount is more than the blocks left.
std::vector<at::Tensor> block_masks(const std::vector<BlockWeight>& ws, int64_t r, int64_t c,
                                    const PruneAmount& amount, int norm, at::Generator* gen,
                                    const std::string& where = "");

}  // namespace lopper
