// Losses on a model's output and what feeding a model batches needs from it; shared by calibration
// (grad/taylor pruning), training and evaluation.
#include "train/loss.h"

#include <ATen/ATen.h>

#include "lopper/error.h"
#include "lopper/executor.h"

namespace lopper {

ModelIO model_io(const ir::Model& model, const Executor& ex) {
  LOPPER_CHECK(!ex.inputs().empty(), "[data] the model has no input to feed data to");
  ModelIO io;
  io.input = ex.inputs()[0]->name;
  for (const auto& d : ex.inputs()[0]->type.dims) io.dims.push_back(d.is_static() ? d.value : -1);
  if (io.dims.empty()) io.dims.push_back(-1);
  for (const auto& n : model.graph.nodes)
    for (const auto& o : n.outputs)
      if (o == model.graph.outputs.at(0).name) io.out_op = n.op_type;
  return io;
}

at::Tensor classification_loss(const at::Tensor& out, const at::Tensor& labels,
                               const std::string& out_op) {
  LOPPER_CHECK(out.dim() >= 1 && out.size(0) == labels.size(0), "[loss] the model's output ",
               out.sizes(), " does not have one row per sample (", labels.size(0), " labels)");
  at::Tensor logits = out.reshape({out.size(0), -1}).to(at::kFloat);
  int64_t classes = logits.size(1);
  int64_t max_label = labels.numel() ? labels.max().item<int64_t>() : 0;
  LOPPER_CHECK(max_label < classes, "[loss] the model has ", classes,
               " outputs per sample, but the data has label ", max_label);
  // NOTE: a model exported with its softmax gives probabilities; cross-entropy needs their log.
  if (out_op == "Softmax") return at::nll_loss(at::log(logits.clamp_min(1e-12)), labels);
  if (out_op == "LogSoftmax") return at::nll_loss(logits, labels);
  return at::cross_entropy_loss(logits, labels);
}

}  // namespace lopper
