// prune(): which weights are prunable, which axis is a row, a column and the reduction, and the
// masks applied to a model.
#include "lopper/prune.h"
#include "prune/masks.h"
#include "prune/plan.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <map>
#include <optional>
#include <sstream>
#include <unordered_set>

#include "analysis/weights.h"
#include "lopper/analysis.h"
#include "lopper/error.h"
#include "lopper/onnx_io.h"
#include "prune/importance.h"
#include "prune/layer_filter.h"
#include "prune/layer_inputs.h"

namespace lopper {

namespace {

// The initializer axes that hold the layer's output units and input (reduction) units. A weight
// read through a Transpose has its axes mapped back through the permutation.
void find_axes(const ir::Graph& g, const ir::Node& n, const at::Tensor& weight, int64_t& in_axis,
               int64_t& out_axis) {
  int64_t rank = weight.dim();
  int64_t in = -1, out = -1;
  if (n.op_type == "Conv") {
    out = 0, in = 1;
  } else if (n.op_type == "ConvTranspose") {
    in = 0, out = 1;
  } else if (n.op_type == "Gemm") {
    const ir::Attribute* a = n.attr("transB");
    bool trans_b = a && a->i != 0;
    out = trans_b ? 0 : 1, in = trans_b ? 1 : 0;
  } else if (rank >= 2) {  // MatMul: B is [..., K, N]
    in = rank - 2, out = rank - 1;
  }
  if (rank < 2) in = out = -1;
  std::vector<int64_t> perm(rank);
  for (int64_t i = 0; i < rank; ++i) perm[i] = i;
  if (!g.find_initializer(n.inputs[1])) {
    for (const auto& p : g.nodes)
      if (p.op_type == "Transpose" && p.outputs.size() == 1 && p.outputs[0] == n.inputs[1]) {
        const ir::Attribute* pa = p.attr("perm");
        if (pa && int64_t(pa->ints.size()) == rank)
          perm = pa->ints;
        else
          std::reverse(perm.begin(), perm.end());
      }
  }
  in_axis = in >= 0 ? perm[in] : -1;
  out_axis = out >= 0 ? perm[out] : -1;
}

std::string nm_name(const PruneLayerOptions& o) {
  return std::to_string(o.n) + ":" + std::to_string(o.m);
}

std::string block_name(const PruneLayerOptions& o) {
  return "block:" + std::to_string(o.block_r) + "x" + std::to_string(o.block_c);
}

bool ranks_by_norm(PrunePattern p) {
  return p == PrunePattern::kRow || p == PrunePattern::kColumn || p == PrunePattern::kBlock;
}

}  // namespace

using importance::Criterion;
using importance::WeightRank;

namespace {

const Criterion& criterion_of(const PruneLayerOptions& o) {
  return importance::find(o.criterion, importance::Use::kWeights);
}

}  // namespace

CriterionInfo weight_criterion_info(const std::string& name) {
  const Criterion& c = importance::find(name, importance::Use::kWeights);
  CriterionInfo i = importance::info(c);
  i.takes_threshold = c.weights == WeightRank::kThreshold;
  i.reads_inputs = c.needs == importance::Needs::kActivations;
  return i;
}

std::vector<CriterionInfo> weight_criteria() {
  return importance::infos(importance::Use::kWeights, weight_criterion_info);
}

std::string criterion_names(const std::vector<CriterionInfo>& criteria, const char* last,
                            bool data_only) {
  std::vector<const std::string*> names;
  for (const auto& c : criteria)
    if (!data_only || c.needs_data) names.push_back(&c.name);
  std::string s;
  for (size_t i = 0; i < names.size(); ++i)
    s += (i == 0 ? "" : i + 1 == names.size() ? last : ", ") + *names[i];
  return s;
}

void check_layer_options(const PruneLayerOptions& o) {
  const Criterion& c = criterion_of(o);
  if (c.weights == WeightRank::kThreshold) {
    LOPPER_CHECK(o.threshold >= 0 && std::isfinite(o.threshold),
                 "[prune] threshold must be >= 0, got ", o.threshold);
    LOPPER_CHECK(o.pattern == PrunePattern::kUnstructured,
                 "[prune] " LOPPER_OPTION("criterion") " ", c.name,
                 " removes single weights: use " LOPPER_OPTION("pattern") " unstructured");
  } else if (o.pattern != PrunePattern::kNM) {
    if (o.amount.is_count)
      LOPPER_CHECK(o.amount.value >= 0, "[prune] amount must be a count >= 0, got ",
                   o.amount.value);
    else
      LOPPER_CHECK(o.amount.value >= 0 && o.amount.value <= 1,
                   "[prune] amount must be in [0, 1], got ", o.amount.value);
  }
  if (o.pattern == PrunePattern::kNM) {
    LOPPER_CHECK(o.n >= 1 && o.m >= 2 && o.n < o.m, "[prune] N:M needs 1 <= N < M, got ",
                 nm_name(o));
    LOPPER_CHECK(c.weights != WeightRank::kDrawn,
                 "[prune] N:M keeps the most important weights of each group: use " LOPPER_OPTION(
                     "criterion") " ",
                 importance::names(
                     importance::Use::kWeights,
                     [](const Criterion& x) {
                       return x.weights == WeightRank::kMagnitude ||
                              x.weights == WeightRank::kScores;
                     },
                     " or "));
  }
  if (c.weights == WeightRank::kReconstruct) {
    LOPPER_CHECK(o.pattern == PrunePattern::kUnstructured || o.pattern == PrunePattern::kNM,
                 "[prune] " LOPPER_OPTION("criterion") " ", c.name,
                 " removes single weights: use " LOPPER_OPTION("pattern") " unstructured or N:M");
    LOPPER_CHECK(o.block_size >= 1 && o.block_size <= (int64_t(1) << 20),
                 "[prune] " LOPPER_OPTION("block_size") " must be in 1..1048576, got ",
                 o.block_size);
    LOPPER_CHECK(o.dampening > 0 && std::isfinite(o.dampening),
                 "[prune] " LOPPER_OPTION("dampening") " must be > 0, got ", o.dampening);
  }
  if (c.per_row && o.pattern == PrunePattern::kUnstructured)
    LOPPER_CHECK(!o.amount.is_count, "[prune] ", c.name,
                 " removes the amount from each output row: give it as a fraction, got ",
                 o.amount.str());
  if (o.pattern == PrunePattern::kBlock)
    LOPPER_CHECK(o.block_r >= 1 && o.block_r <= 256 && o.block_c >= 1 && o.block_c <= 256,
                 "[prune] bad pattern '", block_name(o),
                 "' (expected block:RxC with R, C in 1..256)");
  if (ranks_by_norm(o.pattern))
    LOPPER_CHECK(o.norm == 1 || o.norm == 2, "[prune] norm must be 1 or 2, got ", o.norm);
}

namespace {

// Ops that hand a tensor on with its values unchanged but for layout or type: a weight read
// through them is still read.
bool passes_on(const ir::Node& n) {
  static const std::unordered_set<std::string> ops = {
      "Identity", "Transpose", "Cast", "CastLike", "Reshape", "Squeeze", "Unsqueeze", "Flatten"};
  return n.domain.empty() && ops.count(n.op_type) > 0;
}

// Readers of the shape alone: pruning keeps every shape.
bool reads_shape(const ir::Node& n) {
  return n.domain.empty() && (n.op_type == "Shape" || n.op_type == "Size");
}

// Who reads which value: (node index, input position; -1 for a read from inside a subgraph).
using Readers = std::unordered_map<std::string, std::vector<std::pair<size_t, int64_t>>>;

Readers readers_of(const ir::Graph& g) {
  Readers r;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const ir::Node& n = g.nodes[i];
    std::unordered_set<std::string> direct;
    for (size_t k = 0; k < n.inputs.size(); ++k)
      if (!n.inputs[k].empty())
        r[n.inputs[k]].emplace_back(i, int64_t(k)), direct.insert(n.inputs[k]);
    for (const auto& v : ir::node_reads(n))
      if (!direct.count(v)) r[v].emplace_back(i, -1);
  }
  return r;
}

// Every reader of initializer `w` but `first`, through the ops that pass it on.
std::vector<WeightUse> other_uses(const ir::Graph& g, const ir::GraphIndex& index,
                                  const Readers& readers,
                                  const std::unordered_set<std::string>& outputs,
                                  const ir::Initializer* w, const ir::Node* first) {
  std::map<size_t, std::string> use;  // node index -> use, in node order
  std::vector<WeightUse> out;
  std::vector<std::pair<std::string, int>> todo = {{w->name, 0}};
  std::unordered_set<std::string> seen;
  while (!todo.empty()) {
    auto [v, depth] = todo.back();
    todo.pop_back();
    if (!seen.insert(v).second) continue;
    if (outputs.count(v)) out.push_back({v, "", "", "output"});
    auto it = readers.find(v);
    if (it == readers.end()) continue;
    for (const auto& [i, k] : it->second) {
      const ir::Node& n = g.nodes[i];
      if (k == 0 && passes_on(n) && depth < 16) {
        for (const auto& o : n.outputs)
          if (!o.empty()) todo.emplace_back(o, depth + 1);
        continue;
      }
      if (k >= 0 && reads_shape(n)) continue;
      std::string u = k == 1 && layer_weight(index, n) == w                 ? "layer"
                      : k == 0 && n.domain.empty() && n.op_type == "Gather" ? "embedding"
                                                                            : "other";
      auto [at, fresh] = use.emplace(i, u);
      if (!fresh && at->second != u) at->second = "other";  // read twice, not only as a weight
    }
  }
  for (const auto& [i, u] : use) {
    const ir::Node& n = g.nodes[i];
    if (&n == first && u == "layer") continue;
    out.push_back({n.label(), n.op_type, torch_module(n), u});
  }
  return out;
}

}  // namespace

