// Structured pruning: channel groups from the dependency graph, their importance, the channels
// each group loses (local, global, recipe), and the physical removal.
#include "lopper/structured.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <set>

#include "lopper/analysis.h"
#include "lopper/depth.h"
#include "lopper/error.h"
#include "lopper/memory.h"
#include "prune/activations.h"
#include "prune/depgraph.h"
#include "prune/importance.h"
#include "prune/layer_filter.h"

namespace lopper {

namespace {

using ops::ParamRole;

struct Group {
  std::vector<int64_t> classes;  // root atoms, in channel order
  std::set<size_t> layers;       // its sources and the nodes whose parameters follow it
  bool head = false;
  std::string blocked;
  std::vector<int64_t> block_of;  // per class: its block under a grouped conv (empty: none)
  int64_t blocks = 1;
  std::vector<std::vector<size_t>> parts;  // classes (indices) of which one must stay (a Split)
  int64_t part_keep = 0;                   // how many stay at least for `parts`
  std::vector<double> score;               // per class
};

struct Analysis {
  depgraph::DepGraph dg;
  std::vector<Group> groups;
};

Analysis analyse(const ir::Model& model, const StructuredOptions& opts) {
  Analysis a;
  auto shapes = resolve_input_shapes(model, opts.input_shapes, 1);
  NodeShapes io = opts.runs ? node_shapes(model, opts.runs->feeds, &opts.runs->before)
                            : node_shapes(model, shapes);
  if (opts.runs) opts.runs->cost_before = analyze(model, shapes, io);
  a.dg = depgraph::build(model, io, opts.unit == StructuredUnit::kHead);
  auto& dg = a.dg;
  for (const auto& f : opts.fixed)
    for (const auto& sl : dg.slices) {
      if (!sl.ref.is_initializer || sl.ref.name != f.weight) continue;
      const int64_t stored = sl.ref.perm.empty() ? sl.axis : sl.ref.perm.at(size_t(sl.axis));
      if (f.axis < 0 || f.axis == stored) depgraph::pin_atoms(dg, sl.atoms, f.why);
    }
  const int64_t n_atoms = int64_t(dg.parent.size());
  // Classes and their sources.
  std::map<int64_t, std::set<size_t>> sources;
  std::map<int64_t, std::string> pinned;
  std::map<int64_t, bool> head;
  for (int64_t x = 0; x < n_atoms; ++x) {
    int64_t r = dg.find(x);
    sources[r].insert(dg.source[x]);
    if (!dg.pinned[x].empty() && pinned[r].empty()) pinned[r] = dg.pinned[x];
    head[r] = head[r] || dg.head[x];
  }
  std::map<std::set<size_t>, size_t> by_sources;
  std::map<int64_t, size_t> group_of;
  for (const auto& [r, src] : sources) {  // roots ascend: channel order within a group
    auto [it, fresh] = by_sources.try_emplace(src, a.groups.size());
    if (fresh) a.groups.emplace_back();
    Group& g = a.groups[it->second];
    g.classes.push_back(r);
    g.layers.insert(src.begin(), src.end());
    g.head = g.head || head[r];
    if (g.blocked.empty() && !pinned[r].empty()) g.blocked = pinned[r];
    group_of[r] = it->second;
  }
  // Layers: every node whose parameters follow a group's channels, under each group they follow
  // (a Concat's consumer under every branch; a grouped conv under its input's group, whose weight
  // an edit cuts). Nodes that only rewrite shapes (Split, Reshape) are not layers.
  std::set<size_t> with_params;
  for (const auto& s : dg.slices) with_params.insert(s.node);
  for (const auto& e : dg.edits) {
    if (!with_params.count(e.node)) continue;
    size_t last = SIZE_MAX;
    for (int64_t x : e.atoms)
      if (size_t gi = group_of[dg.find(x)]; gi != last)
        a.groups[gi].layers.insert(e.node), last = gi;
  }
  // Grouped convolutions: every class of the group in exactly one block of one partition.
  for (const auto& [atoms, blocks] : dg.blocks) {
    if (atoms.empty()) continue;
    const int64_t per = int64_t(atoms.size()) / blocks;
    std::map<size_t, std::map<int64_t, int64_t>> by_group;  // group -> class -> block
    for (size_t i = 0; i < atoms.size(); ++i)
      by_group[group_of[dg.find(atoms[i])]][dg.find(atoms[i])] = int64_t(i) / per;
    for (auto& [gi, cls] : by_group) {
      Group& g = a.groups[gi];
      std::vector<int64_t> block_of;
      for (int64_t c : g.classes) {
        auto it = cls.find(c);
        block_of.push_back(it == cls.end() ? -1 : it->second);
      }
      bool ok = by_group.size() == 1 &&
                std::find(block_of.begin(), block_of.end(), -1) == block_of.end() &&
                (g.block_of.empty() || g.block_of == block_of);
      if (!ok && g.blocked.empty())
        g.blocked = "grouped convolution whose groups do not line up with the channels";
      g.block_of = block_of, g.blocks = blocks;
    }
  }
  for (const auto& [id, why] : opts.kept_groups)
    if (id >= 0 && size_t(id) < a.groups.size() && a.groups[size_t(id)].blocked.empty())
      a.groups[size_t(id)].blocked = why;
  for (auto& g : a.groups)
    if (g.blocked.empty() && g.classes.size() < 2) g.blocked = "a single channel";
  // Values that hold some of a group's channels only (a Split's outputs, a Slice): each keeps
  // one. One that holds a whole group, or a blocked one's, keeps one anyway; one across groups
  // keeps one when its first group does.
  std::map<int64_t, size_t> position;  // class -> its index in its group
  for (const auto& g : a.groups)
    for (size_t c = 0; c < g.classes.size(); ++c) position[g.classes[c]] = c;
  for (const auto& atoms : dg.parts) {
    std::map<size_t, std::set<size_t>> by_group;
    for (int64_t x : atoms) {
      const int64_t r = dg.find(x);
      by_group[group_of[r]].insert(position[r]);
    }
    bool kept = by_group.empty();
    for (const auto& [gi, cls] : by_group)
      kept |= !a.groups[gi].blocked.empty() || cls.size() == a.groups[gi].classes.size();
    if (kept) continue;
    const auto& [gi, cls] = *by_group.begin();
    a.groups[gi].parts.emplace_back(cls.begin(), cls.end());
  }
  for (auto& g : a.groups) {
    // Only the smallest parts matter (one inside another is kept with it); disjoint ones each
    // keep a channel of their own.
    auto& p = g.parts;
    std::sort(p.begin(), p.end(), [](const auto& x, const auto& y) {
      return x.size() != y.size() ? x.size() < y.size() : x < y;
    });
    p.erase(std::unique(p.begin(), p.end()), p.end());
    std::vector<std::vector<size_t>> minimal;
    std::vector<char> taken(g.classes.size(), 0);
    for (const auto& part : p) {
      auto within = [&](const std::vector<size_t>& m) {
        return std::includes(part.begin(), part.end(), m.begin(), m.end());
      };
      if (std::any_of(minimal.begin(), minimal.end(), within)) continue;
      minimal.push_back(part);
      if (std::none_of(part.begin(), part.end(), [&](size_t c) { return taken[c] != 0; })) {
        for (size_t c : part) taken[c] = 1;
        ++g.part_keep;
      }
    }
    p = std::move(minimal);
  }
  return a;
}

// Every group's per-class importance (Group::score), from the dependency graph's slices, as the
// criterion's entry of the table says.
void score(Analysis& a, const ir::Graph& graph, const StructuredOptions& opts,
           const Saliency* saliency) {
  using importance::SliceRank;
  auto& dg = a.dg;
  const importance::Criterion& c = importance::find(opts.criterion, importance::Use::kChannels);
  std::map<int64_t, double> s;  // class -> the sum of its terms
  auto add = [&](const depgraph::Slice& sl, const at::Tensor& per_index) {
    auto v = per_index.to(at::kDouble).contiguous();
    const double* p = v.data_ptr<double>();
    for (size_t i = 0; i < sl.atoms.size(); ++i) s[dg.find(sl.atoms[i])] += p[i];
  };
  static const std::vector<int64_t> no_perm;
  std::set<int64_t> scored;  // kCustom, kActivations: classes some slice scored
  // kActivations: by the tensors that layers read the channels from, each tensor once.
  if (c.slices == SliceRank::kActivations)
    for (const ActivationSite& site : activation_sites(graph, dg)) {
      at::Tensor t = importance::activation_terms(c, saliency, site.value);
      if (!t.defined()) continue;  // a tensor the calibration never reached
      LOPPER_CHECK(t.numel() == int64_t(site.atoms.size()), "[prune] ", c.name, ": the scores of '",
                   site.value, "' hold ", t.numel(), " channels, the model's has ",
                   site.atoms.size());
      auto v = t.to(at::kDouble).contiguous();
      for (size_t i = 0; i < site.atoms.size(); ++i) {
        const int64_t cls = dg.find(site.atoms[i]);
        s[cls] += v.data_ptr<double>()[i];
        scored.insert(cls);
      }
    }
  for (const auto& sl : dg.slices) {
    const bool out = sl.role == ParamRole::kWeightOut, in = sl.role == ParamRole::kWeightIn;
    if (c.slices == SliceRank::kWeightScores && (out || in)) {
      at::Tensor w = importance::weight_scores({c, sl.value, sl.ref.name, sl.ref.perm, saliency});
      if (!w.defined()) continue;  // a weight without scores (not reached by the loss)
      // The sum over every axis but the slice's, in the weight's type (ATen sums pairwise:
      // about 1e-7 relative in float, as PyTorch's own norms), with no transposed copy.
      std::vector<int64_t> others;
      for (int64_t d = 0; d < w.dim(); ++d)
        if (d != sl.axis) others.push_back(d);
      add(sl, others.empty() ? w : at::sum(w, others));
    } else if (c.slices == SliceRank::kCustom) {
      at::Tensor t = c.slice_scores({sl.value, sl.axis, out, in, sl.role == ParamRole::kNormScale});
      if (!t.defined()) continue;
      add(sl, t);
      for (int64_t atom : sl.atoms) scored.insert(dg.find(atom));
    }
  }
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(opts.seed);
  for (auto& g : a.groups) {
    g.score.clear();
    for (int64_t cls : g.classes) {
      double v = s.count(cls) ? s[cls] : 0.0;
      if (c.finish) v = c.finish(v);
      g.score.push_back(v);
    }
    if (c.slices == SliceRank::kDrawn) {
      at::Tensor r = at::rand({int64_t(g.classes.size())}, gen, at::kDouble);
      for (size_t i = 0; i < g.classes.size(); ++i) g.score[i] = r.data_ptr<double>()[i];
    }
    if (c.unscored && g.blocked.empty() &&
        std::none_of(g.classes.begin(), g.classes.end(),
                     [&](int64_t cls) { return scored.count(cls) > 0; }))
      g.blocked = c.unscored;
  }
}

std::string layer_names(const ir::Graph& g, const Group& grp, std::vector<std::string>* out) {
  std::string all;
  for (size_t i : grp.layers) {
    if (out) out->push_back(g.nodes[i].label());
    all += g.nodes[i].label() + "\n";
  }
  return all;
}

// Per layer of the group, its weight's PyTorch parameter name ("" without one).
std::vector<std::string> layer_params(const ir::Graph& g, const Group& grp) {
  std::vector<std::string> out;
  for (size_t i : grp.layers) {
    const ir::Initializer* w = layer_weight(g, g.nodes[i]);
    out.push_back(w ? param_name(g.nodes[i], w->name) : "");
  }
  return out;
}

// How many of n channels may go at most: one stays (one per block for grouped convolutions, one
// per disjoint part).
int64_t cap(const Group& g, int64_t k, int64_t round_to) {
  const int64_t n = int64_t(g.classes.size());
  k = std::clamp<int64_t>(k, 0, n - std::max<int64_t>({1, g.blocks, g.part_keep}));
  if (round_to > 1) {
    int64_t kept = n - k;
    kept = std::min(n, (kept + round_to - 1) / round_to * round_to);
    k = n - kept;
  }
  if (g.blocks > 1) k -= k % g.blocks;
  return k;
}

// Which classes of `g` go when `k` of them should (k from cap()): the lowest scores, as many from
// each block, never the last of a part (its best channel stays, the next lowest goes instead).
// When the parts and blocks together allow fewer, as many as cap() allows of those go.
std::vector<size_t> lowest(const Group& g, int64_t k, int64_t round_to) {
  std::vector<size_t> order(g.classes.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t x, size_t y) { return g.score[x] < g.score[y]; });
  std::vector<std::vector<size_t>> parts_of(g.classes.size());
  for (size_t p = 0; p < g.parts.size(); ++p)
    for (size_t c : g.parts[p]) parts_of[c].push_back(p);
  for (;;) {
    std::vector<size_t> out;
    std::vector<int64_t> taken(g.blocks, 0), left(g.parts.size());
    for (size_t p = 0; p < g.parts.size(); ++p) left[p] = int64_t(g.parts[p].size());
    for (size_t i : order) {
      if (int64_t(out.size()) == k) break;
      const int64_t b = g.block_of.empty() ? 0 : g.block_of[i];
      const bool last_of_a_part = std::any_of(parts_of[i].begin(), parts_of[i].end(),
                                              [&](size_t p) { return left[p] == 1; });
      if (taken[b] == k / g.blocks || last_of_a_part) continue;
      for (size_t p : parts_of[i]) --left[p];
      ++taken[b], out.push_back(i);
    }
    if (int64_t(out.size()) == k) {
      std::sort(out.begin(), out.end());
      return out;
    }
    k = cap(g, std::min(int64_t(out.size()), k - 1), round_to);
  }
}

StructuredReport report_of(const ir::Model& model, const Analysis& a,
                           const std::vector<std::vector<size_t>>& removed,
                           const std::vector<std::string>& rules) {
  StructuredReport r;
  r.barriers = a.dg.barriers;
  for (size_t gi = 0; gi < a.groups.size(); ++gi) {
    const Group& g = a.groups[gi];
    ChannelGroupReport gr;
    gr.id = int64_t(gi);
    gr.kind = g.head ? "head" : "channel";
    layer_names(model.graph, g, &gr.layers);
    gr.layer_params = layer_params(model.graph, g);
    gr.size_before = int64_t(g.classes.size());
    gr.size_after = gr.size_before - int64_t(removed[gi].size());
    if (!g.score.empty())
      gr.score = std::accumulate(g.score.begin(), g.score.end(), 0.0) / double(g.score.size());
    gr.blocked = g.blocked;
    gr.blocks = g.blocks;
    gr.rule = rules[gi];
    for (size_t i : removed[gi]) gr.removed.push_back(int64_t(i));
    if (g.blocked.empty()) r.channels_before += gr.size_before, r.channels_after += gr.size_after;
    r.groups.push_back(std::move(gr));
  }
  return r;
}

}  // namespace

