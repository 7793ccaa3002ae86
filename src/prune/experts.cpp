// Whole-expert pruning (lopper/experts.h): the criteria, the counts, the choice and the report.
#include "lopper/experts.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <utility>

#include "lopper/error.h"
#include "lopper/report.h"

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
