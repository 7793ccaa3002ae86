// Pruning to a target (lopper/target.h): the allocation of per-layer amounts and its measurement.
#include "lopper/target.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "lopper/analysis.h"
#include "lopper/depth.h"
#include "lopper/error.h"
#include "lopper/executor.h"
#include "lopper/onnx_io.h"
#include "prune/importance.h"
#include "prune/layer_filter.h"
#include "prune/masks.h"
#include "prune/sparsegpt.h"

namespace lopper {
namespace {

// One unit's options: amounts with the cost they save and the loss they add (nondecreasing).
struct Curve {
  std::vector<double> amount, saved, dloss;
};

// The target's option, marked for an Error's message: "target_macs", "target_params",
// "target_latency" (the CLI says --target-macs, --target-params, --target-latency-ms).
std::string target_option(TargetKind k) {
  return std::string("\x1e") + "target_" + target_name(k) + "\x1f";
}

bool reads_inputs(const importance::Criterion& c) {
  return c.needs == importance::Needs::kActivations;
}

}  // namespace

SensitivityOptions sensitivity_options(const TargetOptions& o) {
  SensitivityOptions so;
  so.structured = o.structured;
  so.blocks = o.blocks;
  so.criterion = o.criterion;
  so.round_to = o.round_to;
  so.exclude = o.exclude;
  so.allow_tied = o.allow_tied;
  so.block_size = o.block_size;
  so.dampening = o.dampening;
  so.device = o.device;
  so.input_shapes = o.input_shapes;
  so.fixed = o.fixed;
  if (!o.structured) so.amounts = {0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.98, 0.99};
  return so;
}

namespace {

// A model with only the given amounts applied: per weight (unstructured; a fraction, or a count
// when `counts`) or per channel group (structured).
ir::Model apply(const ir::Model& model, const TargetOptions& o,
                const std::map<std::string, double>& weights,
                const std::map<int64_t, double>& groups, bool counts = false,
                const std::map<int64_t, double>& blocks = {}) {
  ir::Model m = model;
  if (o.structured || o.blocks) {
    // NOTE: the channel groups first, while their ids are the model's (removing a block removes
    // its groups); the blocks are found again on the result, where they are the same units.
    bool any = false;
    for (const auto& [g, a] : groups) any |= a > 0;
    if (any) {
      StructuredOptions so = structured_options_of(o);
      for (const auto& [g, a] : groups)
        if (a > 0) so.group_amounts[g] = a;
      prune_structured(m, so);
    }
    StructuredOptions depth;
    depth.unit = StructuredUnit::kBlock;
    depth.input_shapes = o.input_shapes;
    for (const auto& [b, a] : blocks)
      if (a >= 0.5) depth.blocks.push_back(b);
    if (!depth.blocks.empty()) prune_depth(m, depth, nullptr, {});
    return m;
  }
  const importance::Criterion& c = importance::find(o.criterion, importance::Use::kWeights);
  std::unordered_map<std::string, int64_t> out_axis;
  if (c.per_row || c.weights == importance::WeightRank::kReconstruct)
    for (const auto& pw : prunable_weights(m.graph)) out_axis[pw.weight] = pw.out_axis;
  for (const auto& [name, a] : weights) {
    if (a <= 0) continue;
    ir::Initializer* init = m.graph.find_initializer(name);
    LOPPER_CHECK(init, "[prune] no weight '", name, "'");
    // NOTE: a copied ir::Model shares its tensors: replace, never write in place.
    const at::Tensor& w = init->value;
    const PruneAmount amount{counts ? std::round(a) : a, counts};
    auto axis = out_axis.find(name);
    if (axis == out_axis.end() || axis->second < 0 || counts) {
      init->value = w * l1_mask(w, amount);
      continue;
    }
    // The criterion's own counts, by magnitude: wanda's per output row, sparsegpt's per block of
    // columns (what it prunes at `a`, so the costs measured here are those it will have).
    const at::Tensor rows = w.movedim(axis->second, 0).reshape({w.size(axis->second), -1});
    at::Tensor drop;
    if (c.per_row) {
      drop = smallest_per_row(rows.abs(), rows.ne(0), amount);
    } else {
      drop = at::zeros(rows.sizes(), at::kBool);
      for (int64_t i = 0; i < rows.size(1); i += o.block_size) {
        const at::Tensor b = rows.slice(1, i, std::min(i + o.block_size, rows.size(1)));
        const at::Tensor alive = b.ne(0);
        const int64_t k = sparsegpt_block_count(a, alive.sum().item<int64_t>());
        drop.slice(1, i, i + b.size(1)).copy_(smallest_k({b}, {alive}, k, true)[0]);
      }
    }
    init->value =
        w.masked_fill(drop.reshape(w.movedim(axis->second, 0).sizes()).movedim(0, axis->second), 0);
  }
  return m;
}

double cost_of(const ir::Model& m, const TargetOptions& o,
               const std::map<std::string, std::vector<int64_t>>& shapes) {
  if (o.kind == TargetKind::kLatency) {
    LatencyOptions lo;
    lo.min_runs = std::max(o.latency_iters, 1);
    const LatencyStats s = measure_model_latency(m, o.device, shapes, lo);
    if (o.on_latency) o.on_latency(s);
    return s.median_ms;
  }
  const EffectiveCost c = effective_cost(m, shapes);
  return double(o.kind == TargetKind::kParams ? c.params : c.macs);
}

// The smallest-loss choice per curve for lambda: argmin dloss - lambda * saved.
std::vector<size_t> choose(const std::vector<Curve>& curves, double lambda) {
  std::vector<size_t> pick(curves.size(), 0);
  for (size_t u = 0; u < curves.size(); ++u) {
    const Curve& c = curves[u];
    double best = 0;  // index 0: amount 0, nothing saved, nothing lost
    for (size_t i = 1; i < c.amount.size(); ++i) {
      const double v = c.dloss[i] - lambda * c.saved[i];
      if (v < best - 1e-15) best = v, pick[u] = i;
    }
  }
  return pick;
}

double total(const std::vector<Curve>& curves, const std::vector<size_t>& pick,
             std::vector<double> Curve::*field) {
  double t = 0;
  for (size_t u = 0; u < curves.size(); ++u) t += (curves[u].*field)[pick[u]];
  return t;
}

// The choice saving at least `need` with the least summed loss increase the relaxation finds, or
// nullopt when even the largest amounts everywhere do not save enough.
std::optional<std::vector<size_t>> allocate(const std::vector<Curve>& curves, double need) {
  std::vector<size_t> most(curves.size());
  for (size_t u = 0; u < curves.size(); ++u) {
    // The largest saving of each curve (latency savings need not grow with the amount).
    const auto& s = curves[u].saved;
    most[u] = size_t(std::max_element(s.begin(), s.end()) - s.begin());
  }
  if (total(curves, most, &Curve::saved) < need) return std::nullopt;
  if (need <= 0) return std::vector<size_t>(curves.size(), 0);
  double lo = 0, hi = 1;
  while (total(curves, choose(curves, hi), &Curve::saved) < need && hi < 1e30) hi *= 4;
  if (total(curves, choose(curves, hi), &Curve::saved) < need) return most;
  for (int i = 0; i < 200 && hi - lo > 1e-12 * hi; ++i) {
    const double mid = 0.5 * (lo + hi);
    (total(curves, choose(curves, mid), &Curve::saved) >= need ? hi : lo) = mid;
  }
  std::vector<size_t> pick = choose(curves, hi);
  // The relaxation jumps between the curves' lower hull; step layers back while the savings
  // still meet the need, the largest loss reduction first.
  double saved = total(curves, pick, &Curve::saved);
  for (;;) {
    size_t best = curves.size();
    double gain = -1;
    for (size_t u = 0; u < curves.size(); ++u) {
      if (pick[u] == 0) continue;
      const Curve& c = curves[u];
      const double drop = c.saved[pick[u]] - c.saved[pick[u] - 1];
      const double g = c.dloss[pick[u]] - c.dloss[pick[u] - 1];
      if (saved - drop >= need && g > gain) best = u, gain = g;
    }
    if (best == curves.size()) break;
    saved -= curves[best].saved[pick[best]] - curves[best].saved[pick[best] - 1];
    --pick[best];
  }
  return pick;
}

// Each measured curve refined with 8 linear steps between its points.
Curve refine(const Curve& c) {
  Curve f;
  for (size_t i = 0; i < c.amount.size(); ++i) {
    if (i > 0)
      for (int s = 1; s < 8; ++s) {
        const double t = s / 8.0;
        f.amount.push_back(c.amount[i - 1] + t * (c.amount[i] - c.amount[i - 1]));
        f.saved.push_back(c.saved[i - 1] + t * (c.saved[i] - c.saved[i - 1]));
        f.dloss.push_back(c.dloss[i - 1] + t * (c.dloss[i] - c.dloss[i - 1]));
      }
    f.amount.push_back(c.amount[i]);
    f.saved.push_back(c.saved[i]);
    f.dloss.push_back(c.dloss[i]);
  }
  return f;
}

void progress(const TargetOptions& o, const std::string& what, int64_t done, int64_t total) {
  if (o.progress) o.progress(what, done, total);
}

// --- With sensitivity data. --------------------------------------------------------------------

TargetReport by_sensitivity(ir::Model& model, const TargetOptions& o,
                            const std::map<std::string, std::vector<int64_t>>& shapes,
                            double before, double target) {
  const SensitivityResult& s = *o.sensitivity;
  const std::string unit = o.structured && o.blocks ? "channel+block"
                           : o.blocks               ? "block"
                           : o.structured           ? "channel"
                                                    : "weight";
  LOPPER_CHECK(s.unit == unit, "[prune] the sensitivity data is per ",
               s.unit == "channel" ? "channel group" : s.unit, ", the target prunes per ",
               unit == "channel" ? "channel group" : unit,
               ": run lopper sensitivity with the target's " LOPPER_OPTION("structured"));
  LOPPER_CHECK(!s.layers.empty(), "[prune] the sensitivity data has no layer");
  // The data must describe this model.
  StructuredReport groups;
  std::unordered_map<std::string, PrunableWeight> weights;
  std::vector<DepthUnit> depth;
  if (o.blocks) depth = depth_units(model, o.input_shapes);
  if (o.structured || o.blocks) {
    if (o.structured) groups = channel_groups(model, structured_options_of(o));
    for (const auto& l : s.layers) {
      const bool ok = l.block >= 0 ? size_t(l.block) < depth.size() &&
                                         depth[size_t(l.block)].layers == l.layers &&
                                         depth[size_t(l.block)].blocked.empty()
                                   : l.group >= 0 && size_t(l.group) < groups.groups.size() &&
                                         groups.groups[size_t(l.group)].layers == l.layers &&
                                         groups.groups[size_t(l.group)].blocked.empty();
      LOPPER_CHECK(ok, "[prune] the sensitivity data does not match this model (", l.name,
                   "): rerun lopper sensitivity on it");
    }
  } else {
    for (auto& pw : prunable_weights(model.graph)) weights.emplace(pw.weight, std::move(pw));
    for (const auto& l : s.layers)
      LOPPER_CHECK(weights.count(l.weight),
                   "[prune] the sensitivity data does not match this "
                   "model (no prunable weight '",
                   l.weight, "'): rerun lopper sensitivity on it");
  }
  LayerFilter exclude(o.exclude);
  std::vector<const LayerSensitivity*> units;
  int64_t tied = 0;
  for (const auto& l : s.layers) {
    std::vector<std::string> names = l.layers;
    if (l.block >= 0) {
      names = depth[size_t(l.block)].names();
    } else if (o.structured) {
      const auto& params = groups.groups[size_t(l.group)].layer_params;
      names.insert(names.end(), params.begin(), params.end());
    } else {
      const PrunableWeight& pw = weights.at(l.weight);
      if (pw.tied() && !o.allow_tied) {  // as prune() leaves it
        ++tied;
        continue;
      }
      names = pw.names();
    }
    if (!exclude.excludes(names)) units.push_back(&l);
  }
  LOPPER_CHECK(!units.empty(), "[prune] no layer to prune", exclude.leaves_none(),
               tied ? " (tied weights stay unless " LOPPER_OPTION("allow_tied") ")" : "");

  const double base_latency = o.kind == TargetKind::kLatency ? before : 0;
  int64_t measured_points = 0, to_measure = 0;
  if (o.kind == TargetKind::kLatency)
    for (const auto* l : units) to_measure += int64_t(l->points.size());
  std::vector<Curve> curves;
  for (const auto* l : units) {
    Curve c{{0}, {0}, {0}};
    double worst = 0;
    for (const auto& p : l->points) {
      double saved = 0;
      if (o.kind == TargetKind::kParams) saved = double(s.params - p.params);
      if (o.kind == TargetKind::kMacs) saved = double(s.macs - p.macs);
      if (o.kind == TargetKind::kLatency) {
        std::map<std::string, double> w;
        std::map<int64_t, double> g, b;
        if (l->block >= 0)
          b[l->block] = p.amount;
        else
          (o.structured ? (void)(g[l->group] = p.amount) : (void)(w[l->weight] = p.amount));
        saved = std::max(0.0, base_latency - cost_of(apply(model, o, w, g, false, b), o, shapes));
        progress(o, fmt::format("latency {} @ {:g}", l->name, p.amount), ++measured_points,
                 to_measure);
      }
      worst = std::max(worst, std::max(0.0, p.loss - s.loss));  // losses only grow with the amount
      c.amount.push_back(p.amount);
      c.saved.push_back(saved);
      c.dloss.push_back(worst);
    }
    // A block goes whole or stays: no amounts between.
    curves.push_back(l->block >= 0 ? c : refine(c));
  }

  TargetReport r;
  r.estimator = "sensitivity";
  r.base_loss = s.loss;
  // NOTE: the layers' savings do not add up exactly (two neighbouring channel groups save their
  // shared layer's MACs once, not twice; latencies overlap) and channel counts round, so the
  // measured cost of an allocation can miss what the curves promised, in either direction and not
  // monotonically. Each round asks the curves for a saving `need`, measures the result, and moves
  // `need`: up past the shortfall while nothing met the target, then by bisection between the
  // largest need that missed and the smallest that met it. The allocation kept is the one that met
  // the target with the least estimated loss (then the least pruned).
  constexpr int kRounds = 12;
  // One allocation, applied to a copy of the model and measured.
  auto try_pick = [&](const std::vector<size_t>& pick, ir::Model& pruned) {
    TargetReport t = r;  // estimator, base loss
    t.units.clear();
    std::map<std::string, double> w;
    std::map<int64_t, double> g, b;
    for (size_t u = 0; u < units.size(); ++u) {
      TargetUnit tu;
      tu.name = units[u]->name;
      tu.layers = units[u]->layers;
      tu.weight = units[u]->weight;
      tu.param = units[u]->param;
      tu.group = units[u]->group;
      tu.block = units[u]->block;
      tu.amount = curves[u].amount[pick[u]];
      tu.est_loss_increase = curves[u].dloss[pick[u]];
      if (tu.block >= 0)
        b[tu.block] = tu.amount;
      else
        (o.structured ? g[tu.group] : w[tu.weight]) = tu.amount;
      t.units.push_back(tu);
    }
    pruned = apply(model, o, w, g, false, b);
    t.predicted = before - total(curves, pick, &Curve::saved);
    t.predicted_loss = s.loss + total(curves, pick, &Curve::dloss);
    t.measured = cost_of(pruned, o, shapes);
    return t;
  };
  const auto meets = [&](const TargetReport& t) { return t.measured <= target * (1 + 1e-9); };
  double need = before - target, missed = -1, met = -1;
  std::optional<TargetReport> best;
  std::vector<size_t> best_pick;
  ir::Model best_model, last_model;
  int rounds = 0;
  for (int round = 1; round <= kRounds; ++round) {
    std::optional<std::vector<size_t>> pick = allocate(curves, need);
    if (!pick) {
      if (best) break;
      throw Error(fmt::format(
          "[prune] cannot reach {} {:g}: every analysed layer at its largest amount saves too "
          "little (analyse larger amounts with lopper sensitivity " LOPPER_OPTION("amounts") ")",
          target_option(o.kind), o.value));
    }
    ir::Model pruned;
    r = try_pick(*pick, pruned);
    rounds = round;
    progress(o,
             fmt::format("round {}: predicted {:.4g}, measured {:.4g}, target {:.4g}", round,
                         r.predicted, r.measured, target),
             round, kRounds);
    const bool ok = meets(r);
    if (ok && (!best || r.predicted_loss < best->predicted_loss - 1e-12 ||
               (r.predicted_loss <= best->predicted_loss + 1e-12 && r.measured > best->measured))) {
      best = r;
      best_pick = *pick;
      best_model = std::move(pruned);
    } else {
      last_model = std::move(pruned);
    }
    if (ok && r.measured >= target * 0.99) break;  // within 1% of the target
    if (ok)
      met = met < 0 ? need : std::min(met, need);
    else
      missed = std::max(missed, need);
    if (met >= 0 && missed >= 0) {
      if (met - missed <= 1e-6 * std::max(1.0, met)) break;
      need = 0.5 * (missed + met);
    } else if (!ok) {
      // Nothing met yet: the shortfall, scaled by how far the promise overshot the measurement.
      const double promised = before - r.predicted, got = before - r.measured;
      need = promised + (r.measured - target) * std::max(1.0, promised / std::max(got, 1e-9));
    } else {
      need *= 0.5 + 0.5 * (before - target) / std::max(before - r.measured, 1e-9);  // pruned past
    }
  }
  if (!best) {
    LOPPER_CHECK(o.kind == TargetKind::kLatency, "[prune] could not meet ", target_option(o.kind),
                 " ", o.value, " in ", kRounds, " rounds (measured ", r.measured, ", target ",
                 target, ")");
    r.rounds = rounds;
    model = std::move(last_model);  // latency is noisy: the caller warns
    return r;
  }
  // Channel counts are coarse: the allocation kept may have pruned past the target. Step units
  // back one point of their curve, the largest loss reduction first, while the measured cost
  // still meets the target (parameters and MACs: exact and cheap to measure).
  if (o.kind != TargetKind::kLatency) {
    int trials = 0;
    const int budget = 4 * int(units.size());
    for (bool stepped = true; stepped && trials < budget;) {
      stepped = false;
      std::vector<size_t> order;
      for (size_t u = 0; u < units.size(); ++u)
        if (best_pick[u] > 0) order.push_back(u);
      auto gain = [&](size_t u) {
        return curves[u].dloss[best_pick[u]] - curves[u].dloss[best_pick[u] - 1];
      };
      std::stable_sort(order.begin(), order.end(),
                       [&](size_t a, size_t b) { return gain(a) > gain(b); });
      for (size_t u : order) {
        if (trials++ >= budget) break;
        std::vector<size_t> pick = best_pick;
        --pick[u];
        ir::Model pruned;
        TargetReport t = try_pick(pick, pruned);
        if (!meets(t)) continue;
        best = t;
        best_pick = pick;
        best_model = std::move(pruned);
        stepped = true;
        break;
      }
    }
  }
  best->rounds = rounds;
  model = std::move(best_model);
  return *best;
}

// --- Without data: one global ranking, one amount found by bisection. ---------------------------

TargetReport by_ranking(ir::Model& model, const TargetOptions& o,
                        const std::map<std::string, std::vector<int64_t>>& shapes, double before,
                        double target) {
  TargetReport r;
  LayerFilter exclude(o.exclude);
  LOPPER_CHECK(!o.blocks,
               "[prune] a target with residual blocks weighs each block's loss against the "
               "channels': give sensitivity data (" LOPPER_OPTION(
                   "data") " or lopper sensitivity " LOPPER_OPTION("structured") " block)");
  if (o.structured) {
    r.estimator = "global channel ranking";
    StructuredOptions so = structured_options_of(o);
    so.exclude = o.exclude;
    so.scope = PruneScope::kGlobal;
    // The model pruned at global amount a, and what was removed.
    struct Pruned {
      ir::Model model;
      StructuredReport report;
    };
    auto at = [&](double a) {
      Pruned p{model, {}};
      StructuredOptions s2 = so;
      s2.amount = PruneAmount{a, false};
      p.report = prune_structured(p.model, s2);
      return p;
    };
    // Bisect the global share of channels removed (each group capped at --max-layer-amount).
    double lo = 0, hi = so.max_layer_amount;
    Pruned best = at(hi);
    double best_cost = cost_of(best.model, o, shapes);
    LOPPER_CHECK(best_cost <= target, "[prune] cannot reach ", target_option(o.kind), " ", o.value,
                 ": removing ", hi * 100, "% of the channels leaves ", best_cost, " (target ",
                 target, ")");
    for (int i = 1; i <= 12; ++i) {
      const double mid = 0.5 * (lo + hi);
      Pruned p = at(mid);
      const double c = cost_of(p.model, o, shapes);
      progress(o, fmt::format("global amount {:.4f}: {:.4g} (target {:.4g})", mid, c, target), i,
               12);
      if (c <= target) {
        hi = mid, best = std::move(p), best_cost = c;
      } else {
        lo = mid;
      }
      r.rounds = i;
    }
    for (const auto& g : best.report.groups) {
      if (!g.blocked.empty()) continue;
      TargetUnit tu;
      tu.group = g.id;
      tu.layers = g.layers;
      tu.name = fmt::format("group {}: {}", g.id, g.layers.empty() ? "?" : g.layer_label(0));
      tu.amount = g.size_before ? 1.0 - double(g.size_after) / double(g.size_before) : 0;
      r.units.push_back(tu);
    }
    r.predicted = r.measured = best_cost;
    model = std::move(best.model);
    return r;
  }

  // LAMP (the criteria table's entry): scores that compare across layers, lowest removed first.
  r.estimator = "lamp";
  const importance::Criterion& lamp = importance::find("lamp", importance::Use::kWeights);
  static const std::vector<int64_t> no_perm;
  struct Entry {
    float score;
    int32_t unit;
  };
  std::vector<Entry> all;
  std::vector<PrunableWeight> units;
  std::vector<int64_t> params;
  std::vector<double> macs_per_weight;
  const ModelCost cost = analyze(model, shapes);
  std::unordered_map<std::string, int64_t> macs_of;
  for (const auto& l : cost.layers) macs_of[l.weight] += l.macs;
  int64_t tied = 0;
  for (const auto& pw : prunable_weights(model.graph)) {
    if (pw.tied() && !o.allow_tied) {  // as prune() leaves it
      ++tied;
      continue;
    }
    if (exclude.excludes(pw.names())) continue;
    const at::Tensor& w = model.graph.find_initializer(pw.weight)->value;
    const at::Tensor scores = importance::weight_scores({lamp, w, pw.weight, no_perm, nullptr});
    const at::Tensor score =
        std::get<0>(scores.masked_select(w.to(at::kCPU).ne(0)).sort()).contiguous();
    const int32_t u = int32_t(units.size());
    const float* p = score.data_ptr<float>();
    for (int64_t i = 0; i < score.numel(); ++i) all.push_back({p[i], u});
    units.push_back(pw);
    params.push_back(w.numel());
    macs_per_weight.push_back(double(macs_of[pw.weight]) / double(std::max<int64_t>(w.numel(), 1)));
  }
  LOPPER_CHECK(!units.empty(), "[prune] no prunable layer", exclude.leaves_none(),
               tied ? " (tied weights stay unless " LOPPER_OPTION("allow_tied") ")" : "");
  std::stable_sort(all.begin(), all.end(),
                   [](const Entry& a, const Entry& b) { return a.score < b.score; });
  // The model with the k lowest scores removed, and its per-layer counts.
  auto counts_at = [&](int64_t k) {
    std::vector<int64_t> n(units.size(), 0);
    for (int64_t i = 0; i < k; ++i) ++n[size_t(all[size_t(i)].unit)];
    return n;
  };
  auto model_at = [&](const std::vector<int64_t>& n) {
    std::map<std::string, double> w;
    for (size_t u = 0; u < units.size(); ++u) w[units[u].weight] = double(n[u]);
    return apply(model, o, w, {}, /*counts=*/true);
  };
  const int64_t max_k = int64_t(all.size());
  auto cost_k = [&](int64_t k) {  // params and MACs are exact without running the model
    if (o.kind == TargetKind::kLatency) return cost_of(model_at(counts_at(k)), o, shapes);
    double saved = 0;
    const auto n = counts_at(k);
    for (size_t u = 0; u < units.size(); ++u)
      saved += double(n[u]) * (o.kind == TargetKind::kParams ? 1.0 : macs_per_weight[u]);
    return before - saved;
  };
  double hi_cost = cost_k(max_k);
  LOPPER_CHECK(hi_cost <= target, "[prune] cannot reach ", target_option(o.kind), " ", o.value,
               ": even removing every weight of the prunable layers leaves ", hi_cost);
  int64_t lo = 0, hi = max_k;  // hi_cost = cost_k(hi) <= target
  int rounds = 0;
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    const double c = cost_k(mid);
    ++rounds;
    if (o.kind == TargetKind::kLatency)
      progress(o, fmt::format("{} weights: {:.4g} ms (target {:.4g})", mid, c, target), rounds, 0);
    if (c <= target) {
      hi = mid, hi_cost = c;
    } else {
      lo = mid;
    }
  }
  const auto n = counts_at(hi);
  ir::Model pruned = model_at(n);
  r.rounds = rounds;
  r.predicted = hi_cost;
  r.measured = cost_of(pruned, o, shapes);
  for (size_t u = 0; u < units.size(); ++u) {
    TargetUnit tu;
    tu.name = units[u].node->label();
    tu.layers = {tu.name};
    tu.weight = units[u].weight;
    tu.param = units[u].param;
    tu.amount = params[u] ? double(n[u]) / double(params[u]) : 0;
    r.units.push_back(tu);
  }
  model = std::move(pruned);
  return r;
}

}  // namespace

