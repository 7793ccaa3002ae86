// Activation importance for structured pruning (Minitron, Muralidharan et al. 2024): how large each
// channel's activations are on calibration data, where layers read them. Internal header.
//
// A site is a tensor that a layer with a weight (Conv, grouped and depthwise too, ConvTranspose,
// Gemm, MatMul) reads along a channel group's channels: the next layers' input, after normalisation
// and activation (a CNN's feature map, an MLP's intermediate activations = the down projection's
// input, the attention's output = the output projection's input). A tensor read by several such
// layers is one site. Per site and channel class (the channels pruned together: one channel, or one
// head), per position (batch x spatial positions, or batch x tokens) the class's value is the mean
// |x| of its features there (a channel has one feature per position; after a Flatten, its spatial
// block) or, for heads, the L2 norm of its features; the site's score of the class is its mean over
// every position of every batch. A channel's importance is the sum of its scores over the sites.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "lopper/graph.h"
#include "lopper/prune.h"

namespace lopper {

class DataLoader;  // lopper/data.h
namespace depgraph {
struct DepGraph;  // prune/depgraph.h
}

struct ActivationSite {
  std::string value;           // the tensor
  std::string reader;          // the first output of the first layer that reads it (observed there)
  int64_t axis = 1;            // its channel axis; negative: from the end (a MatMul's features)
  std::vector<int64_t> atoms;  // per index along the axis: its atom (depgraph)
  std::vector<int64_t> part;   // ... and which of the site's classes it holds
  int64_t parts = 0;
};

/// The sites of `dg` (built from `g`): the data input of every layer that reads channels with its
/// weight (a slice along its input channels; a grouped or depthwise convolution), each tensor once,
/// in the graph's order.
std::vector<ActivationSite> activation_sites(const ir::Graph& g, depgraph::DepGraph& dg);

/// Runs `model` (inference, fusions off) on at most calib.batches batches of `data` and returns,
/// under `criterion` in Saliency::scores, per site (by value) one term per index along its channel
/// axis: its class's score at the site divided by the class's count of indices there, so that a
/// class's terms sum to its score (float64, on the CPU). `l2`: a class's value at a position is the
/// L2 norm of its features (heads), else their mean magnitude. The loss of calib.loss is computed
/// too, for calib.progress and Saliency::loss, as gradient calibration computes it. Throws
/// lopper::Error when `sites` is empty or the data gives no batch.
Saliency collect_activations(const ir::Model& model, const std::vector<ActivationSite>& sites,
                             bool l2, DataLoader& data, const CalibrationOptions& calib,
                             const std::string& criterion);

}  // namespace lopper
