// The executor: autograd gradients against PyTorch's, the inference rewrites (fusions) against the
// plain graph, input checking, and unsupported ops.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <random>

#include "dnnl/primitives.h"
#include "exec/allocator.h"
#include "exec/fuse.h"
#include "exec/kernel_choice.h"
#include "exec/onednn.h"
#include "kernels/cpu/rows.h"
#include "kernels/cpu/sparse.h"
#include "lopper/error.h"
#include "lopper/executor.h"
#include "lopper/memory.h"
#include "lopper/npy.h"
#include "lopper/onnx_io.h"
#include "lopper/prune.h"
#include "test_models.h"

namespace fs = std::filesystem;
using namespace lopper;
using namespace lopper::test;

namespace {

// The fixture's saved inputs (STEM.input_0.npy, ...) under the model's input names.
NamedTensors fixture_feeds(const ir::Model& m, const std::string& stem) {
  NamedTensors feeds;
  for (int i = 0; fs::exists(fixture(stem + ".input_" + std::to_string(i) + ".npy")); ++i)
    feeds.emplace_back(m.graph.real_inputs()[i]->name,
                       load_npy(fixture(stem + ".input_" + std::to_string(i) + ".npy")));
  return feeds;
}

// A model of one float input x of `dims` and one output y (its nodes and weights to be added).
// init(name, tensor) adds the initializer to g.
auto initializer_adder(ir::Graph& g) {
  return [&g](const std::string& n, at::Tensor t) { g.initializers.push_back({n, t, "", false}); };
}

ir::Model image_model(std::vector<int64_t> dims) {
  ir::Model m;
  m.ir_version = 8;
  m.opset_import = {{"", 17}};
  ir::ValueInfo x;
  x.name = "x";
  x.type = {ir::DType::kFloat, true, {}, "", ""};
  for (int64_t d : dims) x.type.dims.push_back({d, ""});
  m.graph.inputs.push_back(x);
  m.graph.outputs.push_back({"y", {ir::DType::kFloat, false, {}, "", ""}, ""});
  return m;
}

// Makes the graph's outputs y1, ..., yn (of the first output's type).
void name_outputs(ir::Graph& g, int n) {
  g.outputs.resize(static_cast<size_t>(n), g.outputs[0]);
  for (int i = 0; i < n; ++i) g.outputs[static_cast<size_t>(i)].name = "y" + std::to_string(i + 1);
}

// Runs m on x under each LOPPER_FORCE_KERNEL list ("": the timed choice), twice (the first run
// chooses the kernels, the second runs them), and compares every output with want: its shape, and
// its values to a relative error of 1e-5.
void expect_outputs_match(const ir::Model& m, const at::Tensor& x,
                          const std::vector<at::Tensor>& want,
                          std::initializer_list<const char*> forced_lists) {
  for (const char* forced : forced_lists) {
    ::setenv("LOPPER_FORCE_KERNEL", forced, 1);
    Executor e(m);
    for (int run = 0; run < 2; ++run) {
      const auto outs = e.run({{"x", x}});
      ASSERT_EQ(outs.size(), want.size());
      for (size_t i = 0; i < want.size(); ++i) {
        EXPECT_EQ(outs[i].sizes(), want[i].sizes()) << forced << " output " << i;
        EXPECT_LE(test::relative_max_diff(outs[i], want[i]), 1e-5) << forced << " output " << i;
      }
    }
  }
  ::unsetenv("LOPPER_FORCE_KERNEL");
}

// x -> Conv -> BatchNorm -> Relu -> Conv -> Add(relu out) -> Relu -> MatMul -> Add(bias) ->
// Gelu written with Erf -> y
ir::Model fusable_model() {
  at::manual_seed(3);
  ir::Model m;
  m.ir_version = 8;
  m.opset_import = {{"", 17}};
  ir::Graph& g = m.graph;
  g.inputs.push_back(
      {"x", {ir::DType::kFloat, true, {{2, ""}, {8, ""}, {6, ""}, {6, ""}}, "", ""}, ""});
  g.outputs.push_back({"y", {ir::DType::kFloat, false, {}, "", ""}, ""});
  auto init = initializer_adder(g);
  init("w1", at::randn({8, 8, 3, 3}) * 0.2);
  init("b1", at::randn({8}));
  init("scale", at::rand({8}) + 0.5);
  init("shift", at::randn({8}));
  init("mean", at::randn({8}) * 0.1);
  init("var", at::rand({8}) + 0.5);
  init("w2", at::randn({8, 8, 3, 3}) * 0.2);
  init("wm", at::randn({6, 5}));
  init("bm", at::randn({5}));
  init("sqrt2", at::scalar_tensor(1.4142135f));
  init("one", at::scalar_tensor(1.0f));
  init("half", at::scalar_tensor(0.5f));
  auto conv_attrs = [] { return std::vector<ir::Attribute>{ints_attr("pads", {1, 1, 1, 1})}; };
  g.nodes = {
      node("Conv", {"x", "w1", "b1"}, {"c1"}, conv_attrs()),
      node("BatchNormalization", {"c1", "scale", "shift", "mean", "var"}, {"bn"}),
      node("Relu", {"bn"}, {"r1"}),
      node("Conv", {"r1", "w2"}, {"c2"}, conv_attrs()),
      node("Add", {"c2", "r1"}, {"s"}),
      node("Relu", {"s"}, {"r2"}),
      node("MatMul", {"r2", "wm"}, {"mm"}),
      node("Add", {"bm", "mm"}, {"lin"}),
      node("Div", {"lin", "sqrt2"}, {"d"}),
      node("Erf", {"d"}, {"e"}),
      node("Add", {"e", "one"}, {"e1"}),
      node("Mul", {"lin", "e1"}, {"m1"}),
      node("Mul", {"m1", "half"}, {"y"}),
  };
  return m;
}

// Grouped-query attention as transformers exports it: q [1, 8, s, 4] against a key/value cache of
// 2 heads [1, 2, S, 4], each repeated 4 times (Unsqueeze -> Expand -> Reshape), keys transposed.
// `expand` and `merge` are the Expand and Reshape targets.
ir::Model grouped_attention_model(std::vector<int64_t> expand, std::vector<int64_t> merge) {
  ir::Model m;
  m.ir_version = 8;
  m.opset_import = {{"", 17}};
  ir::Graph& g = m.graph;
  auto input = [&](const char* n) {
    g.inputs.push_back({n, {ir::DType::kFloat, false, {}, "", ""}, ""});
  };
  input("q");
  input("k");
  input("v");
  g.outputs.push_back({"y", {ir::DType::kFloat, false, {}, "", ""}, ""});
  g.initializers.push_back({"axis2", at::tensor({int64_t{2}}), "", false});
  g.initializers.push_back({"expand", at::tensor(expand), "", false});
  g.initializers.push_back({"merge", at::tensor(merge), "", false});
  g.nodes = {
      node("Unsqueeze", {"k", "axis2"}, {"k5"}),
      node("Expand", {"k5", "expand"}, {"ke"}),
      node("Reshape", {"ke", "merge"}, {"kr"}),
      node("Transpose", {"kr"}, {"kt"}, {ints_attr("perm", {0, 1, 3, 2})}),
      node("MatMul", {"q", "kt"}, {"scores"}),
      node("Softmax", {"scores"}, {"p"}),
      node("Unsqueeze", {"v", "axis2"}, {"v5"}),
      node("Expand", {"v5", "expand"}, {"ve"}),
      node("Reshape", {"ve", "merge"}, {"vr"}),
      node("MatMul", {"p", "vr"}, {"y"}),
  };
  return m;
}

// The model's first output run op by op in ATen at `precision` (autograd: no fusion, no
// prepacking, no kernel choice): what lopper's kernels are checked against.
at::Tensor aten_output(const ir::Model& m, const NamedTensors& feeds,
                       at::ScalarType precision = at::kFloat) {
  ExecOptions plain;
  plain.autograd = true;
  plain.precision = precision;
  return Executor(m, plain).run(feeds)[0].detach();
}

// `exec`'s first output on `feeds`, each layer's kernel the first of the LOPPER_FORCE_KERNEL list
// `forced` that it has ("": chosen by timing).
at::Tensor run_forced(Executor& exec, const NamedTensors& feeds, const char* forced) {
  if (*forced) setenv("LOPPER_FORCE_KERNEL", forced, 1);
  at::Tensor y = exec.run(feeds)[0];
  unsetenv("LOPPER_FORCE_KERNEL");
  return y;
}

// How many of `exec`'s kernel decisions chose a kernel `pick` takes (by its name).
int chosen(const Executor& exec, const std::function<bool(const std::string&)>& pick) {
  int n = 0;
  for (const auto& d : exec.kernel_decisions()) n += pick(d.chosen);
  return n;
}

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }
bool has(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

}  // namespace

// Attention's scores as PyTorch exports scaled_dot_product_attention (sqrt(scale) on Q and on K)
// and as older exports write it (the product divided by sqrt(d)): the scalings fold into
// ScaledSoftmax; a scaling read twice, or by a constant that would broadcast the rank, stays.
TEST(Exec, AttentionScalesFoldIntoTheSoftmax) {
  at::manual_seed(17);
  for (int variant = 0; variant < 4; ++variant) {
    ir::Model m = image_model({2, 3, 9, 8});
    ir::Graph& g = m.graph;
    auto init = initializer_adder(g);
    init("sq", at::scalar_tensor(0.4f));
    init("sk", at::tensor({0.7f}));
    init("d", at::scalar_tensor(2.5f));
    init("wide", at::full({1, 1, 1, 1}, 0.5f));
    init("k", at::randn({2, 3, 8, 9}));
    init("v", at::randn({2, 3, 9, 5}));
    name_outputs(g, 1);
    const char* q_scale = variant == 3 ? "wide" : "sq";
    g.nodes = {node("Mul", {"x", q_scale}, {"qs"}), node("Mul", {"sk", "k"}, {"ks"}),
               node("MatMul", {"qs", "ks"}, {"s"})};
    std::string scores = "s";
    if (variant == 1) {  // the product divided by a constant too
      g.nodes.push_back(node("Div", {"s", "d"}, {"sd"}));
      scores = "sd";
    }
    g.nodes.push_back(node("Softmax", {scores}, {"p"}));
    g.nodes.push_back(node("MatMul", {"p", "v"}, {"y1"}));
    if (variant == 2) {  // Q's scaling read twice: it stays, K's folds
      name_outputs(g, 2);
      g.nodes.push_back(node("Identity", {"qs"}, {"y2"}));
    }
    const ir::Graph fused = exec::fuse_for_inference(g, 17);
    int softmax = 0, muls = 0;
    float scale = 0;
    std::vector<std::string> inputs;
    for (const auto& n : fused.nodes) {  // the softmax, fused with both products (step 8)
      if (n.op_type == "ScaledAttention") ++softmax, scale = n.attr("scale")->f, inputs = n.inputs;
      muls += n.op_type == "Mul" || n.op_type == "Div";
    }
    // A rank-4 factor is not folded into the attribute (it could raise the rank): its Mul joins
    // the attention as a factor input, applied at run time (one element: part of the scale).
    const float want_scale[] = {0.4f * 0.7f, 0.4f * 0.7f / 2.5f, 0.7f, 0.7f};
    EXPECT_EQ(softmax, 1) << variant;
    EXPECT_FLOAT_EQ(scale, want_scale[variant]) << variant;
    EXPECT_EQ(muls, variant == 2 ? 1 : 0) << variant;
    if (variant == 3) {
      ASSERT_EQ(inputs.size(), 5u);
      EXPECT_EQ(inputs[0], "x");
      EXPECT_EQ(inputs[3], "wide");
    }
    const at::Tensor x = at::randn({2, 3, 9, 8});
    auto w = [&](const char* n) { return g.find_initializer(n)->value; };
    at::Tensor s = at::matmul(x * w(q_scale), w("k") * 0.7f);
    if (variant == 1) s = s / 2.5f;
    std::vector<at::Tensor> want{at::matmul(at::softmax(s, -1), w("v"))};
    if (variant == 2) want.push_back(x * 0.4f);
    expect_outputs_match(m, x, want, {""});
  }
}

// An unmasked attention (MatMul, Softmax along the last axis, MatMul; Q, K and V head views of one
// fused projection, as transformers export them) runs as one ScaledAttention node; with a mask
// added to the scores, or the probabilities also a graph output, it stays three nodes. Against
// ATen, 1 and 2 threads.
TEST(Exec, UnmaskedAttentionRunsInOnePass) {
  at::manual_seed(23);
  for (int variant = 0; variant < 3; ++variant) {
    ir::Model m = image_model({2, 7, 36});  // [batch, tokens, 3 x 2 heads x 6]
    ir::Graph& g = m.graph;
    auto init = initializer_adder(g);
    init("shape", at::tensor({2, 7, 3, 2, 6}, at::kLong));
    init("mask", at::randn({1, 1, 7, 7}));
    init("axis0", at::tensor({0}, at::kLong));
    name_outputs(g, variant == 2 ? 2 : 1);
    g.nodes = {node("Reshape", {"x", "shape"}, {"r"}),
               node("Transpose", {"r"}, {"t"}, {ints_attr("perm", {2, 0, 3, 1, 4})}),
               node("Split", {"t"}, {"q3", "k3", "v3"}, {int_attr("axis", 0)}),
               node("Squeeze", {"q3", "axis0"}, {"q"}),
               node("Squeeze", {"k3", "axis0"}, {"k"}),
               node("Squeeze", {"v3", "axis0"}, {"v"}),
               node("Transpose", {"k"}, {"kt"}, {ints_attr("perm", {0, 1, 3, 2})}),
               node("MatMul", {"q", "kt"}, {"s"})};
    std::string scores = "s";
    if (variant == 1) {
      g.nodes.push_back(node("Add", {"s", "mask"}, {"sm"}));
      scores = "sm";
    }
    g.nodes.push_back(node("Softmax", {scores}, {variant == 2 ? "y2" : "p"}));
    g.nodes.push_back(node("MatMul", {variant == 2 ? "y2" : "p", "v"}, {"y1"}));
    const ir::Graph fused = exec::fuse_for_inference(g, 17);
    int attention = 0, matmuls = 0;
    for (const auto& n : fused.nodes) {
      attention += n.op_type == "ScaledAttention";
      matmuls += n.op_type == "MatMul";
    }
    EXPECT_EQ(attention, variant == 0 ? 1 : 0) << variant;
    EXPECT_EQ(matmuls, variant == 0 ? 0 : 2) << variant;
    const at::Tensor x = at::randn({2, 7, 36});
    const at::Tensor t = x.reshape({2, 7, 3, 2, 6}).permute({2, 0, 3, 1, 4});
    at::Tensor s = at::matmul(t[0], t[1].transpose(-1, -2));
    if (variant == 1) s = s + g.find_initializer("mask")->value;
    const at::Tensor p = at::softmax(s, -1);
    std::vector<at::Tensor> want{at::matmul(p, t[2])};
    if (variant == 2) want.push_back(p);
    for (int threads : {1, 2}) {
      const int before = at::get_num_threads();
      at::set_num_threads(threads);
      expect_outputs_match(m, x, want, {""});
      at::set_num_threads(before);
    }
  }
}

TEST(Exec, FusionRewritesAndKeepsOutputs) {
  ir::Model m = fusable_model();
  ir::Graph fused = exec::fuse_for_inference(m.graph, 17);
  std::map<std::string, int> ops;
  for (const auto& n : fused.nodes) ops[n.domain + ":" + n.op_type]++;
  EXPECT_EQ(ops["ai.lopper:FusedConv"], 2);    // Conv+BN+Relu, Conv+Add+Relu
  EXPECT_EQ(ops["ai.lopper:FusedMatMul"], 1);  // MatMul+Add+Gelu
  EXPECT_EQ(fused.nodes.size(), 3u);

  at::Tensor x = at::randn({2, 8, 6, 6});
  ExecOptions plain;
  plain.fuse = false;
  plain.fold_constants = false;
  Executor a(m, plain), b(m);
  at::Tensor ya = a.run({{"x", x}})[0], yb = b.run({{"x", x}})[0];
  EXPECT_EQ(ya.sizes(), yb.sizes());
  EXPECT_LE(test::relative_max_diff(yb, ya), 1e-5);
  EXPECT_TRUE(yb.is_contiguous());
  // The model the caller holds is untouched.
  EXPECT_EQ(m.graph.nodes.size(), 13u);
}