const char* target_name(TargetKind k) {
  return k == TargetKind::kParams ? "params" : k == TargetKind::kMacs ? "macs" : "latency-ms";
}

void check_target_options(const TargetOptions& o) {
  if (o.kind == TargetKind::kLatency)
    LOPPER_CHECK(std::isfinite(o.value) && o.value > 0, "[prune] ", target_option(o.kind),
                 " must be > 0, got ", o.value);
  else
    LOPPER_CHECK(std::isfinite(o.value) && o.value > 0 && o.value < 1, "[prune] ",
                 target_option(o.kind), " is the share kept, in (0, 1), got ", o.value);
  LOPPER_CHECK(o.round_to >= 1, "[prune] " LOPPER_OPTION("round_to") " must be >= 1, got ",
               o.round_to);
  if (o.blocks && !o.structured) return;  // blocks alone: removed whole, no criterion
  if (o.structured) {
    LOPPER_CHECK(!importance::find(o.criterion, importance::Use::kChannels).needs_data(),
                 "[prune] pruning to a target ranks channels by ",
                 importance::names(
                     importance::Use::kChannels,
                     [](const importance::Criterion& c) { return !c.needs_data(); }, " or "));
    return;
  }
  const importance::Criterion& c = importance::find(o.criterion, importance::Use::kWeights);
  if (o.sensitivity && !o.sensitivity->method.empty() && o.sensitivity->method != c.name) {
    const importance::Criterion* measured = nullptr;
    for (const auto& x : importance::criteria())
      if (o.sensitivity->method == x.name) measured = &x;
    LOPPER_CHECK(!reads_inputs(c) && !(measured && reads_inputs(*measured)),
                 "[prune] the sensitivity data was measured with ", o.sensitivity->method,
                 ", the target prunes with ", c.name, ": measure it with ", c.name);
  }
  if (!reads_inputs(c)) {
    LOPPER_CHECK(c.name == std::string("l1"), "[prune] a target prunes weights by l1 or ",
                 importance::names(importance::Use::kWeights, reads_inputs, " or "), ", not ",
                 c.name);
    return;
  }
  LOPPER_CHECK(o.sensitivity != nullptr, "[prune] a target with ", c.name,
               " chooses each layer's amount on sensitivity curves measured with it: give "
               "sensitivity data (lopper sensitivity " LOPPER_OPTION("criterion") " ",
               c.name, ")");
  LOPPER_CHECK(o.calibration_data != nullptr, "[prune] a target with ", c.name,
               " prunes with the layers' inputs: give calibration data");
  PruneLayerOptions lo;
  lo.criterion = c.name;
  lo.block_size = o.block_size;
  lo.dampening = o.dampening;
  check_layer_options(lo);
}

