// The training loop: the executor in training mode (autograd, BatchNorm on batch statistics,
// Dropout active), PyTorch-style optimisers, masks that keep pruned weights at zero, regularisers,
// progressive pruning, checkpoints, and gradient averaging over c10d ranks.
#include "lopper/train.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <c10/core/GradMode.h>
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <fmt/format.h>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "lopper/data.h"
#include "lopper/distributed.h"
#include "lopper/error.h"
#include "lopper/executor.h"
#include "lopper/files.h"
#include "lopper/npy.h"
#include "lopper/onnx_io.h"
#include "lopper/structured.h"
#include "prune/importance.h"
#include "train/loss.h"
#include "train/loss_scaler.h"
#include "train/optimizer.h"
#include "util/pattern.h"

namespace lopper {

double agp_sparsity(double s_i, double s_f, double t, double t0, double t1) {
  if (t <= t0) return s_i;
  if (t >= t1) return s_f;
  double r = 1.0 - (t - t0) / (t1 - t0);
  return s_f + (s_i - s_f) * r * r * r;
}

double prunable_sparsity(const ir::Model& model) {
  int64_t params = 0, nonzero = 0;
  for (const auto& p : prunable_weights(model.graph)) {
    const at::Tensor& w = model.graph.find_initializer(p.weight)->value;
    params += w.numel();
    nonzero += w.count_nonzero().item<int64_t>();
  }
  return params ? 1.0 - double(nonzero) / double(params) : 0.0;
}

namespace {

namespace fs = std::filesystem;

// The metadata key under which lopper.export_onnx lists the module's buffers
// (python/lopper/_onnx.py: BUFFERS_KEY).
constexpr const char* kBuffersKey = "lopper.buffers";

// The file that marks a checkpoint folder as lopper's (see check_checkpoint_dir).
constexpr const char* kCheckpointMarker = ".lopper-checkpoint";

// A checkpoint folder held for one run: its marker file (made when missing, with the folder) is
// locked (flock) until the run ends, so that a second run on the same folder is refused instead
// of each removing the other's epochs. A run that made the folder or the marker and wrote no
// checkpoint removes them again: a failed run leaves nothing.
class CheckpointLock {
 public:
  explicit CheckpointLock(const std::string& dir) : dir_(dir) {
    std::error_code ec;
    if (!fs::exists(dir_, ec)) {
      made_dir_ = fs::create_directory(dir_, ec);
      LOPPER_CHECK(!ec, "[train] cannot make the checkpoint folder '", dir, "': ", ec.message());
    }
    const std::string marker = (dir_ / kCheckpointMarker).string();
    // NOTE: O_EXCL makes the marker once: two runs starting together open the same file, so
    // that their locks meet (a marker replaced by a rename would give each its own).
    fd_ = ::open(marker.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd_ >= 0) {
      made_marker_ = true;
      const std::string text =
          "A checkpoint folder of lopper train: epoch-N/ and latest are lopper's.\n";
      const bool ok = ::write(fd_, text.data(), text.size()) == ssize_t(text.size());
      if (!ok) release();
      LOPPER_CHECK(ok, "[train] cannot write '", marker, "': ", std::strerror(errno));
    } else if (errno == EEXIST) {
      fd_ = ::open(marker.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    }
    if (fd_ < 0) {
      const int e = errno;
      release();
      throw Error(detail::concat("[train] cannot open '", marker, "': ", std::strerror(e)));
    }
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      const int e = errno;
      release();
      if (e == EWOULDBLOCK)
        throw UsageError("[train] " LOPPER_OPTION("checkpoint_dir") " " + dir +
                         " is in use by another run of lopper train (it holds the lock on " +
                         kCheckpointMarker + "); give another folder or wait for it to end");
      throw Error(detail::concat("[train] cannot lock '", marker, "': ", std::strerror(e)));
    }
  }
  ~CheckpointLock() { release(); }
  CheckpointLock(const CheckpointLock&) = delete;
  CheckpointLock& operator=(const CheckpointLock&) = delete;

 private:
  void release() {
    std::error_code ec;
    const bool wrote = fs::exists(dir_ / "latest", ec);
    if (made_marker_ && !wrote) fs::remove(dir_ / kCheckpointMarker, ec);
    if (made_dir_ && !wrote) fs::remove(dir_, ec);  // only when empty again
    if (fd_ >= 0) ::close(fd_);                     // the lock goes with the descriptor
    fd_ = -1;
    made_marker_ = made_dir_ = false;
  }

  fs::path dir_;
  int fd_ = -1;
  bool made_dir_ = false, made_marker_ = false;
};

// Mixed precision for one forward pass: ATen's autocast runs matmul-class ops (linear, conv,
// matmul) in `dtype` and keeps reductions, normalisations and losses in fp32; the weights stay
// fp32 master copies. fp32 leaves everything as it is.
class AutocastScope {
 public:
  AutocastScope(at::DeviceType dev, at::ScalarType dtype) : dev_(dev), on_(dtype != at::kFloat) {
    if (!on_) return;
    prev_enabled_ = at::autocast::is_autocast_enabled(dev);
    prev_dtype_ = at::autocast::get_autocast_dtype(dev);
    at::autocast::set_autocast_dtype(dev, dtype);
    at::autocast::set_autocast_enabled(dev, true);
    at::autocast::increment_nesting();
  }
  ~AutocastScope() {
    if (!on_) return;
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_autocast_enabled(dev_, prev_enabled_);
    at::autocast::set_autocast_dtype(dev_, prev_dtype_);
  }
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  at::DeviceType dev_;
  bool on_, prev_enabled_ = false;
  at::ScalarType prev_dtype_ = at::kFloat;
};

// One trained initializer.
struct Param {
  std::string name;
  at::Tensor value;  // the executor's leaf
  at::Tensor keep;   // prunable weights with zeros: true where the weight is alive (else undefined)
  bool prunable = false, bn_scale = false;
  bool tied = false;  // prunable, but the schedule leaves it alone (PruneLayerOptions::allow_tied)
  int64_t out_axis = -1;
};

// NOTE: PyTorch's exporter stores equal initializers once and reads the copies through Identity
// nodes (a fresh BatchNorm's running_var is Identity(weight): both all ones). Trained as they
// are, those tensors would be one parameter, and the running-statistics update would write the
// scale. Each such Identity becomes an initializer of its own before training.
void untie_identity_initializers(ir::Graph& g) {
  std::unordered_set<std::string> outputs;
  for (const auto& o : g.outputs) outputs.insert(o.name);
  std::vector<ir::Node> kept;
  for (auto& n : g.nodes) {
    const ir::Initializer* src =
        n.op_type == "Identity" && n.inputs.size() == 1 && n.outputs.size() == 1
            ? g.find_initializer(n.inputs[0])
            : nullptr;
    if (src && !outputs.count(n.outputs[0]) && !g.find_initializer(n.outputs[0])) {
      g.initializers.push_back({n.outputs[0], src->value.clone(), "", false});
      continue;
    }
    kept.push_back(std::move(n));
  }
  g.nodes = std::move(kept);
}

class Trainer {
 public:
  Trainer(ir::Model& model, DataLoader& data, const TrainOptions& o, const TrainCallbacks& cb,
          Distributed* dist)
      : model_(model), data_(data), o_(o), cb_(cb), dist_(dist) {
    check_options();
    // A schedule whose criterion ranks by gradients accumulates them at every step.
    if (o_.schedule != PruneSchedule::kNone) {
      const importance::Criterion& c =
          o_.structured_schedule
              ? importance::find(o_.structured.criterion, importance::Use::kChannels)
              : importance::find(o_.prune.criterion, importance::Use::kWeights);
      if (c.needs == importance::Needs::kGradients) saliency_.emplace(c.name);
    }
    untie_identity_initializers(model_.graph);
    build();
    if (o_.distill.teacher) setup_teacher();
  }

