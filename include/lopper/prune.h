// Unstructured, N:M and row/column pruning of a model's prunable weights (Conv, ConvTranspose,
// Gemm, MatMul weight initializers; biases and normalisation parameters are never touched). Pruning
// keeps every shape and writes zeros, with the semantics of torch.nn.utils.prune: cumulative (a
// weight that is already zero stays zero and an `amount` counts from the weights still nonzero,
// like PyTorch's PruningContainer), and the same weights removed as l1_unstructured /
// global_unstructured(L1Unstructured) / ln_structured on the same values, ties included.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "lopper/graph.h"

namespace lopper {

enum class PruneMethod { kAbs, kL1, kRandom };
enum class PruneScope { kLocal, kGlobal };
enum class PrunePattern { kUnstructured, kNM, kRow, kColumn };

/// torch's `amount`: a fraction of the remaining weights in [0, 1] (rounded half to even, as
/// Python's round), or an integer count.
struct PruneAmount {
  double value = 0;
  bool is_count = false;
  /// "0.3" / "1e-1" -> fraction, "120" -> count. Throws lopper::Error on anything else.
  static PruneAmount parse(const std::string& s);
  /// How many of `n` remaining weights (or channels) to remove; throws, naming `where`, when a
  /// fraction is outside [0, 1], a count is negative or a count exceeds `n`.
  int64_t count_of(int64_t n, const std::string& where = "") const;
  std::string str() const;
};

struct PruneOptions {
  PruneMethod method = PruneMethod::kL1;
  PruneScope scope = PruneScope::kLocal;
  PrunePattern pattern = PrunePattern::kUnstructured;
  double threshold = -1;  // kAbs: remove |w| < threshold (required, >= 0)
  PruneAmount amount;     // kL1, kRandom
  uint64_t seed = 0;      // kRandom
  int64_t n = 2, m = 4;   // kNM: keep n of every m consecutive weights along the reduction dim
  int norm = 1;           // kRow / kColumn with kL1: the Ln norm ranking rows or columns (1 or 2)
  std::string exclude;    // ECMAScript regex on the layer (node) name or the weight name
  bool skip_first_last = false;
};

struct PruneLayerReport {
  std::string name;    // node name
  std::string op;      // Conv, ConvTranspose, Gemm, MatMul
  std::string weight;  // initializer name
  std::vector<int64_t> shape;
  int64_t params = 0;
  int64_t nonzero_before = 0;
  int64_t nonzero_after = 0;
  std::string method;   // "l1", "abs", "random" (+ pattern), empty when skipped
  std::string amount;   // the amount or threshold as given
  std::string skipped;  // why the layer was left alone, empty when pruned
  double sparsity() const { return params ? 1.0 - double(nonzero_after) / double(params) : 0.0; }
};

struct PruneReport {
  std::vector<PruneLayerReport> layers;
  std::vector<std::string> warnings;  // e.g. an --exclude regex that matched no layer
  int64_t params = 0, nonzero_before = 0, nonzero_after = 0;  // over the prunable layers
};

/// Prunes `model`'s prunable weights in place and reports per layer. Throws lopper::Error ("[prune]
/// ...") on bad options and when nothing is left to prune; the model is untouched then.
PruneReport prune(ir::Model& model, const PruneOptions& opts);

// --- Masks (true = keep). Each keeps the weights that are already zero at zero. ------------------

/// Removes the `k` smallest values of `scores` (concatenated in order, only where `alive`), with
/// torch.topk(largest=False)'s choice among ties. One flag tensor per input, true = removed.
/// NOTE: finds the threshold by selection (std::nth_element), never a full sort; see prune.cpp.
std::vector<at::Tensor> smallest_k(const std::vector<at::Tensor>& scores,
                                   const std::vector<at::Tensor>& alive, int64_t k);
/// torch's l1_unstructured on one tensor, counted from its nonzero weights.
at::Tensor l1_mask(const at::Tensor& w, const PruneAmount& amount);
/// random_unstructured: `amount` of the nonzero weights, drawn with `gen`.
at::Tensor random_mask(const at::Tensor& w, const PruneAmount& amount, at::Generator& gen);
/// Keeps the n largest |w| of every m consecutive weights along the last dim (size % m == 0).
at::Tensor nm_mask(const at::Tensor& w, int64_t n, int64_t m);
/// ln_structured (norm 1 or 2) or random_structured (norm 0, with `gen`) along `dim`, counted from
/// the slices that still have a nonzero weight.
at::Tensor channel_mask(const at::Tensor& w, int64_t dim, const PruneAmount& amount, int norm,
                        at::Generator* gen);

const char* method_name(PruneMethod m);

}  // namespace lopper