PruneRecipe target_recipe(const TargetReport& r, const PruneLayerOptions& how) {
  PruneRecipe recipe;
  recipe.source = "the target's amounts";
  for (const auto& u : r.units) {
    LOPPER_CHECK(u.group < 0 && u.block < 0, "[prune] target_recipe: ", u.name,
                 " is a channel group (structured targets prune channels, not by a recipe)");
    if (u.amount <= 0) continue;
    PruneRule rule;
    rule.match = "^" + Pattern::quote(u.weight) + "$";
    rule.options = how;
    rule.options.amount = PruneAmount{u.amount, false};
    rule.where = u.label();
    recipe.rules.push_back(std::move(rule));
  }
  return recipe;
}

TargetReport prune_to_target(ir::Model& model, const TargetOptions& opts) {
  // Every latency measurement of the search is counted, so a busy machine is reported.
  int measurements = 0, wide = 0;
  LatencyStats widest;
  TargetOptions o = opts;
  o.on_latency = [&](const LatencyStats& s) {
    ++measurements;
    if (s.unreliable()) ++wide;
    if (s.contended ? s.contention > widest.contention || !widest.contended
                    : !widest.contended && s.spread > widest.spread)
      widest = s;
    if (opts.on_latency) opts.on_latency(s);
  };
  check_target_options(o);
  const bool calibrated =
      !o.structured && reads_inputs(importance::find(o.criterion, importance::Use::kWeights));
  if (calibrated) check_calibration(*o.calibration_data, o.calibration);
  const ir::Model original = model;  // shares its tensors: nothing below writes through them
  const auto shapes = resolve_input_shapes(model, o.input_shapes, 1);
  const double before = cost_of(model, o, shapes);
  const double target = o.kind == TargetKind::kLatency ? o.value : o.value * before;
  TargetReport r;
  if (before <= target) {  // nothing to do
    r.estimator = o.sensitivity ? "sensitivity" : o.structured ? "global channel ranking" : "lamp";
    r.predicted = r.measured = before;
  } else {
    r = o.sensitivity ? by_sensitivity(model, o, shapes, before, target)
                      : by_ranking(model, o, shapes, before, target);
    if (calibrated) {
      // The amounts were chosen on the curves and checked with magnitude masks of the same
      // counts; the model is pruned by the criterion itself, from the original.
      PruneLayerOptions how;
      how.criterion = o.criterion;
      how.block_size = o.block_size;
      how.dampening = o.dampening;
      how.allow_tied = o.allow_tied;
      ir::Model pruned = original;
      prune_calibrated(pruned, target_recipe(r, how), *o.calibration_data, o.calibration);
      model = std::move(pruned);
      r.measured = cost_of(model, o, shapes);
    }
  }
  r.kind = o.kind;
  r.before = before;
  r.target = target;
  r.latency_measurements = measurements;
  r.latency_wide = wide;
  r.latency_widest = widest;
  for (const auto& pw : prunable_weights(original.graph))
    if (auto w = importance::non_finite_warning(pw.weight,
                                                original.graph.find_initializer(pw.weight)->value);
        !w.empty())
      r.warnings.push_back(std::move(w));
  return r;
}

}  // namespace lopper
