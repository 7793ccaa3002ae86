// What each prunable layer sees of the calibration data (layer_inputs.h).
#include "prune/layer_inputs.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <unordered_map>

#include "lopper/analysis.h"
#include "lopper/data.h"
#include "lopper/error.h"
#include "lopper/executor.h"
#include "lopper/prune.h"
#include "train/loss.h"

namespace lopper {

std::map<std::string, LayerInput> collect_layer_inputs(const ir::Model& model, DataLoader& data,
                                                       const LayerInputOptions& opts) {
  LOPPER_CHECK(opts.batches > 0, "[prune] " LOPPER_OPTION("batches") " must be > 0, got ",
               opts.batches);
  // The layers, by their first output (what the executor's own copy of the graph keeps).
  struct Layer {
    std::string weight;
    bool trans_a = false;
  };
  std::unordered_map<std::string, Layer> layers;
  std::map<std::string, LayerInput> out;
  for (const auto& pw : prunable_weights(model.graph)) {
    std::vector<const ir::Node*> readers{pw.node};
    for (const auto& u : pw.shared)
      for (const auto& n : model.graph.nodes)
        if (n.label() == u.node && (n.op_type == "Gemm" || n.op_type == "MatMul"))
          readers.push_back(&n);
    for (const ir::Node* n : readers) {
      if (n->op_type != "Gemm" && n->op_type != "MatMul") continue;
      if (pw.in_axis < 0 || n->outputs.empty()) continue;
      const ir::Attribute* ta = n->attr("transA");
      layers[n->outputs[0]] = {pw.weight, ta && ta->i != 0};
      out.try_emplace(pw.weight);
    }
  }
  LOPPER_CHECK(!layers.empty(), "[prune] the model has no Gemm or MatMul weights to calibrate");

  ExecOptions eo;
  eo.device = opts.device;
  eo.fuse = false;  // every layer runs as itself, with its own input
  Executor ex(model, eo);
  const ModelIO io = model_io(model, ex);
  Objective objective(opts.loss, io);
  ex.on_node = [&](const ir::Node& n, const std::vector<at::Tensor>& in,
                   const std::vector<at::Tensor>&) {
    if (n.outputs.empty()) return;
    auto it = layers.find(n.outputs[0]);
    if (it == layers.end() || in.empty() || !in[0].defined()) return;
    at::Tensor x = it->second.trans_a ? in[0].t() : in[0];
    const int64_t k = x.size(-1);
    LayerInput& li = out[it->second.weight];
    at::Tensor rows = x.reshape({-1, k}).to(at::kDouble);
    if (!li.sq_norm.defined()) {
      li.sq_norm = at::zeros({k}, rows.options());
      if (opts.gram) li.gram = at::zeros({k, k}, rows.options());
    }
    LOPPER_ASSERT(li.sq_norm.size(0) == k, "layer input of ", k, " features for weight '",
                  it->second.weight, "', was ", li.sq_norm.size(0));
    li.sq_norm += rows.square().sum(0);
    if (opts.gram) li.gram.addmm_(rows.t(), rows);
    li.tokens += rows.size(0);
  };

  const int64_t of = std::min<int64_t>(opts.batches, data.batches_per_epoch());
  LOPPER_CHECK(of > 0, "[prune] ", data.dataset().name(), " has no full batch to calibrate on");
  data.start_epoch(0);
  c10::NoGradGuard no_grad;
  Batch b;
  int64_t done = 0;
  while (done < of && data.next(b)) {
    objective.prepare(b, done);
    (void)ex.run(feeds(io, b, ex.device()));
    ++done;
    if (opts.progress) opts.progress(done, of);
  }
  LOPPER_CHECK(done > 0, "[prune] ", data.dataset().name(), " gave no batch to calibrate on");
  for (auto it = out.begin(); it != out.end();)  // a layer the data never reached
    it = it->second.sq_norm.defined() ? std::next(it) : out.erase(it);
  return out;
}

}  // namespace lopper