// DenseNet's pattern: two convolutions' outputs concatenated along the channels, normalised and
// rectified (Concat + BatchNormalization + Relu fused: each input normalised straight into its
// slice of the output), convolved; 19 + 13 channels (no multiple of a vector); against ATen.
TEST(Exec, DenseNetConcatNormReluMatchesAten) {
  at::manual_seed(5);
  ir::Model m = image_model({2, 8, 9, 7});
  ir::Graph& g = m.graph;
  auto init = initializer_adder(g);
  init("wa", at::randn({19, 8, 3, 3}) * 0.2);
  init("wb", at::randn({13, 8, 1, 1}) * 0.2);
  init("scale", at::rand({32}) + 0.5);
  init("shift", at::randn({32}));
  init("mean", at::randn({32}) * 0.1);
  init("var", at::rand({32}) + 0.5);
  init("wc", at::randn({5, 32, 1, 1}) * 0.2);
  g.nodes = {
      node("Conv", {"x", "wa"}, {"a"}, {ints_attr("pads", {1, 1, 1, 1})}),
      node("Conv", {"x", "wb"}, {"b"}),
      node("Concat", {"a", "b"}, {"cat"}, {int_attr("axis", 1)}),
      node("BatchNormalization", {"cat", "scale", "shift", "mean", "var"}, {"bn"}),
      node("Relu", {"bn"}, {"r"}),
      node("Conv", {"r", "wc"}, {"y"}),
  };
  ir::Graph fused = exec::fuse_for_inference(m.graph, 17);
  // Concat + BatchNormalization + Relu: one node that never writes the concatenation.
  ASSERT_EQ(fused.nodes.size(), 4u);
  EXPECT_EQ(fused.nodes[2].op_type, "FusedConcatNorm");
  const at::Tensor x = at::randn({2, 8, 9, 7});
  auto w = [&](const char* n) { return g.find_initializer(n)->value; };
  const at::Tensor cat = at::cat({at::conv2d(x, w("wa"), {}, 1, 1), at::conv2d(x, w("wb"))}, 1);
  const at::Tensor want = at::conv2d(at::relu(at::batch_norm(cat, w("scale"), w("shift"), w("mean"),
                                                             w("var"), false, 0.1, 1e-5, false)),
                                     w("wc"));
  ExecOptions plain, unpacked;
  plain.fuse = false;
  unpacked.prepack = false;  // the fused node on ATen's ops (a concatenation, then the formula)
  Executor a(m, plain), b(m), d(m, unpacked);
  for (int run = 0; run < 2; ++run) {  // the first run chooses kernels, the second runs them
    EXPECT_LE(test::relative_max_diff(a.run({{"x", x}})[0], want), 1e-5);
    EXPECT_LE(test::relative_max_diff(b.run({{"x", x}})[0], want), 1e-5);
    EXPECT_LE(test::relative_max_diff(d.run({{"x", x}})[0], want), 1e-5);
  }
}

// ResNet's downsampling block: Relu(Conv(x) + b + Conv'(x') + b'): the residual Conv's bias moves
// into the fused convolution's (one add fewer over the residual on a GPU); a residual read twice
// keeps its own. Against ATen and the same graph unfused, on each CPU kernel.
TEST(Exec, ResidualConvBiasMovesIntoTheFusedConvolution) {
  at::manual_seed(9);
  ir::Model m = image_model({2, 8, 17, 15});
  ir::Graph& g = m.graph;
  auto init = initializer_adder(g);
  init("wa", at::randn({12, 8, 3, 3}) * 0.2);
  init("ba", at::randn({12}));
  init("wd", at::randn({12, 8, 1, 1}) * 0.3);
  init("bd", at::randn({12}));
  init("wb", at::randn({12, 12, 1, 1}) * 0.3);
  init("bb", at::randn({12}));
  init("we", at::randn({12, 12, 1, 1}) * 0.3);
  init("be", at::randn({12}));
  g.nodes = {
      node("Conv", {"x", "wa", "ba"}, {"a"}, {ints_attr("pads", {1, 1, 1, 1})}),
      node("Conv", {"x", "wd", "bd"}, {"d"}),
      node("Add", {"a", "d"}, {"s"}),
      node("Relu", {"s"}, {"r"}),
      // A residual also read by another node: its bias stays where it is.
      node("Conv", {"r", "wb"}, {"b"}),
      node("Conv", {"r", "we", "be"}, {"e"}),
      node("Add", {"b", "e"}, {"t"}),
      node("Relu", {"t"}, {"u"}),
      node("Add", {"u", "e"}, {"y"}),
  };
  ir::Graph fused = exec::fuse_for_inference(m.graph, 17);
  int moved = 0, kept = 0;
  for (const auto& n : fused.nodes) {
    if (n.op_type != "Conv") continue;
    if (n.inputs[1] == "wd") moved += n.inputs.size() == 2;
    if (n.inputs[1] == "we") kept += n.inputs.size() == 3 && n.inputs[2] == "be";
  }
  EXPECT_EQ(moved, 1);
  EXPECT_EQ(kept, 1);
  const at::Tensor x = at::randn({2, 8, 17, 15});
  auto w = [&](const char* n) { return g.find_initializer(n)->value; };
  const at::Tensor r =
      at::relu(at::conv2d(x, w("wa"), w("ba"), 1, 1) + at::conv2d(x, w("wd"), w("bd")));
  const at::Tensor e = at::conv2d(r, w("we"), w("be"));
  const at::Tensor want = at::relu(at::conv2d(r, w("wb")) + e) + e;
  ExecOptions plain;
  plain.fuse = false;
  Executor a(m, plain);
  EXPECT_LE(test::relative_max_diff(a.run({{"x", x}})[0], want), 1e-5);
  for (const char* forced : {"lopper-direct", "lopper-winograd", "onednn-conv,onednn-linear",
                             "onednn-direct", "aten", ""}) {
    ::setenv("LOPPER_FORCE_KERNEL", forced, 1);
    Executor b(m);
    for (int run = 0; run < 2; ++run)  // the first run chooses kernels, the second runs them
      EXPECT_LE(test::relative_max_diff(b.run({{"x", x}})[0], want), 1e-5) << forced;
    // The 3x3 convolution (17x15 maps of two images: 40 tiles of 4x4) runs Winograd's F(4x4, 3x3)
    // when it is forced.
    const int winograd = chosen(b, [](const std::string& k) { return has(k, "lopper-winograd"); });
    if (std::string(forced) == "lopper-winograd") EXPECT_EQ(winograd, 1);
  }
  ::unsetenv("LOPPER_FORCE_KERNEL");
}

// MobileNetV3's and EfficientNet's activations fused into the convolution before them: HardSwish,
// SiLU written Mul(x, Sigmoid(x)), HardSwish written Mul(HardSigmoid(x), x) (older opsets),
// the squeeze-and-excitation gate's HardSigmoid; a HardSigmoid of another line (alpha 0.2) is left
// alone. Odd channel counts; against the same graph unfused, and on ATen's ops (no prepacking).
TEST(Exec, GatedAndHardActivationsFuseIntoTheConvolution) {
  at::manual_seed(7);
  ir::Model m = image_model({2, 8, 9, 7});
  ir::Graph& g = m.graph;
  auto init = initializer_adder(g);
  init("wa", at::randn({21, 8, 3, 3}) * 0.3);
  init("ba", at::randn({21}));
  init("wd", at::randn({21, 1, 3, 3}) * 0.5);
  init("w_sq", at::randn({5, 21, 1, 1}) * 0.3);
  init("w_ex", at::randn({21, 5, 1, 1}) * 0.3);
  init("wc", at::randn({13, 21, 1, 1}) * 0.3);
  init("we", at::randn({13, 13, 1, 1}) * 0.3);
  const float sixth = 1.f / 6;
  auto hard_sigmoid = [&](const char* in, const char* out, float alpha) {
    return node("HardSigmoid", {in}, {out}, {float_attr("alpha", alpha), float_attr("beta", 0.5f)});
  };
  g.nodes = {
      node("Conv", {"x", "wa", "ba"}, {"a"}, {ints_attr("pads", {1, 1, 1, 1})}),
      node("HardSwish", {"a"}, {"h"}),
      node("Conv", {"h", "wd"}, {"d"}, {ints_attr("pads", {1, 1, 1, 1}), int_attr("group", 21)}),
      node("Sigmoid", {"d"}, {"ds"}),
      node("Mul", {"ds", "d"}, {"silu"}),
      node("GlobalAveragePool", {"silu"}, {"p"}),
      node("Conv", {"p", "w_sq"}, {"q"}),
      node("Relu", {"q"}, {"qr"}),
      node("Conv", {"qr", "w_ex"}, {"r"}),
      hard_sigmoid("r", "gate", sixth),
      node("Mul", {"silu", "gate"}, {"se"}),
      node("Conv", {"se", "wc"}, {"c"}),
      hard_sigmoid("c", "cs", sixth),
      node("Mul", {"c", "cs"}, {"hs"}),
      node("Conv", {"hs", "we"}, {"e"}),
      hard_sigmoid("e", "y", 0.2f),
  };
  ir::Graph fused = exec::fuse_for_inference(m.graph, 17);
  std::vector<std::string> acts;
  std::map<std::string, int> ops;
  for (const auto& n : fused.nodes) {
    ops[n.op_type]++;
    if (n.op_type == "FusedConv") acts.push_back(n.attr("activation")->s);
  }
  EXPECT_EQ(acts,
            (std::vector<std::string>{"HardSwish", "Silu", "Relu", "HardSigmoid", "HardSwish"}));
  EXPECT_EQ(ops["Conv"], 1);         // the last one: its HardSigmoid is another line
  EXPECT_EQ(ops["HardSigmoid"], 1);  // that one
  EXPECT_EQ(ops["Mul"], 1);          // the excitation's channel scale
  EXPECT_EQ(ops["Sigmoid"], 0);
  const at::Tensor x = at::randn({2, 8, 9, 7}) * 2;
  ExecOptions plain, unpacked;
  plain.fuse = false;
  plain.fold_constants = false;
  unpacked.prepack = false;
  Executor a(m, plain), d(m, unpacked);
  const at::Tensor want = a.run({{"x", x}})[0];
  EXPECT_LE(test::relative_max_diff(d.run({{"x", x}})[0], want), 1e-5);
  // Each convolution kernel in turn: lopper's own (the activations in its epilogue), oneDNN's.
  for (const char* forced :
       {"lopper-direct,lopper-depthwise", "onednn-conv,onednn-linear", "onednn-direct", ""}) {
    ::setenv("LOPPER_FORCE_KERNEL", forced, 1);
    Executor b(m);
    for (int run = 0; run < 2; ++run)  // the first run chooses kernels, the second runs them
      EXPECT_LE(test::relative_max_diff(b.run({{"x", x}})[0], want), 1e-5) << forced;
    ::unsetenv("LOPPER_FORCE_KERNEL");
  }
}

// Shape arithmetic (Shape -> Gather -> Div -> Concat -> Reshape) is computed once and reused while
// its inputs are the same: right again when the input's shape changes, and when a shape depends on
// the data (Shape of NonZero's output) at the same input shape.
TEST(Exec, ShapeArithmeticIsReusedOnlyWhileItsInputsAreTheSame) {
  ir::Model m;
  m.ir_version = 8;
  m.opset_import = {{"", 17}};
  ir::Graph& g = m.graph;
  g.inputs.push_back({"x", {ir::DType::kFloat, false, {}, "", ""}, ""});
  g.outputs.push_back({"y", {ir::DType::kFloat, false, {}, "", ""}, ""});
  g.outputs.push_back({"n", {ir::DType::kInt64, false, {}, "", ""}, ""});
  g.initializers.push_back({"i1", at::scalar_tensor(1, at::kLong), "", false});
  g.initializers.push_back({"two", at::scalar_tensor(2, at::kLong), "", false});
  g.initializers.push_back({"minus1", at::tensor({int64_t{-1}}), "", false});
  g.initializers.push_back({"zero", at::tensor({int64_t{0}}), "", false});
  g.nodes = {
      // y = x reshaped to [-1, x.shape[1] / 2]
      node("Shape", {"x"}, {"s"}),
      node("Gather", {"s", "i1"}, {"d1"}),
      node("Div", {"d1", "two"}, {"half"}),
      node("Unsqueeze", {"half", "zero"}, {"half1"}),
      node("Concat", {"minus1", "half1"}, {"shape"}, {int_attr("axis", 0)}),
      node("Reshape", {"x", "shape"}, {"y"}),
      // n = the number of nonzeros of x, through Shape of NonZero's output
      node("NonZero", {"x"}, {"nz"}),
      node("Shape", {"nz"}, {"nzs"}),
      node("Gather", {"nzs", "i1"}, {"n"}),
  };
  Executor ex(m);
  auto check = [&](const at::Tensor& x) {
    auto out = ex.run({{"x", x}});
    EXPECT_EQ(out[0].sizes(), (std::vector<int64_t>{x.numel() / (x.size(1) / 2), x.size(1) / 2}));
    EXPECT_TRUE(at::equal(out[0].flatten(), x.flatten()));
    EXPECT_EQ(out[1].item<int64_t>(), x.count_nonzero().item<int64_t>());
  };
  check(at::randn({3, 8}));
  check(at::randn({3, 8}));
  check(at::randn({2, 6}));           // another shape: the arithmetic again
  check(at::zeros({2, 6}));           // the same shape, other data: NonZero's shape changes
  check(at::eye(6).narrow(0, 0, 2));  // and again
  check(at::randn({4, 10, 3}));       // another rank
}

// A channel Concat of channels-last inputs (lopper's own copy kernel) is ATen's cat bit for bit:
// signed zeros, infinities and NaN included, odd channel counts.
TEST(Exec, ChannelsLastConcatIsAnExactCopy) {
  ir::Model m;
  m.ir_version = 8;
  m.opset_import = {{"", 17}};
  ir::Graph& g = m.graph;
  for (const char* n : {"a", "b", "c"})
    g.inputs.push_back({n, {ir::DType::kFloat, false, {}, "", ""}, ""});
  g.outputs.push_back({"y", {ir::DType::kFloat, false, {}, "", ""}, ""});
  g.nodes = {node("Concat", {"a", "b", "c"}, {"y"}, {int_attr("axis", 1)})};
  auto input = [](int64_t ch) {
    at::Tensor t = at::randn({2, ch, 5, 3});
    t.view(-1)[0] = -0.0f;
    t.view(-1)[1] = INFINITY;
    t.view(-1)[2] = -INFINITY;
    t.view(-1)[3] = NAN;
    return t.contiguous(at::MemoryFormat::ChannelsLast);
  };
  const at::Tensor a = input(19), b = input(1), c = input(37);
  Executor ex(m);
  const at::Tensor y = ex.run({{"a", a}, {"b", b}, {"c", c}})[0];
  const at::Tensor want = at::cat({a, b, c}, 1);
  ASSERT_EQ(y.sizes(), want.sizes());
  EXPECT_TRUE(at::equal(y.contiguous().view(at::kInt), want.contiguous().view(at::kInt)));
}

// GlobalAveragePool of a channels-last input (lopper's one-pass mean): ATen's mean, to float
// rounding, for a map of 3136 pixels and an odd channel count, and a large map of one image and
// few channels (its rows split into parts between the threads).
TEST(Exec, ChannelsLastGlobalAveragePoolMatchesAten) {
  ir::Model m;
  m.ir_version = 8;
  m.opset_import = {{"", 17}};
  m.graph.inputs.push_back({"x", {ir::DType::kFloat, false, {}, "", ""}, ""});
  m.graph.outputs.push_back({"y", {ir::DType::kFloat, false, {}, "", ""}, ""});
  m.graph.nodes = {node("GlobalAveragePool", {"x"}, {"y"})};
  for (const auto& dims :
       {std::vector<int64_t>{2, 70, 56, 56}, std::vector<int64_t>{1, 16, 113, 57}}) {
    const at::Tensor x = (at::randn(dims) + 3).contiguous(at::MemoryFormat::ChannelsLast);
    const int threads = at::get_num_threads();
    at::set_num_threads(2);
    Executor ex(m);
    const at::Tensor y = ex.run({{"x", x}})[0];
    const at::Tensor want = x.to(at::kDouble).mean({2, 3}, true);
    ASSERT_EQ(y.sizes(), want.sizes());
    at::set_num_threads(threads);
    EXPECT_LE((y.to(at::kDouble) - want).abs().max().item<double>(), 1e-6) << x.sizes();
  }
}