  TrainResult run() {
    // Dropout draws from ATen's default generator: seeded, so the same seed trains the same model
    // (each rank its own stream).
    at::manual_seed(o_.seed * 1000003 + uint64_t(dist_ ? dist_->rank() : 0));
    if (!o_.checkpoint_dir.empty() && !(dist_ && !dist_->is_main()))
      lock_.emplace(o_.checkpoint_dir);
    if (!o_.resume.empty()) resume();
    if (cb_.start) cb_.start();
    if (dist_ && dist_->world() > 1) {
      // Every rank starts from rank 0's weights (and running statistics).
      std::vector<at::Tensor> all;
      for (const auto& [name, t] : ex_->parameters()) all.push_back(t.detach());
      dist_->broadcast(all);
      refresh_masks();
    }
    steps_per_epoch_ = data_.batches_per_epoch();
    LOPPER_CHECK(steps_per_epoch_ > 0, "[train] ", data_.dataset().name(),
                 " gives no batch per epoch (batch size ", data_.options().batch_size, ")");
    s_initial_ = o_.structured_schedule ? 0.0 : sparsity_now();
    for (int64_t e = first_epoch_; e < o_.epochs; ++e) run_epoch(e);
    write_back(model_);
    return result_;
  }

 private:
  // The executor, parameters, optimiser and group-lasso structure for the model as it is now
  // (again after a structured removal: the optimiser's state restarts).
  void build() {
    ExecOptions eo;
    eo.device = o_.device;
    eo.training = true;
    ex_.reset();
    ex_ = std::make_unique<Executor>(model_, eo);
    io_ = model_io(model_);
    if (!o_.distill.states.empty()) {
      // The student's compared tensors, taken as its nodes write them (still in autograd's graph).
      for (const auto& st : o_.distill.states)
        if (!writes(model_.graph, st.student))
          throw UsageError("[train] " LOPPER_OPTION("distill_state") " '" + st.student + "=" +
                           st.teacher + "': no node of the student writes '" + st.student + "'");
      ex_->on_node = [this](const ir::Node& n, const std::vector<at::Tensor>&,
                            const std::vector<at::Tensor>& out) {
        for (size_t k = 0; k < n.outputs.size() && k < out.size(); ++k)
          if (auto it = student_states_.find(n.outputs[k]); it != student_states_.end())
            it->second = out[k];
      };
    }
    if (!objective_) objective_.emplace(o_.loss, io_);
    params_.clear();
    collect_params();
    std::vector<at::Tensor> leaves;
    for (auto& p : params_) leaves.push_back(p.value);
    optim::OptimizerConfig oc;
    oc.kind = o_.optimizer;
    oc.momentum = o_.momentum;
    oc.nesterov = o_.nesterov;
    oc.weight_decay = o_.weight_decay;
    oc.beta1 = o_.beta1;
    oc.beta2 = o_.beta2;
    oc.eps = o_.eps;
    opt_ = std::make_unique<optim::Optimizer>(oc, leaves);
    gl_.clear();
    gl_sizes_.clear();
    if (o_.group_lasso > 0) {
      GroupSlices gs = channel_group_slices(model_, o_.structured);
      std::unordered_map<std::string, size_t> index;
      for (size_t i = 0; i < params_.size(); ++i) index[params_[i].name] = i;
      gl_sizes_ = gs.group_sizes;
      for (const auto& sl : gs.slices)
        if (auto it = index.find(sl.weight); it != index.end())
          gl_.push_back({it->second, sl.axis, sl.group,
                         at::tensor(sl.channel, at::kLong).to(ex_->device()),
                         at::tensor(sl.index, at::kLong).to(ex_->device())});
      if (gl_.empty())  // no channel group: each prunable weight's output channels on their own
        for (size_t i = 0; i < params_.size(); ++i)
          if (params_[i].prunable && params_[i].out_axis >= 0) {
            const int64_t n = params_[i].value.size(params_[i].out_axis);
            gl_.push_back(
                {i, params_[i].out_axis, int64_t(gl_sizes_.size()),
                 at::arange(n, at::TensorOptions().dtype(at::kLong).device(ex_->device())),
                 at::Tensor()});
            gl_sizes_.push_back(n);
          }
    }
  }

  void check_options() {
    check_train_options(o_);
    if (!o_.checkpoint_dir.empty()) check_checkpoint_dir(o_.checkpoint_dir);
    precision_ = o_.precision;
  }

  void collect_params() {
    std::unordered_set<std::string> bn_stats, bn_scales;
    for (const auto& n : model_.graph.nodes)
      if (n.op_type == "BatchNormalization" && n.inputs.size() >= 5) {
        bn_scales.insert(n.inputs[1]);
        bn_stats.insert(n.inputs[3]);
        bn_stats.insert(n.inputs[4]);
      }
    std::unordered_map<std::string, int64_t> prunable;
    std::unordered_set<std::string> tied;  // left alone by the schedule's prune() (allow_tied)
    for (const auto& w : prunable_weights(model_.graph)) {
      prunable[w.weight] = w.out_axis;
      if (w.tied() && !o_.prune.allow_tied) tied.insert(w.weight);
    }
    // A module's buffers, as lopper.export_onnx names them in the file's metadata: PyTorch's
    // optimisers never see them (RoPE's inv_freq), so neither does lopper's.
    std::unordered_set<std::string> buffers;
    for (const auto& [key, value] : model_.metadata_props)
      if (key == kBuffersKey) {
        try {
          for (const auto& b : nlohmann::json::parse(value)) buffers.insert(b.get<std::string>());
        } catch (const nlohmann::json::exception& e) {
          throw Error(std::string("[train] the model's metadata '") + kBuffersKey +
                      "' is not a JSON list of names: " + e.what());
        }
      }
    std::optional<Pattern> freeze;
    if (!o_.freeze.empty()) {
      if (const std::string why = Pattern::error_of(o_.freeze); !why.empty())
        throw Error("[train] " LOPPER_OPTION("freeze") " '" + o_.freeze +
                    "' is not a valid regex: " + why);
      freeze.emplace(o_.freeze, "freeze");
    }
    for (auto& [name, t] : ex_->parameters()) {
      // NOTE: scalars are constants the exporter kept as initializers (epsilons, attention
      // scales), not parameters; BatchNorm's running statistics are updated by the op itself.
      if (!t.requires_grad() || t.numel() <= 1 || bn_stats.count(name) || buffers.count(name))
        continue;
      if (freeze && freeze->search(name)) continue;
      Param p;
      p.name = name;
      p.value = t;
      auto it = prunable.find(name);
      p.prunable = it != prunable.end();
      p.out_axis = p.prunable ? it->second : -1;
      p.tied = tied.count(name) > 0;
      p.bn_scale = bn_scales.count(name) > 0;
      params_.push_back(std::move(p));
    }
    LOPPER_CHECK(!params_.empty(), "[train] the model has no float parameters to train");
    refresh_masks();
  }

