// Gradient saliencies from calibration batches: the model runs under autograd through the
// executor, the loss is cross-entropy on the dataset's labels, and each prunable weight's gradient
// is accumulated as mean |g| (grad) and sum |w * g| (first-order Taylor).
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <unordered_set>

#include "lopper/analysis.h"
#include "lopper/data.h"
#include "lopper/error.h"
#include "lopper/executor.h"
#include "lopper/loss.h"
#include "lopper/prune.h"

namespace lopper {

namespace {

// The input the batches feed: the first graph input that is not an initializer.
const ir::ValueInfo& data_input(const Executor& ex) {
  LOPPER_CHECK(!ex.inputs().empty(), "[prune] the model has no input to feed data to");
  return *ex.inputs()[0];
}

std::vector<int64_t> input_dims(const ir::ValueInfo& v) {
  std::vector<int64_t> dims;
  for (const auto& d : v.type.dims) dims.push_back(d.is_static() ? d.value : -1);
  if (dims.empty()) dims.push_back(-1);
  return dims;
}

// The op that writes graph output `name`, or "".
std::string producer_op(const ir::Graph& g, const std::string& name) {
  for (const auto& n : g.nodes)
    for (const auto& o : n.outputs)
      if (o == name) return n.op_type;
  return "";
}

}  // namespace

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

Saliency compute_saliency(const ir::Model& model, DataLoader& data,
                          const CalibrationOptions& opts) {
  LOPPER_CHECK(opts.batches > 0, "[prune] --calib-batches must be > 0, got ", opts.batches);
  ExecOptions eo;
  eo.device = opts.device;
  eo.autograd = true;  // eval semantics (BatchNorm running statistics, no dropout), gradients on
  Executor ex(model, eo);
  const ir::ValueInfo& input = data_input(ex);
  std::vector<int64_t> dims = input_dims(input);
  std::string out_op = producer_op(model.graph, model.graph.outputs.at(0).name);

  std::unordered_set<std::string> prunable;
  for (const auto& n : model.graph.nodes)
    if (const ir::Initializer* w = layer_weight(model.graph, n)) prunable.insert(w->name);
  std::vector<std::pair<std::string, at::Tensor>> params;
  for (auto& [name, p] : ex.parameters())
    if (prunable.count(name) && p.requires_grad()) params.emplace_back(name, p);
  LOPPER_CHECK(!params.empty(), "[prune] the model has no float prunable weights to score");

  Saliency s;
  std::vector<at::Tensor> grad_sum(params.size()), taylor_sum(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    grad_sum[i] = at::zeros_like(params[i].second, at::kFloat).detach();
    taylor_sum[i] = at::zeros_like(params[i].second, at::kFloat).detach();
  }
  int64_t of = std::min<int64_t>(opts.batches, data.batches_per_epoch());
  LOPPER_CHECK(of > 0, "[prune] ", data.dataset().name(), " has no full batch to calibrate on");
  data.start_epoch(0);
  Batch b;
  double loss_sum = 0;
  while (s.batches < of && data.next(b)) {
    at::Tensor x = fit_to_input(b.x, dims, input.name).to(ex.device());
    at::Tensor y = b.y.to(ex.device());
    std::vector<at::Tensor> out = ex.run({{input.name, x}});
    at::Tensor loss = classification_loss(out.at(0), y, out_op);
    loss.backward();
    {
      c10::NoGradGuard no_grad;
      for (size_t i = 0; i < params.size(); ++i) {
        at::Tensor& p = params[i].second;
        at::Tensor g = p.grad();
        if (!g.defined()) continue;  // the weight does not reach the loss
        grad_sum[i].add_(g.abs().to(at::kFloat));
        taylor_sum[i].add_((p.detach() * g).abs().to(at::kFloat));
        p.mutable_grad().reset();
      }
    }
    loss_sum += loss.item<double>();
    s.samples += b.y.size(0);
    ++s.batches;
    if (opts.progress) opts.progress(s.batches, of, loss_sum / double(s.batches));
  }
  LOPPER_CHECK(s.batches > 0, "[prune] ", data.dataset().name(), " gave no batch to calibrate on");
  s.loss = loss_sum / double(s.batches);
  for (size_t i = 0; i < params.size(); ++i) {
    s.grad[params[i].first] = grad_sum[i].div_(double(s.batches)).cpu();
    s.taylor[params[i].first] = taylor_sum[i].cpu();
  }
  return s;
}

}  // namespace lopper
