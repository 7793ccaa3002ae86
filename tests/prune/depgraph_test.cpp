// The structured-pruning dependency graph on tiny hand-built graphs: which layers share a channel
// group, what blocks a group, and what prune_structured cuts (exact slices, rewritten shapes and
// attributes). Every pruned model runs and equals the original with the removed channels zeroed.
#include "prune/depgraph.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "lopper/error.h"
#include "lopper/executor.h"
#include "lopper/structured.h"
#include "test_util.h"

using namespace lopper;
using Ints = std::vector<int64_t>;

namespace {

ir::Attribute attr(const char* name, int64_t v) {
  return {.name = name, .type = ir::AttrType::kInt, .i = v};
}
ir::Attribute attr(const char* name, Ints v) {
  return {.name = name, .type = ir::AttrType::kInts, .ints = std::move(v)};
}
ir::Attribute pads1() { return attr("pads", Ints{1, 1, 1, 1}); }

// A model with one float input "x" of a static shape and one output "y", built node by node.
struct Net {
  ir::Model m;
  explicit Net(const Ints& x) {
    m.ir_version = 8;
    m.opset_import = {{"", 17}};
    ir::TypeInfo t{ir::DType::kFloat, true, {}, "", ""};
    for (int64_t d : x) t.dims.push_back({d, ""});
    m.graph.inputs.push_back({"x", t, ""});
    m.graph.outputs.push_back({"y", {ir::DType::kFloat, false, {}, "", ""}, ""});
  }
  void init(const std::string& name, at::Tensor v) { m.graph.initializers.push_back({name, v}); }
  // The node is named after its first output.
  void op(const char* type, std::vector<std::string> in, std::vector<std::string> out,
          std::vector<ir::Attribute> attrs = {}) {
    ir::Node n;
    n.op_type = type, n.name = out[0], n.inputs = std::move(in), n.outputs = std::move(out);
    n.attrs = std::move(attrs);
    m.graph.nodes.push_back(std::move(n));
  }
};

at::Tensor init(const ir::Model& m, const std::string& name) {
  const auto* i = m.graph.find_initializer(name);
  EXPECT_NE(i, nullptr) << name;
  return i ? i->value : at::Tensor();
}
const ir::Node& node(const ir::Model& m, const std::string& name) {
  for (const auto& n : m.graph.nodes)
    if (n.name == name) return n;
  throw std::runtime_error("no node " + name);
}
// The constant node `n` reads as its input `k` (after pruning it may be a renamed copy).
at::Tensor input_of(const ir::Model& m, const std::string& n, size_t k) {
  return init(m, node(m, n).inputs.at(k));
}
at::Tensor longs(const Ints& v) { return at::tensor(v, at::kLong); }
// `t` with the entries `idx` along `axis` scaled by 0.01: makes those channels the least important.
at::Tensor scaled(at::Tensor t, int64_t axis, const Ints& idx) {
  return t.index_copy(axis, longs(idx), t.index_select(axis, longs(idx)) * 0.01);
}
// A copy of `m` whose initializers `names` are zero at `idx` along `axis`.
ir::Model zeroed(const ir::Model& m, const std::vector<std::string>& names, int64_t axis,
                 const Ints& idx) {
  ir::Model z = m;
  for (const auto& name : names) {
    auto* i = z.graph.find_initializer(name);
    if (i) i->value = i->value.index_fill(axis, longs(idx), 0);
    EXPECT_NE(i, nullptr) << name;
  }
  return z;
}
// The indices of 0 .. n-1 not in `removed`.
Ints kept(int64_t n, const Ints& removed) {
  Ints k;
  for (int64_t i = 0; i < n; ++i)
    if (std::find(removed.begin(), removed.end(), i) == removed.end()) k.push_back(i);
  return k;
}
// Initializer `name` of `after` is that of `before` cut to `keep` along `axis`, exactly.
void expect_slice(const ir::Model& before, const ir::Model& after, const std::string& name,
                  int64_t axis, const Ints& keep) {
  at::Tensor got = init(after, name), want = init(before, name).index_select(axis, longs(keep));
  EXPECT_TRUE(got.defined() && at::equal(got, want)) << name << " " << got.sizes();
}
// The pruned model runs, gives `shape`, and equals `zeroed` (the original without the channels).
void expect_runs_as(const ir::Model& pruned, const ir::Model& zeroed, const Ints& x_shape,
                    const Ints& shape) {
  at::manual_seed(7);
  at::Tensor x = at::randn(x_shape);
  Executor a(pruned), b(zeroed);
  at::Tensor ya = a.run({{"x", x}})[0], yb = b.run({{"x", x}})[0];
  EXPECT_EQ(ya.sizes().vec(), shape);
  EXPECT_LE(test::relative_max_diff(ya, yb), 1e-5);
}
StructuredOptions amount(double a, StructuredUnit unit = StructuredUnit::kChannel) {
  StructuredOptions o;
  o.amount = PruneAmount{a, false};
  o.unit = unit;
  return o;
}
using Names = std::vector<std::string>;

}  // namespace

// Residual: two convs feeding one Add are one group (atom i of each is one class), the consumer
// follows; the lowest channels go from both convs' filters and biases and the consumer's inputs.
TEST(DepGraph, ResidualAddCouplesBothConvsInOneGroup) {
  at::manual_seed(1);
  Net n({1, 4, 6, 6});
  const Ints low = {1, 2, 5, 6};
  n.init("wa", scaled(at::randn({8, 4, 3, 3}), 0, low)), n.init("ba", at::randn({8}));
  n.init("wb", scaled(at::randn({8, 4, 3, 3}), 0, low)), n.init("bb", at::randn({8}));
  n.init("w3", scaled(at::randn({5, 8, 1, 1}), 1, low));
  n.op("Conv", {"x", "wa", "ba"}, {"ca"}, {pads1()});
  n.op("Conv", {"x", "wb", "bb"}, {"cb"}, {pads1()});
  n.op("Add", {"ca", "cb"}, {"s"});
  n.op("Relu", {"s"}, {"r"});
  n.op("Conv", {"r", "w3"}, {"y"});

  StructuredReport g = channel_groups(n.m);
  ASSERT_EQ(g.groups.size(), 2u);
  EXPECT_EQ(g.groups[0].layers, (Names{"ca", "cb", "y"}));
  EXPECT_EQ(g.groups[0].size_before, 8);
  EXPECT_EQ(g.groups[0].blocked, "");
  EXPECT_EQ(g.groups[1].size_before, 5);
  EXPECT_EQ(g.groups[1].blocked, "graph output 'y'");
  EXPECT_EQ(g.barriers, Names{"graph output 'y'"});
  EXPECT_EQ(g.channels_before, 8);

  // The internals: atom i of ca (node 0) and atom i of cb (node 1) share a root, no two i do.
  depgraph::DepGraph dg = depgraph::build(n.m, node_shapes(n.m, {{"x", {1, 4, 6, 6}}}), false);
  Ints a, b;
  for (size_t x = 0; x < dg.source.size(); ++x)
    if (dg.source[x] <= 1) (dg.source[x] == 0 ? a : b).push_back(int64_t(x));
  ASSERT_EQ(a.size(), 8u);
  ASSERT_EQ(b.size(), 8u);
  for (size_t i = 0; i < 8; ++i) {
    EXPECT_EQ(dg.find(a[i]), dg.find(b[i]));
    if (i > 0) EXPECT_NE(dg.find(a[i]), dg.find(a[i - 1]));
  }

  ir::Model pruned = n.m;
  StructuredReport r = prune_structured(pruned, amount(0.5));
  EXPECT_EQ(r.groups[0].removed, low);
  EXPECT_EQ(r.groups[0].size_after, 4);
  for (const char* w : {"wa", "ba", "wb", "bb"}) expect_slice(n.m, pruned, w, 0, kept(8, low));
  expect_slice(n.m, pruned, "w3", 1, kept(8, low));
  expect_runs_as(pruned, zeroed(n.m, {"wa", "ba", "wb", "bb"}, 0, low), {1, 4, 6, 6}, {1, 5, 6, 6});
}

