// prune_calibrated(): one-shot pruning with calibration data, block by block (lopper/prune.h).
//
// The graph, in topological order, is cut before the first layer of each block (a transformer
// layer: the layers whose names share a prefix ending in a number; any other layer alone). Every
// calibration batch's values that cross a cut are carried from one block to the next: a block
// runs once on them to collect its layers' inputs (LayerInputCollector), its layers are pruned,
// and it runs again, pruned, to hand the next block its inputs. The whole model never runs twice.
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "exec/allocator.h"
#include "lopper/data.h"
#include "lopper/error.h"
#include "lopper/executor.h"
#include "lopper/prune.h"
#include "prune/importance.h"
#include "prune/layer_inputs.h"
#include "prune/plan.h"
#include "prune/sparsegpt.h"
#include "train/loss.h"

namespace lopper {

void check_calibration(const DataLoader& data, const CalibrationOptions& calib) {
  LOPPER_CHECK(calib.batches > 0, "[prune] " LOPPER_OPTION("batches") " must be > 0, got ",
               calib.batches);
  const int64_t have = data.batches_per_epoch();
  LOPPER_CHECK(have >= calib.batches, "[prune] ", data.dataset().name(), " has ", have,
               " calibration batch", have == 1 ? "" : "es", " of ", data.options().batch_size,
               ", fewer than the ", calib.batches, " asked: give more data or fewer batches");
}

namespace {

using importance::Criterion;
using importance::Needs;
using importance::WeightRank;

const Criterion& criterion_of(const PruneLayerOptions& o) {
  return importance::find(o.criterion, importance::Use::kWeights);
}

bool reads_inputs(const PruneLayerOptions& o) {
  return criterion_of(o).needs == Needs::kActivations;
}

// "model.layers.3" for "model.layers.3.mlp.up_proj.weight" or "/model/layers.3/mlp/MatMul": the
// name up to its first component that is a number; "" when it has none.
std::string block_key(const std::string& name) {
  size_t start = 0;
  for (size_t i = 0; i <= name.size(); ++i) {
    if (i < name.size() && name[i] != '.' && name[i] != '/') continue;
    if (i > start && std::all_of(name.begin() + long(start), name.begin() + long(i),
                                 [](char c) { return c >= '0' && c <= '9'; }))
      return name.substr(0, i);
    start = i + 1;
  }
  return "";
}

// The block a target belongs to, by its parameter's, its layer's or its weight's name.
std::string block_of(const Target& t) {
  for (const std::string& n : {t.weight.param, t.node->label(), t.weight.weight}) {
    std::string k = block_key(n);
    if (!k.empty()) return k;
  }
  return "";
}

// Ops that hand a weight on with its values unchanged but for layout or type.
bool passes_weight_on(const ir::Node& n) {
  static const std::unordered_set<std::string> ops = {
      "Identity", "Transpose", "Cast", "CastLike", "Reshape", "Squeeze", "Unsqueeze", "Flatten"};
  return n.domain.empty() && ops.count(n.op_type) > 0;
}

// A run of consecutive nodes (positions [begin, end) of the topological order) and the targets
// whose first layer is among them.
struct Segment {
  size_t begin = 0, end = 0;
  std::vector<size_t> targets;  // indices into PrunePlan::targets
  std::string name;             // the block, or the layer's label
  bool block = false;           // a block of layers named alike (a transformer layer)
};

// The plan's targets cut into segments: one per block (`by_block`; a target outside the blocks is
// one of its own), else one for them all. `target_pos`: where each target's segment would start in
// the order the nodes run; `end`: the number of nodes.
std::vector<Segment> cut_segments(const PrunePlan& plan, const std::vector<size_t>& target_pos,
                                  size_t end, bool by_block) {
  std::vector<size_t> by_pos(plan.targets.size());
  for (size_t i = 0; i < by_pos.size(); ++i) by_pos[i] = i;
  std::stable_sort(by_pos.begin(), by_pos.end(),
                   [&](size_t a, size_t b) { return target_pos[a] < target_pos[b]; });
  std::vector<Segment> out;
  std::string last_key;
  for (size_t i : by_pos) {
    const std::string key = block_of(plan.targets[i]);
    const bool same = !out.empty() && (!by_block || (!key.empty() && key == last_key));
    if (!same) {
      Segment s;
      s.begin = out.empty() ? 0 : target_pos[i];
      s.name = !by_block ? "the model" : key.empty() ? plan.targets[i].weight.label() : key;
      s.block = by_block && !key.empty();
      if (!out.empty()) out.back().end = s.begin;
      out.push_back(std::move(s));
    }
    out.back().targets.push_back(i);
    last_key = key;
  }
  if (!out.empty()) out.back().end = end;
  return out;
}

// Where the layers' inputs come from, a segment at a time: lopper's executor on the model's graph
// (Calibration), or the caller running its own model (Runner).
class Source {
 public:
  virtual ~Source() = default;
  // The model's segments: one per block (`by_block`), else one for the whole model.
  virtual std::vector<Segment> segments(bool by_block) const = 0;
  // Each watched weight's inputs over every batch, with the segment as it is now.
  virtual std::map<std::string, LayerInput> collect(const Segment& s,
                                                    const std::map<std::string, bool>& watch) = 0;
  // Runs the segment (as pruned now) on every batch, so that the next one sees its outputs.
  virtual void advance(const Segment& s) = 0;
};

class Calibration final : public Source {
 public:
  Calibration(ir::Model& model, PrunePlan& plan, DataLoader& data, const CalibrationOptions& calib)
      : model_(model), plan_(plan), calib_(calib) {
    const ir::Graph& g = model.graph;
    order_ = g.topological_order();
    std::vector<size_t> pos(g.nodes.size());
    for (size_t p = 0; p < order_.size(); ++p) pos[order_[p]] = p;
    for (size_t p = 0; p < order_.size(); ++p)
      for (const auto& v : ir::node_reads(g.nodes[order_[p]]))
        if (!v.empty()) last_read_[v] = p;
    for (const auto& init : g.initializers) constants_.insert(init.name);
    // A block starts at the first node that reads one of its weights: the layer itself, or a
    // Transpose (Cast, Reshape...) that hands the weight to it. Cut at the layer, such a node would
    // run in the block before, on the weight not yet pruned, and hand it over as an activation.
    target_pos_.resize(plan.targets.size());
    for (size_t i = 0; i < plan.targets.size(); ++i) {
      size_t first = pos[size_t(plan.targets[i].node - g.nodes.data())];
      std::unordered_set<std::string> views = {plan.targets[i].init->name};
      for (size_t p = 0; p < order_.size() && p < first; ++p) {
        const ir::Node& n = g.nodes[order_[p]];
        const bool reads = std::any_of(n.inputs.begin(), n.inputs.end(),
                                       [&](const std::string& v) { return views.count(v) > 0; });
        if (!reads) continue;
        first = std::min(first, p);
        if (passes_weight_on(n))
          for (const auto& o : n.outputs) views.insert(o);
      }
      target_pos_[i] = first;
    }
    load_batches(data);
  }