std::string WeightUse::describe() const {
  if (use == "output") return "graph output '" + node + "'";
  const std::string name = "'" + (module.empty() ? node : module) + "' (" + op + ")";
  if (use == "embedding") return "embedding " + name;
  if (use == "layer") return "layer " + name;
  return name;
}

std::vector<std::string> PrunableWeight::names() const {
  std::vector<std::string> out = {node ? node->label() : "", weight, param};
  for (const auto& u : shared)
    if (u.use == "layer") out.push_back(u.node);
  return out;
}

std::string PrunableWeight::label() const {
  return !param.empty() ? param : node ? node->label() : weight;
}

bool PrunableWeight::tied() const {
  return std::any_of(shared.begin(), shared.end(),
                     [](const WeightUse& u) { return u.use != "layer"; });
}

std::string PrunableWeight::tie_reason() const {
  std::vector<const WeightUse*> ties;
  for (const auto& u : shared)
    if (u.use != "layer") ties.push_back(&u);
  if (ties.empty()) return "";
  const WeightUse& u = *ties.front();
  std::string s = (u.use == "output"      ? "also the "
                   : u.use == "embedding" ? "tied with "
                                          : "shared with ") +
                  u.describe();
  if (u.use == "other") s += ", not a prunable layer";
  if (ties.size() > 1) s += " (+" + std::to_string(ties.size() - 1) + " more)";
  s += ": pruning would change ";
  s += u.use == "embedding" ? "the embedding too"
       : u.use == "output"  ? "that output too"
                            : "it too";
  return s;
}

