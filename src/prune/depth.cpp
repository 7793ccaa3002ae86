// Depth pruning: residual blocks found in the graph, ranked (block influence, loss without the
// block, random) and removed. See lopper/depth.h.
#include "lopper/depth.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "ir/index.h"
#include "lopper/analysis.h"
#include "lopper/error.h"
#include "lopper/executor.h"
#include "prune/layer_filter.h"
#include "train/loss.h"

namespace lopper {

namespace {

// Ops that make a block an attention block (its MLP block after it joins it in one layer).
bool is_attention(const ir::Node& n) {
  static const std::set<std::string> ops = {"Softmax", "Attention", "MultiHeadAttention",
                                            "GroupQueryAttention", "LogSoftmax"};
  return ops.count(n.op_type) > 0;
}

// A weight: a float initializer of two or more dims.
bool is_weight(const ir::Initializer* w) {
  return w && w->value.dim() >= 2 && at::isFloatingType(w->value.scalar_type());
}

struct Found {
  size_t add = 0;             // the residual Add (the unit's last one)
  std::string input, output;  // x, y
  std::set<size_t> nodes;     // body + Adds
  bool attention = false;
  bool merged = false;  // an attention block and its MLP block: a layer
  std::string blocked;
  int64_t axis = -1;
};

class Finder {
 public:
  Finder(const ir::Graph& g, const NodeShapes& shapes) : g_(g), idx_(g), shapes_(shapes) {
    order_ = g.topological_order();
    pos_.assign(g.nodes.size(), 0);
    for (size_t i = 0; i < order_.size(); ++i) pos_[order_[i]] = i;
  }

  std::vector<Found> blocks() {
    std::vector<Found> out;
    for (size_t i : order_) {
      const ir::Node& n = g_.nodes[i];
      if (n.op_type != "Add" || !n.domain.empty() || n.inputs.size() != 2 || n.outputs.size() != 1)
        continue;
      for (int k = 0; k < 2; ++k) {
        Found f;
        if (body_of(i, n.inputs[size_t(k)], n.inputs[size_t(1 - k)], f)) {
          out.push_back(std::move(f));
          break;
        }
      }
    }
    // A block inside another's body: the inner ones are the units.
    std::vector<Found> units;
    for (auto& f : out) {
      bool outer = std::any_of(out.begin(), out.end(),
                               [&](const Found& o) { return &o != &f && f.nodes.count(o.add); });
      if (!outer) units.push_back(std::move(f));
    }
    return units;
  }

  // Joins each attention block with the MLP block that reads its output into a layer.
  std::vector<Found> layers(std::vector<Found> blocks) {
    std::vector<Found> out;
    for (size_t i = 0; i < blocks.size(); ++i) {
      Found f = std::move(blocks[i]);
      if (f.attention && i + 1 < blocks.size() && !blocks[i + 1].attention &&
          passes_on(f.output, blocks[i + 1].input)) {
        Found& next = blocks[++i];
        f.nodes.insert(next.nodes.begin(), next.nodes.end());
        // The Casts and Identities between them go with them.
        for (std::string v = next.input; v != f.output;) {
          const size_t p = idx_.producer(v);
          f.nodes.insert(p);
          v = g_.nodes[p].inputs[0];
        }
        f.merged = true;
        f.output = next.output;
        f.add = next.add;
        f.blocked = f.blocked.empty() ? next.blocked : f.blocked;
        if (f.blocked.empty()) f.blocked = leaks(f.nodes, f.output);
      }
      out.push_back(std::move(f));
    }
    return out;
  }

  const ir::GraphIndex& index() const { return idx_; }

  // Whether `to` is `from` itself or `from` through Identity and Cast nodes (an exporter's Cast of
  // a float to float before a norm).
  bool passes_on(const std::string& from, std::string to) const {
    for (int hops = 0; hops < 4; ++hops) {
      if (to == from) return true;
      const ir::Node* p = idx_.producer_node(to);
      if (!p || p->inputs.empty() || (p->op_type != "Identity" && p->op_type != "Cast")) break;
      to = p->inputs[0];
    }
    return false;
  }