// x -> Conv ca (3) and Conv cb (5) -> Concat on the channels -> Conv y. Branch a's channel 1 and
// branch b's 0 and 3 (the consumer's columns 1, 3 and 6) score lowest.
static Net concat_net() {
  at::manual_seed(2);
  Net n({1, 2, 5, 5});
  n.init("wa", scaled(at::randn({3, 2, 1, 1}), 0, {1}));
  n.init("wb", scaled(at::randn({5, 2, 1, 1}), 0, {0, 3}));
  n.init("w3", scaled(at::randn({4, 8, 1, 1}), 1, {1, 3 + 0, 3 + 3}));
  n.op("Conv", {"x", "wa"}, {"ca"});
  n.op("Conv", {"x", "wb"}, {"cb"});
  n.op("Concat", {"ca", "cb"}, {"cat"}, {attr("axis", int64_t(1))});
  n.op("Conv", {"cat", "w3"}, {"y"});
  return n;
}

// Concat: each branch is its own group, and its channels sit at the branch's offset in the
// consumer's weight (branch a: columns 0..2, branch b: 3..7).
TEST(DepGraph, ConcatPutsEachBranchAtItsOffset) {
  Net n = concat_net();
  StructuredReport g = channel_groups(n.m);
  ASSERT_EQ(g.groups.size(), 3u);
  EXPECT_EQ(g.groups[0].layers, (Names{"ca", "y"}));
  EXPECT_EQ(g.groups[0].size_before, 3);
  EXPECT_EQ(g.groups[1].layers, (Names{"cb", "y"}));  // y's weight follows both branches
  EXPECT_EQ(g.groups[1].size_before, 5);
  EXPECT_EQ(g.groups[2].blocked, "graph output 'y'");

  ir::Model pruned = n.m;
  StructuredReport r = prune_structured(pruned, amount(0.4));  // 1 of 3, 2 of 5
  EXPECT_EQ(r.groups[0].removed, Ints{1});
  EXPECT_EQ(r.groups[1].removed, (Ints{0, 3}));
  expect_slice(n.m, pruned, "wa", 0, {0, 2});
  expect_slice(n.m, pruned, "wb", 0, {1, 2, 4});
  expect_slice(n.m, pruned, "w3", 1, {0, 2, 3 + 1, 3 + 2, 3 + 4});
  ir::Model z = zeroed(zeroed(n.m, {"wa"}, 0, {1}), {"wb"}, 0, {0, 3});
  expect_runs_as(pruned, z, {1, 2, 5, 5}, {1, 4, 5, 5});
}

// x -> Conv c1 (6) -> Split [2, 4] -> Conv ca, Conv cb -> Add -> y; c1's channels `low` score
// lowest (their filters and their columns in ca or cb).
static Net split_net(const Ints& low) {
  at::manual_seed(3);
  Net n({1, 3, 4, 4});
  Ints in_a, in_b;  // their indices in s0 and s1
  for (int64_t c : low) (c < 2 ? in_a : in_b).push_back(c < 2 ? c : c - 2);
  n.init("w1", scaled(at::randn({6, 3, 1, 1}), 0, low)), n.init("b1", at::randn({6}));
  n.init("wa", scaled(at::randn({3, 2, 1, 1}), 1, in_a));
  n.init("wb", scaled(at::randn({3, 4, 1, 1}), 1, in_b));
  n.init("sizes", longs({2, 4}));
  n.op("Conv", {"x", "w1", "b1"}, {"c1"});
  n.op("Split", {"c1", "sizes"}, {"s0", "s1"}, {attr("axis", int64_t(1))});
  n.op("Conv", {"s0", "wa"}, {"ca"});
  n.op("Conv", {"s1", "wb"}, {"cb"});
  n.op("Add", {"ca", "cb"}, {"y"});
  return n;
}

// Split: one conv's channels feed two branches; removing channels rewrites the split sizes and
// cuts each branch's weight at the channel's index within its part.
TEST(DepGraph, SplitRewritesItsSizesAndEachBranch) {
  const Ints low = {0, 3, 4};
  Net n = split_net(low);
  StructuredReport g = channel_groups(n.m);
  ASSERT_EQ(g.groups.size(), 2u);
  EXPECT_EQ(g.groups[0].layers, (Names{"c1", "ca", "cb"}));
  EXPECT_EQ(g.groups[0].size_before, 6);
  EXPECT_EQ(g.groups[1].layers, (Names{"ca", "cb"}));  // coupled by the Add
  EXPECT_EQ(g.groups[1].blocked, "graph output 'y'");

  ir::Model pruned = n.m;
  StructuredReport r = prune_structured(pruned, amount(0.5));
  EXPECT_EQ(r.groups[0].removed, low);
  expect_slice(n.m, pruned, "w1", 0, {1, 2, 5});
  expect_slice(n.m, pruned, "b1", 0, {1, 2, 5});
  EXPECT_TRUE(at::equal(input_of(pruned, "s0", 1), longs({1, 2})));
  expect_slice(n.m, pruned, "wa", 1, {1});     // c1's 1
  expect_slice(n.m, pruned, "wb", 1, {0, 3});  // c1's 2 and 5
  expect_runs_as(pruned, zeroed(n.m, {"w1", "b1"}, 0, low), {1, 3, 4, 4}, {1, 3, 4, 4});
}

