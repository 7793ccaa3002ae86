// What each prunable layer sees of the calibration data, for the methods that weigh a weight by
// its input (Wanda scores |W_ij| * ||X_j||_2, SparseGPT solves with H = X^T X): per layer weight,
// over every calibration token, the squared norm of each input feature and, when asked, the Gram
// matrix of the inputs. Gemm and MatMul layers read rows of features; a Conv reads its input's
// patches (im2col: C x kh x kw features per output position). Internal header.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "lopper/graph.h"
#include "lopper/loss.h"

namespace lopper {

class DataLoader;  // lopper/data.h

struct LayerInput {
  at::Tensor sq_norm;  // [K] float64: sum over tokens of x_j^2, K the weight's inputs per output
  at::Tensor gram;     // [K, K] float64: sum over tokens of x x^T (when asked)
  int64_t tokens = 0;  // rows of inputs seen (batch x sequence, or x output positions for a Conv)
};

/// Why the inputs of layer `n` (reading weight `w` as its weight) cannot be collected, or "": a
/// Gemm, a MatMul with a 2-D weight and a 1-D or 2-D Conv with one group can be.
std::string layer_input_unsupported(const ir::Node& n, const at::Tensor& w);

/// Accumulates LayerInputs from an executor's node hook (Executor::on_node).
class LayerInputCollector {
 public:
  /// `watch`: weight initializer -> whether its Gram matrix is wanted too. Its layers are the
  /// nodes of `g` that read it as their weight (a shared weight sums its layers' inputs).
  LayerInputCollector(const ir::Graph& g, const std::map<std::string, bool>& watch);
  /// The executor's on_node: adds the node's input when it is a watched layer.
  void observe(const ir::Node& n, const std::vector<at::Tensor>& in);
  /// The statistics so far, per weight the data reached. Layers that read the same input hold the
  /// same tensors (LayerInput::sq_norm, gram): a caller that writes one in place copies it first.
  std::map<std::string, LayerInput> take();

 private:
  struct Layer {
    std::string weight;
    bool gram = false;
    const ir::Node* node = nullptr;
  };
  std::unordered_map<std::string, Layer> layers_;  // by the layer's first output
  std::map<std::string, LayerInput> stats_;
  struct Last {  // the last input's batch statistics, for the next layer that reads it too
    at::Tensor input, sq_norm, gram;
    std::string op;
    int64_t tokens = 0;
    std::string first;  // the weight of the first layer that read it
  } last_;
  std::unordered_map<std::string, std::string> follows_;  // weight -> the one whose sums it holds
};

struct LayerInputOptions {
  int64_t batches = 128;  // at most this many batches (fewer when an epoch has fewer)
  std::string device = "cpu";
  bool gram = false;
  /// The prunable weights whose inputs to collect (empty: every one).
  std::vector<std::string> weights;
  LossOptions loss;  // only how batches feed the model's inputs (lopper/loss.h)
  /// Called after each batch (1-based).
  std::function<void(int64_t batch, int64_t of)> progress;
};

/// Per prunable weight whose layers' inputs can be collected: its input statistics over the
/// batches of `data`, in one inference pass of the whole model each (fusions off, so every layer
/// runs as itself). Throws lopper::Error when the data gives no batch or the model has no such
/// layer.
std::map<std::string, LayerInput> collect_layer_inputs(const ir::Model& model, DataLoader& data,
                                                       const LayerInputOptions& opts);

}  // namespace lopper
