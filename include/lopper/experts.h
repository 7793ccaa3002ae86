// Whole-expert pruning of mixture-of-experts layers (Mixtral, Qwen2-MoE, Qwen3-MoE and the like):
// each MoE layer loses the experts that matter least, and the model keeps working with the rest
// (its router picks its top-k among fewer experts). What ranks an expert:
//   reap        REAP (Lasby et al. 2025, llm-compressor's REAPPruningModifier): the mean, over the
//               tokens routed to the expert, of its routing weight (as the model's experts receive
//               it: renormalised over the top-k or not, as the model's config says) times the L2
//               norm of its output for that token;
//   frequency   how many tokens the router sends it (top-k selections);
//   activation  the mean L2 norm of its output over the tokens routed to it (Minitron's
//               activation criterion, for experts);
//   random      seeded draws.
// The front end (lopper.prune_structured(model, ..., unit="expert"), python/lopper/_experts.py)
// runs the model and hands over each calibration batch's routing (the top-k indices and weights,
// and each routed token's expert output norm); the criteria, the counts, the choice and the report
// are here. Layer by layer, as llm-compressor's sequential pipeline: a layer is chosen for once its
// batches are in, and the front end removes its experts before the next layer sees any data.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "lopper/data.h"
#include "lopper/prune.h"
#include "lopper/sensitivity.h"
#include "lopper/structured.h"

namespace lopper {

/// One way of ranking experts (a row of expert_criteria()).
struct ExpertCriterionInfo {
  std::string name;
  std::string summary;
  bool needs_data = false;   // ranked on calibration batches
  bool needs_norms = false;  // reads each routed token's expert output norm
};

/// reap, frequency, activation, random (in that order).
const std::vector<ExpertCriterionInfo>& expert_criteria();
/// The criterion called `name`; throws UsageError naming the ones there are.
const ExpertCriterionInfo& expert_criterion_info(const std::string& name);

/// An expert pruning's options, as ExpertRequest::validate() gives them.
struct ExpertOptions {
  std::string criterion = "reap";
  PruneAmount amount;
  uint64_t seed = 0;  // random
};

/// What a front end was given for unit "expert" (lopper.prune_structured's arguments).
struct ExpertRequest {
  std::optional<std::string> criterion;  // reap (default) | frequency | activation | random
  /// A fraction of each layer's experts (int(E * amount) of them go, as llm-compressor's REAP
  /// drops) or a count.
  std::optional<PruneAmount> amount;
  std::optional<uint64_t> seed;
  bool data = false;  // calibration batches given
  /// Options of channel pruning given with it (their library names): each is refused.
  std::vector<std::string> channel_options;
  std::string data_hint;  // how the front end takes data (" (an iterable of batches)")

  /// Throws UsageError naming the first thing wrong: an unknown criterion, no amount, an amount
  /// outside [0, 1] or negative, data missing for a criterion that ranks on it (or given to one
  /// that does not), a channel option.
  ExpertOptions validate() const;
};

/// One MoE layer, as the front end found it in the model.
struct ExpertLayer {
  std::string name;  // the MoE block (the module holding the router and the experts)
  int64_t experts = 0;
  int64_t top_k = 0;  // experts each token is routed to
  /// The parameters one expert holds: its weights and biases and its row of the router.
  int64_t params_per_expert = 0;
};

/// How many of `layer`'s experts `amount` removes: int(experts * amount) for a fraction (as
/// llm-compressor's REAP), the count itself for a count. Throws UsageError when the amount is out
/// of range or when fewer than top_k experts would be left (the router picks top_k of them).
int64_t experts_to_drop(const PruneAmount& amount, const ExpertLayer& layer);

/// One layer's statistics over the calibration batches, kept on the batches' device in double.
class ExpertStats {
 public:
  explicit ExpertStats(int64_t experts = 0) : experts_(experts) {}
  /// One batch: `indices` [T, k] (integers: the experts the router chose for each of T tokens),
  /// `weights` [T, k] (what the experts module multiplies each chosen expert's output by) and
  /// `norms` [T, k] (the L2 norm of expert indices[t, j]'s output for token t; undefined when the
  /// criterion reads none). Throws lopper::Error on shapes that do not match or an index out of
  /// range.
  void add(const at::Tensor& indices, const at::Tensor& weights, const at::Tensor& norms);
  int64_t experts() const { return experts_; }
  /// Tokens routed to each expert (top-k selections) so far.
  std::vector<double> tokens() const;
  /// Each expert's score by `criterion` (reap, frequency, activation): REAP's and activation's
  /// means are over the tokens routed to the expert (0 for an expert none was routed to).
  std::vector<double> scores(const std::string& criterion) const;

