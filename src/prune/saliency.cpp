// Gradient saliencies from calibration batches: the model runs under autograd through the
// executor, the loss is the calibration's (lopper/loss.h: classification, language models), and
// each prunable weight's gradient is accumulated as every gradient criterion of the table says
// (importance::GradientStats).
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <unordered_set>

#include "lopper/analysis.h"
#include "lopper/data.h"
#include "lopper/error.h"
#include "lopper/executor.h"
#include "lopper/prune.h"
#include "prune/importance.h"
#include "train/loss.h"

namespace lopper {

Saliency compute_saliency(const ir::Model& model, DataLoader& data,
                          const CalibrationOptions& opts) {
  LOPPER_CHECK(opts.batches > 0, "[prune] " LOPPER_OPTION("batches") " must be > 0, got ",
               opts.batches);
  ExecOptions eo;
  eo.device = opts.device;
  eo.autograd = true;  // eval semantics (BatchNorm running statistics, no dropout), gradients on
  Executor ex(model, eo);
  const ModelIO io = model_io(model);
  Objective objective(opts.loss, io);

  std::unordered_set<std::string> prunable;
  for (const auto& n : model.graph.nodes)
    if (const ir::Initializer* w = layer_weight(model.graph, n)) prunable.insert(w->name);
  std::vector<std::pair<std::string, at::Tensor>> params;
  for (auto& [name, p] : ex.parameters())
    if (prunable.count(name) && p.requires_grad()) params.emplace_back(name, p);
  LOPPER_CHECK(!params.empty(), "[prune] the model has no float prunable weights to score");

  Saliency s;
  importance::GradientStats stats;
  for (const auto& [name, p] : params) stats.track(name, p);
  int64_t of = std::min<int64_t>(opts.batches, data.batches_per_epoch());
  LOPPER_CHECK(of > 0, "[prune] ", data.dataset().name(), " has no full batch to calibrate on");
  data.start_epoch(0);
  Batch b;
  double loss_sum = 0;
  while (s.batches < of && data.next(b)) {
    objective.prepare(b, s.batches);
    std::vector<at::Tensor> out = ex.run(feeds(io, b, ex.device()));
    at::Tensor loss = objective.loss(objective.targets(out.at(0), b));
    loss.backward();
    {
      c10::NoGradGuard no_grad;
      for (size_t i = 0; i < params.size(); ++i) {
        at::Tensor& p = params[i].second;
        at::Tensor g = p.grad();
        if (!g.defined()) continue;  // the weight does not reach the loss
        stats.add(params[i].first, p.detach(), g);
        p.mutable_grad().reset();
      }
    }
    loss_sum += loss.item<double>();
    s.samples += b.size();
    ++s.batches;
    stats.end_batch();
    if (opts.progress) opts.progress(s.batches, of, loss_sum / double(s.batches));
  }
  LOPPER_CHECK(s.batches > 0, "[prune] ", data.dataset().name(), " gave no batch to calibrate on");
  s.loss = loss_sum / double(s.batches);
  stats.fill(s);
  return s;
}

}  // namespace lopper
