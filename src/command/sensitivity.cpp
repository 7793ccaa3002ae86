// SensitivityRequest: the rules of lopper sensitivity and lopper.sensitivity, once.
#include <string>
#include <tuple>
#include <utility>

#include "command/rules.h"
#include "lopper/command.h"
#include "lopper/error.h"

namespace lopper {

SensitivityJob SensitivityRequest::validate() const {
  using command::opt;
  SensitivityJob job;
  SensitivityOptions& so = job.options;
  if (structured)
    std::tie(so.structured, so.blocks) = command::structured_units("sensitivity", *structured);
  const std::string name = criterion.value_or("l1");
  if (so.blocks && !so.structured && criterion)
    throw UsageError("[sensitivity] " + opt("structured") +
                     " block removes each block whole: drop " + opt("criterion"));
  const CriterionInfo c = command::as_usage(
      [&] { return so.structured ? channel_criterion_info(name) : weight_criterion_info(name); });
  so.criterion = c.name;
  job.reads_inputs = !so.structured && !so.blocks && c.reads_inputs;
  command::check_one_shot("sensitivity", "", so.criterion, job.reads_inputs, batches,
                          block_size.has_value(), dampening.has_value());
  if (block_size) so.block_size = *block_size;
  if (dampening) so.dampening = *dampening;
  if (batches) so.calib_batches = *batches;
  if (amounts) so.amounts = *amounts;
  if (eval_batches) so.eval_batches = *eval_batches;
  if (round_to) so.round_to = *round_to;
  if (exclude) so.exclude = *exclude;
  if (seed) so.seed = *seed;
  if (allow_tied && (so.structured || so.blocks))
    throw UsageError("[sensitivity] " + opt("allow_tied") + " is for single weights, not " +
                     opt("structured"));
  so.allow_tied = allow_tied;
  so.device = device;
  so.input_shapes = input_shapes;
  command::as_usage([&] { check_sensitivity_options(so); });
  command::check_exclude("sensitivity", so.exclude);
  if (!data)
    throw UsageError("[sensitivity] " + opt("data") +
                     " is needed: the sweep evaluates the model on it" + data_hint);
  return job;
}

}  // namespace lopper