TEST(Exec, FusionLeavesSharedValuesAlone) {
  ir::Model m = fusable_model();
  // Make the first Conv's output a graph output too: it must not be fused away.
  m.graph.outputs.push_back({"c1", {}, ""});
  ir::Graph fused = exec::fuse_for_inference(m.graph, 17);
  int bn = 0;  // not folded into the Conv (its ReLU is fused into it instead)
  for (const auto& n : fused.nodes) bn += n.op_type == "FusedBatchNormalization";
  EXPECT_EQ(bn, 1);
  at::Tensor x = at::randn({2, 8, 6, 6});
  ExecOptions plain;
  plain.fuse = false;
  Executor a(m, plain), b(m);
  auto oa = a.run({{"x", x}}), ob = b.run({{"x", x}});
  ASSERT_EQ(oa.size(), 2u);
  for (size_t i = 0; i < 2; ++i) EXPECT_LE(test::relative_max_diff(ob[i], oa[i]), 1e-5);
}

TEST(Exec, FusionGroupsQueryHeadsWithoutRepeatingKeysAndValues) {
  struct Case {
    std::vector<int64_t> expand, merge, q;
  };
  // Heads repeated (the grouped path, s = 1 and 3: lopper's few-rows product); a repeat of 1 and a
  // reshape that does not merge the heads (both computed as the nodes did); fp32 and bf16.
  const Case cases[] = {{{1, 2, 4, 5, 4}, {1, 8, 5, 4}, {1, 8, 1, 4}},
                        {{1, 2, 4, 5, 4}, {0, 8, -1, 4}, {1, 8, 3, 4}},
                        {{1, 2, 1, 5, 4}, {1, 2, 5, 4}, {1, 2, 3, 4}},
                        {{1, 2, 4, 5, 4}, {1, 2, 20, 4}, {1, 2, 3, 4}}};
  for (const auto& tc : cases) {
    ir::Model m = grouped_attention_model(tc.expand, tc.merge);
    ir::Graph fused = exec::fuse_for_inference(m.graph, 17);
    std::map<std::string, int> ops;
    for (const auto& n : fused.nodes) ops[n.domain + ":" + n.op_type]++;
    EXPECT_EQ(ops["ai.lopper:GroupedMatMul"], 2);
    EXPECT_EQ(ops[":Reshape"] + ops[":Transpose"] + ops[":MatMul"], 0);
    NamedTensors feeds = {
        {"q", at::randn(tc.q)}, {"k", at::randn({1, 2, 5, 4})}, {"v", at::randn({1, 2, 5, 4})}};
    ExecOptions plain;
    plain.fuse = false;
    at::Tensor want = Executor(m, plain).run(feeds)[0], got = Executor(m).run(feeds)[0];
    ASSERT_EQ(got.sizes(), want.sizes());
    EXPECT_LE(test::relative_max_diff(got, want), 1e-5);
    // in bf16 (a decoded token's products on lopper's few-rows kernel) against ATen's bf16 ops
    ExecOptions bf16;
    bf16.precision = at::kBFloat16;
    const at::Tensor got16 = Executor(m, bf16).run(feeds)[0];
    EXPECT_LE(test::relative_max_diff(got16, aten_output(m, feeds, at::kBFloat16)), 2e-2);
  }
  // A repeated key read by another node as well stays a Reshape of its own.
  ir::Model m = grouped_attention_model({1, 2, 4, 5, 4}, {1, 8, 5, 4});
  m.graph.outputs.push_back({"kr", {}, ""});
  int grouped = 0;
  for (const auto& n : exec::fuse_for_inference(m.graph, 17).nodes)
    grouped += n.op_type == "GroupedMatMul";
  EXPECT_EQ(grouped, 1);
  // Shapes that do not multiply fail naming the node, as the MatMul did.
  ir::Model bad = grouped_attention_model({1, 2, 4, 5, 4}, {1, 8, 5, 4});
  EXPECT_THROW(
      {
        try {
          Executor(bad).run({{"q", at::randn({1, 8, 1, 3})},
                             {"k", at::randn({1, 2, 5, 4})},
                             {"v", at::randn({1, 2, 5, 4})}});
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("inner dimensions differ"), std::string::npos)
              << e.what();
          throw;
        }
      },
      Error);
}

// RMSNorm as PyTorch exports LLaMA's (Pow, ReduceMean, Add, Sqrt, Reciprocal, Mul, Mul), and its
// Div forms, become one RMSNormalization with the same outputs; a mean over another axis, or one
// that drops the axis, stays as it is.
TEST(Exec, FusionWritesRMSNormAsOneOp) {
  enum Form { kReciprocal, kDivOne, kDivX, kOtherAxis, kNoKeepdims };
  for (Form form : {kReciprocal, kDivOne, kDivX, kOtherAxis, kNoKeepdims}) {
    ir::Model m;
    m.ir_version = 8;
    m.opset_import = {{"", 18}};
    ir::Graph& g = m.graph;
    g.inputs.push_back({"x", {ir::DType::kFloat, false, {}, "", ""}, ""});
    g.outputs.push_back({"y", {ir::DType::kFloat, false, {}, "", ""}, ""});
    auto init = initializer_adder(g);
    init("two", at::scalar_tensor(2.0f));
    init("one", at::scalar_tensor(1.0f));
    init("eps", at::scalar_tensor(1e-5f));
    init("axes", at::tensor({int64_t{form == kOtherAxis ? 1 : -1}}));
    init("gamma", at::rand({6}) + 0.5);
    std::vector<ir::Attribute> mean_attrs;
    if (form == kNoKeepdims) mean_attrs.push_back(int_attr("keepdims", 0));
    g.nodes = {node("Pow", {"x", "two"}, {"sq"}),
               node("ReduceMean", {"sq", "axes"}, {"ms"}, mean_attrs),
               node("Add", {"ms", "eps"}, {"v"}), node("Sqrt", {"v"}, {"rt"})};
    if (form == kDivX) {
      g.nodes.push_back(node("Div", {"x", "rt"}, {"n"}));
    } else {
      g.nodes.push_back(form == kDivOne ? node("Div", {"one", "rt"}, {"r"})
                                        : node("Reciprocal", {"rt"}, {"r"}));
      g.nodes.push_back(node("Mul", {"r", "x"}, {"n"}));
    }
    g.nodes.push_back(node("Mul", {"gamma", "n"}, {"y"}));
    const bool fuses = form == kReciprocal || form == kDivOne || form == kDivX;
    ir::Graph fused = exec::fuse_for_inference(g, 18);
    EXPECT_EQ(fused.nodes.size(), fuses ? 1u : g.nodes.size()) << form;
    if (fuses) EXPECT_EQ(fused.nodes[0].op_type, "RMSNormalization");
    // (Without keepdims the mean's [rows] broadcasts against x only when rows == 6.)
    const std::vector<std::vector<int64_t>> shapes =
        form == kNoKeepdims ? std::vector<std::vector<int64_t>>{{6, 6}}
                            : std::vector<std::vector<int64_t>>{{3, 6}, {2, 6, 6}};
    for (const auto& shape : shapes) {
      at::Tensor x = at::randn(shape) * 3;
      ExecOptions plain;
      plain.fuse = false;
      at::Tensor want = Executor(m, plain).run({{"x", x}})[0], got = Executor(m).run({{"x", x}})[0];
      ASSERT_EQ(got.sizes(), want.sizes());
      EXPECT_LE(test::relative_max_diff(got, want), 1e-6) << form;
    }
  }
}

// Pow(x, 2.0), how exporters write RMSNorm's square, runs as one multiply: the values (inf and NaN
// included) and the gradient are pow's, and an exponent of more dimensions still broadcasts.
TEST(Exec, PowOfTwoIsASquare) {
  for (const std::vector<int64_t>& two_shape : {std::vector<int64_t>{}, {1}, {1, 1}}) {
    ir::Model m;
    m.ir_version = 8;
    m.opset_import = {{"", 18}};
    ir::Graph& g = m.graph;
    g.inputs.push_back({"x", {ir::DType::kFloat, false, {}, "", ""}, ""});
    g.outputs.push_back({"y", {ir::DType::kFloat, false, {}, "", ""}, ""});
    initializer_adder(g)("two", at::full(two_shape, 2.0f));
    g.nodes = {node("Pow", {"x", "two"}, {"y"})};
    at::Tensor x = at::tensor({-3.0f, 0.5f, INFINITY, -INFINITY, NAN});
    const at::Tensor want = at::pow(x, at::full(two_shape, 2.0f));
    const at::Tensor got = Executor(m).run({{"x", x}})[0];
    ASSERT_EQ(got.sizes(), want.sizes());
    EXPECT_TRUE(at::allclose(got, want, 0, 0, /*equal_nan=*/true)) << got;
    ExecOptions o;
    o.autograd = true;
    at::Tensor xg = at::randn({4, 3}).requires_grad_(true);
    Executor(m, o).run({{"x", xg}})[0].sum().backward();
    EXPECT_TRUE(at::allclose(xg.grad(), 2 * xg.detach())) << two_shape;
  }
}

TEST(Exec, GradientsMatchPyTorch) {
  for (const char* stem : {"mlp.ts", "mlp.dynamo", "small_cnn.preserve"}) {
    std::string name = std::string(stem).substr(0, std::string(stem).find('.'));
    ir::Model m = onnx::load_model(fixture(std::string(stem) + ".onnx"));
    ExecOptions o;
    o.autograd = true;
    Executor exec(m, o);
    at::Tensor x = load_npy(fixture(name + ".input_0.npy"));
    at::Tensor y = exec.run({{"input", x}})[0];
    ASSERT_TRUE(y.requires_grad()) << stem;
    at::Tensor g = load_npy(fixture(name + ".grad_output.npy"));
    (y * g).sum().backward();
    int checked = 0;
    for (auto& [pname, p] : exec.parameters()) {
      fs::path want = fixture(name + ".grad." + pname + ".npy");
      if (!fs::exists(want)) continue;
      ASSERT_TRUE(p.grad().defined()) << stem << " " << pname;
      EXPECT_LE(test::relative_max_diff(p.grad(), load_npy(want.string())), 1e-4)
          << stem << " " << pname;
      ++checked;
    }
    EXPECT_GE(checked, 6) << stem;
  }
}

// Unique under autograd (ATen's unique has no derivative): the values' gradient reaches the
// input at each value's first occurrence, with and without an axis, sorted or not.
TEST(Exec, UniqueIsDifferentiable) {
  for (bool with_axis : {false, true})
    for (int64_t sorted : {0, 1}) {
      ir::Model m = image_model({4, 2});
      std::vector<ir::Attribute> attrs{int_attr("sorted", sorted)};
      if (with_axis) attrs.push_back(int_attr("axis", 0));
      m.graph.nodes = {node("Unique", {"x"}, {"u"}, attrs), node("Mul", {"u", "u"}, {"y"})};
      const at::Tensor x = at::tensor({3.f, 1.f, 2.f, 2.f, 3.f, 1.f, 2.f, 2.f}).reshape({4, 2});
      ExecOptions o;
      o.autograd = true;
      Executor exec(m, o);
      at::Tensor xg = x.clone().requires_grad_(true);
      at::Tensor y = exec.run({{"x", xg}})[0];
      y.sum().backward();
      ASSERT_TRUE(xg.grad().defined());
      // d(u^2)/dx = 2x where x is a value's first occurrence, 0 elsewhere.
      const at::Tensor want =
          with_axis ? at::tensor({6.f, 2.f, 4.f, 4.f, 0.f, 0.f, 0.f, 0.f}).reshape({4, 2})
                    : at::tensor({6.f, 2.f, 4.f, 0.f, 0.f, 0.f, 0.f, 0.f}).reshape({4, 2});
      EXPECT_TRUE(at::equal(xg.grad(), want)) << with_axis << sorted << xg.grad();
      ExecOptions inference;
      EXPECT_TRUE(at::equal(Executor(m, inference).run({{"x", x}})[0], y.detach()));
    }
}

TEST(Exec, TrainingModeUsesBatchStatistics) {
  ir::Model m = onnx::load_model(fixture("small_cnn.preserve.onnx"));
  at::Tensor x = load_npy(fixture("small_cnn.input_0.npy"));
  ExecOptions train;
  train.training = true;
  Executor t(m, train), e(m);
  at::Tensor yt = t.run({{"input", x}})[0], ye = e.run({{"input", x}})[0];
  // The fixture's running statistics are not the batch's: the two modes must differ.
  EXPECT_GT(test::relative_max_diff(yt.detach(), ye), 1e-3);
}

TEST(Exec, ChecksInputsAndOps) {
  ir::Model m = fusable_model();
  Executor exec(m);
  auto err = [&](const NamedTensors& in) { return error_of([&] { exec.run(in); }); };
  EXPECT_NE(err({{"x", at::randn({2, 8, 5, 6})}}).find("expected shape [2,8,6,6]"),
            std::string::npos);
  EXPECT_NE(err({{"x", at::randn({2, 8, 6, 6}, at::kDouble)}}).find("expected float32"),
            std::string::npos);
  EXPECT_NE(err({}).find("missing input 'x'"), std::string::npos);
  EXPECT_NE(err({{"x", at::randn({2, 8, 6, 6})}, {"z", at::randn({1})}}).find("no input named 'z'"),
            std::string::npos);

  m.graph.nodes[2].op_type = "Frobnicate";
  try {
    Executor bad(m);
    FAIL() << "an unsupported op must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("node 'r1': unsupported op 'Frobnicate'"),
              std::string::npos)
        << e.what();
  }
}

// Pruned models run by each sparse kernel (forced) give the dense result: MLP (Gemm), transformer
// encoder (MatMul), MobileNetV2 (pointwise convs with fused ReLU6 and residual adds) and a small
// CNN (3x3 convs through im2col); unstructured and in the blocks of each block format.
TEST(Exec, SparseKernelsRunPrunedModelsLikeDense) {
  setenv("LOPPER_KERNEL_CACHE", "off", 1);
  const std::vector<std::pair<std::string, std::vector<const char*>>> patterns = {
      {"unstructured", {"csr-cols,csr-cols-im2col", "csr-gather", "csr-dot"}},
      {"block:8x1", {"bcsr8x1-rows", "bcsr8x1-cols,bcsr8x1-cols-im2col", "bcsr4x1-rows"}},
      {"block:1x4", {"bcsr1x4-cols,bcsr1x4-cols-im2col"}}};
  for (const char* stem : {"mlp", "transformer_encoder", "mobilenet_v2", "small_cnn"}) {
    for (const auto& [pattern, kernels] : patterns) {
      ir::Model m = onnx::load_model(fixture(std::string(stem) + ".ts.onnx"));
      PruneOptions po;
      po.amount = PruneAmount::parse("0.9");
      parse_prune_pattern(pattern, po);
      prune(m, po);
      NamedTensors feeds = fixture_feeds(m, stem);
      const at::Tensor want = aten_output(m, feeds);
      for (const char* force : kernels) {
        SCOPED_TRACE(std::string(stem) + " " + pattern + " forced " + force);
        Executor exec(m);
        EXPECT_LE(test::relative_max_diff(run_forced(exec, feeds, force), want), 1e-4);
        EXPECT_GT(chosen(exec, [](const std::string& k) { return has(k, "(forced)"); }), 0);
      }
    }
  }
  unsetenv("LOPPER_KERNEL_CACHE");
}

