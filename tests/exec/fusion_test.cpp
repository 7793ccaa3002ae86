// The inference rewrites one by one (src/exec/fusion): each pass, run alone on its pattern, says
// it changed the graph, writes the ops it names, keeps the outputs of the graph it was given
// (both run unfused), and finds nothing left to do when run again; on a near miss of its pattern
// it changes nothing.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "exec/fusion/passes.h"
#include "lopper/executor.h"
#include "test_models.h"
#include "test_util.h"

using namespace lopper;
using namespace lopper::test;

namespace {

const exec::fusion::Pass& pass(const std::string& name) {
  for (const auto& p : exec::fusion::passes())
    if (name == p.name) return p;
  throw std::runtime_error("no pass " + name);
}

// A model at `opset` reading `inputs` (name, dims) and writing y1..yn; its nodes and initializers
// are the test's.
ir::Model model(std::vector<std::pair<std::string, std::vector<int64_t>>> inputs, int outputs = 1,
                int64_t opset = 17) {
  ir::Model m;
  m.ir_version = 8;
  m.opset_import = {{"", opset}};
  for (const auto& [name, dims] : inputs) m.graph.inputs.push_back(value_info(name, dims));
  for (int i = 1; i <= outputs; ++i)
    m.graph.outputs.push_back(
        {"y" + std::to_string(i), {ir::DType::kFloat, false, {}, "", ""}, ""});
  return m;
}

void add(ir::Model& m, const std::string& name, at::Tensor t) {
  m.graph.initializers.push_back({name, t.contiguous(), "", false});
}

// A scalar initializer.
void add_scalar(ir::Model& m, const std::string& name, float v) { add(m, name, at::full({}, v)); }

int64_t opset_of(const ir::Model& m) { return m.opset_import.at(0).version; }

// Each node's op, with its domain when it has one ("ai.lopper.FusedConv").
std::vector<std::string> ops(const ir::Graph& g) {
  std::vector<std::string> out;
  for (const auto& n : g.nodes)
    out.push_back(n.domain.empty() ? n.op_type : n.domain + "." + n.op_type);
  return out;
}

// Random inputs of the model's declared shapes.
NamedTensors feeds_of(const ir::Model& m) {
  NamedTensors feeds;
  for (const auto* v : m.graph.real_inputs()) {
    std::vector<int64_t> dims;
    for (const auto& d : v->type.dims) dims.push_back(d.value);
    feeds.emplace_back(v->name, at::randn(dims));
  }
  return feeds;
}

std::vector<at::Tensor> run_unfused(const ir::Model& m, const NamedTensors& feeds) {
  ExecOptions plain;
  plain.fuse = false;
  plain.fold_constants = false;
  Executor e(m, plain);
  return e.run(feeds);
}

// `name` rewrites m into `want` and keeps its outputs; a second run finds nothing.
void expect_rewrite(const ir::Model& m, const std::string& name,
                    const std::vector<std::string>& want) {
  SCOPED_TRACE(name);
  const auto& p = pass(name);
  ir::Model f = m;
  ASSERT_TRUE(p.apply(f.graph, opset_of(m)));
  EXPECT_EQ(ops(f.graph), want);
  const NamedTensors feeds = feeds_of(m);
  const auto before = run_unfused(m, feeds), after = run_unfused(f, feeds);
  ASSERT_EQ(before.size(), after.size());
  for (size_t i = 0; i < before.size(); ++i) {
    EXPECT_EQ(before[i].sizes(), after[i].sizes()) << "output " << i;
    EXPECT_LE(relative_max_diff(after[i], before[i]), 1e-5) << "output " << i;
  }
  ir::Graph again = f.graph;
  EXPECT_FALSE(p.apply(again, opset_of(m)));
  EXPECT_EQ(ops(again), want);
}

void expect_untouched(const ir::Model& m, const std::string& name) {
  SCOPED_TRACE(name);
  ir::Graph g = m.graph;
  EXPECT_FALSE(pass(name).apply(g, opset_of(m)));
  EXPECT_EQ(ops(g), ops(m.graph));
  EXPECT_EQ(g.initializers.size(), m.graph.initializers.size());
}

ir::Attribute tensor_attr(const char* name, at::Tensor t) {
  ir::Attribute a;
  a.name = name;
  a.type = ir::AttrType::kTensor;
  a.t = t;
  return a;
}

ir::Node with_domain(ir::Node n, const char* domain) {
  n.domain = domain;
  return n;
}

}  // namespace

