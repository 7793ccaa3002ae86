// An inverted residual's or a ResNeXt bottleneck's convolutions in one pass over the image's rows
// (internal): MobileNetV2's, MnasNet's, EfficientNet's and MobileNetV3's pointwise expansion,
// depthwise convolution and pointwise projection, and ResNeXt's 1x1 reduction, grouped 3x3
// convolution of a few channels a group (the narrow-group kernel's) and 1x1 expansion. Layer by
// layer, the middle activations go to memory and back twice; here each thread runs a band of
// output rows, makes the rows the middle convolution reads into a ring of kernel-height rows, and
// sends each of its output rows straight through the last 1x1 convolution, so that the middle
// activations stay in L1 and L2.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <vector>

#include "kernels/cpu/conv.h"

namespace lopper::kernels::cpu {

class ConvChain {
 public:
  /// A 1x1 convolution of stride 1 without padding: w [k, c, 1, 1] float32, b [k] or undefined.
  struct Pointwise {
    at::Tensor w, b;
    Activation act;
  };
  /// Whether the kernels of `isa` take the chain: at least two of the three convolutions
  /// (`alone`: the middle one may be alone, a bf16 layer run row by row), float32 CPU weights,
  /// the middle one w [m, g, kh, kw] (kh at most kDwMaxTaps) of m / g groups between an
  /// expansion to m channels and a projection from them: depthwise (g = 1), or groups of g
  /// channels in and out that the narrow-group kernel runs (ConvIsaOps::narrow_takes).
  static bool takes(const Pointwise* expand, const at::Tensor& dw, const Pointwise* project,
                    bool alone = false, Isa isa = active_isa());

  /// `bf16_pairs`: the 1x1 stages' weights (and a narrow-group middle one's) packed a second time
  /// for bf16 rows (pairs()), for a model run in bf16.
  ConvChain(const std::optional<Pointwise>& expand, const at::Tensor& dw_w, const at::Tensor& dw_b,
            DirectConv::Geometry g, Activation dw_act, const std::optional<Pointwise>& project,
            Isa isa = active_isa(), bool bf16_pairs = false);

  /// y [n, k, oh, ow] channels-last for x [n, c, h, w] float32, or bfloat16 (y bfloat16 too,
  /// sums in float32: see pairs()); `residual` undefined or of y's shape, added by the last
  /// convolution before its activation.
  at::Tensor run(const at::Tensor& x, const at::Tensor& residual) const;
  /// Whether a bfloat16 run multiplies by the CPU's bfloat16 dot product (AVX512_BF16): each 1x1
  /// stage with an even count of input channels, on its bf16 input rows (the projection's, the
  /// middle stage's output, rounded to bf16 first), weights rounded to bf16; a narrow-group middle
  /// stage too where both 1x1 stages do (the expanded rows kept in bf16). Otherwise, and in the
  /// other stages, bf16 rows are widened on the way in and rounded on the way out.
  bool pairs() const;

 private:
  struct Stage {
    std::vector<float> packed, bias;
    // bf16 pairs for bf16 rows, where the CPU has the dot product: a 1x1 stage's (run_pairs), a
    // narrow-group middle stage's (narrow_row_pairs)
    std::vector<uint32_t> pairs;
    Activation act;
    int64_t c = 0, k = 0;
  };
  // A 1x1 stage, or (`middle`) the middle one: depthwise, or narrow groups (group_width_ > 1).
  Stage pack(const at::Tensor& w, const at::Tensor& b, Activation act, bool middle,
             bool bf16_pairs) const;

  const ConvIsaOps* ops_;
  Isa isa_;
  std::optional<Stage> expand_, project_;
  Stage dw_;                 // the middle convolution
  int64_t group_width_ = 1;  // its channels a group: 1 (depthwise), or the narrow kernel's
  int64_t kh_ = 1, kw_ = 1;
  DirectConv::Geometry g_;
};

}  // namespace lopper::kernels::cpu
