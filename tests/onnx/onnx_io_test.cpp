// ONNX import/export: round trips keep everything, and malformed or hostile models are refused
// with one-line errors.
#include "lopper/onnx_io.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "lopper/error.h"
#include "lopper/files.h"
#include "onnx.pb.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace lopper;

namespace {

using test::error_of;
using test::slurp;
using test::TempDir;

ir::Model small_model() {
  ir::Model m;
  m.ir_version = 9;
  m.opset_import = {{"", 17}, {"com.example", 1}};
  m.producer_name = "lopper-test";
  m.producer_version = "1";
  m.doc_string = "a model";
  m.metadata_props = {{"author", "me"}, {"license", "MIT"}};
  ir::Graph& g = m.graph;
  g.name = "g";
  g.doc_string = "graph doc";
  ir::ValueInfo x{"x", {ir::DType::kFloat, true, {{-1, "batch"}, {4, ""}}, "", ""}, "the input"};
  g.inputs.push_back(x);
  g.outputs.push_back({"y", {ir::DType::kFloat, true, {{-1, "batch"}, {3, ""}}, "", ""}, ""});
  g.value_info.push_back({"h", {ir::DType::kFloat, true, {{-1, "batch"}, {3, ""}}, "", ""}, ""});
  at::manual_seed(0);
  g.initializers.push_back({"w", at::randn({3, 4}), "weights", false});
  g.initializers.push_back({"b", at::randn({3}), "", false});
  ir::Node gemm;
  gemm.name = "fc";
  gemm.op_type = "Gemm";
  gemm.inputs = {"x", "w", "b"};
  gemm.outputs = {"h"};
  gemm.doc_string = "node doc";
  ir::Attribute tb;
  tb.name = "transB";
  tb.type = ir::AttrType::kInt;
  tb.i = 1;
  ir::Attribute alpha;
  alpha.name = "alpha";
  alpha.type = ir::AttrType::kFloat;
  alpha.f = 1.0f;
  gemm.attrs = {tb, alpha};
  ir::Node relu;
  relu.name = "act";
  relu.op_type = "Relu";
  relu.inputs = {"h"};
  relu.outputs = {"y"};
  g.nodes = {gemm, relu};
  return m;
}

void expect_same(const ir::Model& a, const ir::Model& b) {
  EXPECT_EQ(a.ir_version, b.ir_version);
  ASSERT_EQ(a.opset_import.size(), b.opset_import.size());
  EXPECT_EQ(a.opset(""), b.opset(""));
  EXPECT_EQ(a.producer_name, b.producer_name);
  EXPECT_EQ(a.doc_string, b.doc_string);
  EXPECT_EQ(a.metadata_props, b.metadata_props);
  EXPECT_EQ(a.graph.doc_string, b.graph.doc_string);
  ASSERT_EQ(a.graph.inputs.size(), b.graph.inputs.size());
  EXPECT_EQ(a.graph.inputs[0].doc_string, b.graph.inputs[0].doc_string);
  EXPECT_EQ(a.graph.inputs[0].type.dims[0].param, b.graph.inputs[0].type.dims[0].param);
  EXPECT_EQ(a.graph.inputs[0].type.dims[1].value, b.graph.inputs[0].type.dims[1].value);
  EXPECT_EQ(a.graph.value_info.size(), b.graph.value_info.size());
  ASSERT_EQ(a.graph.nodes.size(), b.graph.nodes.size());
  EXPECT_EQ(a.graph.nodes[0].doc_string, b.graph.nodes[0].doc_string);
  EXPECT_EQ(a.graph.nodes[0].attr("transB")->i, 1);
  ASSERT_EQ(a.graph.initializers.size(), b.graph.initializers.size());
  for (size_t i = 0; i < a.graph.initializers.size(); ++i) {
    EXPECT_EQ(a.graph.initializers[i].name, b.graph.initializers[i].name);
    EXPECT_EQ(a.graph.initializers[i].doc_string, b.graph.initializers[i].doc_string);
    EXPECT_TRUE(at::equal(a.graph.initializers[i].value, b.graph.initializers[i].value));
  }
}

// A model with one external initializer whose location is `location`.
void write_external_model(const std::string& path, const std::string& location,
                          int64_t length = 48) {
  lopper_onnx::ModelProto m;
  m.set_ir_version(9);
  m.add_opset_import()->set_version(17);
  auto* g = m.mutable_graph();
  g->set_name("g");
  auto* t = g->add_initializer();
  t->set_name("w");
  t->set_data_type(1);
  t->add_dims(3);
  t->add_dims(4);
  t->set_data_location(lopper_onnx::TensorProto::EXTERNAL);
  auto* e = t->add_external_data();
  e->set_key("location");
  e->set_value(location);
  auto* l = t->add_external_data();
  l->set_key("length");
  l->set_value(std::to_string(length));
  write_file_atomic(path, m.SerializeAsString());
}

}  // namespace