TEST(Fusion, ThePassListNamesEachPassOnce) {
  std::set<std::string> names;
  for (const auto& p : exec::fusion::passes()) {
    EXPECT_NE(p.apply, nullptr) << p.name;
    EXPECT_TRUE(names.insert(p.name).second) << p.name;
  }
  EXPECT_EQ(names.size(), 15u);
}

// A Constant node and the Identity of an initializer become initializers; the Identity of a
// computed value stays.
TEST(Fusion, ConstantsBecomeInitializers) {
  ir::Model m = model({{"x", {2, 3}}});
  add(m, "w", at::randn({2, 3}));
  m.graph.nodes = {node("Constant", {}, {"c"}, {tensor_attr("value", at::randn({2, 3}))}),
                   node("Identity", {"w"}, {"w2"}), node("Mul", {"x", "c"}, {"p"}),
                   node("Add", {"p", "w2"}, {"y1"})};
  expect_rewrite(m, "constants_to_initializers", {"Mul", "Add"});

  ir::Model kept = model({{"x", {2, 3}}});
  kept.graph.nodes = {node("Identity", {"x"}, {"y1"})};
  expect_untouched(kept, "constants_to_initializers");
}

// Conv + BatchNormalization -> Conv of folded weights; not when the Conv's output is read too.
TEST(Fusion, FoldsBatchNormIntoConv) {
  ir::Model m = model({{"x", {2, 3, 5, 5}}});
  add(m, "w", at::randn({4, 3, 3, 3}));
  add(m, "b", at::randn({4}));
  add(m, "scale", at::rand({4}) + 0.5);
  add(m, "shift", at::randn({4}));
  add(m, "mean", at::randn({4}));
  add(m, "var", at::rand({4}) + 0.5);
  m.graph.nodes = {node("Conv", {"x", "w", "b"}, {"c"}),
                   node("BatchNormalization", {"c", "scale", "shift", "mean", "var"}, {"y1"})};
  expect_rewrite(m, "fold_batchnorm", {"Conv"});

  ir::Model read = m;
  read.graph.outputs.push_back(read.graph.outputs[0]);
  read.graph.outputs[1].name = "c";
  expect_untouched(read, "fold_batchnorm");
}

// Conv + residual Add + Relu -> FusedConv(x, W, B, residual); a Conv whose output is also the
// graph's stays.
TEST(Fusion, FusesConvResidualAndActivation) {
  ir::Model m = model({{"x", {1, 3, 5, 5}}, {"r", {1, 4, 5, 5}}});
  add(m, "w", at::randn({4, 3, 3, 3}));
  add(m, "b", at::randn({4}));
  m.graph.nodes = {node("Conv", {"x", "w", "b"}, {"c"}, {ints_attr("pads", {1, 1, 1, 1})}),
                   node("Add", {"r", "c"}, {"s"}), node("Relu", {"s"}, {"y1"})};
  expect_rewrite(m, "fuse_conv", {"ai.lopper.FusedConv"});

  ir::Model read = model({{"x", {1, 3, 5, 5}}}, 2);
  read.graph.initializers = m.graph.initializers;
  read.graph.nodes = {node("Conv", {"x", "w", "b"}, {"y1"}), node("Relu", {"y1"}, {"y2"})};
  expect_untouched(read, "fuse_conv");
}