// The bitmask format (the decode regime: a few rows of x) in float32 and bfloat16, unstructured
// 50% and 2:4, forced on the MLP's Gemms (batch 4) and on every MatMul of a LLaMA decoding one
// token with its KV cache as inputs: the result of ATen at the same precision.
TEST(Exec, BitmaskKernelRunsFewRowsInFloatAndBfloat16) {
  setenv("LOPPER_KERNEL_CACHE", "off", 1);
  for (auto [stem, layers] :
       {std::pair<std::string, int>{"mlp.ts", 3}, {"llama_decode.dynamo", 15}})
    for (const char* pattern : {"unstructured", "2:4"}) {
      ir::Model m = onnx::load_model(fixture(stem + ".onnx"));
      PruneOptions po;
      po.amount = PruneAmount::parse("0.5");
      parse_prune_pattern(pattern, po);
      prune(m, po);
      NamedTensors feeds = fixture_feeds(m, stem.substr(0, stem.find('.')));
      for (at::ScalarType precision : {at::kFloat, at::kBFloat16}) {
        SCOPED_TRACE(stem + " " + pattern + " " + c10::toString(precision));
        const at::Tensor want = aten_output(m, feeds, precision);
        ExecOptions eo;
        eo.precision = precision;
        Executor exec(m, eo);
        const at::Tensor got =
            run_forced(exec, feeds, "bitmask,bitmask-8of16,bitmask-panels,bitmask-2of4-panels");
        EXPECT_LE(test::relative_max_diff(got, want), precision == at::kFloat ? 1e-5 : 2e-2);
        EXPECT_EQ(
            chosen(exec,
                   [](const std::string& k) { return has(k, "bitmask") && has(k, "(forced)"); }),
            layers);
        // A bfloat16 2:4 weight runs in panels where the CPU has the bfloat16 dot product.
        const bool panels =
            precision == at::kBFloat16 && std::string(pattern) == "2:4" &&
            kernels::cpu::MaskedWeight::takes_panels(kernels::cpu::active_isa(), true);
        if (panels)
          EXPECT_EQ(chosen(exec, [](const std::string& k) { return has(k, "-2of4-panels"); }),
                    layers);
      }
    }
  unsetenv("LOPPER_KERNEL_CACHE");
}

// A model run on a few rows (a token) and on many (a prompt) keeps a kernel choice for each: the
// bitmask format is a candidate for the few only (and, at 50%, instead of CSR), and each run uses
// its own choice.
TEST(Exec, FewAndManyRowsChooseApart) {
  setenv("LOPPER_KERNEL_CACHE", "off", 1);
  ir::Model m = onnx::load_model(fixture("bert_cls.dynamo.onnx"));  // dynamic batch and sequence
  PruneOptions po;
  po.amount = PruneAmount::parse("0.5");
  prune(m, po);
  auto feeds = [&](int64_t batch, int64_t seq) {
    return NamedTensors{{"input_ids", at::randint(1, 1000, {batch, seq})},
                        {"attention_mask", at::ones({batch, seq}, at::kLong)},
                        {"token_type_ids", at::zeros({batch, seq}, at::kLong)}};
  };
  Executor exec(m);
  ExecOptions plain;
  plain.autograd = true;
  Executor aten(m, plain);
  for (auto [batch, seq] : {std::pair<int64_t, int64_t>{1, 8}, {4, 16}, {1, 8}}) {
    const NamedTensors f = feeds(batch, seq);
    EXPECT_LE(test::relative_max_diff(exec.run(f)[0], aten.run(f)[0].detach()), 1e-4);
  }
  std::map<std::string, std::vector<int64_t>> rows;  // per layer: the rows of each choice
  for (const auto& d : exec.kernel_decisions()) {
    rows[d.node].push_back(d.input_shape.empty() ? 0 : d.input_shape[0]);
    bool bitmask = false, csr = false;
    for (const auto& [name, ms] : d.timings) {
      bitmask |= name.rfind("bitmask", 0) == 0;
      csr |= name.find("csr") != std::string::npos;
    }
    EXPECT_EQ(bitmask, d.input_shape[0] <= 16) << d.node;
    // At 50%, CSR moves more bytes than the bitmask format: not offered for a few rows.
    EXPECT_EQ(csr, d.input_shape[0] > 16) << d.node;
  }
  // The encoder's layers see 8 rows, then 64 (a choice each); the pooler and the classifier see
  // the batch, 1 then 4 (both a few: one choice).
  int apart = 0;
  for (const auto& [node, r] : rows) {
    if (r.size() == 2)
      EXPECT_EQ(r, (std::vector<int64_t>{8, 64})) << node;
    else
      EXPECT_EQ(r, std::vector<int64_t>{1}) << node;
    apart += r.size() == 2;
  }
  EXPECT_GE(apart, 8);
  unsetenv("LOPPER_KERNEL_CACHE");
}

// Kernels are timed with the weights out of the caches when the model's weights outgrow the
// last-level cache (a decoding LLM: each layer's weights come from memory at every step), in the
// cache otherwise; the decision says which.
// The kernel kept from the timings: the fastest, or on the CPU a kernel of lopper's own (its
// direct, GEMV and chain kernels, and its sparse formats too) within 10% of a faster ATen or
// oneDNN one; between lopper's own kernels the fastest; on a GPU, or where the candidates are
// timed alike (prefer_own off), the fastest.
TEST(Exec, KernelKeptIsTheFastestOrLoppersOwnWithinItsMargin) {
  using ops::keep_of;
  using V = std::vector<std::string>;
  EXPECT_EQ(keep_of(V{"aten", "onednn", "lopper-gemv"}, {1.0, 0.9, 0.95}, false, true), 2u);
  EXPECT_EQ(keep_of(V{"aten", "onednn", "lopper-gemv"}, {1.0, 0.9, 1.0}, false, true), 1u);
  // a sparse format is lopper's own: kept within 10% of oneDNN
  EXPECT_EQ(keep_of(V{"onednn", "bitmask"}, {1.0, 1.05}, false, true), 1u);
  EXPECT_EQ(keep_of(V{"onednn", "csr-cols-bf16"}, {1.0, 1.05}, false, true), 1u);
  // between two of lopper's own, the faster: no margin for one over the other
  EXPECT_EQ(keep_of(V{"aten", "lopper-gemv", "bitmask"}, {2.0, 1.09, 1.0}, false, true), 2u);
  EXPECT_EQ(keep_of(V{"onednn", "lopper-gemv", "bitmask"}, {1.0, 1.05, 1.08}, false, true), 1u);
  EXPECT_EQ(keep_of(V{"onednn-conv", "lopper-direct"}, {1.0, 1.05}, true, true), 0u);  // GPU
  EXPECT_EQ(keep_of(V{"layer-by-layer", "lopper-chain"}, {1.0, 1.05}, false, false), 0u);
  EXPECT_TRUE(ops::library_kernel("onednn-linear"));
  EXPECT_FALSE(ops::library_kernel("bitmask-8of16"));
}

// A layer's chosen kernel and its runner-up take turns on its next calls in the model, each call
// timed where it runs, and the faster there is kept (InModelTrial): every call's output is right
// during the trial; the decision gives both medians and names the faster one chosen; a model loaded
// again takes the settled choice from the cache without a new trial. LOPPER_KERNEL_TRIAL=all tries
// every runner-up (the test cannot make two kernels' lone times close), =off none. A convolution,
// and a linear layer over 40 rows (a few rows make a choice of their own).
TEST(Exec, RunnerUpTriedInTheModelAndTheFasterThereKept) {
  setenv("LOPPER_KERNEL_CACHE", "off", 1);  // the choices kept in this process only
  setenv("LOPPER_CHOICE_BUSY", "0", 1);     // every timing taken as idle: cached
  constexpr int kCalls = 1 + 2 * ops::InModelTrial::kTrialCalls;  // the choice, then the trial
  for (const bool conv : {true, false})
    for (const char* mode : {"off", "all"}) {
      SCOPED_TRACE(std::string(conv ? "conv " : "linear ") + mode);
      setenv("LOPPER_KERNEL_TRIAL", mode, 1);
      // a weight of this run's own: the kernel cache (a file when the process's first test found
      // it on) may hold a settled trial of any weight an earlier run drew
      at::manual_seed(std::random_device{}());
      ir::Model m =
          image_model(conv ? std::vector<int64_t>{1, 16, 28, 28} : std::vector<int64_t>{40, 64});
      auto init = initializer_adder(m.graph);
      init("w", conv ? at::randn({24, 16, 3, 3}) * 0.2 : at::randn({24, 64}) * 0.2);
      init("b", at::randn({24}));
      m.graph.nodes = {conv
                           ? node("Conv", {"x", "w", "b"}, {"c"}, {ints_attr("pads", {1, 1, 1, 1})})
                           : node("Gemm", {"x", "w", "b"}, {"c"}, {int_attr("transB", 1)}),
                       node("Relu", {"c"}, {"y"})};
      const at::Tensor x = conv ? at::randn({1, 16, 28, 28}) : at::randn({40, 64});
      const at::Tensor& w = m.graph.initializers[0].value;
      const at::Tensor& b = m.graph.initializers[1].value;
      const at::Tensor want = at::relu(conv ? at::conv2d(x, w, b, 1, 1) : at::linear(x, w, b));
      Executor exec(m);
      for (int i = 0; i < kCalls; ++i) {
        ASSERT_LE(test::relative_max_diff(exec.run({{"x", x}})[0], want), 1e-5) << "call " << i;
        // under way from the choice until the trial's last call
        if (std::string(mode) == "all" && i + 1 < kCalls)
          EXPECT_TRUE(exec.kernel_decisions()[0].in_trial) << "call " << i;
      }
      const std::vector<KernelDecision> d = exec.kernel_decisions();
      ASSERT_EQ(d.size(), 1u);
      ASSERT_GE(d[0].timings.size(), 2u);
      EXPECT_FALSE(d[0].in_trial);
      if (std::string(mode) == "off") {
        EXPECT_TRUE(d[0].in_model.empty());
        continue;
      }
      ASSERT_EQ(d[0].in_model.size(), 2u);
      const auto& [first, first_ms] = d[0].in_model[0];
      const auto& [second, second_ms] = d[0].in_model[1];
      EXPECT_NE(first, second);
      EXPECT_GT(first_ms, 0);
      EXPECT_GT(second_ms, 0);
      EXPECT_EQ(d[0].chosen, second_ms < first_ms ? second : first);
      // Loaded again: the settled choice and its medians from the cache, no new trial.
      Executor again(m);
      for (int i = 0; i < kCalls; ++i)
        ASSERT_LE(test::relative_max_diff(again.run({{"x", x}})[0], want), 1e-5) << "call " << i;
      const std::vector<KernelDecision> d2 = again.kernel_decisions();
      ASSERT_EQ(d2.size(), 1u);
      EXPECT_TRUE(d2[0].cached);
      EXPECT_EQ(d2[0].chosen, d[0].chosen);
      auto sorted = [](std::vector<std::pair<std::string, double>> v) {
        std::sort(v.begin(), v.end());
        return v;
      };
      EXPECT_EQ(sorted(d2[0].in_model), sorted(d[0].in_model));  // the cache keeps them by name
    }
  unsetenv("LOPPER_KERNEL_TRIAL");
  unsetenv("LOPPER_CHOICE_BUSY");
  unsetenv("LOPPER_KERNEL_CACHE");
}

// An inverted residual fused to a ConvChain: lopper's one pass over the rows and the body layer by
// layer take turns in the model the same way (timed alone, the layers' expanded activation stays
// in the caches between them, in the model it does not); the output is right at every call,
// during the trial and after it, when what the kept way does not run is freed.
TEST(Exec, ConvChainAndItsLayersTakeTurnsInTheModel) {
  setenv("LOPPER_KERNEL_CACHE", "off", 1);
  setenv("LOPPER_CHOICE_BUSY", "0", 1);
  setenv("LOPPER_KERNEL_TRIAL", "all", 1);
  at::manual_seed(std::random_device{}());
  ir::Model m = image_model({1, 16, 28, 28});
  auto init = initializer_adder(m.graph);
  init("we", at::randn({64, 16, 1, 1}) * 0.2);
  init("be", at::randn({64}));
  init("wd", at::randn({64, 1, 3, 3}) * 0.3);
  init("bd", at::randn({64}));
  init("wp", at::randn({16, 64, 1, 1}) * 0.1);
  m.graph.nodes = {node("Conv", {"x", "we", "be"}, {"e"}),
                   node("Relu", {"e"}, {"er"}),
                   node("Conv", {"er", "wd", "bd"}, {"d"},
                        {ints_attr("pads", {1, 1, 1, 1}), int_attr("group", 64)}),
                   node("Relu", {"d"}, {"dr"}),
                   node("Conv", {"dr", "wp"}, {"p"}),
                   node("Add", {"p", "x"}, {"y"})};
  const at::Tensor x = at::randn({1, 16, 28, 28});
  const auto& w = m.graph.initializers;
  const at::Tensor e = at::relu(at::conv2d(x, w[0].value, w[1].value));
  const at::Tensor d = at::relu(at::conv2d(e, w[2].value, w[3].value, 1, 1, 1, 64));
  const at::Tensor want = at::conv2d(d, w[4].value) + x;
  constexpr int kCalls = 1 + 2 * ops::InModelTrial::kTrialCalls + 2;  // choice, trial, after
  Executor exec(m);
  auto chain_decision = [&] {
    for (const KernelDecision& k : exec.kernel_decisions())
      if (k.op == "ConvChain") return k;
    ADD_FAILURE() << "no decision for the chain";
    return KernelDecision{};
  };
  for (int i = 0; i < kCalls; ++i) {
    ASSERT_LE(test::relative_max_diff(exec.run({{"x", x}})[0], want), 1e-5) << "call " << i;
    if (i + 3 < kCalls) EXPECT_TRUE(chain_decision().in_trial) << "call " << i;
  }
  const KernelDecision k = chain_decision();
  EXPECT_FALSE(k.in_trial);
  ASSERT_EQ(k.in_model.size(), 2u);
  std::vector<std::string> ways{k.in_model[0].first, k.in_model[1].first};
  std::sort(ways.begin(), ways.end());
  EXPECT_EQ(ways, (std::vector<std::string>{"layer-by-layer", "lopper-chain"}));
  EXPECT_EQ(k.chosen, k.in_model[1].second < k.in_model[0].second ? k.in_model[1].first
                                                                  : k.in_model[0].first);
  unsetenv("LOPPER_KERNEL_TRIAL");
  unsetenv("LOPPER_CHOICE_BUSY");
  unsetenv("LOPPER_KERNEL_CACHE");
}

// Winograd's F(4x4, 3x3) is offered where its 36 transformed float32 weight matrices are read for
// enough tiles: 16 (a 14x14 map of one image) in float32; 32 in bf16 where the other kernels run
// on the CPU's bfloat16 dot product (twice float32's rate on half the weight's bytes), so a 14x14
// map is not offered it there, and of at least 4096 tiles x outputs: a 28x28 map (49 tiles) of 96
// outputs is, of 32 not (DenseNet's 3x3 layers lost to the direct kernel in the model), a 56x56
// one (196 tiles) of 32 is.
TEST(Exec, WinogradOfferedWhereItPaysInFloatAndBfloat16) {
  setenv("LOPPER_KERNEL_CACHE", "off", 1);
  const bool dot =
      kernels::cpu::bf16_dot_supported(kernels::cpu::active_isa()) && ops::onednn::bf16_native();
  for (const int64_t side : {14, 28, 56})
    for (const int64_t k : {32, 96})
      for (const bool bf16 : {false, true}) {
        SCOPED_TRACE(std::to_string(side) + " -> " + std::to_string(k) +
                     (bf16 ? " bf16" : " fp32"));
        at::manual_seed(3);
        ir::Model m = image_model({1, 16, side, side});
        auto init = initializer_adder(m.graph);
        init("w", at::randn({k, 16, 3, 3}) * 0.2);
        init("b", at::randn({k}));
        m.graph.nodes = {node("Conv", {"x", "w", "b"}, {"c"}, {ints_attr("pads", {1, 1, 1, 1})}),
                         node("Relu", {"c"}, {"y"})};
        ExecOptions eo;
        if (bf16) eo.precision = at::kBFloat16;
        Executor exec(m, eo);
        const at::Tensor x = at::randn({1, 16, side, side});
        const at::Tensor want = at::relu(
            at::conv2d(x, m.graph.initializers[0].value, m.graph.initializers[1].value, 1, 1));
        EXPECT_LE(test::relative_max_diff(exec.run({{"x", x}})[0], want), bf16 ? 2e-2 : 1e-5);
        const std::vector<KernelDecision> decisions = exec.kernel_decisions();  // a copy
        ASSERT_EQ(decisions.size(), 1u);
        bool offered = false;
        for (const auto& [name, ms] : decisions[0].timings) offered |= name == "lopper-winograd";
        // without a native bf16 path a bf16 model's convolution runs ATen's op: no candidates
        if (bf16 && !ops::onednn::bf16_native()) continue;
        // bf16 on the dot product: maps of 32 tiles or more, 4096 tiles x outputs or more
        EXPECT_EQ(offered, (side == 28 && k == 96) || side == 56 || !bf16 || !dot);
      }
  unsetenv("LOPPER_KERNEL_CACHE");
}

