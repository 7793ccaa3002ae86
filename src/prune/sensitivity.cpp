// Sensitivity analysis: one layer (or channel group) pruned at a time, evaluated on fixed batches.
// Unstructured: one executor (autograd mode: weights are its own tensors, nothing prepacked), the
// layer's weight overwritten in place per amount and restored. Structured: the model copied and
// shrunk per point, then a fresh executor.
#include "lopper/sensitivity.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <optional>
#include <unordered_map>

#include "lopper/analysis.h"
#include "lopper/data.h"
#include "lopper/depth.h"
#include "lopper/error.h"
#include "lopper/executor.h"
#include "prune/importance.h"
#include "prune/layer_filter.h"
#include "prune/layer_inputs.h"
#include "prune/masks.h"
#include "prune/plan.h"
#include "train/loss.h"

namespace lopper {
namespace {

// The evaluation batches, read once.
struct EvalSet {
  std::vector<Batch> batches;
  int64_t samples = 0;
};

EvalSet read_batches(DataLoader& data, int64_t n) {
  EvalSet s;
  data.start_epoch(0);
  Batch b;
  while (int64_t(s.batches.size()) < n && data.next(b)) {
    s.samples += b.size();
    s.batches.push_back(std::move(b));
    b = Batch();
  }
  LOPPER_CHECK(s.samples > 0, "[sensitivity] ", data.dataset().name(), " gave no sample");
  return s;
}

ExecOptions eval_options(const std::string& device) {
  ExecOptions eo;
  eo.device = device;
  eo.autograd = true;  // eval semantics, weights are the executor's own tensors, nothing prepacked
  return eo;
}

// The sweep's progress, counted in batches (evaluated, and calibration batches): no more than one
// batch between two calls, and the plan said before the first (step 0), so that a long sweep says
// its cost up front and never looks stuck.
struct Sweep {
  const SensitivityOptions& o;
  int64_t done = 0, total = 0;
  void plan(const std::string& what) const {
    if (o.progress) o.progress(0, total, what);
  }
  void step(const std::string& what) {
    ++done;
    if (o.progress) o.progress(done, total, what);
  }
};

// "21 layers x 10 amounts = 210 points, 16 batches each: 3376 batch runs" (the unpruned model
// is evaluated too).
std::string plan_text(size_t units, const std::string& unit, size_t amounts, size_t batches,
                      int64_t calibration) {
  auto count = [](size_t n, const std::string& one) {
    return fmt::format("{} {}{}", n, one, n == 1 ? "" : one.back() == 'h' ? "es" : "s");
  };
  const size_t points = units * amounts;
  std::string t = fmt::format("{} x {} = {}, {} each: {}", count(units, unit),
                              count(amounts, "amount"), count(points, "point"),
                              count(batches, "batch"), count((points + 1) * batches, "batch run"));
  if (calibration > 0) t += " after " + count(size_t(calibration), "calibration batch");
  return t;
}

// Mean loss (lopper/loss.h) and top-1 of `ex` over `s`: per target (samples, or tokens). `what`
// names the point for the progress, batch by batch.
std::pair<double, double> evaluate_on(Executor& ex, const ir::Model& model, const EvalSet& s,
                                      const LossOptions& loss, Sweep& sweep,
                                      const std::string& what) {
  c10::NoGradGuard no_grad;
  const ModelIO io = model_io(model);
  Objective objective(loss, io);
  double sum = 0, hit = 0;
  int64_t counted = 0;
  for (size_t i = 0; i < s.batches.size(); ++i) {
    // NOTE: masked-lm picks the same tokens at every point: a function of the batch's index.
    Batch b = s.batches[i];
    objective.prepare(b, int64_t(i));
    at::Tensor out = ex.run(feeds(io, b, ex.device())).at(0).to(at::kCPU);
    const Objective::Targets t = objective.targets(out, b);
    const int64_t n = t.labels.size(0);
    sum += objective.loss(t).item<double>() * double(n);
    hit += double(Objective::correct(t));
    counted += n;
    sweep.step(fmt::format("{}: batch {}/{}", what, i + 1, s.batches.size()));
  }
  return {sum / double(counted), hit / double(counted)};
}

// wanda, sparsegpt: the layers whose inputs can be collected, in passes over the calibration
// batches (the others leave `todo`, named in `skipped`). Gram matrices (sparsegpt) are collected a
// share of the layers at a time, so that no pass holds more than kGramBytes of them.
struct Calibration {
  std::vector<std::vector<std::string>> passes;
  LayerInputOptions options;
};

Calibration plan_calibration(const ir::Model& model, const DataLoader& data,
                             const SensitivityOptions& o, std::vector<PrunableWeight>& todo,
                             std::vector<std::string>& skipped) {
  constexpr int64_t kGramBytes = int64_t(1) << 30;
  Calibration c;
  LayerInputOptions& lo = c.options;
  const int64_t batch = std::max<int64_t>(data.options().batch_size, 1);
  lo.batches = o.calib_batches > 0 ? o.calib_batches
                                   : (CalibrationOptions::kLayerInputSamples + batch - 1) / batch;
  LOPPER_CHECK(o.calib_batches <= data.batches_per_epoch(), "[sensitivity] ", data.dataset().name(),
               " has ", data.batches_per_epoch(), " batches, ", LOPPER_OPTION("calib_batches"),
               " asks for ", o.calib_batches);
  lo.batches = std::min<int64_t>(lo.batches, data.batches_per_epoch());
  lo.device = o.device;
  lo.gram = importance::find(o.criterion, importance::Use::kWeights).needs_gram;
  lo.loss = o.loss;
  int64_t bytes = 0;
  std::vector<PrunableWeight> kept;
  for (auto& pw : todo) {
    const at::Tensor& w = model.graph.find_initializer(pw.weight)->value;
    if (std::string why = layer_input_unsupported(*pw.node, w); !why.empty()) {
      skipped.push_back(pw.label() + ": " + why);
      continue;
    }
    const int64_t k = w.numel() / std::max<int64_t>(w.size(pw.out_axis), 1);
    const int64_t b = lo.gram ? k * k * int64_t(sizeof(double)) : 0;
    if (c.passes.empty() || (bytes > 0 && bytes + b > kGramBytes))
      c.passes.emplace_back(), bytes = 0;
    c.passes.back().push_back(pw.weight);
    bytes += b;
    kept.push_back(std::move(pw));
  }
  todo = std::move(kept);
  return c;
}

SensitivityResult weights(const ir::Model& model, DataLoader& data, const EvalSet& s,
                          const SensitivityOptions& o) {
  SensitivityResult r;
  r.unit = "weight";
  r.method = o.criterion;
  const importance::Criterion& crit = importance::find(o.criterion, importance::Use::kWeights);
  const bool drawn = crit.weights == importance::WeightRank::kDrawn;
  const auto shapes = resolve_input_shapes(model, o.input_shapes, 1);
  const ModelCost cost = analyze(model, shapes);
  const EffectiveCost base = effective_cost(cost);
  r.params = base.params, r.macs = base.macs;
  std::unordered_map<std::string, int64_t> macs_of;  // per weight (a shared one: all its layers)
  for (const auto& l : cost.layers) macs_of[l.weight] += l.macs;

  LayerFilter exclude(o.exclude);
  std::vector<PrunableWeight> todo;
  bool tied = false;  // left out, as prune() leaves it
  for (const auto& pw : prunable_weights(model.graph)) {
    if (pw.tied() && !o.allow_tied)
      tied = true;
    else if (!exclude.excludes(pw.names()))
      todo.push_back(pw);
  }
  LOPPER_CHECK(!todo.empty(), "[sensitivity] no prunable layer to analyse", exclude.leaves_none(),
               tied ? " (tied weights stay unless " LOPPER_OPTION("allow_tied") ")" : "");
  // wanda, sparsegpt: each layer's inputs on the unpruned model (sensitivity prunes one layer at a
  // time, so no layer's inputs change).
  std::map<std::string, LayerInput> inputs;
  Calibration calib;
  if (crit.needs == importance::Needs::kActivations) {
    calib = plan_calibration(model, data, o, todo, r.skipped);
    LOPPER_CHECK(!todo.empty(), "[sensitivity] ", o.criterion, " has no layer to analyse (",
                 r.skipped.front(), ")");
  }
  const int64_t nb = int64_t(s.batches.size());
  const int64_t calibration = int64_t(calib.passes.size()) * calib.options.batches;
  Sweep sweep{o};
  sweep.total = calibration + nb * (1 + int64_t(todo.size() * o.amounts.size()));
  sweep.plan(plan_text(todo.size(), "layer", o.amounts.size(), s.batches.size(), calibration));
  Executor ex(model, eval_options(o.device));
  std::tie(r.loss, r.top1) = evaluate_on(ex, model, s, o.loss, sweep, "unpruned");
  std::unordered_map<std::string, at::Tensor> params;
  for (const auto& [name, t] : ex.parameters()) params[name] = t;
  for (size_t i = 0; i < calib.passes.size(); ++i) {
    calib.options.weights = calib.passes[i];
    calib.options.progress = [&](int64_t b, int64_t of) {
      sweep.step(calib.passes.size() > 1 ? fmt::format("calibration {}/{}: batch {}/{}", i + 1,
                                                       calib.passes.size(), b, of)
                                         : fmt::format("calibration: batch {}/{}", b, of));
    };
    for (auto& [name, in] : collect_layer_inputs(model, data, calib.options))
      inputs[name] = std::move(in);
  }
  if (!calib.passes.empty()) {
    std::vector<PrunableWeight> reached;
    for (auto& pw : todo) {
      if (inputs.count(pw.weight))
        reached.push_back(std::move(pw));
      else
        r.skipped.push_back(pw.label() + ": the calibration data never reached it");
    }
    sweep.total -= nb * int64_t((todo.size() - reached.size()) * o.amounts.size());
    todo = std::move(reached);
    LOPPER_CHECK(!todo.empty(), "[sensitivity] ", o.criterion, " has no layer to analyse (",
                 r.skipped.front(), ")");
  }
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(o.seed);
  c10::NoGradGuard no_grad;
  for (const auto& pw : todo) {
    at::Tensor p = params.at(pw.weight);
    const at::Tensor orig = p.detach().to(at::kCPU, at::kFloat).clone();
    // The layer as prune_calibrated() sees it, its weight the unpruned one.
    ir::Initializer init{pw.weight, orig, "", false};
    Target t;
    t.node = pw.node;
    t.weight = pw;
    t.init = &init;
    t.in_axis = pw.in_axis, t.out_axis = pw.out_axis;
    const LayerInput* in = inputs.count(pw.weight) ? &inputs.at(pw.weight) : nullptr;
    const at::Tensor score = in ? layer_score(t, crit, nullptr, in) : at::Tensor();
    LayerSensitivity ls;
    ls.name = pw.node->label();
    ls.weight = pw.weight;
    ls.param = pw.param;
    ls.layers = {ls.name};
    ls.params = orig.numel();
    ls.macs = macs_of[pw.weight];
    const int64_t nz0 = orig.count_nonzero().item<int64_t>();
    SparseGptFactor factor;  // sparsegpt: the layer's Hessian factored once, for every amount
    if (crit.weights == importance::WeightRank::kReconstruct)
      factor = sparsegpt_factor(in->gram, o.dampening, ls.label());
    for (double a : o.amounts) {
      const PruneAmount amount{a, false};
      at::Tensor w;
      if (crit.weights == importance::WeightRank::kReconstruct) {
        PruneLayerOptions lo;
        lo.criterion = o.criterion;
        lo.amount = amount;
        lo.block_size = o.block_size;
        lo.dampening = o.dampening;
        w = layer_solve(t, lo, factor, nz0);
      } else if (score.defined()) {
        PruneLayerOptions lo;
        lo.criterion = o.criterion;
        lo.amount = amount;
        w = orig * layer_keep(t, lo, gen, ls.name, score);
      } else {
        w = orig * (drawn ? random_mask(orig, amount, gen) : l1_mask(orig, amount));
      }
      p.detach().copy_(w.to(p.device(), p.scalar_type()));
      SensitivityPoint pt;
      pt.amount = a;
      const int64_t nz = w.count_nonzero().item<int64_t>();
      pt.removed = ls.params ? 1.0 - double(nz) / double(ls.params) : 0.0;
      std::tie(pt.loss, pt.top1) =
          evaluate_on(ex, model, s, o.loss, sweep, fmt::format("{} @ {:g}", ls.name, a));
      pt.params = base.params - (nz0 - nz);
      pt.macs = base.macs - int64_t(std::llround(double(ls.macs) * double(nz0 - nz) /
                                                 double(std::max<int64_t>(ls.params, 1))));
      ls.points.push_back(pt);
    }
    p.detach().copy_(orig.to(p.device(), p.scalar_type()));
    r.layers.push_back(std::move(ls));
  }
  return r;
}

SensitivityResult channels(const ir::Model& model, const EvalSet& s, const SensitivityOptions& o) {
  SensitivityResult r;
  r.unit = o.structured && o.blocks ? "channel+block" : o.blocks ? "block" : "channel";
  r.method = o.criterion;
  StructuredOptions so = structured_options_of(o);
  so.seed = o.seed;
  so.exclude = o.exclude;
  const auto shapes = resolve_input_shapes(model, o.input_shapes, 1);
  const ModelCost cost = analyze(model, shapes);
  const EffectiveCost base = effective_cost(cost);
  r.params = base.params, r.macs = base.macs;
  std::unordered_map<std::string, const LayerCost*> layer_cost;
  for (const auto& l : cost.layers) layer_cost[l.name] = &l;

  StructuredReport groups;
  std::vector<const ChannelGroupReport*> todo;
  if (o.structured) {
    groups = channel_groups(model, so);
    for (const auto& g : groups.groups)
      if (g.blocked.empty()) todo.push_back(&g);
    LOPPER_CHECK(!todo.empty(), "[sensitivity] no channel group can be pruned",
                 groups.barriers.empty() ? std::string() : ": " + groups.barriers.front());
  }
  // Residual blocks, each removed alone: one point.
  std::vector<DepthUnit> units;
  std::vector<size_t> blocks;
  if (o.blocks) {
    units = depth_units(model, o.input_shapes);
    std::vector<std::vector<std::string>> names;
    for (const auto& u : units) names.push_back(u.names());
    const std::vector<std::string> excluded = depth_excluded(names, o.exclude);
    for (size_t i = 0; i < units.size(); ++i)
      if (units[i].blocked.empty() && excluded[i].empty()) blocks.push_back(i);
    LOPPER_CHECK(!blocks.empty(), "[sensitivity] no residual block can be removed",
                 units.empty() ? std::string(" (the model has none)")
                               : ": " + units[0].label + ": " + units[0].blocked);
  }
  Sweep sweep{o};
  sweep.total = int64_t(s.batches.size()) *
                (1 + int64_t(todo.size() * o.amounts.size()) + int64_t(blocks.size()));
  sweep.plan(o.structured
                 ? plan_text(todo.size(), "channel group", o.amounts.size(), s.batches.size(), 0) +
                       (blocks.empty() ? "" : fmt::format(", and {} blocks", blocks.size()))
                 : plan_text(blocks.size(), "residual block", 1, s.batches.size(), 0));
  {
    Executor ex(model, eval_options(o.device));
    std::tie(r.loss, r.top1) = evaluate_on(ex, model, s, o.loss, sweep, "unpruned");
  }
  for (const ChannelGroupReport* g : todo) {
    LayerSensitivity ls;
    ls.group = g->id;
    ls.layers = g->layers;
    ls.name = fmt::format("group {}: {}", g->id, g->layers.empty() ? "?" : g->layer_label(0));
    for (const auto& name : g->layers)
      if (auto it = layer_cost.find(name); it != layer_cost.end())
        ls.params += it->second->params, ls.macs += it->second->macs;
    for (double a : o.amounts) {
      StructuredOptions one = so;
      one.group_amounts = {{g->id, a}};
      ir::Model pruned = model;
      const StructuredReport pr = prune_structured(pruned, one);
      const ChannelGroupReport& after = pr.groups.at(size_t(g->id));
      SensitivityPoint pt;
      pt.amount = a;
      pt.removed =
          after.size_before ? 1.0 - double(after.size_after) / double(after.size_before) : 0.0;
      Executor ex(pruned, eval_options(o.device));
      std::tie(pt.loss, pt.top1) =
          evaluate_on(ex, pruned, s, o.loss, sweep, fmt::format("{} @ {:g}", ls.name, a));
      const EffectiveCost c = effective_cost(pruned, shapes);
      pt.params = c.params, pt.macs = c.macs;
      ls.points.push_back(pt);
    }
    r.layers.push_back(std::move(ls));
  }
  for (size_t i : blocks) {
    const DepthUnit& u = units[i];
    LayerSensitivity ls;
    ls.block = int64_t(i);
    ls.layers = u.layers;
    ls.name = fmt::format("block {}: {}", i, u.label);
    for (const auto& name : u.layers)
      if (auto it = layer_cost.find(name); it != layer_cost.end())
        ls.params += it->second->params, ls.macs += it->second->macs;
    StructuredOptions one;
    one.unit = StructuredUnit::kBlock;
    one.blocks = {int64_t(i)};
    one.input_shapes = o.input_shapes;
    ir::Model pruned = model;
    prune_depth(pruned, one, nullptr, {});
    SensitivityPoint pt;
    pt.amount = pt.removed = 1;
    Executor ex(pruned, eval_options(o.device));
    std::tie(pt.loss, pt.top1) =
        evaluate_on(ex, pruned, s, o.loss, sweep, fmt::format("{} removed", ls.name));
    const EffectiveCost c = effective_cost(pruned, shapes);
    pt.params = c.params, pt.macs = c.macs;
    ls.points.push_back(pt);
    r.layers.push_back(std::move(ls));
  }
  return r;
}

}  // namespace

void check_sensitivity_options(const SensitivityOptions& o) {
  LOPPER_CHECK(!o.amounts.empty(), "[sensitivity] " LOPPER_OPTION("amounts") " lists no amount");
  for (double a : o.amounts)
    LOPPER_CHECK(std::isfinite(a) && a >= 0 && a < 1,
                 "[sensitivity] every amount must be in [0, 1), got ", a);
  LOPPER_CHECK(o.eval_batches > 0,
               "[sensitivity] " LOPPER_OPTION("eval_batches") " must be > 0, got ", o.eval_batches);
  LOPPER_CHECK(o.round_to >= 1, "[sensitivity] " LOPPER_OPTION("round_to") " must be >= 1, got ",
               o.round_to);
  // NOTE: a sweep evaluates the model once per layer and amount; a criterion that needs data would
  // need it again at every point (and within a layer, a rescaling of |w| such as LAMP ranks as l1).
  using importance::Criterion;
  auto data = [](const Criterion& c) { return c.needs_data(); };
  if (o.structured) {
    const Criterion& c = importance::find(o.criterion, importance::Use::kChannels);
    LOPPER_CHECK(
        !c.needs_data(), "[sensitivity] structured sensitivity ranks channels by ",
        importance::names(
            importance::Use::kChannels, [](const Criterion& x) { return !x.needs_data(); }, " or "),
        " (", importance::names(importance::Use::kChannels, data, " and "),
        " would calibrate again at every point)");
  } else {
    auto sweeps = [](const Criterion& x) {
      return x.needs == importance::Needs::kActivations ||
             (!x.needs_data() && (x.weights == importance::WeightRank::kMagnitude ||
                                  x.weights == importance::WeightRank::kDrawn));
    };
    auto gradients = [](const Criterion& x) { return x.needs == importance::Needs::kGradients; };
    const Criterion& c = importance::find(o.criterion, importance::Use::kWeights);
    LOPPER_CHECK(sweeps(c), "[sensitivity] " LOPPER_OPTION("criterion") " must be ",
                 importance::names(importance::Use::kWeights, sweeps, " or "), " (",
                 importance::names(importance::Use::kWeights, gradients, " and "),
                 " need gradients per point: prune with them after choosing amounts)");
    if (c.needs == importance::Needs::kActivations) {
      LOPPER_CHECK(o.calib_batches >= 0,
                   "[sensitivity] " LOPPER_OPTION("calib_batches") " must be >= 0, got ",
                   o.calib_batches);
      PruneLayerOptions lo;
      lo.criterion = o.criterion;
      lo.block_size = o.block_size;
      lo.dampening = o.dampening;
      try {
        check_layer_options(lo);
      } catch (const Error& e) {
        // The same message, options still marked for the caller to name, as the sweep's.
        std::string m = e.render([](const std::string& n) { return "\x1e" + n + "\x1f"; });
        if (m.rfind("[prune] ", 0) == 0) m = m.substr(8);
        throw Error("[sensitivity] " + m);
      }
    }
  }
}

EffectiveCost effective_cost(const ir::Model& model,
                             const std::map<std::string, std::vector<int64_t>>& input_shapes) {
  return effective_cost(analyze(model, input_shapes));
}

EffectiveCost effective_cost(const ModelCost& c) {
  EffectiveCost e;
  e.params = c.nonzero;
  e.dense_macs = c.macs;
  double saved = 0;
  for (const auto& l : c.layers)
    if (l.params > 0) saved += double(l.macs) * (1.0 - double(l.nonzero) / double(l.params));
  e.macs = c.macs - int64_t(std::llround(saved));
  return e;
}

SensitivityResult sensitivity(const ir::Model& model, DataLoader& data,
                              const SensitivityOptions& opts) {
  check_sensitivity_options(opts);
  const EvalSet s = read_batches(data, opts.eval_batches);
  SensitivityResult r =
      opts.structured || opts.blocks ? channels(model, s, opts) : weights(model, data, s, opts);
  r.samples = s.samples;
  return r;
}

std::string sensitivity_json(const SensitivityResult& r) {
  nlohmann::json layers = nlohmann::json::array();
  for (const auto& l : r.layers) {
    nlohmann::json pts = nlohmann::json::array();
    for (const auto& p : l.points)
      pts.push_back({{"amount", p.amount},
                     {"removed", p.removed},
                     {"loss", p.loss},
                     {"top1", p.top1},
                     {"params", p.params},
                     {"macs", p.macs}});
    nlohmann::json jl = {{"name", l.name},
                         {"layers", l.layers},
                         {"params", l.params},
                         {"macs", l.macs},
                         {"points", pts}};
    if (!l.weight.empty()) jl["weight"] = l.weight;
    if (!l.param.empty()) jl["param"] = l.param;
    if (l.group >= 0) jl["group"] = l.group;
    if (l.block >= 0) jl["block"] = l.block;
    layers.push_back(jl);
  }
  nlohmann::json j = {
      {"format", "lopper.sensitivity/1"},
      {"unit", r.unit},
      {"method", r.method},
      {"base", {{"loss", r.loss}, {"top1", r.top1}, {"params", r.params}, {"macs", r.macs}}},
      {"samples", r.samples},
      {"layers", layers}};
  if (!r.skipped.empty()) j["skipped"] = r.skipped;
  return j.dump(1);
}

SensitivityResult parse_sensitivity(const std::string& text, const std::string& source) {
  SensitivityResult r;
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    LOPPER_CHECK(j.value("format", "") == "lopper.sensitivity/1", "[sensitivity] ", source,
                 " is not a lopper sensitivity file (no \"format\": \"lopper.sensitivity/1\")");
    r.unit = j.at("unit").get<std::string>();
    LOPPER_CHECK(r.unit == "weight" || r.unit == "channel" || r.unit == "block" ||
                     r.unit == "channel+block" || r.unit == "expert",
                 "[sensitivity] ", source,
                 ": unit must be weight, channel, block, channel+block or expert, got '", r.unit,
                 "'");
    r.method = j.value("method", "");
    const auto& b = j.at("base");
    r.loss = b.at("loss").get<double>();
    r.top1 = b.at("top1").get<double>();
    r.params = b.at("params").get<int64_t>();
    r.macs = b.at("macs").get<int64_t>();
    r.samples = j.at("samples").get<int64_t>();
    r.skipped = j.value("skipped", std::vector<std::string>());
    for (const auto& jl : j.at("layers")) {
      LayerSensitivity l;
      l.name = jl.at("name").get<std::string>();
      l.layers = jl.at("layers").get<std::vector<std::string>>();
      l.weight = jl.value("weight", "");
      l.param = jl.value("param", "");
      l.group = jl.value("group", int64_t(-1));
      l.block = jl.value("block", int64_t(-1));
      l.params = jl.at("params").get<int64_t>();
      l.macs = jl.at("macs").get<int64_t>();
      for (const auto& jp : jl.at("points")) {
        SensitivityPoint p;
        p.amount = jp.at("amount").get<double>();
        p.removed = jp.at("removed").get<double>();
        p.loss = jp.at("loss").get<double>();
        p.top1 = jp.at("top1").get<double>();
        p.params = jp.at("params").get<int64_t>();
        p.macs = jp.at("macs").get<int64_t>();
        l.points.push_back(p);
      }
      r.layers.push_back(std::move(l));
    }
  } catch (const nlohmann::json::exception& e) {
    throw Error(detail::concat("[sensitivity] ", source, ": ", e.what()));
  }
  return r;
}

}  // namespace lopper
