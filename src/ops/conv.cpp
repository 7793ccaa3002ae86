// Conv and ConvTranspose (1-D, 2-D, 3-D; groups, dilations, asymmetric and automatic padding),
// and Col2Im, the inverse of the im2col a convolution unrolls to: what each computes (shapes,
// MACs, channel rules, the reference forward on ATen). Which kernel runs a 2-D convolution on a
// device is chosen in exec/conv_kernels.cpp.
#include "exec/conv_kernels.h"
#include "exec/onednn.h"
#include "ops/channels.h"
#include "ops/conv_geometry.h"
#include "ops/op.h"

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
  const Conv2dLayer layer{x, in, w, b, other, padding, g, post};
  if (auto y = conv2d_by_kernel(c, layer)) return c.set_output(0, *y);
  at::Tensor y = at::convolution(in, w, b, g.strides, padding, g.dilations, false,
                                 std::vector<int64_t>(padding.size(), 0), g.group);
  if (other.defined()) y = y + other;
  c.set_output(0, onednn::apply_unfused(y, post));
}

// ai.lopper.ConvChain(x [, residual]), body: an inverted residual's [1x1 expansion ->] depthwise
// (or narrow-grouped) [-> 1x1 projection] convolutions (exec/fusion/fuse_conv_chain.cpp): the
// body's output, run as one pass or layer by layer (exec/conv_kernels.h).
void conv_chain_forward(OpContext& c) {
  const ir::Attribute* a = c.node().attr("body");
  c.check(a && a->g, "needs its 'body' graph");
  const ir::Graph& body = *a->g;
  std::vector<at::Tensor> ins{c.input(0)};
  if (c.has_input(1)) ins.push_back(c.input(1));
  c.set_output(0, conv_chain_by_kernel(c, body, [&] { return c.run_subgraph(body, ins).at(0); }));
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