  std::vector<Segment> segments(bool by_block) const override {
    return cut_segments(plan_, target_pos_, order_.size(), by_block);
  }

  std::map<std::string, LayerInput> collect(const Segment& s,
                                            const std::map<std::string, bool>& watch) override {
    ir::Model sub = segment_model(s);
    LayerInputCollector collector(sub.graph, watch);
    Executor ex = executor(sub);
    ex.on_node = [&](const ir::Node& n, const std::vector<at::Tensor>& in,
                     const std::vector<at::Tensor>&) { collector.observe(n, in); };
    const std::vector<std::string> ins = inputs_of(sub);
    for (auto& live : live_) (void)ex.run(gather(live, ins));
    return collector.take();
  }

  void advance(const Segment& s) override {
    ir::Model sub = segment_model(s);
    Executor ex = executor(sub);
    const std::vector<std::string> ins = inputs_of(sub);
    for (auto& live : live_) {
      std::vector<at::Tensor> outs = ex.run(gather(live, ins));
      for (auto it = live.begin(); it != live.end();)
        it = last_read(it->first) < s.end ? live.erase(it) : std::next(it);
      for (size_t k = 0; k < outs.size(); ++k) live[sub.graph.outputs[k].name] = outs[k];
    }
  }

 private:
  size_t last_read(const std::string& v) const {
    auto it = last_read_.find(v);
    return it == last_read_.end() ? 0 : it->second;
  }

