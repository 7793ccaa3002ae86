// Pruning recipes: per-layer rules read from YAML (schema in lopper/prune.h and
// examples/recipe.yaml). Every error is one line naming the file, the key and the line.
#include <yaml-cpp/yaml.h>

#include <fstream>
#include <set>
#include <sstream>

#include "lopper/error.h"
#include "lopper/files.h"
#include "lopper/prune.h"
#include "prune/importance.h"

namespace lopper {

namespace {

struct Parser {
  std::string source;

  [[noreturn]] void fail(const YAML::Node& n, const std::string& key, const std::string& msg) {
    std::string where = source;
    if (n.IsDefined() && n.Mark().line >= 0) where += ":" + std::to_string(n.Mark().line + 1);
    throw Error("[prune] recipe " + where + ": " + (key.empty() ? "" : key + ": ") + msg);
  }

  std::string scalar(const YAML::Node& n, const std::string& key) {
    if (!n.IsScalar()) fail(n, key, "must be a single value");
    return n.Scalar();
  }

  template <typename T>
  T as(const YAML::Node& n, const std::string& key, const char* what) {
    if (!n.IsScalar()) fail(n, key, std::string("must be ") + what);
    try {
      return n.as<T>();
    } catch (const YAML::Exception&) {
      fail(n, key, std::string("must be ") + what + ", got '" + n.Scalar() + "'");
    }
  }

  // Reads the pruning keys of a map (defaults or a rule) over `o`. `extra` are the other keys the
  // map may hold. Returns whether it names a method; sets has_amount / has_threshold.
  void options(const YAML::Node& map, const std::string& path, const std::set<std::string>& extra,
               PruneLayerOptions& o, bool& has_method, bool& has_amount, bool& has_threshold) {
    static const std::set<std::string> keys = {"method",     "amount",     "threshold",
                                               "pattern",    "norm",       "seed",
                                               "allow_tied", "block_size", "dampening"};
    for (auto it = map.begin(); it != map.end(); ++it) {
      const YAML::Node& k = it->first;
      const YAML::Node& v = it->second;
      std::string name = scalar(k, path);
      std::string key = path + "." + name;
      if (extra.count(name)) continue;
      if (!keys.count(name)) {
        std::string known;
        for (const auto& s : keys) known += (known.empty() ? "" : ", ") + s;
        for (const auto& s : extra) known += ", " + s;
        fail(k, key, "unknown key (keys: " + known + ")");
      }
      try {
        if (name == "method") {
          o.criterion = importance::find(scalar(v, key), importance::Use::kWeights).name;
          has_method = true;
        } else if (name == "amount") {
          o.amount = PruneAmount::parse(scalar(v, key));
          has_amount = true;
        } else if (name == "threshold") {
          o.threshold = as<double>(v, key, "a number");
          has_threshold = true;
        } else if (name == "pattern") {
          parse_prune_pattern(scalar(v, key), o);
        } else if (name == "norm") {
          o.norm = as<int>(v, key, "1 or 2");
        } else if (name == "seed") {
          o.seed = as<uint64_t>(v, key, "an integer >= 0");
        } else if (name == "allow_tied") {
          o.allow_tied = as<bool>(v, key, "true or false");
        } else if (name == "block_size") {
          o.block_size = as<int64_t>(v, key, "an integer >= 1");
        } else if (name == "dampening") {
          o.dampening = as<double>(v, key, "a number > 0");
        }
      } catch (const Error& e) {
        std::string m = e.render(recipe_key);
        if (m.rfind("[prune] recipe ", 0) == 0) throw;
        if (m.rfind("[prune] ", 0) == 0) m = m.substr(8);
        fail(v, key, m);
      }
    }
  }