 private:
  // The body of Add node `add` with x = `x`, branch = `b`: the nodes between x and b. False when
  // there is none, or it holds no weight.
  bool body_of(size_t add, const std::string& x, const std::string& b, Found& f) {
    const size_t bp = idx_.producer(b);
    if (bp == ir::GraphIndex::npos) return false;
    // y must have x's shape: an Add that broadcasts (an attention mask added to the scores) is
    // no residual.
    auto it = shapes_.find(&g_.nodes[add]);
    if (it != shapes_.end() && it->second.in.size() == 2 && !it->second.out.empty()) {
      const auto& xs = it->second.in[x == g_.nodes[add].inputs[0] ? 0 : 1];
      const auto& ys = it->second.out[0];
      if (xs != ys) return false;
      f.axis = ys.size() == 4 ? 1 : int64_t(ys.size()) - 1;
    }
    const size_t xp = idx_.producer(x);
    const size_t start = xp == ir::GraphIndex::npos ? 0 : pos_[xp] + 1;
    // The ancestors of b after x's producer, then those among them that x reaches.
    std::set<size_t> seen{bp};
    std::vector<size_t> stack{bp};
    while (!stack.empty()) {
      const size_t v = stack.back();
      stack.pop_back();
      for (const auto& in : ir::node_reads(g_.nodes[v])) {
        const size_t p = idx_.producer(in);
        if (p == ir::GraphIndex::npos || pos_[p] < start || !seen.insert(p).second) continue;
        stack.push_back(p);
      }
    }
    std::vector<size_t> cand(seen.begin(), seen.end());
    std::sort(cand.begin(), cand.end(), [&](size_t a, size_t c) { return pos_[a] < pos_[c]; });
    std::unordered_set<std::string> from_x{x};
    bool weight = false;
    for (size_t v : cand) {
      const ir::Node& n = g_.nodes[v];
      const auto reads = ir::node_reads(n);
      if (std::none_of(reads.begin(), reads.end(),
                       [&](const std::string& r) { return from_x.count(r) > 0; }))
        continue;
      f.nodes.insert(v);
      for (const auto& o : n.outputs)
        if (!o.empty()) from_x.insert(o);
      for (const auto& r : n.inputs) weight = weight || is_weight(idx_.find_initializer(r));
      f.attention = f.attention || is_attention(n);
    }
    if (!from_x.count(b) || !weight) return false;
    f.nodes.insert(add);
    f.add = add;
    f.input = x;
    f.output = g_.nodes[add].outputs[0];
    f.blocked = leaks(f.nodes, f.output);
    return true;
  }

  // Why the nodes cannot go with their unit: a value other than `output` read outside them or
  // given out by the graph ("" when none).
  std::string leaks(const std::set<size_t>& nodes, const std::string& output) const {
    for (size_t v : nodes)
      for (const auto& o : g_.nodes[v].outputs) {
        if (o.empty() || o == output) continue;
        if (idx_.is_output(o)) return "its value '" + o + "' is an output of the model";
        for (size_t r : idx_.readers(o))
          if (!nodes.count(r))
            return "its value '" + o + "' is read after it, by node '" + g_.nodes[r].label() + "'";
      }
    return "";
  }

