// The kernels a convolution can run, and the choice between them (see conv_kernels.h).
#include "exec/conv_kernels.h"

#include <cstdlib>
#include <initializer_list>
#include <optional>
#include <string_view>

#include "dnnl/primitives.h"
#include "exec/kernel_choice.h"
#include "exec/sparse_linear.h"
#include "kernels/cpu/bf16.h"
#include "kernels/cpu/chain.h"
#include "kernels/cpu/conv.h"
#include "kernels/cpu/winograd.h"
#include "lopper/memory.h"

namespace lopper::ops {
namespace {

struct ConvState {
  at::Tensor packed;         // oneDNN convolution weight, reordered for the first input shape
  at::Tensor packed_linear;  // for 1x1 convolutions: the weight as a oneDNN linear layer's
  SparseCandidate sparse;    // a sparse weight as [C_out, C_in * kernel]
  std::shared_ptr<const kernels::cpu::DirectConv> direct;      // lopper's own dense kernel
  std::shared_ptr<const kernels::cpu::WinogradConv> winograd;  // and its 3x3 F(4x4, 3x3)
  std::shared_ptr<const kernels::cpu::ConvChain> dw_rows;      // bf16 depthwise, row by row
  // oneDNN's primitive called directly, one per input shape seen (the last few)
  std::vector<std::shared_ptr<const dnnl::Conv>> primitives;
  enum class Kernel {
    kUndecided,
    kConv,
    kLinear,
    kSparse,
    kDirect,
    kDirectInPlace,  // lopper's grouped kernel, the groups read in place (not copied)
    kWinograd,
    kDwRows,  // a bf16 depthwise layer as a chain of one: bf16 rows in and out
    kPrimitive
  } kernel = Kernel::kUndecided;
  Kernel rival = Kernel::kUndecided;  // the runner-up while it and `kernel` take turns
  InModelTrial trial;
};

// A 2-D convolution on a GPU (inference, constant weight), by cuDNN in one of three forms, timed
// once per layer: as given (NCHW, or channels-last when the input already is), channels-last
// (NHWC: tensor cores read it without the transposes cuDNN adds around NCHW, and the output stays
// NHWC for the next layer), and channels-last with the residual add and ReLU fused into the
// convolution (cuDNN's fused conv-bias-add-ReLU: at batch 64 the separate bias, add and ReLU passes
// over the output cost more than a 1x1 convolution itself; resnet50 fp32 on an H200 ran in 4.1 ms
// with it, 8.0 ms without). A form cuDNN refuses for this layer is not timed (its error is kept
// with the layer's decision).
struct CudaConvState {
  at::Tensor w_nhwc;  // the weight in channels-last layout
  enum class Kernel { kUndecided, kAsGiven, kNhwc, kNhwcFused } kernel = Kernel::kUndecided;
};

// cuDNN's own algorithm search (cudnnFind; PyTorch's torch.backends.cudnn.benchmark) for lopper's
// convolutions: its heuristics alone pick poorly for the channel counts pruning leaves. resnet50
// at batch 64 on an H200, pruned to half its MACs: 4.13 -> 3.36 ms in fp32, 2.66 -> 2.57 in bf16;
// the dense model lost 4-6% (4.08 -> 4.35, 2.81 -> 2.92). The two cannot be chosen per layer:
// ATen keeps one cuDNN plan per convolution shape, made by whichever way came first. On for
// lopper's calls only, the caller's setting put back after each (in the Python package the flag
// is the user's PyTorch's). LOPPER_CUDNN_BENCHMARK=0 turns it off, to measure what it gives.
class CudnnBenchmarkScope {
 public:
  CudnnBenchmarkScope() : was_(at::globalContext().benchmarkCuDNN()) {
    static const bool on = [] {
      const char* v = std::getenv("LOPPER_CUDNN_BENCHMARK");
      return !(v && std::string_view(v) == "0");
    }();
    at::globalContext().setBenchmarkCuDNN(on);
  }
  ~CudnnBenchmarkScope() { at::globalContext().setBenchmarkCuDNN(was_); }
  CudnnBenchmarkScope(const CudnnBenchmarkScope&) = delete;
  CudnnBenchmarkScope& operator=(const CudnnBenchmarkScope&) = delete;

