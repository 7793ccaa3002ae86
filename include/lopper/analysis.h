// What a model costs: parameters, nonzero parameters and multiply-accumulates, per prunable layer
// and in total. Shapes come from running the model once on zeros (exact for every op).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "lopper/executor.h"
#include "lopper/graph.h"

namespace lopper {

struct LayerCost {
  std::string name;    // node name
  std::string op;      // Conv, ConvTranspose, Gemm, MatMul
  std::string weight;  // initializer name
  std::string param;   // the PyTorch parameter's name (param_name), "" when the model lacks it
  std::vector<int64_t> weight_shape;
  int64_t params = 0;
  int64_t nonzero = 0;
  int64_t macs = 0;
};

struct ModelCost {
  int64_t params = 0;  // float initializers, BatchNorm running statistics excluded
  int64_t nonzero = 0;
  int64_t macs = 0;  // every op with a MAC rule (convolutions, matmuls, attention ...)
  std::vector<LayerCost> layers;
  std::map<std::string, std::vector<int64_t>> input_shapes;  // what was fed
};

/// Input shapes to use: `overrides` by name (or the single input when the name is empty), else the
/// declared dims with every dynamic dim set to `dynamic_dim`.
std::map<std::string, std::vector<int64_t>> resolve_input_shapes(
    const ir::Model& model, const std::map<std::string, std::vector<int64_t>>& overrides,
    int64_t dynamic_dim = 1);

/// A prunable layer's weight: the initializer feeding a Conv/ConvTranspose/Gemm/MatMul (directly or
/// through a Transpose), or nullptr.
const ir::Initializer* layer_weight(const ir::Graph& g, const ir::Node& n);

/// The name a PyTorch user knows the weight `weight` of layer `layer` by: the initializer's own
/// name when the exporter kept the parameter's (`layer1.0.conv1.weight`,
/// `m.transformer.h.0.attn.c_attn.weight`), else the parameter that torch.export's metadata on the
/// node names (`pkg.torch.onnx.name_scopes` and `fx_node`: a Linear's weight folded into
/// `val_59` is `m.encoder.layer.0.attention.self.query.weight`), else "" (a constant the exporter
/// made, such as TorchScript's `onnx::Conv_193`: tables then show the node's name).
std::string param_name(const ir::Node& layer, const std::string& weight);
/// The PyTorch module a node was exported from, as torch.export's metadata names it
/// (`m.transformer.wte` for an embedding's Gather), else "".
std::string torch_module(const ir::Node& n);

/// The shapes of every node's inputs and outputs (empty for a missing one), from one run of
/// `model` on zeros of the given input shapes; nodes inside subgraphs are not listed.
struct NodeIO {
  std::vector<std::vector<int64_t>> in, out;
  /// The values of integer outputs of at most 64 elements (shape arithmetic), else undefined.
  std::vector<at::Tensor> small_ints;
};
using NodeShapes = std::unordered_map<const ir::Node*, NodeIO>;
NodeShapes node_shapes(const ir::Model& model,
                       const std::map<std::string, std::vector<int64_t>>& input_shapes);

/// node_shapes() from one run on `feeds` (their shapes, on their device), the run's outputs in
/// `outputs`.
NodeShapes node_shapes(const ir::Model& model, const NamedTensors& feeds,
                       std::vector<at::Tensor>* outputs);
/// What node_shapes runs: every node as it is (no fusion, no folding), no prepacked weights.
ExecOptions shape_options();
/// Records every node's input and output shapes into `seen` as `exec` runs (its on_node), for an
/// executor made with shape_options(): a caller that runs the model anyway gets node_shapes'
/// result from that run.
void record_node_shapes(Executor& exec, NodeShapes& seen);

/// Costs of `model` at the given input shapes (see resolve_input_shapes).
ModelCost analyze(const ir::Model& model,
                  const std::map<std::string, std::vector<int64_t>>& input_shapes);
/// The same from the node shapes of a run at those input shapes (node_shapes or
/// record_node_shapes).
ModelCost analyze(const ir::Model& model,
                  const std::map<std::string, std::vector<int64_t>>& input_shapes,
                  const NodeShapes& seen);

/// What deserves a warning the moment `model` is loaded, one sentence each (no prefix): today,
/// BatchNormalization in training mode, which normalises with each batch's own statistics as
/// ONNX specifies (eval and compare then measure another model than the one deployed).
std::vector<std::string> load_warnings(const ir::Model& model);

}  // namespace lopper