TEST(OnnxIo, RoundTripKeepsEverything) {
  TempDir d;
  ir::Model m = small_model();
  onnx::save_model(m, d / "m.onnx");
  expect_same(m, onnx::load_model(d / "m.onnx"));
  // No temp files left behind.
  int files = 0;
  for (auto& e : fs::directory_iterator(d.path)) files += e.is_regular_file();
  EXPECT_EQ(files, 1);
}

// Large initializers are streamed after the rest of the graph and adopted on load without a copy:
// the file is still one ONNX message that protobuf parses to the same model, and the initializer
// order, the small tensors and the subgraph-free layout all survive.
TEST(OnnxIo, LargeInitializersStreamAndLoadTheSame) {
  TempDir d;
  ir::Model m = small_model();
  at::manual_seed(1);
  m.graph.initializers.insert(m.graph.initializers.begin() + 1,
                              {"big", at::randn({64, 48}), "a big one", false});
  m.graph.initializers.push_back({"big_i64", at::arange(2048, at::kLong), "", false});
  onnx::save_model(m, d / "m.onnx");
  ir::Model back = onnx::load_model(d / "m.onnx");
  expect_same(m, back);
  // The same message as one SerializeAsString: parse both ways, compare.
  std::string bytes = slurp(d / "m.onnx");
  expect_same(back, onnx::parse_model(bytes.data(), bytes.size()));
  expect_same(m,
              onnx::parse_model(onnx::serialize_model(m).data(), onnx::serialize_model(m).size()));
  // A loaded tensor that adopted the parsed bytes behaves like any other (writable, freed).
  at::Tensor& big = back.graph.initializers[1].value;
  big.mul_(2);
  EXPECT_TRUE(at::equal(big, m.graph.initializers[1].value * 2));
  // And with external data: the big tensors go to the .data file, straight from memory.
  onnx::SaveOptions o;
  o.external_data = true;
  onnx::save_model(m, d / "e.onnx", o);
  EXPECT_GE(fs::file_size(d / "e.onnx.data"), 64u * 48 * 4 + 2048 * 8);
  EXPECT_LT(fs::file_size(d / "e.onnx"), 4096u);
  expect_same(m, onnx::load_model(d / "e.onnx"));
}

TEST(OnnxIo, ExternalDataRoundTrip) {
  TempDir d;
  ir::Model m = small_model();
  onnx::SaveOptions o;
  o.external_data = true;
  o.external_min_bytes = 0;
  onnx::save_model(m, d / "m.onnx", o);
  ASSERT_TRUE(fs::exists(d / "m.onnx.data"));
  EXPECT_GE(fs::file_size(d / "m.onnx.data"), 48u);
  expect_same(m, onnx::load_model(d / "m.onnx"));
}

TEST(OnnxIo, SparseInitializersShrinkTheFile) {
  TempDir d;
  ir::Model m = small_model();
  at::Tensor big = at::randn({256, 256});
  big = big * (at::rand({256, 256}) < 0.1).to(at::kFloat);  // ~90% zeros
  m.graph.initializers.push_back({"big", big, "", false});
  m.graph.initializers.push_back(
      {"zero", at::scalar_tensor(0.0f), "", false});  // rank 0: stays dense
  onnx::save_model(m, d / "dense.onnx");
  onnx::SaveOptions o;
  o.sparse = onnx::SaveOptions::Sparse::kAll;
  onnx::save_model(m, d / "sparse.onnx", o);
  EXPECT_LT(fs::file_size(d / "sparse.onnx") * 2, fs::file_size(d / "dense.onnx"));
  ir::Model back = onnx::load_model(d / "sparse.onnx");
  const auto* t = back.graph.find_initializer("big");
  ASSERT_TRUE(t);
  EXPECT_TRUE(t->sparse);
  EXPECT_TRUE(at::equal(t->value, big));
  EXPECT_FALSE(back.graph.find_initializer("zero")->sparse);
  // kKeep writes it sparse again; kNone makes it dense.
  onnx::save_model(back, d / "again.onnx");
  EXPECT_TRUE(onnx::load_model(d / "again.onnx").graph.find_initializer("big")->sparse);
  o.sparse = onnx::SaveOptions::Sparse::kNone;
  onnx::save_model(back, d / "dense2.onnx", o);
  EXPECT_FALSE(onnx::load_model(d / "dense2.onnx").graph.find_initializer("big")->sparse);
}

