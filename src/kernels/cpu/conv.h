// Dense 2-D convolution of channels-last float32 activations by lopper's own kernels (internal):
// direct (every input channel) or depthwise (one input channel per output), the weight packed once
// for the widest ISA the CPU has, the bias, a residual add and a simple activation fused, the work
// split over ATen's threads. oneDNN is timed beside it per layer (ops/conv.cpp); these kernels win
// where oneDNN's per-call overhead and blocked layouts cost more than the arithmetic: small images,
// few or odd channel counts (what structured pruning leaves), depthwise layers.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "kernels/cpu/sparse.h"

namespace lopper::kernels::cpu {

struct ConvIsaOps;
struct ConvShape;
struct Epilogue;
/// The NHWC window kernels of `isa` (conv_isa.h).
const ConvIsaOps& conv_isa_ops(Isa isa);

/// y = act(x * scale[c] + shift[c]) for x [n, c, h, w] float32 channels-last on the CPU, in one
/// pass; y channels-last. scale and shift: c floats.
at::Tensor channel_affine_nhwc(const at::Tensor& x, const float* scale, const float* shift,
                               Activation act);
/// Whether xs are CPU [n, c_i, h, w] tensors of `type`, contiguous channels-last, of one n, h, w:
/// what the channel concatenation below reads without a copy.
bool channels_last_of_one_map(const std::vector<at::Tensor>& xs, at::ScalarType type = at::kFloat);
/// The same of the channel concatenation of xs (each [n, c_i, h, w] float32 channels-last on the
/// CPU, one n, h, w), without the concatenation itself: each input goes through the scale and
/// shift of its channels straight into its slice of y. scale and shift: sum c_i floats.
/// bfloat16 xs (act none or ReLU only) give a bfloat16 y, computed in float32 and rounded once.
at::Tensor concat_affine_nhwc(const std::vector<at::Tensor>& xs, const float* scale,
                              const float* shift, Activation act);
/// The distance between the adjacent pixels of x [n, c, h, w] when its pixels are evenly spaced in
/// (n, h, w) order and its channels adjacent (channels-last, or a channel slice of it); 0 when not.
int64_t pixel_stride(const at::Tensor& x);
/// A dense weight w [s.k][s.c][s.kh][s.kw] packed in bf16 pairs of input channels for
/// ops.run_pairs, or nothing where that kernel does not run it (an odd s.c, no bfloat16 dot
/// product for `isa`).
std::vector<uint32_t> conv_pairs(const ConvIsaOps& ops, Isa isa, const float* w,
                                 const ConvShape& s);
/// Throws lopper::Error "[kernels] WHAT wants float32 [n, C, h, w], got ..." unless x is that:
/// the input of the convolution kernel `what` ("the direct convolution") of `c` channels.
void check_conv_input(const at::Tensor& x, int64_t c, const char* what);
/// Whether xs are float32 CPU [n, c_i, h, w] tensors of one n, h, w whose channels are adjacent
/// and whose pixels are evenly spaced: channels-last, or a channel slice of such a tensor (what
/// Slice and Split of a channels-last activation give), read in place by concat_shuffle_nhwc.
bool pixel_rows_of_one_map(const std::vector<at::Tensor>& xs);
/// The channel shuffle of the channel concatenation of xs (ShuffleNet's, between its units):
/// y[:, j * groups + r] = cat(xs)[:, r * (c / groups) + j] for the c = sum c_i channels in
/// `groups` groups, in one pass, y channels-last. xs: see pixel_rows_of_one_map; groups divides c.
at::Tensor concat_shuffle_nhwc(const std::vector<at::Tensor>& xs, int64_t groups);

class DirectConv {
 public:
  struct Geometry {
    int64_t sh = 1, sw = 1, ph = 0, pw = 0, dh = 1, dw = 1;  // padding: both sides alike
  };
  /// Whether the kernels take w [k, c_per_group, kh, kw] with `group` groups over `in_channels`:
  /// a float32 CPU weight whose groups divide its input and output channels. Depthwise layers
  /// (group == in_channels == k) run the depthwise kernel; groups of 2, 4 or 8 channels in and
  /// out, fewer than a vector holds, the narrow-group kernel (a ResNeXt pruned to half); other
  /// groupings the dense kernel per group on its slice of the channels (RegNet's and ResNeXt's
  /// groups of 8 to 64 channels: copied a band of rows at a time, with the padding).
  static bool takes(const at::Tensor& w, int64_t group, int64_t in_channels);

  /// Packs w (see takes) and its bias [k] (optional, float32); with `bf16_pairs`, a dense or
  /// grouped layer's weight a second time for bfloat16 inputs (takes_bf16), for a model run in
  /// bf16.
  DirectConv(const at::Tensor& w, const at::Tensor& bias, int64_t group, Geometry g,
             Isa isa = active_isa(), bool bf16_pairs = false);