// ResNet's downsample: the residual Conv's bias moves into the FusedConv's; a residual that is
// also a graph output keeps its own.
TEST(Fusion, MovesTheResidualBias) {
  auto make = [](bool residual_read) {
    ir::Model m = model({{"x", {1, 3, 5, 5}}}, residual_read ? 2 : 1);
    add(m, "w", at::randn({4, 3, 1, 1}));
    add(m, "b", at::randn({4}));
    add(m, "wd", at::randn({4, 3, 1, 1}));
    add(m, "bd", at::randn({4}));
    const std::string d = residual_read ? "y2" : "d";
    m.graph.nodes = {node("Conv", {"x", "wd", "bd"}, {d}), node("Conv", {"x", "w", "b"}, {"c"}),
                     node("Add", {"c", d}, {"s"}), node("Relu", {"s"}, {"y1"})};
    EXPECT_TRUE(pass("fuse_conv").apply(m.graph, 17));
    return m;
  };
  // The first Conv takes the Add (its residual the second Conv's output): the nodes stay in place,
  // the executor orders them.
  expect_rewrite(make(false), "move_residual_bias", {"ai.lopper.FusedConv", "Conv"});
  expect_untouched(make(true), "move_residual_bias");
}

// A BatchNormalization no Conv absorbed + Relu -> FusedBatchNormalization; + Add: no activation.
TEST(Fusion, FusesBatchNormAndActivation) {
  auto make = [](const char* after) {
    ir::Model m = model({{"x", {2, 4, 3, 3}}});
    add(m, "scale", at::rand({4}) + 0.5);
    add(m, "shift", at::randn({4}));
    add(m, "mean", at::randn({4}));
    add(m, "var", at::rand({4}) + 0.5);
    m.graph.nodes = {node("BatchNormalization", {"x", "scale", "shift", "mean", "var"}, {"n"}),
                     std::string(after) == "Relu" ? node("Relu", {"n"}, {"y1"})
                                                  : node("Add", {"n", "x"}, {"y1"})};
    return m;
  };
  expect_rewrite(make("Relu"), "fuse_batchnorm_activation", {"ai.lopper.FusedBatchNormalization"});
  expect_untouched(make("Add"), "fuse_batchnorm_activation");
}

// Concat along the channels + BatchNormalization -> FusedConcatNorm; along another axis, no.
TEST(Fusion, FusesConcatAndNorm) {
  auto make = [](int64_t axis) {
    ir::Model m = model({{"a", {2, 3, 4, 4}}, {"b", {2, axis == 1 ? 5 : 3, 4, 4}}});
    const int64_t c = axis == 1 ? 8 : 3;
    add(m, "scale", at::rand({c}) + 0.5);
    add(m, "shift", at::randn({c}));
    add(m, "mean", at::randn({c}));
    add(m, "var", at::rand({c}) + 0.5);
    m.graph.nodes = {node("Concat", {"a", "b"}, {"cat"}, {int_attr("axis", axis)}),
                     node("BatchNormalization", {"cat", "scale", "shift", "mean", "var"}, {"y1"})};
    return m;
  };
  expect_rewrite(make(1), "fuse_concat_norm", {"ai.lopper.FusedConcatNorm"});
  expect_untouched(make(2), "fuse_concat_norm");
}

// ShuffleNet's Reshape -> Transpose(0, 2, 1, 3, 4) -> Reshape -> ChannelShuffle; another
// permutation is no shuffle.
TEST(Fusion, FusesChannelShuffle) {
  auto make = [](std::vector<int64_t> perm) {
    ir::Model m = model({{"x", {1, 8, 3, 3}}});
    add(m, "s5", at::tensor(std::vector<int64_t>{1, 2, 4, 3, 3}));
    add(m, "s4", at::tensor(std::vector<int64_t>{1, 8, 3, 3}));
    m.graph.nodes = {node("Reshape", {"x", "s5"}, {"r"}),
                     node("Transpose", {"r"}, {"t"}, {ints_attr("perm", perm)}),
                     node("Reshape", {"t", "s4"}, {"y1"})};
    return m;
  };
  expect_rewrite(make({0, 2, 1, 3, 4}), "fuse_channel_shuffle", {"ai.lopper.ChannelShuffle"});
  expect_untouched(make({0, 1, 2, 4, 3}), "fuse_channel_shuffle");
}