TEST(OnnxIo, RefusesExternalDataOutsideTheModelFolder) {
  TempDir d;
  fs::create_directories(d.path / "sub");
  { std::ofstream(d / "secret.bin") << std::string(48, 'x'); }
  write_external_model(d / "sub/abs.onnx", (d.path / "secret.bin").string());
  EXPECT_NE(error_of([&] { onnx::load_model(d / "sub/abs.onnx"); }).find("absolute path"),
            std::string::npos);
  write_external_model(d / "sub/up.onnx", "../secret.bin");
  EXPECT_NE(
      error_of([&] { onnx::load_model(d / "sub/up.onnx"); }).find("leaves the model's folder"),
      std::string::npos);
  write_external_model(d / "sub/up2.onnx", "a/../../secret.bin");
  EXPECT_NE(error_of([&] { onnx::load_model(d / "sub/up2.onnx"); }).find("leaves"),
            std::string::npos);
  // A symbolic link that points outside is refused too.
  fs::create_symlink(d.path / "secret.bin", d.path / "sub" / "link.bin");
  write_external_model(d / "sub/link.onnx", "link.bin");
  EXPECT_NE(error_of([&] { onnx::load_model(d / "sub/link.onnx"); }).find("outside"),
            std::string::npos);
  // Inside the folder it loads.
  { std::ofstream(d / "sub/ok.bin") << std::string(48, '\0'); }
  write_external_model(d / "sub/ok.onnx", "ok.bin");
  EXPECT_EQ(error_of([&] { onnx::load_model(d / "sub/ok.onnx"); }), "");
}

TEST(OnnxIo, ChecksSizesAgainstTheBytesPresent) {
  TempDir d;
  { std::ofstream(d / "short.bin") << std::string(20, '\0'); }
  write_external_model(d / "short.onnx", "short.bin");
  EXPECT_NE(error_of([&] { onnx::load_model(d / "short.onnx"); }).find("has 20 bytes"),
            std::string::npos);
  { std::ofstream(d / "ok.bin") << std::string(48, '\0'); }
  write_external_model(d / "len.onnx", "ok.bin", 40);
  EXPECT_NE(error_of([&] { onnx::load_model(d / "len.onnx"); }).find("length"), std::string::npos);
  write_external_model(d / "missing.onnx", "nope.bin");
  EXPECT_NE(error_of([&] { onnx::load_model(d / "missing.onnx"); }).find("cannot open"),
            std::string::npos);

  auto raw_model = [&](std::vector<int64_t> dims, size_t bytes) {
    lopper_onnx::ModelProto m;
    m.set_ir_version(9);
    auto* t = m.mutable_graph()->add_initializer();
    t->set_name("w");
    t->set_data_type(1);
    for (auto v : dims) t->add_dims(v);
    t->set_raw_data(std::string(bytes, '\0'));
    return m.SerializeAsString();
  };
  std::string s = raw_model({3, 4}, 40);
  EXPECT_NE(error_of([&] { onnx::parse_model(s.data(), s.size()); }).find("raw data has 40 bytes"),
            std::string::npos);
  s = raw_model({-3, 4}, 0);
  EXPECT_NE(error_of([&] { onnx::parse_model(s.data(), s.size()); }).find("negative dimension"),
            std::string::npos);
  s = raw_model({1 << 30, 1 << 30, 1 << 30}, 0);
  EXPECT_NE(error_of([&] { onnx::parse_model(s.data(), s.size()); }).find("too many elements"),
            std::string::npos);
}

TEST(OnnxIo, RefusesWhatIsNotAModel) {
  std::string empty;
  EXPECT_NE(error_of([&] { onnx::parse_model(empty.data(), 0); }).find("not an ONNX model"),
            std::string::npos);
  std::string text = "hello, this is not a model at all";
  EXPECT_NE(error_of([&] { onnx::parse_model(text.data(), text.size()); }), "");
  std::string good = onnx::serialize_model(small_model());
  for (size_t cut : {good.size() / 2, good.size() - 3, size_t(7)})
    EXPECT_NE(error_of([&] { onnx::parse_model(good.data(), cut); }), "") << "cut at " << cut;
  EXPECT_NE(error_of([&] { onnx::load_model("/nonexistent/model.onnx"); }).find("cannot open"),
            std::string::npos);
  EXPECT_NE(error_of([&] { onnx::load_model("/tmp"); }).find("directory"), std::string::npos);
}

TEST(OnnxIo, TensorProtoFiles) {
  TempDir d;
  at::Tensor t = at::arange(12, at::kLong).view({3, 4});
  onnx::save_tensor_pb(t, d / "t.pb", "t");
  EXPECT_TRUE(at::equal(onnx::load_tensor_pb(d / "t.pb"), t));
  at::Tensor h = at::randn({5}).to(at::kHalf);
  onnx::save_tensor_pb(h, d / "h.pb");
  EXPECT_TRUE(at::equal(onnx::load_tensor_pb(d / "h.pb"), h));
}
