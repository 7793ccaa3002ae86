#include "kernels/cpu/chain.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "kernels/cpu/bf16.h"
#include "kernels/cpu/conv_isa.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/sparse.h"
#include "lopper/error.h"

namespace lopper::kernels::cpu {
namespace {

bool pointwise_weight(const at::Tensor& w) {
  return w.dim() == 4 && w.scalar_type() == at::kFloat && w.device().is_cpu() && w.size(2) == 1 &&
         w.size(3) == 1 && w.size(0) > 0 && w.size(1) > 0;
}

}  // namespace

bool ConvChain::takes(const Pointwise* expand, const at::Tensor& dw, const Pointwise* project,
                      bool alone, Isa isa) {
  if (!alone && (expand != nullptr) + (project != nullptr) < 1) return false;
  if (dw.dim() != 4 || dw.scalar_type() != at::kFloat || !dw.device().is_cpu() || dw.size(0) < 1 ||
      dw.size(1) < 1 || dw.size(2) > kDwMaxTaps)
    return false;
  const int64_t m = dw.size(0), g = dw.size(1);
  if (g > 1 && !(m % g == 0 && conv_isa_ops(isa).narrow_takes(g))) return false;
  if (expand && !(pointwise_weight(expand->w) && expand->w.size(0) == m)) return false;
  return !project || (pointwise_weight(project->w) && project->w.size(1) == m);
}

ConvChain::Stage ConvChain::pack(const at::Tensor& w_in, const at::Tensor& b, Activation act,
                                 bool middle, bool bf16_pairs) const {
  const at::Tensor w = w_in.contiguous();
  const bool narrow = middle && group_width_ > 1, depthwise = middle && !narrow;
  Stage st;
  st.k = w.size(0);
  st.c = middle ? st.k : w.size(1);
  ConvShape s;
  s.c = narrow ? group_width_ : st.c, s.k = st.k, s.kh = w.size(2), s.kw = w.size(3);
  st.packed.resize(narrow ? ops_->narrow_packed_size(s) : ops_->packed_size(s, depthwise));
  if (narrow)
    ops_->narrow_pack(w.data_ptr<float>(), s, st.packed.data());
  else
    ops_->pack(w.data_ptr<float>(), s, depthwise, st.packed.data());
  if (b.defined()) {
    const at::Tensor bc = b.to(at::kFloat).contiguous();
    st.bias.assign(bc.data_ptr<float>(), bc.data_ptr<float>() + st.k);
  }
  st.act = act;
  if (bf16_pairs && !middle) st.pairs = conv_pairs(*ops_, isa_, w.data_ptr<float>(), s);
  // Narrow groups in a bf16 model: the middle weight in bf16 pairs too, for bf16 rows (pairs()).
  if (bf16_pairs && narrow && ops_->narrow_pack_pairs && bf16_dot_supported(isa_)) {
    st.pairs.resize(static_cast<size_t>(ops_->narrow_pairs_size(s)));
    ops_->narrow_pack_pairs(w.data_ptr<float>(), s, st.pairs.data());
  }
  return st;
}

bool ConvChain::pairs() const {
  return (expand_ && !expand_->pairs.empty()) || (project_ && !project_->pairs.empty());
}

ConvChain::ConvChain(const std::optional<Pointwise>& expand, const at::Tensor& dw_w,
                     const at::Tensor& dw_b, DirectConv::Geometry g, Activation dw_act,
                     const std::optional<Pointwise>& project, Isa isa, bool bf16_pairs)
    : ops_(&conv_isa_ops(isa)), isa_(isa), g_(g) {
  LOPPER_CHECK(takes(expand ? &*expand : nullptr, dw_w, project ? &*project : nullptr, true, isa),
               "[kernels] the convolution chain does not take these weights");
  group_width_ = dw_w.size(1), kh_ = dw_w.size(2), kw_ = dw_w.size(3);
  if (expand) expand_ = pack(expand->w, expand->b, expand->act, false, bf16_pairs);
  dw_ = pack(dw_w, dw_b, dw_act, true, bf16_pairs);
  if (project) project_ = pack(project->w, project->b, project->act, false, bf16_pairs);
}

at::Tensor ConvChain::run(const at::Tensor& x_in, const at::Tensor& residual) const {
  constexpr auto kCl = at::MemoryFormat::ChannelsLast;
  const int64_t c = expand_ ? expand_->c : dw_.c, m = dw_.c;
  // NOTE: a bfloat16 input (--precision bf16) gives a bfloat16 output, sums in float32: the 1x1
  // stages read bf16 rows by the dot product where the CPU has it (pairs()), and otherwise the
  // rows read (input, residual) are widened and the rows written rounded, one row at a time in
  // the thread's scratch (in L1), so the chain moves half the bytes to and from memory.
  const bool bf16 = x_in.scalar_type() == at::kBFloat16;
  if (bf16)
    LOPPER_CHECK(x_in.dim() == 4 && x_in.size(1) == c, "[kernels] the convolution chain wants [n, ",
                 c, ", h, w], got ", x_in.sizes());
  else
    check_conv_input(x_in, c, "the convolution chain");
  const at::Tensor x = channels_last_layout(x_in);
  const int64_t n = x.size(0), h = x.size(2), w = x.size(3);
  // The depthwise convolution's shape (its input: the expanded map, m channels a pixel).
  ConvShape ds;
  ds.n = 1, ds.h = h, ds.w = w, ds.c = ds.k = m, ds.kh = kh_, ds.kw = kw_;
  ds.sh = g_.sh, ds.sw = g_.sw, ds.ph = g_.ph, ds.pw = g_.pw, ds.dh = g_.dh, ds.dw = g_.dw;
  const int64_t spare_h = h + 2 * ds.ph - ds.dh * (kh_ - 1) - 1;
  const int64_t spare_w = w + 2 * ds.pw - ds.dw * (kw_ - 1) - 1;
  LOPPER_CHECK(spare_h >= 0 && spare_w >= 0,
               "[kernels] the depthwise kernel reaches past its padded input ", x.sizes());
  ds.oh = spare_h / ds.sh + 1, ds.ow = spare_w / ds.sw + 1;
  ds.x_stride = ds.y_stride = ds.r_stride = m;
  const int64_t oh = ds.oh, ow = ds.ow, k = project_ ? project_->k : m;
  at::Tensor y = at::empty({n, k, oh, ow}, x.options().memory_format(kCl));
  const at::Tensor r = residual_for(residual, y);  // y's type: bf16 rows widened below
  if (y.numel() == 0) return y;                    // an empty batch (or map): nothing to compute
  ConvShape es;                                    // one input row through the expansion
  es.h = es.oh = 1, es.w = es.ow = w, es.c = c, es.k = m;
  ConvShape ps;  // one depthwise row through the projection
  ps.h = ps.oh = 1, ps.w = ps.ow = ow, ps.c = m, ps.k = k;
  const int64_t e_tiles = expand_ ? ops_->tiles(es, false) : 0;
  const int64_t p_tiles = project_ ? ops_->tiles(ps, false) : 0;
  auto epilogue = [](const Stage& st) {
    return to_epilogue(st.act, st.bias.empty() ? nullptr : st.bias.data());
  };
  const Epilogue ee = expand_ ? epilogue(*expand_) : Epilogue{}, de = epilogue(dw_);
  const Epilogue pe = project_ ? epilogue(*project_) : Epilogue{};
  const int64_t span = (kh_ - 1) * ds.dh + 1;  // input rows an output row reads
  // NOTE: the ring's rows carry the padding columns, zero, so that every output pixel is an
  // interior one of the depthwise kernel (its vector path, not its per-pixel border path: a 7x7
  // map under a 5x5 kernel has 3 interior pixels a row).
  const int64_t pw = expand_ ? ds.pw : 0, row_floats = (w + 2 * pw) * m;
  const int64_t ring_floats = expand_ ? span * row_floats : 0;
  if (expand_) ds.w = w + 2 * pw, ds.pw = 0;
  const int64_t mid_floats = project_ ? ow * m : 0;
  const int64_t cp = (m + ops_->width - 1) / ops_->width * ops_->width;
  // One output row of the middle convolution (its kernel rows [i0, i1) in rows).
  auto middle_row = [&](const float* const* rows, float* out, const float* res, int64_t i0,
                        int64_t i1) {
    if (group_width_ == 1)
      ops_->dw_row(rows, dw_.packed.data(), out, res, ds, de, i0, i1, 0, cp);
    else
      ops_->narrow_row(rows, dw_.packed.data(), out, res, ds, group_width_, de, i0, i1, 0,
                       cp / ops_->width);
  };
  // bf16: the input rows a stage reads, widened (the expansion's one row; without an expansion,
  // the depthwise kernel's ring of kernel-height rows), and one output row (with its residual).
  const int64_t in_row = w * c;
  const int64_t in_floats = !bf16 ? 0 : expand_ ? in_row : span * in_row;
  // bf16 through the dot product: the projection's input row rounded to bf16; the projection
  // writes its bf16 output rows itself and reads the bf16 residual as it is (no float32 output
  // row to round, no residual row to widen).
  const bool expand_pairs = bf16 && expand_ && !expand_->pairs.empty();
  const bool project_pairs = bf16 && project_ && !project_->pairs.empty();
  const int64_t out_floats = bf16 && !project_pairs ? 2 * ow * k : 0;
  const int64_t mid16_floats = project_pairs ? (ow * m + 1) / 2 : 0;
  // Narrow groups with both 1x1 stages on the dot product: the ring holds the expanded rows in
  // bf16 (half its floats used) and the middle stage multiplies them by the bfloat16 dot product
  // into the projection's bf16 input row, no widening or rounding between the stages.
  const bool mid_pairs = expand_pairs && project_pairs && !dw_.pairs.empty();
  const float* xp = bf16 ? nullptr : x.data_ptr<float>();
  const auto* xp16 = bf16 ? reinterpret_cast<const uint16_t*>(x.data_ptr()) : nullptr;
  const float* rp = r.defined() && !bf16 ? r.data_ptr<float>() : nullptr;
  const auto* rp16 =
      r.defined() && bf16 ? reinterpret_cast<const uint16_t*>(r.data_ptr()) : nullptr;
  float* yp = bf16 ? nullptr : y.data_ptr<float>();
  auto* yp16 = bf16 ? reinterpret_cast<uint16_t*>(y.data_ptr()) : nullptr;
  // NOTE: the output rows of all images are shared among the threads by parallel_steal: each
  // thread runs its share's rows front to back, its ring carried from one chunk to the next, and a
  // thread done early takes rows from the back of another's share (making again the few expanded
  // rows they share). With one fixed band a thread (at::parallel_for), a thread slowed by another
  // process, or late to wake, held the other in the OpenMP barrier: 9-11% of the samples of three
  // MobileNetV2 blocks in float32 and bf16, 3% with stealing (AMD EPYC Zen 4, 2 threads).
  const int64_t scratch_floats =
      std::max<int64_t>(1, ring_floats + mid_floats + in_floats + out_floats + mid16_floats);
  static std::atomic<uint64_t> runs{0};
  const uint64_t run = ++runs;
  parallel_steal(n * oh, steal_grain(n * oh), [&](int64_t u0, int64_t u1) {
    // Where this thread's ring is, kept across its chunks of this run (in its scratch, which the
    // chain's stages do not use): `next`, the output row (over all images) the ring continues at;
    // -1: it starts again.
    struct Worker {
      uint64_t run = 0;
      int64_t next = -1, made = -1, widened = -1;
    };
    thread_local Worker wk;
    const bool fresh = wk.run != run;
    if (fresh) wk.run = run, wk.next = -1;
    float* ring = thread_scratch(0, size_t(scratch_floats));
    float* mid = ring + ring_floats;
    float* xin = mid + mid_floats;  // bf16: widened input rows
    float* yrow = xin + in_floats;  // bf16: one output row, then its residual
    float* rrow = yrow + (out_floats ? ow * k : 0);
    auto* mid16 = reinterpret_cast<uint16_t*>(yrow + out_floats);
    auto* ring16 = reinterpret_cast<uint16_t*>(ring);  // mid_pairs: rows of row_floats values
    for (int64_t q = 0; q < (expand_ && fresh ? span : 0); ++q) {
      if (mid_pairs) {
        uint16_t* row = ring16 + q * row_floats;
        std::fill(row, row + pw * m, uint16_t(0));
        std::fill(row + (pw + w) * m, row + row_floats, uint16_t(0));
        continue;
      }
      float* row = ring + q * row_floats;
      std::fill(row, row + pw * m, 0.f);
      std::fill(row + (pw + w) * m, row + row_floats, 0.f);
    }
    const float* rows[kDwMaxTaps];
    const uint16_t* rows16[kDwMaxTaps];
    for (int64_t u = u0; u < u1;) {  // the chunk's rows of one image at a time
      const int64_t img = u / oh, r0 = u % oh, r1 = std::min(oh, r0 + (u1 - u));
      if (u != wk.next) wk.made = wk.widened = -1;  // not where the ring left off: it starts again
      u += r1 - r0;
      wk.next = r1 < oh ? u : -1;  // the next image's rows start their own ring
      const float* ximg = bf16 ? nullptr : xp + img * h * w * c;
      const uint16_t* ximg16 = bf16 ? xp16 + img * h * w * c : nullptr;
      // Input row `row` as float32: in place, or widened into slot `slot` of xin.
      auto input_row = [&](int64_t row, int64_t slot) -> const float* {
        if (!bf16) return ximg + row * in_row;
        float* dst = xin + slot * in_row;
        widen_span(ximg16 + row * in_row, dst, in_row);
        return dst;
      };
      int64_t& made = wk.made;  // the last expanded row made (rows are made in increasing order)
      int64_t& widened = wk.widened;  // bf16 without an expansion: the last input row widened
      for (int64_t oy = r0; oy < r1; ++oy) {
        const int64_t first = oy * ds.sh - ds.ph;
        int64_t i0 = 0, i1 = kh_;  // kernel rows whose input row exists
        while (i0 < kh_ && first + i0 * ds.dh < 0) ++i0;
        while (i1 > i0 && first + (i1 - 1) * ds.dh >= h) --i1;
        for (int64_t i = i0; i < i1; ++i) {
          const int64_t iy = first + i * ds.dh;
          if (!expand_) {
            if (!bf16) {
              rows[i] = ximg + iy * w * c;
              continue;
            }
            for (int64_t row = std::max({widened + 1, first, int64_t{0}}); row <= iy; ++row)
              input_row(row, row % span), widened = row;
            rows[i] = xin + iy % span * in_row;
            continue;
          }
          // NOTE: the window's rows not made yet are made in order (a dilated kernel reads every
          // other one, the next output row the others; the window's first row, unlike its first
          // row inside the image, never moves back), each into slot row % span, over row - span:
          // before the window, no longer read.
          for (int64_t row = std::max({made + 1, first, int64_t{0}}); row <= iy; ++row) {
            float* dst = ring + row % span * row_floats + pw * m;
            if (mid_pairs)
              ops_->run_pairs(ximg16 + row * in_row, expand_->pairs.data(), nullptr,
                              ring16 + row % span * row_floats + pw * m, nullptr, nullptr, es, ee,
                              0, e_tiles);
            else if (expand_pairs)
              ops_->run_pairs(ximg16 + row * in_row, expand_->pairs.data(), dst, nullptr, nullptr,
                              nullptr, es, ee, 0, e_tiles);
            else
              ops_->run(input_row(row, 0), expand_->packed.data(), dst, nullptr, es, false, ee, 0,
                        e_tiles);
            made = row;
          }
          rows[i] = ring + iy % span * row_floats;
          rows16[i] = ring16 + iy % span * row_floats;
        }
        const int64_t out_row = (img * oh + oy) * ow;
        // The output row and its residual row (k channels a pixel: m without a projection).
        float* out = bf16 ? yrow : yp + out_row * k;
        const float* res = rp ? rp + out_row * k : nullptr;
        uint16_t* out16 = project_pairs ? yp16 + out_row * k : nullptr;
        const uint16_t* res16 = project_pairs && rp16 ? rp16 + out_row * k : nullptr;
        if (rp16 && !project_pairs) {
          widen_span(rp16 + out_row * k, rrow, ow * k);
          res = rrow;
        }
        if (!project_) {
          middle_row(rows, out, res, i0, i1);
        } else if (mid_pairs) {
          ops_->narrow_row_pairs(rows16, dw_.pairs.data(), mid16, ds, group_width_, de, i0, i1, 0,
                                 cp / ops_->width);
          ops_->run_pairs(mid16, project_->pairs.data(), nullptr, out16, nullptr, res16, ps, pe, 0,
                          p_tiles);
        } else {
          middle_row(rows, mid, nullptr, i0, i1);
          if (project_pairs) {
            narrow_span(mid, mid16, ow * m);
            ops_->run_pairs(mid16, project_->pairs.data(), nullptr, out16, nullptr, res16, ps, pe,
                            0, p_tiles);
          } else {
            ops_->run(mid, project_->packed.data(), out, res, ps, false, pe, 0, p_tiles);
          }
        }
        if (bf16 && !project_pairs) narrow_span(yrow, yp16 + out_row * k, ow * k);
      }
    }
  });
  return y;
}

}  // namespace lopper::kernels::cpu
