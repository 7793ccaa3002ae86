// Unstructured, N:M, row/column and block pruning of a model's prunable weights (Conv,
// ConvTranspose, Gemm, MatMul weight initializers; biases and normalisation parameters are never
// touched). Pruning keeps every shape and writes zeros, with the semantics of
// torch.nn.utils.prune: cumulative (a weight that is already zero stays zero and an `amount` counts
// from the weights still nonzero, like PyTorch's PruningContainer), and the same weights removed
// as l1_unstructured / global_unstructured(L1Unstructured) / ln_structured on the same values,
// ties included. Blocks (no torch counterpart) follow the same rules with a block in place of a
// weight.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "lopper/graph.h"

namespace lopper {

enum class PruneMethod {
  kAbs,     // |w| < threshold
  kL1,      // the smallest |w|
  kRandom,  // uniformly at random
  kGrad,    // the smallest mean |dL/dw| over calibration batches (needs a Saliency)
  kTaylor,  // the smallest first-order Taylor saliency sum |w * dL/dw| (needs a Saliency)
};
enum class PruneScope { kLocal, kGlobal };
// kBlock: a weight viewed as a matrix [outputs, inputs] (outputs along the output axis, inputs the
// other axes flattened in memory order, the input axis first: Conv [O, I*kh*kw], Gemm and MatMul
// [N, K]) and tiled into R x C blocks aligned at multiples of R and C (edge blocks are partial);
// whole blocks are removed, the way sparse CPU kernels store them (BSR).
enum class PrunePattern { kUnstructured, kNM, kRow, kColumn, kBlock };

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
  /// "0.5", "1.0" (a fraction: always with a point) or "120" (a count).
  std::string str() const;
};

/// How one layer is pruned: what `--method/--amount/--threshold/--pattern/--norm/--seed` set on the
/// command line, and what one rule of a recipe sets.
struct PruneLayerOptions {
  PruneMethod method = PruneMethod::kL1;  // kGrad, kTaylor: rank by a Saliency instead of |w|
  PrunePattern pattern = PrunePattern::kUnstructured;
  double threshold = -1;  // kAbs: remove |w| < threshold (required, >= 0)
  PruneAmount amount;     // kL1, kRandom
  uint64_t seed = 0;      // kRandom
  int64_t n = 2, m = 4;   // kNM: keep n of every m consecutive weights along the reduction dim
  int norm = 1;           // kRow / kColumn with kL1: the Ln norm ranking rows or columns (1 or 2)
                          // (grad/taylor rank a row or column by the sum of its saliencies);
                          // kBlock: mean |w| (1) or root mean square (2) of a block
  int64_t block_r = 1, block_c = 1;  // kBlock: R outputs x C inputs, each in 1..256
};

struct PruneOptions : PruneLayerOptions {
  PruneScope scope = PruneScope::kLocal;
  std::string exclude;  // ECMAScript regex on the layer (node) name or the weight name
  bool skip_first_last = false;
};

/// A prunable weight (Conv, ConvTranspose, Gemm, MatMul weight initializer) and the axes of its
/// output units (rows) and input units (the reduction dim), -1 when it has none.
struct PrunableWeight {
  const ir::Node* node = nullptr;  // the first node that reads it
  std::string weight;              // initializer name
  int64_t in_axis = -1, out_axis = -1;
};
/// The prunable weights of `g`, once each (a weight shared by two layers once), in node order.
std::vector<PrunableWeight> prunable_weights(const ir::Graph& g);

/// Throws lopper::Error ("[prune] ...") when `o` cannot prune any layer (amount outside [0, 1],
/// threshold < 0, N >= M, norm not 1 or 2, abs with a pattern, N:M with random, a block side
/// outside 1..256).
/// grad/taylor take an amount like l1; their Saliency is checked when pruning.
void check_layer_options(const PruneLayerOptions& o);
/// "abs" | "l1" | "random" | "grad" | "taylor"; throws lopper::Error on anything else.
PruneMethod parse_prune_method(const std::string& s);
/// "unstructured" | "N:M" (e.g. "2:4") | "row" | "column" | "block:RxC" (e.g. "block:8x1") into
/// o.pattern (and o.n, o.m or o.block_r, o.block_c); throws lopper::Error on anything else.
void parse_prune_pattern(const std::string& s, PruneLayerOptions& o);

