// The kernels an unmasked attention can run, and the choice between them (see
// attention_kernels.h).
#include "exec/attention_kernels.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstring>

#include <memory>
#include <string>
#include <vector>

#include "dnnl/primitives.h"
#include "exec/kernel_choice.h"
#include "exec/onednn.h"
#include "kernels/cpu/rows.h"

namespace lopper::ops {
namespace {

// NOTE: oneDNN's route holds every head's scores at once (lopper's kernel a block of 128 KB at a
// time): past this it is not offered (a long prompt's attention).
constexpr int64_t kMaxScoreBytes = int64_t(64) << 20;

struct AttentionState {
  enum class Kernel { kUndecided, kLopper, kDirect } kernel = Kernel::kUndecided;
  // oneDNN's products, one per shape seen (the last four)
  std::vector<std::shared_ptr<const dnnl::AttentionProducts>> direct;
};

dnnl::AttentionSpec spec_of(const at::Tensor& q, const at::Tensor& kt, const at::Tensor& v) {
  dnnl::AttentionSpec s;
  s.heads = q.size(0), s.sq = q.size(1), s.d = q.size(2), s.sk = kt.size(2), s.dv = v.size(2);
  s.bf16 = q.scalar_type() == at::kBFloat16;
  return s;
}

// oneDNN's products for this shape: made on its first call (the last four kept), nullptr where
// oneDNN makes none (the reason in `why`).
std::shared_ptr<const dnnl::AttentionProducts> products_for(AttentionState& st,
                                                            const dnnl::AttentionSpec& s,
                                                            std::string* why) {
  for (const auto& d : st.direct)
    if (d->spec() == s) return d;
  return onednn::make_kept(
      st.direct, [&] { return std::make_shared<const dnnl::AttentionProducts>(s); }, why);
}

// x [b, r, c] as [r, b, c] packed (a row's heads side by side): x itself where it is laid out so
// (a projection per Q, K and V), one copy of each row where its heads are side by side but the
// rows further apart (the views of a fused QKV projection), else ATen's copy.
at::Tensor pack_heads(const at::Tensor& x) {
  const at::Tensor t = x.transpose(0, 1);
  if (t.is_contiguous()) return t;
  if (x.stride(2) != 1 || x.stride(0) != x.size(2)) return t.contiguous();
  const int64_t rows = x.size(1), bytes = x.size(0) * x.size(2) * x.element_size();
  at::Tensor out = at::empty({rows, x.size(0), x.size(2)}, x.options());
  const auto* from = static_cast<const char*>(x.data_ptr());
  auto* to = static_cast<char*>(out.data_ptr());
  const int64_t row_bytes = x.stride(1) * x.element_size();
  at::parallel_for(0, rows, std::max<int64_t>(1, (64 << 10) / bytes), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) std::memcpy(to + r * bytes, from + r * row_bytes, bytes);
  });
  return out;
}

// The attention by oneDNN's two products, lopper's softmax between (bf16: the probabilities
// rounded once, as lopper's kernel and ATen's flash attention round them).
at::Tensor direct_attention(const dnnl::AttentionProducts& d, const at::Tensor& q,
                            const at::Tensor& kt, const at::Tensor& v, float scale) {
  const dnnl::AttentionSpec& s = d.spec();
  // Q [sq, h, d], K [sk, h, d] and V [sk, h, dv] packed
  const at::Tensor qp = pack_heads(q), kp = pack_heads(kt.transpose(1, 2)), vp = pack_heads(v);
  at::Tensor scores = at::empty({s.heads, s.sq, s.sk}, q.options().dtype(at::kFloat));
  const at::Tensor scratch =
      at::empty({int64_t(d.scratchpad_bytes()) + 1}, q.options().dtype(at::kByte));
  d.scores(qp.data_ptr(), kp.data_ptr(), scores.data_ptr<float>(), scratch.data_ptr());
  const at::Tensor probs = s.bf16 ? at::empty({s.heads, s.sq, s.sk}, q.options()) : scores;
  kernels::cpu::softmax_rows(scores.data_ptr<float>(), s.heads * s.sq, s.sk, scale,
                             s.bf16 ? reinterpret_cast<uint16_t*>(probs.data_ptr()) : nullptr);
  at::Tensor y = at::empty({s.sq, s.heads, s.dv}, q.options()).permute({1, 0, 2});
  d.output(probs.data_ptr(), vp.data_ptr(), y.data_ptr(), scratch.data_ptr());
  return y;
}

}  // namespace

at::Tensor attention_by_kernel(OpContext& c, const at::Tensor& q, const at::Tensor& kt,
                               const at::Tensor& v, float scale) {
  auto own = [&] { return kernels::cpu::scaled_attention(q, kt, v, scale); };
  auto& st = c.state<AttentionState>();
  const dnnl::AttentionSpec spec = spec_of(q, kt, v);
  const int64_t score_bytes = spec.heads * spec.sq * spec.sk * int64_t(sizeof(float));
  using K = AttentionState::Kernel;
  if (st.kernel == K::kUndecided) {
    std::vector<KernelCandidate> cands{{"lopper-attention", [&] { own(); }}};
    std::vector<K> kinds{K::kLopper};
    std::vector<std::string> refused;
    onednn::note_direct_unavailable(refused);
    if (dnnl::available()) {
      std::string why;
      std::shared_ptr<const dnnl::AttentionProducts> d;
      if (!onednn::usable(q))
        why = spec.bf16 ? "bf16 without the CPU's bfloat16 arithmetic"
                        : "oneDNN does not take this input";
      else if (score_bytes > kMaxScoreBytes)
        why = "every head's scores (" + std::to_string(score_bytes >> 20) + " MB) at once";
      else
        d = products_for(st, spec, &why);
      if (d) {
        cands.push_back({"onednn-direct", [&, d] { direct_attention(*d, q, kt, v, scale); },
                         d->implementation()});
        kinds.push_back(K::kDirect);
      } else {
        refused.push_back("onednn-direct: " + why);
      }
    }
    // NOTE: no weight: the node, the input's shape and type key the cached choice (a node's
    // layout of Q, K and V is fixed by its graph).
    st.kernel = kinds[choose_kernel(c, cands, at::Tensor(), q, std::move(refused))];
    if (st.kernel != K::kDirect) st.direct.clear();
  }
  // (a later, longer input whose scores outgrow the bound runs lopper's kernel)
  if (st.kernel == K::kDirect && score_bytes <= kMaxScoreBytes)
    if (auto d = products_for(st, spec, nullptr)) return direct_attention(*d, q, kt, v, scale);
  return own();
}

}  // namespace lopper::ops