std::vector<PrunableWeight> prunable_weights(const ir::Graph& g) {
  const Readers readers = readers_of(g);
  const ir::GraphIndex index(g);
  std::unordered_set<std::string> outputs;
  for (const auto& o : g.outputs) outputs.insert(o.name);
  std::vector<PrunableWeight> out;
  std::unordered_set<std::string> seen;
  for (const auto& n : g.nodes) {
    const ir::Initializer* w = layer_weight(index, n);
    if (!w || !seen.insert(w->name).second) continue;
    PrunableWeight p;
    p.node = &n;
    p.weight = w->name;
    p.param = param_name(n, w->name);
    find_axes(g, n, w->value, p.in_axis, p.out_axis);
    p.shared = other_uses(g, index, readers, outputs, w, &n);
    out.push_back(std::move(p));
  }
  return out;
}

// The digits of `s` as a number below 10^8, or -1 when `s` is not 1 to 8 digits.
static int64_t small_count(const std::string& s) {
  if (s.empty() || s.size() > 8 || !std::all_of(s.begin(), s.end(), ::isdigit)) return -1;
  return std::stoll(s);
}

void parse_prune_pattern(const std::string& s, PruneLayerOptions& o) {
  const size_t colon = s.find(':');
  if (s == "unstructured") {
    o.pattern = PrunePattern::kUnstructured;
  } else if (s == "row") {
    o.pattern = PrunePattern::kRow;
  } else if (s == "column") {
    o.pattern = PrunePattern::kColumn;
  } else if (colon != std::string::npos && small_count(s.substr(0, colon)) >= 0 &&
             small_count(s.substr(colon + 1)) >= 0) {
    o.pattern = PrunePattern::kNM;
    o.n = small_count(s.substr(0, colon));
    o.m = small_count(s.substr(colon + 1));
  } else if (s.rfind("block", 0) == 0) {
    const size_t x = s.find('x');
    const bool ok = s.rfind("block:", 0) == 0 && x != std::string::npos;
    int64_t r = ok ? small_count(s.substr(6, x - 6)) : 0, c = ok ? small_count(s.substr(x + 1)) : 0;
    LOPPER_CHECK(r >= 1 && r <= 256 && c >= 1 && c <= 256, "[prune] bad pattern '", s,
                 "' (expected block:RxC with R, C in 1..256)");
    o.pattern = PrunePattern::kBlock;
    o.block_r = r;
    o.block_c = c;
  } else {
    throw Error("[prune] unknown pattern '" + s +
                "' (patterns: unstructured, N:M such as 2:4, row, column, block:RxC such as "
                "block:8x1)");
  }
}

