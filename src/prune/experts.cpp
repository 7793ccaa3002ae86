// Whole-expert pruning (lopper/experts.h): the criteria, the counts, the choice and the report.
#include "lopper/experts.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <utility>

#include "lopper/error.h"
#include "lopper/report.h"
#include "train/loss.h"

namespace lopper {

namespace {

std::string criteria_list() {
  std::string s;
  for (const auto& c : expert_criteria()) s += (s.empty() ? "" : ", ") + c.name;
  return s;
}

// The uniform draws that rank layer `ordinal`'s experts for random: from the seed and the layer
// alone, so that a layer's draw does not depend on the others'.
std::vector<double> random_scores(int64_t experts, uint64_t seed, size_t ordinal) {
  std::seed_seq seq{uint32_t(seed), uint32_t(seed >> 32), uint32_t(ordinal),
                    uint32_t(uint64_t(ordinal) >> 32)};
  std::mt19937_64 gen(seq);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  std::vector<double> s(size_t(std::max<int64_t>(experts, 0)));
  for (double& v : s) v = uniform(gen);
  return s;
}

std::vector<double> to_vector(const at::Tensor& t) {
  const at::Tensor c = t.to(at::kCPU, at::kDouble).contiguous();
  return std::vector<double>(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
}

std::string index_list(const std::vector<int64_t>& v) {
  std::string s;
  for (int64_t i : v) s += (s.empty() ? "" : ", ") + std::to_string(i);
  return "[" + s + "]";
}

// Expert pruning's message `e` as the sweep's ("[sensitivity] ..."), its options still marked.
UsageError sweep_error(const UsageError& e) {
  std::string m = e.render([](const std::string& n) { return "\x1e" + n + "\x1f"; });
  if (m.rfind("[prune] ", 0) == 0) m = m.substr(8);
  return UsageError("[sensitivity] " + m);
}

}  // namespace

const std::vector<ExpertCriterionInfo>& expert_criteria() {
  static const std::vector<ExpertCriterionInfo> table = {
      {"reap",
       "mean over the tokens routed to the expert of its routing weight x the L2 norm of its "
       "output (REAP)",
       true, true},
      {"frequency", "how many tokens the router sends the expert (top-k selections)", true, false},
      {"activation", "mean L2 norm of the expert's output over the tokens routed to it (Minitron)",
       true, true},
      {"random", "seeded random draws", false, false},
  };
  return table;
}

const ExpertCriterionInfo& expert_criterion_info(const std::string& name) {
  for (const auto& c : expert_criteria())
    if (c.name == name) return c;
  throw UsageError("[prune] " LOPPER_OPTION("criterion") " '" + name +
                   "' does not rank experts (" LOPPER_OPTION("unit") " 'expert' takes " +
                   criteria_list() + ")");
}

ExpertOptions ExpertRequest::validate() const {
  for (const std::string& name : channel_options)
    throw UsageError("[prune] \x1e" + name +
                     "\x1f is for channels and heads, not " LOPPER_OPTION("unit") " 'expert'");
  ExpertOptions o;
  const ExpertCriterionInfo& c = expert_criterion_info(criterion.value_or("reap"));
  o.criterion = c.name;
  if (!amount)
    throw UsageError("[prune] " LOPPER_OPTION("unit") " 'expert' needs " LOPPER_OPTION(
        "amount") " (the share of each MoE layer's experts to remove, a fraction in [0, 1], or a "
                  "count)");
  if (amount->is_count) {
    if (!(amount->value >= 0))
      throw UsageError("[prune] " LOPPER_OPTION("amount") " must be a count >= 0, got " +
                       amount->str());
  } else if (!(amount->value >= 0 && amount->value <= 1)) {
    throw UsageError("[prune] " LOPPER_OPTION("amount") " must be in [0, 1], got " + amount->str());
  }
  o.amount = *amount;
  if (seed) {
    if (c.name != "random")
      throw UsageError(
          "[prune] " LOPPER_OPTION("seed") " is for " LOPPER_OPTION("criterion") " random, not " +
          c.name);
    o.seed = *seed;
  }
  if (c.needs_data && !data)
    throw UsageError(
        "[prune] " LOPPER_OPTION("criterion") " " + c.name +
        " ranks experts by how the model routes calibration tokens: give " LOPPER_OPTION("data") +
        data_hint);
  if (!c.needs_data && data)
    throw UsageError("[prune] " LOPPER_OPTION("criterion") " " + c.name +
                     " reads no data: drop " LOPPER_OPTION("data"));
  return o;
}

int64_t experts_to_drop(const PruneAmount& amount, const ExpertLayer& layer) {
  const int64_t e = layer.experts;
  int64_t drop = 0;
  if (amount.is_count) {
    if (!(amount.value >= 0))
      throw UsageError("[prune] " LOPPER_OPTION("amount") " must be a count >= 0, got " +
                       amount.str());
    drop = int64_t(amount.value);
    if (drop > e)
      throw UsageError(fmt::format(
          "[prune] " LOPPER_OPTION("amount") " {} is more than the {} experts of MoE layer "
                                             "'{}'",
          drop, e, layer.name));
  } else {
    if (!(amount.value >= 0 && amount.value <= 1))
      throw UsageError("[prune] " LOPPER_OPTION("amount") " must be in [0, 1], got " +
                       amount.str());
    // NOTE: truncated as Python's int(E * sparsity) (llm-compressor's REAP), the same double
    // product: 0.29 of 100 experts is 28.999999999999996, so 28.
    drop = int64_t(double(e) * amount.value);
  }
  if (e - drop < layer.top_k)
    throw UsageError(fmt::format(
        "[prune] " LOPPER_OPTION("amount") " {} leaves MoE layer '{}' {} of its {} experts, fewer "
                                           "than the {} its router picks for each token (top-k)",
        amount.str(), layer.name, e - drop, e, layer.top_k));
  return drop;
}

void ExpertStats::add(const at::Tensor& indices, const at::Tensor& weights,
                      const at::Tensor& norms) {
  LOPPER_CHECK(indices.defined() && indices.dim() == 2 && !indices.is_floating_point() &&
                   !indices.is_complex() && indices.scalar_type() != at::kBool,
               "[prune] experts: the router's top-k indices must be an integer tensor [tokens, k]");
  const auto shape = indices.sizes();
  LOPPER_CHECK(weights.defined() && weights.sizes() == shape && weights.is_floating_point(),
               "[prune] experts: the routing weights must be a float tensor of the indices' shape "
               "[",
               shape[0], ", ", shape[1], "]");
  if (norms.defined())
    LOPPER_CHECK(norms.sizes() == shape && norms.is_floating_point(),
                 "[prune] experts: the output norms must be a float tensor of the indices' shape [",
                 shape[0], ", ", shape[1], "]");
  if (indices.numel() == 0) return;
  const at::Tensor flat = indices.reshape(-1).to(at::kLong);
  auto [lo, hi] = at::aminmax(flat);
  const int64_t low = lo.item<int64_t>(), high = hi.item<int64_t>();
  LOPPER_CHECK(low >= 0 && high < experts_, "[prune] experts: the router chose expert ",
               low < 0 ? low : high, ", out of range for ", experts_, " experts");
  const auto opts = flat.options().dtype(at::kDouble);
  if (!count_.defined()) {
    count_ = at::zeros({experts_}, opts);
    weighted_norm_ = at::zeros({experts_}, opts);
    norm_ = at::zeros({experts_}, opts);
  }
  count_.index_add_(0, flat.to(count_.device()), at::ones({flat.numel()}, opts));
  if (norms.defined()) {
    const at::Tensor n = norms.reshape(-1).to(opts);
    const at::Tensor w = weights.reshape(-1).to(opts);
    weighted_norm_.index_add_(0, flat, w * n);
    norm_.index_add_(0, flat, n);
  }
}

std::vector<double> ExpertStats::tokens() const {
  if (!count_.defined()) return std::vector<double>(size_t(experts_), 0.0);
  return to_vector(count_);
}

std::vector<double> ExpertStats::scores(const std::string& criterion) const {
  if (!count_.defined()) return std::vector<double>(size_t(experts_), 0.0);
  if (criterion == "frequency") return to_vector(count_);
  // NOTE: llm-compressor's mean: the sum over the routed tokens / max(count, 1), in double.
  const at::Tensor per = count_.clamp_min(1.0);
  if (criterion == "reap") return to_vector(weighted_norm_ / per);
  if (criterion == "activation") return to_vector(norm_ / per);
  LOPPER_ASSERT(false, "no statistics rank experts by '", criterion, "'");
  return {};
}

ExpertChoice choose_experts(const std::vector<double>& scores, int64_t drop) {
  const int64_t n = int64_t(scores.size());
  LOPPER_ASSERT(drop >= 0 && drop <= n, "dropping ", drop, " of ", n, " experts");
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  // NaN ranks lowest (an expert whose output was never finite is the first to go).
  auto less = [&](int64_t a, int64_t b) {
    const double x = scores[size_t(a)], y = scores[size_t(b)];
    if (std::isnan(x) != std::isnan(y)) return std::isnan(x);
    return x < y;
  };
  std::stable_sort(order.begin(), order.end(), less);
  ExpertChoice c;
  c.removed.assign(order.begin(), order.begin() + drop);
  c.kept.assign(order.begin() + drop, order.end());
  std::sort(c.removed.begin(), c.removed.end());
  std::sort(c.kept.begin(), c.kept.end());
  return c;
}

ExpertPruning::ExpertPruning(ExpertOptions options, std::vector<ExpertLayer> layers)
    : options_(std::move(options)),
      criterion_(&expert_criterion_info(options_.criterion)),
      layers_(std::move(layers)) {
  if (layers_.empty())
    throw UsageError(
        "[prune] " LOPPER_OPTION("unit") " 'expert': the model has no mixture-of-experts layer");
  for (const auto& l : layers_) {
    LOPPER_CHECK(l.experts >= 1 && l.top_k >= 1 && l.top_k <= l.experts, "[prune] MoE layer '",
                 l.name, "' has ", l.experts, " experts and routes each token to ", l.top_k);
    drop_.push_back(experts_to_drop(options_.amount, l));
    stats_.emplace_back(l.experts);
  }
  chosen_.resize(layers_.size());
  scores_.resize(layers_.size());
}

size_t ExpertPruning::index(const std::string& name) const {
  for (size_t i = 0; i < layers_.size(); ++i)
    if (layers_[i].name == name) return i;
  throw Error("[prune] no MoE layer '" + name + "'");
}

void ExpertPruning::observe(size_t i, const at::Tensor& indices, const at::Tensor& weights,
                            const at::Tensor& norms) {
  LOPPER_CHECK(i < layers_.size(), "[prune] no MoE layer ", i);
  LOPPER_CHECK(!chosen_[i], "[prune] MoE layer '", layers_[i].name,
               "' has chosen its experts already");
  LOPPER_CHECK(!criterion_->needs_norms || norms.defined(), "[prune] ", criterion_->name,
               " needs the experts' output norms (MoE layer '", layers_[i].name, "')");
  try {
    stats_[i].add(indices, weights, criterion_->needs_norms ? norms : at::Tensor());
  } catch (const Error& e) {
    throw Error("[prune] MoE layer '" + layers_[i].name +
                "': " + std::string(e.what()).substr(std::string("[prune] ").size()));
  }
}

const ExpertChoice& ExpertPruning::choose(size_t i) {
  LOPPER_CHECK(i < layers_.size(), "[prune] no MoE layer ", i);
  if (chosen_[i]) return *chosen_[i];
  scores_[i] = criterion_->needs_data ? stats_[i].scores(criterion_->name)
                                      : random_scores(layers_[i].experts, options_.seed, i);
  chosen_[i] = choose_experts(scores_[i], drop_[i]);
  return *chosen_[i];
}

const std::vector<double>& ExpertPruning::scores(size_t i) {
  (void)choose(i);
  return scores_[i];
}

ExpertReport ExpertPruning::report() const {
  ExpertReport r;
  r.criterion = criterion_->name;
  StructuredReport& s = r.structured;
  for (size_t i = 0; i < layers_.size(); ++i) {
    if (!chosen_[i]) continue;
    const ExpertLayer& l = layers_[i];
    const ExpertChoice& c = *chosen_[i];
    ChannelGroupReport g;
    g.id = int64_t(i);
    g.kind = "expert";
    g.layers = {l.name};
    g.layer_params = {""};
    g.size_before = l.experts;
    g.size_after = int64_t(c.kept.size());
    g.removed = c.removed;
    const std::vector<double>& sc = scores_[i];
    g.score = sc.empty() ? 0.0 : std::accumulate(sc.begin(), sc.end(), 0.0) / double(sc.size());
    s.channels_before += g.size_before;
    s.channels_after += g.size_after;
    if (criterion_->needs_data) {
      const std::vector<double> tokens = stats_[i].tokens();
      int64_t idle = 0;
      for (double t : tokens) idle += t == 0;
      if (idle > 0)
        s.warnings.push_back(fmt::format(
            "MoE layer '{}': {} of its {} experts had no calibration token routed to them (scored "
            "0: the first to go); more data ranks them",
            l.name, idle, l.experts));
      r.tokens.push_back(tokens);
    } else {
      r.tokens.emplace_back();
    }
    r.scores.push_back(sc);
    r.params_per_expert.push_back(l.params_per_expert);
    s.groups.push_back(std::move(g));
  }
  return r;
}

ExpertSweepOptions ExpertSweepRequest::validate() const {
  if (!data)
    throw UsageError("[sensitivity] " LOPPER_OPTION(
                         "data") " is needed: the sweep measures the model's loss on it" +
                     data_hint);
  for (const std::string& name : other_options)
    throw UsageError(
        "[sensitivity] \x1e" + name +
        "\x1f is for the export's sweep, not " LOPPER_OPTION("structured") " 'expert'");
  // The criterion and seed by expert pruning's rules, its messages the sweep's.
  ExpertSweepOptions o;
  const ExpertCriterionInfo* info = nullptr;
  try {
    info = &expert_criterion_info(criterion.value_or("reap"));
    ExpertRequest one;
    one.criterion = criterion;
    one.amount = PruneAmount{};  // each amount is checked below
    one.seed = seed;
    one.data = info->needs_data;
    o.expert = one.validate();
  } catch (const UsageError& e) {
    throw sweep_error(e);
  }
  const ExpertCriterionInfo& c = *info;
  if (calib_batches && !c.needs_data)
    throw UsageError("[sensitivity] " LOPPER_OPTION("criterion") " " + c.name +
                     " reads no calibration batches: drop " LOPPER_OPTION("batches"));
  if (calib_batches && *calib_batches < 1)
    throw UsageError("[sensitivity] " LOPPER_OPTION("batches") " must be >= 1, got " +
                     std::to_string(*calib_batches));
  if (loss && *loss != "auto" && *loss != "causal-lm")
    throw UsageError("[sensitivity] " LOPPER_OPTION("structured") " 'expert' measures the "
                     "model's next-token loss (causal-lm), not " +
                     *loss);
  // NOTE: the amounts and eval_batches follow the export's sweep's rules, checked by its check.
  SensitivityOptions so;
  if (amounts) so.amounts = *amounts;
  if (eval_batches) so.eval_batches = *eval_batches;
  try {
    check_sensitivity_options(so);
  } catch (const Error& e) {
    throw UsageError(e.render([](const std::string& n) { return "\x1e" + n + "\x1f"; }));
  }
  o.amounts = so.amounts;
  o.default_amounts = !amounts;
  o.eval_batches = so.eval_batches;
  return o;
}

ExpertSweep::ExpertSweep(ExpertSweepOptions options, std::vector<ExpertLayer> layers)
    : options_(std::move(options)), pruning_(options_.expert, std::move(layers)) {
  std::vector<double> amounts;
  for (double a : options_.amounts) {
    std::vector<int64_t> drops;
    try {
      for (const ExpertLayer& l : pruning_.layers())
        drops.push_back(experts_to_drop(PruneAmount{a, false}, l));
    } catch (const UsageError& e) {
      if (options_.default_amounts) continue;  // a default the layers cannot take
      throw sweep_error(e);
    }
    amounts.push_back(a);
    for (size_t i = 0; i < drops.size(); ++i) {
      drop_.resize(drops.size());
      drop_[i].push_back(drops[i]);
    }
  }
  LOPPER_CHECK(!amounts.empty(),
               "[sensitivity] every default amount would leave a MoE layer "
               "fewer experts than its top-k: give " LOPPER_OPTION("amounts"));
  options_.amounts = std::move(amounts);
  drop_.resize(pruning_.layers().size());
  points_.assign(pruning_.layers().size(),
                 std::vector<std::optional<Measure>>(options_.amounts.size()));
}

void ExpertSweep::observe(size_t i, const at::Tensor& indices, const at::Tensor& weights,
                          const at::Tensor& norms) {
  pruning_.observe(i, indices, weights, norms);
}

ExpertChoice ExpertSweep::choice(size_t i, size_t j) {
  LOPPER_CHECK(i < drop_.size() && j < options_.amounts.size(), "[sensitivity] no point (", i, ", ",
               j, ")");
  return choose_experts(pruning_.scores(i), drop_[i][j]);
}

bool ExpertSweep::needs_run(size_t i, size_t j) {
  LOPPER_CHECK(i < drop_.size() && j < options_.amounts.size(), "[sensitivity] no point (", i, ", ",
               j, ")");
  // NOTE: the same count removes the same experts (choose_experts ranks the same scores).
  if (drop_[i][j] == 0) return false;
  for (size_t k = 0; k < j; ++k)
    if (drop_[i][k] == drop_[i][j]) return false;
  return true;
}

void ExpertSweep::evaluate(const at::Tensor& logits, const Batch& b) {
  c10::NoGradGuard no_grad;
  LossOptions lo;
  lo.loss = Loss::kCausalLm;
  Objective objective(lo, ModelIO{});
  const Objective::Targets t = objective.targets(logits, b);
  const int64_t n = t.labels.size(0);
  sum_ += objective.loss(t).item<double>() * double(n);
  hits_ += double(Objective::correct(t));
  counted_ += n;
  samples_ += b.size();
}

ExpertSweep::Measure ExpertSweep::take(std::optional<int64_t> params) {
  Measure m;
  LOPPER_ASSERT(params && counted_ > 0, "an expert sweep's point measured on no token");
  m.loss = sum_ / double(counted_);
  m.top1 = hits_ / double(counted_);
  m.params = *params;
  sum_ = hits_ = 0;
  counted_ = 0;
  return m;
}

void ExpertSweep::end_base(int64_t params) {
  LOPPER_ASSERT(!base_, "an expert sweep's unpruned model measured twice");
  base_samples_ = samples_;
  base_ = take(params);
  samples_ = 0;
}

void ExpertSweep::end_point(size_t i, size_t j, std::optional<int64_t> params) {
  LOPPER_ASSERT(base_ && i < points_.size() && j < points_[i].size() && !points_[i][j],
                "an expert sweep's point (", i, ", ", j, ") out of order");
  const bool run = needs_run(i, j);
  LOPPER_ASSERT(run == params.has_value(), "an expert sweep's point (", i, ", ", j, ") ",
                run ? "was not run" : "was run needlessly");
  if (run) {
    points_[i][j] = take(params);
    samples_ = 0;
    return;
  }
  LOPPER_ASSERT(counted_ == 0, "an expert sweep's point (", i, ", ", j, ") measured needlessly");
  std::optional<Measure> same = base_;
  for (size_t k = 0; k < j; ++k)
    if (drop_[i][k] == drop_[i][j]) same = points_[i][k];
  points_[i][j] = same;
}

SensitivityResult ExpertSweep::result() const {
  LOPPER_ASSERT(base_, "an expert sweep's result before its unpruned model was measured");
  SensitivityResult r;
  r.unit = "expert";
  r.method = criterion().name;
  r.loss = base_->loss;
  r.top1 = base_->top1;
  r.samples = base_samples_;
  r.params = base_->params;
  const std::vector<ExpertLayer>& layers = pruning_.layers();
  for (size_t i = 0; i < layers.size(); ++i) {
    const ExpertLayer& l = layers[i];
    LayerSensitivity ls;
    ls.name = fmt::format("experts {}: {}", i, l.name);
    ls.layers = {l.name};
    ls.params = l.experts * l.params_per_expert;
    for (size_t j = 0; j < options_.amounts.size(); ++j) {
      LOPPER_ASSERT(points_[i][j], "an expert sweep's point (", i, ", ", j, ") never measured");
      SensitivityPoint p;
      p.amount = options_.amounts[j];
      p.removed = double(drop_[i][j]) / double(l.experts);
      p.loss = points_[i][j]->loss;
      p.top1 = points_[i][j]->top1;
      p.params = points_[i][j]->params;
      ls.points.push_back(p);
    }
    r.layers.push_back(std::move(ls));
  }
  return r;
}

std::string to_table(const ExpertReport& r) {
  std::vector<std::string> names;
  for (const auto& g : r.structured.groups) names.push_back(g.layers.at(0));
  const size_t w = name_column_width(names, 5);
  std::string s = fmt::format("{:<{}}  {:>7} {:>6} {:>12}  {}\n", "layer", w, "experts", "after",
                              r.criterion, "removed");
  for (const auto& g : r.structured.groups)
    s += fmt::format("{:<{}}  {:>7} {:>6} {:>12.4g}  {}\n", fit_name(g.layers.at(0), w), w,
                     g.size_before, g.size_after, g.score, index_list(g.removed));
  auto pct = [](int64_t a, int64_t b) { return b ? 100.0 * (1.0 - double(a) / double(b)) : 0.0; };
  const int64_t a = r.structured.channels_after, b = r.structured.channels_before;
  s += fmt::format("\nexperts  {:>14}  (was {}, -{:.1f}%)\n", a, b, pct(a, b));
  s += fmt::format("params   {:>14}  (was {}, -{:.1f}%)\n", r.params_after, r.params_before,
                   pct(r.params_after, r.params_before));
  return s;
}

nlohmann::json to_json(const ExpertReport& r) {
  nlohmann::json j = to_json(r.structured);
  j.erase("channels_before");
  j.erase("channels");
  j["experts_before"] = r.structured.channels_before;
  j["experts"] = r.structured.channels_after;
  j["method"] = r.criterion;
  for (size_t i = 0; i < j["groups"].size() && i < r.scores.size(); ++i) {
    j["groups"][i]["scores"] = r.scores[i];
    if (!r.tokens[i].empty()) j["groups"][i]["tokens"] = r.tokens[i];
  }
  j["params_before"] = r.params_before;
  j["params"] = r.params_after;
  return j;
}

}  // namespace lopper
