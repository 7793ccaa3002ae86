// One-shot pruning with calibration data (issue 20): Wanda's per-row selection, the SparseGPT
// solver, the block-by-block calibration (each layer on the outputs of the pruned layers before
// it, computed here by hand), a Conv's inputs as patches, OWL's budgets, and the CLI's one-line
// errors. llm-compressor parity is tests/python/check_llm_parity.py.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "lopper/data.h"
#include "lopper/error.h"
#include "lopper/npy.h"
#include "lopper/onnx_io.h"
#include "lopper/prune.h"
#include "prune/layer_inputs.h"
#include "prune/masks.h"
#include "prune/sparsegpt.h"
#include "test_models.h"
#include "test_util.h"

using namespace lopper;

namespace {

DataLoader npy_loader(const at::Tensor& x, const test::TempDir& tmp, int64_t batch) {
  const std::string xs = tmp / "x.npy", ys = tmp / "y.npy";
  save_npy(x, xs);
  save_npy(at::zeros({x.size(0)}, at::kLong), ys);
  LoaderOptions lo;
  lo.batch_size = batch;
  lo.shuffle = false;
  return DataLoader(open_dataset("npy:" + xs + "," + ys), lo);
}

// ||X W^T - X V^T||^2 over the rows of x: how much pruning changed the layer's output.
double output_error(const at::Tensor& x, const at::Tensor& w, const at::Tensor& v) {
  return (x.mm(w.t()) - x.mm(v.t())).square().sum().item<double>();
}

// Wanda's drop mask for one weight [rows, cols] on inputs x [tokens, cols], by hand.
at::Tensor wanda_drop(const at::Tensor& w, const at::Tensor& x, double amount) {
  const at::Tensor score = w.abs().to(at::kDouble) * x.square().sum(0).sqrt().unsqueeze(0);
  const at::Tensor order = std::get<1>(score.sort(/*stable=*/true, 1, false));
  const int64_t k = int64_t(std::nearbyint(amount * double(w.size(1))));
  return at::zeros_like(w, at::kBool)
      .scatter_(1, order.slice(1, 0, k), at::ones_like(order.slice(1, 0, k), at::kBool));
}

}  // namespace

TEST(SmallestPerRow, EachRowLosesItsShareTiesInColumnOrder) {
  const at::Tensor s = at::tensor({1.f, 1.f, 1.f, 3.f, 5.f, 0.5f, 4.f, 4.f}).reshape({2, 4});
  const at::Tensor alive = at::tensor({1, 1, 1, 1, 1, 0, 1, 1}).reshape({2, 4}).to(at::kBool);
  const at::Tensor drop = smallest_per_row(s, alive, PruneAmount{0.5, false});
  // Row 0: two of the three tied 1s, the first ones (a stable sort); row 1: round(0.5 x 3 alive)
  // = 2 (half to even) of its alive weights, and its dead entry is flagged too.
  const at::Tensor want = at::tensor({1, 1, 0, 0, 0, 1, 1, 1}).reshape({2, 4}).to(at::kBool);
  EXPECT_TRUE(drop.equal(want)) << drop;
}

TEST(SparseGpt, ADiagonalHessianPrunesByMagnitudeWithoutUpdates) {
  at::manual_seed(1);
  const at::Tensor w = at::randn({8, 16});
  SparseGptOptions o;
  o.block_size = 8;
  const SparseGptResult r = sparsegpt(w, at::eye(16, at::kDouble) * 3, o, "diag");
  // Uncorrelated inputs: nothing to compensate; per block the half of least |w| goes.
  for (int64_t b = 0; b < 2; ++b) {
    const at::Tensor blk = w.slice(1, 8 * b, 8 * b + 8);
    const at::Tensor kept = r.weight.slice(1, 8 * b, 8 * b + 8);
    const double thr = std::get<0>(blk.abs().flatten().sort()).select(0, 31).item<double>();
    EXPECT_TRUE(kept.equal(blk.masked_fill(blk.abs().le(thr), 0))) << b;
  }
  EXPECT_DOUBLE_EQ(r.dampening, 0.01);
}

