// Unstructured, N:M, row/column and block pruning of a model's prunable weights (Conv,
// ConvTranspose, Gemm, MatMul weight initializers; biases and normalisation parameters are never
// touched). Pruning keeps every shape and writes zeros, with the semantics of
// torch.nn.utils.prune: cumulative (a weight that is already zero stays zero and an `amount` counts
// from the weights still nonzero, like PyTorch's PruningContainer), and the same weights removed
// as l1_unstructured / global_unstructured(L1Unstructured) / ln_structured on the same values,
// ties included. Blocks (no torch counterpart) follow the same rules with a block in place of a
// weight.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "lopper/graph.h"
#include "lopper/loss.h"

namespace lopper {

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
  /// What ranks the weights: a criterion of the table (src/prune/importance.cpp) that ranks single
  /// weights: abs (|w| under `threshold`), l1, lamp, random, grad and taylor (by a Saliency),
  /// wanda and sparsegpt (by the layers' inputs: prune_calibrated()).
  std::string criterion = "l1";
  PrunePattern pattern = PrunePattern::kUnstructured;
  double threshold = -1;  // abs: remove |w| < threshold (required, >= 0)
  PruneAmount amount;     // every other criterion
  uint64_t seed = 0;      // random
  int64_t n = 2, m = 4;   // kNM: keep n of every m consecutive weights along the reduction dim
  int norm = 1;           // kRow / kColumn with l1: the Ln norm ranking rows or columns (1 or 2)
                          // (other criteria rank a row or column by the sum of its scores);
                          // kBlock: mean |w| (1) or root mean square (2) of a block
  int64_t block_r = 1, block_c = 1;  // kBlock: R outputs x C inputs, each in 1..256
  /// Prune a tied weight too: one that a node other than a prunable layer also reads (GPT-2's
  /// lm_head weight is the token embedding's table, read by a Gather), which then changes as well.
  /// Off (the default), such a weight is left alone and the report says why (PrunableWeight::tied).
  /// A weight that several prunable layers share is pruned once, for all of them, when every one
  /// of them is selected (an `exclude` or recipe rule that matches any of them leaves it alone).
  bool allow_tied = false;
  int64_t block_size = 128;  // sparsegpt: columns pruned together (the lazy batch update)
  double dampening = 0.01;   // sparsegpt: added to the Hessian's diagonal, a fraction of its mean
};

/// OWL (Yin et al. 2023), outlier-weighted layer-wise sparsity: blocks whose Wanda scores hold more
/// outliers (scores above M x the block's mean) keep more weights. Amounts spread linearly by the
/// outlier ratio over [amount - lambda, amount + lambda] and average the model's amount. A block is
/// a transformer layer (the layers whose parameter or node names share a prefix ending in a
/// number, `model.layers.3`); another layer is a block of its own.
struct OwlOptions {
  double lambda = 0;  // 0: off
  double m = 5;
};

struct PruneOptions : PruneLayerOptions {
  PruneScope scope = PruneScope::kLocal;
  std::string exclude;  // regex (regex_error) on each of a layer's names (PrunableWeight::names)
  bool skip_first_last = false;
  OwlOptions owl;  // prune_calibrated() with unstructured fractions
};

/// A node, besides a prunable weight's first layer, that reads the weight: directly or through
/// Identity, Transpose, Cast, CastLike, Reshape, Squeeze, Unsqueeze or Flatten (readers of its
/// shape alone, Shape and Size, do not count: pruning keeps shapes).
struct WeightUse {
  std::string node;    // the reader's name (Node::label), or the graph output's
  std::string op;      // its op type ("" for a graph output)
  std::string module;  // the PyTorch module it was exported from (torch_module), "" when unknown
  /// "layer": another prunable layer whose weight it is (pruned with it); "embedding": a Gather's
  /// table (data input); "output": a graph output; "other": any other reader.
  std::string use;
  /// How tables and reasons name it: "embedding 'm.transformer.wte' (Gather)".
  std::string describe() const;
};

/// A prunable weight (Conv, ConvTranspose, Gemm, MatMul weight initializer) and the axes of its
/// output units (rows) and input units (the reduction dim), -1 when it has none.
struct PrunableWeight {
  const ir::Node* node = nullptr;  // the first layer that reads it
  std::string weight;              // initializer name
  std::string param;               // the PyTorch parameter's name (param_name), "" when unknown
  int64_t in_axis = -1, out_axis = -1;
  std::vector<WeightUse> shared;  // the weight's other readers, in node order

