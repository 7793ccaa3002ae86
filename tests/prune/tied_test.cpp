// Tied weights (one initializer that a prunable layer and another node read: GPT-2's lm_head is its
// token embedding's table) and weights several layers share: what prunable_weights() finds, and
// the one policy every unstructured path follows — a shared weight is pruned only when every
// reader is a prunable layer the selection includes; a tie needs allow_tied. Also the names a layer
// answers to in exclude and recipes (node, weight, PyTorch parameter).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "lopper/analysis.h"
#include "lopper/data.h"
#include "lopper/error.h"
#include "lopper/executor.h"
#include "lopper/onnx_io.h"
#include "lopper/prune.h"
#include "lopper/sensitivity.h"
#include "lopper/structured.h"
#include "lopper/target.h"
#include "test_models.h"

using namespace lopper;
using namespace lopper::test;

namespace {

int64_t nnz(const ir::Model& m, const std::string& w) {
  return init(m, w).count_nonzero().item<int64_t>();
}

const PruneLayerReport& row(const PruneReport& r, const std::string& weight) {
  for (const auto& l : r.layers)
    if (l.weight == weight) return l;
  throw std::runtime_error("no layer with weight " + weight);
}

bool warns(const PruneReport& r, const std::string& needle) {
  for (const auto& w : r.warnings)
    if (w.find(needle) != std::string::npos) return true;
  return false;
}

const char* kTie = "tied with embedding 'embed' (Gather): pruning would change the embedding too";

// w [8, 8] read by two MatMuls: x -> fc_a (w) -> relu -> fc_b (w) -> y.
ir::Model shared_by_two_layers() {
  at::manual_seed(3);
  ir::Model m;
  m.ir_version = 8;
  m.opset_import = {{"", 17}};
  m.graph.nodes = {node("MatMul", {"x", "w"}, {"a"}, "fc_a"), node("Relu", {"a"}, {"r"}, "relu"),
                   node("MatMul", {"r", "w"}, {"y"}, "fc_b")};
  m.graph.initializers = {{"w", at::randn({8, 8})}};
  return m;
}

}  // namespace

TEST(TiedWeights, FoundThroughTheirReadersAndNamed) {
  ir::Model m = tied_classifier();
  std::vector<PrunableWeight> pw = prunable_weights(m.graph);
  ASSERT_EQ(pw.size(), 2u);
  EXPECT_EQ(pw[0].weight, "w1");
  EXPECT_TRUE(pw[0].shared.empty());
  EXPECT_FALSE(pw[0].tied());
  EXPECT_EQ(pw[0].tie_reason(), "");
  EXPECT_EQ(pw[1].weight, "E");
  EXPECT_EQ(pw[1].node->name, "lm_head");
  ASSERT_EQ(pw[1].shared.size(), 1u);
  EXPECT_EQ(pw[1].shared[0].node, "embed");
  EXPECT_EQ(pw[1].shared[0].op, "Gather");
  EXPECT_EQ(pw[1].shared[0].use, "embedding");
  EXPECT_TRUE(pw[1].tied());
  EXPECT_EQ(pw[1].tie_reason(), kTie);

  // A reader of the shape alone does not tie it; one of the values, through Cast, does.
  m.graph.nodes.push_back(node("Shape", {"E"}, {"s"}, "shape"));
  EXPECT_EQ(prunable_weights(m.graph)[1].shared.size(), 1u);
  m.graph.nodes.push_back(node("Cast", {"E"}, {"Ec"}, "cast"));
  m.graph.nodes.back().attrs = {int_attr("to", 1)};
  m.graph.nodes.push_back(node("ReduceSum", {"Ec"}, {"sum"}, "sum"));
  pw = prunable_weights(m.graph);
  ASSERT_EQ(pw[1].shared.size(), 2u);
  EXPECT_EQ(pw[1].shared[1].node, "sum");
  EXPECT_EQ(pw[1].shared[1].use, "other");
  EXPECT_EQ(pw[1].tie_reason(),
            "tied with embedding 'embed' (Gather) (+1 more): pruning would change the embedding "
            "too");

  // As a graph output.
  ir::Model out = shared_by_two_layers();
  out.graph.outputs = {value_info("w", {8, 8})};
  pw = prunable_weights(out.graph);
  ASSERT_EQ(pw.size(), 1u);
  EXPECT_EQ(pw[0].tie_reason(), "also the graph output 'w': pruning would change that output too");
}

