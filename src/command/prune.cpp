// PruneRequest: the rules of lopper prune (per layer, recipes) and lopper.prune, once.
#include <optional>
#include <string>
#include <utility>

#include "command/rules.h"
#include "lopper/command.h"
#include "lopper/data.h"
#include "lopper/error.h"

namespace lopper {
namespace command {

std::pair<bool, bool> structured_units(const char* op, const std::string& structured) {
  if (structured == "channel") return {true, false};
  if (structured == "block") return {false, true};
  if (structured == "channel,block" || structured == "block,channel") return {true, true};
  throw UsageError(std::string("[") + op + "] " + opt("structured") +
                   " takes channel, block or channel,block, got '" + structured + "'");
}

PruneScope scope_of(const std::optional<std::string>& scope) {
  const std::string s = scope.value_or("local");
  if (s == "local") return PruneScope::kLocal;
  if (s == "global") return PruneScope::kGlobal;
  throw UsageError("[prune] unknown scope '" + s + "' (scopes: local, global)");
}

void refuse_data_options(const std::vector<std::string>& given, bool report, bool offers_report,
                         const std::vector<CriterionInfo>& criteria) {
  const std::string methods = criterion_names(criteria, " and ", true);
  for (const std::string& name : given)
    if (!report || name == "batches")
      throw UsageError(
          "[prune] " + opt(name) + " is for " + methods + " only" +
          (offers_report && name != "batches" ? " (or " + opt("report") + "'s accuracy)" : ""));
}

void refuse_target_options(const std::vector<std::string>& given, bool report) {
  const std::string targets =
      opt("target_macs") + "/" + opt("target_params") + "/" + opt("target_latency");
  for (const std::string& name : given)
    if (name != "eval_batches" || !report)
      throw UsageError("[prune] " + opt(name) + " is for " + targets +
                       (name == "eval_batches" ? " and " + opt("report") : std::string()));
}

void check_one_shot(const char* op, const std::string& whose, const std::string& criterion,
                    bool reads_inputs, const std::optional<int64_t>& batches, bool block_size,
                    bool dampening) {
  const std::string at = std::string("[") + op + "] ";
  if (batches && !reads_inputs)
    throw UsageError(at + opt("batches") + " is for " + whose + opt("criterion") +
                     " wanda and sparsegpt (they read the layers' inputs), not " + criterion);
  if (batches && *batches < 1)
    throw UsageError(at + opt("batches") + " must be >= 1, got " + std::to_string(*batches));
  for (const auto& [name, given] :
       {std::pair<const char*, bool>{"block_size", block_size}, {"dampening", dampening}})
    if (given && !(reads_inputs && criterion == "sparsegpt"))
      throw UsageError(at + opt(name) + " is for " + whose + opt("criterion") + " sparsegpt, not " +
                       criterion);
}

}  // namespace command

namespace {

using command::as_usage;
using command::opt;

CriterionInfo criterion_of(const std::string& name) {
  return as_usage([&] { return weight_criterion_info(name); });
}

}  // namespace

PruneJob PruneRequest::validate() const {
  command::refuse_target_options(target_options, report);
  for (const std::string& name : structured_options)
    throw UsageError("[prune] " + opt(name) + " is for " + opt("structured"));
  PruneJob job;
  auto note = [&](const PruneLayerOptions& l) {
    const CriterionInfo c = criterion_of(l.criterion);
    if (c.needs_data && job.data_method.empty()) job.data_method = c.name;
    job.gradients |= c.needs_data && !c.reads_inputs;
  };
  if (recipe) {
    // Every option that says how a layer is pruned belongs in the recipe.
    const std::pair<const char*, bool> per_layer[] = {
        {"criterion", criterion.has_value()}, {"threshold", threshold.has_value()},
        {"amount", amount.has_value()},       {"seed", seed.has_value()},
        {"pattern", pattern.has_value()},     {"norm", norm.has_value()},
        {"exclude", exclude.has_value()},     {"skip_first_last", skip_first_last},
        {"allow_tied", allow_tied},           {"block_size", block_size.has_value()},
        {"dampening", dampening.has_value()}, {"owl_lambda", owl_lambda.has_value()},
        {"owl_m", owl_m.has_value()}};
    for (const auto& [name, given] : per_layer)
      if (given)
        throw UsageError("[prune] " + opt("recipe") + " sets each layer's pruning: drop " +
                         opt(name) + " (put it in the recipe)");
    if (scope && *scope != "local")
      throw UsageError("[prune] " + opt("recipe") + " prunes layer by layer: " + opt("scope") +
                       " " + *scope + " does not go with it");
    job.recipe = recipe();
    if (job.recipe->has_defaults) note(job.recipe->defaults);
    for (const auto& r : job.recipe->rules)
      if (!r.skip) note(r.options);
    job.reads_inputs = reads_layer_inputs(*job.recipe);
  } else {
    if (!criterion)
      throw UsageError("[prune] needs " + opt("criterion") + " (methods: " +
                       criterion_names(weight_criteria()) + ") or " + opt("recipe"));
    PruneOptions o;
    o.criterion = *criterion;
    const CriterionInfo c = criterion_of(o.criterion);
    o.scope = command::scope_of(scope);
    as_usage([&] { parse_prune_pattern(pattern.value_or("unstructured"), o); });
    const std::string method = opt("criterion") + " " + c.name;
    if (c.takes_threshold) {
      if (!threshold)
        throw UsageError("[prune] " + method + " needs " + opt("threshold") +
                         " (it removes |w| < T)");
      if (amount)
        throw UsageError("[prune] " + method + " takes " + opt("threshold") + ", not " +
                         opt("amount"));
      o.threshold = *threshold;
    } else {
      if (threshold)
        throw UsageError("[prune] " + opt("threshold") + " is for " + opt("criterion") + " abs; " +
                         method + " takes " + opt("amount"));
      if (o.pattern != PrunePattern::kNM) {
        if (!amount)
          throw UsageError("[prune] " + method + " needs " + opt("amount") +
                           " (a fraction in [0, 1] or a count)");
        o.amount = *amount;
      }
    }
    if (seed) o.seed = *seed;
    if (norm) o.norm = *norm;
    if (exclude) o.exclude = *exclude;
    o.skip_first_last = skip_first_last;
    o.allow_tied = allow_tied;
    if (block_size) o.block_size = *block_size;
    if (dampening) o.dampening = *dampening;
    if (owl_lambda) o.owl.lambda = *owl_lambda;
    if (owl_m) o.owl.m = *owl_m;
    as_usage([&] { check_prune_options(o); });
    if (o.pattern == PrunePattern::kNM && amount)
      throw UsageError("[prune] N:M keeps N of every M weights: drop " + opt("amount"));
    if (owl_lambda && !data)
      throw UsageError("[prune] OWL weighs each block by its outlier activations: give " +
                       opt("data") + data_hint);
    note(o);
    job.reads_inputs = reads_layer_inputs(o);
    job.options = std::move(o);
  }
  job.needs_data = !job.data_method.empty() || job.reads_inputs;
  if (!job.data_method.empty() && !data) {
    throw UsageError("[prune] " + job.data_method + " ranks weights " +
                     criterion_of(job.data_method).data_needed + " on data: give " + opt("data") +
                     data_hint);
  }
  if (!job.needs_data)
    command::refuse_data_options(data_options, report, offers_report, weight_criteria());
  if (one_pass && !job.reads_inputs)
    throw UsageError("[prune] " + opt("one_pass") + " is for " + opt("criterion") +
                     " wanda and sparsegpt (and OWL)");
  if (batches && *batches < 1)
    throw UsageError("[prune] " + opt("batches") + " must be >= 1, got " +
                     std::to_string(*batches));
  return job;
}

PruneReport PruneJob::run(ir::Model& model, DataLoader* data,
                          const CalibrationOptions& calib) const {
  LOPPER_ASSERT(options.has_value() != recipe.has_value(), "a job prunes one way");
  LOPPER_ASSERT(data || !needs_data, "a job that reads data was given none");
  if (reads_inputs)
    return options ? prune_calibrated(model, *options, *data, calib)
                   : prune_calibrated(model, *recipe, *data, calib);
  std::optional<Saliency> saliency;
  if (needs_data) saliency = compute_saliency(model, *data, calib);
  const Saliency* s = saliency ? &*saliency : nullptr;
  return options ? prune(model, *options, s) : prune(model, *recipe, s);
}

PruneReport PruneJob::run(ir::Model& layers, CalibrationRunner& runner,
                          const CalibrationOptions& calib) const {
  LOPPER_ASSERT(options.has_value() != recipe.has_value(), "a job prunes one way");
  LOPPER_ASSERT(reads_inputs, "a job the caller calibrates reads the layers' inputs");
  return options ? prune_calibrated(layers, *options, runner, calib)
                 : prune_calibrated(layers, *recipe, runner, calib);
}

}  // namespace lopper