  // Masks from the zeros the prunable weights hold now.
  void refresh_masks() {
    for (auto& p : params_) {
      if (!p.prunable) continue;
      at::Tensor keep = p.value.detach().ne(0);
      p.keep = keep.all().item<bool>() ? at::Tensor() : keep;
    }
  }

  double sparsity_now() const {
    int64_t n = 0, nz = 0;
    for (const auto& p : params_)
      if (p.prunable && !p.tied) {  // what the schedule prunes: a tied weight would hold it back
        n += p.value.numel();
        nz += p.value.detach().count_nonzero().item<int64_t>();
      }
    return n ? 1.0 - double(nz) / double(n) : 0.0;
  }

  double lr_at(int64_t epoch, int64_t step) const {
    double lr = o_.lr;
    if (o_.lr_schedule == LrSchedule::kCosine) {
      lr = o_.lr * 0.5 * (1 + std::cos(M_PI * double(epoch) / double(o_.epochs)));
    } else if (o_.lr_schedule == LrSchedule::kStep) {
      int64_t every =
          o_.lr_step_epochs > 0 ? o_.lr_step_epochs : std::max<int64_t>(1, o_.epochs / 3);
      lr = o_.lr * std::pow(o_.lr_gamma, double(epoch / every));
    }
    double warm = o_.warmup_epochs * double(steps_per_epoch_);
    double t = double(epoch * steps_per_epoch_ + step + 1);
    if (warm > 0 && t <= warm) lr *= t / warm;
    return lr;
  }

  at::Tensor regularisers() {
    at::Tensor r;
    auto add = [&](const at::Tensor& t) { r = r.defined() ? r + t : t; };
    for (auto& p : params_) {
      if (p.prunable && o_.l1 > 0) add(p.value.abs().sum() * o_.l1);
      if (p.bn_scale && o_.bn_l1 > 0) add(p.value.abs().sum() * o_.bn_l1);
    }
    // Group lasso: one L2 norm per channel over every weight slice that channel owns (build()
    // says which: the dependency graph's groups, else each weight's output channels).
    std::vector<at::Tensor> acc(gl_sizes_.size());
    for (const auto& t : gl_) {
      const at::Tensor& v = params_[t.param].value;
      std::vector<int64_t> others;
      for (int64_t d = 0; d < v.dim(); ++d)
        if (d != t.axis) others.push_back(d);
      at::Tensor sq = others.empty() ? v.square() : v.square().sum(others);
      at::Tensor& a = acc[t.group];
      if (!a.defined()) a = at::zeros({gl_sizes_[t.group]}, sq.options());
      a = a.index_add(0, t.channel, t.index.defined() ? sq.index_select(0, t.index) : sq);
    }
    // NOTE: a small epsilon keeps the gradient of a channel norm finite once it reaches 0.
    for (const auto& a : acc)
      if (a.defined()) add((a + 1e-12).sqrt().sum() * o_.group_lasso);
    return r;
  }

  bool needs_saliency() const { return saliency_.has_value(); }

  // NOTE: the loss and the hits stay where the model runs: reading them on the host each step
  // would make a GPU drain its queue before the host may queue the next step (run_epoch reads
  // them in batches).
  struct StepResult {
    at::Tensor terms;    // [4] double: the loss (task and distillation mixed), task, KL, states
    at::Tensor correct;  // 0-d int64: top-1 hits among the targets
    int64_t count = 0;   // targets: samples, or tokens for language models
    bool finite = true;  // false: fp16 gradients overflowed, the step must be skipped
  };

  // Forward (under autocast for bf16/fp16) and backward on one batch. Gradients are averaged
  // over ranks, unscaled (fp16) and masked.
  StepResult forward_backward(Batch b, int64_t step) {
    objective_->prepare(b, step);
    NamedInputs in = feeds(io_, b, ex_->device());
    for (auto& [name, t] : student_states_) t = at::Tensor();
    std::vector<at::Tensor> out;
    {
      AutocastScope amp(ex_->device().type(), precision_);
      out = ex_->run(in);
    }
    const std::vector<at::Tensor> tout = teacher_ ? run_teacher(b, out.at(0)) : out;
    // Data without labels, distilled alone: every sample's output is a row, and the accuracy is
    // the agreement with the teacher's top-1.
    const bool unlabelled =
        teacher_ && o_.distill.alpha >= 1 && !b.y.defined() && out.at(0).dim() != 3;
    Objective::Targets t;
    at::Tensor teacher_rows, task, total;
    if (unlabelled) {
      t.logits = out.at(0).to(at::kFloat).reshape({b.x.size(0), -1});
      teacher_rows = tout.at(0).to(at::kFloat).reshape({b.x.size(0), -1});
      t.labels = teacher_rows.argmax(1);
    } else {
      LOPPER_CHECK(!teacher_ || b.y.defined() || out.at(0).dim() == 3,
                   "[train] the data has no labels: distil from the teacher alone (" LOPPER_OPTION(
                       "distill_alpha") " 1), or give labels");
      t = objective_->targets(out.at(0), b);
      if (teacher_) teacher_rows = objective_->targets(tout.at(0), b).logits;
      std::optional<c10::NoGradGuard> shown;  // distilled alone: the task is shown, not trained on
      if (teacher_ && o_.distill.alpha >= 1) shown.emplace();
      task = objective_->loss(t);
    }
    at::Tensor kl, state;
    if (teacher_) {
      kl = distillation_kl(as_logits(t.logits, io_.out_op),
                           as_logits(teacher_rows, teacher_->io.out_op), o_.distill.temperature);
      total = unlabelled ? kl : distillation_mix(task, kl, o_.distill);
      state = state_loss(tout);
      if (state.defined()) total = total + state * o_.distill.state_weight;
    } else {
      total = task;
    }
    const int64_t count = t.labels.size(0);
    const at::Tensor objective = total;
    if (at::Tensor r = regularisers(); r.defined()) total = total + r;
    for (auto& p : params_) p.value.mutable_grad().reset();
    const bool scaled = precision_ == at::kHalf;
    (scaled ? total * scaler_.scale : total).backward();
    c10::NoGradGuard no_grad;
    std::vector<at::Tensor> grads;
    for (auto& p : params_) {
      if (!p.value.grad().defined()) p.value.mutable_grad() = at::zeros_like(p.value);
      grads.push_back(p.value.mutable_grad());
    }
    if (dist_ && dist_->world() > 1) dist_->allreduce_mean(grads);
    const at::TensorOptions d = at::TensorOptions().dtype(at::kDouble).device(objective.device());
    auto term = [&](const at::Tensor& v, double none) {
      return v.defined() ? v.detach().to(at::kDouble).reshape({}) : at::full({}, none, d);
    };
    const at::Tensor terms =
        at::stack({term(objective, 0), term(task, std::nan("")), term(kl, 0), term(state, 0)});
    // NOTE: after the all-reduce every rank holds the same gradients, so all skip alike.
    if (scaled && !scaler_.unscale(grads)) return {terms, correct_of(t), count, false};
    for (auto& p : params_) {
      if (p.keep.defined()) p.value.mutable_grad().mul_(p.keep);
      if (needs_saliency() && p.prunable) saliency_->add(p.name, p.value.detach(), p.value.grad());
    }
    if (needs_saliency()) saliency_->end_batch();
    if (unlabelled) agreement_ = true;
    return {terms, correct_of(t), count, true};
  }