 private:
  bool was_;
};

at::Tensor conv2d_cuda(OpContext& c, const at::Tensor& in, const at::Tensor& w, const at::Tensor& b,
                       const at::Tensor& other, const std::vector<int64_t>& padding,
                       const ConvGeometry& g, const onednn::PostOp& post) {
  auto& st = c.state<CudaConvState>();
  const CudnnBenchmarkScope autotune;
  constexpr auto kCl = at::MemoryFormat::ChannelsLast;
  if (!st.w_nhwc.defined()) st.w_nhwc = w.contiguous(kCl);
  const std::vector<int64_t> no_out_pad(padding.size(), 0);
  auto unfused = [&](const at::Tensor& x, const at::Tensor& wt) {
    at::Tensor y =
        at::convolution(x, wt, b, g.strides, padding, g.dilations, false, no_out_pad, g.group);
    if (other.defined()) y = y + other;
    return onednn::apply_unfused(y, post);
  };
  auto as_given = [&] { return unfused(in, w); };
  auto nhwc = [&] { return unfused(in.contiguous(kCl), st.w_nhwc); };
  auto fused = [&] {
    const at::Tensor x = in.contiguous(kCl);
    const std::optional<at::Tensor> bias = b.defined() ? std::optional(b) : std::nullopt;
    if (other.defined())
      return at::cudnn_convolution_add_relu(x, st.w_nhwc, other.contiguous(kCl), 1.0, bias,
                                            g.strides, padding, g.dilations, g.group);
    return at::cudnn_convolution_relu(x, st.w_nhwc, bias, g.strides, padding, g.dilations, g.group);
  };
  using K = CudaConvState::Kernel;
  if (st.kernel == K::kUndecided) {
    std::vector<KernelCandidate> cands{{"cudnn", as_given}, {"cudnn-nhwc", nhwc}};
    std::vector<K> kinds{K::kAsGiven, K::kNhwc};
    std::vector<std::string> refused;
    if (post.attr == "relu" && g.dilations == std::vector<int64_t>(padding.size(), 1)) {
      // Tried once before timing: cuDNN's fused graph is not built for every shape and type.
      try {
        const at::Tensor want = nhwc();
        LOPPER_CHECK(!other.defined() || other.sizes() == want.sizes(), "the residual broadcasts");
        const at::Tensor got = fused();
        LOPPER_CHECK(got.sizes() == want.sizes() && got.scalar_type() == want.scalar_type(),
                     "gives ", got.scalar_type(), " ", got.sizes(), " instead of ",
                     want.scalar_type(), " ", want.sizes());
        // NOTE: and the same values (to the tolerance of another cuDNN algorithm in this type):
        // a fused graph that ran but computed something else must never be chosen.
        const at::Tensor want_f = want.to(at::kFloat);
        const double err = (got.to(at::kFloat) - want_f).abs().max().item<double>();
        const double scale = want_f.abs().max().item<double>();
        LOPPER_CHECK(err <= 2e-2 * (scale + 1), "differs from the unfused result by ", err);
        cands.push_back({"cudnn-nhwc-fused", fused});
        kinds.push_back(K::kNhwcFused);
      } catch (const std::exception& e) {
        refused.push_back(detail::concat("cudnn-nhwc-fused: ", first_line(e.what())));
      }
    }
    st.kernel = kinds[choose_kernel(c, cands, w, in, std::move(refused))];
  }
  if (st.kernel == K::kNhwcFused) return fused();
  return st.kernel == K::kNhwc ? nhwc() : as_given();
}

using kernels::cpu::widen_bf16;  // a bf16 tensor widened to float32; anything else as it is

// Frees what neither the chosen kernel nor its rival in a trial runs.
void release_unused(ConvState& st) {
  using K = ConvState::Kernel;
  auto kept = [&](std::initializer_list<K> kinds) {
    for (K k : kinds)
      if (st.kernel == k || st.rival == k) return true;
    return false;
  };
  if (!kept({K::kConv})) st.packed.reset();
  if (!kept({K::kLinear})) st.packed_linear.reset();
  if (!kept({K::kDirect, K::kDirectInPlace})) st.direct.reset();
  if (!kept({K::kWinograd})) st.winograd.reset();
  if (!kept({K::kDwRows})) st.dw_rows.reset();
  if (!kept({K::kPrimitive})) st.primitives.clear();
}

// The direct primitive for a layer's input shape: made on the first call with that shape (the
// last four shapes kept), nullptr where oneDNN makes none for it (the reason in `why`).
std::shared_ptr<const dnnl::Conv> primitive_for(ConvState& st, const Conv2dLayer& l, bool residual,
                                                std::string* why) {
  const at::Tensor& in = l.in;
  // (a layer's weight, geometry and activation are fixed: the input shape picks the primitive)
  for (const auto& p : st.primitives) {
    const dnnl::ConvSpec& o = p->spec();
    if (o.n == in.size(0) && o.h == in.size(2) && o.w == in.size(3) && o.residual == residual)
      return p;
  }
  const auto act = onednn::direct_eltwise(l.post);
  if (!act) {
    if (why) *why = "oneDNN's primitive has no NaN-safe form of " + l.post.attr;
    return nullptr;
  }
  dnnl::ConvSpec s;
  s.n = in.size(0), s.c = in.size(1), s.h = in.size(2), s.w = in.size(3);
  s.k = l.w.size(0), s.kh = l.g.kernel[0], s.kw = l.g.kernel[1];
  s.sh = l.g.strides[0], s.sw = l.g.strides[1], s.ph = l.padding[0], s.pw = l.padding[1];
  s.dh = l.g.dilations[0], s.dw = l.g.dilations[1], s.groups = l.g.group;
  s.bf16 = in.scalar_type() == at::kBFloat16;
  s.bias = l.b.defined();
  s.residual = residual;
  s.act = act->first, s.alpha = act->second;
  return onednn::make_kept(
      st.primitives,
      [&] {
        const at::Tensor w = l.w.contiguous();
        const at::Tensor b = s.bias ? l.b.contiguous() : at::Tensor();
        return std::make_shared<const dnnl::Conv>(s, w.data_ptr(), s.bias ? b.data_ptr() : nullptr);
      },
      why);
}

at::Tensor conv2d_cpu(OpContext& c, const Conv2dLayer& l) {
  const at::Tensor &in = l.in, &w = l.w, &b = l.b, &other = l.other;
  // NOTE: a bfloat16 layer (--precision bf16) has oneDNN's bf16 kernels and lopper's own float32
  // ones, which read its input widened to float32 and whose output is rounded back to bf16 (the
  // weights widened once, exactly): where a winograd or direct kernel beats oneDNN's bf16 one
  // with the two conversions counted, it runs, as in float32.
  const bool bf16 = in.scalar_type() == at::kBFloat16;
  auto narrowed = [bf16](const at::Tensor& y) {
    return bf16 ? kernels::cpu::narrow_to_bf16(y) : y;
  };
  const std::vector<int64_t>& padding = l.padding;
  const ConvGeometry& g = l.g;
  const onednn::PostOp& post = l.post;
  auto& st = c.state<ConvState>();
  // lopper's direct kernel reads a channel slice of a channels-last tensor, or a first layer's
  // NCHW input, in place (kernels/cpu/conv.h); the other kernels read channels-last, made in
  // their own candidate below: its copy is part of the time they are chosen on.
  // NOTE: by lopper's copies (an image's few planes, a first layer's input, interleaved: a bf16
  // 3x224x224 image 14 us against ATen's strided copy's 37; BM_FewChannelsLast, AMD EPYC Zen 4).
  auto channels_last = [&] { return kernels::cpu::channels_last_layout(in); };
  std::vector<int64_t> out_shape = {in.size(0), w.size(0)};
  for (size_t i = 0; i < 2; ++i)
    out_shape.push_back((in.size(2 + i) + 2 * padding[i] - g.dilations[i] * (g.kernel[i] - 1) - 1) /
                            g.strides[i] +
                        1);
  bool fused_add =
      other.defined() && other.sizes() == at::IntArrayRef(out_shape) && onednn::usable(other);
  const bool may_conv =
      st.kernel == ConvState::Kernel::kUndecided || st.kernel == ConvState::Kernel::kConv;
  if (!st.packed.defined() && may_conv)
    st.packed = onednn::pack_conv2d_weight(w, padding, g.strides, g.dilations, g.group, in.sizes());
  if (other.defined() && !fused_add) {
    // A broadcasting add: the convolution alone, then the add and the activation.
    at::Tensor y =
        onednn::conv2d(channels_last(), st.packed, b, padding, g.strides, g.dilations, g.group, {});
    return onednn::apply_unfused(y + other, post);
  }
  at::Tensor other_cl = fused_add ? other.contiguous(at::MemoryFormat::ChannelsLast) : at::Tensor();
  auto as_conv = [&] {
    const at::Tensor x = channels_last();
    return fused_add
               ? onednn::conv2d_add(x, other_cl, st.packed, b, padding, g.strides, g.dilations,
                                    g.group, post)
               : onednn::conv2d(x, st.packed, b, padding, g.strides, g.dilations, g.group, post);
  };
  // NOTE: a 1x1 convolution over channels-last data is a matrix product of the [N*H*W, C_in]
  // view; oneDNN's GEMM is sometimes faster than its convolution on it, and lopper's sparse
  // kernels for a sparse weight. Other convolutions run sparse on im2col columns. Timed once,
  // per layer.
  bool pointwise_shape = g.group == 1 && out_shape[2] == in.size(2) && out_shape[3] == in.size(3);
  for (size_t i = 0; i < 2; ++i)
    pointwise_shape = pointwise_shape && g.kernel[i] == 1 && g.strides[i] == 1 && padding[i] == 0;
  const bool pointwise = pointwise_shape && (!fused_add || post.attr == "none");
  int64_t rows = in.size(0) * in.size(2) * in.size(3);
  // The channels-last activation as the [N*H*W, C_in] matrix it already is in memory.
  auto in_rows = [&] { return channels_last().permute({0, 2, 3, 1}).reshape({rows, in.size(1)}); };
  auto as_linear = [&] {
    at::Tensor x2 = in_rows();
    at::Tensor y2 = fused_add ? onednn::linear_add(
                                    x2, other_cl.permute({0, 2, 3, 1}).reshape({rows, w.size(0)}),
                                    st.packed_linear, b)
                              : onednn::linear(x2, st.packed_linear, b, post);
    return y2.view({in.size(0), in.size(2), in.size(3), w.size(0)}).permute({0, 3, 1, 2});
  };
  auto as_sparse = [&](const SparseCandidate& sc) {
    const onednn::PostOp in_kernel = fused_add ? onednn::PostOp{} : post;  // act after the add
    at::Tensor y;
    if (pointwise_shape) {
      y = run_sparse_linear(sc, widen_bf16(in_rows()), in_kernel)
              .view({in.size(0), out_shape[2], out_shape[3], w.size(0)})
              .permute({0, 3, 1, 2});
    } else {
      at::Tensor cols =
          at::im2col(widen_bf16(channels_last()), g.kernel, g.dilations, padding, g.strides);
      y = run_sparse_cols(sc, cols, in_kernel).view(out_shape);
    }
    return narrowed(fused_add ? onednn::apply_unfused(y.add_(widen_bf16(other_cl)), post) : y);
  };
  auto direct = [&](bool in_place) {  // in_place: a grouped layer's groups not copied first
    const kernels::cpu::Activation act = fused_activation(post);
    // A bf16 layer on the CPU's bfloat16 dot product where it has one (dense, or groups of an
    // even channel count): x, the residual and y bf16 as they are.
    if (bf16 && st.direct->takes_bf16())
      return finish_activation(st.direct->run(in, other_cl, act, in_place), post, act);
    at::Tensor y = st.direct->run(widen_bf16(in), widen_bf16(other_cl), act, in_place);
    return narrowed(finish_activation(y, post, act));
  };
  auto as_direct = [&] { return direct(false); };
  auto as_direct_in_place = [&] { return direct(true); };
  // oneDNN's primitive called directly: channels-last in and out, the residual and the NaN-safe
  // part of the activation inside it, the rest in place after.
  auto as_primitive = [&] {
    auto prim = primitive_for(st, l, fused_add, nullptr);
    if (!prim) {  // a new input shape oneDNN makes no primitive for: ATen's oneDNN op
      if (!st.packed.defined())
        st.packed =
            onednn::pack_conv2d_weight(w, padding, g.strides, g.dilations, g.group, in.sizes());
      return as_conv();
    }
    at::Tensor x = channels_last();
    if (!x.is_contiguous(at::MemoryFormat::ChannelsLast))
      x = x.contiguous(at::MemoryFormat::ChannelsLast);
    at::Tensor y = at::empty(out_shape, in.options().memory_format(at::MemoryFormat::ChannelsLast));
    at::Tensor scratch =
        at::empty({int64_t(prim->scratchpad_bytes())}, in.options().dtype(at::kByte));
    prim->run(x.data_ptr(), fused_add ? other_cl.data_ptr() : nullptr, y.data_ptr(),
              scratch.data_ptr());
    return onednn::after_primitive(y, post);
  };
  auto as_winograd = [&] {  // bf16: read and written as it is (widened and rounded in the kernel)
    const kernels::cpu::Activation act = fused_activation(post);
    return finish_activation(st.winograd->run(in, other_cl, act), post, act);
  };
  auto as_dw_rows = [&] {
    const kernels::cpu::Activation act = fused_activation(post);
    return finish_activation(st.dw_rows->run(in, other_cl), post, act);
  };
  using K = ConvState::Kernel;
  auto dispatch = [&](K kind) {
    if (kind == K::kSparse) return as_sparse(st.sparse);
    if (kind == K::kDirect) return as_direct();
    if (kind == K::kDirectInPlace) return as_direct_in_place();
    if (kind == K::kWinograd) return as_winograd();
    if (kind == K::kDwRows) return as_dw_rows();
    if (kind == K::kPrimitive) return as_primitive();
    return kind == K::kLinear ? as_linear() : as_conv();
  };
  if (st.kernel == K::kUndecided) {
    std::vector<KernelCandidate> cands{{"onednn-conv", as_conv}};
    std::vector<K> kinds{K::kConv};
    std::vector<std::string> refused;
    // NOTE: the same library without ATen's per-call descriptor, hashing and cache lookup (see
    // dnnl/primitives.h): 23-27 us less a call.
    onednn::note_direct_unavailable(refused);
    if (dnnl::available() && (!fused_add || other_cl.scalar_type() == in.scalar_type())) {
      std::string why;
      if (auto prim = primitive_for(st, l, fused_add, &why)) {
        cands.push_back({"onednn-direct", as_primitive, prim->implementation()});
        kinds.push_back(K::kPrimitive);
      } else {
        refused.push_back("onednn-direct: " + why);
      }
    }
    // NOTE: lopper's own direct and depthwise kernels: no blocked layout to convert to and from,
    // no primitive to look up per call; they win on small images and on the odd channel counts
    // structured pruning leaves.
    const at::Tensor w32 = widen_bf16(w), b32 = widen_bf16(b);
    if (kernels::cpu::DirectConv::takes(w32, g.group, in.size(1))) {
      kernels::cpu::DirectConv::Geometry dg;
      dg.sh = g.strides[0], dg.sw = g.strides[1], dg.ph = padding[0], dg.pw = padding[1];
      dg.dh = g.dilations[0], dg.dw = g.dilations[1];
      auto d = std::make_shared<kernels::cpu::DirectConv>(w32, b32, g.group, dg,
                                                          kernels::cpu::active_isa(), bf16);
      // NOTE: a bf16 layer on the bfloat16 dot product runs its bf16 pairs alone (its input's
      // type is fixed by the graph): the float32 packing would only hold memory, twice the pairs'.
      if (bf16 && d->takes_bf16()) d->keep_bf16_only();
      st.direct = std::move(d);
      cands.push_back({st.direct->name(), as_direct});
      kinds.push_back(K::kDirect);
      // (a bf16 layer on the dot product runs its groups in place either way)
      if (st.direct->gathers() && !(bf16 && st.direct->takes_bf16())) {
        cands.push_back({"lopper-grouped-in-place", as_direct_in_place});
        kinds.push_back(K::kDirectInPlace);
      }
      // NOTE: a bf16 depthwise layer also runs as the chain kernel's depthwise stage alone, which
      // widens and rounds a row at a time (the widened whole-tensor candidate above moves 3x the
      // bytes of the layer's bf16 input and output).
      using kernels::cpu::ConvChain;
      if (bf16 && st.direct->depthwise() && ConvChain::takes(nullptr, w32, nullptr, true)) {
        st.dw_rows = std::make_shared<const ConvChain>(std::nullopt, w32, b32, dg,
                                                       fused_activation(post), std::nullopt);
        cands.push_back({"lopper-depthwise-rows", as_dw_rows});
        kinds.push_back(K::kDwRows);
      }
      // NOTE: a quarter of the arithmetic on evenly tiled maps, more memory traffic (36
      // transformed weight matrices): it wins on the 3x3 layers of wide enough maps.
      using kernels::cpu::WinogradConv;
      if (WinogradConv::takes(w32, g.group, dg) &&
          WinogradConv::pays(g.group, WinogradConv::tiles(in.size(0), out_shape[2], out_shape[3]),
                             bf16 && st.direct->takes_bf16(), w.size(0))) {
        st.winograd = std::make_shared<const WinogradConv>(w32, b32, g.group, dg);
        cands.push_back({WinogradConv::kName, as_winograd});
        kinds.push_back(K::kWinograd);
      }
    }
    if (pointwise) {
      st.packed_linear = onednn::pack_linear_weight(w.reshape({w.size(0), w.size(1)}), rows);
      cands.push_back({"onednn-linear", as_linear});
      kinds.push_back(K::kLinear);
    }
    std::vector<SparseCandidate> sparse;
    if (g.group == 1)
      sparse = sparse_candidates(w32.reshape({w.size(0), -1}), b32,
                                 pointwise_shape ? std::vector<kernels::cpu::Algo>{}
                                                 : std::vector{kernels::cpu::Algo::kCols});
    for (const auto& sc : sparse) {
      cands.push_back(
          {pointwise_shape ? sc.name : sc.name + "-im2col", [&as_sparse, sc] { as_sparse(sc); }});
      kinds.push_back(K::kSparse);
    }
    // NOTE: the sparse candidates keep one chosen format; the others take part in a trial in the
    // model where their lone times are close (see InModelTrial).
    const KernelChoice choice = choose_kernel_in_model(
        c, cands, w, in, [&](size_t i) { return kinds[i] != K::kSparse; }, std::move(refused));
    const size_t best = choice.best;
    st.kernel = kinds[best];
    if (choice.rival != KernelChoice::kNone) {
      st.rival = kinds[choice.rival];
      st.trial = InModelTrial(choice, cands[best].name, cands[choice.rival].name);
    }
    if (st.kernel == K::kSparse) st.sparse = sparse[best - (cands.size() - sparse.size())];
    release_unused(st);
    return dispatch(st.kernel);  // the choosing call: not part of the trial
  }
  if (!st.trial.active()) return dispatch(st.kernel);
  return st.trial.run_next(c, st.kernel, st.rival, K::kUndecided, dispatch,
                           [&] { release_unused(st); });
}

// ai.lopper.ConvChain(x [, residual]), body: an inverted residual's [1x1 expansion ->] depthwise
// (or a ResNeXt bottleneck's narrow-grouped) [-> 1x1 projection] convolutions
// (exec/fusion/fuse_conv_chain.cpp). On the CPU in float32 and bf16 both ways are timed once on
// the real input, and take turns in the model where they timed close (InModelTrial): lopper's one
// pass over the rows (kernels/cpu/chain.h) and the body layer by layer (each convolution with its
// own kernel choice); anywhere else the body runs.
struct ChainState {
  enum class Way { kLayers, kChain, kNone };
  std::shared_ptr<const kernels::cpu::ConvChain> chain;  // null: layer by layer
  bool decided = false;
  Way way = Way::kLayers;
  Way rival = Way::kNone;  // the other way, while the two take turns in the model
  InModelTrial trial;
};

// The one-pass chain of `body`'s convolutions, or null where its kernels do not take them (an
// activation they do not fuse, a weight that is not float32).
std::shared_ptr<const kernels::cpu::ConvChain> chain_of(const ir::Graph& body, bool bf16) {
  using kernels::cpu::ConvChain;
  std::optional<ConvChain::Pointwise> expand, project;
  const ir::Node* dw = nullptr;
  kernels::cpu::DirectConv::Geometry g;
  auto tensor = [&](const ir::Node& n, size_t i) {  // float32: a bf16 weight widened
    const ir::Initializer* t =
        i < n.inputs.size() && !n.inputs[i].empty() ? body.find_initializer(n.inputs[i]) : nullptr;
    return t ? widen_bf16(t->value) : at::Tensor();
  };
  for (const ir::Node& n : body.nodes) {
    const AttrReader attrs(n);
    const onednn::PostOp post = onednn::post_op_of(attrs);
    const kernels::cpu::Activation act = fused_activation(post);
    if (!post.attr.empty() && post.attr != "none" && act.kind == kernels::cpu::Activation::kNone)
      return nullptr;
    const at::Tensor w = tensor(n, 1), b = tensor(n, 2);
    if (!w.defined() || w.dim() != 4) return nullptr;
    if (attrs.attr_int("group", 1) > 1) {
      if (attrs.attr_int("group", 1) * w.size(1) != w.size(0))
        return nullptr;  // channels in != out
      dw = &n;
      const auto strides = attrs.attr_ints("strides", {1, 1});
      const auto pads = attrs.attr_ints("pads", {0, 0, 0, 0});
      const auto dil = attrs.attr_ints("dilations", {1, 1});
      if (strides.size() != 2 || pads.size() != 4 || dil.size() != 2 || pads[0] != pads[2] ||
          pads[1] != pads[3])
        return nullptr;
      g.sh = strides[0], g.sw = strides[1], g.ph = pads[0], g.pw = pads[1];
      g.dh = dil[0], g.dw = dil[1];
    } else {
      (dw ? project : expand) = ConvChain::Pointwise{w, b, act};
    }
  }
  if (!dw) return nullptr;
  const at::Tensor dw_w = tensor(*dw, 1), dw_b = tensor(*dw, 2);
  if (!ConvChain::takes(expand ? &*expand : nullptr, dw_w, project ? &*project : nullptr))
    return nullptr;
  const kernels::cpu::Activation dw_act = fused_activation(onednn::post_op_of(AttrReader(*dw)));
  return std::make_shared<const ConvChain>(expand, dw_w, dw_b, g, dw_act, project,
                                           kernels::cpu::active_isa(), bf16);
}

}  // namespace

std::optional<at::Tensor> conv2d_by_kernel(OpContext& c, const Conv2dLayer& l) {
  const at::Tensor &x = l.x, &b = l.b;
  // (an empty weight, of no input or no output channels, is ATen's alone: oneDNN makes no
  // primitive for it)
  if (x.dim() != 4 || !c.prepack() || !c.is_constant(1) || (b.defined() && !c.is_constant(2)) ||
      l.w.numel() == 0)
    return std::nullopt;
  // NOTE: inference on the CPU runs oneDNN with the weight reordered once and the activations in
  // channels-last layout (kept from one convolution to the next), the layout its kernels read
  // without reorders; the activation and residual add are fused into the kernel.
  // NOTE: in bfloat16 too (--precision bf16): oneDNN's bf16 primitives with the weight packed once,
  // beside lopper's float32 kernels on widened rows (conv2d_cpu). ATen's bf16 convolution reorders
  // the weight at every call and ran resnet18 no faster than fp32 (AMD EPYC Zen 4).
  const bool one_type = l.w.scalar_type() == x.scalar_type() &&
                        (!b.defined() || b.scalar_type() == x.scalar_type()) &&
                        (!l.other.defined() || l.other.scalar_type() == x.scalar_type());
  if (one_type && onednn::usable(x) && onednn::usable(l.w)) return conv2d_cpu(c, l);
  if (x.is_cuda()) return conv2d_cuda(c, l.in, l.w, b, l.other, l.padding, l.g, l.post);
  return std::nullopt;
}

at::Tensor conv_chain_by_kernel(OpContext& c, const ir::Graph& body,
                                const std::function<at::Tensor()>& layers) {
  const at::Tensor& x = c.input(0);
  // NOTE: a bfloat16 chain runs lopper's (float32 weights, bf16 rows in and out: ConvChain::run)
  // where that beats its layers by oneDNN's bf16 kernels.
  if (!(x.dim() == 4 && x.device().is_cpu() &&
        (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16) && c.prepack()))
    return layers();
  auto& st = c.state<ChainState>();
  using Way = ChainState::Way;
  const at::Tensor residual = c.has_input(1) ? c.input(1) : at::Tensor();
  auto run = [&](Way way) { return way == Way::kChain ? st.chain->run(x, residual) : layers(); };
  // What the way kept does not run goes: the chain, or the layers' packed weights.
  auto release = [&] {
    if (st.way == Way::kChain)
      c.release_subgraph_state(body);
    else
      st.chain.reset();
  };
  if (!st.decided) {
    st.decided = true;
    // LOPPER_FORCE_KERNEL that does not name the chain forces the kernels of its layers.
    const std::optional<bool> forced = kernel_forced("lopper-chain");
    st.chain = forced.value_or(true) ? chain_of(body, x.scalar_type() == at::kBFloat16) : nullptr;
    st.way = st.chain ? Way::kChain : Way::kLayers;
    if (st.chain && !forced) {
      // NOTE: timed alone, the layers' expanded activation stays in the caches between them; in
      // the model it does not. MobileNetV2's block 2 (16 -> 96 at 112x112, depthwise stride 2,
      // 96 -> 24) timed 0.53 ms both ways alone, and took 0.9-1.0 ms layer by layer in the model
      // (AMD EPYC Zen 4): where the two ways time close alone, they take turns in the model
      // (InModelTrial) and the faster there is kept.
      const ir::Node* dw = nullptr;
      for (const ir::Node& n : body.nodes)
        if (AttrReader(n).attr_int("group", 1) > 1) dw = &n;
      const std::vector<KernelCandidate> cands{
          {"layer-by-layer", [&] { layers(); }},
          {"lopper-chain", [&] { st.chain->run(x, residual); }}};
      const KernelChoice choice = choose_kernel_in_model(
          c, cands, body.find_initializer(dw->inputs[1])->value, x, [](size_t) { return true; });
      st.way = choice.best == 0 ? Way::kLayers : Way::kChain;
      if (choice.rival != KernelChoice::kNone) {
        st.rival = st.way == Way::kChain ? Way::kLayers : Way::kChain;
        st.trial = InModelTrial(choice, cands[choice.best].name, cands[choice.rival].name);
      } else {
        release();
      }
    }
    return run(st.way);  // the choosing call: not part of the trial
  }
  if (!st.trial.active()) return run(st.way);
  return st.trial.run_next(c, st.way, st.rival, Way::kNone, run, release);
}

}  // namespace lopper::ops