StructuredReport channel_groups(const ir::Model& model, const StructuredOptions& opts) {
  Analysis a = analyse(model, opts);
  return report_of(model, a, std::vector<std::vector<size_t>>(a.groups.size()),
                   std::vector<std::string>(a.groups.size()));
}

GroupSlices channel_group_slices(const ir::Model& model, const StructuredOptions& opts) {
  Analysis a = analyse(model, opts);
  GroupSlices out;
  std::map<int64_t, std::pair<int64_t, int64_t>> where;  // class -> (group id, channel)
  for (const auto& g : a.groups) {
    if (!g.blocked.empty()) continue;
    int64_t id = int64_t(out.group_sizes.size());
    out.group_sizes.push_back(int64_t(g.classes.size()));
    for (size_t c = 0; c < g.classes.size(); ++c) where[g.classes[c]] = {id, int64_t(c)};
  }
  for (const auto& sl : a.dg.slices) {
    if (sl.role == ParamRole::kOther || !sl.ref.is_initializer) continue;
    // One slice per group the weight follows (a Concat's consumer: one per branch), each with the
    // positions along the axis that are that group's.
    std::map<int64_t, GroupSlice> by_group;
    for (size_t i = 0; i < sl.atoms.size(); ++i) {
      auto it = where.find(a.dg.find(sl.atoms[i]));
      if (it == where.end()) continue;  // a blocked group's channel
      GroupSlice& gs = by_group[it->second.first];
      gs.index.push_back(int64_t(i));
      gs.channel.push_back(it->second.second);
    }
    for (auto& [group, gs] : by_group) {
      gs.weight = sl.ref.name;
      gs.axis = sl.ref.perm.empty() ? sl.axis : sl.ref.perm[sl.axis];
      gs.group = group;
      out.slices.push_back(std::move(gs));
    }
  }
  return out;
}