// Grouped conv (group 2): its input channels go in equal numbers from each group even when the
// lowest scores all sit in one; the weight keeps, per group, the columns of that group's inputs.
TEST(DepGraph, GroupedConvLosesEqualNumbersPerGroup) {
  at::manual_seed(4);
  Net n({1, 4, 5, 5});
  // Filter scales: 0..3 lowest, then 5 and 6 (the grouped conv's input weights are not scored).
  at::Tensor s = at::tensor({1e-4, 2e-4, 3e-4, 4e-4, 1.0, 1e-2, 2e-2, 1.0}, at::kFloat);
  at::Tensor wg = at::randn({8, 4, 3, 3});
  n.init("w1", at::randn({8, 4, 3, 3}) * s.view({8, 1, 1, 1})), n.init("b1", at::randn({8}));
  n.init("wg", wg), n.init("w3", at::randn({3, 8, 1, 1}));
  n.op("Conv", {"x", "w1", "b1"}, {"c1"}, {pads1()});
  n.op("Conv", {"c1", "wg"}, {"g"}, {attr("group", int64_t(2)), pads1()});
  n.op("Conv", {"g", "w3"}, {"y"});

  StructuredReport g = channel_groups(n.m);
  ASSERT_EQ(g.groups.size(), 3u);
  EXPECT_EQ(g.groups[0].layers, (Names{"c1", "g"}));  // g's weight is cut by an edit
  EXPECT_EQ(g.groups[0].size_before, 8);
  EXPECT_EQ(g.groups[0].blocks, 2);
  EXPECT_EQ(g.groups[1].layers, (Names{"g", "y"}));
  EXPECT_EQ(g.groups[1].blocks, 2);

  ir::Model pruned = n.m;
  StructuredOptions o;
  o.group_amounts = {{0, 0.5}};  // only c1's channels
  StructuredReport r = prune_structured(pruned, o);
  EXPECT_EQ(r.groups[0].removed, (Ints{0, 1, 5, 6}));
  EXPECT_EQ(r.groups[1].size_after, 8);
  expect_slice(n.m, pruned, "w1", 0, {2, 3, 4, 7});
  at::Tensor want = at::cat({wg.narrow(0, 0, 4).index_select(1, longs({2, 3})),
                             wg.narrow(0, 4, 4).index_select(1, longs({0, 3}))});
  EXPECT_TRUE(at::equal(init(pruned, "wg"), want));
  EXPECT_EQ(node(pruned, "g").attr("group")->i, 2);
  expect_runs_as(pruned, zeroed(n.m, {"w1", "b1"}, 0, {0, 1, 5, 6}), {1, 4, 5, 5}, {1, 3, 5, 5});
}

// Depthwise (channel multiplier 2): its filters follow their input channel (channel c owns rows
// 2c, 2c+1), the `group` attribute follows the kept count, and the next conv loses both columns.
TEST(DepGraph, DepthwiseFollowsItsInputChannel) {
  at::manual_seed(5);
  Net n({1, 2, 5, 5});
  const Ints low = {1, 4};
  const Ints rows = {0, 1, 4, 5, 6, 7, 10, 11}, gone = {2, 3, 8, 9};  // channel c: rows 2c, 2c+1
  n.init("w1", scaled(at::randn({6, 2, 3, 3}), 0, low)), n.init("b1", at::randn({6}));
  n.init("wd", scaled(at::randn({12, 1, 3, 3}), 0, gone)), n.init("bd", at::randn({12}));
  n.init("w3", scaled(at::randn({5, 12, 1, 1}), 1, gone));
  n.op("Conv", {"x", "w1", "b1"}, {"c1"}, {pads1()});
  n.op("Conv", {"c1", "wd", "bd"}, {"dw"}, {attr("group", int64_t(6)), pads1()});
  n.op("Conv", {"dw", "w3"}, {"y"});

  StructuredReport g = channel_groups(n.m);
  ASSERT_EQ(g.groups.size(), 2u);
  EXPECT_EQ(g.groups[0].layers, (Names{"c1", "dw", "y"}));
  EXPECT_EQ(g.groups[0].size_before, 6);
  EXPECT_EQ(g.groups[0].blocks, 1);

  ir::Model pruned = n.m;
  StructuredReport r = prune_structured(pruned, amount(0.34));  // 2 of 6
  EXPECT_EQ(r.groups[0].removed, low);
  expect_slice(n.m, pruned, "w1", 0, {0, 2, 3, 5});
  expect_slice(n.m, pruned, "wd", 0, rows);
  expect_slice(n.m, pruned, "bd", 0, rows);
  expect_slice(n.m, pruned, "w3", 1, rows);
  EXPECT_EQ(node(pruned, "dw").attr("group")->i, 4);
  ir::Model z = zeroed(zeroed(n.m, {"w1", "b1"}, 0, low), {"bd"}, 0, gone);
  expect_runs_as(pruned, z, {1, 2, 5, 5}, {1, 5, 5, 5});
}

// Flatten into Gemm: a conv channel becomes a block of 16 Gemm input features (channel c:
// columns 16c .. 16c+15 of the transposed weight).
TEST(DepGraph, FlattenMapsAChannelToABlockOfGemmColumns) {
  at::manual_seed(6);
  Net n({2, 2, 4, 4});
  const Ints low = {1, 3};
  Ints low_cols, cols;  // channel c: features 16c .. 16c+15
  for (int64_t c = 0; c < 4; ++c)
    for (int64_t j = 0; j < 16; ++j) (c == 1 || c == 3 ? low_cols : cols).push_back(16 * c + j);
  n.init("w1", scaled(at::randn({4, 2, 3, 3}), 0, low)), n.init("b1", at::randn({4}));
  n.init("wf", scaled(at::randn({10, 64}), 1, low_cols)), n.init("bf", at::randn({10}));
  n.op("Conv", {"x", "w1", "b1"}, {"c1"}, {pads1()});
  n.op("Relu", {"c1"}, {"r"});
  n.op("Flatten", {"r"}, {"f"}, {attr("axis", int64_t(1))});
  n.op("Gemm", {"f", "wf", "bf"}, {"y"}, {attr("transB", int64_t(1))});

  StructuredReport g = channel_groups(n.m);
  ASSERT_EQ(g.groups.size(), 2u);
  EXPECT_EQ(g.groups[0].layers, (Names{"c1", "y"}));
  EXPECT_EQ(g.groups[0].size_before, 4);
  EXPECT_EQ(g.groups[1].size_before, 10);
  EXPECT_EQ(g.groups[1].blocked, "graph output 'y'");

  ir::Model pruned = n.m;
  StructuredReport r = prune_structured(pruned, amount(0.5));
  EXPECT_EQ(r.groups[0].removed, low);
  expect_slice(n.m, pruned, "wf", 1, cols);
  expect_slice(n.m, pruned, "bf", 0, kept(10, {}));
  expect_runs_as(pruned, zeroed(n.m, {"w1", "b1"}, 0, low), {2, 2, 4, 4}, {2, 10});
}

