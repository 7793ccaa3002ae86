// What each prunable layer sees of the calibration data, for the methods that weigh a weight by
// its input (issue 20: Wanda scores |W_ij| * ||X_j||_2, SparseGPT solves with H = X^T X): per
// Gemm/MatMul weight, over every calibration token, the squared norm of each input feature and,
// when asked, the Gram matrix of the inputs. One inference pass per batch (fusions off, so every
// layer runs as itself); the layers' weights are the model's, unpruned. Internal header.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "lopper/graph.h"
#include "lopper/loss.h"

namespace lopper {

class DataLoader;  // lopper/data.h

struct LayerInput {
  at::Tensor sq_norm;  // [K] float64: sum over tokens of x_j^2, K the weight's in_axis size
  at::Tensor gram;     // [K, K] float64: sum over tokens of x x^T (LayerInputOptions::gram)
  int64_t tokens = 0;  // rows of inputs seen (batch x sequence)
};

struct LayerInputOptions {
  int64_t batches = 128;  // at most this many batches (fewer when an epoch has fewer)
  std::string device = "cpu";
  bool gram = false;
  LossOptions loss;  // only how batches feed the model's inputs (lopper/loss.h)
  /// Called after each batch (1-based).
  std::function<void(int64_t batch, int64_t of)> progress;
};

/// Per weight initializer of a Gemm or MatMul layer (the first layer that reads it; a weight
/// shared by two layers counts both layers' inputs): its input statistics. Conv layers are left
/// out. Throws lopper::Error when the data gives no batch or the model has no such layer.
std::map<std::string, LayerInput> collect_layer_inputs(const ir::Model& model, DataLoader& data,
                                                       const LayerInputOptions& opts);

}  // namespace lopper
