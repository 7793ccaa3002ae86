#include "exec/sparse_linear.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "kernels/cpu/bf16.h"

namespace lopper::ops {

namespace kc = kernels::cpu;

namespace {

// NOTE: above this share of nonzeros no sparse kernel comes near a dense GEMM (see
// docs/benchmarks.md for the measured crossover), so packing and timing would only cost load time.
constexpr double kMaxDensity = 0.7;
// A block format is tried when its blocks store at most this many values per nonzero.
constexpr double kMaxBlockFill = 1.2;
// The bitmask format: for products of at most this many rows, weights at most this dense.
constexpr int64_t kMaxMaskedRows = 16;
constexpr double kMaxMaskedDensity = 0.85;
constexpr double kMinBytesRuleDensity = 0.25;

bool sparse_disabled() {
  const char* v = std::getenv("LOPPER_SPARSE");
  return v && (std::strcmp(v, "off") == 0 || std::strcmp(v, "0") == 0);
}

}  // namespace

std::vector<SparseCandidate> sparse_candidates(const at::Tensor& w_in, const at::Tensor& bias,
                                               std::vector<kc::Algo> algos, int64_t rows) {
  std::vector<SparseCandidate> out;
  if (sparse_disabled() || w_in.dim() != 2 || w_in.numel() == 0) return out;
  const int64_t nonzeros = kc::count_nonzero(w_in.contiguous());
  const double density = double(nonzeros) / double(w_in.numel());
  // The bitmask format moves 1/8 byte per weight plus the kept values: it can win up to a higher
  // density than CSR (its indices cost as much as the values).
  int64_t masked_bytes = 0;
  if (algos.empty() && rows > 0 && rows <= kMaxMaskedRows && density <= kMaxMaskedDensity) {
    auto masked = std::make_shared<const kc::MaskedWeight>(w_in, bias);
    masked_bytes = masked->bytes();
    const char* name = masked->tile() == 16 ? "bitmask-2of4-panels"
                       : masked->fixed()    ? "bitmask-8of16"
                                            : "bitmask";
    out.push_back({name, nullptr, kc::Algo::kRows, masked});
    // NOTE: a weight in panels (bfloat16 unstructured, float32 any pattern) reads two streams in
    // order instead of a few short ones but expands every 32 or 16 weights: faster from memory,
    // slower from the caches (docs/kernels.md), so timing decides.
    if (masked->tile() != 16 && kc::MaskedWeight::takes_panels(kc::active_isa(), masked->bf16()))
      out.push_back({"bitmask-panels", nullptr, kc::Algo::kRows,
                     std::make_shared<const kc::MaskedWeight>(w_in, bias, 16)});
  }
  // NOTE: a bfloat16 weight (--precision bf16) is offered the float32 formats too, packed from the
  // weight widened (exactly): its input is widened before and the output rounded after
  // (SparseCandidate::widened). A 90%-sparse encoder ran 1.65x slower in bf16 than in float32 on
  // ATen's dense bf16 products.
  const bool bf16 = w_in.scalar_type() == at::kBFloat16;
  if (!(w_in.scalar_type() == at::kFloat || bf16) || density > kMaxDensity) return out;
  // Every block format stores at least the nonzeros (4 bytes each) and an index per block of r*c:
  // when that alone outweighs the bitmask format for the largest block, the rule below offers
  // none, so none is packed (packing each to count its blocks took a third of a 50% LLaMA's load).
  int64_t largest = 1;
  for (const kc::BlockShape& b : kc::kernel_block_shapes())
    largest = std::max<int64_t>(largest, b.r * b.c);
  if (masked_bytes > 0 && density >= kMinBytesRuleDensity &&
      nonzeros * 4 + nonzeros / largest * 4 > masked_bytes)
    return out;
  const at::Tensor w = bf16 ? w_in.to(at::kFloat).contiguous() : w_in.contiguous();
  const at::Tensor b32 = bf16 && bias.defined() ? bias.to(at::kFloat) : bias;
  if (algos.empty()) algos = {kc::Algo::kCols, kc::Algo::kRows, kc::Algo::kGather, kc::Algo::kDot};
  // NOTE: the bfloat16 cols kernel multiplies twice the weights per instruction of the float32
  // one and reads half the bytes of x: 90% BERT-base layers of 128 rows ran in 0.6x the time.
  const bool pairs = bf16 && rows > kMaxMaskedRows && kc::bf16_dot_supported(kc::active_isa()) &&
                     std::find(algos.begin(), algos.end(), kc::Algo::kCols) != algos.end();
  for (const kc::BlockShape& b : kc::kernel_block_shapes()) {
    const bool csr = b.r == 1 && b.c == 1;
    if (w.size(1) < b.c) continue;
    const int64_t stored = kc::stored_values(w, b);
    if (!csr && double(stored) > kMaxBlockFill * double(std::max<int64_t>(nonzeros, 1))) continue;
    // NOTE: a product of a few rows reads the weight once and does little else: for a model
    // larger than the caches its time is the weight's bytes from memory. Timed on the layer at
    // load, the weight sits in the cache, where a format of more bytes can look as fast (seen:
    // CSR chosen for 14 of 57 layers of a 50% LLaMA, 1.3x slower per token). From a quarter of
    // the weights kept, a format that moves more bytes than the bitmask format is not offered;
    // sparser, timing decides (the bitmask format's work per weight does not shrink with it).
    if (masked_bytes > 0 && density >= kMinBytesRuleDensity &&
        stored * 4 + stored / (b.r * b.c) * 4 > masked_bytes)
      continue;
    auto packed = std::make_shared<const kc::SparseWeight>(w, b, b32, pairs);
    if (pairs)
      out.push_back({(csr ? std::string("csr") : "bcsr" + b.str()) + "-cols-bf16",
                     packed,
                     kc::Algo::kCols,
                     {},
                     false,
                     true});
    for (kc::Algo a : algos)
      if (packed->supports(a))
        out.push_back({(csr ? std::string("csr") : "bcsr" + b.str()) + "-" + kc::algo_name(a) +
                           (bf16 ? "-fp32" : ""),
                       packed,
                       a,
                       {},
                       bf16});
  }
  return out;
}

kc::Activation fused_activation(const onednn::PostOp& post) {
  kc::Activation a;
  if (post.attr == "relu") {
    a.kind = kc::Activation::kRelu;
  } else if (post.attr == "hardtanh" && post.scalars.size() == 2) {
    a.kind = kc::Activation::kClip;
    a.lo = static_cast<float>(post.scalars[0]), a.hi = static_cast<float>(post.scalars[1]);
  } else if (post.attr == "leaky_relu" && post.scalars.size() == 1) {
    a.kind = kc::Activation::kLeaky;
    a.alpha = static_cast<float>(post.scalars[0]);
  } else if (post.attr == "hardswish") {
    a.kind = kc::Activation::kHardSwish;
  } else if (post.attr == "hardsigmoid") {
    a.kind = kc::Activation::kHardSigmoid;
    a.alpha = 1.f / 6, a.beta = 0.5f;
  } else if (post.attr == "sigmoid") {
    a.kind = kc::Activation::kSigmoid;
  } else if (post.attr == "swish") {
    a.kind = kc::Activation::kSilu;
  } else if (post.attr == "gelu" && post.algorithm == "none") {
    a.kind = kc::Activation::kGelu;
  }
  return a;
}

at::Tensor finish_activation(at::Tensor y, const onednn::PostOp& post,
                             const kc::Activation& fused) {
  return fused.kind == kc::Activation::kNone ? onednn::apply_unfused(y, post) : y;
}

namespace {

// A widened candidate (a bf16 layer on a float32 format): `run` on x widened, rounded back.
at::Tensor widened_run(const SparseCandidate& s, const at::Tensor& x, const onednn::PostOp& post,
                       at::Tensor (*run)(const SparseCandidate&, const at::Tensor&,
                                         const onednn::PostOp&)) {
  SparseCandidate plain = s;
  plain.widened = false;
  return kc::narrow_to_bf16(run(plain, kc::widen_bf16(x), post));
}

}  // namespace

at::Tensor run_sparse_linear(const SparseCandidate& s, const at::Tensor& x,
                             const onednn::PostOp& post) {
  if (s.widened) return widened_run(s, x, post, run_sparse_linear);
  kc::Activation act = fused_activation(post);
  if (s.masked) return finish_activation(s.masked->linear(x, act, kc::active_isa()), post, act);
  if (s.pairs) {
    const at::Tensor xb = x.scalar_type() == at::kBFloat16 ? x : x.to(at::kBFloat16);
    return finish_activation(s.weight->linear_bf16(xb, act, kc::active_isa()), post, act);
  }
  return finish_activation(s.weight->linear(x, s.algo, act, kc::active_isa()), post, act);
}

at::Tensor run_sparse_cols(const SparseCandidate& s, const at::Tensor& x,
                           const onednn::PostOp& post) {
  if (s.widened) return widened_run(s, x, post, run_sparse_cols);
  kc::Activation act = fused_activation(post);
  return finish_activation(s.weight->cols_batched(x, act, kc::active_isa()), post, act);
}

}  // namespace lopper::ops