  bool depthwise() const { return depthwise_; }
  /// The groups the dense kernel runs one by one: 1 unless grouped and not depthwise.
  int64_t groups() const { return groups_; }
  /// "lopper-depthwise", "lopper-grouped" or "lopper-direct": the candidate's name per layer.
  const char* name() const;
  /// Whether its groups are copied a band of rows at a time with their padding (groups of up to
  /// kGatherMaxChannels, no dilation) — or, asked with `in_place`, read where they are. Neither
  /// wins everywhere (RegNet's 112x112 stride-2 grouped layers: in place 0.7x the time at batch 1,
  /// 1.3x at batch 32), so the executor times both per layer.
  bool gathers() const;
  /// y [n, k, oh, ow] (channels-last, x's type) = act(conv(x) + bias + residual) for x [n, c, h,
  /// w] float32 (made channels-last when it is not), or bfloat16 where takes_bf16(); `residual`
  /// undefined or of y's shape. in_place: groups read in place even where gathers().
  at::Tensor run(const at::Tensor& x, const at::Tensor& residual, Activation act,
                 bool in_place = false) const;
  /// Whether run also takes a bfloat16 x: a dense layer (any kernel, stride, padding and
  /// dilation) of an even channel count, or a grouped one (not depthwise, not narrow groups) of
  /// an even channel count a group, each group run in place on its slice of the channels, on a
  /// CPU with the bfloat16 dot product (AVX512_BF16), its weight packed in bf16 pairs of input
  /// channels too (ConvIsaOps::run_pairs). y is bfloat16 then (sums, residual and activation in
  /// float32, rounded once), the residual read as bf16; in_place does not apply.
  /// A first layer of up to kPlanarChannels channels (any count, dense, no dilation along rows)
  /// takes bfloat16 too: its NCHW planes by its kernel rows' taps in bf16 pairs
  /// (ConvIsaOps::planar_pairs_rows); a channels-last input or a residual widened to float32.
  bool takes_bf16() const { return !pairs_.empty() || !planar_pairs_.empty(); }
  /// Frees the float32 packing of a dense or grouped layer whose bf16 pairs are packed (a layer
  /// of a bf16 model, which runs bf16 x alone): a third of the memory the two packings hold. run()
  /// then refuses a float32 x. Nothing changes where the pairs are not packed.
  void keep_bf16_only();

 private:
  void run_groups(const float* x, float* y, const float* residual, const ConvShape& whole,
                  const Epilogue& e, bool in_place) const;
  at::Tensor run_bf16(const at::Tensor& x, const at::Tensor& residual, Activation act) const;
  // The layer's shape for n images of h x w (its output's rows and columns computed); throws
  // where the kernel reaches past the padded input.
  ConvShape shape_of(int64_t n, int64_t h, int64_t w) const;
  // Groups of up to kGatherMaxChannels input channels: each band of a group's rows copied with its
  // padding into at most kGatherBytes, then run as an unpadded input (conv.cpp).
  static constexpr int64_t kGatherMaxChannels = 64;
  static constexpr int64_t kGatherBytes = 24 << 10;
  void run_gathered(const float* x, float* y, const float* residual, const ConvShape& group,
                    int64_t per_group, const Epilogue& e) const;
  // An input of at most this many channels in NCHW (a network's first layer) is read from its
  // planes, not made channels-last.
  static constexpr int64_t kPlanarChannels = 4;
  // Layers of fewer multiply-adds run on the calling thread alone. On the bfloat16 dot product
  // (twice float32's rate) the bound is higher: 7x7 64 -> 16 3x3 (451 K) took 5.0-5.2 us on one
  // thread and 4.3-6.9 on two across runs of BM_ConvLopperBf16 (AMD EPYC Zen 4), 14x14 1x1 (200 K)
  // 3.1 and 5.4; 14x14 3x3 (1.8 M) 18.8 and 11.6-15.7.
  static constexpr int64_t kSerialMacs = 1 << 16, kSerialMacsBf16 = 1 << 19;

  const ConvIsaOps* ops_;
  bool depthwise_ = false;
  int64_t groups_ = 1;   // dense groups: the packed weight holds each group's in turn
  bool narrow_ = false;  // groups of a few channels: the narrow-group kernel (conv_isa.h)
  int64_t k_ = 0, c_ = 0, kh_ = 1, kw_ = 1;
  Geometry g_;
  std::vector<float> packed_, bias_;
  // A first layer of a few input channels (a planar input) has its weight packed a second way too,
  // for the kernel vectorised over output pixels (ConvIsaOps::planar_rows), kg channels a pass (0:
  // none).
  std::vector<float> planar_packed_;
  int planar_kg_ = 0;
  std::vector<uint32_t> pairs_;  // the weight in bf16 pairs of input channels
  bool bf16_only_ = false;       // keep_bf16_only(): packed_ freed
  // a first layer's weight in bf16 pairs of a kernel row's taps (ConvIsaOps::planar_pairs_rows)
  std::vector<uint32_t> planar_pairs_;
  int64_t pairs_group_ = 0;  // words of one group's pairs (groups_ > 1)
};

}  // namespace lopper::kernels::cpu
