// Transformer-fused ops: Attention (grouped heads, KV cache, masks, softcap), RotaryEmbedding, and
// lopper's GroupedMatMul (grouped-query attention's products without the key/value repeat) and
// ScaledAttention (an unmasked attention's two products and softmax in one pass).
#include <ATen/ATen.h>

#include <cmath>
#include <limits>
#include <optional>

#include "exec/attention_kernels.h"
#include "kernels/cpu/rows.h"
#include "ops/op.h"

namespace lopper::ops {

namespace {

void attention(OpContext& c) {
  at::Tensor q = c.input(0), k = c.input(1), v = c.input(2);
  c.check(q.is_floating_point(), "Q must be a floating-point tensor");
  c.check(q.dim() == k.dim() && q.dim() == v.dim() && (q.dim() == 3 || q.dim() == 4),
          "Q, K and V must all be 3-D or all 4-D");
  at::ScalarType qt = q.scalar_type();
  bool rank3 = q.dim() == 3;
  int64_t batch = q.size(0);
  if (rank3) {
    int64_t hq = c.attr_int("q_num_heads"), hkv = c.attr_int("kv_num_heads");
    c.check(hq > 0 && hkv > 0, "q_num_heads and kv_num_heads must be positive");
    c.check(q.size(2) % hq == 0 && k.size(2) % hkv == 0 && v.size(2) % hkv == 0,
            "hidden sizes must be divisible by the head counts");
    q = q.reshape({batch, q.size(1), hq, -1}).transpose(1, 2);
    k = k.reshape({batch, k.size(1), hkv, -1}).transpose(1, 2);
    v = v.reshape({batch, v.size(1), hkv, -1}).transpose(1, 2);
  }
  c.check(k.size(0) == batch && v.size(0) == batch, "batch sizes differ");
  c.check(q.size(3) == k.size(3), "Q and K head sizes differ");
  c.check(k.size(1) == v.size(1) && k.size(2) == v.size(2), "K and V shapes do not match");
  bool has_past = c.has_input(4) || c.has_input(5);
  if (has_past) {
    c.check(c.has_input(4) && c.has_input(5), "past_key and past_value must be given together");
    k = at::cat({c.input(4), k}, 2);
    v = at::cat({c.input(5), v}, 2);
  }
  if (c.wants_output(1)) c.set_output(1, k);
  if (c.wants_output(2)) c.set_output(2, v);
  int64_t past_len = has_past ? c.input(4).size(2) : 0;
  int64_t sq = q.size(2), skv = k.size(2);
  int64_t hq = q.size(1), hk = k.size(1);
  c.check(hq % hk == 0, "query heads (", hq, ") must be a multiple of key/value heads (", hk, ")");
  if (hq != hk) {
    k = k.repeat_interleave(hq / hk, 1);
    v = v.repeat_interleave(hq / hk, 1);
  }
  // Compute in at least float32; outputs return to Q's type.
  at::ScalarType ct = at::promote_types(qt, at::kFloat);
  at::Tensor qc = q.to(ct), kc = k.to(ct), vc = v.to(ct);
  double scale = c.has_attr("scale") ? c.attr_float("scale", 0.f)
                                     : 1.0 / std::sqrt(static_cast<double>(q.size(3)));
  auto opts = at::TensorOptions().dtype(ct).device(qc.device());
  constexpr double kNegInf = -std::numeric_limits<double>::infinity();

  // Additive bias [.., sq, skv]: mask, causal, sliding window, key padding.
  std::optional<at::Tensor> bias;
  if (c.has_input(3)) {
    at::Tensor mask = c.input(3);
    int64_t pad = skv - mask.size(-1);
    c.check(pad >= 0, "attn_mask is longer (", mask.size(-1), ") than the key sequence (", skv,
            ")");
    if (mask.scalar_type() == at::kBool) {
      if (pad > 0) mask = at::constant_pad_nd(mask.to(at::kByte), {0, pad}, 0).to(at::kBool);
      bias = at::where(mask, at::scalar_tensor(0.0, opts), at::scalar_tensor(kNegInf, opts));
    } else {
      at::Tensor m = mask.to(ct);
      if (pad > 0) m = at::constant_pad_nd(m, {0, pad}, kNegInf);
      bias = m;
    }
  }
  at::Tensor offset;  // per-batch frontier for the external cache, else scalar offsets
  bool per_batch = false;
  if (c.has_input(6)) {
    c.check(!has_past, "nonpad_kv_seqlen cannot be combined with past_key/past_value");
    at::Tensor lens = c.input(6).to(at::kLong).view({-1, 1, 1, 1});
    at::Tensor j = at::arange(skv, lens.options()).view({1, 1, 1, skv});
    at::Tensor keep = j < lens;
    at::Tensor padb =
        at::where(keep, at::scalar_tensor(0.0, opts), at::scalar_tensor(kNegInf, opts));
    offset = lens - sq;
    per_batch = true;
    bias = bias ? *bias + padb : padb;
  }
  at::Tensor i_idx =
      at::arange(sq, at::TensorOptions().dtype(at::kLong).device(qc.device())).view({sq, 1});
  at::Tensor j_idx = at::arange(skv, i_idx.options()).view({1, skv});
  at::Tensor diff = per_batch ? (i_idx + offset) - j_idx : i_idx + past_len - j_idx;
  if (c.attr_int("is_causal", 0)) {
    at::Tensor cb =
        at::where(diff >= 0, at::scalar_tensor(0.0, opts), at::scalar_tensor(kNegInf, opts));
    bias = bias ? *bias + cb : cb;
  }
  int64_t left = c.attr_int("left_window_size", -1), right = c.attr_int("right_window_size", -1);
  c.check(left >= -1 && right >= -1, "window sizes must be -1 or non-negative");
  if (left >= 0 || right >= 0) {
    at::Tensor allowed = at::ones_like(diff, diff.options().dtype(at::kBool));
    if (left >= 0) allowed = allowed & (diff <= left);
    if (right >= 0) allowed = allowed & (-diff <= right);
    at::Tensor wb =
        at::where(allowed, at::scalar_tensor(0.0, opts), at::scalar_tensor(kNegInf, opts));
    bias = bias ? *bias + wb : wb;
  }

  double root = std::sqrt(scale);
  at::Tensor qk = at::matmul(qc * root, (kc * root).transpose(-1, -2));
  double softcap = c.attr_float("softcap", 0.f);
  if (softcap > 0) qk = at::tanh(qk / softcap) * softcap;
  int64_t mode = c.attr_int("qk_matmul_output_mode", 0);
  c.check(mode >= 0 && mode <= 3, "qk_matmul_output_mode must be 0..3, got ", mode);
  at::Tensor scores = bias ? qk + *bias : qk;
  if (c.has_attr("softmax_precision")) {
    at::ScalarType sp = scalar_type_of(c, c.attr_int("softmax_precision"));
    c.check(at::isFloatingType(sp), "softmax_precision must be a floating type");
    scores = scores.to(sp).to(ct);
  }
  // NOTE: rows masked out entirely give zeros (a plain softmax would give NaN).
  at::Tensor mx = scores.amax(-1, true);
  at::Tensor safe_max = at::where(at::isinf(mx) & (mx < 0), at::zeros_like(mx), mx);
  at::Tensor e = at::exp(scores - safe_max.detach());
  at::Tensor s = e.sum(-1, true);
  at::Tensor probs = e / at::where(s == 0, at::ones_like(s), s);
  if (bias) {
    at::Tensor bmax = bias->amax(-1, true);
    at::Tensor dead = at::isinf(bmax) & (bmax < 0);
    probs = at::where(dead, at::zeros_like(probs), probs);
  }
  if (c.wants_output(3)) {
    at::Tensor qo = mode == 2 ? scores : (mode == 3 ? probs : qk);
    c.set_output(3, qo.to(qt));
  }
  at::Tensor y = at::matmul(probs.to(qt).to(ct), vc);
  if (rank3) y = y.transpose(1, 2).reshape({batch, sq, -1});
  c.set_output(0, y.to(qt));
}

int64_t attention_macs(const MacContext& m) {
  if (m.in_shapes.size() < 3) return 0;
  const auto& q = m.in_shapes[0];
  const auto& k = m.in_shapes[1];
  const auto& v = m.in_shapes[2];
  if (q.size() != k.size() || q.size() != v.size()) return 0;
  int64_t past = m.in_shapes.size() > 4 && m.in_shapes[4].size() == 4 ? m.in_shapes[4][2] : 0;
  if (q.size() == 4) {
    int64_t skv = k[2] + past;
    return q[0] * q[1] * q[2] * skv * (q[3] + v[3]);
  }
  if (q.size() == 3) {
    int64_t hq = m.attr_int("q_num_heads", 1), hkv = m.attr_int("kv_num_heads", 1);
    if (hkv <= 0) return 0;
    int64_t skv = k[1] + past;
    return q[0] * q[1] * skv * (q[2] + v[2] * hq / hkv);
  }
  return 0;
}

void rotary_embedding(OpContext& c) {
  const at::Tensor& input = c.input(0);
  at::Tensor cosc = c.input(1), sinc = c.input(2);
  c.check(input.dim() == 3 || input.dim() == 4, "input must be 3-D or 4-D, got ", input.dim(),
          "-D");
  bool interleaved = c.attr_int("interleaved", 0) != 0;
  int64_t rot = c.attr_int("rotary_embedding_dim", 0);
  int64_t heads = c.attr_int("num_heads", 0);
  at::Tensor x;  // [B, S, heads, head]
  if (input.dim() == 4) {
    x = input.transpose(1, 2);
  } else {
    c.check(heads > 0 && input.size(2) % heads == 0,
            "num_heads must be given and divide the hidden size for 3-D input");
    x = input.reshape({input.size(0), input.size(1), heads, input.size(2) / heads});
  }
  int64_t bsz = x.size(0), seq = x.size(1), head = x.size(3);
  if (rot == 0) rot = head;
  c.check(rot > 0 && rot <= head && rot % 2 == 0, "rotary_embedding_dim ", rot,
          " must be even and at most the head size ", head);
  if (c.has_input(3)) {
    at::Tensor pos = c.input(3).to(cosc.device(), at::kLong);
    c.check(cosc.dim() == 2 && sinc.dim() == 2, "caches must be 2-D when position_ids is given");
    if (pos.numel() > 0) {
      int64_t lo = pos.min().item<int64_t>(), hi = pos.max().item<int64_t>();
      c.check(lo >= 0 && hi < cosc.size(0) && hi < sinc.size(0), "position_ids out of range");
    }
    cosc = at::embedding(cosc, pos);
    sinc = at::embedding(sinc, pos);
  }
  c.check(cosc.dim() == 3 && sinc.dim() == 3 && cosc.size(0) == bsz && cosc.size(1) == seq &&
              sinc.sizes() == cosc.sizes(),
          "caches must be [batch, seq, rotary_dim/2]");
  c.check(cosc.size(2) == rot / 2, "last dim of the caches (", cosc.size(2),
          ") != rotary_embedding_dim/2 (", rot / 2, ")");
  at::Tensor cs = cosc.unsqueeze(2).to(x.scalar_type()), sn = sinc.unsqueeze(2).to(x.scalar_type());
  at::Tensor xr = x.narrow(3, 0, rot), xp = x.narrow(3, rot, head - rot);
  at::Tensor x1, x2;
  if (interleaved) {
    at::Tensor pairs = xr.reshape({bsz, seq, x.size(2), rot / 2, 2});
    x1 = pairs.select(4, 0);
    x2 = pairs.select(4, 1);
  } else {
    x1 = xr.narrow(3, 0, rot / 2);
    x2 = xr.narrow(3, rot / 2, rot / 2);
  }
  at::Tensor real = cs * x1 - sn * x2;
  at::Tensor imag = sn * x1 + cs * x2;
  at::Tensor rotated =
      interleaved ? at::stack({real, imag}, -1).reshape(xr.sizes()) : at::cat({real, imag}, -1);
  at::Tensor y = at::cat({rotated, xp}, -1);
  y = input.dim() == 4 ? y.transpose(1, 2).contiguous() : y.reshape(input.sizes());
  c.set_output(0, y);
}

// GroupedMatMul = A @ Reshape(E, shape), or A @ Reshape(E, shape)^T with transB = 1 (lopper's own
// op, made by the executor's fusion pass from grouped-query attention's key/value head repeat:
// Unsqueeze -> Expand -> Reshape [-> Transpose] -> MatMul). When E [b, kv, rep, S, d] repeats
// each key/value head rep times (axis 2 of stride 0, as Expand leaves it) and the reshape merges
// kv and rep, the rep query heads of a group share one product with their key/value head: A
// viewed as [b, kv, rep * s, k] times E[:, :, 0], without the [b, kv * rep, S, d] copy the
// reshape makes. Otherwise it computes what the nodes it replaced did.
void grouped_matmul(OpContext& c) {
  const at::Tensor& a = c.input(0);
  const at::Tensor& e = c.input(1);
  const bool trans_b = c.attr_int("transB", 0) != 0;
  std::vector<int64_t> shape =
      reshape_target(c, e, to_int_vector(c.input(2)), c.attr_int("allowzero", 0) != 0);
  const bool repeat = a.dim() == 4 && e.dim() == 5 && e.stride(2) == 0 && shape.size() == 4 &&
                      shape[0] == e.size(0) && shape[1] == e.size(1) * e.size(2) &&
                      shape[2] == e.size(3) && shape[3] == e.size(4) && a.size(0) == e.size(0) &&
                      a.size(1) == shape[1];
  at::Tensor b = repeat ? e.select(2, 0) : e.reshape(shape);
  if (trans_b) b = b.transpose(-1, -2);
  c.check(a.dim() >= 1 && a.size(-1) == b.size(-2), "inner dimensions differ: ", a.size(-1), " vs ",
          b.size(-2));
  if (!repeat) return c.set_output(0, at::matmul(a, b));
  const int64_t batch = a.size(0), kv = e.size(1), rep = e.size(2), s = a.size(2);
  const at::Tensor a4 = a.reshape({batch, kv, rep * s, a.size(3)});
  // NOTE: a decoded token's products (a few query rows a key/value head) on lopper's own kernel:
  // ATen's took 130-200 us each in an 8-layer LLaMA step (bf16; 27 us timed alone), its caches
  // and code cold after the layer's weights streamed through.
  const at::ScalarType type = a.scalar_type();
  if (c.prepack() && a.device().is_cpu() && b.device().is_cpu() &&
      (type == at::kFloat || type == at::kBFloat16) && b.scalar_type() == type &&
      rep * s <= kernels::cpu::kFewRowsProduct && a4.numel() > 0 && b.numel() > 0) {
    const at::Tensor y = kernels::cpu::few_rows_product(a4.flatten(0, 1), b.flatten(0, 1));
    return c.set_output(0, y.view({batch, kv * rep, s, y.size(-1)}));
  }
  at::Tensor y = at::matmul(a4, b);
  c.set_output(0, y.view({batch, kv * rep, s, y.size(-1)}));
}

// Every output element is one dot product over A's last axis.
int64_t grouped_matmul_macs(const MacContext& m) {
  if (m.in_shapes.empty() || m.in_shapes[0].empty() || m.out_shapes.empty()) return 0;
  return numel_of(m.out_shapes[0]) * m.in_shapes[0].back();
}

// ai.lopper.ScaledAttention(Q, Kt, V [, Q factor, Kt factor]), attribute scale:
// MatMul(softmax(scale * MatMul(Q [* Q factor], Kt [* Kt factor])), V) along the last axis (made
// by the fusion pass from an unmasked attention's MatMul, Softmax or ScaledSoftmax and MatMul, the
// scores and probabilities read by nothing else; a factor is the other input of a Mul that made Q
// or Kt, a value computed in the graph). A factor of one element joins the scale; any other is
// multiplied in. Inference on the CPU runs kernels::cpu::scaled_attention over the leading axes
// (Q, Kt and V of one rank, 3 or more, the same leading sizes, all float32 or all bf16), or
// oneDNN's products where they time faster (exec/attention_kernels.h); anything else, the three
// steps.
void scaled_attention(OpContext& c) {
  float scale = c.attr_float("scale", 1.f);
  // NOTE: torch's export of MultiheadAttention scales Q and K by sqrt(1 / sqrt(d)) computed from
  // their Shape: two passes over Q and K (in bf16, 0.68 ms of a 12-layer BERT encoder's 32).
  auto scaled = [&](size_t i, size_t factor) {
    const at::Tensor& x = c.input(i);
    if (!c.has_input(factor)) return x;
    const at::Tensor& f = c.input(factor);
    if (f.numel() == 1 && f.dim() <= x.dim()) {
      scale *= f.item<float>();
      return x;
    }
    if (x.numel() == 1 && x.dim() <= f.dim()) {
      scale *= x.item<float>();
      return f;
    }
    return x * f;
  };
  const at::Tensor q = scaled(0, 3), kt = scaled(1, 4);
  const at::Tensor& v = c.input(2);
  c.check(q.dim() >= 2 && kt.dim() >= 2 && v.dim() >= 2, "Q, Kt and V must be at least 2-D");
  c.check(q.size(-1) == kt.size(-2) && kt.size(-1) == v.size(-2), "Q ", q.sizes(), ", Kt ",
          kt.sizes(), " and V ", v.sizes(), " do not chain");
  // The kernel: Q, Kt and V non-empty CPU tensors, all float32 or all bfloat16, of one rank (3 or
  // more) and the same leading sizes.
  // NOTE: bfloat16 runs the same kernel, widening Q, K and V as it packs them (scores and softmax
  // in float32, the output rounded once): ATen's bf16 flash attention took 6.1 ms of a 12-layer
  // BERT encoder (seq 128) where this takes 4.2 (AMD EPYC Zen 4, 2 threads).
  const at::ScalarType type = q.scalar_type();
  bool fused = c.prepack() && (type == at::kFloat || type == at::kBFloat16) && q.dim() >= 3 &&
               kt.dim() == q.dim() && v.dim() == q.dim() && q.numel() > 0 && kt.numel() > 0 &&
               v.numel() > 0;
  for (const at::Tensor* t : {&q, &kt, &v})
    fused = fused && t->scalar_type() == type && t->device().is_cpu();
  for (int64_t d = 0; fused && d + 2 < q.dim(); ++d)
    fused = kt.size(d) == q.size(d) && v.size(d) == q.size(d);
  if (!fused) return c.set_output(0, at::matmul(scaled_softmax(c, at::matmul(q, kt), scale), v));
  auto heads = [](const at::Tensor& x) { return x.dim() == 3 ? x : x.flatten(0, x.dim() - 3); };
  at::Tensor y = attention_by_kernel(c, heads(q), heads(kt), heads(v), scale);
  std::vector<int64_t> shape(q.sizes().begin(), q.sizes().end());
  shape.back() = v.size(-1);
  c.set_output(0, y.view(shape));
}

// The two products: every score one dot product over Q's last axis, every output one over Kt's.
int64_t scaled_attention_macs(const MacContext& m) {
  if (m.in_shapes.size() < 3 || m.out_shapes.empty() || m.in_shapes[0].size() < 2 ||
      m.in_shapes[1].size() < 2)
    return 0;
  const auto& q = m.in_shapes[0];
  const int64_t sk = m.in_shapes[1].back();
  return numel_of(q) * sk + numel_of(m.out_shapes[0]) * sk;
}

}  // namespace

void register_attention(OpTable& t) {
  t.add({"", "Attention", attention, attention_macs});
  t.add({"", "RotaryEmbedding", rotary_embedding});
  t.add({"ai.lopper", "GroupedMatMul", grouped_matmul, grouped_matmul_macs});
  t.add({"ai.lopper", "ScaledAttention", scaled_attention, scaled_attention_macs});
}

}  // namespace lopper::ops