// The heads of self-attention on x by wq, wk, wv: each projection reshaped by "hs" into heads,
// the scores' softmax, the context back as "ct" [batch, sequence, heads, head_dim].
static void attention_heads(Net& n) {
  for (std::string p : {"q", "k", "v"}) {
    n.op("MatMul", {"x", "w" + p}, {p});
    n.op("Reshape", {p, "hs"}, {p + "r"});
  }
  n.op("Transpose", {"qr"}, {"qt"}, {attr("perm", Ints{0, 2, 1, 3})});
  n.op("Transpose", {"kr"}, {"kt"}, {attr("perm", Ints{0, 2, 3, 1})});
  n.op("Transpose", {"vr"}, {"vt"}, {attr("perm", Ints{0, 2, 1, 3})});
  n.op("MatMul", {"qt", "kt"}, {"sc"});
  n.op("Softmax", {"sc"}, {"p"}, {attr("axis", int64_t(-1))});
  n.op("MatMul", {"p", "vt"}, {"ctx"});
  n.op("Transpose", {"ctx"}, {"ct"}, {attr("perm", Ints{0, 2, 1, 3})});
}

// The features of heads 1 and 3 of the attention nets' 4 heads of 8.
const Ints kHeads1And3 = {8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31};

// n's channel groups under --structured head: two, the first one of `heads` whole heads.
static void head_groups(const Net& n, int64_t heads, StructuredReport& g) {
  g = channel_groups(n.m, amount(0, StructuredUnit::kHead));
  ASSERT_EQ(g.groups.size(), 2u);
  EXPECT_EQ(g.groups[0].kind, "head");
  EXPECT_EQ(g.groups[0].size_before, heads);
}

// n's attention with half its 4 heads pruned: heads 1 and 3 (`cols`, their features) go from
// the projections' columns and the output's rows.
static ir::Model without_heads_1_and_3(const Net& n, const Ints& cols) {
  ir::Model pruned = n.m;
  StructuredReport r = prune_structured(pruned, amount(0.5, StructuredUnit::kHead));
  EXPECT_EQ(r.groups[0].removed, (Ints{1, 3}));
  const Ints keep = kept(32, cols);
  for (const char* w : {"wq", "wk", "wv"}) expect_slice(n.m, pruned, w, 1, keep);
  expect_slice(n.m, pruned, "wo", 0, keep);
  return pruned;
}

// Self-attention, 4 heads of 8: Q/K/V MatMul -> Reshape [1,3,4,8] (one shared target) ->
// Transpose -> MatMul -> Softmax -> MatMul -> Transpose -> Reshape [1,3,32] -> MatMul.
static Net attention(const Ints& low_cols) {
  at::manual_seed(8);
  Net n({1, 3, 32});
  for (const char* w : {"wq", "wk", "wv"}) n.init(w, scaled(at::randn({32, 32}), 1, low_cols));
  n.init("wo", scaled(at::randn({32, 32}), 0, low_cols));
  n.init("hs", longs({1, 3, 4, 8}));
  n.init("os", longs({1, 3, 32}));
  attention_heads(n);
  n.op("Reshape", {"ct", "os"}, {"o"});
  n.op("MatMul", {"o", "wo"}, {"y"});
  return n;
}

// --structured head: Q, K and V's heads are one group of 4 whole heads; two go, every reshape
// target follows, and the output projection loses those heads' rows.
TEST(DepGraph, AttentionHeadsGoWhole) {
  const Ints& cols = kHeads1And3;
  Net n = attention(cols);
  StructuredReport g;
  ASSERT_NO_FATAL_FAILURE(head_groups(n, 4, g));
  EXPECT_EQ(g.groups[0].layers, (Names{"q", "k", "v", "y"}));
  EXPECT_EQ(g.groups[1].kind, "channel");
  EXPECT_EQ(g.groups[1].blocked, "graph output 'y'");

  const ir::Model pruned = without_heads_1_and_3(n, cols);
  for (const char* rs : {"qr", "kr", "vr"})
    EXPECT_TRUE(at::equal(input_of(pruned, rs, 1), longs({1, 3, 2, 8}))) << rs;
  EXPECT_TRUE(at::equal(input_of(pruned, "o", 1), longs({1, 3, 16})));
  expect_runs_as(pruned, zeroed(n.m, {"wo"}, 0, cols), {1, 3, 32}, {1, 3, 32});
}

// --structured channel on the same graph: the split takes the inner axis (head_dim, fewest atoms
// merged), so dim d of every head is one class. Q and K's dims are contracted together: one
// group; V's carry through to the output projection: another. Two of 8 go from each, every head.
TEST(DepGraph, AttentionChannelsPruneHeadDimAcrossHeads) {
  Ints cols;
  for (int64_t h = 0; h < 4; ++h) cols.push_back(8 * h + 2), cols.push_back(8 * h + 5);
  std::sort(cols.begin(), cols.end());
  Net n = attention(cols);
  StructuredReport g = channel_groups(n.m);
  ASSERT_EQ(g.groups.size(), 3u);
  EXPECT_EQ(g.groups[0].layers, (Names{"q", "k"}));
  EXPECT_EQ(g.groups[0].size_before, 8);
  EXPECT_EQ(g.groups[1].layers, (Names{"v", "y"}));
  EXPECT_EQ(g.groups[1].size_before, 8);
  EXPECT_EQ(g.groups[2].blocked, "graph output 'y'");

  ir::Model pruned = n.m;
  StructuredReport r = prune_structured(pruned, amount(0.25));
  EXPECT_EQ(r.groups[0].removed, (Ints{2, 5}));
  EXPECT_EQ(r.groups[1].removed, (Ints{2, 5}));
  const Ints keep = kept(32, cols);
  for (const char* w : {"wq", "wk", "wv"}) expect_slice(n.m, pruned, w, 1, keep);
  expect_slice(n.m, pruned, "wo", 0, keep);
  for (const char* rs : {"qr", "kr", "vr"})
    EXPECT_TRUE(at::equal(input_of(pruned, rs, 1), longs({1, 3, 4, 6}))) << rs;
  EXPECT_TRUE(at::equal(input_of(pruned, "o", 1), longs({1, 3, 24})));
  expect_runs_as(pruned, zeroed(n.m, {"wq", "wk", "wv"}, 1, cols), {1, 3, 32}, {1, 3, 32});
}