  const ir::Graph& g_;
  ir::GraphIndex idx_;
  const NodeShapes& shapes_;
  std::vector<size_t> order_, pos_;
};

// The longest common prefix of `names` that ends before a `sep` ("" when there is none).
std::string common_prefix(const std::vector<std::string>& names, const char* sep) {
  if (names.size() < 2) return "";
  std::string p = names[0];
  for (const auto& n : names) {
    size_t i = 0;
    while (i < p.size() && i < n.size() && p[i] == n[i]) ++i;
    p.resize(i);
  }
  const size_t cut = p.rfind(sep);
  return cut == std::string::npos || cut == 0 ? "" : p.substr(0, cut);
}

std::vector<DepthUnit> units_of(const ir::Model& model, const NodeShapes& shapes) {
  const ir::Graph& g = model.graph;
  Finder finder(g, shapes);
  std::vector<Found> found = finder.layers(finder.blocks());
  const ir::GraphIndex& idx = finder.index();
  std::vector<DepthUnit> units;
  for (const Found& f : found) {
    DepthUnit u;
    u.kind = f.merged ? "layer" : "block";
    u.input = f.input;
    u.output = f.output;
    u.blocked = f.blocked;
    u.feature_axis = f.axis;
    std::set<std::string> counted;
    std::vector<size_t> sorted(f.nodes.begin(), f.nodes.end());
    for (size_t v : sorted) {
      const ir::Node& n = g.nodes[v];
      u.nodes.push_back(n.label());
      for (const auto& in : n.inputs) {
        const ir::Initializer* w = idx.find_initializer(in);
        if (!w || !counted.insert(in).second) continue;
        // Only the weights its nodes alone read go with it.
        const auto& readers = idx.readers(in);
        if (std::all_of(readers.begin(), readers.end(), [&](size_t r) { return f.nodes.count(r); }))
          u.params_count += w->value.numel();
      }
      // Its layers: the nodes of the op table's prunable layers (not a rotary table's Gather).
      if (const ir::Initializer* w = layer_weight(g, n)) {
        u.layers.push_back(n.label());
        u.params.push_back(param_name(n, w->name));  // "" where the export lost the name
      }
    }
    // "layer1.0" from layer1.0.conv1.weight and layer1.0.conv2.weight; "/m/model/layers.0" from
    // TorchScript's node names where the weights are onnx::MatMul_554.
    std::vector<std::string> named;
    for (const auto& p : u.params)
      if (!p.empty()) named.push_back(p);
    u.label = named.size() == u.params.size() ? common_prefix(named, ".") : "";
    if (u.label.empty()) u.label = common_prefix(u.layers, "/");
    if (u.label.empty()) u.label = u.layers.empty() ? u.nodes.front() : u.layers.front();
    units.push_back(std::move(u));
  }
  return units;
}

// Removes `units` from `model`: each one's output becomes its input for every reader (an Identity
// where the output is the model's), then every node no output needs and every initializer no
// node reads any more are dropped.
void remove_units(ir::Model& model, const std::vector<const DepthUnit*>& units) {
  ir::Graph& g = model.graph;
  std::set<std::string> outputs;
  for (const auto& o : g.outputs) outputs.insert(o.name);
  std::unordered_map<std::string, std::string> rename;  // y -> x
  for (const DepthUnit* u : units) rename[u->output] = u->input;
  auto resolve = [&](std::string v) {
    for (auto it = rename.find(v); it != rename.end(); it = rename.find(v)) v = it->second;
    return v;
  };
  std::vector<ir::Node> identities;
  for (const DepthUnit* u : units)
    if (outputs.count(u->output)) {
      ir::Node id;
      id.name = u->output + "_depth_identity";
      id.op_type = "Identity";
      id.inputs = {resolve(u->input)};
      id.outputs = {u->output};
      identities.push_back(std::move(id));
    }
  // The Adds that made the outputs go; the readers read the inputs.
  std::set<std::string> made_by_unit;
  for (const DepthUnit* u : units) made_by_unit.insert(u->output);
  std::vector<ir::Node> kept;
  for (auto& n : g.nodes) {
    if (n.outputs.size() == 1 && made_by_unit.count(n.outputs[0])) continue;
    for (auto& in : n.inputs)
      if (rename.count(in)) in = resolve(in);
    kept.push_back(std::move(n));
  }
  for (auto& id : identities) kept.push_back(std::move(id));
  g.nodes = std::move(kept);
  // Subgraphs reading a removed output from the outer scope are not rewired: such a unit's value
  // would be read after it, and depth_units() blocks it.
  std::set<std::string> before_reads;
  for (const auto& n : g.nodes)
    for (const auto& r : ir::node_reads(n)) before_reads.insert(r);
  // Dead nodes, to a fixed point (reverse topological order removes a chain in one pass).
  std::vector<size_t> order = g.topological_order();
  std::unordered_map<std::string, size_t> uses;
  for (const auto& o : g.outputs) ++uses[o.name];
  for (const auto& n : g.nodes)
    for (const auto& r : ir::node_reads(n)) ++uses[r];
  std::vector<char> dead(g.nodes.size(), 0);
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    const ir::Node& n = g.nodes[*it];
    bool used = false;
    for (const auto& o : n.outputs) used = used || (!o.empty() && uses[o] > 0);
    if (used) continue;
    dead[*it] = 1;
    for (const auto& r : ir::node_reads(n)) --uses[r];
  }
  std::vector<ir::Node> live;
  std::set<std::string> gone_values;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    if (dead[i]) {
      for (const auto& o : g.nodes[i].outputs) gone_values.insert(o);
      continue;
    }
    live.push_back(std::move(g.nodes[i]));
  }
  g.nodes = std::move(live);
  std::set<std::string> read;
  for (const auto& n : g.nodes)
    for (const auto& r : ir::node_reads(n)) read.insert(r);
  for (const auto& o : g.outputs) read.insert(o.name);
  // Initializers that only the removed nodes read (ones nothing read before stay as they were).
  std::set<std::string> dropped;
  g.initializers.erase(std::remove_if(g.initializers.begin(), g.initializers.end(),
                                      [&](const ir::Initializer& w) {
                                        const bool go = !read.count(w.name) &&
                                                        (before_reads.count(w.name) > 0 ||
                                                         gone_values.count(w.name) > 0);
                                        if (go) dropped.insert(w.name);
                                        return go;
                                      }),
                       g.initializers.end());
  // Graph inputs that were initializer defaults go with them; value_info of gone values too.
  g.inputs.erase(std::remove_if(g.inputs.begin(), g.inputs.end(),
                                [&](const ir::ValueInfo& v) { return dropped.count(v.name) > 0; }),
                 g.inputs.end());
  g.value_info.erase(std::remove_if(g.value_info.begin(), g.value_info.end(),
                                    [&](const ir::ValueInfo& v) {
                                      return gone_values.count(v.name) > 0 ||
                                             dropped.count(v.name) > 0 ||
                                             made_by_unit.count(v.name) > 0;
                                    }),
                     g.value_info.end());
}

