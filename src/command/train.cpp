// TrainRequest: the rules of lopper train and lopper finetune, once.
#include <memory>
#include <string>

#include "command/rules.h"
#include "lopper/command.h"
#include "lopper/error.h"
#include "lopper/executor.h"

namespace lopper {
namespace {

using command::as_usage;
using command::opt;

PruneSchedule schedule_of(const std::string& s) {
  if (s == "none") return PruneSchedule::kNone;
  if (s == "iterative") return PruneSchedule::kIterative;
  if (s == "agp") return PruneSchedule::kAgp;
  throw UsageError("[train] unknown " + opt("schedule") + " '" + s +
                   "' (schedules: none, iterative, agp)");
}

// "2" (epochs) or "100steps" / "100s".
void parse_every(const std::string& s, TrainOptions& o) {
  size_t used = 0;
  long long v = 0;
  try {
    v = std::stoll(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  const std::string unit = s.substr(used);
  if (!(used > 0 && v > 0 && (unit.empty() || unit == "steps" || unit == "s")))
    throw UsageError("[train] " + opt("every_epochs") +
                     " takes a number of epochs (2) or steps (100steps), got '" + s + "'");
  if (unit.empty()) {
    o.every_epochs = v;
    o.every_steps = 0;
  } else {
    o.every_steps = v;
  }
}

}  // namespace

TrainOptions TrainRequest::validate() const {
  TrainOptions t = options;
  t.schedule = schedule_of(schedule.value_or("none"));
  if (t.schedule != PruneSchedule::kNone) {
    if (!prune_criterion || !prune_amount)
      throw UsageError("[train] " + opt("schedule") + " " + *schedule + " needs " +
                       opt("prune.criterion") + " M and " + opt("prune.amount") + " A");
    t.prune.amount = as_usage([&] { return PruneAmount::parse(*prune_amount); });
    if (prune_structured) {
      t.structured_schedule = true;
      if (*prune_structured == "head")
        t.structured.unit = StructuredUnit::kHead;
      else if (*prune_structured != "channel")
        throw UsageError("[train] " + opt("structured_schedule") + " takes channel or head, got '" +
                         *prune_structured + "'");
      t.structured.criterion =
          as_usage([&] { return channel_criterion_info(*prune_criterion); }).name;
      t.structured.seed = t.seed;
    } else {
      t.prune.criterion = as_usage([&] { return weight_criterion_info(*prune_criterion); }).name;
    }
    const std::string scope = prune_scope.value_or("global");
    if (scope == "global")
      t.prune.scope = PruneScope::kGlobal;
    else if (scope == "local")
      t.prune.scope = PruneScope::kLocal;
    else
      throw UsageError("[train] unknown " + opt("prune.scope") + " '" + scope +
                       "' (global, local)");
    as_usage([&] { parse_prune_pattern(prune_pattern.value_or("unstructured"), t.prune); });
    t.structured.scope = t.prune.scope;
    if (t.prune.pattern != PrunePattern::kUnstructured && t.prune.pattern != PrunePattern::kBlock)
      t.prune.scope = PruneScope::kLocal;
    t.prune.seed = t.seed;
    parse_every(every.value_or("1"), t);
    if (t.schedule == PruneSchedule::kIterative && t.rounds > 0 && t.epochs_per_round > 0)
      t.epochs = t.rounds * t.epochs_per_round;
  } else if (prune_criterion || prune_amount || prune_structured || t.prune.allow_tied) {
    throw UsageError("[train] " + opt("prune.criterion") + "/" + opt("prune.amount") + "/" +
                     opt("structured_schedule") + "/" + opt("prune.allow_tied") + " need " +
                     opt("schedule") + " iterative|agp");
  }
  if (teacher) {
    if (distill_alpha) t.distill.alpha = *distill_alpha;
    if (distill_temperature) t.distill.temperature = *distill_temperature;
    if (distill_state_weight) t.distill.state_weight = *distill_state_weight;
    for (const std::string& pair : distill_states) {
      const size_t eq = pair.find('=');
      if (eq == std::string::npos || eq == 0 || eq + 1 == pair.size() ||
          pair.find('=', eq + 1) != std::string::npos)
        throw UsageError("[train] " + opt("distill_state") +
                         " takes STUDENT_TENSOR=TEACHER_TENSOR, got '" + pair + "'");
      t.distill.states.push_back({pair.substr(0, eq), pair.substr(eq + 1)});
    }
  } else if (distill_alpha || distill_temperature || distill_state_weight ||
             !distill_states.empty()) {
    throw UsageError("[train] " + opt("distill_alpha") + "/" + opt("distill_temperature") + "/" +
                     opt("distill_state") + "/" + opt("distill_state_weight") + " need " +
                     opt("teacher") + " DENSE.onnx");
  }
  (void)check_device(t.device);
  t.optimizer = as_usage([&] { return parse_optimizer(optimizer.value_or("sgd")); });
  t.precision = as_usage([&] { return parse_precision(precision.value_or("fp32")); });
  t.lr_schedule = as_usage([&] { return parse_lr_schedule(lr_schedule.value_or("constant")); });
  as_usage([&] {
    // The teacher itself is checked against the student when the trainer starts.
    TrainOptions c = t;
    if (teacher && !c.distill.teacher) c.distill.teacher = std::make_shared<ir::Model>();
    check_train_options(c);
  });
  return t;
}

}  // namespace lopper
