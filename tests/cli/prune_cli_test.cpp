// lopper prune on the command line: the output and its report, and bad input -> one line, the
// right exit code, no output file.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "cli_refusals.h"
#include "lopper/onnx_io.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace lopper;
using namespace lopper::test;

namespace {

// Each case: one line naming the problem, its exit code, and neither the model nor its report.
void expect_refused(const std::string& in, const std::string& out,
                    const std::vector<BadCase>& cases) {
  test::expect_refused("prune " + in + " -o " + out, cases, {out, out + ".report.json"});
}

}  // namespace

TEST(PruneCli, WritesTheModelAndItsReport) {
  test::TempDir tmp;
  std::string out = tmp / "p.onnx";
  auto r = lopper_cli("prune " + fixture("mlp.ts.onnx") + " -o " + out +
                      " --method l1 --amount 0.5 --scope global");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("sparsity"), std::string::npos);
  auto j = nlohmann::json::parse(slurp(out + ".report.json"));
  EXPECT_EQ(j["params"].get<int64_t>(), 234752);
  EXPECT_EQ(j["nonzero"].get<int64_t>(), 117376);
  EXPECT_EQ(j["layers"].size(), 3u);
  EXPECT_GT(j["file_bytes_before"].get<int64_t>(), 0);
  EXPECT_GT(j["file_bytes_after"].get<int64_t>(), 0);
  ir::Model m = onnx::load_model(out);
  int64_t nz = 0;
  for (const auto& l : j["layers"])
    nz += m.graph.find_initializer(l["weight"].get<std::string>())
              ->value.count_nonzero()
              .item<int64_t>();
  EXPECT_EQ(nz, 117376);
}

