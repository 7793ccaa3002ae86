#include "exec/onednn.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include "kernels/cpu/bf16.h"

namespace lopper::ops::onednn {
namespace {

// NOTE: the mkldnn:: ops are called boxed: their C++ signatures have changed across libtorch
// releases, the schemas have not; the boxing costs a few microseconds per call.
c10::OperatorHandle op(const char* name, const char* overload) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, overload);
}

c10::IValue opt_tensor(const at::Tensor& t) { return t.defined() ? c10::IValue(t) : c10::IValue(); }

c10::IValue scalars(const std::vector<double>& v) {
  c10::List<std::optional<at::Scalar>> l;
  for (double d : v) l.push_back(at::Scalar(d));
  return c10::IValue(l);
}

c10::IValue algorithm(const PostOp& p) {
  return p.algorithm.empty() ? c10::IValue() : c10::IValue(p.algorithm);
}

at::Tensor call(const c10::OperatorHandle& h, torch::jit::Stack stack) {
  h.callBoxed(stack);
  return stack.back().toTensor();
}

}  // namespace

// NOTE: oneDNN's ReLU (slope 0), clip (hardtanh) and hardsigmoid post-ops take max/min with the
// value as the first operand, which turns a NaN into 0 or a bound: a model fed NaN would give
// plausible numbers where ONNX Runtime and PyTorch give NaN. Those run after the primitive, in
// place, as ATen's ops (NaN stays NaN); oneDNN's other post-ops keep NaN (a leaky ReLU blends
// alpha x, the smooth ones compute on x).
bool drops_nan(const PostOp& p) {
  return p.attr == "relu" || p.attr == "hardtanh" || p.attr == "hardsigmoid";
}

// What oneDNN fuses of `p`: nothing where it would drop NaN.
PostOp in_primitive(const PostOp& p) { return drops_nan(p) ? PostOp{} : p; }

// `y` after the part of `p` the primitive did not fuse.
at::Tensor after_primitive(at::Tensor y, const PostOp& p) {
  if (!drops_nan(p)) return y;
  // bf16: lopper's in-place passes (ATen's widen and round every element: 2.5-3x the time).
  if (p.attr == "relu") return kernels::cpu::relu_bf16_(y) ? y : y.relu_();
  if (p.attr == "hardtanh")
    return kernels::cpu::clamp_bf16_(y, float(p.scalars[0]), float(p.scalars[1]))
               ? y
               : y.clamp_(p.scalars[0], p.scalars[1]);
  return at::hardsigmoid_(y);
}

std::optional<std::pair<dnnl::Eltwise, float>> direct_eltwise(const PostOp& post) {
  const PostOp p = in_primitive(post);
  using E = dnnl::Eltwise;
  if (p.attr == "none") return std::pair{E::kNone, 0.f};
  if (p.attr == "leaky_relu") return std::pair{E::kLeakyRelu, float(p.scalars.at(0))};
  if (p.attr == "sigmoid") return std::pair{E::kLogistic, 0.f};
  if (p.attr == "tanh") return std::pair{E::kTanh, 0.f};
  if (p.attr == "gelu" && p.algorithm == "none") return std::pair{E::kGeluErf, 0.f};
  if (p.attr == "gelu" && p.algorithm == "tanh") return std::pair{E::kGeluTanh, 0.f};
  if (p.attr == "hardswish") return std::pair{E::kHardswish, 0.f};
  if (p.attr == "swish") return std::pair{E::kSwish, 0.f};
  return std::nullopt;
}

void note_direct_unavailable(std::vector<std::string>& refused) {
  if (dnnl::available()) return;
  const std::string why = dnnl::unavailable_reason();
  if (why != "LOPPER_DNNL_LIBRARY=off") refused.push_back("onednn-direct: " + why);
}

PostOp post_op_of(const AttrReader& c) {
  PostOp p;
  std::string act = c.attr_string("activation", "");
  if (act.empty()) return p;
  if (act == "Relu") {
    p.attr = "relu";
  } else if (act == "Clip") {
    p.attr = "hardtanh";
    p.scalars = {c.attr_float("activation_min", -INFINITY),
                 c.attr_float("activation_max", INFINITY)};
  } else if (act == "LeakyRelu") {
    p.attr = "leaky_relu";
    p.scalars = {c.attr_float("activation_alpha", 0.01f)};
  } else if (act == "Sigmoid") {
    p.attr = "sigmoid";
  } else if (act == "Tanh") {
    p.attr = "tanh";
  } else if (act == "HardSwish") {
    p.attr = "hardswish";
  } else if (act == "HardSigmoid") {
    // NOTE: oneDNN's (PyTorch's) hardsigmoid is clamp(x / 6 + 1/2, 0, 1): the fusion pass fuses
    // only that line (torch.nn.Hardsigmoid's export); the attribute is kept for the own kernels.
    p.attr = "hardsigmoid";
  } else if (act == "Silu") {
    p.attr = "swish";  // oneDNN's swish, x * sigmoid(alpha x), with alpha 1
  } else if (act == "Gelu") {
    p.attr = "gelu";
    p.algorithm = c.attr_string("activation_approximate", "none");
  } else {
    c.fail("unknown fused activation '", act, "'");
  }
  return p;
}

