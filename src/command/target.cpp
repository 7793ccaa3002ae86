// TargetRequest: the rules of lopper prune --target-* and lopper.prune_to_target, once.
#include <string>
#include <tuple>
#include <utility>

#include "command/rules.h"
#include "lopper/command.h"
#include "lopper/error.h"

namespace lopper {

TargetJob TargetRequest::validate() const {
  using command::opt;
  TargetJob job;
  TargetOptions& t = job.options;
  int given = 0;
  const std::pair<const std::optional<double>*, TargetKind> targets[] = {
      {&target_macs, TargetKind::kMacs},
      {&target_params, TargetKind::kParams},
      {&target_latency_ms, TargetKind::kLatency}};
  for (const auto& [value, kind] : targets)
    if (value->has_value()) ++given, t.kind = kind, t.value = **value;
  if (given != 1)
    throw UsageError("[prune] give one target: " + opt("target_macs") + " or " +
                     opt("target_params") + " (the share kept, in (0, 1)) or " +
                     opt("target_latency") + ", got " + (given ? "several" : "none"));
  for (const std::string& name : per_layer_options)
    throw UsageError("[prune] a target chooses each layer's amount: drop " + opt(name));
  if (structured) {
    std::tie(t.structured, t.blocks) = command::structured_units("prune", *structured);
    if (t.blocks && !t.structured && criterion)
      throw UsageError("[prune] " + opt("structured") + " block removes each block whole: drop " +
                       opt("criterion"));
    t.criterion =
        command::as_usage([&] { return channel_criterion_info(criterion.value_or("l1")).name; });
    if (allow_tied)
      throw UsageError("[prune] " + opt("allow_tied") + " is for unstructured pruning, not " +
                       opt("structured"));
  } else {
    const CriterionInfo c =
        command::as_usage([&] { return weight_criterion_info(criterion.value_or("l1")); });
    job.reads_inputs = c.reads_inputs;
    if (!c.reads_inputs && c.name != "l1")
      throw UsageError("[prune] a target prunes weights by l1, wanda or sparsegpt; " +
                       opt("criterion") + " " + c.name + " does not go with it");
    t.criterion = c.name;
  }
  const std::string method = opt("criterion") + " " + t.criterion;
  command::check_one_shot("prune", "a target with ", t.criterion, job.reads_inputs, batches,
                          block_size.has_value(), dampening.has_value());
  if (block_size) t.block_size = *block_size;
  if (dampening) t.dampening = *dampening;
  if (job.reads_inputs && !data)
    throw UsageError("[prune] a target with " + method +
                     " calibrates on the layers' inputs: give " + opt("data") + data_hint);
  if (round_to) t.round_to = *round_to;
  if (exclude) t.exclude = *exclude;
  t.allow_tied = allow_tied;
  t.device = device;
  t.input_shapes = input_shapes;
  if (eval_batches && *eval_batches < 1)
    throw UsageError("[prune] " + opt("eval_batches") + " must be >= 1, got " +
                     std::to_string(*eval_batches));
  // NOTE: wanda and sparsegpt need sensitivity and calibration data, which the front end reads
  // later: what check_target_options() asks of them here is an l1 target's, and their layer
  // options.
  TargetOptions early = t;
  if (job.reads_inputs) early.criterion = "l1";
  command::as_usage([&] { check_target_options(early); });
  if (job.reads_inputs) {
    PruneLayerOptions lo;
    lo.criterion = t.criterion;
    lo.block_size = t.block_size;
    lo.dampening = t.dampening;
    command::as_usage([&] { check_layer_options(lo); });
  }
  command::check_exclude("prune", t.exclude);
  return job;
}

}  // namespace lopper
