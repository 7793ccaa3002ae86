// 3x3 convolutions of stride 1 by Winograd's minimal filtering, F(4x4, 3x3) (internal): a 4x4
// tile of outputs from a 6x6 window of inputs in 36 multiplies per channel pair instead of 144.
// Each thread takes blocks of tiles: the windows transformed (kernels/cpu/winograd_impl.h), 36
// matrix products of the block's tiles x input channels by the transformed weight's input x output
// channels (lopper's dense 1x1 kernel), the products transformed back with the bias, residual and
// activation. A quarter of the direct convolution's arithmetic where the maps tile evenly; the
// rounding differs from it by about 1e-6 of the output's scale (the transforms' constants reach 8).
// Timed per layer beside the direct kernel and oneDNN (ops/conv.cpp).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "kernels/cpu/conv.h"

namespace lopper::kernels::cpu {

class WinogradConv {
 public:
  /// Whether the kernel takes w with `group` groups and geometry g: a float32 CPU weight
  /// [k, c, 3, 3], one group, stride 1, no dilation (any padding).
  static bool takes(const at::Tensor& w, int64_t group, const DirectConv::Geometry& g);

  /// Transforms and packs w (see takes) and its bias [k] (optional, float32).
  WinogradConv(const at::Tensor& w, const at::Tensor& bias, DirectConv::Geometry g,
               Isa isa = active_isa());

  static constexpr const char* kName = "lopper-winograd";

  /// The 4x4 output tiles of n images of oh x ow outputs.
  static int64_t tiles(int64_t n, int64_t oh, int64_t ow) {
    return n * ((oh + 3) / 4) * ((ow + 3) / 4);
  }
  /// The fewest tiles for which the kernel is worth timing: each of the 36 transformed weight
  /// matrices (four times the direct kernel's weight) is read once per call, for as many rows as
  /// there are tiles; below 16 (a 7x7 map of one image has 4), the weight's traffic costs more than
  /// the arithmetic saved, and a per-layer timing with the weight warm in the cache hides it (a
  /// 256-channel 7x7 layer: 0.19 ms alone, 0.29-0.37 in the model, the direct kernel 0.30).
  static constexpr int64_t kMinTiles = 16;

  /// y [n, k, oh, ow] (channels-last) = act(conv(x) + bias + residual) for x [n, c, h, w] float32
  /// (read in place when channels-last or a channel slice of it); `residual` undefined or of y's
  /// shape.
  at::Tensor run(const at::Tensor& x, const at::Tensor& residual, Activation act) const;

 private:
  const ConvIsaOps* ops_;
  int64_t k_ = 0, c_ = 0;
  DirectConv::Geometry g_;
  int64_t per_pos_ = 0;        // floats of one position's packed [c -> k] matrix
  std::vector<float> packed_;  // 36 positions' matrices, each packed as a 1x1 convolution's
  std::vector<float> bias_;
};

}  // namespace lopper::kernels::cpu
