// 3x3 convolutions of stride 1 by Winograd's minimal filtering, F(4x4, 3x3) (internal): a 4x4
// tile of outputs from a 6x6 window of inputs in 36 multiplies per channel pair instead of 144.
// Grouped convolutions too: the transforms are per channel, the products per group.
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
  /// [k, c / group, 3, 3], stride 1, no dilation (any padding); grouped with at least
  /// kMinGroupChannels input channels a group (RegNet's 8-16, ResNeXt's 4-32; not depthwise).
  static bool takes(const at::Tensor& w, int64_t group, const DirectConv::Geometry& g);
  /// Fewer input channels a group make products too small for the dense kernel's calls.
  static constexpr int64_t kMinGroupChannels = 4;

  /// Transforms and packs w (see takes) and its bias [k] (optional, float32).
  WinogradConv(const at::Tensor& w, const at::Tensor& bias, int64_t group, DirectConv::Geometry g,
               Isa isa = active_isa());

  static constexpr const char* kName = "lopper-winograd";

  /// The 4x4 output tiles of n images of oh x ow outputs.
  static int64_t tiles(int64_t n, int64_t oh, int64_t ow) {
    return n * ((oh + 3) / 4) * ((ow + 3) / 4);
  }
  /// Whether the kernel is worth timing on a call of `tiles` tiles in `group` groups. Each of the
  /// 36 transformed weight matrices (four times the direct kernel's weight in all) is read once
  /// per call for as many rows as there are tiles, from memory in the model, where a per-layer
  /// timing with the weight warm in the cache does not see it:
  /// - dense, at least 16 tiles (a 7x7 map of one image has 4: a 512-channel layer was faster
  ///   alone and slower in the model; a 14x14 map of one image has 16, and wins with a cold cache
  ///   too: 128 channels 0.20 vs 0.32 ms);
  /// - grouped, at least 128 (a group's product is a sliver: RegNet's 14x14x288 in groups of 16
  ///   was 0.08 vs 0.09 ms alone, 0.21 vs 0.11 in the model; with a cold cache, 64 tiles lost and
  ///   98 tied, 196 won by 1.2x and batch 32's 512 by 1.35x);
  /// - dense in a bf16 model whose other kernels run on the CPU's bfloat16 dot product (`bf16_dot`:
  ///   twice the float32 rate on a weight of half the bytes, where Winograd's stays float32), at
  ///   least 32: ResNet-18's 14x14 256-channel layers (16 tiles) took 0.75-0.85 ms in the model
  ///   against oneDNN's bf16 0.53 after 0.46 against 0.54 alone; its 28x28 128-channel ones (49)
  ///   0.50 against 0.54 in the model (AMD EPYC Zen 4, batch 1); and at least 4096 tiles x
  ///   output channels (`outputs`). Alone, Winograd won DenseNet-121's 28x28 128 -> 32 layers
  ///   (49 x 32) 0.10 ms against the direct kernel's 0.13, and lost them in the model: 0.157-0.174
  ///   against 0.141-0.149 (three runs with each forced); a structured-pruned DenseNet's 64 -> 16
  ///   (49 x 16) likewise (0.0376 against 0.0396 alone, 0.046-0.07 against 0.041-0.043 in the
  ///   model); DenseNet-121's 56x56 128 -> 32 layers (196 x 32) and ResNet's 28x28 128 -> 128
  ///   (49 x 128) kept their lead in the model.
  static bool pays(int64_t group, int64_t tiles, bool bf16_dot = false, int64_t outputs = 0) {
    if (bf16_dot && group == 1 && tiles * outputs < kMinTileOutputsBf16) return false;
    return tiles >= (group > 1 ? kMinGroupedTiles : bf16_dot ? kMinTilesBf16 : kMinTiles);
  }
  static constexpr int64_t kMinTiles = 16, kMinTilesBf16 = 32, kMinGroupedTiles = 128;
  static constexpr int64_t kMinTileOutputsBf16 = 4096;

  /// y [n, k, oh, ow] (channels-last, x's type) = act(conv(x) + bias + residual) for x [n, c, h,
  /// w] float32 (read in place when channels-last or a channel slice of it) or bfloat16 (widened as
  /// read, y rounded once as written: float32 arithmetic); `residual` undefined or of y's shape.
  at::Tensor run(const at::Tensor& x, const at::Tensor& residual, Activation act) const;

 private:
  const ConvIsaOps* ops_;
  int64_t groups_ = 1;
  int64_t k_ = 0, c_ = 0;
  DirectConv::Geometry g_;
  int64_t per_pos_ = 0;        // floats of one position's packed matrix of one group
  std::vector<float> packed_;  // [36][groups] matrices, each packed as a 1x1 convolution's
  std::vector<float> bias_;
};

}  // namespace lopper::kernels::cpu