TEST(PruneCli, TiedEmbeddingIsLeftAloneUnlessAllowed) {
  // transformers' GPT-2 from torch.export: lm_head's weight is the token embedding's table, one
  // initializer read by the Gather and (through a Transpose) by lm_head's MatMul.
  test::TempDir tmp;
  const std::string in = fixture("gpt2.dynamo.onnx"), out = tmp / "p.onnx";
  const at::Tensor table = onnx::load_model(in).graph.find_initializer("m.lm_head.weight")->value;
  auto r = lopper_cli("prune " + in + " -o " + out + " --method l1 --scope global --amount 0.8");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("lopper: [prune] warning: m.lm_head.weight left alone: tied with embedding "
                       "'m.transformer.wte' (Gather): pruning would change the embedding too; "
                       "pass --allow-tied to prune both"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.out.find("\nm.lm_head.weight "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\nm.transformer.h.0.attn.c_attn.weight "), std::string::npos) << r.out;
  EXPECT_TRUE(
      at::equal(onnx::load_model(out).graph.find_initializer("m.lm_head.weight")->value, table));
  auto j = nlohmann::json::parse(slurp(out + ".report.json"));
  const auto& head = j["layers"].back();
  EXPECT_EQ(head["param"], "m.lm_head.weight");
  EXPECT_EQ(head["shared"][0]["use"], "embedding");
  EXPECT_EQ(head["shared"][0]["module"], "m.transformer.wte");
  EXPECT_NE(head["skipped"].get<std::string>().find("--allow-tied"), std::string::npos);
  int64_t params = 0, nonzero = 0;  // the 80% come from the other layers
  for (const auto& l : j["layers"])
    if (!l.contains("skipped"))
      params += l["params"].get<int64_t>(), nonzero += l["nonzero"].get<int64_t>();
  EXPECT_EQ(params - nonzero, 78643);  // round(0.8 * 98304)

  r = lopper_cli("prune " + in + " -o " + out + " --method l1 --amount 0.5 --allow-tied");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("m.lm_head.weight is tied with embedding 'm.transformer.wte' (Gather): "
                       "pruned both"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.out.find("[shared with embedding 'm.transformer.wte' (Gather)]"), std::string::npos);
  const ir::Model pruned = onnx::load_model(out);
  EXPECT_EQ(
      pruned.graph.find_initializer("m.lm_head.weight")->value.count_nonzero().item<int64_t>(),
      32000);

  // TorchScript's export folds the Transpose into a copy (onnx::MatMul_N): nothing is tied there.
  r = lopper_cli("prune " + fixture("gpt2.ts.onnx") + " -o " + out + " --method l1 --amount 0.5");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err.find("tied"), std::string::npos) << r.err;
  EXPECT_NE(r.out.find("\n/m/lm_head/MatMul "), std::string::npos) << r.out;

  const std::vector<BadCase> cases = {
      {"--structured channel --amount 0.3 --allow-tied", 2, "--allow-tied"},
      {"--recipe " + example("recipe.yaml") + " --allow-tied", 2, "drop --allow-tied"},
  };
  fs::remove(out);
  fs::remove(out + ".report.json");
  expect_refused(in, out, cases);
}

TEST(PruneCli, ExcludeMatchesTheParameterName) {
  // torch.export's BERT: weights are folded constants (val_N) whose parameters the metadata names.
  test::TempDir tmp;
  const std::string out = tmp / "p.onnx";
  auto r = lopper_cli("prune " + fixture("bert.dynamo.onnx") + " -o " + out +
                      " --method l1 --amount 0.5 --exclude 'attention\\.self\\.query\\.weight$' "
                      "--json");
  ASSERT_EQ(r.code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  int excluded = 0;
  for (const auto& l : j["layers"]) {
    const std::string param = l["param"];
    const bool query = param.find("attention.self.query.weight") != std::string::npos;
    EXPECT_EQ(l.value("skipped", ""), query ? "excluded (--exclude)" : "") << param;
    excluded += query;
  }
  EXPECT_EQ(excluded, 2);
}

TEST(PruneCli, BadInputIsOneLineAndNoOutput) {
  test::TempDir tmp;
  std::string in = fixture("mlp.ts.onnx"), out = tmp / "p.onnx";
  const std::vector<BadCase> cases = {
      {"--method l1 --amount 1.5", 2, "amount must be in [0, 1]"},
      {"--method l1 --amount -0.2", 2, "amount"},
      {"--method l1 --amount 1000000", 1, "more than"},
      {"--method abs --threshold -1", 2, "threshold must be >= 0"},
      {"--method l1 --pattern 4:4", 2, "N:M"},
      {"--method l1 --pattern 2:3", 1, "nothing left to prune"},  // no K divides by 3
      {"--method frob --amount 0.1", 2, "unknown method"},
      {"--method l1 --amount 0.1 --pattern diagonal", 2, "unknown pattern"},
      {"--method l1 --amount 0.1 --scope galactic", 2, "unknown scope"},
      {"--method grad --amount 0.1", 2, "give --data"},
      {"--method taylor --amount 0.1", 2, "give --data"},
      {"--method l1 --amount 0.1 --data fashion-mnist", 2,
       "--data is for grad, taylor, wanda and sparsegpt only"},
      {"--method l1 --amount 0.1 --calib-batches 4", 2, "only"},
      {"--method taylor --amount 0.1 --data cifar10:" + tmp / "none", 1, "no such file"},
      {"--method taylor --amount 0.1 --data mnist:/x", 1, "mnist:/x"},
      {"--method grad --amount 0.1 --data fashion-mnist --calib-batches 0", 2,
       "--calib-batches must be >= 1"},
      {"--method grad --amount 0.1 --data fashion-mnist --split validation", 1, "validation"},
      {"--method l1 --amount 0.1 --recipe r.yaml", 2, "--recipe"},
      {"--method l1", 2, "needs --amount"},
      {"--method abs", 2, "needs --threshold"},
      // As lopper.prune refuses them (one rule, lopper::PruneRequest).
      {"--method l1 --amount 0.1 --threshold 0.1", 2,
       "--threshold is for --method abs; --method l1 takes --amount"},
      {"--method l1 --pattern 2:4 --amount 0.5", 2,
       "N:M keeps N of every M weights: drop --amount"},
  };
  expect_refused(in, out, cases);
}

TEST(PruneCli, RefusesToOverwriteItsInput) {
  test::TempDir tmp;
  std::string in = tmp / "m.onnx";
  fs::copy_file(fixture("mlp.ts.onnx"), in);
  auto before = slurp(in);
  auto r = lopper_cli("prune " + in + " -o " + in + " --method l1 --amount 0.5");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(lines(r.err), 1) << r.err;
  EXPECT_EQ(slurp(in), before);
}

TEST(PruneCli, NothingPrunableIsAnError) {
  test::TempDir tmp;
  // An Add-only model: no Conv/Gemm/MatMul weight.
  ir::Model m;
  m.ir_version = 8;
  m.opset_import = {{"", 17}};
  ir::ValueInfo x;
  x.name = "x";
  x.type.elem_type = ir::DType::kFloat;
  x.type.has_shape = true;
  x.type.dims = {ir::Dim{3, ""}};
  m.graph.inputs = {x};
  ir::ValueInfo y = x;
  y.name = "y";
  m.graph.outputs = {y};
  ir::Node add;
  add.op_type = "Add";
  add.inputs = {"x", "c"};
  add.outputs = {"y"};
  m.graph.nodes = {add};
  m.graph.initializers = {{"c", at::ones({3})}};
  onnx::save_model(m, tmp / "add.onnx");
  auto r = lopper_cli("prune " + (tmp / "add.onnx") + " -o " + (tmp / "o.onnx") +
                      " --method l1 --amount 0.5");
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("no prunable weights"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(tmp / "o.onnx"));
}

TEST(PruneCli, RecipeExamplePrunesEachLayerByItsRule) {
  test::TempDir tmp;
  std::string out = tmp / "p.onnx";
  auto r = lopper_cli("prune " + example("cnn_small.onnx") + " -o " + out + " --recipe " +
                      example("recipe.yaml"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("rules[2]"), std::string::npos) << r.out;
  auto j = nlohmann::json::parse(slurp(out + ".report.json"));
  std::map<std::string, nlohmann::json> by;
  for (const auto& l : j["layers"]) by[l["name"].get<std::string>()] = l;
  ASSERT_EQ(by.size(), 4u);
  EXPECT_DOUBLE_EQ(by["/0/Conv"]["sparsity"].get<double>(), 0.0);
  EXPECT_TRUE(by["/0/Conv"].contains("skipped"));
  EXPECT_DOUBLE_EQ(by["/4/Conv"]["sparsity"].get<double>(), 0.5);
  EXPECT_EQ(by["/4/Conv"]["method"], "l1");
  EXPECT_EQ(by["/4/Conv"]["rule"], "defaults");
  EXPECT_DOUBLE_EQ(by["/9/Gemm"]["sparsity"].get<double>(), 0.5);
  EXPECT_EQ(by["/9/Gemm"]["method"], "l1 2:4");
  EXPECT_DOUBLE_EQ(by["/11/Gemm"]["sparsity"].get<double>(), 0.25);
  EXPECT_EQ(by["/11/Gemm"]["method"], "random");
  // The model agrees with the report: 2:4 along K of the [128x3136] Gemm weight.
  ir::Model m = onnx::load_model(out);
  at::Tensor w = m.graph.find_initializer(by["/9/Gemm"]["weight"].get<std::string>())->value;
  EXPECT_TRUE(w.ne(0).reshape({128, -1, 4}).sum(-1).eq(2).all().item<bool>());
}

TEST(PruneCli, BadRecipesAreOneLineAndNoOutput) {
  test::TempDir tmp;
  std::string in = example("cnn_small.onnx"), out = tmp / "p.onnx", ok = example("recipe.yaml");
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(tmp / name) << text;
    return tmp / name;
  };
  const std::vector<BadCase> cases = {
      {"--recipe " + write("a.yaml", "rules: [\n  {match: a\n"), 1, "a.yaml:"},
      {"--recipe " + write("b.yaml", "defaults: {method: l1, amount: 0.5, speed: 2}\n"), 1,
       "defaults.speed: unknown key"},
      {"--recipe " + write("c.yaml", "rules:\n  - {match: \"[\", skip: true}\n"), 1,
       "rules[0].match"},
      {"--recipe " + write("d.yaml", "rules:\n  - {match: Conv|Gemm, skip: true}\n"), 1,
       "nothing left to prune"},
      {"--recipe " + tmp / "missing.yaml", 1, "cannot read recipe"},
      {"--recipe " + ok + " --scope global", 2, "--scope global"},
      {"--recipe " + ok + " --method l1", 2, "drop --method"},
      {"", 2, "needs --method"},
  };
  expect_refused(in, out, cases);
  // A rule that matches nothing: a warning on stderr, the rest pruned.
  auto r = lopper_cli(
      "prune " + in + " -o " + out + " --recipe " +
      write("w.yaml",
            "defaults: {method: l1, amount: 0.5}\nrules:\n  - {match: Nope, skip: true}\n"));
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("warning"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("Nope"), std::string::npos) << r.err;
}

// grad and taylor on real data (Debian's Fashion-MNIST): the report names the method, the amount
// is met, and calibration shows progress as plain lines off a terminal.
TEST(PruneCli, GradAndTaylorCalibrateOnFashionMnist) {
  test::TempDir tmp;
  for (std::string method : {"grad", "taylor"}) {
    std::string out = tmp / (method + ".onnx");
    auto r = lopper_cli("prune " + fixture("mlp.ts.onnx") + " -o " + out + " --method " + method +
                        " --amount 0.5 --data fashion-mnist --calib-batches 8 --seed 3");
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.err.find("calibrate 8/8  loss "), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find('\r'), std::string::npos) << "a bar redrawn off a terminal";
    auto j = nlohmann::json::parse(slurp(out + ".report.json"));
    EXPECT_EQ(j["nonzero"].get<int64_t>(), 117376);
    for (const auto& l : j["layers"]) EXPECT_EQ(l["method"].get<std::string>(), method);
  }
  // Different scores, different weights: grad and taylor do not just fall back to magnitude.
  ir::Model g = onnx::load_model(tmp / "grad.onnx"), t = onnx::load_model(tmp / "taylor.onnx");
  ir::Model l1;
  ASSERT_EQ(lopper_cli("prune " + fixture("mlp.ts.onnx") + " -o " + (tmp / "l1.onnx") +
                       " --method l1 --amount 0.5")
                .code,
            0);
  l1 = onnx::load_model(tmp / "l1.onnx");
  auto mask = [](const ir::Model& m) { return m.graph.find_initializer("1.weight")->value.ne(0); };
  EXPECT_FALSE(at::equal(mask(g), mask(t)));
  EXPECT_FALSE(at::equal(mask(t), mask(l1)));
}

TEST(PruneCli, StructuredBadInputIsOneLineAndNoOutput) {
  test::TempDir tmp;
  std::string in = fixture("small_cnn.ts.onnx"), out = tmp / "p.onnx";
  const std::vector<BadCase> cases = {
      {"--structured filter --amount 0.5", 2,
       "unknown unit 'filter' (units: channel, head, block)"},
      {"--structured channel", 2, "needs --amount"},
      {"--structured channel --amount 1.5", 2, "amount must be in [0, 1]"},
      {"--structured channel --amount 0.5 --method frob", 2, "unknown structured method"},
      {"--structured channel --amount 0.5 --method taylor", 2, "give --data"},
      {"--structured channel --amount 0.5 --method activation", 2, "give --data"},
      {"--structured channel --amount 0.5 --data fashion-mnist", 2, "--data is for"},
      {"--structured channel --amount 0.5 --round-to 0", 2, "--round-to must be >= 1"},
      {"--structured channel --amount 0.5 --scope global --max-layer-amount 1.5", 2,
       "--max-layer-amount"},
      {"--structured channel --amount 0.5 --scope sideways", 2, "unknown scope"},
      {"--structured channel --amount 0.5 --exclude '('", 2, "not a valid regex"},
      {"--structured channel --amount 0.5 --block-size 8", 2,
       "--block-size is for unstructured pruning, not --structured"},
      {"--structured channel --amount 0.5 --batch-size 8", 2,
       "--batch-size is for taylor and activation only"},
      {"--structured channel --amount 0.5 --pattern 2:4", 2, "is for unstructured pruning"},
      {"--structured head --amount 0.5", 1, "no channel group can be pruned"},
      {"--structured channel --amount 0.5 --exclude .", 1, "no channel group can be pruned"},
      {"--method l1 --amount 0.5 --round-to 8", 2, "is for --structured"},
      {"--structured channel --amount 0.5 --shape input=1x3", 1, ""},
  };
  expect_refused(in, out, cases);
}

// Every importance criterion shrinks the CNN; the report's groups, sizes and the written model
// agree; random depends on its seed; round-to keeps multiples; global respects max-layer-amount.
TEST(PruneCli, StructuredShrinksTheModel) {
  test::TempDir tmp;
  std::string in = fixture("small_cnn.preserve.onnx");
  auto report = [&](const std::string& args) {
    std::string out = tmp / "s.onnx";
    auto r = lopper_cli("prune " + in + " -o " + out + " --structured channel --json " + args);
    EXPECT_EQ(r.code, 0) << args << ": " << r.err;
    auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j, nlohmann::json::parse(slurp(out + ".report.json")));
    auto inspect = lopper_cli("inspect " + out + " --json");
    EXPECT_EQ(inspect.code, 0) << inspect.err;
    auto ji = nlohmann::json::parse(inspect.out);
    EXPECT_EQ(ji["params"], j["params"]) << args;  // what the written model really holds
    EXPECT_EQ(ji["macs"], j["macs"]) << args;
    EXPECT_LT(j["params"].get<int64_t>(), j["params_before"].get<int64_t>()) << args;
    EXPECT_LT(j["macs"].get<int64_t>(), j["macs_before"].get<int64_t>()) << args;
    return j;
  };
  for (std::string m : {"l1", "l2", "bn", "fpgm", "random"}) {
    auto j = report("--amount 0.5 --method " + m);
    EXPECT_EQ(j["method"], m);
    for (const auto& g : j["groups"])
      if (!g.contains("blocked"))
        EXPECT_EQ(g["size_after"].get<int64_t>(), g["size_before"].get<int64_t>() / 2) << m;
  }
  auto removed = [&](uint64_t seed) {
    auto j = report("--amount 0.5 --method random --seed " + std::to_string(seed));
    return j["groups"][0]["removed"];
  };
  EXPECT_EQ(removed(1), removed(1));
  EXPECT_NE(removed(1), removed(2));
  auto j = report("--amount 0.3 --round-to 8");
  for (const auto& g : j["groups"])
    if (!g.contains("blocked")) EXPECT_EQ(g["size_after"].get<int64_t>() % 8, 0) << g.dump();
  j = report("--amount 0.6 --scope global --max-layer-amount 0.7");
  int64_t before = 0, after = 0;
  for (const auto& g : j["groups"]) {
    if (g.contains("blocked")) continue;
    before += g["size_before"].get<int64_t>(), after += g["size_after"].get<int64_t>();
    EXPECT_GE(g["size_after"].get<int64_t>(),
              g["size_before"].get<int64_t>() - int64_t(0.7 * g["size_before"].get<double>()));
  }
  EXPECT_EQ(before - after, int64_t(std::nearbyint(0.6 * double(before))));
}

