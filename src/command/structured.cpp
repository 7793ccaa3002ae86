// StructuredRequest: the rules of lopper prune --structured and lopper.prune_structured, once.
#include <memory>
#include <optional>
#include <string>

#include "command/rules.h"
#include "lopper/command.h"
#include "lopper/data.h"
#include "lopper/depth.h"
#include "lopper/error.h"

namespace lopper {

StructuredJob StructuredRequest::validate() const {
  command::refuse_target_options(target_options, report);
  using command::opt;
  for (const std::string& name : unstructured_options)
    throw UsageError("[prune] " + opt(name) + " is for unstructured pruning, not " +
                     opt("structured"));
  StructuredJob job;
  StructuredOptions& so = job.options;
  if (unit == "channel")
    so.unit = StructuredUnit::kChannel;
  else if (unit == "head")
    so.unit = StructuredUnit::kHead;
  else if (unit == "block")
    so.unit = StructuredUnit::kBlock;
  else if (unit == "expert")
    throw UsageError(
        "[prune] " + opt("structured") +
        " expert runs from Python on the transformers model (lopper.prune_structured(model, "
        "inputs, unit=\"expert\", method=\"reap\", amount=..., data=...)): an MoE model's ONNX "
        "export keeps each layer's experts in one tensor that the router's TopK indices gather "
        "from at run time (transformers' eager and grouped_mm experts do not export at all), so "
        "the graph has no expert to remove");
  else
    throw UsageError("[prune] unknown unit '" + unit + "' (units: channel, head, block)");
  const bool depth = so.unit == StructuredUnit::kBlock;
  const CriterionInfo crit = command::as_usage([&] {
    return depth ? depth_criterion_info(criterion.value_or("influence"))
                 : channel_criterion_info(criterion.value_or("l1"));
  });
  so.criterion = crit.name;
  if (depth)
    for (const auto& [given, name] : {std::pair{recipe != nullptr, "recipe"},
                                      {scope.has_value(), "scope"},
                                      {max_layer_amount.has_value(), "max_layer_amount"},
                                      {round_to.has_value(), "round_to"}})
      if (given)
        throw UsageError("[prune] " + opt(name) + " is for channel and head groups, not " +
                         opt("structured") + " block (give " + opt("amount") + ")");
  if (recipe) {
    if (amount)
      throw UsageError("[prune] " + opt("recipe") + " sets each group's amount: drop " +
                       opt("amount") + " (put it in the recipe)");
    job.recipe = std::make_shared<const PruneRecipe>(recipe());
    so.recipe = job.recipe.get();
  } else {
    if (!amount)
      throw UsageError("[prune] structured pruning needs " + opt("amount") +
                       " (the share of each group's channels to remove, a fraction in [0, 1], "
                       "or a count) or " +
                       opt("recipe"));
    so.amount = *amount;
  }
  so.scope = command::scope_of(scope);
  if (max_layer_amount) so.max_layer_amount = *max_layer_amount;
  if (round_to) so.round_to = *round_to;
  if (exclude) so.exclude = *exclude;
  if (seed) so.seed = *seed;
  so.input_shapes = input_shapes;
  command::as_usage([&] { check_structured_options(so); });
  job.needs_data = crit.needs_data;
  if (crit.needs_data && !data)
    throw UsageError("[prune] " + opt("criterion") + " " + crit.name + " ranks channels " +
                     crit.data_needed + " on data: give " + opt("data") + data_hint);
  if (!crit.needs_data)
    command::refuse_data_options(data_options, report, offers_report,
                                 depth ? depth_criteria() : channel_criteria());
  return job;
}

StructuredReport StructuredJob::run(ir::Model& model, DataLoader* data,
                                    const CalibrationOptions& calib) const {
  LOPPER_ASSERT(data || !needs_data, "a structured job that ranks by data was given none");
  if (options.unit == StructuredUnit::kBlock) return prune_depth(model, options, data, calib);
  std::optional<Saliency> saliency;
  if (needs_data) saliency = structured_saliency(model, options, *data, calib);
  return prune_structured(model, options, saliency ? &*saliency : nullptr);
}

}  // namespace lopper
