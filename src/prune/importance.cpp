// The criteria table. Each entry says what it needs and how it ranks single weights and channel
// slices; everything that prunes reads these fields, never a criterion's name.
#include "prune/importance.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>

#include "lopper/error.h"
#include "lopper/prune.h"
#include "prune/layer_inputs.h"

namespace lopper::importance {

namespace {

// A tensor as one row per index along `axis`, in double.
at::Tensor rows(const at::Tensor& t, int64_t axis) {
  return t.to(at::kDouble).movedim(axis, 0).reshape({t.size(axis), -1});
}

// A gradient criterion's scores: its entry of the Saliency, in the reader's view.
at::Tensor from_saliency(const WeightInput& in) {
  if (!in.saliency) return {};
  auto c = in.saliency->scores.find(in.criterion.name);
  if (c == in.saliency->scores.end()) return {};
  auto it = c->second.find(in.name);
  if (it == c->second.end()) return {};
  return in.perm.empty() ? it->second : it->second.permute(in.perm);
}

// LAMP (Lee et al. 2021): w^2 over the sum of the squares of the layer's weights not smaller
// than it, so that scores compare across layers. Zeros score 0. A NaN or infinite weight scores
// NaN or +Inf (ranked largest, as torch ranks NaN) and is left out of the other weights' sums,
// which it would otherwise make NaN or infinite for the whole layer.
at::Tensor lamp(const WeightInput& in) {
  const at::Tensor sq = in.w.to(at::kCPU, at::kDouble).flatten().square();
  const at::Tensor finite = sq.isfinite();
  auto [sorted, order] = at::where(finite, sq, at::zeros_like(sq)).sort();
  // suffix sums: sum_{v >= u} w_v^2 over the sorted squares (the zeros, first, add nothing)
  const at::Tensor suffix = sorted.flip(0).cumsum(0).flip(0);
  const at::Tensor score = at::where(sorted.gt(0), sorted / suffix, at::zeros_like(sorted));
  const at::Tensor out = at::zeros_like(score).index_put_({order}, score);
  return at::where(finite, out, sq).to(at::kFloat).reshape(in.w.sizes());
}

// Wanda (Sun et al. 2023): |w_ij| * ||x_j||_2, the weight times the norm of the input feature it
// multiplies over every calibration token. Features are the weight's axes but the output one, in
// memory order (a Conv's C x kh x kw, as im2col lays out its patches).
at::Tensor wanda(const WeightInput& in) {
  if (!in.input || !in.input->sq_norm.defined() || in.out_axis < 0) return {};
  const at::Tensor w = in.w.to(at::kCPU).movedim(in.out_axis, 0);
  const at::Tensor norm = in.input->sq_norm.sqrt().to(at::kCPU, at::kFloat);
  LOPPER_CHECK(norm.numel() * w.size(0) == w.numel(), "[prune] wanda: '", in.name, "' has ",
               w.numel() / std::max<int64_t>(w.size(0), 1), " inputs per output, its layer read ",
               norm.numel());
  return (w.abs().reshape({w.size(0), -1}) * norm.unsqueeze(0))
      .reshape(w.sizes())
      .movedim(0, in.out_axis)
      .contiguous();
}

at::Tensor l2_term(const SliceInput& s) {
  if (!s.weight_out && !s.weight_in) return {};
  return rows(s.value, s.axis).pow(2).sum(1);
}
double square_root(double sum) { return std::sqrt(sum); }

at::Tensor bn_term(const SliceInput& s) {
  if (!s.norm_scale) return {};
  return s.value.to(at::kDouble).abs().reshape({-1});
}

at::Tensor fpgm_term(const SliceInput& s) {
  if (!s.weight_out) return {};
  at::Tensor r = rows(s.value, s.axis);
  return at::cdist(r, r).sum(1);
}

std::vector<Criterion> make_table() {
  std::vector<Criterion> t;
  auto add = [&](Criterion c) { t.push_back(c); };
  {
    Criterion c{"abs", "weights with |w| under a threshold"};
    c.weights = WeightRank::kThreshold;
    add(c);
  }
  {
    Criterion c{"l1", "the smallest |w|; channels by the L1 norm of their weights"};
    c.weights = WeightRank::kMagnitude;
    c.slices = SliceRank::kWeightScores;
    add(c);
  }
  {
    Criterion c{"l2", "channels by the L2 norm of their weights"};
    c.slices = SliceRank::kCustom;
    c.slice_scores = l2_term;
    c.finish = square_root;
    add(c);
  }
  {
    Criterion c{"bn", "channels by |gamma| of their normalisation layer (network slimming)"};
    c.slices = SliceRank::kCustom;
    c.slice_scores = bn_term;
    c.unscored = "no normalisation scale to rank by (--method bn)";
    add(c);
  }
  {
    Criterion c{"fpgm", "filters by their distance to the layer's others (geometric median)"};
    c.slices = SliceRank::kCustom;
    c.slice_scores = fpgm_term;
    add(c);
  }
  {
    Criterion c{"lamp", "|w| rescaled per layer (LAMP) so that global scope compares layers"};
    c.weights = WeightRank::kScores;
    c.weight_scores = lamp;
    add(c);
  }
  {
    Criterion c{"random", "uniformly at random (seeded): the baseline"};
    c.weights = WeightRank::kDrawn;
    c.slices = SliceRank::kDrawn;
    add(c);
  }
  {
    Criterion c{"grad", "the smallest mean |dL/dw| over calibration batches"};
    c.needs = Needs::kGradients;
    c.weights = WeightRank::kScores;
    c.weight_scores = from_saliency;
    c.gradient_term = [](const at::Tensor&, const at::Tensor& g) { return g.abs(); };
    c.mean_over_batches = true;
    add(c);
  }
  {
    Criterion c{"taylor", "the smallest first-order Taylor saliency sum |w * dL/dw|"};
    c.needs = Needs::kGradients;
    c.weights = WeightRank::kScores;
    c.weight_scores = from_saliency;
    c.gradient_term = [](const at::Tensor& w, const at::Tensor& g) { return (w * g).abs(); };
    c.slices = SliceRank::kWeightScores;
    add(c);
  }
  {
    Criterion c{"wanda", "the smallest |w| x ||input||_2 within each output row (Wanda)"};
    c.needs = Needs::kActivations;
    c.weights = WeightRank::kScores;
    c.weight_scores = wanda;
    c.per_row = true;
    add(c);
  }
  {
    // Minitron (Muralidharan et al. 2024): a channel by the mean over batches and positions of
    // |x| in the tensors that layers read it from (prune/activations.h), a head by the mean L2
    // norm of its features there.
    Criterion c{"activation",
                "channels by their mean |activation| on calibration data, heads by the mean L2 "
                "norm of their outputs (Minitron)"};
    c.needs = Needs::kActivations;
    c.slices = SliceRank::kActivations;
    c.unscored = "no layer with a weight reads its channels (--method activation)";
    add(c);
  }
  {
    Criterion c{"sparsegpt",
                "SparseGPT: removes by the inverse Hessian of the layer's inputs and updates the "
                "kept weights to reconstruct its output"};
    c.needs = Needs::kActivations;
    c.weights = WeightRank::kReconstruct;
    c.needs_gram = true;
    add(c);
  }
  return t;
}

bool used_for(const Criterion& c, Use use) {
  return use == Use::kWeights ? c.ranks_weights() : c.ranks_channels();
}

}  // namespace

const std::vector<Criterion>& criteria() {
  static const std::vector<Criterion> table = make_table();
  return table;
}

std::string names(Use use, bool (*keep)(const Criterion&), const char* last) {
  std::vector<const char*> all;
  for (const auto& c : criteria())
    if (used_for(c, use) && (!keep || keep(c))) all.push_back(c.name);
  std::string s;
  for (size_t i = 0; i < all.size(); ++i)
    s += (i == 0 ? "" : i + 1 == all.size() ? last : ", ") + std::string(all[i]);
  return s;
}

const Criterion& find(const std::string& name, Use use) {
  for (const auto& c : criteria())
    if (name == c.name && used_for(c, use)) return c;
  throw Error(std::string("[prune] unknown ") + (use == Use::kChannels ? "structured " : "") +
              "method '" + name + "' (methods: " + names(use) + ")");
}

CriterionInfo info(const Criterion& c) {
  CriterionInfo i;
  i.name = c.name;
  i.needs_data = c.needs_data();
  if (i.needs_data) i.data_needed = data_needed(c);
  i.summary = c.summary;
  return i;
}

std::vector<CriterionInfo> infos(Use use, CriterionInfo (*info_of)(const std::string& name)) {
  std::vector<CriterionInfo> out;
  for (const auto& c : criteria())
    if (used_for(c, use)) out.push_back(info_of(c.name));
  return out;
}

std::string data_needed(const Criterion& c) {
  return c.needs == Needs::kActivations ? "by the layers' inputs" : "by their gradients";
}

at::Tensor weight_scores(const WeightInput& in) {
  switch (in.criterion.weights) {
    case WeightRank::kMagnitude:
    case WeightRank::kThreshold:
      return in.w.abs();
    case WeightRank::kScores:
      return in.criterion.weight_scores(in);
    case WeightRank::kNone:
    case WeightRank::kDrawn:
    case WeightRank::kReconstruct:
      break;
  }
  LOPPER_ASSERT(false, "criterion ", in.criterion.name, " has no per-weight scores");
  return {};
}

GradientStats::GradientStats(const std::string& only) {
  for (const auto& c : criteria())
    if (c.gradient_term && (only.empty() || only == c.name)) criteria_.push_back(&c);
}

void GradientStats::track(const std::string& name, const at::Tensor& like) {
  std::vector<at::Tensor> zeros;
  for (size_t i = 0; i < criteria_.size(); ++i)
    zeros.push_back(at::zeros_like(like, at::kFloat).detach());
  sums_.emplace_back(name, std::move(zeros));
}

void GradientStats::add(const std::string& name, const at::Tensor& w, const at::Tensor& g) {
  auto it =
      std::find_if(sums_.begin(), sums_.end(), [&](const auto& s) { return s.first == name; });
  if (it == sums_.end()) {
    sums_.emplace_back(name, std::vector<at::Tensor>(criteria_.size()));
    it = sums_.end() - 1;
  }
  for (size_t i = 0; i < criteria_.size(); ++i) {
    at::Tensor term = criteria_[i]->gradient_term(w, g).to(at::kFloat);
    at::Tensor& sum = it->second[i];
    if (sum.defined())
      sum.add_(term);
    else
      sum = term.clone();
  }
}

void GradientStats::fill(Saliency& out) const {
  out.batches = batches_;
  for (size_t i = 0; i < criteria_.size(); ++i) {
    auto& by_weight = out.scores[criteria_[i]->name];
    for (const auto& [name, sums] : sums_) {
      const at::Tensor& s = sums[i];
      by_weight[name] =
          (criteria_[i]->mean_over_batches ? s / double(std::max<int64_t>(batches_, 1)) : s).cpu();
    }
  }
}

void GradientStats::clear() {
  sums_.clear();
  batches_ = 0;
}

at::Tensor activation_terms(const Criterion& c, const Saliency* saliency,
                            const std::string& value) {
  if (!saliency) return {};
  auto by_value = saliency->scores.find(c.name);
  if (by_value == saliency->scores.end()) return {};
  auto it = by_value->second.find(value);
  return it == by_value->second.end() ? at::Tensor() : it->second;
}

std::string non_finite_warning(const std::string& name, const at::Tensor& w) {
  if (!at::isFloatingType(w.scalar_type())) return "";
  const int64_t bad = w.isfinite().logical_not().sum().item<int64_t>();
  if (!bad) return "";
  return detail::concat("weight '", name, "' holds ", bad, " non-finite value", bad == 1 ? "" : "s",
                        " (NaN or Inf): ranked as the largest, never below a threshold; the "
                        "model's outputs will not be finite");
}

}  // namespace lopper::importance