void check_prune_options(const PruneOptions& o) {
  check_layer_options(o);
  // NOTE: a block's score is a mean, comparable across layers like |w| is; rows, columns and N:M
  // groups have no such common scale (a row's norm grows with the layer's fan-in).
  LOPPER_CHECK(o.scope == PruneScope::kLocal || o.pattern == PrunePattern::kUnstructured ||
                          o.pattern == PrunePattern::kBlock,
                      "[prune] " LOPPER_OPTION("scope") " global ranks single weights or blocks: "
                      "use " LOPPER_OPTION("pattern") " unstructured or block:RxC");
  const Criterion& c = criterion_of(o);
  LOPPER_CHECK(o.scope == PruneScope::kLocal || (!c.per_row && c.weights != WeightRank::kReconstruct),
               "[prune] ", c.name,
               " compares weights within each layer: use " LOPPER_OPTION("scope") " local (OWL "
               "spreads the amount over the layers)");
  if (o.owl.lambda != 0) {
    LOPPER_CHECK(o.owl.lambda > 0 && std::isfinite(o.owl.lambda),
                 "[prune] " LOPPER_OPTION("owl_lambda") " must be > 0, got ", o.owl.lambda);
    LOPPER_CHECK(o.owl.m > 0 && std::isfinite(o.owl.m),
                 "[prune] " LOPPER_OPTION("owl_m") " must be > 0, got ", o.owl.m);
    LOPPER_CHECK(o.pattern == PrunePattern::kUnstructured && !o.amount.is_count &&
                     c.weights != WeightRank::kThreshold && o.scope == PruneScope::kLocal,
                 "[prune] OWL spreads a fraction of unstructured weights over the layers: give "
                 "an amount as a fraction, " LOPPER_OPTION(
                     "pattern") " unstructured and " LOPPER_OPTION("scope") " local");
    LOPPER_CHECK(o.amount.value - o.owl.lambda >= 0 && o.amount.value + o.owl.lambda <= 1,
                 "[prune] OWL's amounts span amount +- lambda, which must stay in [0, 1]: ",
                 o.amount.value, " +- ", o.owl.lambda);
  }
  LayerFilter check_regex(o.exclude);
}

bool reads_layer_inputs(const PruneOptions& opts) {
  return criterion_of(opts).needs == importance::Needs::kActivations || opts.owl.lambda != 0;
}

bool reads_layer_inputs(const PruneRecipe& recipe) {
  bool reads =
      recipe.has_defaults && criterion_of(recipe.defaults).needs == importance::Needs::kActivations;
  for (const auto& r : recipe.rules)
    reads |= !r.skip && criterion_of(r.options).needs == importance::Needs::kActivations;
  return reads;
}