  /// The names the weight answers to in `exclude` and recipe rules: each of its layers' node
  /// names, the weight's and the parameter's.
  std::vector<std::string> names() const;
  /// What tables show for it: the parameter's name, else the first layer's node name.
  std::string label() const;
  /// Whether a reader that is not a prunable layer shares it (PruneLayerOptions::allow_tied).
  bool tied() const;
  /// Why the tie keeps it from being pruned ("tied with embedding 'm.transformer.wte' (Gather):
  /// pruning would change the embedding too"), "" when it is not tied.
  std::string tie_reason() const;
};
/// The prunable weights of `g`, once each (a weight shared by two layers once), in node order.
std::vector<PrunableWeight> prunable_weights(const ir::Graph& g);

/// Throws lopper::Error ("[prune] ...") when `o` cannot prune any layer (amount outside [0, 1],
/// threshold < 0, N >= M, norm not 1 or 2, abs with a pattern, N:M with random, a block side
/// outside 1..256).
/// Data-driven criteria take an amount like l1; their Saliency is checked when pruning.
void check_layer_options(const PruneLayerOptions& o);
/// check_layer_options(), and throws when scope is global with a pattern other than unstructured
/// and block, or `exclude` is not a valid regex: every check prune() makes before any work.
void check_prune_options(const PruneOptions& o);
/// Why `re` is not a valid pattern for `exclude`, recipe `match` or `freeze` ("" when it is).
/// Patterns are RE2's: ECMAScript's syntax without backreferences and lookaround, matched in time
/// linear in the name (names come from untrusted models).
std::string regex_error(const std::string& re);
/// What a criterion that ranks single weights asks of its caller (the table of
/// src/prune/importance.cpp), for checking a caller's options before any work.
struct CriterionInfo {
  std::string name;
  bool takes_threshold = false;  // removes |w| < threshold (abs); the others take an amount
  bool needs_data = false;       // ranks by calibration data
  bool reads_inputs = false;     // ... by the layers' inputs: prune_calibrated(), not a Saliency
  std::string data_needed;       // "by their gradients" (needs_data), for messages
  std::string summary;           // one line for help texts: what ranks, what goes first
};
/// The criterion called `name`. Throws lopper::Error "[prune] unknown method 'x' (methods: ...)".
CriterionInfo weight_criterion_info(const std::string& name);
/// Every criterion that ranks single weights, in the table's order (help texts, messages).
std::vector<CriterionInfo> weight_criteria();
/// The names of `criteria` joined ("l1, lamp and wanda" with `last` " and "); `data_only`: only
/// those that rank by data.
std::string criterion_names(const std::vector<CriterionInfo>& criteria, const char* last = ", ",
                            bool data_only = false);
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
// Keys of `defaults` and of a rule: method (a criterion: abs, l1, lamp, random, grad, taylor,
// wanda, sparsegpt), amount (fraction or count), threshold, pattern, norm, seed, allow_tied (bool),
// block_size and dampening (sparsegpt); a rule also has
// match (required; a regex (regex_error) searched in each name of the layer: its node name, the
// weight (initializer) name, the PyTorch parameter name; a weight several layers share: each of
// theirs) and skip (bool). A rule's keys override the defaults.

