// The kernels a linear layer can run, and the choice between them (see linear_kernels.h).
#include "exec/linear_kernels.h"

#include "exec/kernel_choice.h"
#include "exec/sparse_linear.h"
#include "kernels/cpu/conv.h"
#include "kernels/cpu/sparse.h"
#include "kernels/cuda/library.h"
#include "kernels/cuda/sparse_gemv.h"  // kMaxRows

namespace lopper::ops {
namespace {

struct LinearState {
  at::Tensor weight;  // [N, K] contiguous
  std::shared_ptr<kernels::cuda::PackedLinear> cuda_sparse;
  std::shared_ptr<kernels::cuda::PackedLinear> semi;
  enum class Kernel {
    kUndecided,
    kAten,
    kOnednn,
    kSparse,
    kCudaSparse,
    kCudaSemi,
    kGemv,
    kDense,                       // lopper's dense kernel (a 1x1 convolution's) for many rows
    kDirect                       // oneDNN's matrix-product primitive called directly
  } kernel = Kernel::kUndecided;  // CUDA
  // The CPU's choice, made apart for products of a few rows (decoding a token: the bitmask
  // format's regime) and of more (a prompt, a batch): a model that runs both keeps the best of
  // each.
  struct CpuChoice {
    at::Tensor packed;                                      // oneDNN's layout of the weight
    std::shared_ptr<kernels::cpu::DenseGemv> gemv;          // lopper's panels of the weight
    std::shared_ptr<const kernels::cpu::DirectConv> dense;  // the weight as a 1x1 layer's
    SparseCandidate sparse;
    // oneDNN's primitive, one per row count seen (the last four)
    std::vector<std::shared_ptr<const dnnl::Linear>> direct;
    Kernel kernel = Kernel::kUndecided;
    Kernel rival = Kernel::kUndecided;  // the runner-up in a trial in the model
    InModelTrial trial;
  } few, many;
};

// The direct primitive for x2's rows: made on the first call with that many (the last four kept),
// nullptr where oneDNN makes none (the reason in `why`).
std::shared_ptr<const dnnl::Linear> direct_for(LinearState::CpuChoice& ch, const at::Tensor& weight,
                                               const at::Tensor& x2, const at::Tensor& bias,
                                               const onednn::PostOp& post, std::string* why) {
  for (const auto& d : ch.direct)
    if (d->spec().m == x2.size(0)) return d;
  const auto act = onednn::direct_eltwise(post);
  if (!act) {
    if (why) *why = "oneDNN's primitive has no NaN-safe form of " + post.attr;
    return nullptr;
  }
  dnnl::LinearSpec s;
  s.m = x2.size(0), s.k = weight.size(1), s.n = weight.size(0);
  s.bf16 = x2.scalar_type() == at::kBFloat16;
  s.bias = bias.defined();
  s.act = act->first, s.alpha = act->second;
  return onednn::make_kept(
      ch.direct,
      [&] {
        const at::Tensor b = s.bias ? bias.contiguous() : at::Tensor();
        return std::make_shared<const dnnl::Linear>(s, weight.data_ptr(),
                                                    s.bias ? b.data_ptr() : nullptr);
      },
      why);
}

// y = act(x2 . w^T + bias) by the direct primitive (the NaN-dropping part of act after it).
at::Tensor direct_linear(LinearState::CpuChoice& ch, const at::Tensor& weight, const at::Tensor& x2,
                         const at::Tensor& bias, const onednn::PostOp& post) {
  auto d = direct_for(ch, weight, x2, bias, post, nullptr);
  if (!d) return onednn::apply_unfused(at::linear(x2, weight, bias), post);
  const at::Tensor x = x2.contiguous();
  at::Tensor y = at::empty({x.size(0), weight.size(0)}, x.options());
  at::Tensor scratch = at::empty({int64_t(d->scratchpad_bytes())}, x.options().dtype(at::kByte));
  d->run(x.data_ptr(), y.data_ptr(), scratch.data_ptr());
  return onednn::after_primitive(y, post);
}

// Rows up to which a product counts as "a few" (LinearState::few): the bitmask format's limit.
constexpr int64_t kFewRows = 16;

// y [rows, N] computed from x flattened to rows, back in x's leading shape.
at::Tensor unflatten_rows(const at::Tensor& y, const at::Tensor& x) {
  if (x.dim() == 2) return y;
  auto shape = x.sizes().vec();
  shape.back() = y.size(1);
  return y.reshape(shape);  // a view unless y is a transposed or narrowed result
}

// NOTE: lopper's CUDA kernel reads 4 bytes per nonzero (16-bit value and index) where cuBLAS reads
// 2 per weight, so it cannot win above half the weights nonzero; below, timing decides.
constexpr double kMaxCudaDensity = 0.5;

// A 2:4 weight in fp16/bf16 compressed for each sparse-tensor-core backend that takes it (tried
// once on x), with its backend; the others are named in `refused` with why.
using SemiWeights = std::vector<
    std::pair<kernels::cuda::SemiBackend, std::shared_ptr<kernels::cuda::PackedLinear>>>;

SemiWeights pack_two_four(const kernels::cuda::Library& lib, const at::Tensor& weight,
                          const at::Tensor& bias, const at::Tensor& x,
                          std::vector<std::string>& refused) {
  namespace kcu = kernels::cuda;
  SemiWeights packed;
  if (!lib.semi_fits(weight, x.scalar_type())) {
    if (x.scalar_type() == at::kFloat && lib.is_two_four(weight))
      refused.push_back("cuda-2:4: the sparse tensor cores take fp16/bf16 (--precision bf16)");
    return packed;
  }
  for (auto b : {kcu::SemiBackend::kCusparselt, kcu::SemiBackend::kCutlass}) {
    if (!lib.semi_compiled(b)) {
      refused.push_back(detail::concat(kcu::semi_name(b), ": not in this libtorch"));
      continue;
    }
    try {  // a GPU or library that refuses the weight or the shape drops the candidate
      auto sw = lib.pack_semi(b, weight, bias, x.scalar_type(), x.device());
      sw->linear(x);
      packed.emplace_back(b, std::move(sw));
    } catch (const std::exception& e) {
      refused.push_back(e.what());
    }
  }
  return packed;
}

// On a GPU: cuBLAS (ATen); for a 2:4 weight in fp16/bf16 the sparse tensor cores (cuSPARSELt and
// CUTLASS behind ATen); for an unstructured-sparse weight and a skinny batch (the LLM-decode
// shape) lopper's own kernel. Chosen by timing them once on the layer's real input.
at::Tensor run_linear_cuda(OpContext& c, const at::Tensor& x, LinearState& st,
                           const at::Tensor& bias, const onednn::PostOp& post) {
  namespace kcu = kernels::cuda;
  using K = LinearState::Kernel;
  const kcu::Library& lib = kcu::need_library();
  at::Tensor x2 = x.dim() == 2 ? x : x.reshape({-1, x.size(-1)});
  const bool skinny = x2.size(0) <= kcu::kMaxRows;
  auto dense = [&] { return onednn::apply_unfused(at::linear(x, st.weight, bias), post); };
  if (st.kernel == K::kUndecided) {
    st.kernel = K::kAten;
    std::vector<KernelCandidate> cands{{"cublas", [&] { dense(); }}};
    std::vector<K> kinds{K::kAten};
    std::vector<std::string> refused;
    const bool same_dtype = st.weight.scalar_type() == x.scalar_type();
    const SemiWeights semi =
        same_dtype ? pack_two_four(lib, st.weight, bias, x2, refused) : SemiWeights{};
    for (const auto& packed : semi) {
      auto sw = packed.second;
      cands.push_back(
          {kcu::semi_name(packed.first), [&, sw] { onednn::apply_unfused(sw->linear(x2), post); }});
      kinds.push_back(K::kCudaSemi);
    }
    if (lib.kernels_built() && skinny && same_dtype && lib.sparse_fits(st.weight) &&
        double(st.weight.count_nonzero().item<int64_t>()) <=
            kMaxCudaDensity * double(st.weight.numel())) {
      st.cuda_sparse = lib.pack_sparse(st.weight, bias, x.scalar_type(), x.device());
      cands.push_back(
          {"cuda-csr16", [&] { onednn::apply_unfused(st.cuda_sparse->linear(x2), post); }});
      kinds.push_back(K::kCudaSparse);
    }
    const size_t best = choose_kernel(c, cands, st.weight, x2, std::move(refused));
    st.kernel = kinds[best];
    if (st.kernel == K::kCudaSemi)
      st.semi = semi[best - 1].second;  // candidates 1.. are the 2:4 ones
    if (st.kernel != K::kCudaSparse) st.cuda_sparse.reset();
  }
  if (st.kernel == K::kCudaSemi)
    return unflatten_rows(onednn::apply_unfused(st.semi->linear(x2), post), x);
  if (st.kernel != K::kCudaSparse || !skinny) return dense();
  return unflatten_rows(onednn::apply_unfused(st.cuda_sparse->linear(x2), post), x);
}

// lopper's dense GEMV for a few rows (a classifier's last layer at batch 1, a decoded token): the
// weight streamed once, its panels split between the threads. In a model its weight comes from
// memory, not cache: mnasnet0_5's 1280 -> 1000 classifier took 0.26 ms by oneDNN there (0.06 ms
// timed alone, warm).
at::Tensor dense_gemv(const at::Tensor& x2, const kernels::cpu::DenseGemv& w,
                      const at::Tensor& bias, const onednn::PostOp& post) {
  const kernels::cpu::Activation act = fused_activation(post);
  return finish_activation(w.linear(x2, bias, act), post, act);
}

// lopper's dense kernel for a product of many rows (a prompt, an encoder's sequence): the weight
// [N, K] as a 1x1 convolution's of K -> N channels, packed once in its blocks of output channels
// (bf16 pairs too in a bf16 model, where the CPU has the bfloat16 dot product); null where the
// convolution kernels take no such weight.
// NOTE: a linear layer over M rows is that convolution over a 1 x M channels-last map, with x's
// rows as its pixels and y's as its output pixels: no copy either way. On 128 rows, 768 -> 3072,
// it ran at 96% of the two cores' FMA rate (AMD EPYC Zen 4) where oneDNN's matrix product ran at
// 93%; the bias and activation are applied as each tile is stored.
std::shared_ptr<const kernels::cpu::DirectConv> dense_for(const at::Tensor& weight,
                                                          const at::Tensor& bias, bool bf16) {
  const at::Tensor w = weight.to(at::kFloat).view({weight.size(0), weight.size(1), 1, 1});
  if (!kernels::cpu::DirectConv::takes(w, 1, weight.size(1))) return nullptr;
  auto d = std::make_shared<kernels::cpu::DirectConv>(
      w, bias, 1, kernels::cpu::DirectConv::Geometry{}, kernels::cpu::active_isa(), bf16);
  if (!bf16) return d;
  if (!d->takes_bf16()) return nullptr;
  d->keep_bf16_only();  // the bf16 pairs alone: a bf16 weight of 2 bytes a value packed in 2
  return d;
}

// y [M, N] = post(x2 [M, K] . w^T + bias) by lopper's dense kernel (dense_for), in x2's type.
at::Tensor dense_rows(const at::Tensor& x2, const kernels::cpu::DirectConv& d,
                      const onednn::PostOp& post) {
  const kernels::cpu::Activation act = fused_activation(post);
  const int64_t m = x2.size(0), k = x2.size(1);
  const at::Tensor map = x2.contiguous().view({1, 1, m, k}).permute({0, 3, 1, 2});  // [1, K, 1, M]
  at::Tensor y = d.run(map, at::Tensor(), act);  // [1, N, 1, M] channels-last
  y = y.permute({0, 2, 3, 1}).view({m, y.size(1)});
  return finish_activation(y, post, act);
}

// Frees the packed weights neither the chosen kernel nor its rival in a trial runs.
void release_unused(LinearState::CpuChoice& ch) {
  using K = LinearState::Kernel;
  auto kept = [&](K k) { return ch.kernel == k || ch.rival == k; };
  if (!kept(K::kOnednn)) ch.packed.reset();
  if (!kept(K::kDirect)) ch.direct.clear();
  if (!kept(K::kGemv)) ch.gemv.reset();
  if (!kept(K::kDense)) ch.dense.reset();
}

// y [rows, N] = post(x2 . w^T + bias) on the CPU by kernel `kind` of the choice `ch`.
at::Tensor run_cpu(LinearState::Kernel kind, LinearState::CpuChoice& ch, const LinearState& st,
                   const at::Tensor& x2, const at::Tensor& bias, const onednn::PostOp& post) {
  using K = LinearState::Kernel;
  switch (kind) {
    case K::kOnednn:
      return onednn::linear(x2.contiguous(), ch.packed, bias, post);
    case K::kDirect:
      return direct_linear(ch, st.weight, x2, bias, post);
    case K::kGemv:
      return dense_gemv(x2, *ch.gemv, bias, post);
    case K::kDense:
      return dense_rows(x2, *ch.dense, post);
    case K::kSparse:
      return run_sparse_linear(ch.sparse, x2, post);
    default:
      return onednn::apply_unfused(at::linear(x2, st.weight, bias), post);
  }
}

// y = x @ w^T + bias for x of any rank >= 2 with a constant weight w [N, K] (inference). On the
// CPU the kernel is chosen once, by timing ATen's BLAS, oneDNN, lopper's dense kernels and (for a
// sparse weight) its sparse kernels on the layer's real input, a close runner-up then tried in the
// model (InModelTrial).
at::Tensor run_linear(OpContext& c, const at::Tensor& x, LinearState& st, const at::Tensor& bias,
                      const onednn::PostOp& post = {}) {
  if (x.is_cuda()) return run_linear_cuda(c, x, st, bias, post);
  const bool cpu_f32 = x.device().is_cpu() && x.scalar_type() == at::kFloat &&
                       st.weight.scalar_type() == at::kFloat &&
                       (!bias.defined() || bias.scalar_type() == at::kFloat);
  // bfloat16 on the CPU: ATen, oneDNN with the weight packed once (where bf16 is native), or for
  // a few rows lopper's GEMV and the bitmask format (on the CPU's bfloat16 dot product).
  const bool cpu_bf16 = x.device().is_cpu() && x.scalar_type() == at::kBFloat16 &&
                        st.weight.scalar_type() == at::kBFloat16 &&
                        (!bias.defined() || bias.scalar_type() == at::kBFloat16);
  // (an empty weight, of no inputs or no outputs, is ATen's alone: oneDNN makes no primitive)
  if ((!cpu_f32 && !cpu_bf16) || st.weight.numel() == 0)
    return onednn::apply_unfused(at::linear(x, st.weight, bias), post);
  at::Tensor x2 = x.dim() == 2 ? x : x.reshape({-1, x.size(-1)});
  using K = LinearState::Kernel;
  LinearState::CpuChoice& ch = x2.size(0) <= kFewRows ? st.few : st.many;
  if (ch.kernel == K::kUndecided) {
    std::vector<KernelCandidate> cands{
        {"aten", [&] { onednn::apply_unfused(at::linear(x2, st.weight, bias), post); }}};
    std::vector<K> kinds{K::kAten};
    std::vector<std::string> refused;
    if (onednn::usable(x) && onednn::usable(st.weight)) {  // fp32, or bf16 where native
      ch.packed = onednn::pack_linear_weight(st.weight, x2.size(0));
      cands.push_back({"onednn", [&] { onednn::linear(x2, ch.packed, bias, post); }});
      kinds.push_back(K::kOnednn);
      // NOTE: the same library without ATen's per-call descriptor, hashing and cache lookup (see
      // dnnl/primitives.h).
      onednn::note_direct_unavailable(refused);
      if (dnnl::available()) {
        std::string why;
        if (auto d = direct_for(ch, st.weight, x2, bias, post, &why)) {
          cands.push_back({"onednn-direct", [&] { direct_linear(ch, st.weight, x2, bias, post); },
                           d->implementation()});
          kinds.push_back(K::kDirect);
        } else {
          refused.push_back("onednn-direct: " + why);
        }
      }
    }
    if (x2.size(0) <= kFewRows && (cpu_f32 || (cpu_bf16 && kernels::cpu::DenseGemv::takes_bf16(
                                                               kernels::cpu::active_isa())))) {
      ch.gemv = std::make_shared<kernels::cpu::DenseGemv>(st.weight, kernels::cpu::active_isa());
      cands.push_back({"lopper-gemv", [&] { dense_gemv(x2, *ch.gemv, bias, post); }});
      kinds.push_back(K::kGemv);
    }
    if (x2.size(0) > kFewRows && (ch.dense = dense_for(st.weight, bias, cpu_bf16))) {
      cands.push_back({"lopper-dense", [&] { dense_rows(x2, *ch.dense, post); }});
      kinds.push_back(K::kDense);
    }
    auto sparse = sparse_candidates(st.weight, bias, {}, x2.size(0));
    for (const auto& sc : sparse) {
      cands.push_back({sc.name, [&x2, &post, sc] { run_sparse_linear(sc, x2, post); }});
      kinds.push_back(K::kSparse);
    }
    // NOTE: the sparse candidates keep one chosen format; the others take part in a trial in the
    // model where their lone times are close (see InModelTrial).
    const KernelChoice choice = choose_kernel_in_model(
        c, cands, st.weight, x2, [&](size_t i) { return kinds[i] != K::kSparse; },
        std::move(refused));
    const size_t best = choice.best;
    ch.kernel = kinds[best];
    if (choice.rival != KernelChoice::kNone) {
      ch.rival = kinds[choice.rival];
      ch.trial = InModelTrial(choice, cands[best].name, cands[choice.rival].name);
    }
    if (ch.kernel == K::kSparse) ch.sparse = sparse[best - (cands.size() - sparse.size())];
    release_unused(ch);
    return unflatten_rows(run_cpu(ch.kernel, ch, st, x2, bias, post), x);  // not in the trial
  }
  if (!ch.trial.active()) return unflatten_rows(run_cpu(ch.kernel, ch, st, x2, bias, post), x);
  return unflatten_rows(ch.trial.run_next(
                            c, ch.kernel, ch.rival, K::kUndecided,
                            [&](K kind) { return run_cpu(kind, ch, st, x2, bias, post); },
                            [&] { release_unused(ch); }),
                        x);
}

}  // namespace

at::Tensor linear_by_kernel(OpContext& c, const at::Tensor& x,
                            const std::function<at::Tensor()>& weight, const at::Tensor& bias,
                            const onednn::PostOp& post) {
  auto& st = c.state<LinearState>();
  if (!st.weight.defined()) st.weight = weight();
  return run_linear(c, x, st, bias, post);
}

}  // namespace lopper::ops
