// Structured pruning: channel groups from the dependency graph, their importance, the channels
// each group loses (local, global, recipe), and the physical removal.
#include "lopper/structured.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <regex>
#include <set>

#include "lopper/analysis.h"
#include "lopper/error.h"
#include "prune/depgraph.h"
#include "prune/regex.h"

namespace lopper {

namespace {

using ops::ParamRole;

struct Group {
  std::vector<int64_t> classes;  // root atoms, in channel order
  std::set<size_t> layers;       // nodes with slices or sources
  bool head = false;
  std::string blocked;
  std::vector<int64_t> block_of;  // per class: its block under a grouped conv (empty: none)
  int64_t blocks = 1;
  std::vector<double> score;      // per class
};

struct Analysis {
  depgraph::DepGraph dg;
  std::vector<Group> groups;
};

Analysis analyse(const ir::Model& model, const StructuredOptions& opts) {
  Analysis a;
  auto shapes = resolve_input_shapes(model, opts.input_shapes, 1);
  NodeShapes io = node_shapes(model, shapes);
  a.dg = depgraph::build(model, io, opts.unit == StructuredUnit::kHead);
  auto& dg = a.dg;
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
  for (const auto& s : dg.slices)
    if (!s.atoms.empty()) a.groups[group_of[dg.find(s.atoms[0])]].layers.insert(s.node);
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
  for (auto& g : a.groups)
    if (g.blocked.empty() && g.classes.size() < 2) g.blocked = "a single channel";
  return a;
}

// Every group's per-class importance (Group::score), from the dependency graph's slices.
void score(Analysis& a, const StructuredOptions& opts, const Saliency* saliency) {
  auto& dg = a.dg;
  std::map<int64_t, double> s;  // class -> score (l2: sum of squares until the end)
  auto add = [&](const depgraph::Slice& sl, const at::Tensor& per_index) {
    auto v = per_index.to(at::kDouble).contiguous();
    const double* p = v.data_ptr<double>();
    for (size_t i = 0; i < sl.atoms.size(); ++i) s[dg.find(sl.atoms[i])] += p[i];
  };
  auto rows = [](const at::Tensor& t, int64_t axis) {  // one row per index along `axis`
    return t.to(at::kDouble).movedim(axis, 0).reshape({t.size(axis), -1});
  };
  auto reduce_except = [&](const at::Tensor& t, int64_t axis, bool square) {
    at::Tensor x = rows(t, axis);
    return square ? x.pow(2).sum(1) : x.abs().sum(1);
  };
  const auto imp = opts.importance;
  std::set<int64_t> normed;  // classes with a normalisation scale (bn ranks by it)
  for (const auto& sl : dg.slices) {
    const bool weight = sl.role == ParamRole::kWeightOut || sl.role == ParamRole::kWeightIn;
    if ((imp == ChannelImportance::kL1 || imp == ChannelImportance::kL2) && weight) {
      add(sl, reduce_except(sl.value, sl.axis, imp == ChannelImportance::kL2));
    } else if (imp == ChannelImportance::kBN && sl.role == ParamRole::kNormScale) {
      add(sl, sl.value.to(at::kDouble).abs().reshape({-1}));
      for (int64_t atom : sl.atoms) normed.insert(dg.find(atom));
    } else if (imp == ChannelImportance::kTaylor && weight) {
      auto it = saliency->taylor.find(sl.ref.name);
      if (it == saliency->taylor.end()) continue;
      at::Tensor t = sl.ref.perm.empty() ? it->second : it->second.permute(sl.ref.perm);
      add(sl, reduce_except(t, sl.axis, false));
    } else if (imp == ChannelImportance::kFPGM && sl.role == ParamRole::kWeightOut) {
      at::Tensor r = rows(sl.value, sl.axis);
      add(sl, at::cdist(r, r).sum(1));
    }
  }
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(opts.seed);
  for (auto& g : a.groups) {
    g.score.clear();
    for (int64_t c : g.classes) {
      double v = s.count(c) ? s[c] : 0.0;
      if (imp == ChannelImportance::kL2) v = std::sqrt(v);
      g.score.push_back(v);
    }
    if (imp == ChannelImportance::kRandom) {
      at::Tensor r = at::rand({int64_t(g.classes.size())}, gen, at::kDouble);
      for (size_t i = 0; i < g.classes.size(); ++i) g.score[i] = r.data_ptr<double>()[i];
    }
    if (imp == ChannelImportance::kBN && g.blocked.empty() &&
        std::none_of(g.classes.begin(), g.classes.end(),
                     [&](int64_t c) { return normed.count(c) > 0; }))
      g.blocked = "no normalisation scale to rank by (--method bn)";
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

// Which classes of `g` go when `k` of them should: the lowest scores, as many from each block.
std::vector<size_t> lowest(const Group& g, int64_t k) {
  std::vector<size_t> order(g.classes.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t x, size_t y) { return g.score[x] < g.score[y]; });
  std::vector<size_t> out;
  if (g.block_of.empty()) {
    out.assign(order.begin(), order.begin() + k);
  } else {
    const int64_t per_block = k / g.blocks;
    std::vector<int64_t> taken(g.blocks, 0);
    for (size_t i : order)
      if (taken[g.block_of[i]] < per_block) ++taken[g.block_of[i]], out.push_back(i);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// How many of n channels may go at most: one stays (one per block for grouped convolutions).
int64_t cap(const Group& g, int64_t k, int64_t round_to) {
  const int64_t n = int64_t(g.classes.size());
  k = std::clamp<int64_t>(k, 0, n - std::max<int64_t>(1, g.blocks));
  if (round_to > 1) {
    int64_t kept = n - k;
    kept = std::min(n, (kept + round_to - 1) / round_to * round_to);
    k = n - kept;
  }
  if (g.blocks > 1) k -= k % g.blocks;
  return k;
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

ChannelImportance parse_channel_importance(const std::string& s) {
  for (auto i : {ChannelImportance::kL1, ChannelImportance::kL2, ChannelImportance::kBN,
                 ChannelImportance::kTaylor, ChannelImportance::kFPGM, ChannelImportance::kRandom})
    if (s == importance_name(i)) return i;
  throw Error("[prune] unknown structured method '" + s +
              "' (methods: l1, l2, bn, taylor, fpgm, random)");
}

const char* importance_name(ChannelImportance i) {
  switch (i) {
    case ChannelImportance::kL1: return "l1";
    case ChannelImportance::kL2: return "l2";
    case ChannelImportance::kBN: return "bn";
    case ChannelImportance::kTaylor: return "taylor";
    case ChannelImportance::kFPGM: return "fpgm";
    case ChannelImportance::kRandom: return "random";
  }
  return "?";
}

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
    if (sl.role == ParamRole::kOther || !sl.ref.is_initializer || sl.atoms.empty()) continue;
    auto it = where.find(a.dg.find(sl.atoms[0]));
    if (it == where.end()) continue;
    GroupSlice gs;
    gs.weight = sl.ref.name;
    gs.axis = sl.ref.perm.empty() ? sl.axis : sl.ref.perm[sl.axis];
    gs.group = it->second.first;
    for (int64_t atom : sl.atoms) gs.channel.push_back(where.at(a.dg.find(atom)).second);
    out.slices.push_back(std::move(gs));
  }
  return out;
}

StructuredReport prune_structured(ir::Model& model, const StructuredOptions& opts,
                                  const Saliency* saliency) {
  PruneLayerOptions amount_only;  // the amount's checks are prune()'s
  amount_only.amount = opts.amount;
  check_layer_options(amount_only);
  LOPPER_CHECK(opts.max_layer_amount > 0 && opts.max_layer_amount <= 1,
               "[prune] --max-layer-amount must be in (0, 1], got ", opts.max_layer_amount);
  LOPPER_CHECK(opts.round_to >= 1, "[prune] --round-to must be >= 1, got ", opts.round_to);
  LOPPER_CHECK(opts.importance != ChannelImportance::kTaylor || saliency,
               "[prune] --method taylor needs calibration data (--data)");
  std::optional<std::regex> exclude;
  if (!opts.exclude.empty()) exclude = compile_regex(opts.exclude, "--exclude");
  std::vector<std::regex> rule_res;  // checked when the recipe was parsed
  if (opts.recipe)
    for (const auto& rule : opts.recipe->rules) rule_res.push_back(compile_regex(rule.match, "match"));
  Analysis a = analyse(model, opts);
  score(a, opts, saliency);
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
    std::string names = layer_names(graph, g, nullptr);
    if (exclude && std::regex_search(names, *exclude)) {
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
        if (!std::regex_search(names, rule_res[ri])) continue;
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
      int64_t k = amount[gi]->count_of(int64_t(g.classes.size()), layer_names(graph, g, nullptr));
      removed[gi] = lowest(g, cap(g, k, opts.round_to));
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
    std::stable_sort(all.begin(), all.end(), [](const Entry& x, const Entry& y) { return x.s < y.s; });
    std::vector<int64_t> want(a.groups.size(), 0), limit(a.groups.size(), 0);
    for (size_t gi = 0; gi < a.groups.size(); ++gi)
      if (amount[gi]) {
        const Group& g = a.groups[gi];
        limit[gi] = cap(g, int64_t(std::floor(opts.max_layer_amount * double(g.classes.size()))), 1);
      }
    for (const auto& e : all) {
      if (k == 0) break;
      if (want[e.g] < limit[e.g]) ++want[e.g], --k;
    }
    for (size_t gi = 0; gi < a.groups.size(); ++gi)
      if (amount[gi]) removed[gi] = lowest(a.groups[gi], cap(a.groups[gi], want[gi], opts.round_to));
  }

  // Remove: classes of every removed channel.
  std::vector<char> gone(a.dg.parent.size(), 0);
  bool changed = false;
  for (size_t gi = 0; gi < a.groups.size(); ++gi)
    for (size_t c : removed[gi]) gone[a.groups[gi].classes[c]] = 1, changed = true;
  StructuredReport r = report_of(model, a, removed, rules);
  r.warnings = warnings;
  if (!changed) return r;  // amount 0: the model as it was
  ir::Model out = model;
  depgraph::apply(out, a.dg, gone);
  try {
    (void)node_shapes(out, resolve_input_shapes(out, opts.input_shapes, 1));
  } catch (const std::exception& e) {
    throw Error(std::string("[prune] internal error: the shrunk model does not run (please "
                            "report it): ") + e.what());
  }
  model = std::move(out);
  return r;
}

}  // namespace lopper