// The calibration batches, read once (influence and loss go over them again).
std::vector<Batch> read_batches(DataLoader& data, const CalibrationOptions& calib) {
  LOPPER_CHECK(calib.batches > 0, "[prune] " LOPPER_OPTION("batches") " must be > 0, got ",
               calib.batches);
  const int64_t of = std::min<int64_t>(calib.batches, data.batches_per_epoch());
  LOPPER_CHECK(of > 0, "[prune] ", data.dataset().name(), " has no full batch to calibrate on");
  std::vector<Batch> out;
  data.start_epoch(0);
  Batch b;
  while (int64_t(out.size()) < of && data.next(b)) out.push_back(b);
  LOPPER_CHECK(!out.empty(), "[prune] ", data.dataset().name(), " gave no batch to calibrate on");
  return out;
}

// Block influence of every unit, in one pass per batch: a unit's input is kept when it is made
// and compared with its output when that is made.
std::vector<double> influence(const ir::Model& model, const std::vector<DepthUnit>& units,
                              const std::vector<Batch>& batches, const CalibrationOptions& calib) {
  ExecOptions eo = shape_options();
  eo.device = calib.device;
  Executor ex(model, eo);
  const ModelIO io = model_io(model);
  Objective objective(calib.loss, io);  // the calibration loss, for the progress line
  std::vector<BlockInfluence> bi(units.size());
  std::unordered_map<std::string, std::vector<size_t>> starts, ends;
  for (size_t i = 0; i < units.size(); ++i) {
    if (!units[i].blocked.empty()) continue;
    starts[units[i].input].push_back(i);
    ends[units[i].output].push_back(i);
  }
  std::unordered_map<std::string, at::Tensor> held;  // unit inputs waiting for their outputs
  ex.on_node = [&](const ir::Node& n, const std::vector<at::Tensor>&,
                   const std::vector<at::Tensor>& out) {
    for (size_t k = 0; k < n.outputs.size() && k < out.size(); ++k) {
      const std::string& v = n.outputs[k];
      if (starts.count(v)) held[v] = out[k].detach().clone();
      if (auto it = ends.find(v); it != ends.end())
        for (size_t i : it->second) {
          auto x = held.find(units[i].input);
          if (x != held.end()) bi[i].add(x->second, out[k], units[i].feature_axis);
        }
    }
  };
  c10::InferenceMode guard;
  int64_t done = 0;
  double loss = 0;
  bool has_loss = true;  // a model whose output the data's labels do not fit has none to show
  for (Batch b : batches) {
    held.clear();
    objective.prepare(b, done);
    NamedInputs in = feeds(io, b, ex.device());
    for (const auto& [name, t] : in)
      if (starts.count(name)) held[name] = t;
    const std::vector<at::Tensor> out = ex.run(in);
    if (has_loss) try {
        loss += objective.loss(objective.targets(out.at(0), b)).item<double>();
      } catch (const Error&) {
        has_loss = false;
      }
    ++done;
    if (calib.progress)
      calib.progress(done, int64_t(batches.size()), has_loss ? loss / double(done) : std::nan(""));
  }
  std::vector<double> s;
  for (const auto& b : bi) s.push_back(b.value());
  return s;
}