// An inverted residual's 1x1 -> depthwise 3x3 -> 1x1 -> ConvChain, and a ResNeXt bottleneck's,
// its middle one in groups of 2 channels; with a full 3x3 convolution in the middle, or groups of
// 3 channels (no narrow kernel), there is no chain.
TEST(Fusion, FusesTheConvChain) {
  auto make = [](int64_t width) {  // the middle convolution's channels a group
    ir::Model m = model({{"x", {1, 4, 6, 6}}});
    add(m, "we", at::randn({6, 4, 1, 1}));
    add(m, "wd", at::randn({6, width, 3, 3}));
    add(m, "bd", at::randn({6}));
    add(m, "wp", at::randn({3, 6, 1, 1}));
    m.graph.nodes = {node("Conv", {"x", "we"}, {"e"}),
                     node("Conv", {"e", "wd", "bd"}, {"d"},
                          {ints_attr("pads", {1, 1, 1, 1}), int_attr("group", 6 / width)}),
                     node("Conv", {"d", "wp"}, {"y1"})};
    return m;
  };
  expect_rewrite(make(1), "fuse_conv_chain", {"ai.lopper.ConvChain"});
  expect_rewrite(make(2), "fuse_conv_chain", {"ai.lopper.ConvChain"});
  expect_untouched(make(6), "fuse_conv_chain");
  expect_untouched(make(3), "fuse_conv_chain");
}

// GELU written out with Erf -> Gelu; with another factor than one half it is no GELU.
TEST(Fusion, FusesGelu) {
  auto make = [](float half) {
    ir::Model m = model({{"x", {3, 7}}}, 1, 20);
    add_scalar(m, "sqrt2", static_cast<float>(std::sqrt(2.0)));
    add_scalar(m, "one", 1.f);
    add_scalar(m, "half", half);
    m.graph.nodes = {node("Div", {"x", "sqrt2"}, {"d"}), node("Erf", {"d"}, {"e"}),
                     node("Add", {"e", "one"}, {"a"}), node("Mul", {"x", "a"}, {"m"}),
                     node("Mul", {"m", "half"}, {"y1"})};
    return m;
  };
  expect_rewrite(make(0.5f), "fuse_gelu", {"Gelu"});
  expect_untouched(make(0.4f), "fuse_gelu");
}

// MatMul by a weight + bias + Relu, and Gemm(transB) + Tanh -> FusedMatMul; a product of two
// inputs stays.
TEST(Fusion, FusesMatMulBiasAndActivation) {
  ir::Model m = model({{"x", {2, 5, 6}}, {"z", {3, 6}}}, 2);
  add(m, "w", at::randn({6, 4}));
  add(m, "b", at::randn({4}));
  add(m, "wt", at::randn({4, 6}));
  add(m, "bt", at::randn({4}));
  m.graph.nodes = {node("MatMul", {"x", "w"}, {"p"}), node("Add", {"p", "b"}, {"s"}),
                   node("Relu", {"s"}, {"y1"}),
                   node("Gemm", {"z", "wt", "bt"}, {"g"}, {int_attr("transB", 1)}),
                   node("Tanh", {"g"}, {"y2"})};
  expect_rewrite(m, "fuse_matmul", {"ai.lopper.FusedMatMul", "ai.lopper.FusedMatMul"});

  ir::Model two = model({{"x", {2, 5, 6}}, {"v", {6, 4}}});
  two.graph.nodes = {node("MatMul", {"x", "v"}, {"p"}), node("Relu", {"p"}, {"y1"})};
  expect_untouched(two, "fuse_matmul");
}

