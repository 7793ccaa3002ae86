// Activations (Relu ... Mish, the gated Swish and SwiGLU) and the softmax family.
#include <ATen/ATen.h>

#include "kernels/cpu/rows.h"
#include "ops/channels.h"
#include "ops/op.h"

namespace lopper::ops {

namespace {

// Runs `fn(x2d_or_x, dim)` with ONNX's axis rule: before opset 13 the input is seen as 2-D
// [prod(dims before axis), prod(dims from axis)] (default axis 1); from 13 it works on one axis
// (default -1).
at::Tensor along_axis(const OpContext& c, const at::Tensor& x,
                      at::Tensor (*fn)(const at::Tensor&, int64_t)) {
  int64_t rank = x.dim();
  if (c.opset() < 13) {
    int64_t axis = c.attr_int("axis", 1);
    if (rank == 0) return fn(x.reshape({1, 1}), 1).reshape({});
    axis = normalize_axis(c, axis, rank);
    int64_t outer = 1;
    for (int64_t i = 0; i < axis; ++i) outer *= x.size(i);
    int64_t inner = 1;
    for (int64_t i = axis; i < rank; ++i) inner *= x.size(i);
    return fn(x.reshape({outer, inner}), 1).reshape(x.sizes());
  }
  int64_t axis = c.attr_int("axis", -1);
  if (rank == 0) return fn(x.reshape({1}), 0).reshape({});
  return fn(x, normalize_axis(c, axis, rank));
}

at::Tensor hardmax(const at::Tensor& x, int64_t dim) {
  if (x.numel() == 0) return at::zeros_like(x);
  // argmax returns the first maximal index, as ONNX asks.
  at::Tensor idx = at::argmax(x, dim, /*keepdim=*/true);
  return at::zeros_like(x).scatter(dim, idx, 1);
}

// NOTE: on 16-bit floats ONNX's reference rounds after every step (x - max, exp, sum, divide),
// where at::softmax rounds once; the stepwise form matches it to the last bit. Its float16 sum
// accumulates in float32 (numpy's pairwise sum), its bfloat16 sum adds one element at a time with
// rounding (ml_dtypes), so bfloat16 rows are summed that way here.
// NOTE: one pass over contiguous rows, not one tensor op per element (a decoder's attention in
// bfloat16 summed 257-long rows with 257 ops each: 2 ms a token).
// On a GPU the sum is ATen's (fp32 accumulation, one rounding): the loop below reads host memory
// (seen: a segfault on an H100 in BERT's attention in bfloat16).
at::Tensor sum16(const at::Tensor& e, int64_t dim) {
  if (e.scalar_type() != at::kBFloat16 || e.size(dim) == 0 || !e.device().is_cpu())
    return at::sum(e, dim, true);
  const at::Tensor rows = e.movedim(dim, -1).contiguous();
  const int64_t n = rows.size(-1), count = rows.numel() / n;
  at::Tensor out = at::empty({count}, rows.options());
  const c10::BFloat16* p = rows.data_ptr<c10::BFloat16>();
  c10::BFloat16* o = out.data_ptr<c10::BFloat16>();
  for (int64_t r = 0; r < count; ++r) {
    c10::BFloat16 acc = p[r * n];
    for (int64_t i = 1; i < n; ++i) acc = acc + p[r * n + i];  // rounded to bfloat16 each time
    o[r] = acc;
  }
  std::vector<int64_t> shape = rows.sizes().vec();
  shape.back() = 1;
  return out.reshape(shape).movedim(-1, dim);
}

bool is_float16(const at::Tensor& v) {
  return v.scalar_type() == at::kHalf || v.scalar_type() == at::kBFloat16;
}

at::Tensor softmax_fn(const at::Tensor& v, int64_t d) {
  if (!is_float16(v) || v.numel() == 0) return at::softmax(v, d);
  at::Tensor e = at::exp(v - std::get<0>(at::max(v, d, true)).detach());
  return e / sum16(e, d);
}
at::Tensor log_softmax_fn(const at::Tensor& v, int64_t d) {
  if (!is_float16(v) || v.numel() == 0) return at::log_softmax(v, d);
  at::Tensor shifted = v - std::get<0>(at::max(v, d, true)).detach();
  return shifted - at::log(sum16(at::exp(shifted), d));
}

void unary(OpTable& t, const char* name,
           std::function<at::Tensor(OpContext&, const at::Tensor&)> fn) {
  t.add({"", name, [fn](OpContext& c) { c.set_output(0, fn(c, c.input(0))); }});
}

// Whether `axis` of the op (Softmax's semantics in c's opset) is x's last axis alone.
bool last_axis(const OpContext& c, const at::Tensor& x) {
  if (x.dim() == 0) return false;
  const int64_t axis = c.attr_int("axis", c.opset() < 13 ? 1 : -1);
  return axis == -1 || axis == x.dim() - 1;
}

// ai.lopper.ScaledSoftmax(x), attribute scale: softmax(scale * x) along the last axis (made by the
// fusion pass from attention's Softmax(MatMul(Q * a, K * b) [* c]): the scales leave Q, K and the
// scores and meet inside the softmax).
void scaled_softmax_forward(OpContext& c) {
  const at::Tensor& x = c.input(0);
  c.check(x.dim() >= 1, "input must be at least 1-D");
  c.set_output(0, scaled_softmax(c, x, c.attr_float("scale", 1.f)));
}

// Channel rules: activations keep their input's channels; Softmax and its kin only when they
// normalise over another axis.
void softmax_channels(ChannelContext& c) {
  const Tracked* x = c.in(0);
  if (!x) return;
  const int64_t rank = int64_t(c.in_shape(0).size());
  const bool legacy = c.opset() < 13;  // opset < 13 flattens the axes from `axis` on
  int64_t axis = c.attr_int("axis", legacy ? 1 : -1);
  if (axis < 0) axis += rank;
  if (x->axis == axis || (legacy && x->axis > axis))
    return c.barrier(c.node().op_type + " normalises over the channels");
  c.set_out(0, *x);
}

void prelu(OpContext& c) {
  const at::Tensor& x = c.input(0);
  at::Tensor slope = c.input(1);
  if (c.opset() < 7 && slope.dim() == 1 && x.dim() >= 2 && slope.size(0) == x.size(1) &&
      slope.size(0) != 1) {
    // PRelu-6: a 1-D slope is per channel (axis 1).
    std::vector<int64_t> shape(x.dim() - 1, 1);
    shape[0] = slope.size(0);
    slope = slope.reshape(shape);
  }
  // NOTE: ONNX broadcasts the slope numpy-style (at::prelu wants it per channel).
  at::Tensor r = at::where(x < 0, x * slope, x);
  c.set_output(0, r.scalar_type() == x.scalar_type() ? r : r.to(x.scalar_type()));
}

void swish(OpContext& c) {
  const at::Tensor& x = c.input(0);
  c.check(x.is_floating_point(), "input must be a floating-point tensor");
  double alpha = c.attr_float("alpha", 1.0f);
  c.set_output(0, x * at::sigmoid(x * alpha));
}

void swiglu(OpContext& c) {
  const at::Tensor& a = c.input(0);
  const at::Tensor& b = c.input(1);
  c.check(a.is_floating_point(), "inputs must be floating-point tensors");
  c.check(a.sizes() == b.sizes(), "A and B must have the same shape, got ", a.sizes(), " and ",
          b.sizes());
  c.check(a.scalar_type() == b.scalar_type(), "A and B must have the same type");
  double alpha = c.attr_float("alpha", 1.0f);
  c.set_output(0, a * at::sigmoid(a * alpha) * b);
}

}  // namespace

// softmax(scale * x) along the last axis (op.h): lopper's row kernel for float32 on the CPU in
// inference (kernels/cpu/rows.h: one pass of three over each row, the scale folded in), and for
// bf16 in a model lowered to it (each row widened, rounded once), else ATen's.
// NOTE: a decoding step of 8 LLaMA layers in bf16 spent 0.79 ms in its 8 softmaxes of [32, 257]
// on the stepwise form (0.12 ms in float32).
at::Tensor scaled_softmax(const OpContext& c, const at::Tensor& x, float scale) {
  if (c.prepack() && x.device().is_cpu() &&
      (x.scalar_type() == at::kFloat || (x.scalar_type() == at::kBFloat16 && c.lowered())))
    return kernels::cpu::softmax_last_axis(x, scale);
  return softmax_fn(scale == 1.f ? x : x * scale, -1);
}

void register_activation(OpTable& t) {
  unary(t, "Relu", [](OpContext&, const at::Tensor& x) { return at::relu(x); });
  unary(t, "LeakyRelu", [](OpContext& c, const at::Tensor& x) {
    return at::leaky_relu(x, c.attr_float("alpha", 0.01f));
  });
  t.add({"", "PRelu", prelu});
  unary(t, "Sigmoid", [](OpContext&, const at::Tensor& x) { return at::sigmoid(x); });
  unary(t, "HardSigmoid", [](OpContext& c, const at::Tensor& x) {
    double alpha = c.attr_float("alpha", 0.2f), beta = c.attr_float("beta", 0.5f);
    return at::clamp(x * alpha + beta, 0.0, 1.0);
  });
  unary(t, "HardSwish", [](OpContext&, const at::Tensor& x) {
    return x * at::clamp(x * (1.0 / 6.0) + 0.5, 0.0, 1.0);
  });
  unary(t, "Tanh", [](OpContext&, const at::Tensor& x) { return at::tanh(x); });
  unary(t, "Softplus", [](OpContext&, const at::Tensor& x) {
    // log(1 + exp(x)), stable for large |x|.
    return at::clamp_min(x, 0) + at::log1p(at::exp(-at::abs(x)));
  });
  unary(t, "Softsign", [](OpContext&, const at::Tensor& x) { return x / (at::abs(x) + 1); });
  unary(t, "Elu", [](OpContext& c, const at::Tensor& x) {
    double alpha = c.attr_float("alpha", 1.0f);
    return at::elu(x, alpha);
  });
  unary(t, "Selu", [](OpContext& c, const at::Tensor& x) {
    double alpha = c.attr_float("alpha", 1.67326319217681884765625f);
    double gamma = c.attr_float("gamma", 1.05070102214813232421875f);
    return at::elu(x, alpha, gamma);
  });
  unary(t, "Celu", [](OpContext& c, const at::Tensor& x) {
    double alpha = c.attr_float("alpha", 1.0f);
    return at::celu(x, alpha);
  });
  unary(t, "Gelu", [](OpContext& c, const at::Tensor& x) {
    std::string approx = c.attr_string("approximate", "none");
    c.check(approx == "none" || approx == "tanh", "approximate must be none or tanh, got '", approx,
            "'");
    return at::gelu(x, approx);
  });
  unary(t, "Mish", [](OpContext&, const at::Tensor& x) { return at::mish(x); });
  t.add({"", "Swish", swish});
  t.add({"", "SwiGLU", swiglu});
  unary(t, "ThresholdedRelu", [](OpContext& c, const at::Tensor& x) {
    double alpha = c.attr_float("alpha", 1.0f);
    return at::where(x > alpha, x, at::zeros({}, x.options()));
  });
  unary(t, "Shrink", [](OpContext& c, const at::Tensor& x) {
    double bias = c.attr_float("bias", 0.0f), lambd = c.attr_float("lambd", 0.5f);
    at::Tensor zero = at::zeros({}, x.options());
    at::Tensor r = at::where(x < -lambd, x + bias, at::where(x > lambd, x - bias, zero));
    return r.scalar_type() == x.scalar_type() ? r : r.to(x.scalar_type());
  });
  unary(t, "Softmax", [](OpContext& c, const at::Tensor& x) {
    return last_axis(c, x) ? scaled_softmax(c, x, 1.f) : along_axis(c, x, softmax_fn);
  });
  t.add({"ai.lopper", "ScaledSoftmax", scaled_softmax_forward});
  unary(t, "LogSoftmax",
        [](OpContext& c, const at::Tensor& x) { return along_axis(c, x, log_softmax_fn); });
  unary(t, "Hardmax", [](OpContext& c, const at::Tensor& x) { return along_axis(c, x, hardmax); });
  t.set_channels({"Relu", "LeakyRelu", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "Softplus",
                  "Softsign", "Elu", "Selu", "Celu", "Gelu", "Mish", "ThresholdedRelu", "Shrink"},
                 channel_rules::same);
  t.set_channels({"PRelu"}, channel_rules::broadcast);
  t.set_channels({"Softmax", "LogSoftmax", "Hardmax"}, softmax_channels);
}

}  // namespace lopper::ops