  // Distillation's teacher: the same inputs as the student's, inference in the run's precision,
  // its first output of the student's shape, and the compared states of one shape each.
  void setup_teacher() {
    const DistillOptions& d = o_.distill;
    Teacher tc;
    tc.io = model_io(*d.teacher);
    auto dims = [](const std::vector<int64_t>& v) {
      std::string s;
      for (int64_t x : v)
        s += (s.empty() ? "" : ", ") + (x < 0 ? std::string("?") : std::to_string(x));
      return "[" + s + "]";
    };
    auto fits = [](const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
      if (a.empty() || b.empty()) return true;  // unknown
      if (a.size() != b.size()) return false;
      for (size_t i = 0; i < a.size(); ++i)
        if (a[i] >= 0 && b[i] >= 0 && a[i] != b[i]) return false;
      return true;
    };
    bool same = tc.io.inputs.size() == io_.inputs.size();
    for (const auto& in : io_.inputs) {
      const auto it = std::find_if(tc.io.inputs.begin(), tc.io.inputs.end(),
                                   [&](const ModelIO::Input& x) { return x.name == in.name; });
      same = same && it != tc.io.inputs.end() && it->dtype == in.dtype && fits(it->dims, in.dims);
    }
    if (!same)
      throw UsageError("[train] the " LOPPER_OPTION("teacher") "'s inputs (" + input_names(tc.io) +
                       ") are not the student's (" + input_names(io_) +
                       "): distillation feeds both the same batch, so they must take the same "
                       "inputs, by name, type and fixed size");
    if (!fits(tc.io.out_dims, io_.out_dims))
      throw UsageError("[train] the " LOPPER_OPTION("teacher") "'s output " + dims(tc.io.out_dims) +
                       " is not the student's " + dims(io_.out_dims) +
                       ": distillation compares outputs of one shape");
    std::shared_ptr<const ir::Model> model = d.teacher;
    if (!d.states.empty()) {
      auto copy = std::make_shared<ir::Model>(*d.teacher);
      for (const auto& st : d.states) {
        if (!writes(copy->graph, st.teacher))
          throw UsageError("[train] " LOPPER_OPTION("distill_state") " '" + st.student + "=" +
                           st.teacher + "': no node of the " LOPPER_OPTION("teacher") " writes '" +
                           st.teacher + "'");
        copy->graph.outputs.push_back({st.teacher, {}, ""});
      }
      model = copy;
    }
    tc.model = model;
    ExecOptions eo;
    eo.device = o_.device;
    eo.precision = precision_;
    tc.ex = std::make_unique<Executor>(*tc.model, eo);
    teacher_.emplace(std::move(tc));
    for (const auto& st : d.states) student_states_[st.student] = at::Tensor();
  }

  // The teacher's outputs on batch `b` (its first, then the states), as tensors autograd may
  // read (an inference tensor cannot be saved for backward).
  std::vector<at::Tensor> run_teacher(const Batch& b, const at::Tensor& student_out) {
    std::vector<at::Tensor> out = teacher_->ex->run(feeds(teacher_->io, b, teacher_->ex->device()));
    for (auto& t : out) t = t.clone();
    if (out.at(0).sizes() != student_out.sizes())
      throw UsageError(
          detail::concat("[train] the " LOPPER_OPTION("teacher") "'s output ", out[0].sizes(),
                         " is not the student's ", student_out.sizes(),
                         " on the same batch: distillation compares outputs of one shape"));
    return out;
  }

  // The states' mean squared errors, summed (undefined: no state).
  at::Tensor state_loss(const std::vector<at::Tensor>& tout) {
    at::Tensor sum;
    const auto& states = o_.distill.states;
    for (size_t i = 0; i < states.size(); ++i) {
      const at::Tensor& s = student_states_.at(states[i].student);
      LOPPER_CHECK(s.defined(), "[train] " LOPPER_OPTION("distill_state") " '", states[i].student,
                   "': the student did not compute it on this batch");
      const at::Tensor& t = tout.at(1 + i);
      if (s.sizes() != t.sizes())
        throw UsageError(detail::concat(
            "[train] " LOPPER_OPTION("distill_state") " '", states[i].student, "=",
            states[i].teacher, "': the student's tensor is ", s.sizes(), ", the teacher's ",
            t.sizes(), " (states are compared where their widths match)"));
      at::Tensor m = at::mse_loss(s.to(at::kFloat), t.to(at::kFloat));
      sum = sum.defined() ? sum + m : m;
    }
    return sum;
  }

  // Rows of an output as logits: a Softmax's probabilities through their log (a LogSoftmax's
  // output already is one, up to a constant per row).
  static at::Tensor as_logits(const at::Tensor& rows, const std::string& out_op) {
    return out_op == "Softmax" ? at::log(rows.clamp_min(1e-12)) : rows;
  }

  static bool writes(const ir::Graph& g, const std::string& name) {
    for (const auto& n : g.nodes)
      for (const auto& o : n.outputs)
        if (o == name) return true;
    return false;
  }

  void clip_gradients() {
    if (o_.grad_clip <= 0) return;
    c10::NoGradGuard no_grad;
    at::Tensor sq;
    for (auto& p : params_) {
      at::Tensor s = p.value.grad().to(at::kFloat).square().sum();
      sq = sq.defined() ? sq + s : s;
    }
    // As torch.nn.utils.clip_grad_norm_: the factor min(1, clip / (norm + 1e-6)) stays on the
    // device (no wait for a GPU).
    at::Tensor scale = (o_.grad_clip / (sq.sqrt() + 1e-6)).clamp_max(1.0);
    for (auto& p : params_) p.value.mutable_grad().mul_(scale);
  }

  void apply_masks() {
    c10::NoGradGuard no_grad;
    for (size_t i = 0; i < params_.size(); ++i) {
      if (!params_[i].keep.defined()) continue;
      params_[i].value.detach().mul_(params_[i].keep);
      opt_->mask_state(i, params_[i].keep);
    }
  }

  // The current weights into `m`'s initializers (CPU copies).
  void write_back(ir::Model& m) {
    c10::NoGradGuard no_grad;
    for (const auto& [name, t] : ex_->parameters())
      if (ir::Initializer* init = m.graph.find_initializer(name))
        init->value = t.detach().to(at::kCPU).clone();
  }