TEST(Exec, KernelsTimedColdWhenTheWeightsOutgrowTheCache) {
  const int64_t llc = last_level_cache_bytes();
  if (llc <= 0 || llc > (int64_t{64} << 20))
    GTEST_SKIP() << "last-level cache " << llc << " bytes: a bigger model than a test should load";
  setenv("LOPPER_KERNEL_CACHE", "off", 1);
  for (const int64_t bytes : {llc / 4, llc + (int64_t{4} << 20)}) {
    const int64_t n = bytes / (4 * 1024);
    ir::Model m;
    m.ir_version = 8;
    m.opset_import = {{"", 17}};
    m.graph.inputs.push_back({"x", {ir::DType::kFloat, false, {{1, ""}, {1024, ""}}, "", ""}, ""});
    m.graph.outputs.push_back({"y", {ir::DType::kFloat, false, {}, "", ""}, ""});
    at::Tensor w = at::randn({1024, n});
    m.graph.initializers.push_back({"w", w * (at::rand({1024, n}) > 0.5), "", false});
    m.graph.nodes = {node("MatMul", {"x", "w"}, {"y"})};
    Executor exec(m);
    at::Tensor x = at::randn({1, 1024});
    EXPECT_LE(test::relative_max_diff(exec.run({{"x", x}})[0],
                                      at::matmul(x, m.graph.initializers[0].value)),
              1e-4);
    ASSERT_EQ(exec.kernel_decisions().size(), 1u);
    const KernelDecision d = exec.kernel_decisions()[0];  // a copy: the vector is a temporary
    EXPECT_GE(d.timings.size(), 2u);
    EXPECT_EQ(d.cold, bytes > llc) << bytes << " bytes of weights, " << llc << " of cache";
  }
  unsetenv("LOPPER_KERNEL_CACHE");
}

namespace {

// The activations oneDNN's direct primitives compute inside (slope 0.1 for the leaky ReLU), each
// with ATen's form of it.
std::vector<std::pair<dnnl::Eltwise, std::function<at::Tensor(const at::Tensor&)>>>
direct_activations() {
  using E = dnnl::Eltwise;
  return {{E::kNone, [](const at::Tensor& t) { return t; }},
          {E::kLeakyRelu, [](const at::Tensor& t) { return at::leaky_relu(t, 0.1); }},
          {E::kLogistic, [](const at::Tensor& t) { return at::sigmoid(t); }},
          {E::kTanh, [](const at::Tensor& t) { return at::tanh(t); }},
          {E::kGeluErf, [](const at::Tensor& t) { return at::gelu(t); }},
          {E::kGeluTanh, [](const at::Tensor& t) { return at::gelu(t, "tanh"); }},
          {E::kHardswish, [](const at::Tensor& t) { return at::hardswish(t); }},
          {E::kSwish, [](const at::Tensor& t) { return at::silu(t); }}};
}

// A direct primitive's output `y` against ATen's float32 `want`: NaN exactly where it has NaN, the
// finite values to bf16's or float32's tolerance.
void expect_direct_result(const at::Tensor& y, const at::Tensor& want, bool bf16) {
  const at::Tensor got = y.to(at::kFloat);
  EXPECT_TRUE(at::equal(at::isnan(got), at::isnan(want))) << "NaN where ATen has none, or not";
  const at::Tensor ok = at::isfinite(want);
  EXPECT_LE(test::relative_max_diff(got.masked_select(ok), want.masked_select(ok)),
            bf16 ? 2e-2 : 1e-5);
}

}  // namespace

// oneDNN's convolution primitive called directly (dnnl/primitives.h) against ATen's convolution:
// plain, strided, grouped, depthwise, dilated and first layers; with and without bias and residual;
// every activation it computes inside; float32 and bf16; a NaN in the input comes out where ATen's
// gives one (and only there). Skipped where oneDNN's library is not at hand.
TEST(DnnlConv, MatchesAtenOnEveryShapeTypeAndActivation) {
  if (!dnnl::available()) GTEST_SKIP() << dnnl::unavailable_reason();
  at::manual_seed(29);
  struct Case {
    int64_t n, c, h, w, k, kh, kw, s, p, d, groups;
  };
  const Case cases[] = {{2, 8, 9, 7, 16, 3, 3, 1, 1, 1, 1},
                        {1, 16, 12, 12, 24, 1, 1, 1, 0, 1, 1},
                        {1, 12, 11, 10, 12, 3, 3, 2, 1, 1, 12},
                        {2, 6, 10, 10, 9, 3, 3, 1, 2, 2, 3},
                        {1, 3, 15, 15, 8, 7, 7, 2, 3, 1, 1}};
  const auto acts = direct_activations();
  int i = 0;
  // bf16 where lopper offers it: a CPU with bf16 arithmetic (ops::onednn::bf16_native)
  for (bool bf16 : {false, ops::onednn::bf16_native()})
    for (const Case& k : cases)
      for (const auto& [act, ref] : acts) {
        ++i;
        const bool bias = i % 2, residual = i % 3 == 0;
        const auto type = bf16 ? at::kBFloat16 : at::kFloat;
        dnnl::ConvSpec s;
        s.n = k.n, s.c = k.c, s.h = k.h, s.w = k.w, s.k = k.k, s.kh = k.kh, s.kw = k.kw;
        s.sh = s.sw = k.s, s.ph = s.pw = k.p, s.dh = s.dw = k.d, s.groups = k.groups;
        s.bf16 = bf16, s.bias = bias, s.residual = residual, s.act = act, s.alpha = 0.1f;
        SCOPED_TRACE(::testing::Message()
                     << "case " << i << (bf16 ? " bf16" : " f32") << " c " << k.c << " k " << k.k
                     << " groups " << k.groups << " act " << int(act));
        const at::Tensor w = (at::randn({k.k, k.c / k.groups, k.kh, k.kw}) * 0.3).to(type);
        const at::Tensor b = at::randn({k.k}).to(type);
        at::Tensor x = at::randn({k.n, k.c, k.h, k.w});
        if (!bf16) x[0][0][k.h / 2][k.w / 2] = NAN;  // one value: a patch of the output NaN
        x = x.to(type).contiguous(at::MemoryFormat::ChannelsLast);
        const std::vector<int64_t> out = {k.n, k.k, s.out_h(), s.out_w()};
        const at::Tensor r = at::randn(out).to(type).contiguous(at::MemoryFormat::ChannelsLast);
        const dnnl::Conv conv(s, w.data_ptr(), b.data_ptr());
        at::Tensor y = at::empty(out, x.options().memory_format(at::MemoryFormat::ChannelsLast));
        at::Tensor scratch = at::empty({int64_t(conv.scratchpad_bytes()) + 1}, at::kByte);
        conv.run(x.data_ptr(), residual ? r.data_ptr() : nullptr, y.data_ptr(), scratch.data_ptr());
        at::Tensor want =
            at::conv2d(x.to(at::kFloat), w.to(at::kFloat), bias ? b.to(at::kFloat) : at::Tensor(),
                       k.s, k.p, k.d, k.groups);
        if (residual) want = want + r.to(at::kFloat);
        want = ref(want);
        expect_direct_result(y, want, bf16);
      }
}

// oneDNN's matrix-product primitive called directly against ATen's linear: one row (a decoded
// token), a few and a prompt's many; with and without bias; every activation it computes inside;
// float32 and bf16; a NaN in the input comes out only in its row.
TEST(DnnlLinear, MatchesAtenOnEveryShapeTypeAndActivation) {
  if (!dnnl::available()) GTEST_SKIP() << dnnl::unavailable_reason();
  at::manual_seed(31);
  const auto acts = direct_activations();
  int i = 0;
  for (bool bf16 : {false, ops::onednn::bf16_native()})
    for (int64_t m : {1, 5, 128})
      for (const auto& [act, ref] : acts) {
        ++i;
        const auto type = bf16 ? at::kBFloat16 : at::kFloat;
        dnnl::LinearSpec s;
        s.m = m, s.k = 40 + i, s.n = 24 + 3 * i, s.bf16 = bf16, s.bias = i % 2, s.act = act;
        s.alpha = 0.1f;
        SCOPED_TRACE(::testing::Message() << "case " << i << (bf16 ? " bf16" : " f32") << " m " << m
                                          << " act " << int(act));
        const at::Tensor w = (at::randn({s.n, s.k}) * 0.3).to(type);
        const at::Tensor b = at::randn({s.n}).to(type);
        at::Tensor x = at::randn({m, s.k});
        if (!bf16 && m > 1) x[m - 1][s.k / 2] = NAN;  // the last row NaN
        x = x.to(type);
        const dnnl::Linear lin(s, w.data_ptr(), b.data_ptr());
        at::Tensor y = at::empty({m, s.n}, x.options());
        at::Tensor scratch = at::empty({int64_t(lin.scratchpad_bytes()) + 1}, at::kByte);
        lin.run(x.data_ptr(), y.data_ptr(), scratch.data_ptr());
        const at::Tensor want = ref(at::linear(x.to(at::kFloat), w.to(at::kFloat),
                                               s.bias ? b.to(at::kFloat) : at::Tensor()));
        expect_direct_result(y, want, bf16);
      }
}

// A residual Add and the LayerNormalization after it, fused (AddLayerNormalization, one pass over
// each row), give the unfused nodes' result bit for bit in float32 and in bf16 (the sum rounded to
// bf16 first, as the Add rounds it): post-norm, and pre-norm with the sum a graph output too; a
// NaN stays in its row; rows of 40 (a vector and a part) on 1 and 2 threads; a second run (the
// bf16 scale and bias widened once, at the first).
TEST(Exec, AddLayerNormMatchesTheUnfusedNodes) {
  at::manual_seed(47);
  for (bool pre_norm : {false, true}) {
    ir::Model m = image_model({3, 7, 40});
    m.graph.inputs.push_back(m.graph.inputs[0]);
    m.graph.inputs.back().name = "r";
    name_outputs(m.graph, pre_norm ? 2 : 1);
    auto init = initializer_adder(m.graph);
    init("gamma", at::rand({40}) + 0.5);
    init("beta", at::randn({40}));
    m.graph.nodes = {node("Add", {"x", "r"}, {"s"}),
                     node("LayerNormalization", {"s", "gamma", "beta"}, {"y1"})};
    if (pre_norm) m.graph.nodes.push_back(node("Identity", {"s"}, {"y2"}));
    at::Tensor x = at::randn({3, 7, 40}) * 3;
    x[1][2][5] = NAN;
    const at::Tensor r = at::randn({3, 7, 40});
    for (auto precision : {at::kFloat, at::kBFloat16})
      for (int threads : {1, 2}) {
        SCOPED_TRACE(::testing::Message() << (pre_norm ? "pre-norm " : "post-norm ")
                                          << c10::toString(precision) << " " << threads);
        const int before = at::get_num_threads();
        at::set_num_threads(threads);
        ExecOptions fused, plain;
        fused.precision = plain.precision = precision;
        plain.fuse = false;
        Executor a(m, fused), b(m, plain);
        int nodes = 0;
        for (const auto& n : exec::fuse_for_inference(m.graph, 17).nodes)
          nodes += n.op_type == "AddLayerNormalization";
        EXPECT_EQ(nodes, 1);
        a.run({{"x", x * 2}, {"r", r}});  // the second run reads what the first kept
        const auto got = a.run({{"x", x}, {"r", r}}), want = b.run({{"x", x}, {"r", r}});
        ASSERT_EQ(got.size(), want.size());
        for (size_t i = 0; i < got.size(); ++i) {
          EXPECT_TRUE(at::equal(at::isnan(got[i]), at::isnan(want[i]))) << "output " << i;
          EXPECT_TRUE(at::equal(at::nan_to_num(got[i]), at::nan_to_num(want[i]))) << "output " << i;
        }
        EXPECT_TRUE(at::isnan(got[0][1][2]).all().item<bool>());  // the NaN's row
        EXPECT_FALSE(at::isnan(got[0][1][3]).any().item<bool>());
        at::set_num_threads(before);
      }
  }
}

// An attention's two products on oneDNN's primitives (dnnl/primitives.h) with lopper's softmax
// between (kernels/cpu/rows.h), against ATen: many heads of a row, one query row, keys more than
// queries, head sizes of Q and V apart; float32 and bf16 (bf16: the probabilities rounded once);
// a NaN in one query comes out in that query's row of its head only.
TEST(DnnlAttention, ProductsAndSoftmaxMatchAten) {
  if (!dnnl::available()) GTEST_SKIP() << dnnl::unavailable_reason();
  at::manual_seed(41);
  struct Case {
    int64_t heads, sq, sk, d, dv;
  };
  const Case cases[] = {{12, 32, 32, 16, 16}, {2, 1, 13, 8, 8}, {3, 7, 19, 5, 6}};
  for (bool bf16 : {false, ops::onednn::bf16_native()})
    for (const Case& k : cases) {
      SCOPED_TRACE(::testing::Message() << (bf16 ? "bf16" : "f32") << " heads " << k.heads << " sq "
                                        << k.sq << " sk " << k.sk);
      const auto type = bf16 ? at::kBFloat16 : at::kFloat;
      dnnl::AttentionSpec s;
      s.heads = k.heads, s.sq = k.sq, s.sk = k.sk, s.d = k.d, s.dv = k.dv, s.bf16 = bf16;
      // packed: a row's heads side by side
      at::Tensor q = at::randn({k.sq, k.heads, k.d});
      if (!bf16) q[k.sq - 1][0][0] = NAN;
      q = q.to(type);
      const at::Tensor kk = at::randn({k.sk, k.heads, k.d}).to(type);
      const at::Tensor v = at::randn({k.sk, k.heads, k.dv}).to(type);
      const float scale = 0.3f;
      const dnnl::AttentionProducts d(s);
      at::Tensor scores = at::empty({k.heads, k.sq, k.sk});
      at::Tensor scratch = at::empty({int64_t(d.scratchpad_bytes()) + 1}, at::kByte);
      d.scores(q.data_ptr(), kk.data_ptr(), scores.data_ptr<float>(), scratch.data_ptr());
      const at::Tensor qh = q.to(at::kFloat).transpose(0, 1),
                       kh = kk.to(at::kFloat).transpose(0, 1);
      const at::Tensor want_scores = at::matmul(qh, kh.transpose(1, 2));
      expect_direct_result(scores, want_scores, false);
      at::Tensor probs = bf16 ? at::empty({k.heads, k.sq, k.sk}, at::kBFloat16) : scores;
      kernels::cpu::softmax_rows(scores.data_ptr<float>(), k.heads * k.sq, k.sk, scale,
                                 bf16 ? reinterpret_cast<uint16_t*>(probs.data_ptr()) : nullptr);
      at::Tensor y = at::empty({k.sq, k.heads, k.dv}, type);
      d.output(probs.data_ptr(), v.data_ptr(), y.data_ptr(), scratch.data_ptr());
      const at::Tensor want =
          at::matmul(at::softmax(want_scores * scale, -1), v.to(at::kFloat).transpose(0, 1));
      expect_direct_result(y.transpose(0, 1), want, bf16);
    }
}