TEST(SparseGpt, ReconstructsTheOutputBetterThanWandaAndKeepsItsPattern) {
  at::manual_seed(2);
  const int64_t k = 64, rows = 32;
  const at::Tensor x = at::randn({512, k}).mm(at::randn({k, k}) * 0.3 + at::eye(k));  // correlated
  const at::Tensor w = at::randn({rows, k});
  const at::Tensor gram = x.t().mm(x).to(at::kDouble);
  SparseGptOptions o;
  o.block_size = 16;
  const SparseGptResult u = sparsegpt(w, gram, o, "u");
  EXPECT_EQ(u.weight.eq(0).sum().item<int64_t>(), rows * k / 2);
  const at::Tensor by_wanda = w.masked_fill(wanda_drop(w, x, 0.5), 0);
  EXPECT_LT(output_error(x, w, u.weight), 0.8 * output_error(x, w, by_wanda));

  o.n = 2, o.m = 4;
  const SparseGptResult nm = sparsegpt(w, gram, o, "nm");
  EXPECT_TRUE(nm.weight.reshape({rows, k / 4, 4}).ne(0).sum(2).le(2).all().item<bool>());
  EXPECT_EQ(nm.weight.eq(0).sum().item<int64_t>(), rows * k / 2);

  // Weights that are zero already stay zero; the amount counts from the others.
  const at::Tensor sparse = w.masked_fill(at::arange(k).remainder(4).eq(0).unsqueeze(0), 0);
  o.n = 0;
  const SparseGptResult c = sparsegpt(sparse, gram, o, "c");
  EXPECT_TRUE(c.weight.masked_select(sparse.eq(0)).eq(0).all().item<bool>());
  EXPECT_EQ(c.weight.eq(0).sum().item<int64_t>(), rows * k / 4 + rows * k * 3 / 8);
}

// Ties at the block's threshold (equal weights, a diagonal Hessian): exactly the amount goes all
// the same; and the factor the layers of one input share prunes as the Gram matrix itself does.
TEST(SparseGpt, TiesStillRemoveExactlyTheAmountAndASharedFactorPrunesAlike) {
  const at::Tensor w = at::ones({6, 16}).mul_(at::arange(16).remainder(2).add(1).unsqueeze(0));
  SparseGptOptions o;
  o.block_size = 8;
  o.amount = 0.75;  // 36 of each block's 48 weights: 24 ones, then 12 of the 24 twos (ties)
  const at::Tensor gram = at::eye(16, at::kDouble) * 2;
  const SparseGptResult r = sparsegpt(w, gram, o, "ties");
  for (int64_t b = 0; b < 2; ++b)
    EXPECT_EQ(r.weight.slice(1, 8 * b, 8 * b + 8).eq(0).sum().item<int64_t>(), 36) << b;
  at::manual_seed(3);
  const at::Tensor x = at::randn({256, 16});
  const at::Tensor g = x.t().mm(x).to(at::kDouble);
  const SparseGptFactor f = sparsegpt_factor(g, o.dampening, "shared");
  for (int i = 0; i < 3; ++i) {
    const at::Tensor wi = at::randn({5, 16});
    EXPECT_TRUE(sparsegpt(wi, f, o).weight.equal(sparsegpt(wi, g.clone(), o, "own").weight)) << i;
  }
  EXPECT_TRUE(g.equal(x.t().mm(x).to(at::kDouble)));  // not moved in: left as it was
}