// Grouped-query attention's expanded keys, reshaped and transposed into a MatMul ->
// GroupedMatMul (the Expand stays); keys not made by an Expand are no repeat.
TEST(Fusion, FusesGroupedMatMul) {
  auto make = [](bool expanded) {
    ir::Model m = model({{"q", {1, 4, 5, 8}}, {"k", {1, 2, expanded ? 1 : 2, 5, 8}}});
    add(m, "e", at::tensor(std::vector<int64_t>{1, 2, 2, 5, 8}));
    add(m, "s", at::tensor(std::vector<int64_t>{1, 4, 5, 8}));
    m.graph.nodes = {
        node(expanded ? "Expand" : "Identity",
             expanded ? std::vector<std::string>{"k", "e"} : std::vector<std::string>{"k"}, {"ke"}),
        node("Reshape", {"ke", "s"}, {"kr"}),
        node("Transpose", {"kr"}, {"kt"}, {ints_attr("perm", {0, 1, 3, 2})}),
        node("MatMul", {"q", "kt"}, {"y1"})};
    return m;
  };
  expect_rewrite(make(true), "fuse_grouped_matmul", {"Expand", "ai.lopper.GroupedMatMul"});
  expect_untouched(make(false), "fuse_grouped_matmul");
}

// LLaMA's RMSNorm as PyTorch exports it -> RMSNormalization, at opset 17 (axes an attribute) and
// 18 (an input); a mean over another axis is no RMSNorm.
TEST(Fusion, FusesRmsNorm) {
  auto make = [](int64_t opset, int64_t axis) {
    ir::Model m = model({{"x", {2, 5, 8}}}, 1, opset);
    add_scalar(m, "two", 2.f);
    add_scalar(m, "eps", 1e-6f);
    add(m, "gamma", at::rand({8}) + 0.5);
    add(m, "axes", at::tensor(std::vector<int64_t>{axis}));
    ir::Node mean = opset >= 18 ? node("ReduceMean", {"p", "axes"}, {"ms"})
                                : node("ReduceMean", {"p"}, {"ms"}, {ints_attr("axes", {axis})});
    m.graph.nodes = {node("Pow", {"x", "two"}, {"p"}),   mean,
                     node("Add", {"ms", "eps"}, {"a"}),  node("Sqrt", {"a"}, {"r"}),
                     node("Reciprocal", {"r"}, {"inv"}), node("Mul", {"x", "inv"}, {"n"}),
                     node("Mul", {"n", "gamma"}, {"y1"})};
    return m;
  };
  expect_rewrite(make(17, -1), "fuse_rms_norm", {"RMSNormalization"});
  expect_rewrite(make(18, -1), "fuse_rms_norm", {"RMSNormalization"});
  expect_untouched(make(17, 1), "fuse_rms_norm");
}

// A residual Add normalised by a LayerNormalization -> AddLayerNormalization: post-norm (the
// sum read by the norm alone; a bias and none), pre-norm (the sum also read by the next residual:
// it is the fused node's second output), the norm over a middle axis (not the kernel's case: the
// node computes it unfused); a norm of computed scale, or one whose mean is asked for, stays.
TEST(Fusion, FusesAddLayerNorm) {
  auto make = [](bool bias, bool pre_norm, int64_t axis, bool computed_scale, bool stats) {
    ir::Model m = model({{"x", {2, 5, 8}}, {"r", {2, 5, 8}}}, pre_norm || stats ? 2 : 1);
    const std::vector<int64_t> normalized =
        axis == -1 ? std::vector<int64_t>{8} : std::vector<int64_t>{5, 8};
    add(m, "gamma", at::rand(normalized) + 0.5);
    add(m, "beta", at::randn(normalized));
    std::vector<std::string> in{"s", computed_scale ? "g2" : "gamma"};
    if (bias) in.push_back("beta");
    m.graph.nodes = {node("Add", {"x", "r"}, {"s"})};
    if (computed_scale) m.graph.nodes.push_back(node("Abs", {"gamma"}, {"g2"}));
    std::vector<std::string> out{"y1"};
    if (stats) out = {"y1", "y2"};
    m.graph.nodes.push_back(node("LayerNormalization", in, out, {int_attr("axis", axis)}));
    if (pre_norm) m.graph.nodes.push_back(node("Add", {"s", "y1"}, {"y2"}));
    return m;
  };
  const char* fused = "ai.lopper.AddLayerNormalization";
  expect_rewrite(make(true, false, -1, false, false), "fuse_add_layer_norm", {fused});
  expect_rewrite(make(false, false, -1, false, false), "fuse_add_layer_norm", {fused});
  expect_rewrite(make(true, true, -1, false, false), "fuse_add_layer_norm", {fused, "Add"});
  expect_rewrite(make(true, false, 1, false, false), "fuse_add_layer_norm", {fused});
  expect_untouched(make(true, false, -1, true, false), "fuse_add_layer_norm");
  expect_untouched(make(true, false, -1, false, true), "fuse_add_layer_norm");
  ir::Model pre = make(true, true, -1, false, false);
  ASSERT_TRUE(pass("fuse_add_layer_norm").apply(pre.graph, 17));
  EXPECT_EQ(pre.graph.nodes[0].outputs, (std::vector<std::string>{"y1", "s"}));
}