namespace {

// The prunable weights, once each (a weight shared by two layers is pruned once), and their rows
// in the report.
std::vector<Target> find_targets(ir::Graph& g, PruneReport& report) {
  std::vector<Target> all;
  for (auto& pw : prunable_weights(g)) {
    Target t;
    t.node = pw.node;
    t.init = g.find_initializer(pw.weight);
    t.in_axis = pw.in_axis, t.out_axis = pw.out_axis;
    t.report = report.layers.size();
    PruneLayerReport l;
    l.name = pw.node->label();
    l.op = pw.node->op_type;
    l.weight = pw.weight;
    l.param = pw.param;
    l.shared = pw.shared;
    l.shape = t.init->value.sizes().vec();
    l.params = t.init->value.numel();
    l.nonzero_before = l.nonzero_after = t.init->value.count_nonzero().item<int64_t>();
    if (auto w = importance::non_finite_warning(pw.weight, t.init->value); !w.empty())
      report.warnings.push_back(std::move(w));
    onnx::drop_pages(t.init->value);  // a mapped model's weight is read again when pruned
    report.layers.push_back(std::move(l));
    t.weight = std::move(pw);
    all.push_back(std::move(t));
  }
  LOPPER_CHECK(!all.empty(),
               "[prune] the model has no prunable weights (Conv, ConvTranspose, Gemm or MatMul "
               "with a weight initializer)");
  return all;
}

// Why `o` cannot prune this layer (its pattern does not fit the weight), or "".
std::string layer_skip_reason(const Target& t, const PruneLayerOptions& o) {
  if (o.pattern == PrunePattern::kNM) {
    int64_t k = t.in_axis < 0               ? 0
                : t.node->op_type == "Conv" ? t.init->value.numel() / t.init->value.size(0)
                                            : t.init->value.size(t.in_axis);
    if (t.in_axis < 0 || k % o.m != 0)
      return "reduction dim " + std::to_string(k) + " not divisible by M=" + std::to_string(o.m);
  }
  const Criterion& c = criterion_of(o);
  if (c.needs == importance::Needs::kActivations) {
    const std::string why = layer_input_unsupported(*t.node, t.init->value);
    if (!why.empty())
      return std::string(c.name) +
             " reads the inputs of Gemm, MatMul and one-group Conv layers, not of " + why;
    if (t.out_axis < 0 || t.in_axis < 0) return "no row/column axis (1-D weight)";
  }
  if ((o.pattern == PrunePattern::kRow && t.out_axis < 0) ||
      (o.pattern == PrunePattern::kColumn && t.in_axis < 0) ||
      (o.pattern == PrunePattern::kBlock && (t.out_axis < 0 || t.in_axis < 0)))
    return "no row/column axis (1-D weight)";
  return "";
}

// The report's word on each tied weight: left alone (`remedy` says what allows it), or pruned
// together with what shares it.
void note_ties(PruneReport& report, const std::vector<Target>& all, const std::string& remedy) {
  for (const auto& t : all) {
    if (!t.weight.tied()) continue;
    PruneLayerReport& l = report.layers[t.report];
    if (l.skipped == t.weight.tie_reason()) {
      l.skipped += remedy;
      report.warnings.push_back(l.label() + " left alone: " + l.skipped);
    } else if (l.skipped.empty()) {
      std::string with;
      for (const auto& u : t.weight.shared)
        if (u.use != "layer") with += (with.empty() ? "" : ", ") + u.describe();
      report.warnings.push_back(l.label() + " is tied with " + with + ": pruned both (allow_tied)");
    }
  }
}

}  // namespace

std::string method_string(const PruneLayerOptions& o, PruneScope scope) {
  const Criterion& c = criterion_of(o);
  std::string s = c.name;
  if (scope == PruneScope::kGlobal && c.weights != WeightRank::kThreshold) s += " global";
  switch (o.pattern) {
    case PrunePattern::kUnstructured:
      break;
    case PrunePattern::kNM:
      s += " " + nm_name(o);
      break;
    case PrunePattern::kRow:
      s += " row";
      break;
    case PrunePattern::kColumn:
      s += " column";
      break;
    case PrunePattern::kBlock:
      s += " " + block_name(o);
      break;
  }
  if (ranks_by_norm(o.pattern) && c.weights == WeightRank::kMagnitude)
    s += " L" + std::to_string(o.norm);
  return s;
}

std::string amount_string(const PruneLayerOptions& o) {
  if (criterion_of(o).weights == WeightRank::kThreshold) {
    std::ostringstream os;
    os << "|w| < " << o.threshold;
    return os.str();
  }
  if (o.pattern == PrunePattern::kNM) return "";
  return o.amount.str();
}

at::Tensor layer_score(const Target& t, const Criterion& c, const Saliency* saliency,
                       const LayerInput* input) {
  if (c.weights != WeightRank::kScores) return {};
  const bool reads_inputs = c.needs == importance::Needs::kActivations;
  LOPPER_CHECK(reads_inputs || !c.needs_data() || saliency != nullptr,
               "[prune] " LOPPER_OPTION("criterion") " ", c.name, " ranks weights ",
               importance::data_needed(c), ": give calibration data (a Saliency)");
  LOPPER_CHECK(!reads_inputs || input != nullptr, "[prune] " LOPPER_OPTION("criterion") " ", c.name,
               " ranks weights ", importance::data_needed(c),
               ": prune with calibration data (prune_calibrated)");
  static const std::vector<int64_t> no_perm;
  at::Tensor s = importance::weight_scores(
      {c, t.init->value, t.init->name, no_perm, saliency, input, t.out_axis});
  LOPPER_CHECK(s.defined(), "[prune] no ", c.name, " saliency for weight '", t.init->name, "'");
  LOPPER_CHECK(s.sizes() == t.init->value.sizes(), "[prune] the ", c.name, " saliency of '",
               t.init->name, "' has shape ", s.sizes(), ", the weight ", t.init->value.sizes());
  return s.to(at::kFloat).contiguous();
}

