// Activation importance (activations.h): the sites of a dependency graph and their statistics over
// calibration batches, accumulated in the executor's node hook without keeping any activation.
#include "prune/activations.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <map>
#include <set>
#include <unordered_map>

#include "lopper/data.h"
#include "lopper/error.h"
#include "lopper/executor.h"
#include "prune/depgraph.h"
#include "train/loss.h"

namespace lopper {

namespace {

// The channel axis of a layer's data input (input 0), as the layers' channel rules track it.
int64_t data_axis(const ir::Node& n) {
  if (n.op_type == "Gemm") {
    const ir::Attribute* ta = n.attr("transA");
    return ta && ta->i != 0 ? 0 : 1;
  }
  if (n.op_type == "MatMul") return -1;
  return 1;  // Conv, ConvTranspose: [N, C, ...]
}

struct SiteStats {
  const ActivationSite* site = nullptr;
  at::Tensor part;   // [K] int64 on the device: the class of each index
  at::Tensor count;  // [P] float64 on the CPU: indices per class
  at::Tensor sum;    // mean magnitude: [K] sum of |x| per index; l2: [P] sum of the norms
  int64_t positions = 0;
};

// Every layer that reads a channel group's channels with its weight, with its data input's atoms:
// the layers with a slice along their input channels, and grouped and depthwise convolutions.
std::vector<std::pair<size_t, std::vector<int64_t>>> layer_inputs(const ir::Graph& g,
                                                                  const depgraph::DepGraph& dg) {
  std::vector<std::pair<size_t, std::vector<int64_t>>> out;  // (node, its data input's atoms)
  std::map<size_t, std::multiset<std::vector<int64_t>>> slices_of;  // grouped convolutions'
  for (const auto& sl : dg.slices) {
    if (sl.role == ops::ParamRole::kWeightIn) out.emplace_back(sl.node, sl.atoms);
    const ir::Node& n = g.nodes[sl.node];
    const ir::Attribute* group = n.attr("group");
    if (n.op_type == "Conv" && group && group->i > 1) slices_of[sl.node].insert(sl.atoms);
  }
  // NOTE: a grouped or depthwise convolution has no slice along its input channels (its rule cuts
  // the weight by an edit). An edit that is not one of the node's slices follows the node's
  // tracked inputs (depgraph::Edit), here its data input alone: the weight and bias are constants.
  for (const auto& e : dg.edits) {
    auto it = slices_of.find(e.node);
    if (it == slices_of.end() || e.atoms.empty()) continue;
    auto same = it->second.find(e.atoms);
    if (same != it->second.end())
      it->second.erase(same);  // the slice's own edit
    else
      out.emplace_back(e.node, e.atoms);
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  return out;
}

}  // namespace

std::vector<ActivationSite> activation_sites(const ir::Graph& g, depgraph::DepGraph& dg) {
  std::vector<ActivationSite> sites;
  std::set<std::string> seen;
  for (const auto& [node, atoms] : layer_inputs(g, dg)) {
    const ir::Node& n = g.nodes[node];
    if (n.inputs.empty() || n.inputs[0].empty() || n.outputs.empty()) continue;
    if (!seen.insert(n.inputs[0]).second) continue;  // read by an earlier layer: one site
    ActivationSite s;
    s.value = n.inputs[0];
    s.reader = n.outputs[0];
    s.axis = data_axis(n);
    s.atoms = atoms;
    std::map<int64_t, int64_t> local;  // class -> its index among the site's
    for (int64_t atom : atoms) {
      auto [it, fresh] = local.try_emplace(dg.find(atom), s.parts);
      if (fresh) ++s.parts;
      s.part.push_back(it->second);
    }
    sites.push_back(std::move(s));
  }
  return sites;
}

Saliency collect_activations(const ir::Model& model, const std::vector<ActivationSite>& sites,
                             bool l2, DataLoader& data, const CalibrationOptions& calib,
                             const std::string& criterion) {
  LOPPER_CHECK(calib.batches > 0, "[prune] " LOPPER_OPTION("batches") " must be > 0, got ",
               calib.batches);
  LOPPER_CHECK(!sites.empty(), "[prune] ", criterion,
               ": no layer with a weight reads a channel group (nothing to rank by activation)");
  ExecOptions eo;
  eo.device = calib.device;
  eo.fuse = false;     // every layer runs as itself and reads its own input
  eo.prepack = false;  // one pass: no packed copies, no kernel timing
  Executor ex(model, eo);
  const ModelIO io = model_io(model);
  Objective objective(calib.loss, io);

  std::vector<SiteStats> stats(sites.size());
  std::unordered_map<std::string, SiteStats*> by_reader;
  for (size_t i = 0; i < sites.size(); ++i) {
    const ActivationSite& s = sites[i];
    SiteStats& st = stats[i];
    st.site = &s;
    st.part = at::tensor(s.part, at::kLong).to(ex.device());
    st.count = at::zeros({s.parts}, at::kDouble)
                   .index_add_(0, at::tensor(s.part, at::kLong),
                               at::ones({int64_t(s.part.size())}, at::kDouble));
    st.sum = at::zeros({l2 ? s.parts : int64_t(s.part.size())},
                       at::TensorOptions(ex.device()).dtype(at::kDouble));
    by_reader[s.reader] = &st;
  }
  ex.on_node = [&](const ir::Node& n, const std::vector<at::Tensor>& in,
                   const std::vector<at::Tensor>&) {
    if (n.outputs.empty() || in.empty() || !in[0].defined()) return;
    auto it = by_reader.find(n.outputs[0]);
    if (it == by_reader.end()) return;
    SiteStats& st = *it->second;
    const ActivationSite& s = *st.site;
    const at::Tensor& x = in[0];
    const int64_t k = int64_t(s.part.size());
    const int64_t axis = s.axis < 0 ? s.axis + x.dim() : s.axis;
    LOPPER_CHECK(axis >= 0 && axis < x.dim() && x.size(axis) == k, "[prune] ", criterion,
                 ": node '", n.label(), "' read '", s.value, "' of shape ", x.sizes(),
                 ", the analysis saw ", k, " channels on axis ", s.axis);
    const at::Tensor rows = x.to(at::kFloat).movedim(axis, -1).reshape({-1, k});  // [positions, K]
    st.positions += rows.size(0);
    if (l2) {  // per position, the L2 norm of each class's features
      at::Tensor sq = at::zeros({rows.size(0), s.parts}, rows.options());
      sq.index_add_(1, st.part, rows.square());
      st.sum += sq.sqrt().sum(0, false, at::kDouble);
    } else {
      st.sum += rows.abs().sum(0, false, at::kDouble);
    }
  };

  const int64_t of = std::min<int64_t>(calib.batches, data.batches_per_epoch());
  LOPPER_CHECK(of > 0, "[prune] ", data.dataset().name(), " has no full batch to calibrate on");
  data.start_epoch(0);
  c10::NoGradGuard no_grad;
  Saliency out;
  Batch b;
  double loss_sum = 0;
  while (out.batches < of && data.next(b)) {
    objective.prepare(b, out.batches);
    std::vector<at::Tensor> y = ex.run(feeds(io, b, ex.device()));
    loss_sum += objective.loss(objective.targets(y.at(0), b)).item<double>();
    out.samples += b.size();
    ++out.batches;
    if (calib.progress) calib.progress(out.batches, of, loss_sum / double(out.batches));
  }
  LOPPER_CHECK(out.batches > 0, "[prune] ", data.dataset().name(),
               " gave no batch to calibrate on");
  out.loss = loss_sum / double(out.batches);
  auto& terms = out.scores[criterion];
  for (const SiteStats& st : stats) {
    if (st.positions == 0) continue;  // not run (a branch the data never takes)
    const at::Tensor part = at::tensor(st.site->part, at::kLong);
    at::Tensor score = st.sum.cpu() / double(st.positions);
    if (!l2)  // the mean over each class's indices
      score = at::zeros({st.site->parts}, at::kDouble).index_add_(0, part, score) / st.count;
    // Each index's share of its class's score.
    terms[st.site->value] = (score / st.count).index_select(0, part);
  }
  return out;
}

}  // namespace lopper