// The solver against SparseGPT written out column by column in ATen (the reference's loop, with
// the factor the solver uses): the same pruned weights, to float rounding, for unstructured and
// N:M, with weights zero already, a block size that does not divide the columns, and groups that
// straddle no block.
TEST(SparseGpt, EqualsTheColumnByColumnReference) {
  at::manual_seed(4);
  const int64_t k = 72, rows = 37;
  const at::Tensor x = at::randn({300, k}).mm(at::randn({k, k}) * 0.2 + at::eye(k));
  const at::Tensor gram = x.t().mm(x).to(at::kDouble);
  const at::Tensor w = at::randn({rows, k}).masked_fill(at::rand({rows, k}).lt(0.1), 0);
  for (const int64_t n : {int64_t(0), int64_t(2)}) {
    SparseGptOptions o;
    o.block_size = 32;
    o.n = n, o.m = n ? 4 : 0;
    const SparseGptFactor f = sparsegpt_factor(gram.clone(), o.dampening, "ref");
    const at::Tensor got = sparsegpt(w, f, o).weight;
    // The reference: per column, prune (the block's mask chosen up front, or the group's at its
    // first column), spread the error over the columns after it.
    at::Tensor W = w.clone();
    const at::Tensor dead = w.eq(0);
    for (int64_t i1 = 0; i1 < k; i1 += o.block_size) {
      const int64_t i2 = std::min(i1 + o.block_size, k);
      const at::Tensor H1 = f.hinv.slice(0, i1, i2).slice(1, i1, i2);
      const at::Tensor d = H1.diagonal();
      at::Tensor mask = dead.slice(1, i1, i2).clone();
      if (!n) {
        const at::Tensor s =
            (W.slice(1, i1, i2).square() / d.square()).masked_fill(mask, -1).flatten();
        const int64_t alive = mask.numel() - mask.sum().item<int64_t>();
        const int64_t take = mask.numel() - alive + int64_t(std::nearbyint(0.5 * double(alive)));
        mask.view({-1}).index_fill_(
            0, std::get<1>(s.sort(std::optional<bool>(true), 0)).slice(0, 0, take), true);
      }
      at::Tensor err = at::zeros({rows, i2 - i1});
      for (int64_t i = 0; i < i2 - i1; ++i) {
        if (n && i % 4 == 0) {
          const at::Tensor s =
              (W.slice(1, i1 + i, i1 + i + 4).square() / d.slice(0, i, i + 4).square())
                  .masked_fill(dead.slice(1, i1 + i, i1 + i + 4), -1);
          mask.slice(1, i, i + 4)
              .scatter_(1, std::get<1>(s.sort(std::optional<bool>(true), 1)).slice(1, 0, 2), true);
        }
        at::Tensor col = W.select(1, i1 + i);
        const at::Tensor e = col.masked_fill(mask.select(1, i).logical_not(), 0) / d[i];
        col.masked_fill_(mask.select(1, i), 0);
        err.select(1, i).copy_(e);
        W.slice(1, i1 + i + 1, i2).sub_(e.unsqueeze(1) * H1[i].slice(0, i + 1).unsqueeze(0));
      }
      if (i2 < k) W.slice(1, i2).sub_(err.mm(f.hinv.slice(0, i1, i2).slice(1, i2)));
    }
    EXPECT_TRUE(got.eq(0).equal(W.eq(0))) << "n " << n;
    EXPECT_LT((got - W).abs().max().item<double>(), 1e-4 * W.abs().max().item<double>()) << n;
  }
}

TEST(SparseGpt, BadHessiansAreOneLineErrorsNamingTheLayer) {
  const at::Tensor w = at::randn({4, 8});
  SparseGptOptions o;
  at::Tensor nan = at::eye(8, at::kDouble);
  nan[2][3] = std::nan("");
  EXPECT_NE(test::error_of([&] {
              sparsegpt(w, nan, o, "blk.0.q");
            }).find("inputs of layer 'blk.0.q' hold NaN or Inf"),
            std::string::npos);
  // Not positive definite even with 100x the dampening: the retries end in one error.
  const at::Tensor indefinite = -at::eye(8, at::kDouble);
  const std::string e = test::error_of([&] { sparsegpt(w, indefinite, o, "blk.1.up"); });
  EXPECT_NE(e.find("Hessian of layer 'blk.1.up' is not positive definite"), std::string::npos) << e;
  // An input no token ever set: its weights go (H_jj = 0), as in the reference.
  at::Tensor dead = at::eye(8, at::kDouble);
  dead[5][5] = 0;
  o.amount = 0;
  EXPECT_TRUE(sparsegpt(w, dead, o, "d").weight.select(1, 5).eq(0).all().item<bool>());
}