// Barriers: a Softmax over the channels and an op with no channel rule (LRN) block the groups
// before them, each named once; with nothing prunable, prune_structured refuses and leaves the
// model alone.
TEST(DepGraph, BarriersBlockTheirGroupsAndAreNamed) {
  at::manual_seed(9);
  Net n({1, 3, 4, 4});
  n.init("w1", at::randn({4, 3, 1, 1})), n.init("w2", at::randn({4, 4, 1, 1}));
  n.init("w3", at::randn({2, 4, 1, 1}));
  n.op("Conv", {"x", "w1"}, {"c1"});
  n.op("Softmax", {"c1"}, {"sm"}, {attr("axis", int64_t(1))});
  n.op("Conv", {"sm", "w2"}, {"c2"});
  n.op("LRN", {"c2"}, {"lrn"}, {attr("size", int64_t(3))});
  n.op("Conv", {"lrn", "w3"}, {"y"});

  const std::string sm = "node 'sm' (Softmax): Softmax normalises over the channels";
  const std::string lrn = "node 'lrn' (LRN): no channel rule for LRN";
  StructuredReport g = channel_groups(n.m);
  ASSERT_EQ(g.groups.size(), 3u);
  EXPECT_EQ(g.groups[0].blocked, sm);
  EXPECT_EQ(g.groups[1].blocked, lrn);
  EXPECT_EQ(g.groups[2].blocked, "graph output 'y'");
  EXPECT_EQ(g.barriers, (Names{sm, lrn, "graph output 'y'"}));
  EXPECT_EQ(g.channels_before, 0);

  ir::Model m = n.m;
  try {
    prune_structured(m, amount(0.5));
    ADD_FAILURE() << "pruned a model with no free group";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "[prune] no channel group can be pruned: barriers: " + sm);
  }
  EXPECT_EQ(init(m, "w1").sizes().vec(), (Ints{4, 3, 1, 1}));
  EXPECT_EQ(m.graph.nodes.size(), 5u);
}

// A group's layers name every node whose parameters follow its channels, whichever of its channels
// come first: a Concat consumer's weight under each branch, a grouped conv (whose input side an
// edit cuts, not a slice) under its input's group. --exclude and recipe rules match on these
// names, so they reach such groups.
TEST(DepGraph, LayersListEveryNodeThatShrinks) {
  StructuredReport g = channel_groups(concat_net().m);
  ASSERT_EQ(g.groups.size(), 3u);
  EXPECT_EQ(g.groups[1].layers, (Names{"cb", "y"}));
  Net n({1, 4, 5, 5});
  n.init("w1", at::randn({8, 4, 1, 1})), n.init("wg", at::randn({8, 4, 1, 1}));
  n.op("Conv", {"x", "w1"}, {"c1"});
  n.op("Conv", {"c1", "wg"}, {"y"}, {attr("group", int64_t(2))});
  g = channel_groups(n.m);
  ASSERT_FALSE(g.groups.empty());
  EXPECT_EQ(g.groups[0].layers, (Names{"c1", "y"}));
  ir::Model m = n.m;
  StructuredOptions o = amount(0.5);
  o.exclude = "y";  // y is a layer of both groups: nothing is left to prune
  EXPECT_THROW(prune_structured(m, o), Error);
}

// channel_group_slices splits a weight that follows several groups (a Concat consumer's) into
// one slice per group, each with only that group's positions along the axis and their channels
// in that group: w3 gives {group 0, columns 0..2 -> channels 0..2} and {group 1, columns 3..7 ->
// channels 0..4}, so the trainer's group lasso charges each column to its own branch. A blocked
// branch (its channels are also a graph output) is left out, its columns with it.
TEST(DepGraph, GroupSlicesOfAConcatConsumerFollowEachBranch) {
  Net n = concat_net();
  GroupSlices gs = channel_group_slices(n.m);
  ASSERT_EQ(gs.group_sizes, (Ints{3, 5}));
  int64_t b_cols = 0;  // w3's columns charged to branch b's group
  for (const auto& s : gs.slices) {
    ASSERT_EQ(s.index.size(), s.channel.size()) << s.weight;
    for (int64_t c : s.channel) {
      EXPECT_LT(c, gs.group_sizes.at(s.group)) << s.weight;
      b_cols += s.weight == "w3" && s.group == 1;
    }
    if (s.weight == "w3") {
      EXPECT_EQ(s.axis, 1);
      EXPECT_EQ(s.index, s.group == 0 ? (Ints{0, 1, 2}) : (Ints{3, 4, 5, 6, 7}));
      EXPECT_EQ(s.channel, s.group == 0 ? (Ints{0, 1, 2}) : (Ints{0, 1, 2, 3, 4}));
    }
  }
  EXPECT_EQ(b_cols, 5);
  n.m.graph.outputs.push_back({"cb", {ir::DType::kFloat, false, {}, "", ""}, ""});
  EXPECT_NO_THROW(gs = channel_group_slices(n.m));
  EXPECT_EQ(gs.group_sizes, Ints{3});
  for (const auto& s : gs.slices) {
    EXPECT_EQ(s.group, 0) << s.weight;
    if (s.weight == "w3") EXPECT_EQ(s.index, (Ints{0, 1, 2}));
  }
}

// A Split output keeps one channel: when the lowest channels are all of one part (here c1's 0 and
// 1, all of s0), that part's best channel stays and the next lowest goes instead, so the group
// still loses 2 and the Conv after s0 keeps an input. As many go as the parts allow: of 6
// channels in parts of 2 and 4, at most 4 (one stays in each part).
TEST(DepGraph, SplitPartNeverLosesAllItsChannels) {
  Net n = split_net({0, 1});
  ir::Model pruned = n.m;
  StructuredOptions o;
  o.amount = PruneAmount{2, true};
  StructuredReport r;
  ASSERT_NO_THROW(r = prune_structured(pruned, o));
  const Ints gone = r.groups[0].removed;
  ASSERT_EQ(gone.size(), 2u);
  EXPECT_LT(gone[0], 2);  // the lower of s0's two; the other stays
  EXPECT_GE(gone[1], 2);  // the lowest of s1's
  EXPECT_TRUE(r.warnings.empty());
  EXPECT_TRUE(at::equal(input_of(pruned, "s0", 1), longs({1, 3})));
  expect_slice(n.m, pruned, "wa", 1, {1 - gone[0]});
  expect_runs_as(pruned, zeroed(n.m, {"w1", "b1"}, 0, gone), {1, 3, 4, 4}, {1, 3, 4, 4});

  pruned = n.m;
  o.amount = PruneAmount{0.9, false};  // 5 of 6 without the parts
  ASSERT_NO_THROW(r = prune_structured(pruned, o));
  EXPECT_EQ(r.groups[0].size_after, 2);
  EXPECT_TRUE(at::equal(input_of(pruned, "s0", 1), longs({1, 1})));
  Executor e(pruned);
  EXPECT_EQ(e.run({{"x", at::randn({1, 3, 4, 4})}})[0].sizes().vec(), (Ints{1, 3, 4, 4}));
}