TEST(TiedWeights, PruneLeavesThemAloneInEveryPatternUnlessAllowed) {
  const ir::Model model = tied_classifier();
  const int64_t e_before = nnz(model, "E");
  struct Case {
    const char* what;
    PruneOptions o;
  };
  std::vector<Case> cases;
  auto add = [&](const char* what, auto set) {
    PruneOptions o;
    o.amount = PruneAmount{0.5, false};
    set(o);
    cases.push_back({what, o});
  };
  add("l1 local", [](PruneOptions&) {});
  add("l1 global", [](PruneOptions& o) { o.scope = PruneScope::kGlobal; });
  add("lamp global", [](PruneOptions& o) { o.criterion = "lamp", o.scope = PruneScope::kGlobal; });
  add("random", [](PruneOptions& o) { o.criterion = "random"; });
  add("abs", [](PruneOptions& o) { o.criterion = "abs", o.threshold = 0.5; });
  add("2:4", [](PruneOptions& o) { o.pattern = PrunePattern::kNM; });
  add("row", [](PruneOptions& o) { o.pattern = PrunePattern::kRow; });
  add("column", [](PruneOptions& o) { o.pattern = PrunePattern::kColumn; });
  add("block",
      [](PruneOptions& o) { o.pattern = PrunePattern::kBlock, o.block_r = 2, o.block_c = 2; });
  for (const auto& c : cases) {
    ir::Model m = model;
    const PruneReport r = prune(m, c.o);
    EXPECT_EQ(nnz(m, "E"), e_before) << c.what;
    EXPECT_LT(nnz(m, "w1"), 16 * 784) << c.what;
    const PruneLayerReport& l = row(r, "E");
    EXPECT_EQ(l.skipped, std::string(kTie) + "; pass --allow-tied to prune both") << c.what;
    EXPECT_EQ(l.nonzero_after, e_before) << c.what;
    ASSERT_EQ(l.shared.size(), 1u);
    EXPECT_TRUE(warns(r, "E left alone: tied with embedding 'embed'")) << c.what;

    ir::Model allowed = model;
    PruneOptions o = c.o;
    o.allow_tied = true;
    const PruneReport ra = prune(allowed, o);
    EXPECT_LT(nnz(allowed, "E"), e_before) << c.what;
    EXPECT_TRUE(row(ra, "E").skipped.empty()) << c.what;
    EXPECT_TRUE(warns(ra, "E is tied with embedding 'embed' (Gather): pruned both")) << c.what;
  }
  // Global scope ranks the weights it prunes: half of w1 alone.
  ir::Model m = model;
  PruneOptions o;
  o.amount = PruneAmount{0.5, false};
  o.scope = PruneScope::kGlobal;
  prune(m, o);
  EXPECT_EQ(nnz(m, "w1"), 16 * 784 / 2);
  // Nothing else to prune: the error names the tie.
  o.exclude = "^fc$";
  m = model;
  try {
    prune(m, o);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("nothing left to prune"), std::string::npos) << e.what();
  }
}

TEST(TiedWeights, RecipesAllowThemPerRule) {
  const ir::Model model = tied_classifier();
  ir::Model m = model;
  PruneReport r = prune(m, parse_prune_recipe("defaults: {method: l1, amount: 0.5}\n", "r.yaml"));
  EXPECT_EQ(nnz(m, "E"), nnz(model, "E"));
  EXPECT_EQ(row(r, "E").skipped,
            std::string(kTie) + "; set allow_tied: true in its recipe rule to prune both");
  EXPECT_EQ(nnz(m, "w1"), 16 * 784 / 2);

  m = model;
  r = prune(m, parse_prune_recipe("defaults: {method: l1, amount: 0.5}\n"
                                  "rules:\n  - {match: lm_head, allow_tied: true}\n",
                                  "r.yaml"));
  EXPECT_EQ(nnz(m, "E"), 80);
  EXPECT_EQ(row(r, "E").rule, "rules[0] (line 3)");

  try {
    parse_prune_recipe("rules:\n  - {match: x, method: l1, amount: 0.5, allow_tied: maybe}\n",
                       "r.yaml");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rules[0].allow_tied: must be true or false"),
              std::string::npos)
        << e.what();
  }
}

