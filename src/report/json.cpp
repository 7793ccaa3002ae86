// The JSON form of every report (lopper/report.h): what the CLI writes beside a model and prints
// with --json, and what a program embedding lopper can store the same way.
#include <fmt/format.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "lopper/analysis.h"
#include "lopper/prune.h"
#include "lopper/report.h"
#include "lopper/structured.h"
#include "lopper/target.h"
#include "lopper/train.h"

namespace lopper {

nlohmann::json to_json(const PruneReport& r) {
  nlohmann::json j;
  j["params"] = r.params;
  j["nonzero_before"] = r.nonzero_before;
  j["nonzero"] = r.nonzero_after;
  j["sparsity"] = r.params ? 1.0 - double(r.nonzero_after) / double(r.params) : 0.0;
  j["warnings"] = r.warnings;
  j["layers"] = nlohmann::json::array();
  for (const auto& l : r.layers) {
    nlohmann::json jl = {{"name", l.name},
                         {"op", l.op},
                         {"weight", l.weight},
                         {"param", l.param},
                         {"shape", l.shape},
                         {"params", l.params},
                         {"nonzero_before", l.nonzero_before},
                         {"nonzero", l.nonzero_after},
                         {"sparsity", l.sparsity()},
                         {"method", l.method},
                         {"amount", l.amount}};
    if (!l.skipped.empty()) jl["skipped"] = l.skipped;
    if (!l.rule.empty()) jl["rule"] = l.rule;
    if (!l.shared.empty()) {
      jl["shared"] = nlohmann::json::array();
      for (const auto& u : l.shared) {
        nlohmann::json ju = {{"node", u.node}, {"op", u.op}, {"use", u.use}};
        if (!u.module.empty()) ju["module"] = u.module;
        jl["shared"].push_back(ju);
      }
    }
    j["layers"].push_back(jl);
  }
  return j;
}

nlohmann::json to_json(const StructuredReport& r) {
  nlohmann::json j;
  j[r.counted + "_before"] = r.channels_before;  // channels_before / blocks_before
  j[r.counted] = r.channels_after;
  j["barriers"] = r.barriers;
  j["warnings"] = r.warnings;
  j["groups"] = nlohmann::json::array();
  for (const auto& g : r.groups) {
    nlohmann::json jg = {{"id", g.id},
                         {"kind", g.kind},
                         {"layers", g.layers},
                         {"layer_params", g.layer_params},
                         {"size_before", g.size_before},
                         {"size_after", g.size_after},
                         {"score", g.score},
                         {"removed", g.removed}};
    if (!g.blocked.empty()) jg["blocked"] = g.blocked;
    if (g.blocks > 1) jg["blocks"] = g.blocks;
    if (!g.rule.empty()) jg["rule"] = g.rule;
    if (g.params > 0) jg["params"] = g.params;
    j["groups"].push_back(jg);
  }
  return j;
}

nlohmann::json to_json(const TargetReport& r, bool with_sensitivity) {
  nlohmann::json j;
  j["target"] = {{"kind", target_name(r.kind)}, {"goal", r.target},
                 {"before", r.before},          {"predicted", r.predicted},
                 {"measured", r.measured},      {"estimator", r.estimator},
                 {"rounds", r.rounds}};
  if (r.kind == TargetKind::kLatency) {
    j["target"]["latency_spread"] = r.latency_widest.spread;  // the widest p90 / median
    if (r.latency_wide > 0)
      j["target"]["latency_warning"] =
          fmt::format("{} of {} latency measurements: {}", r.latency_wide, r.latency_measurements,
                      r.latency_widest.warning());
  }
  if (with_sensitivity)
    j["target"]["loss"] = {{"base", r.base_loss}, {"predicted", r.predicted_loss}};
  if (!r.warnings.empty()) j["target"]["warnings"] = r.warnings;
  j["layers"] = nlohmann::json::array();
  for (const auto& u : r.units) {
    nlohmann::json ju = {{"name", u.name}, {"layers", u.layers}, {"amount", u.amount}};
    if (!u.weight.empty()) ju["weight"] = u.weight;
    if (!u.param.empty()) ju["param"] = u.param;
    if (u.group >= 0) ju["group"] = u.group;
    if (u.block >= 0) ju["block"] = u.block;
    if (with_sensitivity) ju["est_loss_increase"] = u.est_loss_increase;
    j["layers"].push_back(ju);
  }
  return j;
}

nlohmann::json to_json(const TrainResult& r) {
  nlohmann::json j;
  j["epochs"] = nlohmann::json::array();
  for (const auto& e : r.epochs) {
    nlohmann::json je = {{"epoch", e.epoch},
                         {"loss", e.loss},
                         {"accuracy", e.accuracy},
                         {"samples_per_s", e.samples_per_s},
                         {"lr", e.lr},
                         {"sparsity", e.sparsity},
                         {"seconds", e.seconds},
                         {"skipped_steps", e.skipped_steps}};
    // Distillation's terms apart (task_loss null: no labels).
    if (e.distilled) {
      je["task_loss"] = e.task_loss;
      je["distill_kl"] = e.distill_kl;
      je["distill_state"] = e.distill_state;
      je["teacher_agreement"] = e.teacher_agreement;
    }
    j["epochs"].push_back(je);
  }
  j["notes"] = r.notes;
  return j;
}

void put_costs(nlohmann::json& j, const ModelCost& before, const ModelCost& after) {
  j["params_before"] = before.params;
  j["params"] = after.params;
  j["macs_before"] = before.macs;
  j["macs"] = after.macs;
}

nlohmann::json to_json(const EvalResult& r) {
  nlohmann::json j = {{"top1", r.top1},
                      {"top5", r.top5},
                      {"loss", r.loss},
                      {"loss_kind", r.loss_kind},
                      {"samples", r.samples}};
  if (r.tokens > 0) {
    j["tokens"] = r.tokens;
    j["perplexity"] = r.perplexity;
  }
  j["per_class"] = nlohmann::json::array();
  for (size_t c = 0; c < r.per_class.size(); ++c)
    j["per_class"].push_back(
        {{"class", c},
         {"samples", c < r.per_class_count.size() ? r.per_class_count[c] : 0},
         {"accuracy",
          std::isnan(r.per_class[c]) ? nlohmann::json() : nlohmann::json(r.per_class[c])}});
  return j;
}

}  // namespace lopper
