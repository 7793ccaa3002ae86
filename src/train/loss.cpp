// Feeding a model batches (model_io, feeds) and the losses of lopper/loss.h (Objective).
#include "train/loss.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>

#include "lopper/error.h"
#include "lopper/executor.h"
#include "lopper/onnx_io.h"
#include "util/random.h"

namespace lopper {
namespace {

struct LossName {
  Loss loss;
  const char* name;
};
constexpr LossName kLosses[] = {{Loss::kAuto, "auto"},
                                {Loss::kCrossEntropy, "cross-entropy"},
                                {Loss::kMse, "mse"},
                                {Loss::kCausalLm, "causal-lm"},
                                {Loss::kMaskedLm, "masked-lm"},
                                {Loss::kTokenClassification, "token-classification"}};

const ModelIO::Input* find_input(const ModelIO& io, const std::string& name) {
  for (const auto& in : io.inputs)
    if (in.name == name) return &in;
  return nullptr;
}

const at::Tensor* find_named(const NamedInputs& v, const std::string& name) {
  for (const auto& [n, t] : v)
    if (n == name) return &t;
  return nullptr;
}

// The attention mask of a batch ([B, T], 1 = a token), when it has one.
at::Tensor attention_mask(const Batch& b) {
  const at::Tensor* m = find_named(b.inputs, "attention_mask");
  return m ? *m : at::Tensor();
}

// A host tensor onto `device`. To a GPU the copy goes through pinned memory without blocking the
// host: a copy from pageable memory waits for the stream to drain, so the host could not queue the
// next step's work while the GPU runs this one.
at::Tensor to_device(const at::Tensor& t, const at::Device& device) {
  if (!device.is_cuda() || t.device() == device) return t.to(device);
  return t.contiguous().pin_memory().to(device, /*non_blocking=*/true);
}

// splitmix64 of (seed, step): the masked-LM pick of one batch.
uint64_t step_seed(uint64_t seed, int64_t step) {
  return splitmix64(seed * 0x9E3779B97F4A7C15ULL + uint64_t(step) + 0x632BE59BD9B4E019ULL);
}

}  // namespace

Loss parse_loss(const std::string& s) {
  for (const auto& l : kLosses)
    if (s == l.name) return l.loss;
  throw Error("[loss] unknown loss '" + s +
              "' (losses: auto, cross-entropy, mse, causal-lm, masked-lm, token-classification)");
}

const char* loss_name(Loss l) {
  for (const auto& n : kLosses)
    if (n.loss == l) return n.name;
  return "?";
}

void check_loss_options(const LossOptions& o) {
  LOPPER_CHECK(o.loss != Loss::kMaskedLm || o.mask_token >= 0,
               "[loss] masked-lm needs the mask token's ID (" LOPPER_OPTION("mask_token") ")");
  LOPPER_CHECK(o.mask_prob > 0 && o.mask_prob <= 1,
               "[loss] " LOPPER_OPTION("mask_prob") " must be in (0, 1], got ", o.mask_prob);
}

std::string input_names(const ModelIO& io) {
  std::string s;
  for (const auto& in : io.inputs) s += (s.empty() ? "" : ", ") + in.name;
  return s;
}

ModelIO model_io(const ir::Model& model) {
  const std::vector<const ir::ValueInfo*> inputs = model.graph.real_inputs();
  LOPPER_CHECK(!inputs.empty(), "[data] the model has no input to feed data to");
  ModelIO io;
  for (const ir::ValueInfo* v : inputs) {
    ModelIO::Input in;
    in.name = v->name;
    for (const auto& d : v->type.dims) in.dims.push_back(d.is_static() ? d.value : -1);
    if (in.dims.empty()) in.dims.push_back(-1);
    if (v->type.elem_type != ir::DType::kUndefined)
      in.dtype = onnx::to_scalar_type(v->type.elem_type);
    io.inputs.push_back(std::move(in));
  }
  const ir::ValueInfo& out = model.graph.outputs.at(0);
  for (const auto& d : out.type.dims) io.out_dims.push_back(d.is_static() ? d.value : -1);
  for (const auto& n : model.graph.nodes)
    for (const auto& o : n.outputs)
      if (o == out.name) io.out_op = n.op_type;
  return io;
}

NamedInputs feeds(const ModelIO& io, const Batch& b, const at::Device& device) {
  LOPPER_CHECK(b.x.defined() && b.x.dim() >= 1, "[data] the batch has no samples");
  // Where the samples go.
  const ModelIO::Input* main = nullptr;
  if (!b.x_input.empty()) {
    main = find_input(io, b.x_input);
    LOPPER_CHECK(main, "[data] the data goes to input '", b.x_input,
                 "', which the model does not have (its inputs: ", input_names(io), ")");
  } else if (!b.x.is_floating_point() && find_input(io, "input_ids") &&
             !find_named(b.inputs, "input_ids")) {
    main = find_input(io, "input_ids");
  } else {
    for (const auto& in : io.inputs)
      if (!find_named(b.inputs, in.name)) {
        main = &in;
        break;
      }
    LOPPER_CHECK(main, "[data] every input of the model is given by name; the samples have none");
  }
  for (const auto& [name, t] : b.inputs)
    LOPPER_CHECK(find_input(io, name) || name == "attention_mask", "[data] the data gives input '",
                 name, "', which the model does not take (its inputs: ", input_names(io), ")");
  const int64_t batch = b.x.size(0);
  NamedInputs out;
  for (const auto& in : io.inputs) {
    at::Tensor t;
    if (&in == main) {
      t = fit_to_input(b.x, in.dims, in.name);
    } else if (const at::Tensor* given = find_named(b.inputs, in.name)) {
      t = fit_to_input(*given, in.dims, in.name);
    } else {
      // Derived from the token IDs [B, T].
      const bool derivable =
          in.name == "attention_mask" || in.name == "token_type_ids" || in.name == "position_ids";
      LOPPER_CHECK(derivable, "[data] the model's input '", in.name,
                   "' has no data: give it by name in the data spec (npy:", in.name,
                   "=F.npy,... or tokens:IDS.npy,", in.name, "=F.npy)");
      LOPPER_CHECK(b.x.dim() == 2, "[data] the model's input '", in.name,
                   "' is made from token IDs [B, T], but the samples are ", b.x.sizes(),
                   ": give it by name in the data spec");
      const int64_t tokens = b.x.size(1);
      if (in.name == "attention_mask")
        t = at::ones({batch, tokens}, at::kLong);
      else if (in.name == "token_type_ids")
        t = at::zeros({batch, tokens}, at::kLong);
      else
        t = at::arange(tokens, at::kLong).unsqueeze(0).expand({batch, tokens});
      t = fit_to_input(t, in.dims, in.name);
    }
    if (t.scalar_type() != in.dtype) t = t.to(in.dtype);
    out.emplace_back(in.name, to_device(t, device));
  }
  return out;
}

Objective::Objective(const LossOptions& o, const ModelIO& io)
    : o_(o), kind_(o.loss), out_op_(io.out_op) {
  check_loss_options(o);
  if (!io.out_dims.empty() && io.out_dims.back() > 0) vocab_ = io.out_dims.back();
}

void Objective::prepare(Batch& b, int64_t step) const {
  if (kind_ != Loss::kMaskedLm) return;
  LOPPER_CHECK(b.x.dim() == 2 && !b.x.is_floating_point(),
               "[loss] masked-lm needs token IDs [B, T] (tokens:IDS.npy), got samples of ",
               b.x.scalar_type(), " ", b.x.sizes());
  at::Generator gen = at::detail::createCPUGenerator(step_seed(o_.seed, step));
  at::Tensor ids = b.x.to(at::kLong);
  at::Tensor live = attention_mask(b);
  live = live.defined() ? live.ne(0) : at::ones_like(ids, at::kBool);
  at::Tensor picked = at::rand(ids.sizes(), gen).lt(o_.mask_prob).logical_and(live);
  if (!picked.any().item<bool>()) {
    // NOTE: a batch with no pick would have no loss; take its first live token.
    at::Tensor first = live.flatten().nonzero();
    LOPPER_CHECK(first.numel() > 0, "[loss] masked-lm: the batch has no token (all masked out)");
    picked.view(-1)[first[0][0].item<int64_t>()] = true;
  }
  const int64_t vocab = vocab_ > 0 ? vocab_ : ids.max().item<int64_t>() + 1;
  at::Tensor r = at::rand(ids.sizes(), gen);
  at::Tensor random_ids = at::randint(vocab, ids.sizes(), gen, at::kLong);
  at::Tensor masked = ids.clone();
  masked = at::where(picked.logical_and(r.lt(0.8)), at::full_like(ids, o_.mask_token), masked);
  masked = at::where(picked.logical_and(r.ge(0.8)).logical_and(r.lt(0.9)), random_ids, masked);
  b.y = at::where(picked, ids, at::full_like(ids, -100));
  b.x = masked;
}

Objective::Targets Objective::targets(const at::Tensor& out_any, const Batch& b) {
  const at::Tensor out = out_any.is_floating_point() ? out_any.to(at::kFloat) : out_any;
  const int64_t batch = b.x.size(0);
  LOPPER_CHECK(out.dim() >= 1 && out.size(0) == batch, "[loss] the model's output ", out.sizes(),
               " does not have one row per sample (", batch, " samples)");
  if (kind_ == Loss::kAuto) {
    if (!b.y.defined()) {
      LOPPER_CHECK(out.dim() == 3, "[loss] the data has no labels, and the model's output ",
                   out.sizes(),
                   " is not a language model's logits [B, T, V]: give labels, or tokens for a "
                   "language model");
      kind_ = Loss::kCausalLm;
    } else if (b.y.dim() == 1) {
      kind_ = Loss::kCrossEntropy;
    } else {
      LOPPER_CHECK(out.dim() == 3, "[loss] the labels are per token ", b.y.sizes(),
                   ", but the model's output ", out.sizes(), " is not per token [B, T, C]");
      kind_ = Loss::kTokenClassification;
    }
  }
  Targets t;
  if (kind_ == Loss::kCrossEntropy || kind_ == Loss::kMse) {
    LOPPER_CHECK(b.y.defined() && b.y.dim() == 1, "[loss] ", loss_name(kind_),
                 " needs one label per sample [B], the data has ",
                 b.y.defined() ? "labels " + detail::concat(b.y.sizes()) : std::string("none"));
    t.logits = out.reshape({batch, -1});
    t.labels = b.y;
  } else {
    LOPPER_CHECK(out.dim() == 3, "[loss] ", loss_name(kind_),
                 " needs per-token logits [B, T, V], the model's output is ", out.sizes());
    const int64_t tokens = out.size(1);
    at::Tensor labels;
    if (kind_ == Loss::kCausalLm) {
      labels = b.y.defined() && b.y.dim() == 2 ? b.y : b.x;
      LOPPER_CHECK(labels.dim() == 2 && !labels.is_floating_point() && labels.size(1) == tokens,
                   "[loss] causal-lm needs token IDs [B, ", tokens, "], the data has ",
                   labels.scalar_type(), " ", labels.sizes());
      labels = labels.to(at::kLong);
      if (at::Tensor m = attention_mask(b); m.defined())
        labels = at::where(m.ne(0), labels, at::full_like(labels, -100));
      // Position t predicts token t + 1.
      labels = labels.slice(1, 1);
      t.logits = out.slice(1, 0, tokens - 1).reshape({-1, out.size(2)});
    } else {
      LOPPER_CHECK(b.y.defined() && b.y.dim() == 2 && b.y.size(1) == tokens, "[loss] ",
                   loss_name(kind_), " needs labels per token [B, ", tokens, "], the data has ",
                   b.y.defined() ? detail::concat(b.y.sizes()) : std::string("none"));
      labels = b.y;
      if (at::Tensor m = attention_mask(b); m.defined() && kind_ == Loss::kTokenClassification)
        labels = at::where(m.ne(0), labels, at::full_like(labels, -100));
      t.logits = out.reshape({-1, out.size(2)});
    }
    // NOTE: which tokens count is found where the labels are (the host, for batches from a
    // loader): nonzero() on a GPU would wait for it.
    labels = labels.reshape({-1});
    at::Tensor keep = labels.ne(-100).nonzero().squeeze(1);
    t.logits = t.logits.index_select(0, to_device(keep, out.device()));
    t.labels = labels.index_select(0, keep);
    LOPPER_CHECK(t.labels.numel() > 0, "[loss] ", loss_name(kind_),
                 ": the batch has no token to predict (every label is -100 or masked out)");
  }
  const int64_t classes = t.logits.size(1);
  const int64_t max_label = t.labels.numel() ? t.labels.max().item<int64_t>() : 0;
  LOPPER_CHECK(max_label < classes, "[loss] the model has ", classes, " outputs per ",
               kind_ == Loss::kCrossEntropy || kind_ == Loss::kMse ? "sample" : "token",
               ", but the data has label ", max_label);
  // The labels checked where they are, then onto the logits' device.
  t.labels = to_device(t.labels, out.device());
  return t;
}

at::Tensor Objective::loss(const Targets& t) const {
  if (kind_ == Loss::kMse)
    return at::mse_loss(t.logits, at::one_hot(t.labels, t.logits.size(1)).to(at::kFloat));
  // NOTE: a model exported with its softmax gives probabilities; cross-entropy needs their log.
  if (out_op_ == "Softmax") return at::nll_loss(at::log(t.logits.clamp_min(1e-12)), t.labels);
  if (out_op_ == "LogSoftmax") return at::nll_loss(t.logits, t.labels);
  return at::cross_entropy_loss(t.logits, t.labels);
}

at::Tensor Objective::correct_count(const Targets& t) {
  return t.logits.argmax(1).eq(t.labels).sum();
}

int64_t Objective::correct(const Targets& t) { return correct_count(t).item<int64_t>(); }

}  // namespace lopper
