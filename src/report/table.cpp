// The text form of every pruning report (lopper/report.h): what the CLI prints, and what a
// report object prints as in a program embedding lopper.
#include "lopper/report.h"

#include <fmt/format.h>

#include <algorithm>

#include "lopper/analysis.h"
#include "lopper/prune.h"
#include "lopper/report.h"
#include "lopper/sensitivity.h"
#include "lopper/structured.h"
#include "lopper/target.h"
#include "lopper/train.h"

namespace lopper {

size_t name_column_width(const std::vector<std::string>& names, size_t min) {
  size_t w = min;
  for (const auto& n : names) w = std::max(w, n.size());
  return std::min<size_t>(w, 48);
}

std::string fit_name(const std::string& name, size_t width) {
  return name.size() > width ? "…" + name.substr(name.size() - width + 1) : name;
}

std::string to_table(const PruneReport& r) {
  std::vector<std::string> names;
  for (const auto& l : r.layers) names.push_back(l.label());
  const size_t w = name_column_width(names, 5);
  std::string s = fmt::format("{:<{}}  {:<13} {:>12} {:>12} {:>12} {:>9}  {}\n", "layer", w, "op",
                              "params", "nonzero was", "nonzero", "sparsity", "method");
  for (const auto& l : r.layers) {
    std::string how = l.skipped.empty() ? l.method + " " + l.amount : "skipped: " + l.skipped;
    if (l.skipped.empty() && !l.rule.empty()) how += "  [" + l.rule + "]";
    if (l.skipped.empty() && !l.shared.empty()) {  // pruned for every reader at once
      std::string with;
      for (size_t i = 0; i < l.shared.size() && i < 2; ++i)
        with += (i ? ", " : "") + l.shared[i].describe();
      if (l.shared.size() > 2) with += fmt::format(" (+{})", l.shared.size() - 2);
      how += "  [shared with " + with + "]";
    }
    s += fmt::format("{:<{}}  {:<13} {:>12} {:>12} {:>12} {:>8.1f}%  {}\n", fit_name(l.label(), w),
                     w, l.op, l.params, l.nonzero_before, l.nonzero_after, 100 * l.sparsity(), how);
  }
  const double sparsity = r.params ? 1.0 - double(r.nonzero_after) / double(r.params) : 0.0;
  s += fmt::format("\nprunable params {:>14}\nnonzero         {:>14}  (was {}, sparsity {:.1f}%)\n",
                   r.params, r.nonzero_after, r.nonzero_before, 100.0 * sparsity);
  return s;
}

std::string to_table(const StructuredReport& r) {
  std::string s = fmt::format("{:>5}  {:<7} {:>8} {:>8} {:>12}  {}\n", "group", "kind", "before",
                              "after", "score", "layers");
  for (const auto& g : r.groups) {
    std::string layers;
    for (size_t i = 0; i < g.layers.size() && i < 3; ++i)
      layers += (i ? ", " : "") + g.layer_label(i);
    if (g.layers.size() > 3) layers += fmt::format(" (+{})", g.layers.size() - 3);
    if (g.params > 0) layers = fmt::format("{} params: ", g.params) + layers;
    if (!g.blocked.empty()) layers += "  [kept: " + g.blocked + "]";
    s += fmt::format("{:>5}  {:<7} {:>8} {:>8} {:>12.4g}  {}\n", g.id, g.kind, g.size_before,
                     g.size_after, g.score, layers);
  }
  const int64_t a = r.channels_after, b = r.channels_before;
  s += fmt::format("\n{:<8} {:>14}  (was {}, -{:.1f}%)\n", r.counted, a, b,
                   b ? 100.0 * (1.0 - double(a) / double(b)) : 0.0);
  return s;
}

std::string cost_change(const ModelCost& before, const ModelCost& after) {
  auto pct = [](int64_t a, int64_t b) { return b ? 100.0 * (1.0 - double(a) / double(b)) : 0.0; };
  return fmt::format("params   {:>14}  (was {}, -{:.1f}%)\n", after.params, before.params,
                     pct(after.params, before.params)) +
         fmt::format("MACs     {:>14}  (was {}, -{:.1f}%)\n", after.macs, before.macs,
                     pct(after.macs, before.macs));
}

std::string to_table(const TargetReport& r, bool structured, bool with_sensitivity) {
  std::vector<std::string> names;
  for (const auto& u : r.units) names.push_back(u.label());
  const size_t w = name_column_width(names, 5);
  std::string s = fmt::format("{:<{}}  {:>8}{}\n", structured ? "group" : "layer", w, "amount",
                              with_sensitivity ? "  est. loss +" : "");
  for (const auto& u : r.units)
    s += fmt::format("{:<{}}  {:>7.1f}%{}\n", fit_name(u.label(), w), w, 100 * u.amount,
                     with_sensitivity ? fmt::format("  {:>11.4f}", u.est_loss_increase) : "");
  return s;
}

std::string target_summary(const TargetReport& r, double value, const SensitivityResult* sens,
                           const EvalResult* measured, const ModelCost& before,
                           const ModelCost& after) {
  const bool latency = r.kind == TargetKind::kLatency;
  auto fmt_cost = [&](double v) {
    return latency ? fmt::format("{:.3f} ms", v) : fmt::format("{:.0f}", v);
  };
  std::string s =
      fmt::format("target   {} {} = {} (estimator: {}, {} round{})\n", target_name(r.kind),
                  latency ? fmt_cost(value) : fmt::format("{:g} of {}", value, fmt_cost(r.before)),
                  fmt_cost(r.target), r.estimator, r.rounds, r.rounds == 1 ? "" : "s") +
      fmt::format("result   predicted {}, measured {}\n", fmt_cost(r.predicted),
                  fmt_cost(r.measured));
  if (sens)
    s += fmt::format(
        "loss     {:.4f} unpruned, {:.4f} predicted (sum of the layers' "
        "increases){}\n",
        r.base_loss, r.predicted_loss,
        measured ? fmt::format(", {:.4f} measured", measured->loss) : "");
  if (sens && measured)
    s += fmt::format(
        "top-1    {:.2f}% unpruned, {:.2f}% measured (on the same {} "
        "samples, before fine-tuning)\n",
        100 * sens->top1, 100 * measured->top1, measured->samples);
  const EffectiveCost eb = effective_cost(before), ea = effective_cost(after);
  s += fmt::format("params   {:>14}  (nonzero {}, was {})\n", after.params, after.nonzero,
                   before.nonzero) +
       fmt::format("MACs     {:>14}  (was {}; on nonzero weights {}, was {})\n", after.macs,
                   before.macs, ea.macs, eb.macs);
  return s;
}

std::string to_table(const SensitivityResult& r) {
  std::vector<std::string> names;
  for (const auto& l : r.layers) names.push_back(l.label());
  const size_t w = name_column_width(names, 12);
  std::string s = fmt::format(
      "top-1 with one {} pruned alone{} (unpruned: {:.2f}%, loss {:.4f}, {} "
      "samples)\n",
      r.unit == "channel"         ? "channel group"
      : r.unit == "block"         ? "residual block"
      : r.unit == "channel+block" ? "channel group or residual block"
                                  : "layer",
      r.method.empty() || r.unit == "block" ? std::string() : " by " + r.method, 100 * r.top1,
      r.loss, r.samples);
  // The amounts' columns (a channel group's or a weight's); a block's one point, the block
  // removed, in a column of its own.
  size_t columns = 0;
  bool blocks = false;
  std::string head =
      fmt::format("{:<{}} {:>10}", r.unit == "channel" ? "group" : "layer", w, "params");
  for (const auto& l : r.layers) {
    if (l.block >= 0) {
      blocks = true;
      continue;
    }
    if (columns) continue;
    for (const auto& p : l.points) head += fmt::format(" {:>7}", fmt::format("{:g}", p.amount));
    columns = l.points.size();
  }
  if (blocks) head += fmt::format(" {:>7}", "removed");
  s += head + "\n";
  for (const auto& l : r.layers) {
    std::string line = fmt::format("{:<{}} {:>10}", fit_name(l.label(), w), w, l.params);
    if (l.block >= 0) line += std::string(8 * columns, ' ');
    for (const auto& p : l.points) line += fmt::format(" {:>6.2f}%", 100 * p.top1);
    s += line + "\n";
  }
  for (const auto& why : r.skipped) s += "not analysed: " + why + "\n";
  return s;
}

std::string eval_summary(const EvalResult& r) {
  if (r.tokens > 0)
    return fmt::format("loss {:.4f}  perplexity {:.2f}  top-1 {:.2f}% of {} tokens  ({} samples)",
                       r.loss, r.perplexity, 100 * r.top1, r.tokens, r.samples);
  return fmt::format("top-1 {:.2f}%  top-5 {:.2f}%  loss {:.4f}  ({} samples)", 100 * r.top1,
                     100 * r.top5, r.loss, r.samples);
}

}  // namespace lopper