// taylor ranks channels by first-order saliency on calibration batches; the lowest go.
TEST(PruneCli, StructuredTaylorUsesData) {
  test::TempDir tmp;
  std::string out = tmp / "t.onnx";
  auto r = lopper_cli("prune " + fixture("mlp.ts.onnx") + " -o " + out +
                      " --structured channel --method taylor --amount 0.25 --data fashion-mnist"
                      " --calib-batches 2 --batch-size 16 --json");
  ASSERT_EQ(r.code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["method"], "taylor");
  int64_t pruned = 0;
  for (const auto& g : j["groups"]) {
    if (g.contains("blocked")) continue;
    ++pruned;
    EXPECT_EQ(g["size_after"].get<int64_t>(), g["size_before"].get<int64_t>() * 3 / 4);
    EXPECT_GT(g["score"].get<double>(), 0);
  }
  EXPECT_EQ(pruned, 2);  // the two hidden layers; the logits are a graph output
}

// activation ranks channels by their mean |activation| on calibration batches (Minitron): the
// groups shrink as asked, their scores are means of magnitudes, and the ranking is not taylor's.
TEST(PruneCli, StructuredActivationUsesData) {
  test::TempDir tmp;
  auto removed = [&](const std::string& method) {
    std::string out = tmp / (method + ".onnx");
    auto r = lopper_cli(
        "prune " + fixture("mlp.ts.onnx") + " -o " + out + " --structured channel --method " +
        method + " --amount 0.25 --data fashion-mnist --calib-batches 2 --batch-size 16 --json");
    EXPECT_EQ(r.code, 0) << r.err;
    auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["method"], method);
    std::vector<nlohmann::json> out_groups;
    for (const auto& g : j["groups"]) {
      if (g.contains("blocked")) continue;
      EXPECT_EQ(g["size_after"].get<int64_t>(), g["size_before"].get<int64_t>() * 3 / 4);
      EXPECT_GT(g["score"].get<double>(), 0);
      out_groups.push_back(g["removed"]);
    }
    EXPECT_EQ(out_groups.size(), 2u);  // the two hidden layers; the logits are a graph output
    return out_groups;
  };
  EXPECT_NE(removed("activation"), removed("taylor"));
}