// x [N, S, 32] with a dynamic batch and sequence (the symbolic dims "N" and "S").
static Net dynamic_net() {
  Net n({1, 3, 32});
  n.m.graph.inputs[0].type.dims = {{-1, "N"}, {-1, "S"}, {32, ""}};
  return n;
}

// `name` = Unsqueeze(Gather(Shape(x), i)): one run-time size of x as a 1-element vector.
static void size_of(Net& n, const std::string& x, int64_t i, const std::string& name) {
  n.init(name + "_i", longs({i}).reshape({}));
  n.op("Shape", {x}, {name + "_shape"});
  n.op("Gather", {name + "_shape", name + "_i"}, {name + "_g"}, {attr("axis", int64_t(0))});
  n.op("Unsqueeze", {name + "_g", "zero"}, {name});
}

// Self-attention, 4 heads of 8, as torch.export writes it with a dynamic batch and sequence:
// the heads' target [N, S, -1, 8] is Concat(Shape(x)[0], Shape(x)[1], -1, 8), one shared by
// Q, K and V; the merge's [N, S, H * D] multiplies the sizes of the merged tensor (H * D =
// Shape(ct)[2] * Shape(ct)[3]).
static Net dynamic_attention(const Ints& low_cols) {
  at::manual_seed(10);
  Net n = dynamic_net();
  for (const char* w : {"wq", "wk", "wv"}) n.init(w, scaled(at::randn({32, 32}), 1, low_cols));
  n.init("wo", scaled(at::randn({32, 32}), 0, low_cols));
  n.init("zero", longs({0}));
  n.init("minus1", longs({-1}));
  n.init("hd", longs({8}));
  size_of(n, "x", 0, "b");
  size_of(n, "x", 1, "s");
  n.op("Concat", {"b", "s", "minus1", "hd"}, {"hs"}, {attr("axis", int64_t(0))});
  attention_heads(n);
  n.init("two", longs({2}).reshape({}));
  n.init("three", longs({3}).reshape({}));
  n.op("Shape", {"ct"}, {"cts"});
  n.op("Gather", {"cts", "two"}, {"heads"}, {attr("axis", int64_t(0))});
  n.op("Gather", {"cts", "three"}, {"head_dim"}, {attr("axis", int64_t(0))});
  n.op("Mul", {"heads", "head_dim"}, {"hidden"});
  n.op("Unsqueeze", {"hidden", "zero"}, {"hidden1"});
  n.op("Concat", {"b", "s", "hidden1"}, {"os"}, {attr("axis", int64_t(0))});
  n.op("Reshape", {"ct", "os"}, {"o"});
  n.op("MatMul", {"o", "wo"}, {"y"});
  return n;
}

// The literal a Reshape's computed target holds at entry 3: the 1-element initializer the
// Concat making its target reads as input 3.
static int64_t head_dim_of(const ir::Model& m, const std::string& reshape) {
  const std::string& target = node(m, reshape).inputs.at(1);
  for (const auto& c : m.graph.nodes)
    if (!c.outputs.empty() && c.outputs[0] == target)
      return init(m, c.inputs.at(3)).item<int64_t>();
  throw std::runtime_error("no node makes " + target);
}

// The pruned model runs at every input shape in `shapes` and equals `zeroed` there.
static void expect_runs_as_at(const ir::Model& pruned, const ir::Model& zeroed,
                              const std::vector<Ints>& shapes) {
  for (const auto& s : shapes) {
    at::manual_seed(11);
    at::Tensor x = at::randn(s);
    Executor a(pruned), b(zeroed);
    at::Tensor ya = a.run({{"x", x}})[0], yb = b.run({{"x", x}})[0];
    EXPECT_EQ(ya.sizes().vec(), yb.sizes().vec());
    EXPECT_LE(test::relative_max_diff(ya, yb), 1e-5) << at::IntArrayRef(s);
  }
}

// --structured head on a dynamic-shape export: the targets computed from Shape are followed, so
// whole heads go; the -1 takes the new head count, the batch and sequence stay run-time sizes,
// and the merge's Shape(ct)[2] * Shape(ct)[3] follows by itself. The model runs at other batch
// and sequence sizes.
TEST(DepGraph, DynamicShapeTargetsFollowHeads) {
  const Ints& cols = kHeads1And3;
  Net n = dynamic_attention(cols);
  StructuredReport g;
  ASSERT_NO_FATAL_FAILURE(head_groups(n, 4, g));
  EXPECT_EQ(g.groups[0].blocked, "");

  const ir::Model pruned = without_heads_1_and_3(n, cols);
  for (const char* rs : {"qr", "kr", "vr"}) {
    EXPECT_EQ(node(pruned, rs).inputs[1], "hs") << rs;  // untouched: -1 and 8
    EXPECT_EQ(head_dim_of(pruned, rs), 8) << rs;
  }
  EXPECT_TRUE(at::equal(init(pruned, "minus1"), longs({-1})));
  EXPECT_EQ(node(pruned, "o").inputs[1], "os");
  expect_runs_as_at(pruned, zeroed(n.m, {"wo"}, 0, cols), {{1, 3, 32}, {3, 11, 32}, {2, 1, 32}});
}