struct PruneRule {
  std::string match;          // regex (regex_error) on the layer's names (PrunableWeight::names)
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
/// The recipe key that sets an option of PruneLayerOptions ("criterion" -> "method", the others
/// as they are): how a recipe's errors name the options (Error::render).
std::string recipe_key(const std::string& option);
/// Reads and parses the recipe in `path`.
PruneRecipe load_prune_recipe(const std::string& path);

struct PruneLayerReport {
  std::string name;               // node name
  std::string op;                 // Conv, ConvTranspose, Gemm, MatMul
  std::string weight;             // initializer name
  std::string param;              // the PyTorch parameter's name, "" when the model lacks it
  std::vector<WeightUse> shared;  // the weight's other readers (another layer, a tied embedding)
  std::vector<int64_t> shape;
  int64_t params = 0;
  int64_t nonzero_before = 0;
  int64_t nonzero_after = 0;
  std::string method;   // "l1", "abs", "random" (+ pattern), empty when skipped
  std::string amount;   // the amount or threshold as given
  std::string skipped;  // why the layer was left alone, empty when pruned
  std::string rule;  // recipes: the rule that chose method/amount ("rules[1] (line 7)", "defaults")
  double sparsity() const { return params ? 1.0 - double(nonzero_after) / double(params) : 0.0; }
  /// What tables show for the layer: the parameter's name, else the node's.
  const std::string& label() const { return param.empty() ? name : param; }
};

struct PruneReport {
  std::vector<PruneLayerReport> layers;
  std::vector<std::string> warnings;  // e.g. an --exclude regex that matched no layer, a tie
  int64_t params = 0, nonzero_before = 0, nonzero_after = 0;  // over the prunable layers
};

// --- Data-driven importance (grad, taylor). --------------------------------------------------

class DataLoader;  // lopper/data.h

/// The scores of the criteria that rank by gradients, per criterion (by name: "grad" is the mean
/// over the batches of |dL/dw|, "taylor" the sum of |w * dL/dw|) and per prunable weight (by
/// initializer name): scores >= 0 of the weight's shape, on the CPU. Channels ranked by
/// "activation" (structured_saliency(), lopper/structured.h) are per tensor a layer reads (by
/// value name): one float64 term per index along its channel axis, a channel's terms summing to
/// its score.
struct Saliency {
  std::map<std::string, std::map<std::string, at::Tensor>> scores;
  int64_t batches = 0, samples = 0;
  double loss = 0;  // mean loss over the batches
};

struct CalibrationOptions {
  /// The papers' calibration for the criteria that read the layers' inputs (Wanda, SparseGPT,
  /// OWL): this many samples, when the caller does not say how many batches.
  static constexpr int64_t kLayerInputSamples = 128;
  /// At most this many batches (fewer when an epoch has fewer); prune_calibrated() needs this
  /// many and throws when the data has fewer.
  int64_t batches = 32;
  std::string device = "cpu";
  LossOptions loss;  // lopper/loss.h
  /// Called after each batch (1-based) with the running mean loss.
  std::function<void(int64_t batch, int64_t of, double loss)> progress;
  /// prune_calibrated(): block by block, each block's layers calibrated on the outputs of the
  /// blocks before it, already pruned (SparseGPT's and Wanda's sequential calibration). Off: every
  /// layer on the unpruned model's activations, in one pass.
  bool sequential = true;
  /// prune_calibrated(): called as each calibration pass starts (1-based), with what it calibrates
  /// ("model.layers.3", "OWL outlier ratios").
  std::function<void(int64_t pass, int64_t of, const std::string& what)> on_pass;
  /// prune_calibrated(): called whenever the weights read so far need not stay in memory (after
  /// the layers are counted, after each block is pruned and has handed on its outputs), e.g. to
  /// drop a mapped model's pages (onnx::MappedData::release).
  std::function<void()> release_memory;
};

/// Runs `model` under autograd on batches of `data` and accumulates each prunable weight's
/// gradient saliencies, for every criterion that ranks by gradients. The loss is opts.loss on the
/// model's first output (cross-entropy on the labels for classifiers, next-token or masked-token
/// cross-entropy for language models; a final Softmax or LogSoftmax is taken into account).
/// Throws lopper::Error when the model's output does not fit the data (e.g. fewer classes than
/// the dataset has).
Saliency compute_saliency(const ir::Model& model, DataLoader& data, const CalibrationOptions& opts);

/// Prunes `model`'s prunable weights and reports per layer. A weight that no other ir::Model copy
/// shares is written in place; a shared one is replaced. A tied weight (PrunableWeight::tied) is
/// left alone unless `allow_tied`, with the reason in its row and a warning either way. Throws
/// lopper::Error ("[prune] ...") on bad options, when a data-driven criterion has no `saliency`,
/// and when nothing is left to prune; the model is untouched then.
PruneReport prune(ir::Model& model, const PruneOptions& opts, const Saliency* saliency = nullptr);
/// Prunes each layer as the first recipe rule that matches it says (or as the defaults), in place.
/// Warns for a rule that matches no layer; throws when nothing is left to prune (model untouched).
PruneReport prune(ir::Model& model, const PruneRecipe& recipe, const Saliency* saliency = nullptr);

// --- One-shot pruning with calibration data: wanda, sparsegpt, OWL (issue 20). -------------------

/// Whether pruning with `opts` (or `recipe`) reads the layers' inputs: a criterion that ranks by
/// them (wanda, sparsegpt) or OWL. Such pruning is prune_calibrated()'s, not prune()'s.
bool reads_layer_inputs(const PruneOptions& opts);
bool reads_layer_inputs(const PruneRecipe& recipe);

/// Prunes as prune() does, with `calib.batches` batches of `data` as calibration: the layers
/// whose criterion reads their inputs (Gemm, MatMul and one-group Conv) are calibrated on them,
/// block by block in the graph's order (CalibrationOptions::sequential), then pruned before the
/// next block's inputs are computed; the other layers are pruned as prune() would, in their turn.
/// Gradient criteria in a recipe get their Saliency from the unpruned model first. Throws
/// lopper::Error on bad options, when `data` has fewer than `calib.batches` batches, and when a
/// layer's Hessian stays singular (sparsegpt); the model may then be partly pruned: prune a copy
/// to keep the original (the CLI writes nothing on an error).
PruneReport prune_calibrated(ir::Model& model, const PruneOptions& opts, DataLoader& data,
                             const CalibrationOptions& calib);
/// What prune_calibrated() checks of its data before any work: throws lopper::Error when
/// `calib.batches` < 1 or `data` has fewer batches than that.
void check_calibration(const DataLoader& data, const CalibrationOptions& calib);
PruneReport prune_calibrated(ir::Model& model, const PruneRecipe& recipe, DataLoader& data,
                             const CalibrationOptions& calib);

// --- One-shot pruning of a model the caller runs itself ---------------------------------------
//
// The Python package prunes a transformers model through its own decoder layers, never exported
// whole: the layers are a model of their own (layer_model()), and a CalibrationRunner runs the
// caller's blocks and hands lopper each layer's input. The rules, criteria, OWL and the solver are
// prune_calibrated()'s, segment by segment as on an ONNX graph.

/// A layer of a model the caller runs (a torch nn.Linear, transformers' Conv1D, an nn.Conv2d).
struct ModuleLayer {
  std::string name;         // the module's path ("model.layers.0.mlp.up_proj"): its node's name
  std::string param;        // its weight's parameter name: the initializer's
  std::string op = "Gemm";  // Gemm (weight [out, in]), MatMul (weight [in, out]) or Conv
  at::Tensor weight;        // the parameter itself: pruning reads it and never writes it
  std::vector<int64_t> strides, pads, dilations;  // Conv (pads: begins, then ends)
  int64_t group = 1;                              // Conv
  /// A module that is not a layer and reads the same parameter (a tied token embedding): its
  /// path; "" when none does. Such a weight is left alone unless allow_tied.
  std::string embedding;
};

/// The layers as a model of their own, in the order given (the caller's execution order): one
/// node each, named as the module, reading an input of its own ("<name>:input") and its weight
/// (an initializer named as the parameter, sharing its tensor; two layers of one parameter read
/// one initializer). Throws lopper::Error for an op other than Gemm, MatMul and Conv, or a
/// weight whose rank does not fit it.
ir::Model layer_model(const std::vector<ModuleLayer>& layers);

/// One calibration pass's share of the model, as a CalibrationRunner sees it.
struct CalibrationSegment {
  std::string name;    // a block ("model.layers.3"), a layer of its own (its label), or "the model"
  bool block = false;  // layers named alike (a transformer layer)
  std::vector<std::string> layers;  // the node names of the layers pruned in it
};

/// Runs the caller's model for prune_calibrated(): a segment on every calibration batch, its
/// layers as pruned so far, handing lopper the inputs of the layers it watches.
class CalibrationRunner {
 public:
  virtual ~CalibrationRunner() = default;
  using Observe = std::function<void(const std::string& layer, const at::Tensor& input)>;
  /// Runs `segment` (as pruned so far) on every calibration batch and calls `observe` with each
  /// input of the layers `watched` (node names), as the layer reads it ([..., features]; a Conv:
  /// [N, C, ...]).
  virtual void collect(const CalibrationSegment& segment, const std::vector<std::string>& watched,
                       const Observe& observe) = 0;
  /// `segment`'s layers are pruned: their initializers in the layer model hold the new values.
  /// Runs the segment again, pruned, so that the next one sees its outputs.
  virtual void advance(const CalibrationSegment& segment) = 0;
};

/// prune_calibrated() on a layer model (layer_model()) whose calibration the caller runs. Gradient
/// criteria (grad, taylor) are refused: they need the model's whole graph.
PruneReport prune_calibrated(ir::Model& layers, const PruneOptions& opts, CalibrationRunner& runner,
                             const CalibrationOptions& calib);
PruneReport prune_calibrated(ir::Model& layers, const PruneRecipe& recipe,
                             CalibrationRunner& runner, const CalibrationOptions& calib);

}  // namespace lopper