at::Tensor apply_unfused(const at::Tensor& y, const PostOp& p) {
  if (p.attr == "relu") return at::relu(y);
  if (p.attr == "hardtanh") return at::clamp(y, p.scalars[0], p.scalars[1]);
  if (p.attr == "leaky_relu") return at::leaky_relu(y, p.scalars[0]);
  if (p.attr == "sigmoid") return at::sigmoid(y);
  if (p.attr == "tanh") return at::tanh(y);
  if (p.attr == "gelu") return at::gelu(y, p.algorithm);
  if (p.attr == "hardswish") return at::hardswish(y);
  if (p.attr == "hardsigmoid") return at::hardsigmoid(y);
  if (p.attr == "swish") return at::silu(y);
  return y;
}

bool bf16_native() {
  static const bool native = __builtin_cpu_supports("avx512bf16");
  return native;
}

bool usable(const at::Tensor& x) {
  return at::hasMKLDNN() && x.device().is_cpu() && !x.requires_grad() &&
         (x.scalar_type() == at::kFloat || (x.scalar_type() == at::kBFloat16 && bf16_native()));
}

at::Tensor pack_conv2d_weight(const at::Tensor& w, at::IntArrayRef padding, at::IntArrayRef stride,
                              at::IntArrayRef dilation, int64_t groups,
                              at::IntArrayRef input_size) {
  return at::mkldnn_reorder_conv2d_weight(w.contiguous().to_mkldnn(), padding, stride, dilation,
                                          groups, input_size);
}

at::Tensor conv2d(const at::Tensor& x, const at::Tensor& packed_w, const at::Tensor& bias,
                  at::IntArrayRef padding, at::IntArrayRef stride, at::IntArrayRef dilation,
                  int64_t groups, const PostOp& post_in) {
  static const c10::OperatorHandle h = op("mkldnn::_convolution_pointwise", "");
  const PostOp post = in_primitive(post_in);
  return after_primitive(
      call(h, {x, packed_w, opt_tensor(bias), padding.vec(), stride.vec(), dilation.vec(), groups,
               post.attr, scalars(post.scalars), algorithm(post)}),
      post_in);
}

at::Tensor conv2d_add(const at::Tensor& x, const at::Tensor& other, const at::Tensor& packed_w,
                      const at::Tensor& bias, at::IntArrayRef padding, at::IntArrayRef stride,
                      at::IntArrayRef dilation, int64_t groups, const PostOp& post_in) {
  static const c10::OperatorHandle h = op("mkldnn::_convolution_pointwise", "binary");
  const PostOp post = in_primitive(post_in);
  return after_primitive(call(h, {x, other, packed_w, opt_tensor(bias), padding.vec(), stride.vec(),
                                  dilation.vec(), groups, std::string("add"), c10::IValue(),
                                  post.attr == "none" ? c10::IValue() : c10::IValue(post.attr),
                                  scalars(post.scalars), algorithm(post)}),
                         post_in);
}

at::Tensor pack_linear_weight(const at::Tensor& w, int64_t batch) {
  static const c10::OperatorHandle h = op("mkldnn::_reorder_linear_weight", "");
  return call(h, {w.contiguous(), batch});
}

at::Tensor linear_add(const at::Tensor& x, const at::Tensor& other, const at::Tensor& packed_w,
                      const at::Tensor& bias) {
  static const c10::OperatorHandle h = op("mkldnn::_linear_pointwise", "binary");
  return call(h, {x, other, packed_w, opt_tensor(bias), std::string("add")});
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& packed_w, const at::Tensor& bias,
                  const PostOp& post_in) {
  static const c10::OperatorHandle h = op("mkldnn::_linear_pointwise", "");
  const PostOp post = in_primitive(post_in);
  return after_primitive(
      call(h, {x, packed_w, opt_tensor(bias), post.attr, scalars(post.scalars), algorithm(post)}),
      post_in);
}

}  // namespace lopper::ops::onednn