  // Prunes to `target` sparsity of the prunable weights (counted from what is left, like
  // prune()), then resets the masks. Every rank computes the same masks from the same weights and
  // (all-reduced) saliencies.
  void prune_to(double target, const std::string& why) {
    if (o_.structured_schedule) return remove_channels_to(target, why);
    double now = sparsity_now();
    if (target <= now + 1e-12) return;
    if (needs_saliency() && saliency_->batches() == 0) calibrate();
    ir::Model snap = model_;
    write_back(snap);
    PruneOptions po = o_.prune;
    po.amount = PruneAmount{std::clamp(1.0 - (1.0 - target) / (1.0 - now), 0.0, 1.0), false};
    Saliency sal = saliency_so_far();
    PruneReport r = prune(snap, po, needs_saliency() ? &sal : nullptr);
    {
      c10::NoGradGuard no_grad;
      for (auto& p : params_)
        if (p.prunable)
          p.value.detach().copy_(snap.graph.find_initializer(p.name)->value.to(ex_->device()));
    }
    refresh_masks();
    apply_masks();
    reset_saliency();
    double got = r.params ? 1.0 - double(r.nonzero_after) / double(r.params) : 0.0;
    note(fmt::format("{}: pruned to {:.1f}% sparsity ({} {}, target {:.1f}%)", why, 100 * got,
                     o_.prune.criterion, o_.prune.scope == PruneScope::kGlobal ? "global" : "local",
                     100 * target));
  }

  // The gradient saliencies accumulated since the last pruning event.
  Saliency saliency_so_far() const {
    Saliency sal;
    if (needs_saliency()) saliency_->fill(sal);
    return sal;
  }

  // Structured: removes channels until `target` of each group's (or all) original channels are
  // gone, then rebuilds the executor and optimiser for the smaller model.
  void remove_channels_to(double target, const std::string& why) {
    const double now = s_channels_;
    if (target <= now + 1e-12) return;
    if (needs_saliency() && saliency_->batches() == 0) calibrate();
    write_back(model_);
    StructuredOptions so = o_.structured;
    so.amount = PruneAmount{std::clamp(1.0 - (1.0 - target) / (1.0 - now), 0.0, 1.0), false};
    Saliency sal = saliency_so_far();
    StructuredReport r = prune_structured(model_, so, needs_saliency() ? &sal : nullptr);
    s_channels_ = target;
    build();
    refresh_masks();
    reset_saliency();
    note(fmt::format(
        "{}: {} {} of {} channels left (target {:.1f}% removed; optimiser state restarts)", why,
        so.criterion, r.channels_after, r.channels_before, 100 * target));
  }

  // A gradient criterion before any training step: accumulate gradients over up to 32 batches.
  void calibrate() {
    data_.start_epoch(0);
    Batch b;
    for (int i = 0; i < 32 && data_.next(b); ++i) forward_backward(b, i);
  }

  static at::Tensor correct_of(const Objective::Targets& t) {
    c10::NoGradGuard no_grad;
    return Objective::correct_count(t);
  }

  void reset_saliency() {
    if (needs_saliency()) saliency_->clear();
  }

  void note(const std::string& s) {
    result_.notes.push_back(s);
    if (cb_.note && (!dist_ || dist_->is_main())) cb_.note(s);
  }

  double final_sparsity() const { return o_.prune.amount.value; }

  // Schedule points at the start of epoch e (and, for agp by steps, at global step g).
  void maybe_prune_epoch(int64_t e) {
    if (o_.schedule == PruneSchedule::kIterative && e % o_.epochs_per_round == 0) {
      int64_t r = e / o_.epochs_per_round + 1;
      // The same share of what is left every round; the final amount in the last round.
      double keep_total = (1 - final_sparsity()) / (1 - s_initial_);
      double target = 1 - (1 - s_initial_) * std::pow(keep_total, double(r) / double(o_.rounds));
      prune_to(target, fmt::format("round {}/{} (epoch {})", r, o_.rounds, e + 1));
    } else if (o_.schedule == PruneSchedule::kAgp && o_.every_steps == 0 && e >= o_.start_epoch &&
               e <= o_.end_epoch && (e - o_.start_epoch) % o_.every_epochs == 0) {
      double target = agp_sparsity(s_initial_, final_sparsity(), double(e), double(o_.start_epoch),
                                   double(o_.end_epoch));
      prune_to(target, fmt::format("agp epoch {}", e + 1));
    }
  }

  void maybe_prune_step(int64_t e, int64_t step) {
    if (o_.schedule != PruneSchedule::kAgp || o_.every_steps == 0) return;
    int64_t g = e * steps_per_epoch_ + step;
    int64_t g0 = o_.start_epoch * steps_per_epoch_, g1 = o_.end_epoch * steps_per_epoch_;
    if (g < g0 || g > g1 || (g - g0) % o_.every_steps != 0) return;
    prune_to(agp_sparsity(s_initial_, final_sparsity(), double(g), double(g0), double(g1)),
             fmt::format("agp step {}", g));
  }

