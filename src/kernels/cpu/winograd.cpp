#include "kernels/cpu/winograd.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>

#include "kernels/cpu/conv_isa.h"
#include "kernels/cpu/sparse.h"
#include "lopper/error.h"

namespace lopper::kernels::cpu {
namespace {
constexpr int64_t kAlpha = 6, kPositions = kAlpha * kAlpha;

// G of F(4x4, 3x3): the kernel's transform U = G g G^T (winograd_impl.h has B^T and A^T).
constexpr double kG[kAlpha][3] = {{1.0 / 4, 0, 0},
                                  {-1.0 / 6, -1.0 / 6, -1.0 / 6},
                                  {-1.0 / 6, 1.0 / 6, -1.0 / 6},
                                  {1.0 / 24, 1.0 / 12, 1.0 / 6},
                                  {1.0 / 24, -1.0 / 12, 1.0 / 6},
                                  {0, 0, 1}};

int64_t round_up(int64_t a, int64_t b) { return (a + b - 1) / b * b; }

// The matrix product of one position: tiles x c by c x k, as a 1x1 convolution over a row of
// `tiles` pixels.
ConvShape product_shape(int64_t tiles, int64_t c, int64_t k, int64_t ldv, int64_t ldm) {
  ConvShape g;
  g.n = 1, g.h = 1, g.w = tiles, g.c = c;
  g.oh = 1, g.ow = tiles, g.k = k;
  g.x_stride = ldv, g.y_stride = ldm;
  return g;
}
}  // namespace

bool WinogradConv::takes(const at::Tensor& w, int64_t group, const DirectConv::Geometry& g) {
  return w.dim() == 4 && w.scalar_type() == at::kFloat && w.device().is_cpu() && group >= 1 &&
         w.size(0) % group == 0 && (group == 1 || w.size(1) >= kMinGroupChannels) &&
         w.size(2) == 3 && w.size(3) == 3 && g.sh == 1 && g.sw == 1 && g.dh == 1 && g.dw == 1;
}

WinogradConv::WinogradConv(const at::Tensor& w_in, const at::Tensor& bias, int64_t group,
                           DirectConv::Geometry g, Isa isa)
    : ops_(&conv_isa_ops(isa)), groups_(group), g_(g) {
  LOPPER_CHECK(takes(w_in, group, g), "[kernels] Winograd F(4x4, 3x3) takes a float32 ",
               "[k, c / group, 3, 3] weight of stride 1 without dilation, got ", w_in.scalar_type(),
               " ", w_in.sizes(), " in ", group, " groups");
  const at::Tensor w = w_in.contiguous();
  const int64_t gc = w.size(1), gk = w.size(0) / group;
  k_ = w.size(0), c_ = gc * group;
  const float* wp = w.data_ptr<float>();
  const ConvShape one = product_shape(1, gc, gk, gc, gk);
  per_pos_ = ops_->packed_size(one, false);
  // U = G g G^T for every (k, c) pair, in double, laid out per position as [k][c / group]: the
  // rows of group q are [gk][gc] from row q * gk, a 1x1 weight.
  std::vector<float> u(static_cast<size_t>(kPositions * k_ * gc));
  for (int64_t kc = 0; kc < k_ * gc; ++kc) {
    const float* gw = wp + kc * 9;
    double gg[kAlpha][3];  // G g
    for (int i = 0; i < kAlpha; ++i)
      for (int j = 0; j < 3; ++j)
        gg[i][j] = kG[i][0] * gw[j] + kG[i][1] * gw[3 + j] + kG[i][2] * gw[6 + j];
    for (int i = 0; i < kAlpha; ++i)
      for (int j = 0; j < kAlpha; ++j)
        u[(i * kAlpha + j) * k_ * gc + kc] =
            static_cast<float>(gg[i][0] * kG[j][0] + gg[i][1] * kG[j][1] + gg[i][2] * kG[j][2]);
  }
  packed_.assign(static_cast<size_t>(kPositions * group * per_pos_), 0.f);
  for (int64_t pos = 0; pos < kPositions; ++pos)
    for (int64_t q = 0; q < group; ++q)
      ops_->pack(u.data() + (pos * k_ + q * gk) * gc, one, false,
                 packed_.data() + (pos * group + q) * per_pos_);
  if (bias.defined()) {
    const at::Tensor b = bias.to(at::kFloat).contiguous();
    bias_.assign(b.data_ptr<float>(), b.data_ptr<float>() + b.numel());
  }
}

at::Tensor WinogradConv::run(const at::Tensor& x_in, const at::Tensor& residual,
                             Activation act) const {
  constexpr auto kCl = at::MemoryFormat::ChannelsLast;
  // NOTE: a bfloat16 x (--precision bf16) is widened as the input transform reads it, and y, with
  // a bf16 residual, rounded as the output transform writes it: no whole-tensor conversions.
  const bool bf16 = x_in.scalar_type() == at::kBFloat16;
  int64_t ldx = 0;
  if (bf16)
    LOPPER_CHECK(x_in.dim() == 4 && x_in.size(1) == c_ && x_in.device().is_cpu(),
                 "[kernels] the Winograd convolution wants [n, ", c_, ", h, w], got ",
                 x_in.sizes());
  else
    check_conv_input(x_in, c_, "the Winograd convolution"), ldx = pixel_stride(x_in);
  const at::Tensor x = ldx > 0 ? x_in : bf16 ? x_in.contiguous(kCl) : channels_last_layout(x_in);
  if (ldx == 0) ldx = c_;
  ConvShape s;
  s.n = x.size(0), s.c = c_, s.h = x.size(2), s.w = x.size(3), s.x_stride = ldx;
  s.k = k_, s.kh = s.kw = 3, s.ph = g_.ph, s.pw = g_.pw;
  s.oh = s.h + 2 * s.ph - 2, s.ow = s.w + 2 * s.pw - 2;
  LOPPER_CHECK(s.oh > 0 && s.ow > 0, "[kernels] the convolution's kernel reaches past its ",
               "padded input ", x.sizes());
  at::Tensor y = at::empty({s.n, s.k, s.oh, s.ow}, x.options().memory_format(kCl));
  const at::Tensor r = residual_for(residual, y);
  if (y.numel() == 0) return y;  // an empty batch (or map): nothing to compute
  const Epilogue e = to_epilogue(act, bias_.empty() ? nullptr : bias_.data());
  const auto* xp = static_cast<const char*>(x.data_ptr());
  const void* rp = r.defined() ? r.data_ptr() : nullptr;
  void* yp = y.data_ptr();
  const int64_t elem = bf16 ? 2 : 4;  // bytes a value of x

  // NOTE: a block's transformed windows and products (36 x tiles x channels each) stay in about
  // half an L2; blocks of at least 8 tiles (the dense kernel's pixels per call) and no more than
  // 64, as many blocks as threads where the tiles allow. Too few tiles for the threads (a 14x14 map
  // of one image): the threads split the output channels instead (whole blocks of the dense
  // kernel, or whole groups), each transforming the windows of the input channels it reads, so
  // that each reads only its share of the 36 weight matrices. A group's channels need not start
  // on a vector: one vector of slack past the channels keeps a group's last vector inside its
  // tile's row.
  const int64_t width = ops_->width, nb = width * ops_->block_vectors;
  const int64_t gc = c_ / groups_, gk = k_ / groups_, slack = groups_ > 1 ? width : 0;
  const int64_t ldv = round_up(c_, width) + slack, ldm = round_up(k_, width) + slack;
  const int64_t tiles = WinogradConv::tiles(s.n, s.oh, s.ow);
  const int64_t threads = at::get_num_threads();
  int64_t tb =
      std::clamp<int64_t>((512 << 10) / int64_t(sizeof(float)) / (kPositions * (ldv + ldm)), 8, 64);
  tb = std::min({tb, std::max<int64_t>(8, (tiles + threads - 1) / threads), tiles});
  // As many blocks as a multiple of the threads, of equal size (49 tiles in blocks of 22 were 3
  // blocks: one thread did two, the other waited a third of the time).
  int64_t blocks = (tiles + tb - 1) / tb;
  if (blocks > 1) {
    blocks = (blocks + threads - 1) / threads * threads;
    tb = (tiles + blocks - 1) / blocks;
    blocks = (tiles + tb - 1) / tb;
  }
  const int64_t units = groups_ > 1 ? groups_ : (k_ + nb - 1) / nb;  // what a split divides
  const int64_t unit_k = groups_ > 1 ? gk : nb;
  const int64_t ksplit = blocks >= threads ? 1 : std::min(units, (threads + blocks - 1) / blocks);
  at::parallel_for(0, blocks * ksplit, 1, [&](int64_t i0, int64_t i1) {
    // NOTE: each thread keeps its scratch from call to call: a fresh half megabyte per call
    // costs its page faults again (a 56x56 layer ran 1.3x slower in the model than alone).
    thread_local std::vector<float> scratch;
    const size_t need = static_cast<size_t>(kPositions * tb * (ldv + ldm));
    if (scratch.size() < need) scratch.resize(need);
    float* v = scratch.data();
    float* m = v + kPositions * tb * ldv;
    int64_t windows = -1;  // the item whose windows v holds
    for (int64_t item = i0; item < i1; ++item) {
      const int64_t blk = item / ksplit, part = item % ksplit;
      const int64_t t0 = blk * tb, nt = std::min(tb, tiles - t0);
      const int64_t u0 = units * part / ksplit, u1 = units * (part + 1) / ksplit;
      const int64_t k0 = u0 * unit_k, k1 = std::min(k_, u1 * unit_k);
      if (k0 >= k1) continue;
      // The input channels this item reads: all of them, or its groups'.
      const int64_t c0 = groups_ > 1 ? u0 * gc : 0, c1 = groups_ > 1 ? u1 * gc : c_;
      const int64_t key = groups_ > 1 ? item : blk;
      if (windows != key) {
        ConvShape part_s = s;
        part_s.c = c1 - c0;
        ops_->wino_input(xp + c0 * elem, bf16, part_s, t0, nt, v + c0, ldv);
      }
      windows = key;
      if (groups_ == 1) {
        const ConvShape ps = product_shape(nt, c_, k1 - k0, ldv, ldm);
        const int64_t ptiles = ops_->tiles(ps, false);
        for (int64_t pos = 0; pos < kPositions; ++pos)
          ops_->run(v + pos * nt * ldv, packed_.data() + pos * per_pos_ + k0 * c_,
                    m + pos * nt * ldm + k0, nullptr, ps, false, Epilogue{}, 0, ptiles);
      } else {
        ops_->wino_products(v, ldv, packed_.data(), per_pos_, groups_, m, ldm, nt, gc, gk, u0, u1);
      }
      ops_->wino_output(m, ldm, s, t0, nt, k0, k1, yp, rp, bf16, e);
    }
  });
  return y;
}

}  // namespace lopper::kernels::cpu