// An unmasked attention forced onto oneDNN's products (LOPPER_FORCE_KERNEL=onednn-direct) gives
// ATen's result for each layout of Q, K and V the graph can hand it: the head views of one fused
// projection (rows copied), per-head contiguous tensors (ATen's copy), and a row's heads side by
// side (read as they are); the token count changes from run to run (one set of primitives per
// shape, the last four kept).
TEST(Exec, AttentionOnOneDnnFollowsLayoutAndShape) {
  if (!dnnl::available()) GTEST_SKIP() << dnnl::unavailable_reason();
  at::manual_seed(43);
  setenv("LOPPER_FORCE_KERNEL", "onednn-direct", 1);
  setenv("LOPPER_KERNEL_CACHE", "off", 1);
  for (int layout = 0; layout < 3; ++layout) {
    SCOPED_TRACE(::testing::Message() << "layout " << layout);
    // 0: x [1, tokens, 3 x 2 heads x 6]; 1: x [2, 3 heads, tokens, 8]; 2: x [tokens, 2 heads, 6]
    ir::Model m = image_model(layout == 0   ? std::vector<int64_t>{1, -1, 36}
                              : layout == 1 ? std::vector<int64_t>{2, 3, -1, 8}
                                            : std::vector<int64_t>{-1, 2, 6});
    for (auto& dim : m.graph.inputs[0].type.dims)
      if (!dim.is_static()) dim.param = "tokens";
    ir::Graph& g = m.graph;
    auto init = initializer_adder(g);
    init("shape", at::tensor({1, -1, 3, 2, 6}, at::kLong));
    for (int i = 0; i < 3; ++i) init("i" + std::to_string(i), at::scalar_tensor(i, at::kLong));
    if (layout == 0)  // as torch exports MultiheadAttention: Gathers of one transposed projection
      g.nodes = {node("Reshape", {"x", "shape"}, {"r"}),
                 node("Transpose", {"r"}, {"t"}, {ints_attr("perm", {2, 0, 3, 1, 4})}),
                 node("Gather", {"t", "i0"}, {"q"}),
                 node("Gather", {"t", "i1"}, {"k"}),
                 node("Gather", {"t", "i2"}, {"v"}),
                 node("Transpose", {"k"}, {"kt"}, {ints_attr("perm", {0, 1, 3, 2})})};
    else if (layout == 1)
      g.nodes = {node("Identity", {"x"}, {"q"}), node("Identity", {"x"}, {"v"}),
                 node("Transpose", {"x"}, {"kt"}, {ints_attr("perm", {0, 1, 3, 2})})};
    else
      g.nodes = {node("Transpose", {"x"}, {"q"}, {ints_attr("perm", {1, 0, 2})}),
                 node("Identity", {"q"}, {"v"}),
                 node("Transpose", {"x"}, {"kt"}, {ints_attr("perm", {1, 2, 0})})};
    g.nodes.push_back(node("MatMul", {"q", "kt"}, {"s"}));
    g.nodes.push_back(node("Softmax", {"s"}, {"p"}));
    g.nodes.push_back(node("MatMul", {"p", "v"}, {"y"}));
    Executor e(m);
    for (int64_t tokens : {7, 1, 9, 3, 5, 7}) {
      SCOPED_TRACE(::testing::Message() << tokens << " tokens");
      at::Tensor x, q, kt, v;
      if (layout == 0) {
        x = at::randn({1, tokens, 36});
        const at::Tensor t = x.reshape({1, tokens, 3, 2, 6}).permute({2, 0, 3, 1, 4});
        q = t[0], kt = t[1].transpose(-1, -2), v = t[2];
      } else if (layout == 1) {
        x = at::randn({2, 3, tokens, 8});
        q = v = x, kt = x.transpose(-1, -2);
      } else {
        x = at::randn({tokens, 2, 6});
        q = v = x.permute({1, 0, 2}), kt = x.permute({1, 2, 0});
      }
      const at::Tensor want = at::matmul(at::softmax(at::matmul(q, kt), -1), v);
      EXPECT_LE(test::relative_max_diff(e.run({{"x", x}})[0], want), 1e-5);
    }
    EXPECT_EQ(chosen(e, [](const std::string& k) { return k == "onednn-direct (forced)"; }), 1);
    if (layout != 1) continue;
    // Past 64 MB of scores (6 heads of 1700 x 1700 tokens: 66 MB) oneDNN's route, which holds
    // them all at once, is not taken: a later, longer input runs lopper's kernel, and a first one
    // does not offer it, saying why.
    const at::Tensor x = at::randn({2, 3, 1700, 8});
    const at::Tensor want = at::matmul(at::softmax(at::matmul(x, x.transpose(-1, -2)), -1), x);
    EXPECT_LE(test::relative_max_diff(e.run({{"x", x}})[0], want), 1e-5);
    Executor first_long(m);
    EXPECT_LE(test::relative_max_diff(first_long.run({{"x", x}})[0], want), 1e-5);
    const std::vector<KernelDecision> d = first_long.kernel_decisions();
    ASSERT_EQ(d.size(), 1u);
    EXPECT_EQ(d[0].chosen, "lopper-attention");
    ASSERT_EQ(d[0].refused.size(), 1u);
    EXPECT_EQ(d[0].refused[0], "onednn-direct: every head's scores (66 MB) at once");
  }
  unsetenv("LOPPER_FORCE_KERNEL");
  unsetenv("LOPPER_KERNEL_CACHE");
}

// A layer on oneDNN's direct primitives keeps one primitive per input shape (the last four): a
// dynamic batch and map size run 1, 2, 1, 3, 5, 6 and 2 images again (the first shapes evicted and
// made anew), convolutions with a residual and ReLU6, and the classifier's matrix product, each
// against ATen's ops.
TEST(Exec, DirectPrimitivesFollowTheInputShape) {
  if (!dnnl::available()) GTEST_SKIP() << dnnl::unavailable_reason();
  at::manual_seed(37);
  ir::Model m = image_model({-1, 8, -1, -1});
  ir::Graph& g = m.graph;
  for (auto& d : g.inputs[0].type.dims)
    if (!d.is_static()) d.param = "d";
  g.inputs[0].type.dims[0].param = "n";
  auto init = initializer_adder(g);
  init("w1", at::randn({8, 8, 3, 3}) * 0.2);
  init("b1", at::randn({8}));
  init("w2", at::randn({12, 8, 1, 1}) * 0.3);
  init("wl", at::randn({12, 5}));
  init("lo", at::scalar_tensor(0.f));
  init("hi", at::scalar_tensor(6.f));
  g.nodes = {
      node("Conv", {"x", "w1", "b1"}, {"c1"}, {ints_attr("pads", {1, 1, 1, 1})}),
      node("Add", {"c1", "x"}, {"s"}),
      node("Clip", {"s", "lo", "hi"}, {"r"}),
      node("Conv", {"r", "w2"}, {"c2"}),
      node("GlobalAveragePool", {"c2"}, {"p"}),
      node("Flatten", {"p"}, {"f"}),
      node("MatMul", {"f", "wl"}, {"y"}),
  };
  auto w = [&](const char* n) { return g.find_initializer(n)->value; };
  setenv("LOPPER_FORCE_KERNEL", "onednn-direct", 1);
  setenv("LOPPER_KERNEL_CACHE", "off", 1);
  Executor e(m);
  for (int64_t n : {1, 2, 1, 3, 5, 6, 2}) {
    SCOPED_TRACE(::testing::Message() << n << " images");
    const at::Tensor x = at::randn({n, 8, 5 + n, 7});
    const at::Tensor r = at::clamp(at::conv2d(x, w("w1"), w("b1"), 1, 1) + x, 0, 6);
    const at::Tensor want = at::matmul(at::conv2d(r, w("w2")).mean({2, 3}), w("wl"));
    EXPECT_LE(test::relative_max_diff(e.run({{"x", x}})[0], want), 1e-5);
  }
  EXPECT_EQ(chosen(e, [](const std::string& k) { return starts_with(k, "onednn-direct"); }), 3);
  unsetenv("LOPPER_FORCE_KERNEL");
  unsetenv("LOPPER_KERNEL_CACHE");
}

// lopper's dense kernel runs a product of many rows as a 1x1 convolution over a map of those rows:
// forced, in float32 and (on a CPU with the bfloat16 dot product) bf16, it gives ATen's result on
// 18, 128 and 198 rows (whole and partial tiles of rows) of one layer, a bias and GELU fused into
// a 96 -> 1000 product (a partial block of outputs) and ReLU after a 1000 -> 40 one (a single
// partial block); a NaN row stays NaN through the ReLU, the other rows are untouched by it. A few
// rows (a decoded token) are not its: their layers keep their own choice.
TEST(Exec, DenseRowsKernelMatchesAten) {
  setenv("LOPPER_KERNEL_CACHE", "off", 1);
  at::manual_seed(41);
  for (at::ScalarType precision : {at::kFloat, at::kBFloat16}) {
    const bool bf16 = precision == at::kBFloat16;
    if (bf16 && !kernels::cpu::bf16_dot_supported(kernels::cpu::active_isa())) continue;
    SCOPED_TRACE(bf16 ? "bf16" : "fp32");
    ir::Model m = image_model({2, -1, 96});
    m.opset_import = {{"", 20}};  // Gelu
    m.graph.inputs[0].type.dims[1].param = "s";
    auto init = initializer_adder(m.graph);
    init("w1", at::randn({96, 1000}) * 0.1);
    init("b1", at::randn({1000}));
    init("w2", at::randn({1000, 40}) * 0.05);
    m.graph.nodes = {node("MatMul", {"x", "w1"}, {"p1"}), node("Add", {"p1", "b1"}, {"a1"}),
                     node("Gelu", {"a1"}, {"g1"}), node("MatMul", {"g1", "w2"}, {"p2"}),
                     node("Relu", {"p2"}, {"y"})};
    ExecOptions eo;
    eo.precision = precision;
    Executor exec(m, eo);
    for (int64_t s : {9, 64, 99, 2}) {
      SCOPED_TRACE(::testing::Message() << 2 * s << " rows");
      at::Tensor x = at::randn({2, s, 96});
      x[1][s / 2][7] = std::numeric_limits<float>::quiet_NaN();
      const at::Tensor want = aten_output(m, {{"x", x}}, precision);
      const at::Tensor got = run_forced(exec, {{"x", x}}, "lopper-dense");
      ASSERT_EQ(got.sizes(), want.sizes());
      EXPECT_TRUE(at::equal(at::isnan(got), at::isnan(want)));
      EXPECT_TRUE(at::isnan(got[1][s / 2]).all().item<bool>());
      EXPECT_LE(test::relative_max_diff(at::nan_to_num(got, 0), at::nan_to_num(want, 0)),
                bf16 ? 2e-2 : 1e-5);
    }
    // the two layers' products of many rows forced onto it; of a few rows, not
    int dense = 0;
    for (const auto& d : exec.kernel_decisions()) dense += has(d.chosen, "lopper-dense");
    EXPECT_EQ(dense, 2);
  }
  unsetenv("LOPPER_KERNEL_CACHE");
}

// A hostile model's empty weights run on ATen (oneDNN makes no primitive for them, and said so in
// an internal error): a product over no inputs gives its bias, a convolution of no input channels
// ATen's empty output; one of no output channels is ATen's one-line error naming the node.
TEST(Exec, EmptyWeightsRunOnAten) {
  setenv("LOPPER_KERNEL_CACHE", "off", 1);
  ir::Model empty = image_model({20, 0});
  initializer_adder(empty.graph)("w", at::zeros({0, 8}));
  initializer_adder(empty.graph)("b", at::arange(8, at::kFloat));
  empty.graph.nodes = {node("MatMul", {"x", "w"}, {"p"}), node("Add", {"p", "b"}, {"y"})};
  Executor none(empty);
  const at::Tensor y = none.run({{"x", at::zeros({20, 0})}})[0];
  EXPECT_TRUE(at::equal(y, at::arange(8, at::kFloat).expand({20, 8})));
  for (const bool no_out : {false, true}) {
    ir::Model m = image_model({1, no_out ? 4 : 0, 5, 5});
    initializer_adder(m.graph)("w", at::zeros({no_out ? 0 : 8, no_out ? 4 : 0, 3, 3}));
    m.graph.nodes = {node("Conv", {"x", "w"}, {"y"}, {ints_attr("pads", {1, 1, 1, 1})})};
    Executor exec(m);
    const at::Tensor x = at::zeros({1, no_out ? 4 : 0, 5, 5});
    if (!no_out) {
      const at::Tensor want = at::conv2d(x, m.graph.initializers[0].value, {}, 1, 1);
      EXPECT_EQ(exec.run({{"x", x}})[0].sizes(), want.sizes());
      continue;
    }
    try {
      exec.run({{"x", x}});
      ADD_FAILURE() << "a convolution of no output channels must be refused";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("node 'y' (Conv)"), std::string::npos) << what;
      EXPECT_EQ(what.find('\n'), std::string::npos) << what;
      EXPECT_EQ(what.find("primitive"), std::string::npos) << what;
    }
  }
  unsetenv("LOPPER_KERNEL_CACHE");
}