 private:
  int64_t experts_ = 0;
  at::Tensor count_, weighted_norm_, norm_;  // [E] double, allocated by the first batch
};

/// The experts a layer keeps and those it loses, both ascending.
struct ExpertChoice {
  std::vector<int64_t> kept, removed;
};
/// Removes the `drop` experts of lowest `scores`; among equal scores the one of lower index goes
/// first.
ExpertChoice choose_experts(const std::vector<double>& scores, int64_t drop);

/// What expert pruning did: one group per MoE layer (kind "expert", layers: the MoE block, the
/// removed experts' indices), each layer's scores, and the model's parameters before and after.
struct ExpertReport {
  StructuredReport structured;  // channels_before/after count experts over the layers
  std::string criterion;
  std::vector<std::vector<double>> scores;  // per group, per expert (its original index)
  std::vector<std::vector<double>> tokens;  // per group, tokens routed to each expert
  std::vector<int64_t> params_per_expert;   // per group (ExpertLayer::params_per_expert)
  int64_t params_before = 0, params_after = 0;
};

/// A whole expert pruning: the options and layers, checked before any work; then, layer by layer,
/// the batches' routing and the choice; last, the report.
class ExpertPruning {
 public:
  /// Throws UsageError when `layers` is empty or when the amount leaves any layer fewer experts
  /// than its top_k, before any work. `options` come from ExpertRequest::validate().
  ExpertPruning(ExpertOptions options, std::vector<ExpertLayer> layers);

  const ExpertCriterionInfo& criterion() const { return *criterion_; }
  const std::vector<ExpertLayer>& layers() const { return layers_; }
  /// How many experts layer `i` loses.
  int64_t drop(size_t i) const { return drop_.at(i); }
  /// The index of the layer called `name`; throws lopper::Error when there is none.
  size_t index(const std::string& name) const;

  /// One calibration batch's routing in layer `i` (ExpertStats::add). Throws lopper::Error once
  /// the layer is chosen.
  void observe(size_t i, const at::Tensor& indices, const at::Tensor& weights,
               const at::Tensor& norms);
  /// Chooses layer `i`'s experts from what it observed (random: from the seed and the layer's
  /// index). Once: a second call returns the same choice.
  const ExpertChoice& choose(size_t i);
  /// Layer `i`'s score per expert (by its index), those choose() ranks by; chooses first.
  const std::vector<double>& scores(size_t i);
  /// The report of the layers chosen so far (in layer order).
  ExpertReport report() const;

 private:
  ExpertOptions options_;
  const ExpertCriterionInfo* criterion_;
  std::vector<ExpertLayer> layers_;
  std::vector<int64_t> drop_;
  std::vector<ExpertStats> stats_;
  std::vector<std::optional<ExpertChoice>> chosen_;
  std::vector<std::vector<double>> scores_;
};

// --- Sensitivity of the MoE layers ------------------------------------------------------------
// lopper.sensitivity(model, ..., structured="expert"): each MoE layer alone loses each share of
// its experts, those expert pruning removes (ranked once, on the unpruned model: only one layer is
// pruned at a time, so no layer's routing changes), and the model's next-token loss and top-1 are
// measured on the same batches; the front end puts the layer back after each point. The front end
// runs the model, removes and restores the experts; the choice, the measures and the curves
// (lopper/sensitivity.h's SensitivityResult, unit "expert") are here.

/// A sweep's options, as ExpertSweepRequest::validate() gives them.
struct ExpertSweepOptions {
  ExpertOptions expert;  // the criterion and seed (its amount is unused)
  std::vector<double> amounts;
  /// The amounts were not given: SensitivityOptions' defaults, less those that would leave some
  /// layer fewer experts than its top-k (ExpertSweep).
  bool default_amounts = false;
  int64_t eval_batches = 16;
};

/// What a front end was given for a sweep over the experts (lopper.sensitivity's arguments).
struct ExpertSweepRequest {
  std::optional<std::string> criterion;        // reap (default) | frequency | activation | random
  std::optional<std::vector<double>> amounts;  // each in [0, 1)
  std::optional<int64_t> eval_batches;
  std::optional<uint64_t> seed;          // random
  std::optional<std::string> loss;       // auto or causal-lm (the same: next-token prediction)
  std::optional<int64_t> calib_batches;  // the batches the experts are ranked on, at most
  bool data = false;                     // the evaluation (and calibration) batches given
  /// Options of the export's sweep given with it (their library names): each is refused.
  std::vector<std::string> other_options;
  std::string data_hint;  // how the front end takes data