TEST(SharedWeights, PrunedOnceWhenEveryLayerIsSelected) {
  const ir::Model model = shared_by_two_layers();
  std::vector<PrunableWeight> pw = prunable_weights(model.graph);
  ASSERT_EQ(pw.size(), 1u);
  ASSERT_EQ(pw[0].shared.size(), 1u);
  EXPECT_EQ(pw[0].shared[0].node, "fc_b");
  EXPECT_EQ(pw[0].shared[0].use, "layer");
  EXPECT_FALSE(pw[0].tied());
  EXPECT_EQ(pw[0].names(), (std::vector<std::string>{"fc_a", "w", "w", "fc_b"}));

  ir::Model m = model;
  PruneOptions o;
  o.amount = PruneAmount{0.5, false};
  PruneReport r = prune(m, o);
  EXPECT_EQ(nnz(m, "w"), 32);
  EXPECT_TRUE(r.warnings.empty());
  // Excluding either layer leaves the weight (both layers') alone.
  o.exclude = "^fc_b$";
  m = model;
  EXPECT_THROW(prune(m, o), Error);
  EXPECT_EQ(nnz(m, "w"), 64);
  m = model;
  EXPECT_THROW(prune(m, parse_prune_recipe("defaults: {method: l1, amount: 0.5}\n"
                                           "rules:\n  - {match: '^fc_b$', skip: true}\n",
                                           "r.yaml")),
               Error);
  EXPECT_EQ(nnz(m, "w"), 64);
}

TEST(LayerNames, ExcludeAndRecipesMatchTheParameterName) {
  // torch.export folded a Linear's transposed weight into "val_3": the node's metadata names the
  // parameter.
  ir::Model m = two_layers(at::randn({4, 4}), at::randn({4, 4}));
  for (auto& i : m.graph.initializers)
    if (i.name == "w2") i.name = "val_3";
  ir::Node& fc2 = m.graph.nodes.back();
  fc2.inputs[1] = "val_3";
  fc2.metadata_props = {
      {"pkg.torch.onnx.name_scopes", "['', 'm', 'm.head', 'linear']"},
      {"pkg.torch.onnx.fx_node",
       "%linear : [num_users=1] = call_function[target=torch.ops.aten.linear.default](args = "
       "(%relu, %p_m_head_weight), kwargs = {})"}};
  const std::vector<PrunableWeight> pw = prunable_weights(m.graph);
  ASSERT_EQ(pw.size(), 2u);
  EXPECT_EQ(pw[0].param, "w1");  // a name the exporter kept is the parameter's
  EXPECT_EQ(pw[1].param, "m.head.weight");
  EXPECT_EQ(pw[1].label(), "m.head.weight");

  ir::Model p = m;
  PruneOptions o;
  o.amount = PruneAmount{0.5, false};
  o.exclude = "^m\\.head\\.weight$";
  PruneReport r = prune(p, o);
  EXPECT_EQ(row(r, "val_3").skipped, "excluded (--exclude)");
  EXPECT_EQ(row(r, "val_3").param, "m.head.weight");
  EXPECT_EQ(row(r, "val_3").label(), "m.head.weight");
  EXPECT_EQ(nnz(p, "w1"), 8);
  EXPECT_TRUE(r.warnings.empty());

  p = m;
  r = prune(p, parse_prune_recipe("rules:\n  - {match: '^m\\.head\\.weight$', method: l1, "
                                  "amount: 0.25}\n",
                                  "r.yaml"));
  EXPECT_EQ(row(r, "val_3").rule, "rules[0] (line 2)");
  EXPECT_EQ(nnz(p, "val_3"), 12);
  EXPECT_EQ(nnz(p, "w1"), 16);  // no rule, no defaults
}

TEST(TiedWeights, SensitivityAndTargetsLeaveThemOutUnlessAllowed) {
  test::TempDir tmp;
  const std::string spec = random_npy_data(tmp, 8, 4);
  const ir::Model model = tied_classifier();
  auto data = [&] {
    LoaderOptions lo;
    lo.batch_size = 4;
    lo.shuffle = false;
    return std::make_unique<DataLoader>(open_dataset(spec), lo);
  };
  SensitivityOptions so;
  so.amounts = {0.5};
  so.eval_batches = 2;
  SensitivityResult s = sensitivity(model, *data(), so);
  ASSERT_EQ(s.layers.size(), 1u);
  EXPECT_EQ(s.layers[0].weight, "w1");
  EXPECT_EQ(s.layers[0].param, "w1");
  so.allow_tied = true;
  const SensitivityResult all = sensitivity(model, *data(), so);
  ASSERT_EQ(all.layers.size(), 2u);
  EXPECT_EQ(all.layers[1].weight, "E");

  const int64_t e_before = nnz(model, "E");
  for (const SensitivityResult* with : {static_cast<const SensitivityResult*>(nullptr), &all}) {
    ir::Model m = model;
    TargetOptions t;
    t.kind = TargetKind::kParams;
    t.value = 0.7;
    t.sensitivity = with;
    const TargetReport r = prune_to_target(m, t);
    EXPECT_EQ(nnz(m, "E"), e_before);
    for (const auto& u : r.units) EXPECT_NE(u.weight, "E");
    EXPECT_LE(r.measured, r.target);

    ir::Model allowed = model;
    t.allow_tied = true;
    const TargetReport ra = prune_to_target(allowed, t);
    bool has_e = false;
    for (const auto& u : ra.units) has_e |= u.weight == "E";
    EXPECT_TRUE(has_e);
  }
}