// --- Recipes: per-layer rules (local scope), read from YAML. ------------------------------------
//
//   defaults: {method: l1, amount: 0.5}     # optional; without a method, unmatched layers stay
//   rules:                                   # first match wins
//     - {match: "^/0/Conv$", skip: true}
//     - {match: "Gemm", method: l1, pattern: "2:4"}
//
// Keys of `defaults` and of a rule: method (abs | l1 | random | grad | taylor), amount (fraction or count),
// threshold, pattern, norm, seed; a rule also has match (required; ECMAScript regex searched in
// the layer (node) name and the weight name) and skip (bool). A rule's keys override the defaults.

struct PruneRule {
  std::string match;          // ECMAScript regex on the node name or the weight name
  bool skip = false;          // leave the matching layers alone
  PruneLayerOptions options;  // the defaults with the rule's own keys on top
  std::string where;          // "rules[1] (line 7)", for messages and the report
};

struct PruneRecipe {
  std::string source;         // the file, for messages
  bool has_defaults = false;  // false: layers that no rule matches are left alone
  PruneLayerOptions defaults;
  std::vector<PruneRule> rules;
};

/// Parses a recipe. Throws lopper::Error, one line naming `source`, the key and the line, on YAML
/// that does not parse, unknown keys, wrong types, bad values and bad regexes.
PruneRecipe parse_prune_recipe(const std::string& yaml, const std::string& source);
/// Reads and parses the recipe in `path`.
PruneRecipe load_prune_recipe(const std::string& path);

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
  std::string rule;  // recipes: the rule that chose method/amount ("rules[1] (line 7)", "defaults")
  double sparsity() const { return params ? 1.0 - double(nonzero_after) / double(params) : 0.0; }
};

struct PruneReport {
  std::vector<PruneLayerReport> layers;
  std::vector<std::string> warnings;  // e.g. an --exclude regex that matched no layer
  int64_t params = 0, nonzero_before = 0, nonzero_after = 0;  // over the prunable layers
};

// --- Data-driven importance (grad, taylor). --------------------------------------------------

/// Per prunable weight (by initializer name), scores >= 0 of the weight's shape, on the CPU.
struct Saliency {
  std::map<std::string, at::Tensor> grad;    // mean over the batches of |dL/dw|
  std::map<std::string, at::Tensor> taylor;  // sum over the batches of |w * dL/dw|
  int64_t batches = 0, samples = 0;
  double loss = 0;  // mean loss over the batches
};

struct CalibrationOptions {
  int64_t batches = 32;  // at most this many batches (fewer when an epoch has fewer)
  std::string device = "cpu";
  /// Called after each batch (1-based) with the running mean loss.
  std::function<void(int64_t batch, int64_t of, double loss)> progress;
};

class DataLoader;  // lopper/data.h

/// Runs `model` under autograd on batches of `data` and accumulates each prunable weight's
/// gradient saliencies. The loss is cross-entropy between the model's first output (logits; a
/// final Softmax or LogSoftmax is taken into account) and the labels. Throws lopper::Error when
/// the model's output does not fit the labels (e.g. fewer classes than the dataset has).
Saliency compute_saliency(const ir::Model& model, DataLoader& data, const CalibrationOptions& opts);

/// Prunes `model`'s prunable weights and reports per layer. A weight that no other ir::Model copy
/// shares is written in place; a shared one is replaced. Throws lopper::Error ("[prune] ...") on bad
/// options, when grad/taylor have no `saliency`, and when nothing is left to prune; the model is
/// untouched then.
PruneReport prune(ir::Model& model, const PruneOptions& opts, const Saliency* saliency = nullptr);
/// Prunes each layer as the first recipe rule that matches it says (or as the defaults), in place.
/// Warns for a rule that matches no layer; throws when nothing is left to prune (model untouched).
PruneReport prune(ir::Model& model, const PruneRecipe& recipe, const Saliency* saliency = nullptr);

// --- Masks (true = keep). Each keeps the weights that are already zero at zero. ------------------

/// Removes the `k` smallest values of `scores` (|scores| when `absolute`; concatenated in order,
/// only where `alive`, or where the score is nonzero for an undefined `alive`), with
/// torch.topk(largest=False)'s choice among ties up to 2^24 alive scores and the first tied
/// entries beyond. One flag tensor per input, true = removed.
/// NOTE: finds the threshold by a radix select in two streaming passes, never a sort; masks.cpp.
std::vector<at::Tensor> smallest_k(const std::vector<at::Tensor>& scores,
                                   const std::vector<at::Tensor>& alive, int64_t k,
                                   bool absolute = false);
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

const char* method_name(PruneMethod m);

}  // namespace lopper