  void run_epoch(int64_t e) {
    const int64_t skipped_before = scaler_.skipped;
    maybe_prune_epoch(e);
    auto t0 = std::chrono::steady_clock::now();
    data_.start_epoch(e);
    Batch b;
    // Per counted row: the loss, the task loss, the KL, the states' MSE (distillation's terms).
    double sums[4] = {0, 0, 0, 0};
    int64_t correct = 0, counted = 0, samples = 0, step = 0;
    double lr = o_.lr;
    // Steps whose loss and hits the host has not read yet. On a GPU they are read together (one
    // copy, one wait) every 64 steps or half a second, and at the end of the epoch; on the CPU
    // after each step. The loss is checked finite as it is read.
    struct Unread {
      at::Tensor terms, correct;
      int64_t count;
      double lr;
    };
    std::vector<Unread> unread;
    const bool batched = ex_->device().is_cuda();
    auto last_read = std::chrono::steady_clock::now();
    auto read = [&] {
      if (unread.empty()) return;
      std::vector<at::Tensor> ls, cs;
      for (const auto& u : unread) ls.push_back(u.terms), cs.push_back(u.correct);
      const at::Tensor lh = at::stack(ls).to(at::kCPU).contiguous();
      const at::Tensor ch = at::stack(cs).to(at::kCPU, at::kLong);
      const int64_t first = step - int64_t(unread.size());
      for (size_t i = 0; i < unread.size(); ++i) {
        const double* v = lh.data_ptr<double>() + 4 * i;
        LOPPER_CHECK(
            std::isfinite(v[0]), "[train] the loss is ", v[0], " (epoch ", e + 1, ", step ",
            first + int64_t(i) + 1,
            "): lower " LOPPER_OPTION("lr") " or clip gradients (" LOPPER_OPTION("grad_clip") ")");
        for (int k = 0; k < 4; ++k) sums[k] += v[k] * double(unread[i].count);
        correct += ch[int64_t(i)].item<int64_t>();
        counted += unread[i].count;
        if (cb_.step && (!dist_ || dist_->is_main())) {
          StepStats st;
          st.epoch = e + 1;
          st.step = first + int64_t(i) + 1;
          st.steps = steps_per_epoch_;
          st.loss = sums[0] / double(counted);
          st.task_loss = sums[1] / double(counted);
          st.distill_kl = sums[2] / double(counted);
          st.distill_state = sums[3] / double(counted);
          st.accuracy = double(correct) / double(counted);
          st.lr = unread[i].lr;
          cb_.step(st);
        }
      }
      unread.clear();
      last_read = std::chrono::steady_clock::now();
    };
    while (data_.next(b)) {
      maybe_prune_step(e, step);
      lr = lr_at(e, step);
      auto [terms, c, n, finite] = forward_backward(b, e * steps_per_epoch_ + step);
      if (finite) {
        clip_gradients();
        opt_->step(lr);
        apply_masks();
      }
      samples += b.size();
      unread.push_back({terms, c, n, lr});
      ++step;
      // NOTE: a non-finite loss is found when read, the steps after it (on a GPU) then thrown
      // away with the run: the error leaves nothing written.
      if (!batched || unread.size() >= 64 ||
          std::chrono::steady_clock::now() - last_read > std::chrono::milliseconds(500))
        read();
    }
    read();
    if (o_.schedule == PruneSchedule::kAgp && e + 1 == o_.epochs &&
        o_.end_epoch == o_.epochs)  // the ramp ends with training: reach s_f now
      prune_to(final_sparsity(), fmt::format("agp end (epoch {})", e + 1));
    EpochStats s;
    if (dist_ && dist_->world() > 1) {
      std::vector<at::Tensor> m = {at::tensor(
          {sums[0], sums[1], sums[2], sums[3], double(correct), double(counted), double(samples)},
          at::kDouble)};
      dist_->allreduce_sum(m);
      for (int k = 0; k < 4; ++k) sums[k] = m[0][k].item<double>();
      correct = int64_t(m[0][4].item<double>());
      counted = int64_t(m[0][5].item<double>());
      samples = int64_t(m[0][6].item<double>());
    }
    s.epoch = e + 1;
    s.loss = counted ? sums[0] / double(counted) : 0;
    s.task_loss = counted ? sums[1] / double(counted) : 0;
    s.distill_kl = counted ? sums[2] / double(counted) : 0;
    s.distill_state = counted ? sums[3] / double(counted) : 0;
    s.teacher_agreement = agreement_;
    s.distilled = teacher_.has_value();
    s.accuracy = counted ? double(correct) / double(counted) : 0;
    s.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    s.samples_per_s = s.seconds > 0 ? double(samples) / s.seconds : 0;
    s.lr = lr;
    s.sparsity = sparsity_now();
    s.skipped_steps = scaler_.skipped - skipped_before;
    s.loss_scale = precision_ == at::kHalf ? scaler_.scale : 0.0;
    result_.epochs.push_back(s);
    if (cb_.epoch && (!dist_ || dist_->is_main())) cb_.epoch(s);
    if (!o_.checkpoint_dir.empty()) checkpoint(e + 1);
  }

  // One checkpoint: DIR/epoch-N/ (model.onnx, state.json, one .npy per optimiser state tensor),
  // written under a hidden temporary name and renamed; then DIR/latest names it (replaced
  // atomically) and older epoch-* folders go. A crash at any point leaves the previous checkpoint
  // whole and `latest` naming it. Only what lopper made in its own folder is ever removed.
  void checkpoint(int64_t epochs_done) {
    if (dist_ && !dist_->is_main()) return;
    const fs::path dir(o_.checkpoint_dir);
    check_checkpoint_dir(o_.checkpoint_dir);  // again: it may have changed while training
    std::error_code ec;
    LOPPER_CHECK(fs::exists(dir / kCheckpointMarker, ec), "[train] the checkpoint folder '",
                 dir.string(), "' lost its ", kCheckpointMarker, " while training");
    const std::string name = fmt::format("epoch-{}", epochs_done);
    const fs::path tmp = temp_path_beside((dir / name).string());
    fs::create_directory(tmp, ec);
    LOPPER_CHECK(!ec, "[train] cannot write the checkpoint folder '", tmp.string(),
                 "': ", ec.message());
    struct Cleanup {
      fs::path p;
      ~Cleanup() {
        std::error_code e;
        if (!p.empty()) remove_tree(p.string(), e);
      }
    } cleanup{tmp};
    ir::Model snap = model_;
    write_back(snap);
    onnx::save_model(snap, (tmp / "model.onnx").string());
    nlohmann::json j;
    j["epochs_done"] = epochs_done;
    j["optimizer"] = optimizer_name(o_.optimizer);
    j["optimizer_steps"] = opt_->steps();
    if (precision_ == at::kHalf) j["loss_scale"] = scaler_.scale;
    j["params"] = nlohmann::json::array();
    auto& state = opt_->state();
    for (size_t i = 0; i < params_.size(); ++i) {
      nlohmann::json jp = {{"name", params_[i].name}, {"state", state[i].size()}};
      for (size_t k = 0; k < state[i].size(); ++k)
        save_npy(state[i][k].detach().cpu(), (tmp / fmt::format("state_{}_{}.npy", i, k)).string());
      j["params"].push_back(jp);
    }
    write_file_atomic((tmp / "state.json").string(), j.dump(2) + "\n");
    const fs::path final = dir / name;
    remove_tree(final.string(), ec);  // an earlier run's epoch of the same number, lopper's own
    fs::rename(tmp, final, ec);
    LOPPER_CHECK(!ec, "[train] cannot write the checkpoint '", final.string(), "': ", ec.message());
    cleanup.p.clear();
    write_file_atomic((dir / "latest").string(), name + "\n");
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      const std::string f = e.path().filename().string();
      const bool ours =
          Pattern(R"(epoch-\d+|\.epoch-\d+\.tmp[0-9a-f]+)", "checkpoint").full_match(f);
      if (ours && f != name && e.is_directory()) remove_tree(e.path().string(), ec);
    }
    note(fmt::format("checkpoint {} (epoch {})", final.string(), epochs_done));
  }