// Attention scores scaled by constants (the queries by one, the product divided by another) ->
// ScaledSoftmax of the plain product; a softmax over another axis stays.
TEST(Fusion, FusesScaledSoftmax) {
  auto make = [](int64_t axis) {
    ir::Model m = model({{"q", {1, 2, 5, 8}}, {"kt", {1, 2, 8, 5}}});
    add_scalar(m, "a", 0.35f);
    add_scalar(m, "c", 2.f);
    m.graph.nodes = {node("Mul", {"q", "a"}, {"qs"}), node("MatMul", {"qs", "kt"}, {"s"}),
                     node("Div", {"s", "c"}, {"sc"}),
                     node("Softmax", {"sc"}, {"y1"}, {int_attr("axis", axis)})};
    return m;
  };
  expect_rewrite(make(-1), "fuse_scaled_softmax", {"MatMul", "ai.lopper.ScaledSoftmax"});
  expect_untouched(make(1), "fuse_scaled_softmax");
}

// MatMul(Softmax(MatMul(q, kt)), v) -> ScaledAttention, and after a ScaledSoftmax; not when the
// probabilities are an output too.
TEST(Fusion, FusesAttention) {
  auto make = [](bool probs_read, bool scaled) {
    ir::Model m =
        model({{"q", {1, 2, 5, 8}}, {"kt", {1, 2, 8, 5}}, {"v", {1, 2, 5, 8}}}, probs_read ? 2 : 1);
    const std::string p = probs_read ? "y2" : "p";
    ir::Node soft = node("Softmax", {"s"}, {p}, {int_attr("axis", -1)});
    if (scaled) {
      soft =
          with_domain(node("ScaledSoftmax", {"s"}, {p}, {float_attr("scale", 0.25f)}), "ai.lopper");
    }
    m.graph.nodes = {node("MatMul", {"q", "kt"}, {"s"}), soft, node("MatMul", {p, "v"}, {"y1"})};
    return m;
  };
  expect_rewrite(make(false, false), "fuse_attention", {"ai.lopper.ScaledAttention"});
  expect_rewrite(make(false, true), "fuse_attention", {"ai.lopper.ScaledAttention"});
  expect_untouched(make(true, false), "fuse_attention");
}

// Q and Kt scaled by Muls whose factors are computed in the graph (torch's MultiheadAttention
// export): the Muls join the ScaledAttention as factor inputs, whichever side of the Mul the factor
// is on; one element joins the scale, more are multiplied in; the outputs stay the same.
TEST(Fusion, FusesAttentionWithComputedScales) {
  for (auto [fq, fk] : std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>>{
           {{}, {1}}, {{1, 1, 1, 1}, {1, 2, 1, 1}}, {{1, 2, 1, 8}, {}}}) {
    ir::Model m = model(
        {{"q", {1, 2, 5, 8}}, {"kt", {1, 2, 8, 5}}, {"v", {1, 2, 5, 8}}, {"fq", fq}, {"fk", fk}},
        1);
    m.graph.nodes = {node("Mul", {"q", "fq"}, {"qs"}), node("Mul", {"fk", "kt"}, {"ks"}),
                     node("MatMul", {"qs", "ks"}, {"s"}),
                     node("Softmax", {"s"}, {"p"}, {int_attr("axis", -1)}),
                     node("MatMul", {"p", "v"}, {"y1"})};
    expect_rewrite(m, "fuse_attention", {"ai.lopper.ScaledAttention"});
  }
}