// --structured channel on the same export: head_dim is the tracked axis, so the literal 8 in the
// shared target is rewritten. Q and K lose 2 dims per head, V 4 (amounts per group): V's reshape
// and K get copies of the Concat with 6, V keeps the original with 4.
TEST(DepGraph, DynamicShapeTargetsFollowHeadDimPerReader) {
  Ints qk_low, v_low;
  for (int64_t h = 0; h < 4; ++h) {
    for (int64_t d : {1, 6}) qk_low.push_back(8 * h + d);
    for (int64_t d : {0, 2, 5, 7}) v_low.push_back(8 * h + d);
  }
  std::sort(qk_low.begin(), qk_low.end());
  std::sort(v_low.begin(), v_low.end());
  Net n = dynamic_attention({});
  n.m.graph.find_initializer("wq")->value = scaled(init(n.m, "wq"), 1, qk_low);
  n.m.graph.find_initializer("wk")->value = scaled(init(n.m, "wk"), 1, qk_low);
  n.m.graph.find_initializer("wv")->value = scaled(init(n.m, "wv"), 1, v_low);
  n.m.graph.find_initializer("wo")->value = scaled(init(n.m, "wo"), 0, v_low);
  StructuredReport g = channel_groups(n.m);
  ASSERT_EQ(g.groups.size(), 3u);
  EXPECT_EQ(g.groups[0].layers, (Names{"q", "k"}));
  EXPECT_EQ(g.groups[1].layers, (Names{"v", "y"}));
  EXPECT_EQ(g.groups[0].blocked, "");
  EXPECT_EQ(g.groups[1].blocked, "");

  ir::Model pruned = n.m;
  StructuredOptions o;
  o.group_amounts = {{0, 0.25}, {1, 0.5}};
  StructuredReport r = prune_structured(pruned, o);
  EXPECT_EQ(r.groups[0].removed, (Ints{1, 6}));
  EXPECT_EQ(r.groups[1].removed, (Ints{0, 2, 5, 7}));
  EXPECT_EQ(head_dim_of(pruned, "qr"), 6);
  EXPECT_EQ(head_dim_of(pruned, "kr"), 6);
  EXPECT_EQ(head_dim_of(pruned, "vr"), 4);
  EXPECT_NE(node(pruned, "vr").inputs[1], node(pruned, "qr").inputs[1]);
  expect_slice(n.m, pruned, "wq", 1, kept(32, qk_low));
  expect_slice(n.m, pruned, "wv", 1, kept(32, v_low));
  expect_slice(n.m, pruned, "wo", 0, kept(32, v_low));
  ir::Model z = zeroed(zeroed(n.m, {"wq", "wk"}, 1, qk_low), {"wv"}, 1, v_low);
  expect_runs_as_at(pruned, z, {{1, 3, 32}, {3, 11, 32}});
}

// Where the shape arithmetic cannot be followed, the Reshape is a barrier that says what stops
// it and what to do: here the heads' head_dim is Div(Shape(q)[2], 4) — after a head goes it
// would no longer be 8 — and, in a second model, the batch entry comes from a Max lopper does
// not follow. With static input dims the analysis run's target is used instead, and heads go.
TEST(DepGraph, UnfollowedShapeArithmeticNamesWhatStopsIt) {
  auto with_target = [](bool div) {
    Net n = dynamic_attention({});
    std::string from;  // the Concat's new input
    if (div) {         // 8 = Shape(q)[2] / 4
      n.init("four", longs({4}).reshape({}));
      n.op("Shape", {"q"}, {"qs"});
      n.op("Gather", {"qs", "two"}, {"qh"}, {attr("axis", int64_t(0))});
      n.op("Div", {"qh", "four"}, {"qd"});
      n.op("Unsqueeze", {"qd", "zero"}, {"qd1"});
      from = "qd1";
    } else {  // batch = Max(b, b)
      n.op("Max", {"b", "b"}, {"mx"});
      from = "mx";
    }
    for (auto& x : n.m.graph.nodes)
      if (x.name == "hs") x.inputs[div ? 3 : 0] = from;
    return n;
  };
  const std::string hint = "; export the model with static input shapes to prune across it";
  for (bool div : {true, false}) {
    Net n = with_target(div);
    ir::Model m = n.m;
    try {
      prune_structured(m, amount(0.5, StructuredUnit::kHead));
      ADD_FAILURE() << "pruned heads across an unfollowed target";
    } catch (const Error& e) {
      const std::string why =
          div ? "its entry 3 follows a channel count on an axis without one"
              : "its entry 0 is not followed: it is computed by node 'mx' (Max), which lopper "
                "does not follow";
      EXPECT_EQ(std::string(e.what()),
                "[prune] no channel group can be pruned: barriers: node 'qr' (Reshape): Reshape "
                "to a shape computed at run time (" +
                    why + ")" + hint);
    }
    n.m.graph.inputs[0].type.dims = {{1, ""}, {3, ""}, {32, ""}};
    m = n.m;
    StructuredReport r;
    ASSERT_NO_THROW(r = prune_structured(m, amount(0.5, StructuredUnit::kHead))) << div;
    EXPECT_EQ(r.groups[0].size_after, 2);
    Executor e(m);
    EXPECT_EQ(e.run({{"x", at::randn({1, 3, 32})}})[0].sizes().vec(), (Ints{1, 3, 32}));
  }
}

