// The steps prune() is made of (internal): which layers a PruneOptions or a recipe prunes and how,
// each layer's keep-mask, and the masks applied to the model. prune() runs them over every layer at
// once; prune_calibrated() (oneshot.cpp) runs them block by block between calibration passes.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "lopper/prune.h"
#include "prune/sparsegpt.h"

namespace lopper {

namespace importance {
struct Criterion;
}
struct LayerInput;  // prune/layer_inputs.h

/// One prunable weight of the model being pruned.
struct Target {
  const ir::Node* node = nullptr;
  PrunableWeight weight;
  ir::Initializer* init = nullptr;
  int64_t in_axis = -1, out_axis = -1;  // axes of the initializer, -1 when there is none
  size_t report = 0;                    // index in PruneReport::layers
};

/// What prune() will do: every prunable weight with its report row (skipped ones with why), the
/// ones to prune and each one's options.
struct PrunePlan {
  PruneReport report;
  std::vector<Target> all;
  std::vector<Target> targets;
  std::vector<const PruneLayerOptions*> how;  // per target; point into the options or the recipe
  /// Per target: the random stream it draws from (a recipe's rule, its defaults, or the options'
  /// one), each seeded with its own seed and drawn in layer order.
  std::vector<size_t> stream;
  PruneScope scope = PruneScope::kLocal;

  /// Target i's generator.
  at::Generator& generator(size_t i);

 private:
  std::map<size_t, at::Generator> generators_;
};

/// Checks `opts` and picks the layers it prunes. Throws lopper::Error when nothing is left to
/// prune.
PrunePlan plan_prune(ir::Model& model, const PruneOptions& opts);
/// The same for a recipe (local scope): each layer as the first rule that matches it says.
PrunePlan plan_prune(ir::Model& model, const PruneRecipe& recipe);

/// "l1 global 2:4", "|w| < 0.01" / "0.5": the report's method and amount for `o`.
std::string method_string(const PruneLayerOptions& o, PruneScope scope);
std::string amount_string(const PruneLayerOptions& o);

/// The scores ranking a layer's weights for a kScores criterion (undefined for the others, which
/// read |w| or draw at random).
/// `input`: the layer's inputs, for a criterion that reads them.
at::Tensor layer_score(const Target& t, const importance::Criterion& c, const Saliency* saliency,
                       const LayerInput* input = nullptr);
/// One layer's keep-mask (true = keep) under `o`, local scope. `where` names the layer in errors.
/// `score`: the criterion's scores ranking the weights instead of |w|.
at::Tensor layer_keep(const Target& t, const PruneLayerOptions& o, at::Generator& gen,
                      const std::string& where, const at::Tensor& score);

/// Target `t`'s weight pruned under `o` by the criterion that reconstructs the layer (sparsegpt),
/// from the factor of its inputs' Hessian (sparsegpt_factor() of their Gram matrix under
/// o.dampening; layers of the same inputs share one): the new value, in the weight's layout and
/// type (the weight itself is not written). `nonzero`: its weights left, for a count amount.
at::Tensor layer_solve(const Target& t, const PruneLayerOptions& o, const SparseGptFactor& factor,
                       int64_t nonzero);

/// Zeroes the weights each `drop` mask flags (in place when nothing else holds the tensor) and
/// sets the targets' nonzero_after; the masks are released as they are used.
void apply_masks(const std::vector<Target>& targets, std::vector<at::Tensor>& drop,
                 PruneReport& report);
/// The report's totals over every layer, and the warning for a layer left without any weight.
void finish_report(PruneReport& report);

}  // namespace lopper