TEST(TiedWeights, SensitivityAndTrainOnTheCommandLine) {
  test::TempDir tmp;
  const std::string spec = random_npy_data(tmp, 8, 4), model = tmp / "tied.onnx";
  onnx::save_model(tied_classifier(), model);
  const std::string sweep =
      "sensitivity " + model + " --data " + spec + " --amounts 0.5 --eval-batches 1 --json";
  for (bool allow : {false, true}) {
    auto r = lopper_cli(sweep + (allow ? " --allow-tied" : ""));
    ASSERT_EQ(r.code, 0) << r.err;
    const SensitivityResult s = parse_sensitivity(r.out, "stdout");
    EXPECT_EQ(s.layers.size(), allow ? 2u : 1u) << allow;
  }
  const std::string out = tmp / "t.onnx";
  for (bool allow : {false, true}) {
    auto r = lopper_cli("train " + model + " --data " + spec + " -o " + out +
                        " --epochs 1 --batch-size 4 --no-eval --schedule iterative --rounds 1 "
                        "--epochs-per-round 1 --prune-method l1 --prune-amount 0.5" +
                        (allow ? " --allow-tied" : ""));
    ASSERT_EQ(r.code, 0) << r.err;
    const ir::Model m = onnx::load_model(out);
    EXPECT_EQ(nnz(m, "E") < 160, allow) << allow;
    if (!allow) EXPECT_EQ(nnz(m, "w1"), 16 * 784 / 2);  // half of what the schedule prunes
  }
}

TEST(TiedWeights, StructuredPruningSlicesThemOnce) {
  // BERT's masked-LM head: lm_head reads the table behind a dense layer of its own, so the tie
  // alone couples that layer's channels with the embedding's (and fc's, through the Add). The
  // embedding's rows are picked by data, as token IDs are.
  ir::Model m = tied_classifier();
  m.graph.initializers.erase(m.graph.initializers.end() - 1);  // "row"
  m.graph.inputs.push_back(value_info("row", {1}, ir::DType::kInt64));
  ir::Node dense = node("Gemm", {"h2", "w2"}, {"h3"}, "dense");
  dense.attrs = {int_attr("transB", 1)};
  m.graph.nodes.insert(m.graph.nodes.end() - 1, dense);
  m.graph.nodes.back().inputs[0] = "h3";
  m.graph.initializers.push_back({"w2", at::randn({16, 16})});
  const at::Tensor x = at::randn({4, 1, 28, 28});
  StructuredOptions so;
  so.amount = PruneAmount{0.5, false};
  const StructuredReport r = prune_structured(m, so);
  int pruned = 0;
  for (const auto& g : r.groups) pruned += g.blocked.empty() && g.size_after < g.size_before;
  EXPECT_EQ(pruned, 1) << "fc, the embedding and dense are one group";
  int tables = 0;
  for (const auto& i : m.graph.initializers) tables += i.name.rfind("E", 0) == 0;
  EXPECT_EQ(tables, 1);
  EXPECT_EQ(init(m, "E").sizes(), (std::vector<int64_t>{10, 8}));
  for (const auto& n : m.graph.nodes)
    if (n.name == "embed" || n.name == "t") EXPECT_EQ(n.inputs[0], "E") << n.name;
  EXPECT_EQ(init(m, "w2").sizes(), (std::vector<int64_t>{8, 8}));
  Executor ex(m);
  EXPECT_EQ(ex.run({{"x", x}, {"row", at::zeros({1}, at::kLong)}}).at(0).sizes(),
            (std::vector<int64_t>{4, 10}));
}