// The MLP fixture (Gemm, Relu, Gemm, Relu, Gemm): each layer's Wanda mask is computed on the
// outputs of the layers before it, already pruned; --one-pass computes every mask on the unpruned
// model's activations instead, and the two differ.
TEST(PruneCalibrated, WandaLayerByLayerOnThePrunedLayersBefore) {
  test::TempDir tmp;
  at::manual_seed(3);
  const at::Tensor x = at::rand({8, 1, 28, 28});
  auto masks_by_hand = [&](bool sequential) {
    ir::Model m = onnx::load_model(test::fixture("mlp.ts.onnx"));
    std::vector<at::Tensor> drops;
    at::Tensor h = x.reshape({8, -1}), dense = h;
    const auto weights = prunable_weights(m.graph);
    for (size_t i = 0; i < weights.size(); ++i) {
      const at::Tensor w = m.graph.find_initializer(weights[i].weight)->value;
      const at::Tensor b = m.graph.find_initializer(weights[i].node->inputs[2])->value;
      const at::Tensor d = wanda_drop(w, sequential ? h : dense, 0.5);
      drops.push_back(d);
      h = at::linear(h, w.masked_fill(d, 0), b);
      dense = at::linear(dense, w, b);
      if (i + 1 < weights.size()) h = h.relu(), dense = dense.relu();
    }
    return drops;
  };
  for (bool sequential : {true, false}) {
    SCOPED_TRACE(sequential ? "sequential" : "one pass");
    ir::Model m = onnx::load_model(test::fixture("mlp.ts.onnx"));
    DataLoader loader = npy_loader(x, tmp, 4);
    PruneOptions po;
    po.criterion = "wanda";
    po.amount = PruneAmount{0.5, false};
    CalibrationOptions co;
    co.batches = 2;
    co.sequential = sequential;
    std::vector<std::string> passes;
    co.on_pass = [&](int64_t, int64_t, const std::string& what) { passes.push_back(what); };
    const PruneReport r = prune_calibrated(m, po, loader, co);
    EXPECT_EQ(passes.size(), sequential ? 3u : 1u);
    const auto want = masks_by_hand(sequential);
    const auto weights = prunable_weights(m.graph);
    for (size_t i = 0; i < weights.size(); ++i) {
      const at::Tensor got = m.graph.find_initializer(weights[i].weight)->value.eq(0);
      EXPECT_TRUE(got.equal(want[i]))
          << weights[i].weight << ": " << got.ne(want[i]).sum().item<int64_t>() << " differ";
    }
    EXPECT_EQ(r.nonzero_after * 2, r.nonzero_before);
  }
  const auto seq = masks_by_hand(true), one = masks_by_hand(false);
  EXPECT_FALSE(seq.back().equal(one.back()));  // the calibration order matters
}

// A Conv's inputs are its patches: for any V of the weight's shape, the squared output of the
// convolution with V equals trace(V G V^T) with G the collected Gram matrix.
TEST(PruneCalibrated, AConvReadsItsPatches) {
  const ir::Model m = onnx::load_model(test::example("cnn_small.onnx"));
  test::TempDir tmp;
  at::manual_seed(4);
  const at::Tensor x = at::rand({4, 1, 28, 28});
  DataLoader loader = npy_loader(x, tmp, 4);
  LayerInputOptions lo;
  lo.gram = true;
  const auto stats = collect_layer_inputs(m, loader, lo);
  const ir::Node& conv = m.graph.nodes.front();
  ASSERT_EQ(conv.op_type, "Conv");
  const LayerInput& li = stats.at(conv.inputs[1]);
  const at::Tensor w = m.graph.find_initializer(conv.inputs[1])->value;
  const at::Tensor v = at::randn(w.sizes());
  const double direct = at::conv2d(x, v, {}, /*stride=*/1, /*padding=*/1)
                            .to(at::kDouble)
                            .square()
                            .sum()
                            .item<double>();
  const at::Tensor v2 = v.reshape({v.size(0), -1}).to(at::kDouble);
  const double via_gram = v2.mm(li.gram).mm(v2.t()).trace().item<double>();
  // float32 Gram sums: the BLAS's summation order differs by CPU (1.6e-6 seen on a Zen 3).
  EXPECT_NEAR(via_gram, direct, 1e-5 * direct);
  EXPECT_EQ(li.tokens, 4 * 28 * 28);
}