// The calibration loss of `model` over `batches`; progress counts on from *done of `total` steps.
double mean_loss(const ir::Model& model, const std::vector<Batch>& batches,
                 const CalibrationOptions& calib, int64_t* done, int64_t total) {
  ExecOptions eo;
  eo.device = calib.device;
  eo.prepack = false;
  Executor ex(model, eo);
  const ModelIO io = model_io(model);
  Objective objective(calib.loss, io);
  c10::InferenceMode guard;
  double sum = 0;
  int64_t step = 0;
  for (Batch b : batches) {
    objective.prepare(b, step++);
    std::vector<at::Tensor> out = ex.run(feeds(io, b, ex.device()));
    sum += objective.loss(objective.targets(out.at(0), b)).item<double>();
    if (calib.progress) calib.progress(++*done, total, sum / double(step));
  }
  return sum / double(batches.size());
}

// The loss's increase with each unit left out.
std::vector<double> loss_increase(const ir::Model& model, const std::vector<DepthUnit>& units,
                                  const std::vector<Batch>& batches,
                                  const CalibrationOptions& calib) {
  int64_t free = 0, done = 0;
  for (const auto& u : units) free += u.blocked.empty();
  const int64_t total = (1 + free) * int64_t(batches.size());
  const double base = mean_loss(model, batches, calib, &done, total);
  std::vector<double> s(units.size(), 0.0);
  for (size_t i = 0; i < units.size(); ++i) {
    if (!units[i].blocked.empty()) continue;
    ir::Model without = model;
    remove_units(without, {&units[i]});
    s[i] = mean_loss(without, batches, calib, &done, total) - base;
  }
  return s;
}

}  // namespace

void BlockInfluence::add(const at::Tensor& x, const at::Tensor& y, int64_t axis) {
  LOPPER_CHECK(x.sizes() == y.sizes(), "[prune] block influence: input ", x.sizes(), " and output ",
               y.sizes(), " differ in shape");
  if (x.numel() == 0) return;
  c10::InferenceMode guard;
  const at::Tensor a = x.to(at::kDouble), b = y.to(at::kDouble);
  const int64_t d = axis < 0 ? axis + x.dim() : axis;
  LOPPER_CHECK(d >= 0 && d < x.dim(), "[prune] block influence: axis ", axis, " of a ", x.dim(),
               "-d tensor");
  const at::Tensor dot = (a * b).sum(d);
  const at::Tensor na = a.square().sum(d).sqrt(), nb = b.square().sum(d).sqrt();
  const at::Tensor both_zero = (na == 0) & (nb == 0);
  at::Tensor cos = dot / (na * nb).clamp_min(1e-300);
  cos = at::where(both_zero, at::ones_like(cos), cos);
  sum_ += cos.sum().item<double>();
  n_ += cos.numel();
}

std::vector<DepthUnit> depth_units(
    const ir::Model& model, const std::map<std::string, std::vector<int64_t>>& input_shapes) {
  return units_of(model, node_shapes(model, resolve_input_shapes(model, input_shapes, 1)));
}

CriterionInfo depth_criterion_info(const std::string& name) {
  for (const auto& c : depth_criteria())
    if (c.name == name) return c;
  throw Error("[prune] unknown method '" + name +
              "' for depth (methods: " + criterion_names(depth_criteria()) + ")");
}

std::vector<CriterionInfo> depth_criteria() {
  CriterionInfo influence{"influence",
                          false,
                          true,
                          false,
                          "by block influence",
                          "1 - cosine similarity of a block's input and output; lowest go"};
  CriterionInfo loss{"loss",
                     false,
                     true,
                     false,
                     "by the loss without each block",
                     "the loss's increase with the block left out; lowest go"};
  CriterionInfo random{"random", false, false, false, "", "at random (seeded)"};
  return {influence, loss, random};
}

std::vector<std::string> depth_excluded(const std::vector<std::vector<std::string>>& names,
                                        const std::string& exclude) {
  LayerFilter filter(exclude);
  std::vector<std::string> out(names.size());
  if (filter.empty()) return out;
  for (size_t i = 0; i < names.size(); ++i)
    if (filter.excludes(names[i])) out[i] = "excluded";
  return out;
}

std::vector<double> depth_random_scores(size_t n, uint64_t seed) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const at::Tensor v = at::rand({int64_t(n)}, gen, at::kDouble);
  return std::vector<double>(v.data_ptr<double>(), v.data_ptr<double>() + n);
}

std::vector<size_t> choose_depth_units(const std::vector<double>& scores,
                                       const std::vector<std::string>& blocked,
                                       const PruneAmount& amount, const std::string& what) {
  LOPPER_ASSERT(scores.size() == blocked.size(), "scores and blocked differ in length");
  std::vector<size_t> free;
  for (size_t i = 0; i < scores.size(); ++i)
    if (blocked[i].empty()) free.push_back(i);
  const int64_t k = amount.count_of(int64_t(free.size()), what);
  std::stable_sort(free.begin(), free.end(),
                   [&](size_t a, size_t b) { return scores[a] < scores[b]; });
  free.resize(size_t(k));
  std::sort(free.begin(), free.end());
  return free;
}