  void load_batches(DataLoader& data) {
    const ModelIO io = model_io(model_);
    Objective objective(calib_.loss, io);
    const at::Device device = parse_device(calib_.device);
    data.start_epoch(0);
    Batch b;
    for (int64_t i = 0; i < calib_.batches && data.next(b); ++i) {
      objective.prepare(b, i);
      std::unordered_map<std::string, at::Tensor> live;
      for (auto& [name, t] : feeds(io, b, device)) live[name] = t;
      live_.push_back(std::move(live));
    }
    LOPPER_CHECK(int64_t(live_.size()) == calib_.batches, "[prune] ", data.dataset().name(),
                 " gave ", live_.size(), " calibration batches of ", calib_.batches, " asked");
  }

  // Nodes [s.begin, s.end) as a model of their own: its inputs are the values they read that
  // are not constants (carried from the blocks before), its outputs the values they make that a
  // later node reads. Initializers are shared, not copied.
  ir::Model segment_model(const Segment& s) const {
    const ir::Graph& g = model_.graph;
    ir::Model sub;
    sub.ir_version = model_.ir_version;
    sub.opset_import = model_.opset_import;
    sub.functions = model_.functions;
    sub.graph.name = g.name;
    sub.graph.value_info = g.value_info;
    std::unordered_set<std::string> made, added;
    std::set<std::string> reads;
    for (size_t p = s.begin; p < s.end; ++p) {
      const ir::Node& n = g.nodes[order_[p]];
      sub.graph.nodes.push_back(n);
      for (const auto& v : ir::node_reads(n))
        if (!v.empty() && !made.count(v)) reads.insert(v);
      for (const auto& o : n.outputs)
        if (!o.empty()) made.insert(o);
    }
    for (const auto& v : reads) {
      if (constants_.count(v)) {
        sub.graph.initializers.push_back(*g.find_initializer(v));
      } else if (!made.count(v)) {
        sub.graph.inputs.push_back({v, {}, ""});
      }
    }
    for (size_t p = s.begin; p < s.end; ++p)
      for (const auto& o : g.nodes[order_[p]].outputs)
        if (!o.empty() && last_read(o) >= s.end && added.insert(o).second)
          sub.graph.outputs.push_back({o, {}, ""});
    return sub;
  }

  static std::vector<std::string> inputs_of(const ir::Model& sub) {
    std::vector<std::string> out;
    for (const auto& v : sub.graph.inputs) out.push_back(v.name);
    return out;
  }

  NamedTensors gather(const std::unordered_map<std::string, at::Tensor>& live,
                      const std::vector<std::string>& names) const {
    NamedTensors in;
    for (const auto& n : names) {
      auto it = live.find(n);
      LOPPER_ASSERT(it != live.end(), "calibration: value '", n, "' was not carried");
      in.emplace_back(n, it->second);
    }
    return in;
  }

  Executor executor(const ir::Model& sub) const {
    ExecOptions eo;
    eo.device = calib_.device;
    eo.fuse = false;     // every layer runs as itself, with its own input
    eo.prepack = false;  // no weight copies, no kernel timing: two passes per block
    eo.fold_constants = false;
    return Executor(sub, eo);
  }

