#include "kernels/cpu/conv.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/cpu/bf16.h"
#include "kernels/cpu/conv_isa.h"
#include "kernels/cpu/parallel.h"
#include "lopper/error.h"

namespace lopper::kernels::cpu {
const ConvIsaOps& conv_isa_ops(Isa isa) {
  return for_isa(isa, kConvAvx512Ops, kConvAvx2Ops, kConvScalarOps);
}

bool channels_last_of_one_map(const std::vector<at::Tensor>& xs, at::ScalarType type) {
  for (const auto& x : xs)
    if (x.dim() != 4 || x.scalar_type() != type || !x.device().is_cpu() ||
        !x.is_contiguous(at::MemoryFormat::ChannelsLast) || x.size(0) != xs[0].size(0) ||
        x.size(2) != xs[0].size(2) || x.size(3) != xs[0].size(3))
      return false;
  return !xs.empty();
}

namespace {

// Items [t0, t1) of groups x tiles (group q's tiles numbered q * tiles on), each group's share one
// call fn(q, its first tile, its end tile).
template <class F>
void for_group_tiles(int64_t tiles, int64_t t0, int64_t t1, F&& fn) {
  for (int64_t t = t0; t < t1;) {
    const int64_t q = t / tiles, end = std::min(t1, (q + 1) * tiles);
    fn(q, t - q * tiles, end - q * tiles);
    t = end;
  }
}

// Group q's epilogue: its k outputs' share of the bias.
Epilogue group_epilogue(Epilogue e, int64_t q, int64_t k) {
  if (e.bias) e.bias += q * k;
  return e;
}

// y[p, k] = act(x[p, k] * scale[k] + shift[k]) for pixels [p0, p1) of c bfloat16 channels, x's
// pixels ldx apart, y's ldy; act none or ReLU (NaN kept), rounded to nearest even once.
// NOTE: plain loops the compiler vectorises, one build per ISA (memory-bound).
__attribute__((target_clones("arch=x86-64-v4", "avx2", "default"))) void affine_bf16(
    const uint16_t* x, int64_t ldx, uint16_t* y, int64_t ldy, const float* scale,
    const float* shift, int64_t c, int64_t p0, int64_t p1, bool relu) {
  for (int64_t p = p0; p < p1; ++p) {
    const uint16_t* xp = x + p * ldx;
    uint16_t* yp = y + p * ldy;
    for (int64_t k = 0; k < c; ++k) {
      float v = from_bf16(xp[k]) * scale[k] + shift[k];
      if (relu) v = v < 0.f ? 0.f : v;
      yp[k] = to_bf16(v);
    }
  }
}

}  // namespace

at::Tensor concat_affine_nhwc(const std::vector<at::Tensor>& xs_in, const float* scale,
                              const float* shift, Activation act) {
  constexpr auto kCl = at::MemoryFormat::ChannelsLast;
  LOPPER_CHECK(!xs_in.empty(), "[kernels] concat_affine_nhwc of no tensor");
  const bool bf16 = xs_in[0].scalar_type() == at::kBFloat16;
  LOPPER_CHECK(!bf16 || act.kind == Activation::kNone || act.kind == Activation::kRelu,
               "[kernels] concat_affine_nhwc in bfloat16 takes no activation or ReLU");
  std::vector<at::Tensor> xs;
  int64_t channels = 0;
  for (const auto& x : xs_in) {
    // float32 in any layout (made channels-last); bfloat16 channels-last already
    LOPPER_CHECK(x.dim() == 4 && x.scalar_type() == (bf16 ? at::kBFloat16 : at::kFloat) &&
                     x.device().is_cpu() && x.size(0) == xs_in[0].size(0) &&
                     x.size(2) == xs_in[0].size(2) && x.size(3) == xs_in[0].size(3) &&
                     (!bf16 || x.is_contiguous(kCl)),
                 "[kernels] concat_affine_nhwc wants float32 (or channels-last bfloat16) CPU [n, "
                 "c, h, w] of one type, n, h, w, got ",
                 x.scalar_type(), " ", x.sizes());
    xs.push_back(channels_last_layout(x));
    channels += x.size(1);
  }
  const at::Tensor& x0 = xs[0];
  at::Tensor y =
      at::empty({x0.size(0), channels, x0.size(2), x0.size(3)}, x0.options().memory_format(kCl));
  const int64_t pixels = x0.size(0) * x0.size(2) * x0.size(3);
  const ConvIsaOps& ops = conv_isa_ops(active_isa());
  void* yp = y.data_ptr();
  // Blocks of pixels, every input's slice of a block in turn: a block's output lines are
  // completed while in cache.
  constexpr int64_t kBlock = 32;
  const int64_t blocks = (pixels + kBlock - 1) / kBlock;
  const int64_t grain = std::max<int64_t>(1, (1 << 14) / std::max<int64_t>(channels * kBlock, 1));
  at::parallel_for(0, blocks, grain, [&](int64_t b0, int64_t b1) {
    const int64_t p0 = b0 * kBlock, p1 = std::min(pixels, b1 * kBlock);
    for (int64_t q = p0; q < p1; q += kBlock) {
      int64_t off = 0;
      for (const auto& x : xs) {
        const int64_t c = x.size(1), end = std::min(p1, q + kBlock);
        if (bf16) {
          affine_bf16(static_cast<const uint16_t*>(x.data_ptr()), c,
                      static_cast<uint16_t*>(yp) + off, channels, scale + off, shift + off, c, q,
                      end, act.kind == Activation::kRelu);
        } else {
          ops.channel_affine(x.data_ptr<float>(), c, static_cast<float*>(yp) + off, channels,
                             scale + off, c, q, end, to_epilogue(act, shift + off));
        }
        off += c;
      }
    }
  });
  return y;
}

int64_t pixel_stride(const at::Tensor& x) {
  if (x.size(1) > 1 && x.stride(1) != 1) return 0;
  const int64_t n = x.size(0), h = x.size(2), w = x.size(3);
  const int64_t s = w > 1 ? x.stride(3) : h > 1 ? x.stride(2) : n > 1 ? x.stride(0) : x.size(1);
  if (s < x.size(1) || (h > 1 && x.stride(2) != s * w) || (n > 1 && x.stride(0) != s * h * w))
    return 0;
  return s;
}

void check_conv_input(const at::Tensor& x, int64_t c, const char* what) {
  LOPPER_CHECK(x.dim() == 4 && x.size(1) == c && x.scalar_type() == at::kFloat, "[kernels] ", what,
               " wants float32 [n, ", c, ", h, w], got ", x.scalar_type(), " ", x.sizes());
}

bool pixel_rows_of_one_map(const std::vector<at::Tensor>& xs) {
  for (const auto& x : xs)
    if (x.dim() != 4 || x.scalar_type() != at::kFloat || !x.device().is_cpu() ||
        x.size(0) != xs[0].size(0) || x.size(2) != xs[0].size(2) || x.size(3) != xs[0].size(3) ||
        pixel_stride(x) == 0)
      return false;
  return !xs.empty();
}

at::Tensor concat_shuffle_nhwc(const std::vector<at::Tensor>& xs, int64_t groups) {
  constexpr auto kCl = at::MemoryFormat::ChannelsLast;
  LOPPER_CHECK(pixel_rows_of_one_map(xs),
               "[kernels] concat_shuffle_nhwc wants float32 CPU [n, c, h, w] of one n, h, w, "
               "channels adjacent and pixels evenly spaced");
  int64_t channels = 0;
  for (const auto& x : xs) channels += x.size(1);
  LOPPER_CHECK(groups >= 1 && channels % groups == 0, "[kernels] concat_shuffle_nhwc: ", groups,
               " groups do not divide ", channels, " channels");
  const at::Tensor& x0 = xs[0];
  at::Tensor y =
      at::empty({x0.size(0), channels, x0.size(2), x0.size(3)}, x0.options().memory_format(kCl));
  const int64_t pixels = x0.size(0) * x0.size(2) * x0.size(3), per = channels / groups;
  if (pixels == 0 || channels == 0) return y;
  // Where each concatenated channel is: its input's data at that channel, and the input's pixel
  // stride.
  std::vector<const float*> src(static_cast<size_t>(channels));
  std::vector<int64_t> stride(static_cast<size_t>(channels));
  std::vector<size_t> input(static_cast<size_t>(channels));
  for (size_t i = 0, k = 0; i < xs.size(); ++i) {
    const int64_t ld = pixel_stride(xs[i]);
    for (int64_t c = 0; c < xs[i].size(1); ++c, ++k) {
      src[k] = xs[i].data_ptr<float>() + c;
      stride[k] = ld;
      input[k] = i;
    }
  }
  // Two groups each from one input (ShuffleNet's: an input per group, or a group per half of one
  // input): vector zips of the two runs; anything else channel by channel.
  const size_t second = static_cast<size_t>(per);
  const bool zip = groups == 2 && input[0] == input[second - 1] &&
                   input[second] == input[static_cast<size_t>(channels) - 1];
  float* yp = y.data_ptr<float>();
  const ConvIsaOps& ops = conv_isa_ops(active_isa());
  const int64_t grain = std::max<int64_t>(1, (1 << 14) / channels);
  at::parallel_for(0, pixels, grain, [&](int64_t p0, int64_t p1) {
    if (zip) return ops.interleave(src[0], stride[0], src[second], stride[second], yp, per, p0, p1);
    for (int64_t p = p0; p < p1; ++p) {
      float* o = yp + p * channels;
      for (int64_t j = 0; j < per; ++j)
        for (int64_t r = 0; r < groups; ++r) {
          const size_t k = static_cast<size_t>(r * per + j);
          o[j * groups + r] = src[k][p * stride[k]];
        }
    }
  });
  return y;
}

at::Tensor channel_affine_nhwc(const at::Tensor& x, const float* scale, const float* shift,
                               Activation act) {
  return concat_affine_nhwc({x}, scale, shift, act);
}

std::vector<uint32_t> conv_pairs(const ConvIsaOps& ops, Isa isa, const float* w,
                                 const ConvShape& s) {
  std::vector<uint32_t> packed;
  if (s.c % 2 != 0 || ops.run_pairs == nullptr || !bf16_dot_supported(isa)) return packed;
  packed.resize(static_cast<size_t>(ops.pairs_packed_size(s)));
  ops.pack_pairs(w, s, packed.data());
  return packed;
}

bool DirectConv::takes(const at::Tensor& w, int64_t group, int64_t in_channels) {
  if (w.dim() != 4 || w.scalar_type() != at::kFloat || !w.device().is_cpu() || group < 1)
    return false;
  const bool depthwise = group > 1 && group == in_channels && w.size(0) == group;
  return in_channels % group == 0 && w.size(1) == in_channels / group && w.size(0) % group == 0 &&
         w.size(0) > 0 && (!depthwise || w.size(2) <= kDwMaxTaps);
}

const char* DirectConv::name() const {
  return depthwise_ ? "lopper-depthwise" : groups_ > 1 ? "lopper-grouped" : "lopper-direct";
}

DirectConv::DirectConv(const at::Tensor& w_in, const at::Tensor& bias, int64_t group, Geometry g,
                       Isa isa, bool bf16_pairs)
    : ops_(&conv_isa_ops(isa)), g_(g) {
  const at::Tensor w = w_in.contiguous();
  k_ = w.size(0), kh_ = w.size(2), kw_ = w.size(3);
  c_ = w.size(1) * group;
  LOPPER_CHECK(takes(w, group, c_), "[kernels] the direct convolution takes float32 weights whose ",
               "groups divide their channels, got group ", group, " ", w.sizes());
  depthwise_ = group > 1 && w.size(1) == 1 && k_ == group;
  groups_ = depthwise_ ? 1 : group;
  ConvShape s;
  s.c = c_ / groups_, s.k = k_ / groups_, s.kh = kh_, s.kw = kw_;
  // (the narrow kernel locates its taps' rows in an array of kDwMaxTaps, as the depthwise one)
  narrow_ = groups_ > 1 && s.c == s.k && kh_ <= kDwMaxTaps && ops_->narrow_takes(s.c);
  if (narrow_) {  // one packing of all groups, several to a vector
    s.k = k_;
    packed_.resize(static_cast<size_t>(ops_->narrow_packed_size(s)));
    ops_->narrow_pack(w.data_ptr<float>(), s, packed_.data());
  } else {  // each group's in turn
    const int64_t per_group = ops_->packed_size(s, depthwise_);
    packed_.resize(static_cast<size_t>(per_group * groups_));
    for (int64_t q = 0; q < groups_; ++q)
      ops_->pack(w.data_ptr<float>() + q * s.k * s.c * kh_ * kw_, s, depthwise_,
                 packed_.data() + q * per_group);
  }
  if (bias.defined()) {
    const at::Tensor b = bias.to(at::kFloat).contiguous();
    bias_.assign(b.data_ptr<float>(), b.data_ptr<float>() + b.numel());
  }
  // bf16 pairs: a dense layer's weight, or each group's in turn (groups of an even channel count
  // the narrow kernel does not run; none at all where a group's count is odd).
  if (bf16_pairs && !depthwise_ && !narrow_) {
    const int64_t group_floats = s.k * s.c * kh_ * kw_;  // one group's OIHW weight
    for (int64_t q = 0; q < groups_; ++q) {
      const std::vector<uint32_t> p =
          conv_pairs(*ops_, isa, w.data_ptr<float>() + q * group_floats, s);
      if (p.empty()) {
        pairs_.clear();
        break;
      }
      pairs_group_ = static_cast<int64_t>(p.size());
      pairs_.insert(pairs_.end(), p.begin(), p.end());
    }
  }
  // A planar first layer in a bf16 model: its kernel rows' taps in bf16 pairs, for bf16 planes.
  if (bf16_pairs && !depthwise_ && groups_ == 1 && c_ <= kPlanarChannels && g.dw == 1 &&
      kh_ <= kDwMaxTaps && ops_->planar_pack_pairs != nullptr && bf16_dot_supported(isa)) {
    ConvShape ps;
    ps.c = c_, ps.k = k_, ps.kh = kh_, ps.kw = kw_;
    planar_pairs_.resize(static_cast<size_t>(ops_->planar_pairs_size(ps)));
    ops_->planar_pack_pairs(w.data_ptr<float>(), ps, planar_pairs_.data());
  }
  if (!depthwise_ && groups_ == 1 && c_ <= kPlanarChannels && (g.sw == 1 || g.sw == 2) &&
      (planar_kg_ = ops_->planar_group(k_)) > 0) {
    ConvShape ps;
    ps.c = c_, ps.k = k_, ps.kh = kh_, ps.kw = kw_;
    const int64_t kp = (k_ + planar_kg_ - 1) / planar_kg_ * planar_kg_;
    planar_packed_.resize(static_cast<size_t>(kp * c_ * kh_ * kw_));
    ops_->planar_pack(w.data_ptr<float>(), ps, planar_kg_, planar_packed_.data());
  }
}

ConvShape DirectConv::shape_of(int64_t n, int64_t h, int64_t w) const {
  ConvShape s;
  s.n = n, s.c = c_, s.h = h, s.w = w;
  s.k = k_, s.kh = kh_, s.kw = kw_;
  s.sh = g_.sh, s.sw = g_.sw, s.ph = g_.ph, s.pw = g_.pw, s.dh = g_.dh, s.dw = g_.dw;
  // The padded input minus the kernel's reach (negative: no output; C++ division truncates).
  const int64_t spare_h = s.h + 2 * s.ph - s.dh * (s.kh - 1) - 1;
  const int64_t spare_w = s.w + 2 * s.pw - s.dw * (s.kw - 1) - 1;
  LOPPER_CHECK(spare_h >= 0 && spare_w >= 0,
               "[kernels] the convolution's kernel reaches past its padded input [", n, ", ", c_,
               ", ", h, ", ", w, "]");
  s.oh = spare_h / s.sh + 1;
  s.ow = spare_w / s.sw + 1;
  return s;
}

at::Tensor DirectConv::run_bf16(const at::Tensor& x_in, const at::Tensor& residual,
                                Activation act) const {
  constexpr auto kCl = at::MemoryFormat::ChannelsLast;
  LOPPER_CHECK(takes_bf16() && x_in.dim() == 4 && x_in.size(1) == c_ && x_in.device().is_cpu(),
               "[kernels] the direct convolution takes bfloat16 [n, ", c_,
               ", h, w] for a dense or grouped layer of an even channel count a group, or a "
               "first layer of up to ",
               kPlanarChannels, " channels, on a CPU with AVX512_BF16, got ", x_in.sizes());
  if (!planar_pairs_.empty() && !residual.defined() && x_in.is_contiguous()) {
    // A first layer's planes: each output row from its padded input rows, bf16 in and out.
    const ConvShape s = shape_of(x_in.size(0), x_in.size(2), x_in.size(3));
    at::Tensor y = at::empty({s.n, k_, s.oh, s.ow}, x_in.options().memory_format(kCl));
    if (y.numel() == 0) return y;
    ConvShape ps = s;
    ps.c_stride = s.h * s.w;
    const Epilogue e = to_epilogue(act, bias_.empty() ? nullptr : bias_.data());
    const auto* xp = reinterpret_cast<const uint16_t*>(x_in.data_ptr());
    auto* yp = reinterpret_cast<uint16_t*>(y.data_ptr());
    const int64_t rows = s.n * s.oh;
    const SerialScope serial(rows * s.ow * k_ * c_ * kh_ * kw_ < kSerialMacsBf16);
    parallel_steal(rows, steal_grain(rows), [&](int64_t r0, int64_t r1) {
      ops_->planar_pairs_rows(xp, planar_pairs_.data(), yp, ps, e, r0, r1);
    });
    return y;
  }
  if (pairs_.empty())  // a first layer's channels-last input, or a residual: in float32
    return narrow_to_bf16(run(widen_bf16(x_in), widen_bf16(residual), act));
  const at::Tensor x = x_in.contiguous(kCl);
  ConvShape s = shape_of(x.size(0), x.size(2), x.size(3));
  at::Tensor y = at::empty({s.n, k_, s.oh, s.ow}, x.options().memory_format(kCl));
  const at::Tensor r = residual_for(residual, y);  // bf16 too
  if (y.numel() == 0) return y;
  const Epilogue e = to_epilogue(act, bias_.empty() ? nullptr : bias_.data());
  const auto* xp = reinterpret_cast<const uint16_t*>(x.data_ptr());
  const auto* rp = r.defined() ? reinterpret_cast<const uint16_t*>(r.data_ptr()) : nullptr;
  auto* yp = reinterpret_cast<uint16_t*>(y.data_ptr());
  const SerialScope serial(s.n * s.oh * s.ow * k_ * (c_ / groups_) * kh_ * kw_ < kSerialMacsBf16);
  if (groups_ == 1) {
    const int64_t tiles = ops_->tiles(s, false);
    parallel_steal(tiles, steal_grain(tiles), [&](int64_t t0, int64_t t1) {
      ops_->run_pairs(xp, pairs_.data(), nullptr, yp, nullptr, rp, s, e, t0, t1);
    });
    return y;
  }
  // Groups: each a dense convolution of its slice of every pixel, read and written in place (the
  // whole tensor's channel strides); the threads split the tiles of every group.
  ConvShape g = s;
  g.c = c_ / groups_, g.k = k_ / groups_;
  g.x_stride = c_, g.y_stride = k_, g.r_stride = k_;
  const int64_t tiles = ops_->tiles(g, false), all = tiles * groups_;
  parallel_steal(all, steal_grain(all), [&](int64_t t0, int64_t t1) {
    for_group_tiles(tiles, t0, t1, [&](int64_t q, int64_t q0, int64_t q1) {
      ops_->run_pairs(xp + q * g.c, pairs_.data() + q * pairs_group_, nullptr, yp + q * g.k,
                      nullptr, rp ? rp + q * g.k : nullptr, g, group_epilogue(e, q, g.k), q0, q1);
    });
  });
  return y;
}

void DirectConv::keep_bf16_only() {
  if (pairs_.empty()) return;
  std::vector<float>().swap(packed_);
  bf16_only_ = true;
}

bool DirectConv::gathers() const {
  return groups_ > 1 && !narrow_ && c_ / groups_ <= kGatherMaxChannels && g_.dh == 1 && g_.dw == 1;
}

at::Tensor DirectConv::run(const at::Tensor& x_in, const at::Tensor& residual, Activation act,
                           bool in_place) const {
  if (x_in.scalar_type() == at::kBFloat16) return run_bf16(x_in, residual, act);
  constexpr auto kCl = at::MemoryFormat::ChannelsLast;
  LOPPER_CHECK(!bf16_only_,
               "[kernels] this direct convolution keeps its bf16 weight alone and "
               "takes bfloat16 x, got ",
               x_in.scalar_type());
  check_conv_input(x_in, c_, "the direct convolution");
  // A channel slice of a channels-last tensor (ShuffleNet's halves) is read in place, its pixels
  // ldx floats apart; so is an NCHW input of a few channels (a network's first layer, read from
  // its planes); anything else is made channels-last.
  int64_t ldx = pixel_stride(x_in);
  const bool planar =
      ldx == 0 && !depthwise_ && groups_ == 1 && c_ <= kPlanarChannels && x_in.is_contiguous();
  const at::Tensor x = ldx > 0 || planar ? x_in : channels_last_layout(x_in);
  if (ldx == 0) ldx = c_;
  ConvShape s = shape_of(x.size(0), x.size(2), x.size(3));
  s.x_stride = ldx;
  at::Tensor y = at::empty({s.n, s.k, s.oh, s.ow}, x.options().memory_format(kCl));
  const float* xp = x.data_ptr<float>();
  // A planar input stays planar: the kernel reads the planes (ConvShape::c_stride) one image at a
  // time. The dense kernel reads the input unpadded (the tiles at the border gather their windows).
  if (planar) s.x_stride = 1, s.c_stride = s.h * s.w;
  const at::Tensor r = residual_for(residual, y);
  if (y.numel() == 0) return y;  // an empty batch (or map): nothing to compute
  const Epilogue e = to_epilogue(act, bias_.empty() ? nullptr : bias_.data());
  const float* rp = r.defined() ? r.data_ptr<float>() : nullptr;
  float* yp = y.data_ptr<float>();
  // NOTE: a layer of a few thousand multiply-adds (a squeeze-and-excitation block's 1x1 layers on
  // a 1x1 map) runs on this thread: fifty 1x1 layers of 16 channels on 4x4 maps took 2.48 us
  // each on two threads, 1.34 on one.
  const int64_t per_output = (depthwise_ ? 1 : c_ / groups_) * kh_ * kw_;
  const SerialScope serial(s.n * s.oh * s.ow * k_ * per_output < kSerialMacs);
  if (groups_ > 1) {
    run_groups(xp, yp, rp, s, e, in_place);
    return y;
  }
  // The tiles of one call of the kernels (s.n images from x into y), split between the threads.
  auto run_tiles = [&](const float* xp, float* yp, const float* rp, const ConvShape& s) {
    const int64_t tiles = ops_->tiles(s, depthwise_);
    if (depthwise_ || conv_pixel_major(s)) {  // tiles of equal cost, or whole groups of blocks
      parallel_steal(tiles, steal_grain(tiles), [&](int64_t t0, int64_t t1) {
        ops_->run(xp, packed_.data(), yp, rp, s, depthwise_, e, t0, t1);
      });
      return;
    }
    // NOTE: the dense tiles' cost is their block's vectors, and the last block may have fewer (64
    // channels in blocks of 3 x 16: 3 + 1): split by cost, not by count, or one thread does 3/4.
    const int64_t kv = (s.k + ops_->width - 1) / ops_->width;  // vectors of output channels
    const int64_t nv = ops_->block_vectors, blocks = (kv + nv - 1) / nv;
    const int64_t groups = tiles / blocks, total = groups * kv;
    auto tile_at = [&](int64_t cost) {  // the first tile that starts at or after `cost`
      const int64_t b = std::min(cost / (groups * nv), blocks - 1);
      const int64_t in_block = cost - b * groups * nv, block_nv = std::min(nv, kv - b * nv);
      return std::min(tiles, b * groups + (in_block + block_nv - 1) / block_nv);
    };
    const int64_t parts = std::min<int64_t>(kStealParts * at::get_num_threads(), tiles);
    parallel_steal(parts, 1, [&](int64_t q0, int64_t q1) {
      for (int64_t q = q0; q < q1; ++q) {
        const int64_t t0 = tile_at(total * q / parts), t1 = tile_at(total * (q + 1) / parts);
        if (t0 < t1) ops_->run(xp, packed_.data(), yp, rp, s, depthwise_, e, t0, t1);
      }
    });
  };
  if (!planar) {
    run_tiles(xp, yp, rp, s);
    return y;
  }
  if (planar_kg_ > 0 && rp == nullptr && s.ow >= ops_->width) {
    const int64_t rows = s.n * s.oh;
    parallel_steal(rows, steal_grain(rows), [&](int64_t r0, int64_t r1) {
      ops_->planar_rows(xp, planar_packed_.data(), planar_kg_, yp, s, e, r0, r1);
    });
    return y;
  }
  ConvShape one = s;  // planes are one image's: the kernels take them an image at a time
  one.n = 1;
  const int64_t in_image = s.c * s.h * s.w, out_image = s.oh * s.ow * s.k;
  for (int64_t img = 0; img < s.n; ++img)
    run_tiles(xp + img * in_image, yp + img * out_image, rp ? rp + img * out_image : nullptr, one);
  return y;
}

// NOTE: a group of few channels is a line or two of each pixel, one line in 18 of the input (288
// channels in groups of 16): read in place, each tile touched the padding (a 14-wide row in tiles
// of 7 pixels) and checked each tap of each pixel, and a group's lines shared a half of L1's sets.
// Copied first, a band of the group's rows is [rows][columns][channels] with its padding, a few KB
// that stay in L1: the plain kernel reads a kernel row's taps as one run. Items: bands x groups,
// groups innermost (a thread reads each pixel's lines one group after another).
void DirectConv::run_gathered(const float* xp, float* yp, const float* rp, const ConvShape& s,
                              int64_t per_group, const Epilogue& e) const {
  const int64_t cg = s.c, kg = s.k;
  const int64_t cols = (s.ow - 1) * s.sw + s.kw;  // the input columns of a row, padding included
  const int64_t row_floats = cols * cg;
  // Output rows a band: its input rows ((rows - 1) * sh + kh) fit kGatherBytes.
  const int64_t fit = kGatherBytes / int64_t(sizeof(float)) / row_floats;
  const int64_t rows = std::clamp<int64_t>((fit - s.kh) / s.sh + 1, 1, s.oh);
  const int64_t bands = (s.oh + rows - 1) / rows, items = s.n * bands * groups_;
  parallel_steal(items, steal_grain(items), [&](int64_t i0, int64_t i1) {
    thread_local std::vector<float> buf;
    for (int64_t item = i0; item < i1; ++item) {
      const int64_t q = item % groups_, band = item / groups_ % bands, img = item / groups_ / bands;
      const int64_t oy0 = band * rows, oy1 = std::min(s.oh, oy0 + rows);
      const int64_t in_rows = (oy1 - oy0 - 1) * s.sh + s.kh, iy0 = oy0 * s.sh - s.ph;
      const size_t need = static_cast<size_t>(in_rows * row_floats);
      if (buf.size() < need) buf.resize(need);
      float* b = buf.data();
      for (int64_t r = 0; r < in_rows; ++r) {
        const int64_t iy = iy0 + r;
        float* dst = b + r * row_floats;
        if (iy < 0 || iy >= s.h) {
          std::fill(dst, dst + row_floats, 0.f);
          continue;
        }
        const float* src = xp + ((img * s.h + iy) * s.w) * s.x_stride + q * cg;
        // NOTE: copied 16 floats at a time where the group holds whole lines (a call of memcpy
        // per pixel cost 5% of the layer, a loop of unknown length 10%).
        for (int64_t j = 0; j < cols; ++j, dst += cg) {
          const int64_t ix = j - s.pw;
          if (ix < 0 || ix >= s.w) {
            std::fill(dst, dst + cg, 0.f);
            continue;
          }
          const float* from = src + ix * s.x_stride;
          if (cg % 16 == 0) {
            for (int64_t c = 0; c < cg; c += 16) std::memcpy(dst + c, from + c, 16 * sizeof(float));
          } else {
            std::copy(from, from + cg, dst);
          }
        }
      }
      ConvShape g = s;
      g.n = 1, g.h = in_rows, g.w = cols, g.ph = g.pw = 0, g.oh = oy1 - oy0;
      g.x_stride = cg;
      const int64_t at = (img * s.oh + oy0) * s.ow * k_ + q * kg;
      ops_->run(b, packed_.data() + q * per_group, yp + at, rp ? rp + at : nullptr, g, false,
                group_epilogue(e, q, kg), 0, ops_->tiles(g, false));
    }
  });
}

// NOTE: each group is a dense convolution of its own channels: the same kernel on the group's
// slice of every pixel (x, y and the residual are read and written with the whole tensor's
// channel strides). The threads split the pixels and run every group on their pixels, a few tiles
// at a time: a thread reads whole pixels, the rows it padded, not every other cache line of the
// whole image. Too few tiles to split (a 7x7 map is 7 tiles): the threads split the groups.
void DirectConv::run_groups(const float* xp, float* yp, const float* rp, const ConvShape& whole,
                            const Epilogue& e, bool in_place) const {
  if (narrow_) {
    const int64_t tiles = ops_->narrow_tiles(whole);
    parallel_steal(tiles, steal_grain(tiles), [&](int64_t t0, int64_t t1) {
      ops_->narrow_run(xp, packed_.data(), yp, rp, whole, c_ / groups_, e, t0, t1);
    });
    return;
  }
  ConvShape s = whole;
  s.c = c_ / groups_, s.k = k_ / groups_;
  s.x_stride = whole.x_stride, s.y_stride = k_, s.r_stride = k_;
  const int64_t per_group = static_cast<int64_t>(packed_.size()) / groups_;
  if (gathers() && !in_place) {
    run_gathered(xp, yp, rp, s, per_group, e);
    return;
  }
  const int64_t tiles = ops_->tiles(s, false);
  auto run = [&](int64_t q, int64_t t0, int64_t t1) {
    ops_->run(xp + q * s.c, packed_.data() + q * per_group, yp + q * s.k,
              rp ? rp + q * s.k : nullptr, s, false, group_epilogue(e, q, s.k), t0, t1);
  };
  if (tiles >= 8 * at::get_num_threads()) {
    constexpr int64_t kChunk = 4;  // tiles of one group per call
    parallel_steal(tiles, kChunk, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; t += kChunk)
        for (int64_t q = 0; q < groups_; ++q) run(q, t, std::min(t1, t + kChunk));
    });
    return;
  }
  parallel_steal(tiles * groups_, steal_grain(tiles * groups_),
                 [&](int64_t t0, int64_t t1) { for_group_tiles(tiles, t0, t1, run); });
}

}  // namespace lopper::kernels::cpu
