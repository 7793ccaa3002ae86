// The names people know a layer by: param_name() keeps a parameter's name the exporter kept,
// recovers the one torch.export's metadata names when the weight is a constant it made, and gives
// "" for TorchScript's folded constants; analyze() carries it per layer. On the real fixtures.
#include <gtest/gtest.h>

#include "lopper/analysis.h"
#include "lopper/onnx_io.h"
#include "lopper/prune.h"
#include "test_models.h"

using namespace lopper;
using namespace lopper::test;

namespace {

// A node as torch.export writes it: its module scopes and the aten call it came from.
ir::Node exported(const std::string& scopes, const std::string& call) {
  ir::Node n = node("MatMul", {"x", "val_7"}, {"y"}, "node_MatMul_7");
  n.metadata_props = {{"pkg.torch.onnx.name_scopes", scopes}, {"pkg.torch.onnx.fx_node", call}};
  return n;
}

}  // namespace

TEST(ParamName, KeepsParameterNamesAndDropsExporterConstants) {
  const ir::Node plain = node("Conv", {"x", "w"}, {"y"}, "/layer1/layer1.0/conv1/Conv");
  EXPECT_EQ(param_name(plain, "layer1.0.conv1.weight"), "layer1.0.conv1.weight");
  EXPECT_EQ(param_name(plain, "m.transformer.h.0.attn.c_attn.weight"),
            "m.transformer.h.0.attn.c_attn.weight");
  for (const char* made :
       {"onnx::Conv_193", "onnx::MatMul_528", "val_59", "123", "/m/Constant_output_0", ""})
    EXPECT_EQ(param_name(plain, made), "") << made;
}

TEST(ParamName, RecoversTheParameterFromTorchExportMetadata) {
  const ir::Node linear = exported(
      "['', 'm', 'm.encoder', 'm.encoder.layer.0', 'm.encoder.layer.0.attention.self.query', "
      "'linear']",
      "%linear : [num_users=1] = call_function[target=torch.ops.aten.linear.default](args = "
      "(%layer_norm, %p_m_encoder_layer_0_attention_self_query_weight, "
      "%p_m_encoder_layer_0_attention_self_query_bias), kwargs = {})");
  EXPECT_EQ(param_name(linear, "val_7"), "m.encoder.layer.0.attention.self.query.weight");
  EXPECT_EQ(torch_module(linear), "m.encoder.layer.0.attention.self.query");
  // An attribute with '_' in its name, on the module whose forward calls F.linear.
  const ir::Node in_proj = exported(
      "['', 'layers.0', 'layers.0.self_attn', 'linear']",
      "%linear : [num_users=1] = call_function[target=torch.ops.aten.linear.default](args = "
      "(%transpose, %p_layers_0_self_attn_in_proj_weight, %p_layers_0_self_attn_in_proj_bias), "
      "kwargs = {})");
  EXPECT_EQ(param_name(in_proj, "val_7"), "layers.0.self_attn.in_proj_weight");
  // A node fused from another call (a BatchNorm folded into the Conv) names that call's
  // parameters, not the layer's weight.
  const ir::Node folded = exported(
      "['', 'bn1', '_native_batch_norm_legit_no_training']",
      "%bn : [num_users=1] = call_function[target=torch.ops.aten._native_batch_norm_legit_no_"
      "training.default](args = (%conv2d, %p_bn1_weight, %p_bn1_bias), kwargs = {})");
  EXPECT_EQ(param_name(folded, "val_7"), "");
  EXPECT_EQ(torch_module(folded), "bn1");
  EXPECT_EQ(torch_module(node("Relu", {"x"}, {"y"}, "relu")), "");
}

TEST(ParamName, OnExportedModels) {
  // torch.export folds BERT's transposed Linear weights into val_N: every layer gets its
  // parameter back from the metadata.
  const ir::Model bert = onnx::load_model(fixture("bert.dynamo.onnx"));
  const ModelCost cost = analyze(bert, resolve_input_shapes(bert, {}, 1));
  ASSERT_EQ(cost.layers.size(), 12u);
  EXPECT_EQ(cost.layers[0].weight.rfind("val_", 0), 0u) << cost.layers[0].weight;
  EXPECT_EQ(cost.layers[0].param, "m.encoder.layer.0.attention.self.query.weight");
  for (const auto& l : cost.layers)
    EXPECT_EQ(l.param.rfind("m.encoder.layer.", 0), 0u) << l.name << ": " << l.param;
  // TorchScript folds BatchNorm into the convolutions (onnx::Conv_N, no metadata): no parameter
  // name, the node's is shown; the classifier kept its own.
  const ir::Model resnet = onnx::load_model(fixture("resnet18.ts.onnx"));
  for (const auto& pw : prunable_weights(resnet.graph)) {
    if (pw.node->op_type == "Conv") EXPECT_EQ(pw.param, "") << pw.weight;
    if (pw.node->op_type == "Conv") EXPECT_EQ(pw.label(), pw.node->name);
    if (pw.node->op_type == "Gemm") EXPECT_EQ(pw.param, "fc.weight");
  }
}