  ir::Model& model_;
  PrunePlan& plan_;
  const CalibrationOptions& calib_;
  std::vector<size_t> order_, target_pos_;
  std::unordered_map<std::string, size_t> last_read_;
  std::unordered_set<std::string> constants_;
  std::vector<std::unordered_map<std::string, at::Tensor>> live_;  // per batch
};

// The caller runs its own model (a layer model: layer_model()), a segment at a time.
class Runner final : public Source {
 public:
  Runner(ir::Model& model, PrunePlan& plan, CalibrationRunner& runner)
      : model_(model), plan_(plan), runner_(runner) {
    const ir::Graph& g = model.graph;
    for (const auto& t : plan.targets) target_pos_.push_back(size_t(t.node - g.nodes.data()));
    for (const auto& n : g.nodes) nodes_[n.name] = &n;
  }

  std::vector<Segment> segments(bool by_block) const override {
    return cut_segments(plan_, target_pos_, model_.graph.nodes.size(), by_block);
  }

  std::map<std::string, LayerInput> collect(const Segment& s,
                                            const std::map<std::string, bool>& watch) override {
    const ir::Graph& g = model_.graph;
    LayerInputCollector collector(g, watch);
    std::vector<std::string> watched;
    for (const auto& n : g.nodes)
      if (n.inputs.size() > 1 && watch.count(n.inputs[1])) watched.push_back(n.name);
    runner_.collect(view(s), watched, [&](const std::string& layer, const at::Tensor& x) {
      auto it = nodes_.find(layer);
      LOPPER_CHECK(it != nodes_.end(), "[prune] calibration: no layer '", layer, "'");
      const ir::Node& n = *it->second;
      collector.observe(n, {x, g.find_initializer(n.inputs[1])->value});
    });
    return collector.take();
  }

  void advance(const Segment& s) override { runner_.advance(view(s)); }

 private:
  CalibrationSegment view(const Segment& s) const {
    CalibrationSegment v;
    v.name = s.name;
    v.block = s.block;
    for (size_t i : s.targets) v.layers.push_back(plan_.targets[i].node->name);
    return v;
  }

  ir::Model& model_;
  PrunePlan& plan_;
  CalibrationRunner& runner_;
  std::vector<size_t> target_pos_;
  std::unordered_map<std::string, const ir::Node*> nodes_;
};

// A weight as [outputs, inputs]: the output axis first, the other axes flattened in order.
at::Tensor as_rows(const at::Tensor& w, int64_t out_axis) {
  return w.movedim(out_axis, 0).reshape({w.size(out_axis), -1});
}

}  // namespace

at::Tensor layer_solve(const Target& t, const PruneLayerOptions& o, const SparseGptFactor& factor,
                       int64_t nonzero) {
  const at::Tensor& v = t.init->value;
  SparseGptOptions so;
  so.block_size = o.block_size;
  so.dampening = o.dampening;
  if (o.pattern == PrunePattern::kNM) {
    so.n = o.n;
    so.m = o.m;
  } else {
    so.amount =
        o.amount.is_count ? o.amount.value / double(std::max<int64_t>(nonzero, 1)) : o.amount.value;
  }
  SparseGptResult r = sparsegpt(as_rows(v, t.out_axis), factor, so);
  return r.weight.reshape(v.movedim(t.out_axis, 0).sizes())
      .movedim(0, t.out_axis)
      .to(v.scalar_type());
}

namespace {

// SparseGPT's factors of a segment's Hessians: computed once for the layers that read the same
// inputs (their LayerInputs share one Gram matrix: q, k and v; gate and up) and the same
// dampening, each dropped after the last of them.
class SharedFactors {
 public:
  void expect(const at::Tensor& gram, double dampening) { ++slots_[{key(gram), dampening}].uses; }
  /// The factor of `gram` (moved in: the solver works on it in place where nothing else holds it).
  const SparseGptFactor& of(at::Tensor gram, double dampening, const std::string& where) {
    Slot& s = slots_[{key(gram), dampening}];
    if (!s.factor.hinv.defined()) s.factor = sparsegpt_factor(std::move(gram), dampening, where);
    return s.factor;
  }
  void done(const void* gram, double dampening) {
    auto it = slots_.find({gram, dampening});
    if (it != slots_.end() && --it->second.uses <= 0) slots_.erase(it);
  }
  static const void* key(const at::Tensor& gram) { return gram.unsafeGetTensorImpl(); }