StructuredReport prune_depth(ir::Model& model, const StructuredOptions& opts, DataLoader* data,
                             const CalibrationOptions& calib) {
  const bool chosen = !opts.blocks.empty();  // the caller says which (sensitivity, targets)
  const CriterionInfo crit = depth_criterion_info(chosen ? "random" : opts.criterion);
  LOPPER_CHECK(!crit.needs_data || data, "[prune] " LOPPER_OPTION("criterion"), " ", crit.name,
               " ranks blocks ", crit.data_needed, " on data: give " LOPPER_OPTION("data"));
  std::vector<DepthUnit> units = depth_units(model, opts.input_shapes);
  // NOTE: one filter matches and warns: it says when the regex matched no unit.
  LayerFilter filter(opts.exclude);
  for (auto& u : units)
    if (!filter.empty() && filter.excludes(u.names()) && u.blocked.empty()) u.blocked = "excluded";
  StructuredReport r;
  r.counted = "blocks";
  std::vector<std::string> blocked;
  for (const auto& u : units) blocked.push_back(u.blocked);
  const bool any =
      std::any_of(blocked.begin(), blocked.end(), [](const std::string& b) { return b.empty(); });
  LOPPER_CHECK(!units.empty(),
               "[prune] the model has no residual block to remove (an Add of a "
               "value and a branch computed from it, with a weight)");
  LOPPER_CHECK(any, "[prune] none of the model's ", units.size(), " residual blocks can be removed",
               filter.leaves_none(), " (first: ", units[0].label, ": ", units[0].blocked, ")");
  std::vector<double> scores(units.size(), 0.0);
  if (chosen) {
    for (int64_t b : opts.blocks) {
      LOPPER_CHECK(b >= 0 && size_t(b) < units.size(), "[prune] no residual block ", b,
                   " (the model has ", units.size(), ")");
      LOPPER_CHECK(blocked[size_t(b)].empty(), "[prune] residual block ", b, " (",
                   units[size_t(b)].label, ") cannot be removed: ", blocked[size_t(b)]);
    }
  } else if (crit.name == "random") {
    scores = depth_random_scores(units.size(), opts.seed);
  } else {
    const std::vector<Batch> batches = read_batches(*data, calib);
    scores = crit.name == "influence" ? influence(model, units, batches, calib)
                                      : loss_increase(model, units, batches, calib);
  }
  std::vector<size_t> gone;
  if (chosen) {
    const std::set<int64_t> each(opts.blocks.begin(), opts.blocks.end());
    gone.assign(each.begin(), each.end());
  } else {
    gone = choose_depth_units(scores, blocked, opts.amount, "the model's residual blocks");
  }
  std::vector<const DepthUnit*> removed;
  for (size_t i : gone) removed.push_back(&units[i]);
  if (!removed.empty()) {
    ir::Model pruned = model;
    remove_units(pruned, removed);
    ir::validate(pruned);
    model = std::move(pruned);
  }
  const std::set<size_t> gone_set(gone.begin(), gone.end());
  for (size_t i = 0; i < units.size(); ++i) {
    const DepthUnit& u = units[i];
    ChannelGroupReport g;
    g.id = int64_t(i);
    g.kind = u.kind;
    g.layers = {u.label};
    g.layer_params = {u.label};
    for (size_t k = 0; k < u.layers.size(); ++k) {
      g.layers.push_back(u.layers[k]);
      g.layer_params.push_back(u.params[k]);
    }
    g.size_before = 1;
    g.size_after = gone_set.count(i) ? 0 : 1;
    g.params = u.params_count;
    if (gone_set.count(i)) g.removed = {0};
    g.score = scores[i];
    g.blocked = u.blocked;
    r.groups.push_back(std::move(g));
    if (u.blocked.empty()) {
      ++r.channels_before;
      r.channels_after += gone_set.count(i) ? 0 : 1;
    } else if (u.blocked != "excluded") {
      r.barriers.push_back("block '" + u.label + "': " + u.blocked);
    }
  }
  if (const std::string w = filter.unmatched_warning(); !w.empty()) r.warnings.push_back(w);
  return r;
}

}  // namespace lopper