CriterionInfo channel_criterion_info(const std::string& name) {
  return importance::info(importance::find(name, importance::Use::kChannels));
}

std::vector<CriterionInfo> channel_criteria() {
  return importance::infos(importance::Use::kChannels, channel_criterion_info);
}

void check_structured_options(const StructuredOptions& opts) {
  if (opts.group_amounts.empty() && !opts.recipe) {
    PruneLayerOptions amount_only;  // the amount's checks are prune()'s
    amount_only.amount = opts.amount;
    check_layer_options(amount_only);
  }
  LOPPER_CHECK(opts.max_layer_amount > 0 && opts.max_layer_amount <= 1,
               "[prune] " LOPPER_OPTION("max_layer_amount") " must be in (0, 1], got ",
               opts.max_layer_amount);
  LOPPER_CHECK(opts.round_to >= 1, "[prune] " LOPPER_OPTION("round_to") " must be >= 1, got ",
               opts.round_to);
  if (opts.unit == StructuredUnit::kBlock)
    (void)depth_criterion_info(opts.criterion);
  else
    (void)importance::find(opts.criterion, importance::Use::kChannels);
  (void)LayerFilter(opts.exclude);
}

Saliency structured_saliency(const ir::Model& model, const StructuredOptions& opts,
                             DataLoader& data, const CalibrationOptions& calib) {
  check_structured_options(opts);
  const importance::Criterion& c = importance::find(opts.criterion, importance::Use::kChannels);
  LOPPER_CHECK(c.needs_data(), "[prune] " LOPPER_OPTION("criterion") " ", c.name,
               " ranks channels without data");
  if (c.needs == importance::Needs::kGradients) return compute_saliency(model, data, calib);
  StructuredOptions o = opts;
  o.runs = nullptr;  // the caller's runs are prune_structured()'s
  Analysis a = analyse(model, o);
  return collect_activations(model, activation_sites(model.graph, a.dg),
                             opts.unit == StructuredUnit::kHead, data, calib, c.name);
}