 private:
  struct Slot {
    int uses = 0;
    SparseGptFactor factor;
  };
  std::map<std::pair<const void*, double>, Slot> slots_;
};

// Prunes target i of the plan under `o` with its layer's inputs (`in`, null for the criteria that
// do not read them).
void prune_target(PrunePlan& plan, size_t i, const PruneLayerOptions& o, LayerInput* in,
                  const Saliency* saliency, SharedFactors& factors) {
  const Target& t = plan.targets[i];
  PruneLayerReport& l = plan.report.layers[t.report];
  const Criterion& c = criterion_of(o);
  l.method = method_string(o, PruneScope::kLocal);
  l.amount = amount_string(o);
  if (c.needs == Needs::kActivations && !in) {
    l.skipped = "the calibration data never reached it";
    plan.report.warnings.push_back(l.label() +
                                   " left alone: the calibration data never reached it");
    return;
  }
  if (c.weights == WeightRank::kReconstruct) {
    at::Tensor& v = t.init->value;
    const void* key = SharedFactors::key(in->gram);
    at::Tensor w = layer_solve(t, o, factors.of(std::move(in->gram), o.dampening, l.label()),
                               l.nonzero_before);
    factors.done(key, o.dampening);
    if (v.is_contiguous() && v.use_count() == 1 && v.storage().use_count() == 1)
      v.copy_(w);
    else
      v = w.contiguous();
    l.nonzero_after = v.count_nonzero().item<int64_t>();
    return;
  }
  std::vector<at::Tensor> drop = {
      layer_keep(t, o, plan.generator(i), l.name, layer_score(t, c, saliency, in)).logical_not()};
  apply_masks({t}, drop, plan.report);
}

// OWL's amount per target: blocks with more outlier Wanda scores (above M x the block's mean)
// keep more weights; amounts spread over amount +- lambda and average the amount. A layer outside
// the model's blocks (an LM head) keeps the amount.
std::vector<double> owl_amounts(const PrunePlan& plan, const std::vector<Segment>& blocks,
                                const std::map<std::string, LayerInput>& inputs,
                                const PruneOptions& opts) {
  static const Criterion& wanda = importance::find("wanda", importance::Use::kWeights);
  std::vector<double> ratio;
  std::vector<const Segment*> owl_blocks;
  for (const auto& b : blocks) {
    if (!b.block) continue;
    owl_blocks.push_back(&b);
    std::vector<at::Tensor> scores;
    for (size_t i : b.targets) {
      const Target& t = plan.targets[i];
      auto it = inputs.find(t.init->name);
      if (it == inputs.end()) continue;
      scores.push_back(layer_score(t, wanda, nullptr, &it->second).flatten());
    }
    if (scores.empty()) {
      ratio.push_back(0);
      continue;
    }
    const at::Tensor all = at::cat(scores).to(at::kDouble);
    const double mean = all.mean().item<double>();
    ratio.push_back(100.0 * all.gt(opts.owl.m * mean).sum().item<double>() / double(all.numel()));
  }
  if (ratio.empty()) return std::vector<double>(plan.targets.size(), opts.amount.value);
  const auto [lo, hi] = std::minmax_element(ratio.begin(), ratio.end());
  const double lo_v = *lo, span = *hi - *lo;
  std::vector<double> keep(ratio.size());
  double mean_keep = 0;
  for (size_t b = 0; b < ratio.size(); ++b) {
    keep[b] = span > 0 ? (ratio[b] - lo_v) / span * opts.owl.lambda * 2 : 0;
    mean_keep += keep[b] / double(ratio.size());
  }
  std::vector<double> amount(plan.targets.size(), opts.amount.value);
  for (size_t b = 0; b < owl_blocks.size(); ++b)
    for (size_t i : owl_blocks[b]->targets)
      amount[i] = std::clamp(1 - (keep[b] - mean_keep + (1 - opts.amount.value)), 0.0, 1.0);
  return amount;
}

bool needs_gradients(const PrunePlan& plan) {
  bool gradients = false;
  for (const auto* o : plan.how) gradients |= criterion_of(*o).needs == Needs::kGradients;
  return gradients;
}

// The segments calibrated and pruned in turn, their inputs from `cal`.
PruneReport run(PrunePlan& plan, Source& cal, const CalibrationOptions& calib,
                const PruneOptions* opts, const Saliency* saliency) {
  const std::vector<Segment> segments = cal.segments(calib.sequential);
  if (calib.sequential && segments.size() > 1 &&
      std::none_of(segments.begin(), segments.end(), [](const Segment& s) { return s.block; }))
    plan.report.warnings.push_back(
        "no transformer blocks in the layer names (a prefix ending in a number, model.layers.3): "
        "each layer was calibrated as a block of its own, on the layers before it pruned");

  // OWL: the outlier ratios of the unpruned model's blocks, in one pass.
  std::vector<PruneLayerOptions> owl_how;
  const bool owl = opts && opts->owl.lambda != 0;
  const int64_t passes = int64_t(segments.size()) + (owl ? 1 : 0);
  int64_t pass = 0;
  if (owl) {
    if (calib.on_pass) calib.on_pass(++pass, passes, "OWL outlier ratios");
    std::map<std::string, bool> watch;
    for (const auto& t : plan.targets) watch[t.init->name] = false;
    const auto inputs = cal.collect(cal.segments(false).front(), watch);
    const std::vector<double> amount = owl_amounts(plan, cal.segments(true), inputs, *opts);
    owl_how.reserve(plan.targets.size());
    for (size_t i = 0; i < plan.targets.size(); ++i) {
      owl_how.push_back(*plan.how[i]);
      owl_how.back().amount = PruneAmount{amount[i], false};
      plan.how[i] = &owl_how.back();
    }
  }

  for (size_t si = 0; si < segments.size(); ++si) {
    const Segment& s = segments[si];
    if (calib.on_pass) calib.on_pass(++pass, passes, s.name);
    std::map<std::string, bool> watch;
    for (size_t i : s.targets)
      if (reads_inputs(*plan.how[i]))
        watch[plan.targets[i].init->name] |= criterion_of(*plan.how[i]).needs_gram;
    std::map<std::string, LayerInput> inputs;
    if (!watch.empty()) inputs = cal.collect(s, watch);
    SharedFactors factors;
    for (size_t i : s.targets) {
      auto it = inputs.find(plan.targets[i].init->name);
      if (it != inputs.end() && it->second.gram.defined() &&
          criterion_of(*plan.how[i]).weights == WeightRank::kReconstruct)
        factors.expect(it->second.gram, plan.how[i]->dampening);
    }
    for (size_t i : s.targets) {
      auto it = inputs.find(plan.targets[i].init->name);
      prune_target(plan, i, *plan.how[i], it == inputs.end() ? nullptr : &it->second, saliency,
                   factors);
      if (it != inputs.end()) inputs.erase(it);
      exec::empty_cpu_cache();  // the solver's K x K matrices
    }
    if (si + 1 < segments.size()) cal.advance(s);
    // NOTE: the next block's shapes are the same, but its Hessians and the solver's copies are
    // freed now: memory stays at about one block's, not a high-water mark of cached blocks.
    exec::empty_cpu_cache();
    if (calib.release_memory) calib.release_memory();
  }
  finish_report(plan.report);
  return std::move(plan.report);
}

// On `data`, lopper's executor running the model's graph.
PruneReport run(ir::Model& model, PrunePlan& plan, DataLoader& data,
                const CalibrationOptions& calib, const PruneOptions* opts) {
  check_calibration(data, calib);
  // Gradient criteria (a recipe's) score on the unpruned model first.
  std::optional<Saliency> saliency;
  if (needs_gradients(plan)) saliency = compute_saliency(model, data, calib);

  // The plan counted every weight's zeros: its pages and temporaries need not stay.
  exec::empty_cpu_cache();
  if (calib.release_memory) calib.release_memory();
  c10::NoGradGuard no_grad;
  Calibration cal(model, plan, data, calib);
  return run(plan, cal, calib, opts, saliency ? &*saliency : nullptr);
}

// On the caller's model, which `runner` runs.
PruneReport run(ir::Model& layers, PrunePlan& plan, CalibrationRunner& runner,
                const CalibrationOptions& calib, const PruneOptions* opts) {
  if (needs_gradients(plan))
    throw UsageError(
        "[prune] grad and taylor rank by gradients of the whole model: they do not go with a "
        "calibration of its blocks one by one");
  c10::NoGradGuard no_grad;
  Runner cal(layers, plan, runner);
  return run(plan, cal, calib, opts, nullptr);
}

}  // namespace

PruneReport prune_calibrated(ir::Model& model, const PruneOptions& opts, DataLoader& data,
                             const CalibrationOptions& calib) {
  PrunePlan plan = plan_prune(model, opts);
  return run(model, plan, data, calib, &opts);
}

PruneReport prune_calibrated(ir::Model& model, const PruneRecipe& recipe, DataLoader& data,
                             const CalibrationOptions& calib) {
  PrunePlan plan = plan_prune(model, recipe);
  return run(model, plan, data, calib, nullptr);
}

PruneReport prune_calibrated(ir::Model& layers, const PruneOptions& opts, CalibrationRunner& runner,
                             const CalibrationOptions& calib) {
  PrunePlan plan = plan_prune(layers, opts);
  return run(layers, plan, runner, calib, &opts);
}

PruneReport prune_calibrated(ir::Model& layers, const PruneRecipe& recipe,
                             CalibrationRunner& runner, const CalibrationOptions& calib) {
  PrunePlan plan = plan_prune(layers, recipe);
  return run(layers, plan, runner, calib, nullptr);
}

ir::Model layer_model(const std::vector<ModuleLayer>& layers) {
  ir::Model m;
  m.opset_import = {{"", 17}};
  ir::Graph& g = m.graph;
  g.name = "layers";
  std::unordered_set<std::string> weights, embedded;
  for (const auto& l : layers) {
    LOPPER_CHECK(l.weight.defined(), "[prune] layer '", l.name, "' has no weight");
    const int64_t rank = l.weight.dim();
    const bool conv = l.op == "Conv";
    LOPPER_CHECK(l.op == "Gemm" || l.op == "MatMul" || conv, "[prune] layer '", l.name, "': op ",
                 l.op, " is not Gemm, MatMul or Conv");
    LOPPER_CHECK(conv ? rank >= 3 : rank == 2, "[prune] layer '", l.name, "' (", l.op,
                 ") has a weight of rank ", rank);
    ir::Node n;
    n.name = l.name;
    n.op_type = l.op;
    n.inputs = {l.name + ":input", l.param};
    n.outputs = {l.name + ":output"};
    if (l.op == "Gemm") n.attrs.push_back(ir::int_attr("transB", 1));
    if (conv) {
      n.attrs.push_back(ir::int_attr("group", l.group));
      if (!l.strides.empty()) n.attrs.push_back(ir::ints_attr("strides", l.strides));
      if (!l.pads.empty()) n.attrs.push_back(ir::ints_attr("pads", l.pads));
      if (!l.dilations.empty()) n.attrs.push_back(ir::ints_attr("dilations", l.dilations));
    }
    g.inputs.push_back({n.inputs[0], {}, ""});
    g.outputs.push_back({n.outputs[0], {}, ""});
    if (weights.insert(l.param).second) g.initializers.push_back({l.param, l.weight, "", false});
    g.nodes.push_back(std::move(n));
    if (!l.embedding.empty() && embedded.insert(l.param).second) {
      ir::Node e;
      e.name = l.embedding;
      e.op_type = "Gather";
      e.inputs = {l.param, l.embedding + ":ids"};
      e.outputs = {l.embedding + ":output"};
      g.inputs.push_back({e.inputs[1], {}, ""});
      g.outputs.push_back({e.outputs[0], {}, ""});
      g.nodes.push_back(std::move(e));
    }
  }
  return m;
}

}  // namespace lopper