at::Tensor layer_keep(const Target& t, const PruneLayerOptions& o, at::Generator& gen,
                      const std::string& where, const at::Tensor& score) {
  const at::Tensor& w = t.init->value;
  const WeightRank rank = criterion_of(o).weights;
  const int norm = rank == WeightRank::kDrawn ? 0 : o.norm;
  switch (o.pattern) {
    case PrunePattern::kUnstructured:
      // NOTE: |w| < t removes; a NaN is not below any threshold, so it stays (as torch's |w| < t).
      if (rank == WeightRank::kThreshold) return w.abs().lt(o.threshold).logical_not() & w.ne(0);
      {
        at::Tensor alive = w.ne(0);
        int64_t k = o.amount.count_of(alive.sum().item<int64_t>(), where);
        if (rank == WeightRank::kDrawn) return random_mask(w, PruneAmount{double(k), true}, gen);
        if (score.defined() && criterion_of(o).per_row && t.out_axis >= 0) {
          auto rows = [&](const at::Tensor& x) {
            return x.movedim(t.out_axis, 0).reshape({w.size(t.out_axis), -1});
          };
          at::Tensor drop = smallest_per_row(rows(score), rows(alive), o.amount);
          return alive & drop.reshape(w.movedim(t.out_axis, 0).sizes())
                             .movedim(0, t.out_axis)
                             .logical_not();
        }
        if (score.defined()) return alive & smallest_k({score}, {alive}, k)[0].logical_not();
        return alive & smallest_k({w}, {alive}, k, /*absolute=*/true)[0].logical_not();
      }
    case PrunePattern::kNM: {
      at::Tensor keep;
      if (t.node->op_type == "Conv") {
        auto flat = [&](const at::Tensor& x) {
          return x.defined() ? x.reshape({w.size(0), -1}) : x;
        };
        keep = nm_mask(flat(w), o.n, o.m, flat(score)).reshape(w.sizes());
      } else {
        auto last = [&](const at::Tensor& x) { return x.defined() ? x.movedim(t.in_axis, -1) : x; };
        keep = nm_mask(last(w), o.n, o.m, last(score)).movedim(-1, t.in_axis);
      }
      return keep & w.ne(0);
    }
    case PrunePattern::kRow:
    case PrunePattern::kColumn: {
      int64_t axis = o.pattern == PrunePattern::kRow ? t.out_axis : t.in_axis;
      // Counted here first so that an error names the layer.
      (void)o.amount.count_of(w.size(axis), where);
      return channel_mask(w, axis, o.amount, norm, &gen, score);
    }
    case PrunePattern::kBlock:
      return block_masks({{w, t.out_axis, t.in_axis, score}}, o.block_r, o.block_c, o.amount, norm,
                         &gen, where)[0];
  }
  throw Error("[prune] unknown pattern");
}

// Every drop mask is computed before the first is applied, so that an error leaves the model as
// it was.
void apply_masks(const std::vector<Target>& targets, std::vector<at::Tensor>& drop,
                 PruneReport& report) {
  for (size_t i = 0; i < targets.size(); ++i) {
    ir::Initializer& init = *targets[i].init;
    // In place when nothing else holds the weight (a copy would double a big layer's memory);
    // a tensor shared with another model copy is replaced, never written through.
    at::Tensor& v = init.value;
    if (v.is_contiguous() && v.use_count() == 1 && v.storage().use_count() == 1)
      v.masked_fill_(drop[i], 0);
    else
      v = v.masked_fill(drop[i], 0).contiguous();
    drop[i].reset();
    report.layers[targets[i].report].nonzero_after = init.value.count_nonzero().item<int64_t>();
  }
}

void finish_report(PruneReport& report) {
  std::vector<std::string> emptied;
  for (const auto& l : report.layers) {
    report.params += l.params;
    report.nonzero_before += l.nonzero_before;
    report.nonzero_after += l.nonzero_after;
    if (l.skipped.empty() && l.nonzero_before > 0 && l.nonzero_after == 0)
      emptied.push_back(l.label());
  }
  // NOTE: torch's rule, kept: a float amount is a fraction, an int a count, so "--amount 1.0"
  // removes every weight while "--amount 1" removes one. A layer left with no weight at all is
  // almost never meant: said once, naming the layers and the reading used.
  if (!emptied.empty()) {
    std::string names;
    for (size_t i = 0; i < emptied.size() && i < 3; ++i) names += (i ? ", " : "") + emptied[i];
    if (emptied.size() > 3) names += ", +" + std::to_string(emptied.size() - 3);
    report.warnings.push_back(
        std::to_string(emptied.size()) + " layer" + (emptied.size() == 1 ? "" : "s") + " (" +
        names + ") lost every weight: the model outputs constants. An amount with a point (1.0) " +
        "is a fraction of the weights, an integer (1) a count, as in torch.nn.utils.prune");
  }
}

