// Conv and ConvTranspose (1-D, 2-D, 3-D; groups, dilations, asymmetric and automatic padding),
// and Col2Im, the inverse of the im2col a convolution unrolls to.
#include "kernels/cpu/conv.h"
#include "exec/kernel_choice.h"
#include "exec/onednn.h"
#include "exec/sparse_linear.h"
#include "kernels/cpu/chain.h"
#include "kernels/cpu/winograd.h"
#include "lopper/memory.h"
#include "ops/channels.h"
#include "ops/conv_geometry.h"
#include "ops/op.h"

#include <cstdlib>
#include <string_view>

namespace lopper::ops {

ConvGeometry read_conv_geometry(const AttrReader& c, const at::Tensor& w,
                                at::IntArrayRef in_spatial, bool transposed) {
  size_t n = in_spatial.size();
  ConvGeometry g;
  g.kernel = c.attr_ints("kernel_shape", {});
  if (g.kernel.empty())
    for (size_t i = 0; i < n; ++i) g.kernel.push_back(w.size(2 + i));
  c.check(g.kernel.size() == n, "kernel_shape has ", g.kernel.size(), " dims, input has ", n,
          " spatial dims");
  for (size_t i = 0; i < n; ++i)
    c.check(g.kernel[i] == w.size(2 + i), "kernel_shape ", g.kernel[i], " != weight dim ",
            w.size(2 + i));
  g.strides = c.attr_ints("strides", std::vector<int64_t>(n, 1));
  g.dilations = c.attr_ints("dilations", std::vector<int64_t>(n, 1));
  g.group = c.attr_int("group", 1);
  c.check(g.strides.size() == n && g.dilations.size() == n, "strides/dilations need ", n,
          " values");
  for (size_t i = 0; i < n; ++i)
    c.check(g.strides[i] > 0 && g.dilations[i] > 0, "strides and dilations must be positive");
  c.check(g.group > 0, "group must be positive, got ", g.group);
  auto pads = c.attr_ints("pads", std::vector<int64_t>(2 * n, 0));
  c.check(pads.size() == 2 * n, "pads needs ", 2 * n, " values, got ", pads.size());
  for (int64_t p : pads) c.check(p >= 0, "negative pads are not allowed");
  g.pads_begin.assign(pads.begin(), pads.begin() + n);
  g.pads_end.assign(pads.begin() + n, pads.end());
  std::string auto_pad = c.attr_string("auto_pad", "NOTSET");
  if (auto_pad == "VALID") {
    std::fill(g.pads_begin.begin(), g.pads_begin.end(), 0);
    std::fill(g.pads_end.begin(), g.pads_end.end(), 0);
  } else if ((auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") && !transposed) {
    for (size_t i = 0; i < n; ++i) {
      int64_t out = (in_spatial[i] + g.strides[i] - 1) / g.strides[i];
      int64_t eff = (g.kernel[i] - 1) * g.dilations[i] + 1;
      int64_t total = std::max<int64_t>(0, (out - 1) * g.strides[i] + eff - in_spatial[i]);
      int64_t small = total / 2, large = total - small;
      g.pads_begin[i] = auto_pad == "SAME_UPPER" ? small : large;
      g.pads_end[i] = auto_pad == "SAME_UPPER" ? large : small;
    }
  } else if (auto_pad != "NOTSET" && auto_pad != "SAME_UPPER" && auto_pad != "SAME_LOWER") {
    c.fail("unknown auto_pad '", auto_pad, "'");
  }
  return g;
}

// ATen's constant_pad_nd takes pads for the last dim first.
at::Tensor pad_spatial(const at::Tensor& x, const std::vector<int64_t>& begin,
                       const std::vector<int64_t>& end) {
  std::vector<int64_t> p;
  for (size_t i = begin.size(); i-- > 0;) {
    p.push_back(begin[i]);
    p.push_back(end[i]);
  }
  return at::constant_pad_nd(x, p, 0);
}

namespace {

struct ConvState {
  at::Tensor packed;         // oneDNN convolution weight, reordered for the first input shape
  at::Tensor packed_linear;  // for 1x1 convolutions: the weight as a oneDNN linear layer's
  SparseCandidate sparse;    // a sparse weight as [C_out, C_in * kernel]
  std::shared_ptr<const kernels::cpu::DirectConv> direct;      // lopper's own dense kernel
  std::shared_ptr<const kernels::cpu::WinogradConv> winograd;  // and its 3x3 F(4x4, 3x3)
  enum class Kernel {
    kUndecided,
    kConv,
    kLinear,
    kSparse,
    kDirect,
    kDirectInPlace,  // lopper's grouped kernel, the groups read in place (not copied)
    kWinograd
  } kernel = Kernel::kUndecided;
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

// Conv, and FusedConv = activation(Conv(X, W, B) + Other) with inputs X, W, B?, Other?.
void conv_forward(OpContext& c) {
  const at::Tensor& x = c.input(0);
  const at::Tensor& w = c.input(1);
  c.check(x.dim() >= 3 && x.dim() <= 5, "input must be 3-D to 5-D, got ", x.dim(), "-D");
  c.check(w.dim() == x.dim(), "weight rank ", w.dim(), " != input rank ", x.dim());
  at::Tensor b = c.has_input(2) ? c.input(2) : at::Tensor();
  at::Tensor other = c.has_input(3) ? c.input(3) : at::Tensor();
  auto post = onednn::post_op_of(c);
  auto g = read_conv_geometry(c, w, x.sizes().slice(2), false);
  c.check(x.size(1) == w.size(1) * g.group, "input has ", x.size(1), " channels, weight expects ",
          w.size(1) * g.group, " (", w.size(1), " x group ", g.group, ")");
  c.check(w.size(0) % g.group == 0, "output channels ", w.size(0), " not divisible by group ",
          g.group);
  if (b.defined())
    c.check(b.dim() == 1 && b.size(0) == w.size(0), "bias must be [", w.size(0), "]");
  at::Tensor in = x;
  std::vector<int64_t> padding = g.pads_begin;
  if (g.pads_begin != g.pads_end) {
    in = pad_spatial(x, g.pads_begin, g.pads_end);
    std::fill(padding.begin(), padding.end(), 0);
  }
  // NOTE: inference on the CPU runs oneDNN with the weight reordered once and the activations in
  // channels-last layout (kept from one convolution to the next), the layout its kernels read
  // without reorders; the activation and residual add are fused into the kernel.
  if (x.dim() == 4 && c.prepack() && c.is_constant(1) && (!b.defined() || c.is_constant(2)) &&
      onednn::usable(x) && onednn::usable(w)) {
    auto& st = c.state<ConvState>();
    // lopper's direct kernel reads a channel slice of a channels-last tensor, or a first layer's
    // NCHW input, in place (kernels/cpu/conv.h); the other kernels read channels-last, made in
    // their own candidate below: its copy is part of the time they are chosen on.
    auto channels_last = [&] { return in.contiguous(at::MemoryFormat::ChannelsLast); };
    std::vector<int64_t> out_shape = {in.size(0), w.size(0)};
    for (size_t i = 0; i < 2; ++i)
      out_shape.push_back(
          (in.size(2 + i) + 2 * padding[i] - g.dilations[i] * (g.kernel[i] - 1) - 1) /
              g.strides[i] +
          1);
    bool fused_add =
        other.defined() && other.sizes() == at::IntArrayRef(out_shape) && onednn::usable(other);
    const bool may_conv =
        st.kernel == ConvState::Kernel::kUndecided || st.kernel == ConvState::Kernel::kConv;
    if (!st.packed.defined() && may_conv)
      st.packed =
          onednn::pack_conv2d_weight(w, padding, g.strides, g.dilations, g.group, in.sizes());
    if (other.defined() && !fused_add) {
      // A broadcasting add: the convolution alone, then the add and the activation.
      at::Tensor y = onednn::conv2d(channels_last(), st.packed, b, padding, g.strides, g.dilations,
                                    g.group, {});
      c.set_output(0, onednn::apply_unfused(y + other, post));
      return;
    }
    at::Tensor other_cl =
        fused_add ? other.contiguous(at::MemoryFormat::ChannelsLast) : at::Tensor();
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
    auto in_rows = [&] {
      return channels_last().permute({0, 2, 3, 1}).reshape({rows, in.size(1)});
    };
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
        y = run_sparse_linear(sc, in_rows(), in_kernel)
                .view({in.size(0), out_shape[2], out_shape[3], w.size(0)})
                .permute({0, 3, 1, 2});
      } else {
        at::Tensor cols = at::im2col(channels_last(), g.kernel, g.dilations, padding, g.strides);
        y = run_sparse_cols(sc, cols, in_kernel).view(out_shape);
      }
      return fused_add ? onednn::apply_unfused(y.add_(other_cl), post) : y;
    };
    auto direct = [&](bool in_place) {  // in_place: a grouped layer's groups not copied first
      const kernels::cpu::Activation act = fused_activation(post);
      at::Tensor y = st.direct->run(in, other_cl, act, in_place);
      return finish_activation(y, post, act);
    };
    auto as_direct = [&] { return direct(false); };
    auto as_direct_in_place = [&] { return direct(true); };
    auto as_winograd = [&] {
      const kernels::cpu::Activation act = fused_activation(post);
      at::Tensor y = st.winograd->run(in, other_cl, act);
      return finish_activation(y, post, act);
    };
    using K = ConvState::Kernel;
    if (st.kernel == K::kUndecided) {
      std::vector<KernelCandidate> cands{{"onednn-conv", as_conv}};
      std::vector<K> kinds{K::kConv};
      // NOTE: lopper's own direct and depthwise kernels: no blocked layout to convert to and from,
      // no primitive to look up per call; they win on small images and on the odd channel counts
      // structured pruning leaves.
      if (kernels::cpu::DirectConv::takes(w, g.group, in.size(1))) {
        kernels::cpu::DirectConv::Geometry dg;
        dg.sh = g.strides[0], dg.sw = g.strides[1], dg.ph = padding[0], dg.pw = padding[1];
        dg.dh = g.dilations[0], dg.dw = g.dilations[1];
        st.direct = std::make_shared<const kernels::cpu::DirectConv>(w, b, g.group, dg);
        cands.push_back({st.direct->name(), as_direct});
        kinds.push_back(K::kDirect);
        if (st.direct->gathers()) {
          cands.push_back({"lopper-grouped-in-place", as_direct_in_place});
          kinds.push_back(K::kDirectInPlace);
        }
        // NOTE: a quarter of the arithmetic on evenly tiled maps, more memory traffic (36
        // transformed weight matrices): it wins on the 3x3 layers of wide enough maps.
        using kernels::cpu::WinogradConv;
        if (WinogradConv::takes(w, g.group, dg) &&
            WinogradConv::pays(g.group,
                               WinogradConv::tiles(in.size(0), out_shape[2], out_shape[3]))) {
          st.winograd = std::make_shared<const WinogradConv>(w, b, g.group, dg);
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
        sparse = sparse_candidates(w.reshape({w.size(0), -1}), b,
                                   pointwise_shape ? std::vector<kernels::cpu::Algo>{}
                                                   : std::vector{kernels::cpu::Algo::kCols});
      for (const auto& sc : sparse) {
        cands.push_back(
            {pointwise_shape ? sc.name : sc.name + "-im2col", [&as_sparse, sc] { as_sparse(sc); }});
        kinds.push_back(K::kSparse);
      }
      size_t best = choose_kernel(c, cands, w, in);
      st.kernel = kinds[best];
      if (st.kernel == K::kSparse) st.sparse = sparse[best - (cands.size() - sparse.size())];
      if (st.kernel != K::kConv) st.packed.reset();
      if (st.kernel != K::kLinear) st.packed_linear.reset();
      if (st.kernel != K::kDirect && st.kernel != K::kDirectInPlace) st.direct.reset();
      if (st.kernel != K::kWinograd) st.winograd.reset();
    }
    if (st.kernel == K::kSparse) return c.set_output(0, as_sparse(st.sparse));
    if (st.kernel == K::kDirect) return c.set_output(0, as_direct());
    if (st.kernel == K::kDirectInPlace) return c.set_output(0, as_direct_in_place());
    if (st.kernel == K::kWinograd) return c.set_output(0, as_winograd());
    c.set_output(0, st.kernel == ConvState::Kernel::kLinear ? as_linear() : as_conv());
    return;
  }
  if (x.dim() == 4 && x.is_cuda() && c.prepack() && c.is_constant(1) &&
      (!b.defined() || c.is_constant(2))) {
    return c.set_output(0, conv2d_cuda(c, in, w, b, other, padding, g, post));
  }
  at::Tensor y = at::convolution(in, w, b, g.strides, padding, g.dilations, false,
                                 std::vector<int64_t>(padding.size(), 0), g.group);
  if (other.defined()) y = y + other;
  c.set_output(0, onednn::apply_unfused(y, post));
}

// ai.lopper.ConvChain(x [, residual]), body: an inverted residual's [1x1 expansion ->] depthwise
// [-> 1x1 projection] convolutions (exec/fuse.cpp). On the CPU in float32 both ways are timed once
// on the real input: lopper's one pass over the rows (kernels/cpu/chain.h) and the body layer by
// layer (each convolution with its own kernel choice); anywhere else the body runs.
struct ChainState {
  std::shared_ptr<const kernels::cpu::ConvChain> chain;  // null: layer by layer
  bool decided = false;
};

// The one-pass chain of `body`'s convolutions, or null where its kernels do not take them (an
// activation they do not fuse, a weight that is not float32).
std::shared_ptr<const kernels::cpu::ConvChain> chain_of(const ir::Graph& body) {
  using kernels::cpu::ConvChain;
  std::optional<ConvChain::Pointwise> expand, project;
  const ir::Node* dw = nullptr;
  kernels::cpu::DirectConv::Geometry g;
  auto tensor = [&](const ir::Node& n, size_t i) {
    const ir::Initializer* t =
        i < n.inputs.size() && !n.inputs[i].empty() ? body.find_initializer(n.inputs[i]) : nullptr;
    return t ? t->value : at::Tensor();
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
  return std::make_shared<const ConvChain>(expand, dw_w, dw_b, g, dw_act, project);
}

void conv_chain_forward(OpContext& c) {
  const ir::Attribute* a = c.node().attr("body");
  c.check(a && a->g, "needs its 'body' graph");
  const ir::Graph& body = *a->g;
  std::vector<at::Tensor> ins{c.input(0)};
  if (c.has_input(1)) ins.push_back(c.input(1));
  auto layers = [&] { return c.run_subgraph(body, ins).at(0); };
  const at::Tensor& x = c.input(0);
  if (!(x.dim() == 4 && x.device().is_cpu() && x.scalar_type() == at::kFloat && c.prepack()))
    return c.set_output(0, layers());
  auto& st = c.state<ChainState>();
  const at::Tensor residual = c.has_input(1) ? c.input(1) : at::Tensor();
  if (!st.decided) {
    st.decided = true;
    // LOPPER_FORCE_KERNEL that does not name the chain forces the kernels of its layers.
    const std::optional<bool> forced = kernel_forced("lopper-chain");
    st.chain = forced.value_or(true) ? chain_of(body) : nullptr;
    if (st.chain && !forced) {
      // NOTE: the chain gets the margin a lone kernel of lopper's own gets (kernel_choice.h):
      // timed alone, the layers' expanded activation stays in the caches between them; in the
      // model it did not. MobileNetV2's block 2 (16 -> 96 at 112x112, depthwise stride 2, 96 ->
      // 24) timed 0.458 ms layer by layer and 0.499 as a chain alone, and took 0.64-0.71 ms
      // layer by layer and 0.53 as a chain in the model.
      const ir::Node* dw = nullptr;
      for (const ir::Node& n : body.nodes)
        if (AttrReader(n).attr_int("group", 1) > 1) dw = &n;
      const std::vector<KernelCandidate> cands{
          {"layer-by-layer", [&] { layers(); }},
          {"lopper-chain", [&] { st.chain->run(x, residual); }}};
      if (choose_kernel(c, cands, body.find_initializer(dw->inputs[1])->value, x, {}, true) == 0)
        st.chain.reset();
      else
        c.release_subgraph_state(body);  // the layers' packed weights, timed above, go
    }
  }
  c.set_output(0, st.chain ? st.chain->run(x, residual) : layers());
}

int64_t conv_macs(const MacContext& m) {
  if (m.in_shapes.size() < 2 || m.out_shapes.empty() || m.out_shapes[0].size() < 3) return 0;
  const auto& w = m.in_shapes[1];   // [Cout, Cin/group, k...]
  const auto& y = m.out_shapes[0];  // [N, Cout, out...]
  int64_t per_output = 1;
  for (size_t i = 1; i < w.size(); ++i) per_output *= w[i];
  return numel_of(y) * per_output;
}

void conv_transpose_forward(OpContext& c) {
  const at::Tensor& x = c.input(0);
  const at::Tensor& w = c.input(1);  // [Cin, Cout/group, k...]
  c.check(x.dim() >= 3 && x.dim() <= 5, "input must be 3-D to 5-D, got ", x.dim(), "-D");
  c.check(w.dim() == x.dim(), "weight rank ", w.dim(), " != input rank ", x.dim());
  at::Tensor b = c.has_input(2) ? c.input(2) : at::Tensor();
  auto in_spatial = x.sizes().slice(2);
  size_t n = in_spatial.size();
  auto g = read_conv_geometry(c, w, in_spatial, true);
  c.check(x.size(1) == w.size(0), "input has ", x.size(1), " channels, weight expects ", w.size(0));
  c.check(w.size(0) % g.group == 0, "input channels ", w.size(0), " not divisible by group ",
          g.group);
  int64_t out_channels = w.size(1) * g.group;
  if (b.defined())
    c.check(b.dim() == 1 && b.size(0) == out_channels, "bias must be [", out_channels, "]");
  auto output_padding = c.attr_ints("output_padding", std::vector<int64_t>(n, 0));
  c.check(output_padding.size() == n, "output_padding needs ", n, " values");
  auto output_shape = c.attr_ints("output_shape", {});
  std::string auto_pad = c.attr_string("auto_pad", "NOTSET");
  if (output_shape.size() == n + 2)
    output_shape.erase(output_shape.begin(), output_shape.begin() + 2);
  c.check(output_shape.empty() || output_shape.size() == n, "output_shape needs ", n, " values");

  std::vector<int64_t> full(n);  // output size with no padding
  for (size_t i = 0; i < n; ++i)
    full[i] = (in_spatial[i] - 1) * g.strides[i] + (g.kernel[i] - 1) * g.dilations[i] + 1;
  if (!output_shape.empty() || auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
    for (size_t i = 0; i < n; ++i) {
      int64_t target = !output_shape.empty() ? output_shape[i] : in_spatial[i] * g.strides[i];
      int64_t total = full[i] + output_padding[i] - target;
      // NOTE: floor division, as ONNX's reference computes it; a negative total (an output larger
      // than the kernel's reach) then zero-extends the end.
      int64_t half = total >= 0 ? total / 2 : -((-total + 1) / 2);
      if (auto_pad == "SAME_UPPER") {
        g.pads_begin[i] = half;
        g.pads_end[i] = total - half;
      } else {
        g.pads_begin[i] = total - half;
        g.pads_end[i] = half;
      }
    }
  }
  bool simple = true;
  for (size_t i = 0; i < n; ++i)
    simple &= g.pads_begin[i] == g.pads_end[i] && g.pads_begin[i] >= 0 &&
              output_padding[i] < std::max(g.strides[i], g.dilations[i]);
  if (simple) {
    c.set_output(0, at::convolution(x, w, b, g.strides, g.pads_begin, g.dilations, true,
                                    output_padding, g.group));
    return;
  }
  // General case: the full output, then crop (or zero-extend) each side, then the bias.
  at::Tensor y = at::convolution(x, w, {}, g.strides, std::vector<int64_t>(n, 0), g.dilations, true,
                                 std::vector<int64_t>(n, 0), g.group);
  std::vector<int64_t> p;
  for (size_t i = n; i-- > 0;) {
    p.push_back(-g.pads_begin[i]);
    p.push_back(-g.pads_end[i] + output_padding[i]);
  }
  y = at::constant_pad_nd(y, p, 0);
  if (b.defined()) {
    std::vector<int64_t> shape(x.dim(), 1);
    shape[1] = out_channels;
    y = y + b.view(shape);
  }
  c.set_output(0, y);
}

int64_t conv_transpose_macs(const MacContext& m) {
  if (m.in_shapes.size() < 2 || m.in_shapes[0].size() < 3) return 0;
  const auto& x = m.in_shapes[0];  // [N, Cin, in...]
  const auto& w = m.in_shapes[1];  // [Cin, Cout/group, k...]
  int64_t per_input = 1;
  for (size_t i = 1; i < w.size(); ++i) per_input *= w[i];
  return numel_of(x) * per_input;
}

// Channel rules. A Conv's output channels are new atoms (its filters); its input channels shrink
// the weight's axis 1. Depthwise convolutions carry their input's channels through (the group
// attribute follows); other grouped convolutions lose as many channels from each group.
void conv_channels(ChannelContext& c) {
  at::Tensor w = c.constant(1);
  if (!w.defined() || w.dim() < 3) return c.barrier("Conv weight computed at run time");
  const Tracked* x = c.in(0);
  if (x && x->axis != 1) return c.barrier("Conv input tracked off the channel axis");
  const int64_t group = c.attr_int("group", 1), cout = w.size(0), cin = w.size(1) * group;
  const bool bias = c.has_input(2);
  if (group == 1) {
    if (x) c.slice(1, 1, x->atoms, ParamRole::kWeightIn);
    auto out = c.fresh(cout);
    c.slice(1, 0, out, ParamRole::kWeightOut);
    if (bias) c.slice(2, 0, out, ParamRole::kOther);
    return c.set_out(0, Tracked{1, out});
  }
  if (group == cin && cout % cin == 0) {  // depthwise, channel multiplier cout / cin
    if (!x) return;
    const int64_t mult = cout / cin;
    std::vector<int64_t> out;
    for (int64_t a : x->atoms)
      for (int64_t j = 0; j < mult; ++j) out.push_back(a);
    c.slice(1, 0, out, ParamRole::kWeightOut);
    if (bias) c.slice(2, 0, out, ParamRole::kOther);
    auto in = x->atoms;
    c.edit([in](ChannelEditor& e) {
      for (auto& a : e.node().attrs)
        if (a.name == "group") a.i = int64_t(e.kept(in).size());
    });
    return c.set_out(0, Tracked{1, out});
  }
  // Grouped: input and output channels each lose the same number from every group.
  std::vector<int64_t> in = x ? x->atoms : std::vector<int64_t>{};
  if (x) c.equal_blocks(in, group);
  auto out = c.fresh(cout);
  c.equal_blocks(out, group);
  if (bias) c.slice(2, 0, out, ParamRole::kOther);
  c.slice(1, 0, out, ParamRole::kWeightOut);  // for the scores; the edit below cuts the weight
  c.edit([in, out, group](ChannelEditor& e) {
    // The output-row slice already ran: rows are the kept outputs, group after group.
    at::Tensor w = e.constant(1);
    if (in.empty()) return;
    const int64_t per_in = int64_t(in.size()) / group;
    const int64_t rows_per = w.size(0) / group;
    std::vector<at::Tensor> parts;
    for (int64_t g = 0; g < group; ++g) {
      std::vector<int64_t> keep;
      for (int64_t p = 0; p < per_in; ++p)
        if (!e.removed(in[g * per_in + p])) keep.push_back(p);
      parts.push_back(w.narrow(0, g * rows_per, rows_per).index_select(1, at::tensor(keep)));
    }
    e.set_constant(1, at::cat(parts, 0).contiguous());
  });
  c.set_out(0, Tracked{1, out});
}

void conv_transpose_channels(ChannelContext& c) {
  at::Tensor w = c.constant(1);
  const Tracked* x = c.in(0);
  if (!w.defined() || w.dim() < 3 || c.attr_int("group", 1) != 1)
    return c.barrier("ConvTranspose with groups or a computed weight");
  if (x && x->axis != 1) return c.barrier("ConvTranspose input tracked off the channel axis");
  if (x) c.slice(1, 0, x->atoms, ParamRole::kWeightIn);
  auto out = c.fresh(w.size(1));
  c.slice(1, 1, out, ParamRole::kWeightOut);
  if (c.has_input(2)) c.slice(2, 0, out, ParamRole::kOther);
  c.set_out(0, Tracked{1, out});
}

// Col2Im: overlapping blocks add up.
void col2im(OpContext& c) {
  const at::Tensor& x = c.input(0);
  auto image = to_int_vector(c.input(1));
  auto block = to_int_vector(c.input(2));
  size_t nd = image.size();
  c.check(nd >= 1 && block.size() == nd, "image_shape and block_shape must have the same length");
  c.check(x.dim() == 3, "input must be [N, C*prod(block_shape), L], got shape ", x.sizes());
  auto dil = c.attr_ints("dilations", std::vector<int64_t>(nd, 1));
  auto strides = c.attr_ints("strides", std::vector<int64_t>(nd, 1));
  auto pads = c.attr_ints("pads", std::vector<int64_t>(2 * nd, 0));
  c.check(dil.size() == nd && strides.size() == nd && pads.size() == 2 * nd,
          "dilations/strides/pads have the wrong length");
  int64_t kprod = 1;
  std::vector<int64_t> padded(nd), blocks(nd);
  int64_t lprod = 1;
  for (size_t i = 0; i < nd; ++i) {
    c.check(block[i] > 0 && dil[i] > 0 && strides[i] > 0 && image[i] > 0 && pads[i] >= 0 &&
                pads[i + nd] >= 0,
            "sizes, dilations and strides must be positive, pads non-negative");
    kprod *= block[i];
    padded[i] = image[i] + pads[i] + pads[i + nd];
    blocks[i] = (padded[i] - (dil[i] * (block[i] - 1) + 1)) / strides[i] + 1;
    c.check(blocks[i] >= 1, "no complete block fits along dim ", i);
    lprod *= blocks[i];
  }
  c.check(x.size(1) % kprod == 0, "input dim 1 (", x.size(1),
          ") is not divisible by the block size ", kprod);
  c.check(x.size(2) == lprod, "input has ", x.size(2), " blocks, expected ", lprod);
  int64_t ch = x.size(1) / kprod, n = x.size(0);
  std::vector<int64_t> out_shape{n, ch};
  out_shape.insert(out_shape.end(), padded.begin(), padded.end());
  check_output_fits(c, out_shape, x.scalar_type());
  int64_t pprod = numel_of(padded);
  // Flat index into the padded image of every (kernel offset, block) pair.
  at::Tensor idx = at::empty({kprod, lprod}, at::kLong);
  auto a = idx.accessor<int64_t, 2>();
  std::vector<int64_t> k(nd, 0), l(nd, 0);
  for (int64_t ki = 0; ki < kprod; ++ki) {
    int64_t rem = ki;
    for (size_t i = nd; i-- > 0;) {
      k[i] = rem % block[i];
      rem /= block[i];
    }
    for (int64_t li = 0; li < lprod; ++li) {
      int64_t r2 = li;
      for (size_t i = nd; i-- > 0;) {
        l[i] = r2 % blocks[i];
        r2 /= blocks[i];
      }
      int64_t flat = 0;
      for (size_t i = 0; i < nd; ++i) flat = flat * padded[i] + l[i] * strides[i] + k[i] * dil[i];
      a[ki][li] = flat;
    }
  }
  at::Tensor src = x.reshape({n, ch, kprod * lprod});
  at::Tensor out = at::zeros({n, ch, pprod}, x.options());
  out = at::index_add(out, 2, idx.reshape({-1}).to(x.device()), src);
  std::vector<int64_t> shape = {n, ch};
  shape.insert(shape.end(), padded.begin(), padded.end());
  out = out.reshape(shape);
  for (size_t i = 0; i < nd; ++i) out = out.narrow(static_cast<int64_t>(2 + i), pads[i], image[i]);
  c.set_output(0, out.contiguous());
}

}  // namespace

void register_conv(OpTable& t) {
  t.add({"", "Conv", conv_forward, conv_macs});
  t.add({"", "ConvTranspose", conv_transpose_forward, conv_transpose_macs});
  t.add({"ai.lopper", "FusedConv", conv_forward, conv_macs});
  t.add({"", "Col2Im", col2im});
  t.add({"ai.lopper", "ConvChain", conv_chain_forward});
  t.set_channels({"Conv"}, conv_channels);
  t.set_channels({"ConvTranspose"}, conv_transpose_channels);
}

}  // namespace lopper::ops