// --pattern block:RxC: every bad pattern, and abs with a block, is one line and writes nothing.
TEST(PruneCli, BlockBadInputIsOneLineAndNoOutput) {
  test::TempDir tmp;
  std::string in = fixture("mlp.ts.onnx"), out = tmp / "p.onnx";
  const std::vector<BadCase> cases = {
      {"--method l1 --amount 0.5 --pattern block:0x4", 2, "bad pattern 'block:0x4'"},
      {"--method l1 --amount 0.5 --pattern block:4", 2, "bad pattern 'block:4'"},
      {"--method l1 --amount 0.5 --pattern block:4x", 2, "bad pattern 'block:4x'"},
      {"--method l1 --amount 0.5 --pattern block:axb", 2, "bad pattern 'block:axb'"},
      {"--method l1 --amount 0.5 --pattern block:300x1", 2, "R, C in 1..256"},
      {"--method abs --threshold 0.1 --pattern block:4x1", 2, "--method abs removes single"},
      {"--method l1 --amount 0.5 --pattern block:4x1 --norm 3", 2, "norm must be 1 or 2"},
      {"--method l1 --amount 1000000 --pattern block:4x1", 1, "more than"},
      {"--method l1 --pattern block:4x1", 2, "needs --amount"},
  };
  expect_refused(in, out, cases);
}