at::Generator& PrunePlan::generator(size_t i) {
  auto it = generators_.find(stream[i]);
  if (it == generators_.end())
    it = generators_.emplace(stream[i], at::make_generator<at::CPUGeneratorImpl>(how[i]->seed))
             .first;
  return it->second;
}

PrunePlan plan_prune(ir::Model& model, const PruneOptions& opts) {
  check_prune_options(opts);
  PrunePlan plan;
  plan.scope = opts.scope;
  PruneReport& report = plan.report;
  std::vector<Target>& all = plan.all;
  all = find_targets(model.graph, report);

  LayerFilter exclude(opts.exclude);
  for (size_t i = 0; i < all.size(); ++i) {
    Target& t = all[i];
    PruneLayerReport& l = report.layers[t.report];
    if (!t.init->value.is_floating_point()) {
      l.skipped = "not a float tensor";
    } else if (exclude.excludes(t.weight.names())) {
      l.skipped = "excluded (--exclude)";
    } else if (opts.skip_first_last && i == 0) {
      l.skipped = "first layer (--skip-first-last)";
    } else if (opts.skip_first_last && i + 1 == all.size()) {
      l.skipped = "last layer (--skip-first-last)";
    } else if (!opts.allow_tied && t.weight.tied()) {
      l.skipped = t.weight.tie_reason();
    } else {
      l.skipped = layer_skip_reason(t, opts);
    }
    if (!l.skipped.empty()) continue;
    plan.targets.push_back(t);
    plan.how.push_back(&opts);
    plan.stream.push_back(0);
  }
  if (!exclude.unmatched_warning().empty()) report.warnings.push_back(exclude.unmatched_warning());
  note_ties(report, all, "; pass --allow-tied to prune both");
  LOPPER_CHECK(!plan.targets.empty(),
               "[prune] nothing left to prune: every prunable layer was skipped (",
               report.layers[all[0].report].name, ": ", report.layers[all[0].report].skipped, ")");

  return plan;
}

PrunePlan plan_prune(ir::Model& model, const PruneRecipe& recipe) {
  auto in_recipe = [&](const std::string& where, const std::string& msg) {
    return "[prune] recipe " + recipe.source + ": " + where + ": " + msg;
  };
  // Options are checked when the recipe is parsed; a hand-built recipe is checked here as well.
  auto check = [&](const PruneLayerOptions& o, const std::string& where) {
    try {
      check_layer_options(o);
    } catch (const Error& e) {
      std::string m = e.render(recipe_key);
      if (m.rfind("[prune] ", 0) == 0) m = m.substr(8);
      throw Error(in_recipe(where, m));
    }
  };
  if (recipe.has_defaults) check(recipe.defaults, "defaults");
  std::vector<Pattern> res;
  for (const auto& r : recipe.rules) {
    if (!r.skip) check(r.options, r.where);
    if (const std::string why = Pattern::error_of(r.match); !why.empty())
      throw Error(in_recipe(r.where, "match '" + r.match + "' is not a valid regex: " + why));
    res.emplace_back(r.match, "match");
  }

  PrunePlan plan;
  PruneReport& report = plan.report;
  std::vector<Target>& all = plan.all;
  all = find_targets(model.graph, report);
  std::vector<bool> matched(recipe.rules.size(), false);
  for (auto& t : all) {
    PruneLayerReport& l = report.layers[t.report];
    size_t rule = recipe.rules.size();
    const std::vector<std::string> names = t.weight.names();
    for (size_t i = 0; i < res.size() && rule == recipe.rules.size(); ++i)
      for (const auto& name : names)
        if (!name.empty() && res[i].search(name)) {
          rule = i;
          matched[i] = true;
          break;
        }
    const PruneLayerOptions* o = nullptr;
    if (rule < recipe.rules.size()) {
      l.rule = recipe.rules[rule].where;
      if (recipe.rules[rule].skip)
        l.skipped = "recipe " + l.rule + ": skip";
      else
        o = &recipe.rules[rule].options;
    } else if (recipe.has_defaults) {
      l.rule = "defaults";
      o = &recipe.defaults;
    } else {
      l.skipped = "no recipe rule matches (the defaults have no method)";
    }
    if (o && !t.init->value.is_floating_point()) l.skipped = "not a float tensor";
    if (o && l.skipped.empty() && !o->allow_tied && t.weight.tied())
      l.skipped = t.weight.tie_reason();
    if (o && l.skipped.empty()) l.skipped = layer_skip_reason(t, *o);
    if (!l.skipped.empty()) continue;
    plan.targets.push_back(t);
    plan.how.push_back(o);
    plan.stream.push_back(rule);  // rules.size(): the defaults
  }
  for (size_t i = 0; i < matched.size(); ++i)
    if (!matched[i])
      report.warnings.push_back("recipe " + recipe.rules[i].where + ": match '" +
                                recipe.rules[i].match + "' matched no layer");
  note_ties(report, all, "; set allow_tied: true in its recipe rule to prune both");
  LOPPER_CHECK(!plan.targets.empty(), "[prune] recipe ", recipe.source,
               ": nothing left to prune: every prunable layer was skipped (",
               report.layers[all[0].report].name, ": ", report.layers[all[0].report].skipped, ")");

  return plan;
}