  void resume() {
    const fs::path dir(checkpoint_to_resume(o_.resume));
    LOPPER_CHECK(fs::exists(dir / "state.json") && fs::exists(dir / "model.onnx"),
                 "[train] " LOPPER_OPTION("resume") " '", dir.string(),
                 "' is not a checkpoint folder (model.onnx and state.json)");
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(read_file((dir / "state.json").string()));
    } catch (const nlohmann::json::exception& e) {
      throw Error("[train] checkpoint '" + dir.string() + "': state.json: " + e.what());
    }
    LOPPER_CHECK(j.value("optimizer", "") == optimizer_name(o_.optimizer), "[train] checkpoint '",
                 dir.string(), "' was written with " LOPPER_OPTION("optimizer") " ",
                 j.value("optimizer", "?"), ", not ", optimizer_name(o_.optimizer));
    ir::Model ck = onnx::load_model((dir / "model.onnx").string());
    {
      c10::NoGradGuard no_grad;
      for (const auto& [name, t] : ex_->parameters()) {
        const ir::Initializer* init = ck.graph.find_initializer(name);
        LOPPER_CHECK(init && init->value.sizes() == t.sizes(), "[train] checkpoint '", dir.string(),
                     "' does not match the model: initializer '", name, "'");
        t.detach().copy_(init->value.to(t.device()));
      }
    }
    const auto& jp = j.at("params");
    LOPPER_CHECK(jp.size() == params_.size(), "[train] checkpoint '", dir.string(),
                 "' has state for ", jp.size(), " parameters, the model trains ", params_.size());
    auto& state = opt_->state();
    for (size_t i = 0; i < params_.size(); ++i) {
      LOPPER_CHECK(jp[i].at("name").get<std::string>() == params_[i].name, "[train] checkpoint '",
                   dir.string(), "': parameter ", i, " is '", jp[i].at("name").get<std::string>(),
                   "', the model's is '", params_[i].name, "'");
      state[i].clear();
      for (size_t k = 0; k < jp[i].at("state").get<size_t>(); ++k)
        state[i].push_back(
            load_npy((dir / fmt::format("state_{}_{}.npy", i, k)).string()).to(ex_->device()));
    }
    opt_->steps() = j.at("optimizer_steps").get<int64_t>();
    if (j.contains("loss_scale") && j["loss_scale"].is_number())
      scaler_.scale = j["loss_scale"].get<double>();
    first_epoch_ = j.at("epochs_done").get<int64_t>();
    LOPPER_CHECK(first_epoch_ <= o_.epochs, "[train] checkpoint '", dir.string(),
                 "' is past epoch ", first_epoch_, " of " LOPPER_OPTION("epochs") " ", o_.epochs);
    refresh_masks();
    note(fmt::format("resumed from {} after epoch {}", dir.string(), first_epoch_));
  }

  ir::Model& model_;
  DataLoader& data_;
  const TrainOptions& o_;
  const TrainCallbacks& cb_;
  Distributed* dist_;
  struct GroupLassoSlice {
    size_t param;
    int64_t axis, group;
    at::Tensor channel;  // per index along axis: its channel in the group
    at::Tensor index;    // the positions along axis that `channel` covers (undefined: all)
  };
  std::vector<GroupLassoSlice> gl_;
  std::vector<int64_t> gl_sizes_;
  double s_channels_ = 0;  // structured schedules: share of the channels removed so far
  std::unique_ptr<Executor> ex_;
  std::unique_ptr<optim::Optimizer> opt_;
  ModelIO io_;
  std::optional<Objective> objective_;  // made with the first executor; kept across rebuilds
  std::optional<CheckpointLock> lock_;  // the checkpoint folder, held while the run lasts
  // Distillation: the teacher (with the compared states as extra outputs) and its executor.
  struct Teacher {
    std::shared_ptr<const ir::Model> model;
    std::unique_ptr<Executor> ex;
    ModelIO io;
  };
  std::optional<Teacher> teacher_;
  std::unordered_map<std::string, at::Tensor> student_states_;  // this step's, by name
  bool agreement_ = false;  // the accuracy is the agreement with the teacher (no labels)
  std::vector<Param> params_;
  TrainResult result_;
  int64_t steps_per_epoch_ = 0, first_epoch_ = 0;
  // Gradient statistics since the last pruning event, when the schedule's criterion needs them.
  std::optional<importance::GradientStats> saliency_;
  double s_initial_ = 0;
  at::ScalarType precision_ = at::kFloat;
  amp::LossScaler scaler_;
};

}  // namespace

TrainResult train(ir::Model& model, DataLoader& data, const TrainOptions& opts,
                  const TrainCallbacks& cb, Distributed* dist) {
  return Trainer(model, data, opts, cb, dist).run();
}

EvalResult evaluate(const ir::Model& model, DataLoader& data, const EvalOptions& o) {
  ExecOptions eo;
  eo.device = o.device;
  eo.precision = o.precision;
  Executor ex(model, eo);
  const ModelIO io = model_io(model);
  Objective objective(o.loss, io);
  EvalResult r;
  std::vector<int64_t> hit;
  double loss_sum = 0, top1 = 0, top5 = 0;
  int64_t counted = 0;
  data.start_epoch(0);
  Batch b;
  int64_t batch = 0, of = data.batches_per_epoch();
  if (o.max_batches > 0) of = std::min(of, o.max_batches);
  while (batch < of && data.next(b)) {
    // NOTE: the same tokens are masked on every run (masked-lm): the pick is a function of the
    // batch's index and the seed.
    objective.prepare(b, batch);
    at::Tensor out = ex.run(feeds(io, b, ex.device())).at(0).to(at::kCPU);
    const Objective::Targets t = objective.targets(out, b);
    const at::Tensor& y = t.labels;
    const int64_t n = y.size(0);
    loss_sum += objective.loss(t).item<double>() * double(n);
    int64_t k = std::min<int64_t>(5, t.logits.size(1));
    at::Tensor best = std::get<1>(t.logits.topk(k, 1));
    at::Tensor first = best.select(1, 0).eq(y);
    top1 += double(first.sum().item<int64_t>());
    top5 += double(best.eq(y.unsqueeze(1)).any(1).sum().item<int64_t>());
    // Per class: for classifiers (not over a language model's vocabulary).
    if (!is_language_model(objective.kind())) {
      const int64_t classes = std::max(data.dataset().num_classes(), t.logits.size(1));
      if (int64_t(hit.size()) < classes) {
        hit.resize(classes, 0);
        r.per_class_count.resize(classes, 0);
      }
      auto yc = y.accessor<int64_t, 1>();
      auto fc = first.accessor<bool, 1>();
      for (int64_t i = 0; i < n; ++i) {
        ++r.per_class_count[yc[i]];
        hit[yc[i]] += fc[i];
      }
    }
    counted += n;
    r.samples += b.size();
    ++batch;
    if (o.progress) o.progress(batch, of);
  }
  LOPPER_CHECK(counted > 0, "[eval] ", data.dataset().name(), " gave no sample");
  r.loss_kind = loss_name(objective.kind());
  r.top1 = top1 / double(counted);
  r.top5 = top5 / double(counted);
  r.loss = loss_sum / double(counted);
  if (is_language_model(objective.kind())) {
    r.tokens = counted;
    r.perplexity = std::exp(r.loss);
  }
  for (size_t c = 0; c < hit.size(); ++c)
    r.per_class.push_back(r.per_class_count[c] ? double(hit[c]) / double(r.per_class_count[c])
                                               : std::nan(""));
  return r;
}

namespace {

// The spellings of a training option's values, in the order its enum declares them.
template <typename E, size_t N>
struct Spellings {
  const char* names[N];
  E parse(const std::string& s, const char* what, const char* list) const {
    for (size_t i = 0; i < N; ++i)
      if (s == names[i]) return E(i);
    throw Error(std::string("[train] unknown ") + what + " '" + s + "' (" + list + ")");
  }
  const char* name(E e) const { return size_t(e) < N ? names[size_t(e)] : "?"; }
};
constexpr Spellings<Optimizer, 3> kOptimizers{{"sgd", "adam", "adamw"}};
constexpr Spellings<LrSchedule, 3> kLrSchedules{{"constant", "step", "cosine"}};

}  // namespace