// OWL on the LLaMA fixture: one amount per transformer block, within amount +- lambda, averaging
// the amount; the other layer (lm_head) keeps the amount.
TEST(PruneCalibrated, OwlSpreadsTheAmountOverTheBlocks) {
  ir::Model m = onnx::load_model(test::fixture("llama.dynamo.onnx"));
  test::TempDir tmp;
  at::manual_seed(5);
  DataLoader loader = test::token_loader(tmp, at::randint(1, 100, {8, 16}, at::kLong));
  PruneOptions po;
  po.criterion = "wanda";
  po.amount = PruneAmount{0.5, false};
  po.owl.lambda = 0.1;
  CalibrationOptions co;
  co.batches = 4;
  const PruneReport r = prune_calibrated(m, po, loader, co);
  std::map<std::string, double> block;
  for (const auto& l : r.layers) {
    ASSERT_TRUE(l.skipped.empty()) << l.label();
    const double a = std::stod(l.amount);
    const std::string key = l.label().substr(0, l.label().find(".layers.") + 9);
    if (l.label().find(".layers.") == std::string::npos) {
      EXPECT_NEAR(a, 0.5, 1e-9) << l.label();
      continue;
    }
    EXPECT_GE(a, 0.4 - 1e-9);
    EXPECT_LE(a, 0.6 + 1e-9);
    if (block.count(key)) EXPECT_NEAR(block[key], a, 1e-9) << l.label();
    block[key] = a;
  }
  ASSERT_EQ(block.size(), 2u);
  EXPECT_NEAR((block.begin()->second + block.rbegin()->second) / 2, 0.5, 1e-9);
  EXPECT_NEAR(std::abs(block.begin()->second - block.rbegin()->second), 0.2, 1e-9);
}

// Bad input: one line, its exit code, nothing written.
TEST(PruneCalibratedCli, BadInputIsOneLineAndWritesNothing) {
  test::TempDir tmp;
  const std::string llama = test::fixture("llama.dynamo.onnx"), out = tmp / "out.onnx";
  save_npy(at::randint(1, 100, {8, 16}, at::kLong), tmp / "ids.npy");
  save_npy(at::randint(1, 5000, {8, 16}, at::kLong), tmp / "far.npy");
  const std::string base = "prune " + llama + " -o " + out + " ";
  struct Case {
    std::string args, says;
    int code;
  };
  const std::vector<Case> cases = {
      {"--method wanda --amount 0.5", "wanda ranks weights by the layers' inputs on data", 2},
      {"--method wanda --amount 0.5 --batch-size 2 --data tokens:" + (tmp / "ids.npy"),
       "has 4 calibration batches of 2, fewer than the 64 asked", 1},
      {"--method wanda --amount 0.5 --calib-batches 4 --batch-size 2 --data tokens:" +
           (tmp / "far.npy"),
       "index out of range", 1},
      {"--method wanda --amount 0.5 --scope global --batch-size 2 --data tokens:" +
           (tmp / "ids.npy"),
       "use --scope local", 2},
      {"--method wanda --amount 3 --batch-size 2 --data tokens:" + (tmp / "ids.npy"),
       "give it as a fraction", 2},
      {"--method sparsegpt --amount 0.5 --dampening 0 --batch-size 2 --data tokens:" +
           (tmp / "ids.npy"),
       "--dampening must be > 0", 2},
      {"--method sparsegpt --pattern row --amount 0.5 --batch-size 2 --data tokens:" +
           (tmp / "ids.npy"),
       "unstructured or N:M", 2},
      {"--method l1 --amount 0.5 --owl-lambda 0.1", "OWL weighs each block", 2},
      {"--method wanda --amount 0.5 --owl-lambda 0.6 --batch-size 2 --data tokens:" +
           (tmp / "ids.npy"),
       "must stay in [0, 1]", 2},
      {"--structured channel --amount 0.5 --block-size 64",
       "--block-size is for unstructured pruning", 2},
      {"--method l1 --amount 0.5 --one-pass", "--one-pass is for --method wanda", 2},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.args);
    const auto r = test::lopper_cli(base + c.args);
    EXPECT_EQ(r.code, c.code) << r.err;
    EXPECT_EQ(test::lines(r.err.substr(r.err.rfind("lopper:"))), 1) << r.err;
    EXPECT_NE(r.err.find(c.says), std::string::npos) << r.err;
    EXPECT_FALSE(std::filesystem::exists(out));
  }
}