namespace {

void refuse_layer_inputs(bool reads, const std::string& what) {
  LOPPER_CHECK(!reads, "[prune] ", what,
               " reads the layers' inputs: prune with calibration data (prune_calibrated)");
}

}  // namespace

PruneReport prune(ir::Model& model, const PruneOptions& opts, const Saliency* saliency) {
  check_prune_options(opts);
  refuse_layer_inputs(reads_layer_inputs(opts),
                      opts.owl.lambda != 0 ? std::string("OWL") : opts.criterion);
  PrunePlan plan = plan_prune(model, opts);
  PruneReport& report = plan.report;
  const std::vector<Target>& targets = plan.targets;
  const Criterion& crit = criterion_of(opts);
  std::vector<at::Tensor> drop;
  if (opts.scope == PruneScope::kGlobal && opts.pattern == PrunePattern::kBlock) {
    std::vector<BlockWeight> ws;
    for (const auto& t : targets)
      ws.push_back({t.init->value, t.out_axis, t.in_axis, layer_score(t, crit, saliency)});
    drop = block_masks(ws, opts.block_r, opts.block_c, opts.amount,
                       crit.weights == WeightRank::kDrawn ? 0 : opts.norm, &plan.generator(0),
                       "all prunable layers");
    for (auto& d : drop) d = d.logical_not();
  } else if (opts.scope == PruneScope::kGlobal && crit.weights != WeightRank::kThreshold) {
    // NOTE: one pass over the weights themselves: no copy of the scores (|w| is taken inside the
    // selection), so a model of any size is pruned in little more than its own memory.
    std::vector<at::Tensor> weights, alive;
    int64_t total = 0;
    for (const auto& t : targets) {
      weights.push_back(t.init->value);
      total += report.layers[t.report].nonzero_before;
    }
    int64_t k = opts.amount.count_of(total, "all prunable layers");
    if (crit.weights == WeightRank::kScores) {
      std::vector<at::Tensor> scores;
      for (const auto& t : targets) {
        scores.push_back(layer_score(t, crit, saliency));
        alive.push_back(t.init->value.ne(0));
      }
      drop = smallest_k(scores, alive, k);
    } else if (crit.weights == WeightRank::kMagnitude) {
      drop = smallest_k(weights, std::vector<at::Tensor>(weights.size()), k, /*absolute=*/true);
    } else {
      // The k smallest of one uniform draw per alive weight: a uniformly random k-subset.
      std::vector<at::Tensor> draws;
      for (const auto& w : weights) {
        alive.push_back(w.ne(0));
        draws.push_back(at::rand(w.sizes(), plan.generator(0)));
      }
      drop = smallest_k(draws, alive, k);
    }
  } else {
    for (size_t i = 0; i < targets.size(); ++i)
      drop.push_back(layer_keep(targets[i], opts, plan.generator(i),
                                report.layers[targets[i].report].name,
                                layer_score(targets[i], crit, saliency))
                         .logical_not());
  }

  std::string method = method_string(opts, opts.scope), amount = amount_string(opts);
  for (const auto& t : targets) {
    report.layers[t.report].method = method;
    report.layers[t.report].amount = amount;
  }
  apply_masks(targets, drop, report);
  finish_report(report);
  return report;
}

PruneReport prune(ir::Model& model, const PruneRecipe& recipe, const Saliency* saliency) {
  refuse_layer_inputs(reads_layer_inputs(recipe), "recipe " + recipe.source);
  PrunePlan plan = plan_prune(model, recipe);
  PruneReport& report = plan.report;
  std::vector<at::Tensor> drop;
  for (size_t i = 0; i < plan.targets.size(); ++i) {
    const Target& t = plan.targets[i];
    const PruneLayerOptions& o = *plan.how[i];
    PruneLayerReport& l = report.layers[t.report];
    drop.push_back(
        layer_keep(t, o, plan.generator(i), l.name, layer_score(t, criterion_of(o), saliency))
            .logical_not());
    l.method = method_string(o, PruneScope::kLocal);
    l.amount = amount_string(o);
  }
  apply_masks(plan.targets, drop, report);
  finish_report(report);
  return report;
}

}  // namespace lopper
