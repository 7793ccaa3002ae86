// What each prunable layer sees of the calibration data (layer_inputs.h).
#include "prune/layer_inputs.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <set>

#include "lopper/analysis.h"
#include "lopper/data.h"
#include "lopper/error.h"
#include "lopper/executor.h"
#include "lopper/prune.h"
#include "train/loss.h"

namespace lopper {

namespace {

std::vector<int64_t> ints_attr(const ir::Node& n, const char* name, size_t size, int64_t value) {
  const ir::Attribute* a = n.attr(name);
  if (a && a->ints.size() == size) return a->ints;
  return std::vector<int64_t>(size, value);
}

// A Conv's input as the rows its weight multiplies: [N * positions, C * kh * kw] (im2col).
at::Tensor conv_patches(const ir::Node& n, at::Tensor x, const at::Tensor& w) {
  const int64_t spatial = w.dim() - 2;
  if (spatial == 1) x = x.unsqueeze(2);  // [N, C, 1, L]
  std::vector<int64_t> k = spatial == 1 ? std::vector<int64_t>{1, w.size(2)}
                                        : std::vector<int64_t>{w.size(2), w.size(3)};
  auto two = [&](std::vector<int64_t> v, int64_t fill) {
    return spatial == 1 ? std::vector<int64_t>{fill, v[0]} : v;
  };
  std::vector<int64_t> stride = two(ints_attr(n, "strides", spatial, 1), 1);
  std::vector<int64_t> dil = two(ints_attr(n, "dilations", spatial, 1), 1);
  std::vector<int64_t> pads = ints_attr(n, "pads", 2 * spatial, 0);  // begins, then ends
  std::vector<int64_t> pad_nd;  // constant_pad_nd: last dim first, (begin, end) each
  if (spatial == 1)
    pad_nd = {pads[0], pads[1]};
  else
    pad_nd = {pads[1], pads[3], pads[0], pads[2]};
  x = at::constant_pad_nd(x, pad_nd, 0);
  at::Tensor cols = at::im2col(x, k, dil, {0, 0}, stride);  // [N, C*kh*kw, L]
  return cols.transpose(1, 2).reshape({-1, cols.size(1)});
}

// X^T X of `rows` ([tokens, K] float32), from the tiles on and above the diagonal, each below
// it their mirror: nearly half the multiply-adds of one mm for a wide input (56% at K = 5632).
at::Tensor gram_of(const at::Tensor& rows) {
  const int64_t k = rows.size(1);
  const int64_t tile = std::max<int64_t>(512, (k + 7) / 8);
  if (k <= tile) return rows.t().mm(rows);
  at::Tensor g = at::empty({k, k}, rows.options());
  for (int64_t a = 0; a < k; a += tile) {
    const int64_t a2 = std::min(a + tile, k);
    const at::Tensor xa = rows.slice(1, a, a2).t();
    // One product for the row of tiles right of the diagonal, then each mirrored below it.
    const at::Tensor right = xa.mm(rows.slice(1, a));
    g.slice(0, a, a2).slice(1, a).copy_(right);
    if (a2 < k) g.slice(0, a2).slice(1, a, a2).copy_(right.slice(1, a2 - a).t());
  }
  return g;
}

}  // namespace

std::string layer_input_unsupported(const ir::Node& n, const at::Tensor& w) {
  if (n.op_type == "Gemm") return "";
  if (n.op_type == "MatMul") return w.dim() == 2 ? "" : "a MatMul weight of rank > 2";
  if (n.op_type == "Conv") {
    const ir::Attribute* g = n.attr("group");
    if (g && g->i != 1) return "a grouped convolution";
    const ir::Attribute* ap = n.attr("auto_pad");
    if (ap && !ap->s.empty() && ap->s != "NOTSET" && ap->s != "VALID")
      return "a convolution with auto_pad " + ap->s;
    if (w.dim() != 3 && w.dim() != 4) return "a " + std::to_string(w.dim() - 2) + "-D convolution";
    return "";
  }
  return "a " + n.op_type + " layer";
}

LayerInputCollector::LayerInputCollector(const ir::Graph& g,
                                         const std::map<std::string, bool>& watch) {
  for (const auto& n : g.nodes) {
    if (n.outputs.empty()) continue;
    const ir::Initializer* w = layer_weight(g, n);  // through a Transpose too
    if (!w) continue;
    auto it = watch.find(w->name);
    if (it == watch.end() || !layer_input_unsupported(n, w->value).empty()) continue;
    layers_[n.outputs[0]] = {it->first, it->second, &n};
  }
}

void LayerInputCollector::observe(const ir::Node& n, const std::vector<at::Tensor>& in) {
  if (n.outputs.empty() || in.size() < 2 || !in[0].defined()) return;
  auto it = layers_.find(n.outputs[0]);
  if (it == layers_.end()) return;
  const Layer& l = it->second;
  // Layers that read the same input (a transformer's q, k and v; gate and up) share one batch's
  // statistics: the input tensor is the same object, computed once.
  const bool same = last_.input.defined() && last_.input.is_same(in[0]) && last_.op == n.op_type &&
                    n.op_type != "Conv" && !(n.attr("transA") && n.attr("transA")->i != 0) &&
                    (!l.gram || last_.gram.defined());
  if (!same) {
    at::Tensor rows;
    if (n.op_type == "Conv") {
      rows = conv_patches(n, in[0], in[1]);
    } else {
      const ir::Attribute* ta = n.attr("transA");
      at::Tensor x = ta && ta->i != 0 ? in[0].t() : in[0];
      rows = x.reshape({-1, x.size(-1)});
    }
    // One batch's sums in float32 (the rows of a batch), added up over batches in float64.
    rows = rows.to(at::kFloat).contiguous();
    last_.input = in[0];
    last_.op = n.op_type;
    last_.tokens = rows.size(0);
    last_.sq_norm = rows.square().sum(0).to(at::kDouble);
    // NOTE: the batch's Gram matrix stays in float32, added into the float64 sum as it is read
    // (no float64 copy of it: 254 MB for a 5632-wide input).
    last_.gram = l.gram ? gram_of(rows) : at::Tensor();
    last_.first = l.weight;
  }
  const int64_t k = last_.sq_norm.size(0);
  LayerInput& li = stats_[l.weight];
  li.tokens += last_.tokens;
  // NOTE: a layer that reads the same input as the first layer of its run, as it did from the
  // first batch on, holds that layer's sums themselves (q, k and v: one Gram matrix, not three);
  // the sums are added once, by the first. Should the runs ever differ, the two part ways.
  auto follows = follows_.find(l.weight);
  if (follows != follows_.end()) {
    if (same && follows->second == last_.first) return;
    li.sq_norm = li.sq_norm.clone();
    if (li.gram.defined()) li.gram = li.gram.clone();
    follows_.erase(follows);
  }
  if (!li.sq_norm.defined()) {
    const LayerInput& first = stats_[last_.first];
    if (same && last_.first != l.weight && first.tokens == li.tokens &&
        (!l.gram || first.gram.defined())) {
      li.sq_norm = first.sq_norm;
      if (l.gram) li.gram = first.gram;
      follows_[l.weight] = last_.first;
      return;
    }
    li.sq_norm = at::zeros({k}, last_.sq_norm.options());
    if (l.gram) li.gram = at::zeros({k, k}, last_.sq_norm.options());
  }
  LOPPER_ASSERT(li.sq_norm.size(0) == k, "layer input of ", k, " features for weight '", l.weight,
                "', was ", li.sq_norm.size(0));
  li.sq_norm += last_.sq_norm;
  if (l.gram) li.gram += last_.gram;
}

std::map<std::string, LayerInput> LayerInputCollector::take() {
  last_ = {};
  follows_.clear();
  return std::move(stats_);
}

std::map<std::string, LayerInput> collect_layer_inputs(const ir::Model& model, DataLoader& data,
                                                       const LayerInputOptions& opts) {
  LOPPER_CHECK(opts.batches > 0, "[prune] " LOPPER_OPTION("batches") " must be > 0, got ",
               opts.batches);
  std::map<std::string, bool> watch;
  const std::set<std::string> only(opts.weights.begin(), opts.weights.end());
  for (const auto& pw : prunable_weights(model.graph))
    if (only.empty() || only.count(pw.weight)) watch[pw.weight] = opts.gram;
  LayerInputCollector collector(model.graph, watch);

  ExecOptions eo;
  eo.device = opts.device;
  eo.fuse = false;  // every layer runs as itself, with its own input
  Executor ex(model, eo);
  const ModelIO io = model_io(model);
  Objective objective(opts.loss, io);
  ex.on_node = [&](const ir::Node& n, const std::vector<at::Tensor>& in,
                   const std::vector<at::Tensor>&) { collector.observe(n, in); };

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
  auto out = collector.take();
  LOPPER_CHECK(!out.empty(),
               "[prune] the model has no Gemm, MatMul or Conv weights whose inputs to calibrate");
  return out;
}

}  // namespace lopper