Optimizer parse_optimizer(const std::string& s) {
  return kOptimizers.parse(s, "optimizer", "optimizers: sgd, adam, adamw");
}
const char* optimizer_name(Optimizer o) { return kOptimizers.name(o); }

LrSchedule parse_lr_schedule(const std::string& s) {
  return kLrSchedules.parse(s, LOPPER_OPTION("lr_schedule"), "schedules: constant, step, cosine");
}
const char* lr_schedule_name(LrSchedule s) { return kLrSchedules.name(s); }

void check_train_options(const TrainOptions& o) {
  check_loss_options(o.loss);
  check_distill_options(o.distill);
  LOPPER_CHECK(
      o.precision == at::kFloat || o.precision == at::kBFloat16 || o.precision == at::kHalf,
      "[precision] the executor runs fp32, bf16 or fp16, not ", at::toString(o.precision));
  LOPPER_CHECK(o.precision != at::kHalf || o.device.rfind("cuda", 0) == 0,
                      "[train] " LOPPER_OPTION("precision") " fp16 needs a CUDA device (on the CPU "
                      "use bf16)");
  LOPPER_CHECK(o.epochs > 0, "[train] " LOPPER_OPTION("epochs") " must be > 0, got ", o.epochs);
  LOPPER_CHECK(o.lr > 0 && std::isfinite(o.lr), "[train] " LOPPER_OPTION("lr") " must be > 0, got ",
               o.lr);
  LOPPER_CHECK(o.warmup_epochs >= 0 && o.warmup_epochs <= double(o.epochs),
               "[train] " LOPPER_OPTION("warmup_epochs") " must be in [0, epochs], got ",
               o.warmup_epochs);
  LOPPER_CHECK(o.grad_clip >= 0, "[train] " LOPPER_OPTION("grad_clip") " must be >= 0, got ",
               o.grad_clip);
  LOPPER_CHECK(o.l1 >= 0 && o.bn_l1 >= 0 && o.group_lasso >= 0,
               "[train] regulariser strengths must be >= 0");
  LOPPER_CHECK(o.lr_gamma > 0, "[train] " LOPPER_OPTION("lr_gamma") " must be > 0, got ",
               o.lr_gamma);
  LOPPER_CHECK(!o.structured_schedule || o.schedule != PruneSchedule::kNone,
               "[train] " LOPPER_OPTION("structured_schedule") " needs " LOPPER_OPTION(
                   "schedule") " iterative|agp");
  LOPPER_CHECK(!o.structured_schedule || o.resume.empty(),
                      "[train] " LOPPER_OPTION("resume") " does not follow a model that shrinks "
                      "(" LOPPER_OPTION("structured_schedule") "): resume from the checkpoint's "
                      "model.onnx with the rest of the schedule instead");
  if (o.schedule == PruneSchedule::kNone) return;
  if (o.structured_schedule) {  // it has the training batches' gradients, no calibration pass
    auto schedules = [](const importance::Criterion& c) {
      return c.needs != importance::Needs::kActivations;
    };
    LOPPER_CHECK(schedules(importance::find(o.structured.criterion, importance::Use::kChannels)),
                 "[train] a pruning schedule ranks channels by ",
                 importance::names(importance::Use::kChannels, schedules, " or "), ", not ",
                 o.structured.criterion, " (lopper prune --structured ranks by it)");
  }
  check_layer_options(o.prune);
  auto ramps = [](const importance::Criterion& c) {
    return c.weights != importance::WeightRank::kThreshold;
  };
  LOPPER_CHECK(
      o.structured_schedule ||
          ramps(importance::find(o.prune.criterion, importance::Use::kWeights)),
      "[train] a pruning schedule ramps an amount: use " LOPPER_OPTION("prune.criterion") " ",
      importance::names(importance::Use::kWeights, ramps, " or "));
  LOPPER_CHECK(!o.prune.amount.is_count, "[train] " LOPPER_OPTION(
                                                    "prune.amount") " is the final sparsity, a "
                                                                    "fraction in [0, 1)");
  LOPPER_CHECK(o.prune.amount.value < 1,
               "[train] " LOPPER_OPTION("prune.amount") " must be < 1, got ", o.prune.amount.value);
  if (o.schedule == PruneSchedule::kIterative) {
    LOPPER_CHECK(o.rounds > 0 && o.epochs_per_round > 0,
                 "[train] " LOPPER_OPTION("schedule") " iterative needs " LOPPER_OPTION(
                     "rounds") " R and " LOPPER_OPTION("epochs_per_round") " E > 0");
    LOPPER_CHECK(o.epochs == o.rounds * o.epochs_per_round,
                        "[train] " LOPPER_OPTION("schedule") " iterative trains rounds x "
                        "epochs-per-round = ",
                        o.rounds * o.epochs_per_round, " epochs, but " LOPPER_OPTION("epochs") " is ",
                        o.epochs);
  } else {
    LOPPER_CHECK(
        o.start_epoch >= 0 && o.end_epoch > o.start_epoch && o.end_epoch <= o.epochs,
        "[train] " LOPPER_OPTION("schedule") " agp needs 0 <= " LOPPER_OPTION(
            "start_epoch") " < " LOPPER_OPTION("end_epoch") " <= " LOPPER_OPTION("epochs") ", got ",
        o.start_epoch, ", ", o.end_epoch, " of ", o.epochs);
    LOPPER_CHECK(o.every_epochs > 0 || o.every_steps > 0,
                 "[train] " LOPPER_OPTION("every_epochs") " must be > 0");
  }
}

void check_checkpoint_dir(const std::string& dir) {
  std::error_code ec;
  const fs::path p(dir);
  const auto st = fs::symlink_status(p, ec);
  if (!fs::exists(st)) {
    const fs::path parent = p.parent_path().empty() ? fs::path(".") : p.parent_path();
    if (!fs::is_directory(parent, ec))
      throw UsageError("[train] " LOPPER_OPTION("checkpoint_dir") " " + dir + ": no folder " +
                       parent.string());
    return;
  }
  if (!fs::is_directory(st))
    throw UsageError("[train] " LOPPER_OPTION("checkpoint_dir") " " + dir +
                     " exists and is not a folder; give a new folder for the checkpoints");
  if (fs::exists(p / kCheckpointMarker, ec) || fs::is_empty(p, ec)) return;
  throw UsageError("[train] " LOPPER_OPTION("checkpoint_dir") " " + dir +
                   " is a folder lopper did not make (no " + kCheckpointMarker +
                   "); give a new or empty folder: lopper never replaces what it did not "
                   "write");
}

std::string checkpoint_to_resume(const std::string& dir) {
  const fs::path p(dir);
  std::error_code ec;
  if (!fs::exists(p / "latest", ec)) return dir;  // a checkpoint itself (epoch-N, or older layout)
  std::string name = read_file((p / "latest").string());
  while (!name.empty() && (name.back() == '\n' || name.back() == '\r')) name.pop_back();
  LOPPER_CHECK(Pattern(R"(epoch-\d+)", "resume").full_match(name),
               "[train] " LOPPER_OPTION("resume") " '", dir, "': 'latest' names '", name,
               "', not a checkpoint of this folder");
  return (p / name).string();
}

}  // namespace lopper
