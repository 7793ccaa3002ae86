// TrainRequest: the rules of lopper train and lopper finetune, once, and what they resolve to.
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "lopper/command.h"
#include "lopper/error.h"
#include "lopper/train.h"
#include "test_util.h"

namespace lopper {
namespace {

// An AGP schedule to 50% by l1 over the first epoch.
TrainRequest agp() {
  TrainRequest r;
  r.options.epochs = 2;
  r.options.end_epoch = 1;
  r.schedule = "agp";
  r.prune_criterion = "l1";
  r.prune_amount = "0.5";
  return r;
}

// The message `r` is refused with, its options named as the library names them.
std::string refusal(const TrainRequest& r) { return test::refusal_of(r); }

TEST(TrainRequest, ResolvesTheScheduleAndItsPruning) {
  const TrainOptions t = agp().validate();
  EXPECT_EQ(t.schedule, PruneSchedule::kAgp);
  EXPECT_EQ(t.prune.criterion, "l1");
  EXPECT_DOUBLE_EQ(t.prune.amount.value, 0.5);
  EXPECT_EQ(t.prune.scope, PruneScope::kGlobal);  // a schedule ranks globally unless told
  EXPECT_EQ(t.every_epochs, 1);
  EXPECT_EQ(t.optimizer, Optimizer::kSgd);

  TrainRequest nm = agp();
  nm.prune_pattern = "2:4";
  EXPECT_EQ(nm.validate().prune.scope, PruneScope::kLocal);  // N:M is per group of weights

  TrainRequest steps = agp();
  steps.every = "100steps";
  EXPECT_EQ(steps.validate().every_steps, 100);

  TrainRequest heads = agp();
  heads.prune_structured = "head";
  const TrainOptions h = heads.validate();
  EXPECT_TRUE(h.structured_schedule);
  EXPECT_EQ(h.structured.unit, StructuredUnit::kHead);
  EXPECT_EQ(h.structured.criterion, "l1");

  TrainRequest rounds = agp();
  rounds.schedule = "iterative";
  rounds.options.rounds = 3;
  rounds.options.epochs_per_round = 2;
  EXPECT_EQ(rounds.validate().epochs, 6);  // the rounds set the epochs

  TrainRequest plain;
  plain.optimizer = "adamw";
  plain.lr_schedule = "cosine";
  const TrainOptions p = plain.validate();
  EXPECT_EQ(p.schedule, PruneSchedule::kNone);
  EXPECT_EQ(p.optimizer, Optimizer::kAdamW);
  EXPECT_EQ(p.lr_schedule, LrSchedule::kCosine);
}

// Each refusal as an edit of the accepted request, one line a case.
TEST(TrainRequest, RefusesEachBrokenRule) {
  EXPECT_EQ(refusal(agp()), "(accepted)");
  const std::pair<std::function<void(TrainRequest&)>, std::string> cases[] = {
      {[](TrainRequest& r) { r.prune_criterion.reset(); },
       "[train] schedule agp needs prune.criterion M and prune.amount A"},
      {[](TrainRequest& r) { r.schedule = "wavy"; },
       "[train] unknown schedule 'wavy' (schedules: none, iterative, agp)"},
      {[](TrainRequest& r) { r.schedule = "none"; },
       "[train] prune.criterion/prune.amount/structured_schedule/prune.allow_tied need schedule "
       "iterative|agp"},
      {[](TrainRequest& r) { r.prune_structured = "rows"; },
       "[train] structured_schedule takes channel or head, got 'rows'"},
      {[](TrainRequest& r) { r.prune_scope = "wide"; },
       "[train] unknown prune.scope 'wide' (global, local)"},
      {[](TrainRequest& r) { r.every = "soon"; },
       "[train] every_epochs takes a number of epochs (2) or steps (100steps), got 'soon'"},
      {[](TrainRequest& r) { r.prune_amount = "1.5"; },
       "[prune] amount must be in [0, 1], got 1.5"},
      {[](TrainRequest& r) { r.prune_criterion = "nope"; }, "[prune] unknown method 'nope'"},
      {[](TrainRequest& r) { r.prune_structured = "channel", r.prune_criterion = "activation"; },
       "[train] a pruning schedule ranks channels by l1, l2, bn, fpgm, random or taylor, not "
       "activation"},
      {[](TrainRequest& r) { r.optimizer = "rmsprop"; }, "[train] unknown optimizer 'rmsprop'"},
      {[](TrainRequest& r) { r.lr_schedule = "linear"; }, "[train] unknown lr_schedule 'linear'"},
      {[](TrainRequest& r) { r.options.epochs = 0; }, "[train] epochs must be > 0, got 0"},
      {[](TrainRequest& r) { r.options.end_epoch = 9; },
       "[train] schedule agp needs 0 <= start_epoch < end_epoch <= epochs, got 0, 9 of 2"},
  };
  for (const auto& [edit, want] : cases) {
    TrainRequest r = agp();
    edit(r);
    const std::string got = refusal(r);
    EXPECT_EQ(got.substr(0, want.size()), want) << got;
  }
  TrainRequest tied;
  tied.options.prune.allow_tied = true;  // a schedule's option, without the schedule
  EXPECT_NE(refusal(tied).find("need schedule iterative|agp"), std::string::npos) << refusal(tied);
}

}  // namespace
}  // namespace lopper