  // The options a map ends up with must prune: a method, and what that method needs.
  void complete(const YAML::Node& map, const std::string& path, const PruneLayerOptions& o,
                bool has_amount, bool has_threshold) {
    const bool threshold = importance::find(o.criterion, importance::Use::kWeights).weights ==
                           importance::WeightRank::kThreshold;
    if (threshold && !has_threshold) fail(map, path, "method " + o.criterion + " needs threshold");
    if (!threshold && o.pattern != PrunePattern::kNM && !has_amount)
      fail(map, path, "method " + o.criterion + " needs amount");
    try {
      check_layer_options(o);
    } catch (const Error& e) {
      std::string m = e.render(recipe_key);
      if (m.rfind("[prune] ", 0) == 0) m = m.substr(8);
      fail(map, path, m);
    }
  }
};

}  // namespace

std::string recipe_key(const std::string& option) {
  return option == "criterion" ? "method" : option;
}

PruneRecipe parse_prune_recipe(const std::string& yaml, const std::string& source) {
  Parser p{source};
  YAML::Node root;
  try {
    root = YAML::Load(yaml);
  } catch (const YAML::ParserException& e) {
    throw Error("[prune] recipe " + source + ":" + std::to_string(e.mark.line + 1) +
                ": not valid YAML: " + e.msg);
  }
  if (!root.IsMap()) p.fail(root, "", "must be a map with 'defaults' and 'rules'");

  PruneRecipe r;
  r.source = source;
  bool d_method = false, d_amount = false, d_threshold = false;
  YAML::Node defaults, rules;
  for (auto it = root.begin(); it != root.end(); ++it) {
    std::string key = p.scalar(it->first, "");
    if (key == "defaults")
      defaults = it->second;
    else if (key == "rules")
      rules = it->second;
    else
      p.fail(it->first, key, "unknown key (keys: defaults, rules)");
  }
  if (defaults && !defaults.IsNull()) {
    if (!defaults.IsMap()) p.fail(defaults, "defaults", "must be a map");
    p.options(defaults, "defaults", {}, r.defaults, d_method, d_amount, d_threshold);
    if (d_method) p.complete(defaults, "defaults", r.defaults, d_amount, d_threshold);
    r.has_defaults = d_method;
  }
  if (!rules || rules.IsNull()) {
    if (!r.has_defaults) p.fail(root, "", "has no rules and no defaults.method: nothing to do");
    return r;
  }
  if (!rules.IsSequence()) p.fail(rules, "rules", "must be a list of rules");
  for (size_t i = 0; i < rules.size(); ++i) {
    const YAML::Node& n = rules[i];
    std::string path = "rules[" + std::to_string(i) + "]";
    if (!n.IsMap()) p.fail(n, path, "must be a map with 'match' and 'skip' or a method");
    PruneRule rule;
    rule.where = path + " (line " + std::to_string(n.Mark().line + 1) + ")";
    rule.options = r.defaults;
    bool has_method = d_method, has_amount = d_amount, has_threshold = d_threshold;
    bool own_method = false, own_keys = false;
    p.options(n, path, {"match", "skip"}, rule.options, own_method, has_amount, has_threshold);
    has_method = has_method || own_method;
    const YAML::Node m = n["match"];
    if (!m)
      p.fail(n, path, "needs 'match' (a regex on the layer's node, weight or parameter name)");
    rule.match = p.scalar(m, path + ".match");
    if (const std::string why = regex_error(rule.match); !why.empty())
      p.fail(m, path + ".match", "'" + rule.match + "' is not a valid regex: " + why);
    for (auto it = n.begin(); it != n.end(); ++it) {
      std::string k = it->first.Scalar();
      if (k != "match" && k != "skip") own_keys = true;
    }
    if (const YAML::Node s = n["skip"]) rule.skip = p.as<bool>(s, path + ".skip", "true or false");
    if (rule.skip) {
      if (own_keys) p.fail(n, path, "skip: true takes no method, amount or other keys");
    } else {
      if (!has_method) p.fail(n, path, "needs 'skip: true' or a method (defaults have none)");
      p.complete(n, path, rule.options, has_amount, has_threshold);
    }
    r.rules.push_back(std::move(rule));
  }
  return r;
}

PruneRecipe load_prune_recipe(const std::string& path) {
  std::string text;
  try {
    text = read_file(path);  // refuses a FIFO or a device, never blocks
  } catch (const Error& e) {
    throw Error(detail::concat("[prune] cannot read recipe ", path, ": ", e.what()));
  }
  return parse_prune_recipe(text, path);
}

}  // namespace lopper
