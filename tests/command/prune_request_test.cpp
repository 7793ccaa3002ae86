// PruneRequest: the rules of lopper prune and lopper.prune, once, and what they resolve to.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <tuple>

#include "lopper/command.h"
#include "lopper/error.h"
#include "lopper/prune.h"
#include "test_models.h"

namespace lopper {
namespace {

PruneRequest l1(double amount) {
  PruneRequest r;
  r.criterion = "l1";
  r.amount = PruneAmount{amount, false};
  return r;
}

PruneRecipe half_l1() {
  PruneRecipe recipe;
  recipe.source = "r.yaml";
  recipe.has_defaults = true;
  recipe.defaults.amount = PruneAmount{0.5, false};
  return recipe;
}

// The message `r` is refused with, options spelled as a front end spells them.
std::string refusal(const PruneRequest& r, std::string (*name)(const std::string&) = nullptr) {
  return test::refusal_of(r, name);
}
using test::refusal_of;

std::string flag(const std::string& o) { return o == "criterion" ? "--method" : "--" + o; }

TEST(PruneRequest, EachRuleNamesTheOptionsInTheFrontEndsWords) {
  PruneRequest r = l1(0.5);
  r.threshold = 0.1;
  EXPECT_EQ(refusal(r), "[prune] threshold is for criterion abs; criterion l1 takes amount");
  EXPECT_EQ(refusal(r, flag),
            "[prune] --threshold is for --method abs; --method l1 takes --amount");

  r = l1(0.5);
  r.recipe = half_l1;
  EXPECT_EQ(refusal(r),
            "[prune] recipe sets each layer's pruning: drop criterion (put it in the "
            "recipe)");
  r.criterion.reset();
  r.amount.reset();
  r.scope = "global";
  EXPECT_EQ(refusal(r, flag),
            "[prune] --recipe prunes layer by layer: --scope global does not go with it");
}

TEST(PruneRequest, RefusesWhatDoesNotGoTogether) {
  // Each case changes l1 at 0.5 (accepted) into what is refused.
  using Edit = std::function<void(PruneRequest&)>;
  const std::tuple<const char*, Edit, std::string> cases[] = {
      {"no criterion", [](auto& r) { r.criterion.reset(); }, "[prune] needs criterion"},
      {"abs without threshold", [](auto& r) { r.criterion = "abs", r.amount.reset(); },
       "[prune] criterion abs needs threshold"},
      {"abs with amount", [](auto& r) { r.criterion = "abs", r.threshold = 0.1; },
       "[prune] criterion abs takes threshold, not amount"},
      {"l1 without amount", [](auto& r) { r.amount.reset(); }, "[prune] criterion l1 needs amount"},
      {"N:M with amount", [](auto& r) { r.pattern = "2:4"; },
       "[prune] N:M keeps N of every M weights: drop amount"},
      {"bad N:M first", [](auto& r) { r.pattern = "5:4"; },
       "[prune] N:M needs 1 <= N < M, got 5:4"},
      {"scope", [](auto& r) { r.scope = "galaxy"; }, "[prune] unknown scope 'galaxy'"},
      {"grad without data", [](auto& r) { r.criterion = "grad"; },
       "[prune] grad ranks weights by their gradients on data: give data"},
      {"OWL without data", [](auto& r) { r.owl_lambda = 0.1; },
       "[prune] OWL weighs each block by its outlier activations: give data"},
      {"data for l1", [](auto& r) { r.data = true, r.data_options = {"data"}; },
       "[prune] data is for grad, taylor, wanda and sparsegpt only"},
      {"one pass for l1", [](auto& r) { r.one_pass = true; },
       "[prune] one_pass is for criterion wanda and sparsegpt (and OWL)"},
      {"no batches",
       [](auto& r) {
         r.criterion = "wanda", r.data = true, r.data_options = {"data", "batches"}, r.batches = 0;
       },
       "[prune] batches must be >= 1, got 0"},
      {"recipe and block size",
       [](auto& r) {
         r.criterion.reset(), r.amount.reset(), r.recipe = half_l1, r.block_size = 64;
       },
       "[prune] recipe sets each layer's pruning: drop block_size"},
  };
  for (const auto& [name, edit, message] : cases) {
    PruneRequest r = l1(0.5);
    edit(r);
    const std::string m = refusal(r);
    EXPECT_EQ(m.rfind(message, 0), 0u) << name << ": " << m;
  }
}

// The options of the other workflows, given where one command takes them all (the CLI's prune):
// each refused, naming the workflow it is for; the report reads eval_batches.
TEST(PruneRequest, RefusesTheOptionsOfOtherWorkflows) {
  PruneRequest r = l1(0.5);
  r.structured_options = {"round_to"};
  EXPECT_EQ(refusal(r, flag), "[prune] --round_to is for --structured");  // flag(): no dashes
  r.structured_options.clear();
  r.target_options = {"sensitivity"};
  EXPECT_EQ(refusal(r), "[prune] sensitivity is for target_macs/target_params/target_latency");
  r.target_options = {"eval_batches"};
  EXPECT_EQ(refusal(r),
            "[prune] eval_batches is for target_macs/target_params/target_latency and report");
  r.report = true;  // --report's accuracy is measured on that many batches
  EXPECT_EQ(refusal(r), "(accepted)");
  StructuredRequest s;
  s.amount = PruneAmount{0.5, false};
  s.target_options = {"sensitivity"};
  EXPECT_EQ(refusal_of(s), "[prune] sensitivity is for target_macs/target_params/target_latency");
}

TEST(PruneRequest, TheReportMayReadTheDataButNotItsBatchCount) {
  PruneRequest r = l1(0.5);
  r.data = true;
  r.data_options = {"data", "batch_size"};
  r.offers_report = true;
  EXPECT_EQ(refusal(r, flag),
            "[prune] --data is for grad, taylor, wanda and sparsegpt only (or --report's "
            "accuracy)");
  r.report = true;
  EXPECT_EQ(refusal(r), "(accepted)");
  r.data_options.push_back("batches");
  r.batches = 4;
  EXPECT_EQ(refusal(r), "[prune] batches is for grad, taylor, wanda and sparsegpt only");
}

TEST(PruneRequest, ResolvesToTheLibrarysOptionsAndPrunesAsPruneDoes) {
  PruneRequest r = l1(0.5);
  r.scope = "global";
  r.seed = 3;
  r.exclude = "fc2";
  const PruneJob job = r.validate();
  ASSERT_TRUE(job.options.has_value());
  EXPECT_FALSE(job.recipe.has_value());
  EXPECT_FALSE(job.needs_data);
  EXPECT_EQ(job.options->scope, PruneScope::kGlobal);
  EXPECT_EQ(job.options->seed, 3u);
  EXPECT_EQ(job.options->block_size, PruneLayerOptions{}.block_size);  // not given: the default

  at::manual_seed(0);
  ir::Model a = test::two_layers(at::randn({8, 6}), at::randn({8, 4}));
  ir::Model b = a;
  for (auto& i : b.graph.initializers) i.value = i.value.clone();
  const PruneReport ra = job.run(a, nullptr, {});
  const PruneReport rb = prune(b, *job.options);
  EXPECT_EQ(ra.nonzero_after, rb.nonzero_after);
  EXPECT_TRUE(
      at::equal(a.graph.find_initializer("w1")->value, b.graph.find_initializer("w1")->value));

  PruneRequest wanda = l1(0.5);
  wanda.criterion = "wanda";
  wanda.data = true;
  const PruneJob w = wanda.validate();
  EXPECT_TRUE(w.reads_inputs);
  EXPECT_TRUE(w.needs_data);
  EXPECT_EQ(w.data_method, "wanda");

  PruneRequest recipe;
  recipe.recipe = half_l1;
  const PruneJob rj = recipe.validate();
  ASSERT_TRUE(rj.recipe.has_value());
  EXPECT_EQ(rj.recipe->source, "r.yaml");
}

TEST(StructuredRequest, OneRuleForBothFrontEnds) {
  StructuredRequest r;
  EXPECT_NE(std::string(refusal_of(r)).find("structured pruning needs amount"), std::string::npos);
  r.amount = PruneAmount{0.5, false};
  r.unit = "neuron";
  EXPECT_EQ(refusal_of(r), "[prune] unknown unit 'neuron' (units: channel, head, block)");
  r.unit = "head";
  r.unstructured_options = {"block_size"};
  EXPECT_EQ(refusal_of(r), "[prune] block_size is for unstructured pruning, not structured");
  r.unstructured_options.clear();
  r.criterion = "taylor";
  EXPECT_EQ(refusal_of(r).rfind("[prune] criterion taylor ranks channels", 0), 0u);
  r.criterion = "activation";
  EXPECT_EQ(refusal_of(r).rfind("[prune] criterion activation ranks channels by the layers' inputs "
                                "on data: give data",
                                0),
            0u);
  r.criterion = "l1";
  r.data = true;
  r.data_options = {"data"};
  EXPECT_EQ(refusal_of(r), "[prune] data is for taylor and activation only");
  r.data = false;
  r.data_options.clear();
  r.round_to = 0;
  EXPECT_EQ(refusal_of(r), "[prune] round_to must be >= 1, got 0");  // a usage error too
  r.round_to = 8;
  r.recipe = [] {
    PruneRecipe recipe;
    recipe.source = "s.yaml";
    return recipe;
  };
  EXPECT_EQ(refusal_of(r).rfind("[prune] recipe sets each group's amount: drop amount", 0), 0u);
  r.amount.reset();
  const StructuredJob job = r.validate();
  ASSERT_TRUE(job.recipe);
  EXPECT_EQ(job.options.recipe, job.recipe.get());
  EXPECT_EQ(job.options.unit, StructuredUnit::kHead);
  EXPECT_EQ(job.options.round_to, 8);
  const StructuredJob copy = job;  // the options' recipe stays valid in a copy
  EXPECT_EQ(copy.options.recipe->source, "s.yaml");
}

TEST(TargetRequest, OneRuleForBothFrontEnds) {
  TargetRequest r;
  EXPECT_EQ(refusal_of(r).rfind("[prune] give one target", 0), 0u);
  r.target_params = 0.5;
  r.target_macs = 0.5;
  EXPECT_NE(refusal_of(r).find("got several"), std::string::npos);
  r.target_macs.reset();
  r.per_layer_options = {"amount"};
  EXPECT_EQ(refusal_of(r), "[prune] a target chooses each layer's amount: drop amount");
  r.per_layer_options.clear();
  r.criterion = "random";
  EXPECT_NE(refusal_of(r).find("criterion random does not go with it"), std::string::npos);
  r.criterion = "wanda";
  EXPECT_EQ(refusal_of(r).rfind("[prune] a target with criterion wanda calibrates", 0), 0u);
  r.data = true;
  r.block_size = 64;
  EXPECT_EQ(refusal_of(r),
            "[prune] block_size is for a target with criterion sparsegpt, not wanda");
  r.criterion = "sparsegpt";
  r.target_params = 1.5;
  EXPECT_EQ(refusal_of(r), "[prune] target_params is the share kept, in (0, 1), got 1.5");
  r.target_params = 0.5;
  const TargetJob job = r.validate();
  EXPECT_TRUE(job.reads_inputs);
  EXPECT_EQ(job.options.kind, TargetKind::kParams);
  EXPECT_EQ(job.options.block_size, 64);
  EXPECT_EQ(job.options.criterion, "sparsegpt");
  r.structured = "channel";
  r.criterion.reset();
  r.block_size.reset();
  r.allow_tied = true;
  EXPECT_EQ(refusal_of(r), "[prune] allow_tied is for unstructured pruning, not structured");
}

}  // namespace
}  // namespace lopper