// A model with external data is streamed: its data file is copied to the output's and mapped, each
// block's weights pruned in the copy. The result equals the in-memory run's, the input's files are
// untouched, and a failure leaves no file behind.
TEST(PruneCalibratedCli, ExternalDataIsStreamedThroughACopy) {
  test::TempDir tmp;
  const ir::Model m = onnx::load_model(test::fixture("llama.dynamo.onnx"));
  const std::string in = tmp / "in.onnx";
  onnx::SaveOptions so;
  so.external_data = true;
  onnx::save_model(m, in, so);
  const std::string in_data = test::slurp(in + ".data"), in_model = test::slurp(in);
  ASSERT_GT(in_data.size(), 100000u);
  save_npy(at::randint(1, 100, {8, 16}, at::kLong), tmp / "ids.npy");
  save_npy(at::randint(1, 5000, {8, 16}, at::kLong), tmp / "far.npy");
  // NOTE: one thread for both runs: the default follows the idle CPUs, and two runs with other
  // thread counts sum the Hessians in another order (a busy machine made one weight differ).
  const std::string args =
      " --method sparsegpt --amount 0.5 --batch-size 2 --calib-batches 4 --threads 1 ";
  auto streamed = test::lopper_cli("prune " + in + " -o " + (tmp / "s.onnx") + args +
                                   "--data tokens:" + (tmp / "ids.npy"));
  ASSERT_EQ(streamed.code, 0) << streamed.err;
  auto whole = test::lopper_cli("prune " + test::fixture("llama.dynamo.onnx") + " -o " +
                                (tmp / "w.onnx") + args + "--data tokens:" + (tmp / "ids.npy"));
  ASSERT_EQ(whole.code, 0) << whole.err;
  EXPECT_TRUE(std::filesystem::exists(tmp / "s.onnx.data"));
  EXPECT_LT(std::filesystem::file_size(tmp / "s.onnx"), 300000u);  // the weights are outside
  const ir::Model s = onnx::load_model(tmp / "s.onnx"), w = onnx::load_model(tmp / "w.onnx");
  ASSERT_EQ(s.graph.initializers.size(), w.graph.initializers.size());
  for (const auto& init : w.graph.initializers)
    EXPECT_TRUE(s.graph.find_initializer(init.name)->value.equal(init.value)) << init.name;
  EXPECT_EQ(test::slurp(in + ".data"), in_data);
  EXPECT_EQ(test::slurp(in), in_model);

  auto bad = test::lopper_cli("prune " + in + " -o " + (tmp / "b.onnx") + args +
                              "--data tokens:" + (tmp / "far.npy"));
  EXPECT_EQ(bad.code, 1) << bad.err;
  for (const auto& f : std::filesystem::directory_iterator(tmp.path))
    EXPECT_EQ(f.path().filename().string().rfind("b.onnx", 0), std::string::npos) << f.path();
  size_t files = 0;
  for (const auto& f : std::filesystem::directory_iterator(tmp.path)) files += f.is_regular_file();
  EXPECT_EQ(files, 9u);  // in (2), ids, far, s (model, data, report), w (model, report): no more
}
