// Normalisation ops: BatchNormalization, InstanceNormalization, LayerNormalization,
// GroupNormalization, LpNormalization, MeanVarianceNormalization, RMSNormalization, LRN.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/GradMode.h>

#include <cmath>
#include <numeric>

#include "exec/onednn.h"
#include "exec/sparse_linear.h"
#include "kernels/cpu/conv.h"
#include "kernels/cpu/rows.h"
#include "ops/channels.h"
#include "ops/op.h"

namespace lopper::ops {

namespace {

// Shape [1, C, 1, ...] for a per-channel vector against an input of `rank` dims.
std::vector<int64_t> channel_shape(int64_t rank, int64_t c) {
  std::vector<int64_t> s(static_cast<size_t>(std::max<int64_t>(rank, 2)), 1);
  s[1] = c;
  return s;
}

// Compute type for statistics: at least float32 (stash_type 1), the input's own otherwise.
at::ScalarType stash_type_of(const OpContext& c, const at::Tensor& x) {
  int64_t stash = c.attr_int("stash_type", 1);
  c.check(x.is_floating_point(), "input must be a floating-point tensor");
  if (stash == 1) return at::promote_types(x.scalar_type(), at::kFloat);
  if (stash == 0 || stash == 16 || stash == 10 || stash == 11) {
    // 0: not given in old opsets; otherwise an explicit float type.
    return stash == 0 ? x.scalar_type()
                      : at::promote_types(x.scalar_type(), scalar_type_of(c, stash));
  }
  c.fail("unsupported stash_type ", stash);
}

void check_vec(const OpContext& c, const at::Tensor& t, int64_t n, const char* what) {
  c.check(t.numel() == n, what, " must have ", n, " elements, got ", t.numel());
}

// Inference BatchNormalization's per-channel scale and shift, computed once.
struct BatchNormState {
  std::vector<float> scale, shift;
};

// (x - mean) / sqrt(var + eps) * scale + bias per channel (dim 1), in x's type.
at::Tensor normalize(const at::Tensor& x, const at::Tensor& mean, const at::Tensor& var,
                     const at::Tensor& scale, const at::Tensor& bias, double eps) {
  const at::ScalarType ct = x.scalar_type();
  const auto shape = channel_shape(x.dim(), x.size(1));
  const at::Tensor inv = at::rsqrt(var.to(ct).reshape(shape) + eps);
  return (x - mean.to(ct).reshape(shape)) * inv * scale.to(ct).reshape(shape) +
         bias.to(ct).reshape(shape);
}

// NOTE: inference on the CPU with constant float32 parameters (inputs `first`..`first` + 3:
// scale, B, mean, var) of float32 channels-last [n, c_i, h, w] tensors, normalised as one
// channel concatenation (DenseNet normalises every concatenation before its ReLU and
// convolution): the scale and shift folded once, then one pass from each input into its slice of
// the output with the activation fused, instead of a concatenation, four elementwise ATen passes
// and a fifth for the ReLU. Undefined where this does not apply.
at::Tensor batch_norm_nhwc(OpContext& c, const std::vector<at::Tensor>& xs, size_t first,
                           double eps, const onednn::PostOp& post) {
  // NOTE: bfloat16 inputs (--precision bf16) too: computed in float32, the scale and shift folded
  // from the parameters widened, the output rounded once.
  if (xs.empty() || !c.prepack()) return {};
  const at::ScalarType type = xs[0].scalar_type();
  if (!(type == at::kFloat || type == at::kBFloat16) ||
      !kernels::cpu::channels_last_of_one_map(xs, type))
    return {};
  // The bf16 kernel fuses a ReLU only; another activation runs after it (finish_activation).
  kernels::cpu::Activation act = fused_activation(post);
  if (type == at::kBFloat16 && act.kind != kernels::cpu::Activation::kRelu) act = {};
  int64_t ch = 0;
  for (const auto& x : xs) ch += x.size(1);
  for (size_t i = first; i < first + 4; ++i) {
    if (!c.is_constant(i)) return {};
    const at::Tensor& p = c.input(i);
    if (p.scalar_type() != type || p.numel() != ch) return {};
  }
  auto& st = c.state<BatchNormState>();
  if (st.scale.empty()) {
    auto param = [&](size_t i) { return c.input(first + i).to(at::kFloat); };
    const at::Tensor a = (param(0) * at::rsqrt(param(3) + eps)).contiguous();
    const at::Tensor b = (param(1) - param(2) * a).contiguous();
    st.scale.assign(a.data_ptr<float>(), a.data_ptr<float>() + ch);
    st.shift.assign(b.data_ptr<float>(), b.data_ptr<float>() + ch);
  }
  at::Tensor y = kernels::cpu::concat_affine_nhwc(xs, st.scale.data(), st.shift.data(), act);
  return finish_activation(y, post, act);
}

// FusedConcatNorm(scale, B, mean, var, x1, ..., xn) = activation(BatchNormalization(Concat(x1,
// ..., xn, axis 1))) at inference: made by the executor's fusion pass where a normalisation is a
// channel concatenation's only reader.
void fused_concat_norm(OpContext& c) {
  c.check(c.num_inputs() >= 5, "needs scale, B, mean, var and at least one input");
  std::vector<at::Tensor> xs;
  for (size_t i = 4; i < c.num_inputs(); ++i) xs.push_back(c.input(i));
  const double eps = c.attr_float("epsilon", 1e-5f);
  const onednn::PostOp post = onednn::post_op_of(c);
  if (at::Tensor y = batch_norm_nhwc(c, xs, 0, eps, post); y.defined()) return c.set_output(0, y);
  const at::Tensor x = at::cat(xs, 1);
  c.check(x.is_floating_point(), "input must be a floating-point tensor");
  for (size_t i = 0; i < 4; ++i)
    check_vec(c, c.input(i), x.size(1), i == 0 ? "scale" : i == 1 ? "B" : i == 2 ? "mean" : "var");
  c.set_output(0, onednn::apply_unfused(
                      normalize(x, c.input(2), c.input(3), c.input(0), c.input(1), eps), post));
}

// BatchNormalization, and FusedBatchNormalization = activation(BatchNormalization(...)) (made by
// the executor's fusion pass where an activation is the normalisation's only reader).
void batch_norm(OpContext& c) {
  const at::Tensor& x = c.input(0);
  const onednn::PostOp post = onednn::post_op_of(c);
  auto set_y = [&](const at::Tensor& y) { c.set_output(0, onednn::apply_unfused(y, post)); };
  c.check(x.dim() >= 2, "input must have rank >= 2, got ", x.dim());
  c.check(x.is_floating_point(), "input must be a floating-point tensor");
  int64_t ch = x.size(1);
  double eps = c.attr_float("epsilon", 1e-5f);
  double momentum = c.attr_float("momentum", 0.9f);
  bool training = c.training();
  if (c.opset() >= 14) training = training || c.attr_int("training_mode", 0) != 0;
  // Opsets < 14 list the running statistics as outputs of training-mode graphs.
  if (c.opset() < 14)
    for (size_t i = 1; i < c.num_outputs(); ++i) training = training || c.wants_output(i);
  at::ScalarType ct = at::promote_types(x.scalar_type(), c.input(1).scalar_type());
  at::Tensor scale = c.input(1), bias = c.input(2), mean = c.input(3), var = c.input(4);
  check_vec(c, scale, ch, "scale");
  check_vec(c, bias, ch, "B");
  check_vec(c, mean, ch, "mean");
  check_vec(c, var, ch, "var");
  // Training through lopper (not a training-mode graph that outputs the statistics): ATen's own
  // batch norm (cuDNN's on a GPU: one kernel each way instead of a dozen elementwise ones), which
  // updates the running statistics in place as nn.BatchNorm does, so that they are written back to
  // the model. NOTE: PyTorch's semantics, not ONNX's: the running variance takes the unbiased batch
  // variance (n / (n - 1)), and the momentum attribute is 1 - torch's momentum, as exported. On a
  // GPU a bf16/fp16 input (autocast) goes in as it is, with fp32 parameters, as in PyTorch.
  const bool outputs_statistics =
      c.wants_output(1) || c.wants_output(2) || c.wants_output(3) || c.wants_output(4);
  const bool same_params = scale.scalar_type() == ct && bias.scalar_type() == ct &&
                           mean.scalar_type() == ct && var.scalar_type() == ct;
  if (training && c.training() && !outputs_statistics && same_params && at::isFloatingType(ct)) {
    const bool mixed = x.is_cuda() && ct == at::kFloat &&
                       (x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kHalf);
    // The executor's own tensors for the initializers, updated in place (outside autograd).
    at::Tensor y = at::batch_norm(mixed ? x : x.to(ct), scale, bias, mean.detach(), var.detach(),
                                  /*training=*/true, 1.0 - momentum, eps, /*cudnn_enabled=*/true);
    set_y(y.to(x.scalar_type()));
    return;
  }
  if (!training) {
    for (size_t i = 1; i < c.num_outputs(); ++i)
      if (c.wants_output(i)) c.fail("output ", i, " is only produced in training mode");
    if (const at::Tensor y = batch_norm_nhwc(c, {x}, 1, eps, post); y.defined())
      return c.set_output(0, y);
  }
  at::Tensor xc = x.to(ct);
  at::Tensor use_mean = mean, use_var = var;
  at::Tensor batch_mean, batch_var;
  if (training) {
    std::vector<int64_t> dims = {0};
    for (int64_t d = 2; d < x.dim(); ++d) dims.push_back(d);
    auto [v, m] = at::var_mean(xc, dims, /*correction=*/0, /*keepdim=*/false);
    batch_mean = m;
    batch_var = v;
    use_mean = m;
    use_var = v;
  }
  set_y(normalize(xc, use_mean, use_var, scale, bias, eps).to(x.scalar_type()));
  if (training) {
    // NOTE: ONNX's momentum weighs the *old* running value (PyTorch's weighs the new one).
    at::ScalarType st = mean.scalar_type();
    if (c.wants_output(1))
      c.set_output(1, (mean.to(ct) * momentum + batch_mean * (1.0 - momentum)).to(st));
    if (c.wants_output(2))
      c.set_output(2, (var.to(ct) * momentum + batch_var * (1.0 - momentum)).to(var.scalar_type()));
    if (c.wants_output(3)) c.set_output(3, batch_mean.to(st));
    if (c.wants_output(4)) c.set_output(4, batch_var.to(var.scalar_type()));
    // The running statistics updated as above, where ATen's batch norm could not be used.
    if (c.training() && !c.wants_output(1) && !c.wants_output(2) && mean.is_floating_point() &&
        var.is_floating_point()) {
      c10::NoGradGuard no_grad;
      int64_t n = x.numel() / ch;
      double unbias = n > 1 ? double(n) / double(n - 1) : 1.0;
      at::Tensor m = mean, v = var;  // the executor's own tensors for the initializers
      m.mul_(momentum).add_(batch_mean.detach().to(m.scalar_type()), 1.0 - momentum);
      v.mul_(momentum).add_(batch_var.detach().to(v.scalar_type()), (1.0 - momentum) * unbias);
    }
  }
}

void instance_norm(OpContext& c) {
  const at::Tensor& x = c.input(0);
  c.check(x.dim() >= 3, "input must have rank >= 3, got ", x.dim());
  c.check(x.is_floating_point(), "input must be a floating-point tensor");
  int64_t ch = x.size(1);
  check_vec(c, c.input(1), ch, "scale");
  check_vec(c, c.input(2), ch, "B");
  double eps = c.attr_float("epsilon", 1e-5f);
  at::ScalarType ct = at::promote_types(x.scalar_type(), at::kFloat);
  std::vector<int64_t> dims;
  for (int64_t d = 2; d < x.dim(); ++d) dims.push_back(d);
  at::Tensor xc = x.to(ct);
  auto [v, m] = at::var_mean(xc, dims, 0, true);
  auto shape = channel_shape(x.dim(), ch);
  at::Tensor y = (xc - m) * at::rsqrt(v + eps) * c.input(1).to(ct).reshape(shape) +
                 c.input(2).to(ct).reshape(shape);
  c.set_output(0, y.to(x.scalar_type()));
}

// What LayerNormalization and RMSNormalization read alike: the type they compute in, the
// input's rank, the first normalised axis (every axis from it on is normalised) and epsilon.
struct TrailingNorm {
  at::ScalarType ct;
  int64_t rank, axis;
  double eps;
  std::vector<int64_t> dims;  // axis .. rank - 1
};

TrailingNorm read_trailing_norm(OpContext& c, const at::Tensor& x) {
  TrailingNorm n{stash_type_of(c, x), x.dim(), 0, c.attr_float("epsilon", 1e-5f), {}};
  c.check(n.rank >= 1, "input must have rank >= 1");
  n.axis = normalize_axis(c, c.attr_int("axis", -1), n.rank);
  for (int64_t d = n.axis; d < n.rank; ++d) n.dims.push_back(d);
  return n;
}

// A layer norm's scale and bias (the node's inputs i and i + 1; bias undefined where absent) as
// float32, what the CPU kernels read: a bf16 model's widened once and kept with the node where
// they are initializers (two ATen ops on every call otherwise), as they are elsewhere.
std::pair<at::Tensor, at::Tensor> float_params(OpContext& c, size_t i, const at::Tensor& scale,
                                               const at::Tensor& bias) {
  if (scale.scalar_type() == at::kFloat && (!bias.defined() || bias.scalar_type() == at::kFloat))
    return {scale, bias};
  if (!c.prepack() || !c.is_constant(i) || (bias.defined() && !c.is_constant(i + 1)))
    return {scale, bias};
  struct Widened {
    at::Tensor scale, bias;
  };
  auto& st = c.state<Widened>();
  if (!st.scale.defined()) {
    st.scale = scale.to(at::kFloat).contiguous();
    if (bias.defined()) st.bias = bias.to(at::kFloat).contiguous();
  }
  return {st.scale, st.bias};
}

// LayerNormalization of x with the node's scale and bias at inputs `scale_at` and `scale_at` + 1:
// Y, and where `stats` the Mean and InvStdDev its outputs 1 and 2 ask for.
void layer_norm_of(OpContext& c, const at::Tensor& x, size_t scale_at, bool stats) {
  const auto [ct, rank, axis, eps, dims] = read_trailing_norm(c, x);
  at::IntArrayRef normalized = x.sizes().slice(axis);
  const at::Tensor& scale = c.input(scale_at);
  at::Tensor bias = c.has_input(scale_at + 1) ? c.input(scale_at + 1) : at::Tensor();
  const bool want_mean = stats && c.wants_output(1), want_rstd = stats && c.wants_output(2);
  // NOTE: a bfloat16 (or fp16) input computed in float32 (stash_type 1) is ATen's own mixed kernel:
  // statistics and normalisation in float32, the result rounded once. ONNX's function rounds the
  // normalised value before the scale and bias too; one rounding is the closer result. The general
  // path below took 20.9 of vit_b_16's 146 ms in bf16 (AMD EPYC Zen 4).
  const bool mixed = ct == at::kFloat && !want_mean && !want_rstd &&
                     (x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kHalf) &&
                     scale.scalar_type() == x.scalar_type() &&
                     (!bias.defined() || bias.scalar_type() == x.scalar_type());
  if ((ct == x.scalar_type() || mixed) && scale.sizes() == normalized &&
      (!bias.defined() || bias.sizes() == normalized)) {
    // One fused kernel when scale and bias have the normalized shape (what exporters write).
    if (!want_mean && !want_rstd) {
      // NOTE: the last axis of a contiguous float32 or bf16 CPU tensor: lopper's rows kernel (a
      // 12-layer BERT encoder's 24 layer norms, seq 128: ATen 0.49 ms fp32, 0.88 ms bf16).
      if (normalized.size() == 1 && !c.grad_mode() && x.device().is_cpu() && x.is_contiguous() &&
          (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16) &&
          scale.device().is_cpu() && (!bias.defined() || bias.device().is_cpu())) {
        const auto [g, b] = float_params(c, scale_at, scale, bias);
        c.set_output(0, kernels::cpu::layer_norm_last_axis(x, g, b, float(eps)));
        return;
      }
      c.set_output(0, at::layer_norm(x, normalized, scale, bias, eps));
      return;
    }
    auto [y, mean, rstd] = at::native_layer_norm(x, normalized, scale, bias, eps);
    c.set_output(0, y);
    if (want_mean) c.set_output(1, mean);
    if (want_rstd) c.set_output(2, rstd);
    return;
  }
  at::Tensor xc = x.to(ct);
  auto [v, m] = at::var_mean(xc, dims, 0, true);
  at::Tensor inv = at::rsqrt(v + eps);
  at::Tensor y = ((xc - m) * inv).to(x.scalar_type()) * scale;
  if (bias.defined()) y = y + bias;
  c.set_output(0, y.to(x.scalar_type()));
  if (want_mean) c.set_output(1, m);
  if (want_rstd) c.set_output(2, inv);
}

void layer_norm(OpContext& c) { layer_norm_of(c, c.input(0), 1, true); }

// ai.lopper.AddLayerNormalization(A, B, scale [, bias]), LayerNormalization's attributes: Y =
// LayerNormalization(A + B) and, as its second output, A + B where anything else reads it (a
// transformer's residual and its norm, fused for inference). On the CPU, for A and B of one shape
// and type, float32 or bf16, normalised along the last axis: one pass over each row
// (kernels::cpu::add_layer_norm_last_axis); anything else, the Add and the norm.
void add_layer_norm(OpContext& c) {
  const at::Tensor &a = c.input(0), &b = c.input(1);
  const at::Tensor& scale = c.input(2);
  const at::Tensor bias = c.has_input(3) ? c.input(3) : at::Tensor();
  const int64_t rank = a.dim();
  const bool last = rank >= 1 && normalize_axis(c, c.attr_int("axis", -1), rank) == rank - 1;
  const at::ScalarType type = a.scalar_type();
  const bool cpu = a.device().is_cpu() && b.device().is_cpu() && scale.device().is_cpu() &&
                   (!bias.defined() || bias.device().is_cpu());
  // stash_type float32 (the default): bf16 normalised in float32 and rounded once, as
  // LayerNormalization's own kernel above
  if (last && cpu && !c.grad_mode() && (type == at::kFloat || type == at::kBFloat16) &&
      b.scalar_type() == type && a.sizes() == b.sizes() && a.is_contiguous() && b.is_contiguous() &&
      stash_type_of(c, a) == at::kFloat && scale.scalar_type() == type &&
      (!bias.defined() || bias.scalar_type() == type) && scale.dim() == 1 &&
      scale.size(0) == a.size(-1) && (!bias.defined() || bias.sizes() == scale.sizes())) {
    at::Tensor sum;
    const auto [gf, bf] = float_params(c, 2, scale, bias);
    c.set_output(0, kernels::cpu::add_layer_norm_last_axis(a, b, gf, bf,
                                                           float(c.attr_float("epsilon", 1e-5f)),
                                                           c.wants_output(1) ? &sum : nullptr));
    if (c.wants_output(1)) c.set_output(1, sum);
    return;
  }
  const at::Tensor sum = at::add(a, b);
  layer_norm_of(c, sum, 2, false);
  if (c.wants_output(1)) c.set_output(1, sum);
}

void group_norm(OpContext& c) {
  const at::Tensor& x = c.input(0);
  c.check(x.dim() >= 2, "input must have rank >= 2, got ", x.dim());
  at::ScalarType ct =
      c.opset() >= 21 ? stash_type_of(c, x) : at::promote_types(x.scalar_type(), at::kFloat);
  int64_t groups = c.attr_int("num_groups");
  int64_t ch = x.size(1);
  c.check(groups > 0 && ch % groups == 0, "num_groups ", groups, " must divide the ", ch,
          " channels");
  double eps = c.attr_float("epsilon", 1e-5f);
  at::Tensor scale = c.input(1), bias = c.input(2);
  if (c.opset() >= 21) {
    check_vec(c, scale, ch, "scale");
    check_vec(c, bias, ch, "bias");
  } else {
    // Opset 18: one scale and bias per group.
    check_vec(c, scale, groups, "scale");
    check_vec(c, bias, groups, "bias");
    scale = scale.reshape({groups}).repeat_interleave(ch / groups);
    bias = bias.reshape({groups}).repeat_interleave(ch / groups);
  }
  int64_t n = x.size(0);
  at::Tensor xg = x.to(ct).reshape({n, groups, -1});
  auto [v, m] = at::var_mean(xg, {2}, 0, true);
  at::Tensor norm = ((xg - m) * at::rsqrt(v + eps)).reshape(x.sizes());
  auto shape = channel_shape(x.dim(), ch);
  at::Tensor y = norm * scale.to(ct).reshape(shape) + bias.to(ct).reshape(shape);
  c.set_output(0, y.to(x.scalar_type()));
}

void lp_norm(OpContext& c) {
  const at::Tensor& x = c.input(0);
  c.check(x.is_floating_point(), "input must be a floating-point tensor");
  int64_t axis = normalize_axis(c, c.attr_int("axis", -1), x.dim());
  int64_t p = c.attr_int("p", 2);
  c.check(p == 1 || p == 2, "p must be 1 or 2, got ", p);
  if (x.dim() == 0) {
    c.set_output(0, at::where(x == 0, at::zeros_like(x), x / x.abs()));
    return;
  }
  at::Tensor norm = p == 1 ? x.abs().sum({axis}, true) : x.square().sum({axis}, true).sqrt();
  // Zero vectors stay zero (0/0 would be NaN).
  at::Tensor safe = at::where(norm == 0, at::ones_like(norm), norm);
  c.set_output(0, at::where(norm == 0, at::zeros_like(x), x / safe));
}

void mvn(OpContext& c) {
  const at::Tensor& x = c.input(0);
  c.check(x.is_floating_point(), "input must be a floating-point tensor");
  auto axes = c.attr_ints("axes", {0, 2, 3});
  std::vector<int64_t> dims;
  for (int64_t a : axes) dims.push_back(normalize_axis(c, a, x.dim()));
  at::Tensor mean = x.mean(dims, true);
  at::Tensor var = (x.square().mean(dims, true) - mean.square()).clamp_min(0);
  c.set_output(0, (x - mean) / (var.sqrt() + 1e-9));
}

// y = x * rsqrt(mean(x^2) + eps) * scale over each row of d values, accumulated in float32: one
// pass to sum the squares, one to scale (a decoding step's norm is a row of 2048; ATen's ops
// take several microseconds each, the row one).
template <typename T>
void rms_norm_rows(const T* x, const T* scale, T* y, int64_t rows, int64_t d, float eps) {
  at::parallel_for(0, rows, std::max<int64_t>(1, 32768 / std::max<int64_t>(d, 1)),
                   [&](int64_t begin, int64_t end) {
                     for (int64_t r = begin; r < end; ++r) {
                       const T* xr = x + r * d;
                       float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
                       int64_t i = 0;
                       for (; i + 8 <= d; i += 8)
                         for (int j = 0; j < 8; ++j) {
                           const float v = static_cast<float>(xr[i + j]);
                           acc[j] += v * v;
                         }
                       float sum = 0;
                       for (; i < d; ++i)
                         sum += static_cast<float>(xr[i]) * static_cast<float>(xr[i]);
                       for (float a : acc) sum += a;
                       const float inv = 1.0f / std::sqrt(sum / static_cast<float>(d) + eps);
                       T* yr = y + r * d;
                       for (int64_t k = 0; k < d; ++k)
                         yr[k] = static_cast<T>(
                             static_cast<float>(static_cast<T>(static_cast<float>(xr[k]) * inv)) *
                             static_cast<float>(scale[k]));
                     }
                   });
}

void rms_norm(OpContext& c) {
  const at::Tensor& x = c.input(0);
  const auto [ct, rank, axis, eps, dims] = read_trailing_norm(c, x);
  const at::Tensor& scale = c.input(1);
  const int64_t d = x.size(rank - 1);
  if (axis == rank - 1 && !c.grad_mode() && x.is_cpu() && scale.is_cpu() && ct == at::kFloat &&
      (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16) &&
      scale.scalar_type() == x.scalar_type() && scale.numel() == d && scale.dim() >= 1 &&
      scale.dim() <= rank && scale.size(-1) == d) {
    const at::Tensor xc = x.contiguous(), sc = scale.contiguous();
    at::Tensor y = at::empty_like(xc);
    const int64_t rows = d ? xc.numel() / d : 0;
    if (x.scalar_type() == at::kFloat)
      rms_norm_rows(xc.data_ptr<float>(), sc.data_ptr<float>(), y.data_ptr<float>(), rows, d,
                    static_cast<float>(eps));
    else
      rms_norm_rows(xc.data_ptr<at::BFloat16>(), sc.data_ptr<at::BFloat16>(),
                    y.data_ptr<at::BFloat16>(), rows, d, static_cast<float>(eps));
    c.set_output(0, y);
    return;
  }
  at::Tensor xc = x.to(ct);
  at::Tensor y = xc * at::rsqrt(xc.square().mean(dims, true) + eps);
  c.set_output(0, (y.to(x.scalar_type()) * c.input(1)).to(x.scalar_type()));
}

void lrn(OpContext& c) {
  const at::Tensor& x = c.input(0);
  c.check(x.dim() >= 2, "input must have rank >= 2, got ", x.dim());
  c.check(x.is_floating_point(), "input must be a floating-point tensor");
  int64_t size = c.attr_int("size");
  c.check(size >= 1, "size must be >= 1, got ", size);
  double alpha = c.attr_float("alpha", 1e-4f);
  double beta = c.attr_float("beta", 0.75f);
  double bias = c.attr_float("bias", 1.0f);
  int64_t before = (size - 1) / 2, after = size - 1 - before;
  // Sum of squares over a window of channels: pad the channel dim, then slide.
  at::Tensor sq = x.square().transpose(1, -1);
  at::Tensor padded = at::constant_pad_nd(sq, {before, after}, 0);
  at::Tensor sum = padded.unfold(-1, size, 1).sum(-1).transpose(1, -1);
  c.set_output(0, x / at::pow(sum * (alpha / static_cast<double>(size)) + bias, beta));
}

// Channel rules: the per-channel parameters follow the channels on axis 1 (BatchNormalization,
// InstanceNormalization) or on the normalised axes (LayerNormalization: the statistics then cover
// the channels that stay, as in Torch-Pruning's hidden-size pruning).
void batch_norm_channels(ChannelContext& c) {
  const Tracked* x = c.in(0);
  if (!x) return;
  if (x->axis != 1) return c.barrier("normalisation tracked off the channel axis");
  for (size_t i = 1; i < c.num_inputs(); ++i) {
    if (c.in(i) || (c.has_input(i) && !c.constant(i).defined()))
      return c.barrier("normalisation parameters computed at run time");
    if (c.has_input(i)) c.slice(i, 0, x->atoms, i == 1 ? ParamRole::kNormScale : ParamRole::kOther);
  }
  c.set_out(0, *x);
}

void layer_norm_channels(ChannelContext& c) {
  const Tracked* x = c.in(0);
  if (!x) return;
  const int64_t rank = int64_t(c.in_shape(0).size());
  int64_t axis = c.attr_int("axis", -1);
  if (axis < 0) axis += rank;
  if (x->axis >= axis) {
    for (size_t i = 1; i < 3 && i < c.num_inputs(); ++i) {
      if (!c.has_input(i)) continue;
      at::Tensor p = c.constant(i);
      if (!p.defined() || c.in(i))
        return c.barrier("LayerNormalization parameters computed at run time");
      int64_t pa = x->axis - (rank - p.dim());
      if (pa >= 0 && p.size(pa) > 1)
        c.slice(i, pa, x->atoms, i == 1 ? ParamRole::kNormScale : ParamRole::kOther);
    }
  }
  c.set_out(0, *x);
}

}  // namespace

void register_norm(OpTable& t) {
  t.add_onnx({
      {"BatchNormalization", batch_norm, batch_norm_channels},
      {"InstanceNormalization", instance_norm, batch_norm_channels},
      {"LayerNormalization", layer_norm, layer_norm_channels},
      {"GroupNormalization", group_norm},
      {"LpNormalization", lp_norm},
      {"MeanVarianceNormalization", mvn},
      {"RMSNormalization", rms_norm},
      {"LRN", lrn},
  });
  t.add({"ai.lopper", "FusedBatchNormalization", batch_norm});
  t.add({"ai.lopper", "FusedConcatNorm", fused_concat_norm});
  t.add({"ai.lopper", "AddLayerNormalization", add_layer_norm});
}

}  // namespace lopper::ops