// The shape ops' refusals name the node and the shapes, in one line: a Reshape with two -1s, a
// negative dim, a size that does not divide or match; a Transpose whose perm does not match the
// rank; a Split that does not sum to the axis; an Expand that does not broadcast. Their messages
// are built only when the check fails (a Reshape spent half its time building them).
TEST(Exec, ShapeOpRefusalsNameTheShapes) {
  auto refusal = [](ir::Node n, std::vector<int64_t> shape) {
    ir::Model m = image_model({2, 6});
    if (!shape.empty()) initializer_adder(m.graph)("s", at::tensor(shape, at::kLong));
    m.graph.nodes = {std::move(n)};
    try {
      Executor(m).run({{"x", at::randn({2, 6})}});
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("ran");
  };
  const std::vector<std::pair<std::string, std::string>> cases{
      {refusal(node("Reshape", {"x", "s"}, {"y"}), {-1, -1}), "shape [-1,-1] has more than one -1"},
      {refusal(node("Reshape", {"x", "s"}, {"y"}), {3, -5}), "shape [3,-5] has a negative dim"},
      {refusal(node("Reshape", {"x", "s"}, {"y"}), {5, -1}), "cannot reshape [2,6] to [5,-1]"},
      {refusal(node("Reshape", {"x", "s"}, {"y"}), {4, 4}), "cannot reshape [2,6] to [4,4]"},
      {refusal(node("Reshape", {"x", "s"}, {"y"}), {0, 0, 0}),
       "shape [0,0,0] copies dim 2 of a rank-2 input"},
      {refusal(node("Transpose", {"x"}, {"y"}, {ints_attr("perm", {1, 0, 2})}), {}),
       "perm [1,0,2] does not match rank 2"},
      {refusal(node("Split", {"x", "s"}, {"y", "z"}, {int_attr("axis", 1)}), {2, 2}),
       "split [2,2] does not sum to 6"},
      {refusal(node("Expand", {"x", "s"}, {"y"}), {3, 6}),
       "shapes [2,6] and [3,6] do not broadcast"}};
  for (const auto& [what, want] : cases) {
    EXPECT_NE(what.find(want), std::string::npos) << what;
    EXPECT_NE(what.find("node 'y'"), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  }
}

// In bf16 on the CPU each kernel a layer can take gives the result of ATen's bf16 ops (the model
// run op by op, unfused) within bf16's rounding: oneDNN's bf16 convolutions and matrix products
// with the weights packed once; lopper's float32 kernels on the input widened and the output
// rounded back (direct, winograd, depthwise, grouped, the inverted-residual chain), and the GEMV
// of a few rows on the bfloat16 dot product; the bf16 pools, layer norm and attention. Where the
// CPU computes in bf16 natively, oneDNN's kernels run the convolutions.
TEST(Exec, Bf16KernelsMatchAtenBf16) {
  setenv("LOPPER_KERNEL_CACHE", "off", 1);
  const char* own =
      "lopper-winograd,lopper-direct,lopper-depthwise-rows,lopper-depthwise,lopper-grouped,"
      "lopper-chain,lopper-gemv,lopper-dense";
  for (const char* stem :
       {"resnet18", "mobilenet_v2", "mobilenet_v3_small", "densenet121", "transformer_encoder"}) {
    ir::Model m = onnx::load_model(fixture(std::string(stem) + ".ts.onnx"));
    const NamedTensors feeds = fixture_feeds(m, stem);
    const at::Tensor want = aten_output(m, feeds, at::kBFloat16);
    for (const char* forced :
         {"", "onednn-conv,onednn-linear,onednn", "onednn-direct,onednn-linear,onednn", own}) {
      SCOPED_TRACE(std::string(stem) + " forced: " + forced);
      ExecOptions eo;
      eo.precision = at::kBFloat16;
      Executor exec(m, eo);
      const at::Tensor got = run_forced(exec, feeds, forced);
      EXPECT_EQ(got.scalar_type(), at::kFloat);
      EXPECT_LE(test::relative_max_diff(got, want), 2e-2);
      auto kernels = [&](const char* prefix) {
        return chosen(exec, [prefix](const std::string& k) { return starts_with(k, prefix); });
      };
      // Where the CPU has no bf16 arithmetic, convolutions run ATen's bf16 ops (no candidates).
      const bool convs = std::string(stem) != "transformer_encoder" && ops::onednn::bf16_native();
      if (forced == own && convs) EXPECT_GT(kernels("lopper"), 0);
      // mobilenet_v3_small's depthwise layers beside squeeze-and-excitation blocks, not chained
      if (forced == own && convs && std::string(stem) == "mobilenet_v3_small")
        EXPECT_GT(kernels("lopper-depthwise-rows"), 0);
      // the classifier of a few images on lopper's bf16 GEMV (the bfloat16 dot product)
      if (forced == own && convs && kernels::cpu::DenseGemv::takes_bf16(kernels::cpu::active_isa()))
        EXPECT_GT(kernels("lopper-gemv"), 0);
      if (*forced && forced != own && convs) EXPECT_GT(kernels("onednn"), 0);
      // oneDNN's primitives called directly, where its library is at hand
      if (starts_with(forced, "onednn-direct") && dnnl::available() &&
          (convs || (std::string(stem) == "transformer_encoder" && ops::onednn::bf16_native())))
        EXPECT_GT(kernels("onednn-direct"), 0);
    }
  }
  unsetenv("LOPPER_KERNEL_CACHE");
}

// A sparse layer in bf16 (--precision bf16) has the float32 sparse formats as candidates, on its
// input widened and its output rounded back, and for products of many rows, on a CPU with
// AVX512_BF16, the cols kernel in bfloat16: forced, each gives ATen's bf16 result within bf16's
// rounding, for products of many rows (an encoder's sequence) and of a few (a classifier).
TEST(Exec, Bf16SparseLayersRunTheFloatFormatsWidened) {
  setenv("LOPPER_KERNEL_CACHE", "off", 1);
  for (const char* stem : {"transformer_encoder", "mlp"}) {
    SCOPED_TRACE(stem);
    ir::Model m = onnx::load_model(fixture(std::string(stem) + ".ts.onnx"));
    PruneOptions po;
    po.amount = PruneAmount::parse("0.9");
    prune(m, po);
    const NamedTensors feeds = fixture_feeds(m, stem);
    const at::Tensor want = aten_output(m, feeds, at::kBFloat16);
    ExecOptions eo;
    eo.precision = at::kBFloat16;
    Executor exec(m, eo);
    const at::Tensor got = run_forced(exec, feeds, "csr-cols-fp32,csr-rows-fp32");
    EXPECT_LE(test::relative_max_diff(got, want), 2e-2);
    EXPECT_GT(chosen(exec, [](const std::string& k) { return has(k, "-fp32"); }), 0);
    Executor pairs(m, eo);
    const at::Tensor got_pairs = run_forced(pairs, feeds, "csr-cols-bf16,csr-cols-fp32");
    EXPECT_LE(test::relative_max_diff(got_pairs, want), 2e-2);
    const int bf16_cols = chosen(pairs, [](const std::string& k) { return has(k, "-cols-bf16"); });
    if (kernels::cpu::bf16_dot_supported(kernels::cpu::active_isa()) &&
        std::string(stem) == "transformer_encoder")
      EXPECT_GT(bf16_cols, 0);
  }
  unsetenv("LOPPER_KERNEL_CACHE");
}

// --precision: bf16 computes in bf16 (the result moves off fp32's, within bf16's rounding) and
// hands back float32; fp16 needs a GPU; other types are refused.
TEST(Exec, Bf16PrecisionComputesInBf16AndReturnsFloat) {
  for (const char* stem : {"mlp", "small_cnn", "transformer_encoder", "resnet18"}) {
    SCOPED_TRACE(stem);
    ir::Model m = onnx::load_model(fixture(std::string(stem) + ".ts.onnx"));
    NamedTensors feeds = fixture_feeds(m, stem);
    at::Tensor fp32 = Executor(m).run(feeds)[0];
    ExecOptions eo;
    eo.precision = at::kBFloat16;
    at::Tensor bf16 = Executor(m, eo).run(feeds)[0];
    EXPECT_EQ(bf16.scalar_type(), at::kFloat);
    const double diff = test::relative_max_diff(bf16, fp32);
    EXPECT_GT(diff, 0.0);  // it did not run in fp32
    EXPECT_LT(diff, 0.1);  // bf16 keeps 8 bits of mantissa
  }
  ir::Model m = onnx::load_model(fixture("mlp.ts.onnx"));
  ExecOptions half;
  half.precision = at::kHalf;
  EXPECT_THROW(Executor(m, half), Error);
  ExecOptions integer;
  integer.precision = at::kInt;
  EXPECT_THROW(Executor(m, integer), Error);
  EXPECT_EQ(parse_precision("bf16"), at::kBFloat16);
  EXPECT_THROW(parse_precision("fp8"), Error);
}

// A float32 model lowered to bf16 (--precision bf16) softmaxes each bf16 row in float32 and
// rounds once, as PyTorch's bf16 softmax does: the correctly rounded softmax of the bf16 scores
// in all but a few elements (lopper's exp is within 2e-7), where ONNX's stepwise reference for a
// model typed in bf16 (x - max, exp, sum and divide each rounded) is off in many.
TEST(Exec, LoweredBf16SoftmaxRoundsOnce) {
  at::manual_seed(3);
  ir::Model m = image_model({4, 8, 257});
  m.graph.nodes = {node("Softmax", {"x"}, {"y"}, {int_attr("axis", -1)})};
  const at::Tensor x = at::randn({4, 8, 257}) * 3;
  ExecOptions eo;
  eo.precision = at::kBFloat16;
  Executor exec(m, eo);
  const at::Tensor got = exec.run({{"x", x}})[0];
  ASSERT_EQ(got.scalar_type(), at::kFloat);
  const at::Tensor x16 = x.to(at::kBFloat16);
  const at::Tensor exact = at::softmax(x16.to(at::kDouble), -1).to(at::kBFloat16).to(at::kFloat);
  const int64_t off = at::ne(got, exact).sum().item<int64_t>();
  EXPECT_LE(off, x.numel() / 100) << off << " of " << x.numel() << " not the rounded softmax";
  // the stepwise form, for scale
  const at::Tensor e = at::exp(x16 - std::get<0>(at::max(x16, -1, true)));
  const at::Tensor stepwise = (e / e.sum(-1, true)).to(at::kFloat);
  EXPECT_GT(at::ne(stepwise, exact).sum().item<int64_t>(), 4 * std::max<int64_t>(off, 1));
}

// The executor's CPU allocator hands out the most recently freed block that fits (up to twice the
// size asked for), so that the next layer writes into memory still in the caches; blocks under
// 64 KiB and blocks too small or over twice the size are not reused.
TEST(CachingAllocator, ReusesTheLastFreedBlockThatFits) {
  exec::install_caching_cpu_allocator();
  // Earlier tests' blocks out of the way (a full cache gives freed blocks back to the OS).
  exec::empty_cpu_cache();
  auto bytes = [](int64_t kib) { return at::empty({kib * 1024}, at::kByte); };
  at::Tensor a = bytes(200), b = bytes(300);
  void* pa = a.data_ptr();
  void* pb = b.data_ptr();
  a.reset();
  b.reset();
  at::Tensor c = bytes(180);  // both fit: b was freed last
  EXPECT_EQ(c.data_ptr(), pb);
  at::Tensor d = bytes(800);  // a is too small
  EXPECT_NE(d.data_ptr(), pa);
  at::Tensor e = bytes(90);  // under half of a
  EXPECT_NE(e.data_ptr(), pa);
  at::Tensor f = bytes(120);  // a fits
  EXPECT_EQ(f.data_ptr(), pa);
  f.reset();
  at::Tensor g = bytes(200);  // a again: a block keeps its whole size
  EXPECT_EQ(g.data_ptr(), pa);
  g.fill_(7);
  EXPECT_EQ(g.sum().item<int64_t>(), 7 * 200 * 1024);
}

// ReduceMean over the pixels of a convolution's channels-last output (MnasNet's x.mean([2, 3])),
// kept and dropped dims, axes given negative and in either order; and over other axes (ATen's
// path), against ATen.
TEST(Exec, ReduceMeanOverThePixelsMatchesAten) {
  at::manual_seed(23);
  ir::Model m = image_model({2, 6, 5, 7});
  ir::Graph& g = m.graph;
  auto init = initializer_adder(g);
  init("w", at::randn({70, 6, 3, 3}) * 0.3);
  g.nodes = {
      node("Conv", {"x", "w"}, {"a"}, {ints_attr("pads", {1, 1, 1, 1})}),
      node("ReduceMean", {"a"}, {"y1"}, {ints_attr("axes", {2, 3}), int_attr("keepdims", 0)}),
      node("ReduceMean", {"a"}, {"y2"}, {ints_attr("axes", {-1, -2})}),
      node("ReduceMean", {"a"}, {"y3"}, {ints_attr("axes", {1, 3}), int_attr("keepdims", 0)}),
  };
  name_outputs(g, 3);
  const at::Tensor x = at::randn({2, 6, 5, 7});
  const at::Tensor a = at::conv2d(x, g.find_initializer("w")->value, {}, 1, 1);
  expect_outputs_match(m, x, {a.mean({2, 3}), a.mean({2, 3}, true), a.mean({1, 3})},
                       {"lopper-direct", "onednn-conv,onednn-linear", ""});
}

// The channel shuffle of a concatenation, fused into ai.lopper.ChannelShuffle: two groups of a
// channel slice (a strided view) and a convolution's output (ShuffleNet's unit), three groups
// that straddle the inputs, an NCHW graph input, and shapes that are not a shuffle (the nodes'
// own steps); on each convolution kernel (ATen's leaves NCHW outputs), against ATen.
TEST(Exec, ChannelShuffleOfAConcatenationMatchesAten) {
  at::manual_seed(17);
  ir::Model m = image_model({2, 6, 5, 7});
  ir::Graph& g = m.graph;
  auto init = initializer_adder(g);
  init("wa", at::randn({12, 6, 3, 3}) * 0.3);
  init("wb", at::randn({6, 6, 1, 1}) * 0.3);
  init("wc", at::randn({7, 6, 1, 1}) * 0.3);
  init("zero", at::tensor({0}, at::kLong));
  init("six", at::tensor({6}, at::kLong));
  init("eleven", at::tensor({11}, at::kLong));
  init("one", at::tensor({1}, at::kLong));
  init("g2", at::tensor({2, 2, 6, 5, 7}, at::kLong));
  init("g3", at::tensor({0, 3, -1, 5, 7}, at::kLong));
  init("back12", at::tensor({2, 12, 5, 7}, at::kLong));
  init("back18", at::tensor({0, -1, 5, 7}, at::kLong));
  init("flat", at::tensor({2, 2, 6, 35, 1}, at::kLong));
  g.nodes = {
      node("Conv", {"x", "wa"}, {"a"}, {ints_attr("pads", {1, 1, 1, 1})}),
      node("Slice", {"a", "zero", "six", "one"}, {"a1"}),
      node("Slice", {"a", "six", "eleven", "one"}, {"a2"}),
      node("Conv", {"x", "wb"}, {"b"}),
      node("Conv", {"x", "wc"}, {"c"}),
      node("Concat", {"a1", "b"}, {"k1"}, {int_attr("axis", 1)}),
      node("Reshape", {"k1", "g2"}, {"r1"}),
      node("Transpose", {"r1"}, {"t1"}, {ints_attr("perm", {0, 2, 1, 3, 4})}),
      node("Reshape", {"t1", "back12"}, {"y1"}),
      node("Concat", {"b", "a2", "c"}, {"k2"}, {int_attr("axis", 1)}),
      node("Reshape", {"k2", "g3"}, {"r2"}),
      node("Transpose", {"r2"}, {"t2"}, {ints_attr("perm", {0, 2, 1, 3, 4})}),
      node("Reshape", {"t2", "back18"}, {"y2"}),
      node("Concat", {"x", "b"}, {"k3"}, {int_attr("axis", 1)}),
      node("Reshape", {"k3", "g2"}, {"r3"}),
      node("Transpose", {"r3"}, {"t3"}, {ints_attr("perm", {0, 2, 1, 3, 4})}),
      node("Reshape", {"t3", "back12"}, {"y3"}),
      node("Concat", {"a1", "b"}, {"k4"}, {int_attr("axis", 1)}),
      node("Reshape", {"k4", "flat"}, {"r4"}),
      node("Transpose", {"r4"}, {"t4"}, {ints_attr("perm", {0, 2, 1, 3, 4})}),
      node("Reshape", {"t4", "back12"}, {"y4"}),
      // as torch.export writes it: both Reshapes with allowzero 1
      node("Concat", {"a1", "b"}, {"k5"}, {int_attr("axis", 1)}),
      node("Reshape", {"k5", "g2"}, {"r5"}, {int_attr("allowzero", 1)}),
      node("Transpose", {"r5"}, {"t5"}, {ints_attr("perm", {0, 2, 1, 3, 4})}),
      node("Reshape", {"t5", "back12"}, {"y5"}, {int_attr("allowzero", 1)}),
  };
  name_outputs(g, 5);
  int shuffles = 0;
  for (const auto& n : exec::fuse_for_inference(g, 17).nodes) {
    shuffles += n.op_type == "ChannelShuffle";
    EXPECT_NE(n.op_type, "Transpose");
  }
  EXPECT_EQ(shuffles, 5);
  const at::Tensor x = at::randn({2, 6, 5, 7});
  auto w = [&](const char* n) { return g.find_initializer(n)->value; };
  const at::Tensor a = at::conv2d(x, w("wa"), {}, 1, 1), b = at::conv2d(x, w("wb")),
                   c = at::conv2d(x, w("wc"));
  auto shuffle = [](const at::Tensor& t, int64_t groups) {
    const int64_t ch = t.size(1);
    return t.reshape({2, groups, ch / groups, 5, 7}).transpose(1, 2).reshape({2, ch, 5, 7});
  };
  const at::Tensor a1 = a.slice(1, 0, 6);
  expect_outputs_match(
      m, x,
      {shuffle(at::cat({a1, b}, 1), 2), shuffle(at::cat({b, a.slice(1, 6, 11), c}, 1), 3),
       shuffle(at::cat({x, b}, 1), 2),
       at::cat({a1, b}, 1).reshape({2, 2, 6, 35, 1}).transpose(1, 2).reshape({2, 12, 5, 7}),
       shuffle(at::cat({a1, b}, 1), 2)},
      {"lopper-direct", "onednn-conv,onednn-linear", "aten", ""});
  // With allowzero 1 a 0 in the shape is a dim of 0, not a copy: the fused node fails as the
  // Reshape did, naming the problem.
  g.initializers.push_back({"g2", at::tensor({0, 2, 6, 5, 7}, at::kLong), "", false});
  g.initializers.erase(std::find_if(g.initializers.begin(), g.initializers.end(),
                                    [](const auto& t) { return t.name == "g2"; }));
  try {
    Executor(m).run({{"x", x}});
    ADD_FAILURE() << "a reshape to a 0-sized dim ran";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot reshape"), std::string::npos) << e.what();
  }
}

// MobileNet's inverted residuals fused into ai.lopper.ConvChain: expansion (ReLU6 as Clip) ->
// depthwise (stride 1, ReLU6) -> projection + residual; depthwise (stride 2) -> projection alone;
// expansion -> depthwise (dilated) whose output two nodes read (no projection). The one pass, the
// layers one by one under each forced kernel list, and the timed choice against ATen; a
// depthwise convolution read by two projections is not fused.
TEST(Exec, InvertedResidualChainsMatchAten) {
  at::manual_seed(23);
  ir::Model m = image_model({2, 8, 9, 11});
  ir::Graph& g = m.graph;
  auto init = initializer_adder(g);
  init("we", at::randn({24, 8, 1, 1}) * 0.3);
  init("be", at::randn({24}) * 0.1);
  init("wd", at::randn({24, 1, 3, 3}) * 0.3);
  init("bd", at::randn({24}) * 0.1);
  init("wp", at::randn({8, 24, 1, 1}) * 0.3);
  init("wd2", at::randn({8, 1, 3, 3}) * 0.3);
  init("wp2", at::randn({5, 8, 1, 1}) * 0.3);
  init("wd3", at::randn({24, 1, 3, 3}) * 0.3);
  init("lo", at::tensor(0.f));
  init("hi", at::tensor(6.f));
  auto six = [](const char* in, const char* out) { return node("Clip", {in, "lo", "hi"}, {out}); };
  auto pads = [](int64_t p) { return ints_attr("pads", {p, p, p, p}); };
  g.nodes = {
      node("Conv", {"x", "we", "be"}, {"e"}),
      six("e", "e6"),
      node("Conv", {"e6", "wd", "bd"}, {"d"}, {int_attr("group", 24), pads(1)}),
      six("d", "d6"),
      node("Conv", {"d6", "wp"}, {"p"}),
      node("Add", {"p", "x"}, {"y1"}),
      node("Conv", {"y1", "wd2"}, {"d2"},
           {int_attr("group", 8), pads(1), ints_attr("strides", {2, 2})}),
      node("Conv", {"d2", "wp2"}, {"y2"}),
      node("Conv", {"y1", "we", "be"}, {"e3"}),
      six("e3", "e36"),
      node("Conv", {"e36", "wd3"}, {"d3"},
           {int_attr("group", 24), pads(2), ints_attr("dilations", {2, 2})}),
      node("Relu", {"d3"}, {"y3"}),
      node("Sigmoid", {"d3"}, {"y4"}),
      node("Conv", {"y1", "wd2"}, {"d5"}, {int_attr("group", 8), pads(1)}),
      node("Conv", {"d5", "wp2"}, {"y5"}),
      node("Conv", {"d5", "wp2"}, {"y6"}),
  };
  name_outputs(g, 6);
  int chains = 0;
  const ir::Graph fused = exec::fuse_for_inference(g, 17);
  for (const auto& n : fused.nodes) chains += n.op_type == "ConvChain";
  EXPECT_EQ(chains, 3);
  // weights only chains read move into their bodies; one the unfused convolution reads stays
  EXPECT_EQ(fused.find_initializer("wd"), nullptr);
  EXPECT_EQ(fused.find_initializer("we"), nullptr);
  EXPECT_NE(fused.find_initializer("wd2"), nullptr);
  const at::Tensor x = at::randn({2, 8, 9, 11});
  auto w = [&](const char* n) { return g.find_initializer(n)->value; };
  const at::Tensor e = at::clamp(at::conv2d(x, w("we"), w("be")), 0, 6);
  const at::Tensor y1 =
      at::conv2d(at::clamp(at::conv2d(e, w("wd"), w("bd"), 1, 1, 1, 24), 0, 6), w("wp")) + x;
  const at::Tensor y2 = at::conv2d(at::conv2d(y1, w("wd2"), {}, 2, 1, 1, 8), w("wp2"));
  const at::Tensor d3 =
      at::conv2d(at::clamp(at::conv2d(y1, w("we"), w("be")), 0, 6), w("wd3"), {}, 1, 2, 2, 24);
  const at::Tensor y5 = at::conv2d(at::conv2d(y1, w("wd2"), {}, 1, 1, 1, 8), w("wp2"));
  expect_outputs_match(m, x, {y1, y2, at::relu(d3), at::sigmoid(d3), y5, y5},
                       {"lopper-chain", "lopper-direct", "onednn-conv,onednn-linear", "aten", ""});
}

// ResNeXt's bottlenecks fused into ai.lopper.ConvChain: 1x1 reduction (ReLU) -> grouped 3x3 of 4
// channels a group (ReLU) -> 1x1 expansion + residual -> ReLU; and 1x1 -> grouped 3x3 of 2
// channels a group, stride 2 -> 1x1 alone. The one pass, the layers one by one under each forced
// kernel list, and the timed choice against ATen; a grouped middle of 3 channels a group (no
// narrow kernel) is not fused.
TEST(Exec, ResNeXtBottleneckChainsMatchAten) {
  at::manual_seed(31);
  ir::Model m = image_model({2, 16, 9, 11});
  ir::Graph& g = m.graph;
  auto init = initializer_adder(g);
  init("wr", at::randn({16, 16, 1, 1}) * 0.3);
  init("br", at::randn({16}) * 0.1);
  init("wg", at::randn({16, 4, 3, 3}) * 0.3);
  init("bg", at::randn({16}) * 0.1);
  init("wx", at::randn({16, 16, 1, 1}) * 0.3);
  init("wr2", at::randn({8, 16, 1, 1}) * 0.3);
  init("wg2", at::randn({8, 2, 3, 3}) * 0.3);
  init("wx2", at::randn({12, 8, 1, 1}) * 0.3);
  init("wr3", at::randn({6, 16, 1, 1}) * 0.3);
  init("wg3", at::randn({6, 3, 3, 3}) * 0.3);
  init("wx3", at::randn({5, 6, 1, 1}) * 0.3);
  auto pads = [](int64_t p) { return ints_attr("pads", {p, p, p, p}); };
  g.nodes = {
      node("Conv", {"x", "wr", "br"}, {"r"}),
      node("Relu", {"r"}, {"r1"}),
      node("Conv", {"r1", "wg", "bg"}, {"gc"}, {int_attr("group", 4), pads(1)}),
      node("Relu", {"gc"}, {"g1"}),
      node("Conv", {"g1", "wx"}, {"p"}),
      node("Add", {"p", "x"}, {"s"}),
      node("Relu", {"s"}, {"y1"}),
      node("Conv", {"y1", "wr2"}, {"r2"}),
      node("Relu", {"r2"}, {"r21"}),
      node("Conv", {"r21", "wg2"}, {"g2"},
           {int_attr("group", 4), pads(1), ints_attr("strides", {2, 2})}),
      node("Conv", {"g2", "wx2"}, {"y2"}),
      node("Conv", {"y1", "wr3"}, {"r3"}),
      node("Conv", {"r3", "wg3"}, {"g3"}, {int_attr("group", 2), pads(1)}),
      node("Conv", {"g3", "wx3"}, {"y3"}),
  };
  name_outputs(g, 3);
  int chains = 0;
  const ir::Graph fused = exec::fuse_for_inference(g, 17);
  for (const auto& n : fused.nodes) chains += n.op_type == "ConvChain";
  EXPECT_EQ(chains, 2);
  const at::Tensor x = at::randn({2, 16, 9, 11});
  auto w = [&](const char* n) { return g.find_initializer(n)->value; };
  const at::Tensor r1 = at::relu(at::conv2d(x, w("wr"), w("br")));
  const at::Tensor g1 = at::relu(at::conv2d(r1, w("wg"), w("bg"), 1, 1, 1, 4));
  const at::Tensor y1 = at::relu(at::conv2d(g1, w("wx")) + x);
  const at::Tensor r2 = at::relu(at::conv2d(y1, w("wr2")));
  const at::Tensor y2 = at::conv2d(at::conv2d(r2, w("wg2"), {}, 2, 1, 1, 4), w("wx2"));
  const at::Tensor y3 =
      at::conv2d(at::conv2d(at::conv2d(y1, w("wr3")), w("wg3"), {}, 1, 1, 1, 2), w("wx3"));
  expect_outputs_match(m, x, {y1, y2, y3},
                       {"lopper-chain", "lopper-direct,lopper-grouped", "onednn-conv", "aten", ""});
}

// A network's first layer: an NCHW input of a few channels, padded straight from its planes by
// lopper's direct kernel; 1 to 4 channels, strides 1 and 2, against ATen.
TEST(Exec, FirstLayerOfFewChannelsMatchesAten) {
  at::manual_seed(29);
  for (int64_t c : {1, 3, 4}) {
    ir::Model m = image_model({2, c, 9, 11});
    ir::Graph& g = m.graph;
    auto init = initializer_adder(g);
    init("w", at::randn({16, c, 3, 3}) * 0.3);
    init("b", at::randn({16}));
    init("v", at::randn({5, c, 3, 3}) * 0.3);
    g.nodes = {
        node("Conv", {"x", "w", "b"}, {"y"},
             {ints_attr("pads", {1, 1, 1, 1}), ints_attr("strides", {2, 2})}),
        node("Conv", {"x", "v"}, {"z"}, {ints_attr("pads", {1, 2, 1, 2})}),
    };
    g.outputs.push_back(g.outputs[0]);
    g.outputs[1].name = "z";
    const at::Tensor x = at::randn({2, c, 9, 11});
    auto w = [&](const char* n) { return g.find_initializer(n)->value; };
    SCOPED_TRACE(c);
    expect_outputs_match(m, x,
                         {at::conv2d(x, w("w"), w("b"), 2, 1),
                          at::conv2d(x, w("v"), at::Tensor(), 1, at::IntArrayRef{1, 2})},
                         {"lopper-direct", ""});
  }
}

// Convolutions of a channel slice of a channels-last activation (ShuffleNet's halves), which
// lopper's kernels read in place, its pixels the whole tensor's channels apart: pointwise, 3x3
// padded, depthwise and grouped; on each convolution kernel, against ATen.
TEST(Exec, ConvolutionsOfAChannelSliceMatchAten) {
  at::manual_seed(19);
  ir::Model m = image_model({2, 6, 5, 7});
  ir::Graph& g = m.graph;
  auto init = initializer_adder(g);
  init("wa", at::randn({12, 6, 3, 3}) * 0.3);
  init("w1", at::randn({5, 6, 1, 1}) * 0.3);
  init("w3", at::randn({4, 5, 3, 3}) * 0.3);
  init("wd", at::randn({6, 1, 3, 3}) * 0.3);
  init("wg", at::randn({4, 3, 1, 1}) * 0.3);
  init("b1", at::randn({5}));
  init("zero", at::tensor({0}, at::kLong));
  init("six", at::tensor({6}, at::kLong));
  init("seven", at::tensor({7}, at::kLong));
  init("twelve", at::tensor({12}, at::kLong));
  init("one", at::tensor({1}, at::kLong));
  const ir::Attribute pads = ints_attr("pads", {1, 1, 1, 1});
  g.nodes = {
      node("Conv", {"x", "wa"}, {"a"}, {pads}),
      node("Slice", {"a", "zero", "six", "one"}, {"a1"}),
      node("Slice", {"a", "seven", "twelve", "one"}, {"a2"}),
      node("Conv", {"a1", "w1", "b1"}, {"y1"}),
      node("Conv", {"a2", "w3"}, {"y2"}, {pads}),
      node("Conv", {"a1", "wd"}, {"y3"}, {pads, int_attr("group", 6)}),
      node("Conv", {"a1", "wg"}, {"y4"}, {int_attr("group", 2)}),
  };
  name_outputs(g, 4);
  const at::Tensor x = at::randn({2, 6, 5, 7});
  auto w = [&](const char* n) { return g.find_initializer(n)->value; };
  const at::Tensor a = at::conv2d(x, w("wa"), {}, 1, 1);
  const at::Tensor a1 = a.slice(1, 0, 6), a2 = a.slice(1, 7, 12);
  expect_outputs_match(m, x,
                       {at::conv2d(a1, w("w1"), w("b1")), at::conv2d(a2, w("w3"), {}, 1, 1),
                        at::conv2d(a1, w("wd"), at::Tensor(), 1, 1, 1, 6),
                        at::conv2d(a1, w("wg"), at::Tensor(), 1, at::IntArrayRef{0, 0}, 1, 2)},
                       {"lopper-direct", "onednn-conv,onednn-linear", "aten", ""});
}

// ShuffleNet's channel shuffle, Reshape to 5-D, Transpose, Reshape back, of a convolution's
// channels-last output, into another convolution and as the graph's output, and DepthToSpace
// written out in 6-D; odd sizes, on each convolution kernel, against ATen.
TEST(Exec, ChannelShuffleBetweenConvolutionsMatchesAten) {
  at::manual_seed(13);
  ir::Model m = image_model({2, 6, 5, 7});
  ir::Graph& g = m.graph;
  auto init = initializer_adder(g);
  init("w1", at::randn({12, 6, 3, 3}) * 0.3);
  init("w2", at::randn({5, 12, 1, 1}) * 0.3);
  init("s5", at::tensor({2, 3, 4, 5, 7}, at::kLong));
  init("s4", at::tensor({2, 12, 5, 7}, at::kLong));
  g.nodes = {
      node("Conv", {"x", "w1"}, {"a"}, {ints_attr("pads", {1, 1, 1, 1})}),
      node("Reshape", {"a", "s5"}, {"r5"}),
      node("Transpose", {"r5"}, {"t5"}, {ints_attr("perm", {0, 2, 1, 3, 4})}),
      node("Reshape", {"t5", "s4"}, {"shuffled"}),
      node("Conv", {"shuffled", "w2"}, {"y"}),
      // the shuffle once more, straight to the graph's output
      node("Reshape", {"shuffled", "s5"}, {"q5"}),
      node("Transpose", {"q5"}, {"u5"}, {ints_attr("perm", {0, 2, 1, 3, 4})}),
      node("Reshape", {"u5", "s4"}, {"z"}),
      // DepthToSpace written out (6-D): the result's channels-last order is a view of it too
      node("Reshape", {"shuffled", "s6"}, {"d6"}),
      node("Transpose", {"d6"}, {"e6"}, {ints_attr("perm", {0, 1, 4, 2, 5, 3})}),
      node("Reshape", {"e6", "s4d"}, {"p"}),
  };
  init("s6", at::tensor({2, 3, 2, 2, 5, 7}, at::kLong));
  init("s4d", at::tensor({2, 3, 10, 14}, at::kLong));
  g.outputs.push_back(g.outputs[0]);
  g.outputs[1].name = "z";
  g.outputs.push_back(g.outputs[0]);
  g.outputs[2].name = "p";
  const at::Tensor x = at::randn({2, 6, 5, 7});
  auto w = [&](const char* n) { return g.find_initializer(n)->value; };
  auto shuffle = [](const at::Tensor& t) {
    return t.reshape({2, 3, 4, 5, 7}).transpose(1, 2).reshape({2, 12, 5, 7});
  };
  const at::Tensor s = shuffle(at::conv2d(x, w("w1"), {}, 1, 1));
  const at::Tensor want_y = at::conv2d(s, w("w2")), want_z = shuffle(s);
  const at::Tensor want_p =
      s.reshape({2, 3, 2, 2, 5, 7}).permute({0, 1, 4, 2, 5, 3}).reshape({2, 3, 10, 14});
  for (const char* forced : {"lopper-direct", "onednn-conv,onednn-linear", ""}) {
    ::setenv("LOPPER_FORCE_KERNEL", forced, 1);
    Executor e(m);
    for (int run = 0; run < 2; ++run) {
      const auto outs = e.run({{"x", x}});
      EXPECT_LE(test::relative_max_diff(outs[0], want_y), 1e-5) << forced;
      // to the convolution's tolerance: another kernel's summation order (the scalar ISA's)
      EXPECT_LE(test::relative_max_diff(outs[1], want_z), 1e-5) << forced;
      EXPECT_LE(test::relative_max_diff(outs[2], want_p), 1e-5) << forced;
    }
  }
  ::unsetenv("LOPPER_FORCE_KERNEL");
}