StructuredReport prune_structured(ir::Model& model, const StructuredOptions& opts,
                                  const Saliency* saliency) {
  check_structured_options(opts);
  const importance::Criterion& crit = importance::find(opts.criterion, importance::Use::kChannels);
  LOPPER_CHECK(!crit.needs_data() || saliency, "[prune] " LOPPER_OPTION("criterion") " ", crit.name,
               " needs calibration data: a Saliency");
  LayerFilter exclude(opts.exclude);
  std::vector<Pattern> rule_res;  // checked when the recipe was parsed
  if (opts.recipe)
    for (const auto& rule : opts.recipe->rules)
      rule_res.push_back(compile_regex(rule.match, "match"));
  Analysis a = analyse(model, opts);
  score(a, model.graph, opts, saliency);
  const ir::Graph& graph = model.graph;
  std::vector<std::string> warnings;

  // Which groups take part, and their own amount (recipes).
  std::vector<std::optional<PruneAmount>> amount(a.groups.size());
  std::vector<std::string> rules(a.groups.size());
  std::vector<char> rule_used(opts.recipe ? opts.recipe->rules.size() : 0, 0);
  for (size_t gi = 0; gi < a.groups.size(); ++gi) {
    Group& g = a.groups[gi];
    if (!g.blocked.empty()) continue;
    if (opts.unit == StructuredUnit::kHead && !g.head) {
      g.blocked = "not attention heads (--structured head)";
      continue;
    }
    // NOTE: each name is searched on its own, so that ^ and $ anchor to a layer's name.
    std::vector<std::string> names;
    layer_names(graph, g, &names);
    for (auto& p : layer_params(graph, g))
      if (!p.empty()) names.push_back(std::move(p));  // a rule may name a parameter too
    if (exclude.excludes(names)) {
      g.blocked = "excluded (--exclude)";
      continue;
    }
    amount[gi] = opts.amount;
    if (!opts.group_amounts.empty()) {
      auto it = opts.group_amounts.find(int64_t(gi));
      if (it == opts.group_amounts.end()) {
        amount[gi].reset();
      } else {
        LOPPER_CHECK(it->second >= 0 && it->second <= 1, "[prune] group ", gi,
                     ": an amount must be in [0, 1], got ", it->second);
        amount[gi] = PruneAmount{it->second, false};
      }
    } else if (opts.recipe) {
      const PruneRecipe& rc = *opts.recipe;
      bool matched = false;
      for (size_t ri = 0; ri < rc.rules.size() && !matched; ++ri) {
        const auto& rule = rc.rules[ri];
        if (std::none_of(names.begin(), names.end(),
                         [&](const std::string& n) { return rule_res[ri].search(n); }))
          continue;
        matched = true, rule_used[ri] = 1, rules[gi] = rule.where;
        if (rule.skip) {
          g.blocked = "skipped by " + rule.where;
          amount[gi].reset();
        } else {
          amount[gi] = rule.options.amount;
        }
      }
      if (!matched) {
        if (rc.has_defaults) {
          amount[gi] = rc.defaults.amount, rules[gi] = "defaults";
        } else {
          g.blocked = "no recipe rule matches";
          amount[gi].reset();
        }
      }
    }
  }
  for (size_t ri = 0; ri < rule_used.size(); ++ri)
    if (!rule_used[ri])
      warnings.push_back(opts.recipe->rules[ri].where + " matches no channel group");

  std::vector<std::vector<size_t>> removed(a.groups.size());
  auto choose = [&](size_t gi, int64_t k) {  // group gi loses k channels, or what cap() allows
    const Group& g = a.groups[gi];
    k = cap(g, k, opts.round_to);
    removed[gi] = lowest(g, k, opts.round_to);
    if (int64_t(removed[gi].size()) < k)
      warnings.push_back("group " + std::to_string(gi) + " (" +
                         graph.nodes[*g.layers.begin()].label() + ") loses " +
                         std::to_string(removed[gi].size()) + " channels, not " +
                         std::to_string(k) + ": every part of it (a Split output) keeps one");
  };
  bool any = false;
  for (size_t gi = 0; gi < a.groups.size(); ++gi) any |= amount[gi].has_value();
  if (!any)
    throw Error("[prune] no channel group can be pruned: " +
                (a.dg.barriers.empty() ? std::string("the model has no prunable layer")
                                       : "barriers: " + a.dg.barriers.front()));
  if (opts.scope == PruneScope::kLocal || opts.recipe || !opts.group_amounts.empty()) {
    for (size_t gi = 0; gi < a.groups.size(); ++gi) {
      if (!amount[gi]) continue;
      const Group& g = a.groups[gi];
      choose(gi, amount[gi]->count_of(int64_t(g.classes.size()), layer_names(graph, g, nullptr)));
    }
  } else {
    // One ranking across groups; scores divided by their group's mean so groups compare.
    struct Entry {
      double s;
      size_t g, c;
    };
    std::vector<Entry> all;
    int64_t total = 0;
    for (size_t gi = 0; gi < a.groups.size(); ++gi) {
      if (!amount[gi]) continue;
      const Group& g = a.groups[gi];
      double mean = std::accumulate(g.score.begin(), g.score.end(), 0.0) / double(g.score.size());
      for (size_t c = 0; c < g.classes.size(); ++c)
        all.push_back({mean > 0 ? g.score[c] / mean : g.score[c], gi, c});
      total += int64_t(g.classes.size());
    }
    int64_t k = opts.amount.count_of(total, "the model's channels");
    std::stable_sort(all.begin(), all.end(),
                     [](const Entry& x, const Entry& y) { return x.s < y.s; });
    std::vector<int64_t> want(a.groups.size(), 0), limit(a.groups.size(), 0);
    for (size_t gi = 0; gi < a.groups.size(); ++gi)
      if (amount[gi]) {
        const Group& g = a.groups[gi];
        limit[gi] =
            cap(g, int64_t(std::floor(opts.max_layer_amount * double(g.classes.size()))), 1);
      }
    for (const auto& e : all) {
      if (k == 0) break;
      if (want[e.g] < limit[e.g]) ++want[e.g], --k;
    }
    for (size_t gi = 0; gi < a.groups.size(); ++gi)
      if (amount[gi]) choose(gi, want[gi]);
  }

  // Remove: classes of every removed channel. The shrunk model is run on shapes (as the analysis
  // ran it); where it does not run, the groups whose removal alone breaks it are kept at their
  // size, each named with the reason (a width the graph computes in a way the rules did not
  // follow: grouped-query heads repeated through shapes of a dynamic export), and the rest goes.
  auto gone_of = [&] {
    std::vector<char> gone(a.dg.parent.size(), 0);
    for (size_t gi = 0; gi < a.groups.size(); ++gi)
      for (size_t c : removed[gi]) gone[a.groups[gi].classes[c]] = 1;
    return gone;
  };
  // `last`: the shrunk model that is kept, when it runs: its run and cost go to opts.runs.
  auto shrunk = [&](const std::vector<char>& gone, std::string& why, bool last = false) {
    ir::Model m = model;
    depgraph::apply(m, a.dg, gone);
    try {
      const auto shapes = resolve_input_shapes(m, opts.input_shapes, 1);
      if (last && opts.runs)
        opts.runs->cost_after =
            analyze(m, shapes, node_shapes(m, opts.runs->feeds, &opts.runs->after));
      else
        (void)node_shapes(m, shapes);
      why.clear();
    } catch (const std::exception& e) {
      why = first_line(e.what());
    }
    return m;
  };
  std::vector<char> gone = gone_of();
  if (std::none_of(gone.begin(), gone.end(), [](char g) { return g != 0; })) {
    StructuredReport r = report_of(model, a, removed, rules);
    r.warnings = warnings;
    if (opts.runs) {
      opts.runs->after = opts.runs->before;
      opts.runs->cost_after = opts.runs->cost_before;
    }
    return r;  // amount 0: the model as it was
  }
  std::string why;
  ir::Model out = shrunk(gone, why, true);
  if (!why.empty()) {
    const std::string first_why = why;
    for (size_t gi = 0; gi < a.groups.size(); ++gi) {
      if (removed[gi].empty()) continue;
      std::vector<char> alone(a.dg.parent.size(), 0);
      for (size_t c : removed[gi]) alone[a.groups[gi].classes[c]] = 1;
      std::string broke;
      (void)shrunk(alone, broke);
      if (broke.empty()) continue;
      removed[gi].clear();
      a.groups[gi].blocked = "removing its channels breaks the model (" + broke + ")";
      warnings.push_back(
          "group " + std::to_string(gi) + " (" + graph.nodes[*a.groups[gi].layers.begin()].label() +
          ") kept at its size: removing its channels breaks the model (" + broke + ")");
    }
    gone = gone_of();
    if (std::none_of(gone.begin(), gone.end(), [](char g) { return g != 0; }))
      throw Error("[prune] no channel group can be pruned: removing any breaks the model (" +
                  first_why +
                  "); a model exported with static input shapes lets lopper follow "
                  "every width");
    out = shrunk(gone, why, true);
    if (!why.empty())
      throw InternalError("internal error (a lopper bug): the shrunk model does not run: " + why);
  }
  StructuredReport r = report_of(model, a, removed, rules);
  r.warnings = warnings;
  model = std::move(out);
  return r;
}

}  // namespace lopper