// Grouped-query attention, 4 query heads and 2 key/value heads of 8, LLaMA's repeat_kv
// (Unsqueeze, Expand to [1, 2, 2, 3, 8], Reshape to [1, 4, 3, 8]); K's Expand shape is
// TorchScript's Where(Equal(shape, -1), 1, shape) on constants. Query heads 2j, 2j+1 read
// key/value head j, so a kv head and its two query heads are one class: --structured head
// removes them together (the split [1, 3, 2, 8] takes heads, not head_dim, after the query
// split showed head_dim 8), and every shape follows.
TEST(DepGraph, GroupedQueryHeadsGoWithTheirKeyValueHead) {
  at::manual_seed(12);
  Net n({1, 3, 32});
  Ints q_low, kv_low;  // kv head 1: query heads 2 and 3
  for (int64_t i = 16; i < 32; ++i) q_low.push_back(i);
  for (int64_t i = 8; i < 16; ++i) kv_low.push_back(i);
  n.init("wq", scaled(at::randn({32, 32}), 1, q_low));
  n.init("wk", scaled(at::randn({32, 16}), 1, kv_low));
  n.init("wv", scaled(at::randn({32, 16}), 1, kv_low));
  n.init("wo", scaled(at::randn({32, 32}), 0, q_low));
  n.init("qs", longs({1, 3, 4, 8}));
  n.init("kvs", longs({1, 3, 2, 8}));
  n.init("two", longs({2}));
  n.init("rep", longs({1, 2, 2, 3, 8}));  // V's Expand shape
  n.init("rep_k", longs({1, 2, 2, 3, 8}));
  n.init("five", longs({5}));
  n.init("minus1", longs({-1}).reshape({}));
  n.init("merged", longs({1, 4, 3, 8}));
  n.init("os", longs({1, 3, 32}));
  n.op("MatMul", {"x", "wq"}, {"q"});
  n.op("Reshape", {"q", "qs"}, {"qr"});
  n.op("Transpose", {"qr"}, {"qt"}, {attr("perm", Ints{0, 2, 1, 3})});
  // Where(Equal(rep_k, -1 * ones(5)), ones(5), rep_k): rep_k, computed from constants.
  n.op("ConstantOfShape", {"five"}, {"ones"},
       {{.name = "value", .type = ir::AttrType::kTensor, .t = longs({1})}});
  n.op("Mul", {"ones", "minus1"}, {"neg"});
  n.op("Equal", {"rep_k", "neg"}, {"eq"});
  n.op("Where", {"eq", "ones", "rep_k"}, {"rep_kw"});
  for (std::string p : {"k", "v"}) {
    n.op("MatMul", {"x", "w" + p}, {p});
    n.op("Reshape", {p, "kvs"}, {p + "r"});
    n.op("Transpose", {p + "r"}, {p + "t"}, {attr("perm", Ints{0, 2, 1, 3})});
    n.op("Unsqueeze", {p + "t", "two"}, {p + "u"});
    n.op("Expand", {p + "u", p == "k" ? "rep_kw" : "rep"}, {p + "e"});
    n.op("Reshape", {p + "e", "merged"}, {p + "m"});
  }
  n.op("Transpose", {"km"}, {"kmt"}, {attr("perm", Ints{0, 1, 3, 2})});
  n.op("MatMul", {"qt", "kmt"}, {"sc"});
  n.op("Softmax", {"sc"}, {"p"}, {attr("axis", int64_t(-1))});
  n.op("MatMul", {"p", "vm"}, {"ctx"});
  n.op("Transpose", {"ctx"}, {"ct"}, {attr("perm", Ints{0, 2, 1, 3})});
  n.op("Reshape", {"ct", "os"}, {"o"});
  n.op("MatMul", {"o", "wo"}, {"y"});

  StructuredReport g;
  ASSERT_NO_FATAL_FAILURE(head_groups(n, 2, g));  // two kv groups
  EXPECT_EQ(g.groups[0].layers, (Names{"q", "k", "v", "y"}));
  EXPECT_EQ(g.groups[0].blocked, "");

  ir::Model pruned = n.m;
  StructuredReport r = prune_structured(pruned, amount(0.5, StructuredUnit::kHead));
  EXPECT_EQ(r.groups[0].removed, Ints{1});
  expect_slice(n.m, pruned, "wq", 1, kept(32, q_low));
  expect_slice(n.m, pruned, "wk", 1, kept(16, kv_low));
  expect_slice(n.m, pruned, "wv", 1, kept(16, kv_low));
  expect_slice(n.m, pruned, "wo", 0, kept(32, q_low));
  EXPECT_TRUE(at::equal(input_of(pruned, "qr", 1), longs({1, 3, 2, 8})));
  EXPECT_TRUE(at::equal(input_of(pruned, "kr", 1), longs({1, 3, 1, 8})));
  EXPECT_TRUE(at::equal(input_of(pruned, "ke", 1), longs({1, 1, 2, 3, 8})));
  EXPECT_TRUE(at::equal(input_of(pruned, "ve", 1), longs({1, 1, 2, 3, 8})));
  EXPECT_TRUE(at::equal(input_of(pruned, "km", 1), longs({1, 2, 3, 8})));
  EXPECT_TRUE(at::equal(input_of(pruned, "o", 1), longs({1, 3, 16})));
  expect_runs_as(pruned, zeroed(n.m, {"wo"}, 0, q_low), {1, 3, 32}, {1, 3, 32});
}

// The hidden size through RMSNorm as exporters spell it out (Pow, ReduceMean over the channels
// kept as an axis of 1, Add eps, Sqrt, Reciprocal, Mul) and a residual Add: the input projection's
// columns, the residual branch's output columns, the norm's scale and the output projection's rows
// shrink together; the norm then normalises over the channels that stay. The pruned model equals
// the same computation written on the kept channels by hand. A ReduceSum over the channels stays
// a barrier.
TEST(DepGraph, HiddenSizeFollowsRmsNormAndTheResidual) {
  at::manual_seed(11);
  Net n({2, 3, 5});
  n.init("w_in", at::randn({5, 8})), n.init("w_res", at::randn({8, 8}));
  n.init("gamma", at::rand({8}) + 0.5), n.init("w_out", at::randn({8, 6}));
  n.init("two", at::tensor(2.0f)), n.init("eps", at::tensor(1e-6f));
  n.init("axes", longs({-1}));
  n.op("MatMul", {"x", "w_in"}, {"h"});
  n.op("MatMul", {"h", "w_res"}, {"r"});
  n.op("Add", {"h", "r"}, {"s"});
  n.op("Pow", {"s", "two"}, {"sq"});
  n.op("ReduceMean", {"sq", "axes"}, {"ms"}, {attr("keepdims", int64_t(1))});
  n.op("Add", {"ms", "eps"}, {"mse"});
  n.op("Sqrt", {"mse"}, {"rms"});
  n.op("Reciprocal", {"rms"}, {"inv"});
  n.op("Mul", {"s", "inv"}, {"normed"});
  n.op("Mul", {"normed", "gamma"}, {"scaled"});
  n.op("MatMul", {"scaled", "w_out"}, {"y"});
  n.m.opset_import = {{"", 18}};  // ReduceMean's axes as an input
  StructuredReport g = channel_groups(n.m);
  ASSERT_EQ(g.groups.size(), 2u);
  EXPECT_TRUE(g.groups[0].blocked.empty()) << g.groups[0].blocked;
  EXPECT_EQ(g.groups[0].size_before, 8);
  ir::Model m = n.m;
  prune_structured(m, amount(0.5));
  StructuredReport r = channel_groups(m);
  ASSERT_FALSE(r.groups.empty());
  EXPECT_EQ(r.groups[0].size_before, 4);
  // The same computation on the kept channels, by hand.
  ir::Model probe = n.m;
  const Ints removed = prune_structured(probe, amount(0.5)).groups[0].removed;
  const at::Tensor k = longs(kept(8, removed));
  at::Tensor x = at::randn({2, 3, 5});
  at::Tensor h = at::matmul(x, init(n.m, "w_in").index_select(1, k));
  at::Tensor s = h + at::matmul(h, init(n.m, "w_res").index_select(0, k).index_select(1, k));
  at::Tensor normed = s / at::sqrt(s.pow(2).mean(-1, true) + 1e-6);
  at::Tensor want = at::matmul(normed * init(n.m, "gamma").index_select(0, k),
                               init(n.m, "w_out").index_select(0, k));
  Executor ex(m);
  EXPECT_LE(test::relative_max_diff(ex.run({{"x", x}})[0], want), 1e-5);

  Net sum = n;
  for (auto& node : sum.m.graph.nodes)
    if (node.op_type == "ReduceMean") node.op_type = "ReduceSum";
  EXPECT_EQ(channel_groups(sum.m).groups[0].blocked,
            "node 'ms' (ReduceSum): ReduceSum over the channels");
}