  /// Throws UsageError naming the first thing wrong: no data, another option, an unknown
  /// criterion, a seed with another criterion than random, calib_batches with random or < 1, a
  /// loss other than causal-lm, no amount or one outside [0, 1), eval_batches < 1.
  ExpertSweepOptions validate() const;
};

/// One sweep over the MoE layers: the experts ranked once on the calibration batches, then the
/// unpruned model measured, then each layer at each amount, in that order.
class ExpertSweep {
 public:
  /// Throws UsageError, before any work, when `layers` is empty or an amount given would leave a
  /// layer fewer experts than its top_k (experts_to_drop); default amounts that would are left
  /// out.
  ExpertSweep(ExpertSweepOptions options, std::vector<ExpertLayer> layers);

  const ExpertCriterionInfo& criterion() const { return pruning_.criterion(); }
  const std::vector<ExpertLayer>& layers() const { return pruning_.layers(); }
  const std::vector<double>& amounts() const { return options_.amounts; }
  size_t index(const std::string& name) const { return pruning_.index(name); }

  /// One calibration batch's routing in layer `i`, on the unpruned model (ExpertPruning::observe).
  void observe(size_t i, const at::Tensor& indices, const at::Tensor& weights,
               const at::Tensor& norms);
  /// The experts layer `i` loses at amounts()[j]: int(E * amount) of them (experts_to_drop), the
  /// lowest scores first (choose_experts), as expert pruning chooses them.
  ExpertChoice choice(size_t i, size_t j);
  /// Whether point (i, j) must be run: false when it removes no expert (it is the unpruned model)
  /// or the same experts as an earlier amount of the layer (its measures are copied).
  bool needs_run(size_t i, size_t j);

  /// One evaluation batch `b` and the model's logits [B, T, V] on it, for the point being
  /// measured: the causal-LM loss (position t predicts token t + 1 of the labels when the batch
  /// has them [B, T], else of its input IDs; -100 and masked-out positions not counted) and
  /// top-1, per token (lopper/loss.h). Throws lopper::Error when they do not fit.
  void evaluate(const at::Tensor& logits, const Batch& b);
  /// Ends the unpruned model's point (first); `params`: the model's parameters.
  void end_base(int64_t params);
  /// Ends point (i, j), in order after the base: `params`, the model's parameters with the layer
  /// pruned, when it was run (needs_run), none when it was not.
  void end_point(size_t i, size_t j, std::optional<int64_t> params);
  /// The curves: unit "expert", one LayerSensitivity per MoE layer ("experts N: <layer>"), each
  /// point's amount, share of the layer's experts removed, loss, top-1 and parameters (MACs 0:
  /// a token runs top-k experts however many there are).
  SensitivityResult result() const;

 private:
  struct Measure {
    double loss = 0, top1 = 0;
    int64_t params = 0;
  };
  Measure take(std::optional<int64_t> params);

  ExpertSweepOptions options_;
  ExpertPruning pruning_;
  std::vector<std::vector<int64_t>> drop_;  // per layer, per amount
  double sum_ = 0, hits_ = 0;
  int64_t counted_ = 0, samples_ = 0, base_samples_ = 0;
  std::optional<Measure> base_;
  std::vector<std::vector<std::optional<Measure>>> points_;
};

/// The report as text: one row per layer (experts before and after, the mean score, the experts
/// removed), the experts and parameters in total.
std::string to_table(const ExpertReport& r);
/// The report as lopper writes it (StructuredReport's JSON with "experts_before"/"experts" for
/// its channel counts, each group's "scores" and "tokens", "method", parameters before and after).
nlohmann::json to_json(const ExpertReport& r);

}  // namespace lopper
