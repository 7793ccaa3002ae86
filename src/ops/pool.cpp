// Pooling ops: MaxPool, AveragePool, LpPool, their Global* forms, MaxUnpool.
//
// NOTE: ONNX allows asymmetric pads, SAME_* auto padding and a ceil mode whose last window may
// overhang the input. All of them are turned into one explicit padding of the input (pads that
// count as padding, then "ceil" padding that never counts), after which every window lies inside
// the padded tensor and ATen's pooling runs with zero padding and floor mode. (The channels-last
// float32 MaxPool of inference, and MaxPool on a GPU, take the geometry as it is: their kernels,
// chosen in exec/pool_kernels.cpp, skip taps outside the input.)
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "exec/pool_kernels.h"
#include "ops/channels.h"
#include "ops/op.h"

namespace lopper::ops {

namespace {

struct PoolGeom {
  int64_t nd = 0;
  std::vector<int64_t> in, kernel, strides, dilations, out;
  std::vector<int64_t> pad_begin, pad_end;  // explicit (counted) padding
  std::vector<int64_t> extra_end;           // ceil-mode overhang (never counted)
  std::vector<int64_t> trim_end;            // trailing input no window reaches (dropped)
};

PoolGeom pool_geometry(const OpContext& c, const at::Tensor& x, bool has_dilations, bool has_ceil) {
  PoolGeom g;
  c.check(x.dim() >= 3, "input must have rank >= 3 (N x C x spatial), got ", x.dim());
  g.nd = x.dim() - 2;
  size_t nd = static_cast<size_t>(g.nd);
  for (int64_t d = 2; d < x.dim(); ++d) g.in.push_back(x.size(d));
  g.kernel = c.attr_ints("kernel_shape");
  c.check(g.kernel.size() == nd, "kernel_shape must have ", nd, " values, got ", g.kernel.size());
  for (int64_t k : g.kernel) c.check(k >= 1, "kernel_shape values must be >= 1");
  g.strides = c.attr_ints("strides", std::vector<int64_t>(nd, 1));
  c.check(g.strides.size() == nd, "strides must have ", nd, " values");
  for (int64_t s : g.strides) c.check(s >= 1, "strides must be >= 1");
  g.dilations = has_dilations ? c.attr_ints("dilations", std::vector<int64_t>(nd, 1))
                              : std::vector<int64_t>(nd, 1);
  if (g.dilations.empty()) g.dilations.assign(nd, 1);
  c.check(g.dilations.size() == nd, "dilations must have ", nd, " values");
  for (int64_t d : g.dilations) c.check(d >= 1, "dilations must be >= 1");
  bool ceil_mode = has_ceil && c.attr_int("ceil_mode", 0) != 0;
  std::string auto_pad = c.attr_string("auto_pad", "NOTSET");
  g.pad_begin.assign(nd, 0);
  g.pad_end.assign(nd, 0);
  g.out.assign(nd, 0);
  if (auto_pad == "NOTSET" || auto_pad.empty()) {
    auto pads = c.attr_ints("pads", std::vector<int64_t>(2 * nd, 0));
    c.check(pads.size() == 2 * nd, "pads must have ", 2 * nd, " values, got ", pads.size());
    for (size_t i = 0; i < nd; ++i) {
      c.check(pads[i] >= 0 && pads[i + nd] >= 0, "pads must be >= 0");
      g.pad_begin[i] = pads[i];
      g.pad_end[i] = pads[i + nd];
    }
    for (size_t i = 0; i < nd; ++i) {
      int64_t win = (g.kernel[i] - 1) * g.dilations[i] + 1;
      int64_t span = g.in[i] + g.pad_begin[i] + g.pad_end[i] - win;
      c.check(span >= 0, "kernel (", win, ") is larger than the padded input (",
              g.in[i] + g.pad_begin[i] + g.pad_end[i], ")");
      int64_t o = span / g.strides[i] + 1;
      if (ceil_mode && span % g.strides[i] != 0) {
        ++o;
        // The last window must start inside the input or the leading padding.
        if ((o - 1) * g.strides[i] >= g.in[i] + g.pad_begin[i]) --o;
      }
      g.out[i] = o;
    }
  } else if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
    for (size_t i = 0; i < nd; ++i) {
      int64_t win = (g.kernel[i] - 1) * g.dilations[i] + 1;
      g.out[i] = (g.in[i] + g.strides[i] - 1) / g.strides[i];
      int64_t total = std::max<int64_t>(0, (g.out[i] - 1) * g.strides[i] + win - g.in[i]);
      int64_t small = total / 2;
      g.pad_begin[i] = auto_pad == "SAME_UPPER" ? small : total - small;
      g.pad_end[i] = total - g.pad_begin[i];
    }
  } else if (auto_pad == "VALID") {
    for (size_t i = 0; i < nd; ++i) {
      int64_t win = (g.kernel[i] - 1) * g.dilations[i] + 1;
      c.check(g.in[i] >= win, "kernel (", win, ") is larger than the input (", g.in[i], ")");
      g.out[i] = (g.in[i] - win) / g.strides[i] + 1;
    }
  } else {
    c.fail("unknown auto_pad '", auto_pad, "'");
  }
  g.extra_end.assign(nd, 0);
  g.trim_end.assign(nd, 0);
  for (size_t i = 0; i < nd; ++i) {
    int64_t win = (g.kernel[i] - 1) * g.dilations[i] + 1;
    int64_t need = (g.out[i] - 1) * g.strides[i] + win;
    int64_t have = g.in[i] + g.pad_begin[i] + g.pad_end[i];
    if (need > have)
      g.extra_end[i] = need - have;
    else if (need < have) {
      // Drop what no window reads: first from the end padding, then from the input.
      int64_t drop = have - need;
      int64_t from_pad = std::min(drop, g.pad_end[i]);
      g.pad_end[i] -= from_pad;
      g.trim_end[i] = drop - from_pad;
    }
  }
  return g;
}

// Pads (or trims) the spatial dims: explicit pads with `pad_value`, ceil overhang with
// `extra_value`.
at::Tensor pad_spatial(const at::Tensor& x, const PoolGeom& g, double pad_value,
                       double extra_value) {
  at::Tensor y = x;
  for (int64_t i = 0; i < g.nd; ++i)
    if (g.trim_end[i] > 0) y = y.narrow(i + 2, 0, g.in[i] - g.trim_end[i]);
  // constant_pad_nd takes pairs from the last dim backwards.
  std::vector<int64_t> p1, p2;
  bool any1 = false, any2 = false;
  for (int64_t i = g.nd - 1; i >= 0; --i) {
    p1.push_back(g.pad_begin[i]);
    p1.push_back(g.pad_end[i]);
    p2.push_back(0);
    p2.push_back(g.extra_end[i]);
    any1 |= g.pad_begin[i] || g.pad_end[i];
    any2 |= g.extra_end[i] != 0;
  }
  if (any1) y = at::constant_pad_nd(y, p1, pad_value);
  if (any2) y = at::constant_pad_nd(y, p2, extra_value);
  return y;
}

bool all_one(const std::vector<int64_t>& v) {
  for (int64_t a : v)
    if (a != 1) return false;
  return true;
}

// The padding is symmetric, needs no ceil overhang or trimming, and fits ATen's limit (at most
// half the window): ATen's pooling can pad by itself, saving a padded copy of the input.
bool aten_pads(const PoolGeom& g, std::vector<int64_t>& pads) {
  pads.clear();
  for (int64_t i = 0; i < g.nd; ++i) {
    int64_t win = (g.kernel[i] - 1) * g.dilations[i] + 1;
    if (g.pad_begin[i] != g.pad_end[i] || g.extra_end[i] || g.trim_end[i] ||
        g.pad_begin[i] * 2 > win || g.pad_begin[i] * 2 > g.kernel[i])
      return false;
    pads.push_back(g.pad_begin[i]);
  }
  return g.nd >= 1 && g.nd <= 3;
}

// Windows of a padded tensor as trailing dims: [N, C, out..., k...].
at::Tensor windows(const at::Tensor& x, const PoolGeom& g) {
  at::Tensor y = x;
  for (int64_t i = 0; i < g.nd; ++i) {
    int64_t win = (g.kernel[i] - 1) * g.dilations[i] + 1;
    y = y.unfold(i + 2, win, g.strides[i]);
    if (g.dilations[i] != 1) y = y.slice(-1, 0, win, g.dilations[i]);
  }
  return y;
}

std::vector<int64_t> trailing_dims(int64_t nd, int64_t total) {
  std::vector<int64_t> d;
  for (int64_t i = total - nd; i < total; ++i) d.push_back(i);
  return d;
}

// Sum over each window of an already padded tensor.
at::Tensor window_sum(const at::Tensor& xp, const PoolGeom& g) {
  int64_t kprod = numel_of(g.kernel);
  if (all_one(g.dilations) && g.nd <= 3 && xp.is_floating_point()) {
    if (g.nd == 1) return at::avg_pool1d(xp, g.kernel, g.strides, {0}, false, true) * kprod;
    if (g.nd == 2) return at::avg_pool2d(xp, g.kernel, g.strides, {0, 0}, false, true, 1);
    return at::avg_pool3d(xp, g.kernel, g.strides, {0, 0, 0}, false, true, 1);
  }
  at::Tensor w = windows(xp, g);
  return w.sum(trailing_dims(g.nd, w.dim()));
}

at::Tensor window_max(const at::Tensor& xp, const PoolGeom& g) {
  if (g.nd == 1) return at::max_pool1d(xp, g.kernel, g.strides, {0}, g.dilations, false);
  if (g.nd == 2) return at::max_pool2d(xp, g.kernel, g.strides, {0, 0}, g.dilations, false);
  if (g.nd == 3) return at::max_pool3d(xp, g.kernel, g.strides, {0, 0, 0}, g.dilations, false);
  at::Tensor w = windows(xp, g);
  return w.amax(trailing_dims(g.nd, w.dim()));
}

// Pooling math runs in a floating type; integer inputs come back to their own type.
at::ScalarType float_type(const at::Tensor& x) {
  if (x.is_floating_point()) return x.scalar_type();
  return x.scalar_type() == at::kLong || x.scalar_type() == at::kInt ? at::kDouble : at::kFloat;
}

void max_pool(OpContext& c) {
  const at::Tensor& x = c.input(0);
  PoolGeom g = pool_geometry(c, x, c.opset() >= 10, c.opset() >= 10);
  int64_t storage_order = c.attr_int("storage_order", 0);
  c.check(storage_order == 0 || storage_order == 1, "storage_order must be 0 or 1");
  c.check(x.scalar_type() != at::kBool, "bool input is not supported");
  at::Tensor xf = x.to(float_type(x));
  std::vector<int64_t> ap;
  if (!c.wants_output(1) && g.nd == 2)
    if (auto y = max_pool2d_by_kernel(c, x, {g.kernel, g.strides, g.pad_begin, g.dilations, g.out}))
      return c.set_output(0, *y);
  if (!c.wants_output(1) && aten_pads(g, ap)) {
    at::Tensor y;
    if (g.nd == 1)
      y = at::max_pool1d(xf, g.kernel, g.strides, ap, g.dilations, false);
    else if (g.nd == 2)
      y = at::max_pool2d(xf, g.kernel, g.strides, ap, g.dilations, false);
    else
      y = at::max_pool3d(xf, g.kernel, g.strides, ap, g.dilations, false);
    c.set_output(0, y.to(x.scalar_type()));
    return;
  }
  constexpr double kNegInf = -std::numeric_limits<double>::infinity();
  at::Tensor xp = pad_spatial(xf, g, kNegInf, kNegInf);
  if (!c.wants_output(1)) {
    c.set_output(0, window_max(xp, g).to(x.scalar_type()));
    return;
  }
  c.check(g.nd <= 3, "Indices output is supported for 1-D to 3-D pooling only");
  at::Tensor y, idx;
  if (g.nd == 1) {
    auto r = at::max_pool2d_with_indices(xp.unsqueeze(2), {1, g.kernel[0]}, {1, g.strides[0]},
                                         {0, 0}, {1, g.dilations[0]}, false);
    y = std::get<0>(r).squeeze(2);
    idx = std::get<1>(r).squeeze(2);
  } else if (g.nd == 2) {
    std::tie(y, idx) =
        at::max_pool2d_with_indices(xp, g.kernel, g.strides, {0, 0}, g.dilations, false);
  } else {
    std::tie(y, idx) =
        at::max_pool3d_with_indices(xp, g.kernel, g.strides, {0, 0, 0}, g.dilations, false);
  }
  // ATen's indices are flat within one padded plane; ONNX's are flat over the whole unpadded
  // input (all of N and C), row-major or, with storage_order 1, column-major over the plane.
  idx = idx.to(at::kLong);
  std::vector<at::Tensor> coord(static_cast<size_t>(g.nd));
  at::Tensor rest = idx;
  for (int64_t i = g.nd - 1; i >= 0; --i) {
    int64_t padded = xp.size(i + 2);
    coord[i] = at::remainder(rest, padded) - g.pad_begin[i];
    rest = at::div(rest, padded, "floor");
  }
  at::Tensor flat = at::zeros_like(idx);
  if (storage_order == 0) {
    for (int64_t i = 0; i < g.nd; ++i) flat = flat * g.in[i] + coord[i];
  } else {
    for (int64_t i = g.nd - 1; i >= 0; --i) flat = flat * g.in[i] + coord[i];
  }
  int64_t plane = numel_of(g.in);
  int64_t planes = x.size(0) * x.size(1);
  at::Tensor offset = at::arange(planes, idx.options()).view({x.size(0), x.size(1)}) * plane;
  std::vector<int64_t> oshape = {x.size(0), x.size(1)};
  oshape.resize(static_cast<size_t>(x.dim()), 1);
  flat = flat + offset.view(oshape);
  c.set_output(0, y.to(x.scalar_type()));
  c.set_output(1, flat);
}

void average_pool(OpContext& c) {
  const at::Tensor& x = c.input(0);
  c.check(x.is_floating_point(), "input must be a floating-point tensor");
  PoolGeom g = pool_geometry(c, x, c.opset() >= 19, c.opset() >= 10);
  bool include_pad = c.attr_int("count_include_pad", 0) != 0;
  std::vector<int64_t> ap;
  if (all_one(g.dilations) && aten_pads(g, ap)) {
    at::Tensor y;
    if (g.nd == 1)
      y = at::avg_pool1d(x, g.kernel, g.strides, ap, false, include_pad);
    else if (g.nd == 2)
      y = at::avg_pool2d(x, g.kernel, g.strides, ap, false, include_pad);
    else
      y = at::avg_pool3d(x, g.kernel, g.strides, ap, false, include_pad);
    c.set_output(0, y);
    return;
  }
  at::Tensor sum = window_sum(pad_spatial(x, g, 0, 0), g);
  // Divisor per output position: the window's cells that are input (or counted padding).
  std::vector<int64_t> mshape(static_cast<size_t>(x.dim()), 1);
  for (int64_t i = 0; i < g.nd; ++i) mshape[i + 2] = g.in[i];
  at::Tensor ones = at::ones(mshape, x.options());
  at::Tensor count = window_sum(pad_spatial(ones, g, include_pad ? 1.0 : 0.0, 0), g);
  c.set_output(0, sum / count);
}

void lp_pool(OpContext& c) {
  const at::Tensor& x = c.input(0);
  c.check(x.is_floating_point(), "input must be a floating-point tensor");
  PoolGeom g = pool_geometry(c, x, c.opset() >= 18, c.opset() >= 18);
  double p = static_cast<double>(c.attr_int("p", 2));
  c.check(p >= 1, "p must be >= 1, got ", p);
  at::Tensor xa = p == 2 ? x.square() : (p == 1 ? x.abs() : x.abs().pow(p));
  at::Tensor sum = window_sum(pad_spatial(xa, g, 0, 0), g);
  c.set_output(0, p == 1 ? sum : (p == 2 ? sum.sqrt() : sum.pow(1.0 / p)));
}

std::vector<int64_t> spatial_dims(const OpContext& c, const at::Tensor& x) {
  c.check(x.dim() >= 2, "input must have rank >= 2 (N x C x spatial), got ", x.dim());
  std::vector<int64_t> d;
  for (int64_t i = 2; i < x.dim(); ++i) d.push_back(i);
  return d;
}

void global_average_pool(OpContext& c) {
  const at::Tensor& x = c.input(0);
  c.check(x.is_floating_point(), "input must be a floating-point tensor");
  auto d = spatial_dims(c, x);
  if (auto y = mean_over_pixels_by_kernel(c, x)) return c.set_output(0, *y);
  c.set_output(0, d.empty() ? x : x.mean(d, true));
}

void global_max_pool(OpContext& c) {
  const at::Tensor& x = c.input(0);
  auto d = spatial_dims(c, x);
  c.set_output(0, d.empty() ? x : x.amax(d, true));
}

void global_lp_pool(OpContext& c) {
  const at::Tensor& x = c.input(0);
  c.check(x.is_floating_point(), "input must be a floating-point tensor");
  auto d = spatial_dims(c, x);
  double p = static_cast<double>(c.attr_int("p", 2));
  c.check(p >= 1, "p must be >= 1, got ", p);
  if (d.empty()) {
    c.set_output(0, x.abs());
    return;
  }
  c.set_output(0, x.abs().pow(p).sum(d, true).pow(1.0 / p));
}

void max_unpool(OpContext& c) {
  const at::Tensor& x = c.input(0);
  const at::Tensor& ind = c.input(1);
  c.check(x.dim() >= 3, "input must have rank >= 3, got ", x.dim());
  c.check(ind.sizes() == x.sizes(), "indices must have the shape of X");
  size_t nd = static_cast<size_t>(x.dim() - 2);
  auto kernel = c.attr_ints("kernel_shape");
  c.check(kernel.size() == nd, "kernel_shape must have ", nd, " values");
  auto strides = c.attr_ints("strides", std::vector<int64_t>(nd, 1));
  c.check(strides.size() == nd, "strides must have ", nd, " values");
  auto pads = c.attr_ints("pads", std::vector<int64_t>(2 * nd, 0));
  c.check(pads.size() == 2 * nd, "pads must have ", 2 * nd, " values");
  // Indices address the inferred shape; a given output_shape only pads it at the end.
  std::vector<int64_t> shape = {x.size(0), x.size(1)};
  for (size_t i = 0; i < nd; ++i)
    shape.push_back((x.size(i + 2) - 1) * strides[i] - (pads[i] + pads[i + nd]) + kernel[i]);
  for (int64_t s : shape) c.check(s >= 0, "output shape must be non-negative");
  int64_t total = numel_of(shape);
  at::Tensor flat_ind = ind.to(at::kLong).reshape({-1});
  if (flat_ind.numel() > 0) {
    c.check((flat_ind >= 0).all().item<bool>() && (flat_ind < total).all().item<bool>(),
            "indices out of range for output of ", total, " elements");
  }
  at::Tensor out = at::zeros({total}, x.options()).scatter(0, flat_ind, x.reshape({-1}));
  out = out.view(shape);
  if (c.has_input(2)) {
    auto want = to_int_vector(c.input(2));
    c.check(want.size() == shape.size(), "output_shape must have ", shape.size(), " values");
    std::vector<int64_t> pad;
    for (size_t i = shape.size(); i-- > 0;) {
      c.check(want[i] >= shape[i], "output_shape ", want[i], " at dim ", i,
              " is smaller than the inferred ", shape[i]);
      pad.push_back(0);
      pad.push_back(want[i] - shape[i]);
    }
    out = at::constant_pad_nd(out, pad, 0);
  }
  c.set_output(0, out);
}

// Channel rules: pooling acts on each channel alone (MaxPool's indices would change: a barrier).
void pool_channels(ChannelContext& c) {
  if (c.num_outputs() > 1 && !c.node().outputs[1].empty())
    return c.barrier("MaxPool indices depend on the channel count");
  channel_rules::spatial(c);
}

}  // namespace

void register_pool(OpTable& t) {
  t.add_onnx({
      {"MaxPool", max_pool, pool_channels},
      {"AveragePool", average_pool, pool_channels},
      {"LpPool", lp_pool, pool_channels},
      {"GlobalAveragePool", global_average_pool, pool_channels},
      {"GlobalMaxPool", global_max_pool, pool_channels},
      {"GlobalLpPool", global_lp_pool, pool_channels},
      {"MaxUnpool", max_unpool},
  });
}

}  // namespace lopper::ops