// A Conv's blocks run along [O, I*kh*kw], a Gemm's (transB=1) along [N, K], a MatMul's [K, N]
// along its outputs (axis 1): in that view every zero is part of a whole zero 8x1 block, and 80%
// of each layer's blocks are zero.
TEST(PruneCli, BlockPatternZeroesWholeBlocks) {
  test::TempDir tmp;
  for (std::string model : {"small_cnn.ts.onnx", "transformer_encoder.ts.onnx"}) {
    std::string out = tmp / model;
    auto r = lopper_cli("prune " + fixture(model) + " -o " + out +
                        " --method l1 --amount 0.8 --pattern block:8x1 --json");
    ASSERT_EQ(r.code, 0) << r.err;
    auto j = nlohmann::json::parse(r.out);
    ir::Model m = onnx::load_model(out);
    std::set<std::string> ops;
    for (const auto& l : j["layers"]) {
      std::string name = l["name"], op = l["op"];
      ASSERT_FALSE(l.contains("skipped")) << name;
      EXPECT_EQ(l["method"], "l1 block:8x1 L1") << name;
      at::Tensor w = m.graph.find_initializer(l["weight"].get<std::string>())->value;
      at::Tensor mat = op == "Conv" ? w.reshape({w.size(0), -1}) : w.t();  // MatMul [K, N]
      for (const auto& n : m.graph.nodes)
        if (op == "Gemm" && n.label() == name && n.attr("transB") && n.attr("transB")->i) mat = w;
      at::Tensor zero = mat.eq(0);
      int64_t blocks = 0, zero_blocks = 0;
      for (int64_t i = 0; i < mat.size(0); i += 8) {
        at::Tensor stripe = zero.slice(0, i, i + 8);  // [8 or fewer, K]: one block per column
        EXPECT_TRUE(at::equal(stripe.all(0), stripe.any(0))) << name << " rows " << i;
        zero_blocks += stripe.all(0).sum().item<int64_t>();
        blocks += mat.size(1);
      }
      EXPECT_EQ(zero_blocks, int64_t(std::nearbyint(0.8 * double(blocks)))) << name;
      ops.insert(op);
    }
    EXPECT_EQ(ops.count(model == "small_cnn.ts.onnx" ? "Conv" : "MatMul"), 1u) << model;
  }
}
