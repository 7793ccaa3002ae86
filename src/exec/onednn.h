// oneDNN (through libtorch's mkldnn ops) for inference: weights reordered once into the layout the
// kernel reads, and the following activation (or a residual add) fused into the convolution.
// Internal header; every call is CPU, float32 or bfloat16 (activations, weight and bias of one
// type), callers check `usable()`.
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dnnl/primitives.h"
#include "lopper/memory.h"  // first_line
#include "ops/op.h"

namespace lopper::ops::onednn {

/// An activation applied to the kernel's output inside the kernel ("none", "relu", "hardtanh" with
/// scalars {min, max}, "leaky_relu" {slope}, "gelu" with algorithm "none"|"tanh", "sigmoid",
/// "tanh").
struct PostOp {
  std::string attr = "none";
  std::vector<double> scalars;
  std::string algorithm;
};

/// The activation a fused node (ai.lopper.FusedConv / FusedMatMul) carries in its attributes:
/// activation = Relu | Clip (activation_min/max) | LeakyRelu (activation_alpha) | Sigmoid | Tanh |
/// Gelu (activation_approximate = none | tanh) | HardSwish | HardSigmoid (x / 6 + 1/2, clamped to
/// [0, 1]) | Silu (x * sigmoid(x)); none when absent.
PostOp post_op_of(const AttrReader& node);
/// The same activation with plain ATen ops (any device, autograd).
at::Tensor apply_unfused(const at::Tensor& y, const PostOp& post);
/// Whether oneDNN's own form of the activation turns a NaN into a number (ReLU, clip, hardsigmoid):
/// those run after the primitive instead.
bool drops_nan(const PostOp& p);
/// The part of `p` a oneDNN primitive computes: nothing where it would drop a NaN.
PostOp in_primitive(const PostOp& p);
/// `y`, a primitive's output, after the part of `p` the primitive did not compute (in place).
at::Tensor after_primitive(at::Tensor y, const PostOp& p);
/// in_primitive(p) as the directly called primitives' activation (dnnl/primitives.h) and its
/// slope, or nullopt where they have no form of it.
std::optional<std::pair<dnnl::Eltwise, float>> direct_eltwise(const PostOp& p);
/// How many shapes' direct primitives a layer keeps (the newest): a dynamic batch or sequence
/// length makes one per shape.
inline constexpr size_t kKeptPrimitives = 4;
/// A layer's direct primitive for a new shape, `make()`'s (which throws where oneDNN makes none),
/// kept beside the layer's others in `kept` (the newest kKeptPrimitives); nullptr where make()
/// throws, the reason's first line in `why`.
template <class T, class Make>
std::shared_ptr<const T> make_kept(std::vector<std::shared_ptr<const T>>& kept, Make&& make,
                                   std::string* why) {
  try {
    std::shared_ptr<const T> p = make();
    if (kept.size() == kKeptPrimitives) kept.erase(kept.begin());
    kept.push_back(p);
    return p;
  } catch (const std::exception& e) {
    if (why) *why = first_line(e.what());
    return nullptr;
  }
}
/// Where oneDNN's library is not at hand, why (for a layer's refused candidates; nothing when
/// LOPPER_DNNL_LIBRARY=off asked for that).
void note_direct_unavailable(std::vector<std::string>& refused);

/// True when the CPU computes in bfloat16 natively (AVX512_BF16; every CPU with AMX has it too):
/// oneDNN's bf16 primitives then run at twice fp32's rate (AMX tiles where present). Without it
/// oneDNN would emulate bf16 with fp32 arithmetic plus conversions, slower than fp32 itself.
bool bf16_native();
/// True when libtorch has oneDNN and `x` is a CPU tensor that does not require grad, float32, or
/// bfloat16 on a CPU where that is native (bf16_native).
bool usable(const at::Tensor& x);

at::Tensor pack_conv2d_weight(const at::Tensor& w, at::IntArrayRef padding, at::IntArrayRef stride,
                              at::IntArrayRef dilation, int64_t groups, at::IntArrayRef input_size);
/// y = post(conv(x, w) + b)
at::Tensor conv2d(const at::Tensor& x, const at::Tensor& packed_w, const at::Tensor& bias,
                  at::IntArrayRef padding, at::IntArrayRef stride, at::IntArrayRef dilation,
                  int64_t groups, const PostOp& post);
/// y = post(conv(x, w) + b + other); `other` has y's shape.
at::Tensor conv2d_add(const at::Tensor& x, const at::Tensor& other, const at::Tensor& packed_w,
                      const at::Tensor& bias, at::IntArrayRef padding, at::IntArrayRef stride,
                      at::IntArrayRef dilation, int64_t groups, const PostOp& post);

/// w is [N, K]; `batch` is the expected number of rows (a layout hint).
at::Tensor pack_linear_weight(const at::Tensor& w, int64_t batch);
/// y = x @ w^T + b + other for 2-D x and other.
at::Tensor linear_add(const at::Tensor& x, const at::Tensor& other, const at::Tensor& packed_w,
                      const at::Tensor& bias);
/// y = post(x @ w^T + b) for 2-D x.
at::Tensor linear(const at::Tensor& x, const at::Tensor& packed_w, const at::Tensor& bias,
                  const PostOp& post);

}  // namespace lopper::ops::onednn
