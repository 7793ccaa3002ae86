// Resampling ops: Resize, Upsample, GridSample, AffineGrid (the sampling grid GridSample reads).
#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "ops/channels.h"
#include "ops/op.h"

namespace lopper::ops {

namespace {

enum class Interp { kNearest, kLinear, kCubic };

struct ResizeOpts {
  Interp mode = Interp::kNearest;
  std::string coord = "half_pixel";
  std::string nearest = "round_prefer_floor";  // "simple": opset < 11 / Upsample
  double cubic_a = -0.75;
  bool exclude_outside = false;
  bool antialias = false;
  double extrapolation = 0.0;
};

// Source coordinate of output index y along one axis; sets `outside` for tf_crop_and_resize.
double source_coord(const OpContext& c, const ResizeOpts& o, double y, double scale, int64_t in,
                    int64_t out, double roi_lo, double roi_hi, bool& outside) {
  double out_w = scale * static_cast<double>(in);
  outside = false;
  const std::string& m = o.coord;
  if (m == "half_pixel") return (y + 0.5) / scale - 0.5;
  if (m == "asymmetric") return y / scale;
  if (m == "align_corners") return out_w == 1 ? 0.0 : y * (in - 1) / (out_w - 1);
  if (m == "pytorch_half_pixel") return out_w == 1 ? -0.5 : (y + 0.5) / scale - 0.5;
  if (m == "half_pixel_symmetric") {
    double adjustment = static_cast<double>(out) / out_w;
    double offset = in / 2.0 * (1 - adjustment);
    return offset + (y + 0.5) / scale - 0.5;
  }
  if (m == "tf_crop_and_resize") {
    double x = out_w == 1 ? (roi_hi - roi_lo) * (in - 1) / 2.0
                          : y * (roi_hi - roi_lo) * (in - 1) / (out_w - 1);
    x += roi_lo * (in - 1);
    outside = x < 0 || x > in - 1;
    return x;
  }
  c.fail("unknown coordinate_transformation_mode '", m, "'");
}

std::vector<double> resize_coeffs(const ResizeOpts& o, double ratio, double scale) {
  if (o.mode == Interp::kNearest) {
    if (ratio == std::floor(ratio)) return {0, 1};
    if (o.nearest == "round_prefer_floor") return {double(ratio <= 0.5), double(ratio > 0.5)};
    if (o.nearest == "round_prefer_ceil") return {double(ratio < 0.5), double(ratio >= 0.5)};
    if (o.nearest == "floor") return {1, 0};
    return {0, 1};  // ceil
  }
  if (o.mode == Interp::kLinear) {
    if (!o.antialias) return {1 - ratio, ratio};
    double s = std::min(scale, 1.0);
    int64_t start = static_cast<int64_t>(std::floor(-1 / s) + 1);
    int64_t n = 2 - 2 * start;
    std::vector<double> w;
    double sum = 0;
    for (int64_t i = start; i < start + n; ++i) {
      double v = std::clamp(1 - std::abs((i - ratio) * s), 0.0, 1.0);
      w.push_back(v);
      sum += v;
    }
    for (double& v : w) v /= sum;
    return w;
  }
  double a = o.cubic_a;
  auto kernel = [a](double x) {
    x = std::abs(x);
    if (x <= 1) return ((a + 2) * x - (a + 3)) * x * x + 1;
    if (x < 2) return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a;
    return 0.0;
  };
  if (!o.antialias) return {kernel(ratio + 1), kernel(ratio), kernel(1 - ratio), kernel(2 - ratio)};
  double s = std::min(scale, 1.0);
  int64_t start = static_cast<int64_t>(std::floor(-2 / s) + 1);
  int64_t end = 2 - start;
  std::vector<double> w;
  double sum = 0;
  for (int64_t i = start; i < end; ++i) {
    double v = kernel(s * (i - ratio));
    w.push_back(v);
    sum += v;
  }
  for (double& v : w) v /= sum;
  return w;
}

// Resizes one axis of x (already in a floating compute type, or any type for nearest).
at::Tensor resize_axis(const OpContext& c, const ResizeOpts& o, const at::Tensor& x, int64_t axis,
                       double scale, int64_t out, double roi_lo, double roi_hi) {
  int64_t in = x.size(axis);
  if (out == 0 || in == 0) {
    auto shape = x.sizes().vec();
    shape[axis] = out;
    c.check(out == 0, "cannot resize an empty axis to ", out);
    return at::empty(shape, x.options());
  }
  std::vector<int64_t> idx;
  std::vector<double> coef;
  std::vector<uint8_t> outside_flags;
  bool any_outside = false;
  int64_t n = 0;
  for (int64_t y = 0; y < out; ++y) {
    bool outside = false;
    double xo = source_coord(c, o, static_cast<double>(y), scale, in, out, roi_lo, roi_hi, outside);
    any_outside |= outside;
    outside_flags.push_back(outside);
    if (o.nearest == "simple") {
      // Upsample and Resize-10: floor when enlarging, ceil when shrinking.
      int64_t i = static_cast<int64_t>(scale < 1 ? std::ceil(xo) : std::floor(xo));
      idx.push_back(std::clamp<int64_t>(i, 0, in - 1));
      coef.push_back(1);
      n = 1;
      continue;
    }
    double xf = std::floor(xo);
    double ratio = xo == xf ? 1.0 : xo - xf;
    std::vector<double> w = resize_coeffs(o, ratio, scale);
    int64_t k = static_cast<int64_t>(w.size());
    c.check(n == 0 || n == k, "inconsistent resize footprint");
    n = k;
    // NOTE: the neighbourhood of x: for an even footprint it starts floor(x) - k/2 + 1, except
    // at integral x where it starts one lower (its ratio is then 1, not 0).
    int64_t pw = (k + 1) / 2;
    double xp = xo + pw;
    double p = std::floor(xp);
    double frac = xp - p;
    int64_t off;
    if (k % 2 == 0)
      off = frac == 0 ? -(k / 2) : -(k / 2) + 1;
    else
      off = frac <= 0.5 ? -((k - 1) / 2) : -((k - 1) / 2) + 1;
    int64_t start = static_cast<int64_t>(p) + off - pw;
    if (o.exclude_outside) {
      double sum = 0;
      for (int64_t j = 0; j < k; ++j) {
        int64_t at = start + j;
        if (at < 0 || at >= in) w[j] = 0;
        sum += w[j];
      }
      if (sum != 0)
        for (double& v : w) v /= sum;
    }
    for (int64_t j = 0; j < k; ++j) {
      idx.push_back(std::clamp<int64_t>(start + j, 0, in - 1));
      coef.push_back(w[j]);
    }
  }
  at::Tensor result;
  auto cpu_long = at::TensorOptions().dtype(at::kLong);
  if (o.mode == Interp::kNearest) {
    std::vector<int64_t> pick(static_cast<size_t>(out));
    for (int64_t y = 0; y < out; ++y) {
      int64_t best = 0;
      for (int64_t j = 1; j < n; ++j)
        if (coef[y * n + j] > coef[y * n + best]) best = j;
      pick[y] = idx[y * n + best];
    }
    at::Tensor it = at::tensor(pick, cpu_long).to(x.device());
    result = x.index_select(axis, it);
  } else {
    at::Tensor it = at::tensor(idx, cpu_long).to(x.device());
    at::Tensor g = x.index_select(axis, it);
    auto shape = x.sizes().vec();
    shape[axis] = out;
    shape.insert(shape.begin() + axis + 1, n);
    g = g.reshape(shape);
    std::vector<int64_t> wshape(shape.size(), 1);
    wshape[axis] = out;
    wshape[axis + 1] = n;
    at::Tensor w = at::tensor(coef, at::TensorOptions().dtype(at::kDouble))
                       .to(x.device(), x.scalar_type())
                       .view(wshape);
    result = (g * w).sum(axis + 1);
  }
  if (any_outside) {
    std::vector<int64_t> mshape(static_cast<size_t>(x.dim()), 1);
    mshape[axis] = out;
    at::Tensor mask =
        at::tensor(std::vector<int64_t>(outside_flags.begin(), outside_flags.end()), cpu_long)
            .to(x.device())
            .ne(0)
            .view(mshape);
    result = at::where(mask, at::scalar_tensor(o.extrapolation, result.options()), result);
  }
  return result;
}

// floor(scale * dim + offset) as a dim; a product past int64 (a scale of 1e30) saturates, so that
// the size check names it instead of a wrapped negative size.
int64_t scaled_dim(double scale, int64_t dim, double offset = 0.0) {
  double v = std::floor(scale * static_cast<double>(dim) + offset);
  return v >= 9.2e18 ? std::numeric_limits<int64_t>::max() : static_cast<int64_t>(v);
}

// Resizes x given per-axis scales/sizes for every dim.
at::Tensor resize_core(const OpContext& c, const ResizeOpts& o, const at::Tensor& x,
                       const std::vector<double>& scales, const std::vector<int64_t>& sizes,
                       const std::vector<double>& roi) {
  int64_t r = x.dim();
  check_output_fits(c, sizes, x.scalar_type());
  bool nearest = o.mode == Interp::kNearest;
  at::ScalarType ct = x.scalar_type();
  if (!nearest) {
    c.check(x.scalar_type() != at::kBool, "linear/cubic resize of bool is not supported");
    ct = x.is_floating_point() ? at::promote_types(x.scalar_type(), at::kFloat) : at::kFloat;
  }
  at::Tensor y = x.to(ct);
  for (int64_t a = 0; a < r; ++a) {
    double lo = roi.empty() ? 0.0 : roi[a], hi = roi.empty() ? 1.0 : roi[a + r];
    bool tf = o.coord == "tf_crop_and_resize";
    if (std::abs(scales[a] - 1.0) < 1e-9 && sizes[a] == x.size(a) &&
        (!tf || (std::abs(lo) < 1e-9 && std::abs(hi - 1.0) < 1e-9)))
      continue;
    c.check(scales[a] > 0, "scales must be positive, got ", scales[a]);
    y = resize_axis(c, o, y, a, scales[a], sizes[a], lo, hi);
  }
  if (ct != x.scalar_type()) {
    if (at::isIntegralType(x.scalar_type(), false)) y = y.round();
    y = y.to(x.scalar_type());
  }
  return y;
}

ResizeOpts resize_opts(const OpContext& c, bool legacy) {
  ResizeOpts o;
  std::string mode = c.attr_string("mode", "nearest");
  if (mode == "nearest")
    o.mode = Interp::kNearest;
  else if (mode == "linear" || mode == "bilinear" || mode == "trilinear")
    o.mode = Interp::kLinear;
  else if (mode == "cubic" && !legacy)
    o.mode = Interp::kCubic;
  else
    c.fail("unsupported mode '", mode, "'");
  if (legacy) {
    o.coord = "asymmetric";
    o.nearest = "simple";
    return o;
  }
  o.coord = c.attr_string("coordinate_transformation_mode", "half_pixel");
  o.nearest = c.attr_string("nearest_mode", "round_prefer_floor");
  if (o.nearest != "round_prefer_floor" && o.nearest != "round_prefer_ceil" &&
      o.nearest != "floor" && o.nearest != "ceil")
    c.fail("unknown nearest_mode '", o.nearest, "'");
  o.cubic_a = c.attr_float("cubic_coeff_a", -0.75f);
  o.exclude_outside = c.attr_int("exclude_outside", 0) != 0;
  o.antialias = c.opset() >= 18 && c.attr_int("antialias", 0) != 0;
  o.extrapolation = c.attr_float("extrapolation_value", 0.0f);
  if (o.antialias) c.check(o.mode != Interp::kNearest, "antialias is not defined for nearest");
  return o;
}

std::vector<double> to_double_vector(const at::Tensor& t) {
  at::Tensor d = t.detach().to(at::kCPU).to(at::kDouble).contiguous().view({-1});
  return std::vector<double>(d.data_ptr<double>(), d.data_ptr<double>() + d.numel());
}

void resize(OpContext& c) {
  const at::Tensor& x = c.input(0);
  int64_t r = x.dim();
  c.check(r >= 1, "input must have rank >= 1");
  bool legacy = c.opset() < 11;
  ResizeOpts o = resize_opts(c, legacy);
  std::vector<double> scales_in, roi_in;
  std::vector<int64_t> sizes_in;
  if (legacy) {
    scales_in = to_double_vector(c.input(1));
  } else {
    if (c.has_input(1)) roi_in = to_double_vector(c.input(1));
    if (c.has_input(2)) scales_in = to_double_vector(c.input(2));
    if (c.has_input(3)) sizes_in = to_int_vector(c.input(3));
  }
  c.check(scales_in.empty() != sizes_in.empty(), "exactly one of scales and sizes must be given");
  std::vector<int64_t> axes;
  if (c.opset() >= 18 && c.has_attr("axes")) {
    for (int64_t a : c.attr_ints("axes")) axes.push_back(normalize_axis(c, a, r));
    for (size_t i = 0; i < axes.size(); ++i)
      for (size_t j = 0; j < i; ++j) c.check(axes[i] != axes[j], "axes has duplicates");
  } else {
    for (int64_t a = 0; a < r; ++a) axes.push_back(a);
  }
  size_t na = axes.size();
  std::vector<double> scales(static_cast<size_t>(r), 1.0);
  std::vector<int64_t> sizes(x.sizes().begin(), x.sizes().end());
  std::vector<double> roi;
  if (o.coord == "tf_crop_and_resize") {
    c.check(roi_in.size() == 2 * na, "roi must have ", 2 * na, " values, got ", roi_in.size());
    roi.assign(static_cast<size_t>(2 * r), 0.0);
    for (int64_t a = 0; a < r; ++a) roi[a + r] = 1.0;
    for (size_t i = 0; i < na; ++i) {
      roi[axes[i]] = roi_in[i];
      roi[axes[i] + r] = roi_in[i + na];
    }
  }
  if (!scales_in.empty()) {
    c.check(scales_in.size() == na, "scales must have ", na, " values, got ", scales_in.size());
    for (size_t i = 0; i < na; ++i) {
      c.check(scales_in[i] > 0, "scales must be positive");
      scales[axes[i]] = scales_in[i];
      sizes[axes[i]] = scaled_dim(scales_in[i], x.size(axes[i]));
    }
  } else {
    c.check(sizes_in.size() == na, "sizes must have ", na, " values, got ", sizes_in.size());
    for (size_t i = 0; i < na; ++i) {
      c.check(sizes_in[i] >= 0, "sizes must be >= 0");
      c.check(x.size(axes[i]) > 0 || sizes_in[i] == 0, "cannot resize an empty axis");
      sizes[axes[i]] = sizes_in[i];
      scales[axes[i]] = x.size(axes[i]) ? double(sizes_in[i]) / x.size(axes[i]) : 1.0;
    }
    std::string policy =
        c.opset() >= 18 ? c.attr_string("keep_aspect_ratio_policy", "stretch") : "stretch";
    if (policy != "stretch") {
      c.check(policy == "not_larger" || policy == "not_smaller",
              "unknown keep_aspect_ratio_policy '", policy, "'");
      double s = policy == "not_larger" ? std::numeric_limits<double>::infinity() : 0.0;
      for (int64_t a : axes)
        s = policy == "not_larger" ? std::min(s, scales[a]) : std::max(s, scales[a]);
      for (int64_t a : axes) {
        scales[a] = s;
        sizes[a] = scaled_dim(s, x.size(a), 0.5);
      }
    }
  }
  c.set_output(0, resize_core(c, o, x, scales, sizes, roi));
}

void upsample(OpContext& c) {
  const at::Tensor& x = c.input(0);
  ResizeOpts o = resize_opts(c, true);
  std::vector<double> scales;
  if (c.has_input(1))
    scales = to_double_vector(c.input(1));
  else
    for (float f : c.attr_floats("scales")) scales.push_back(f);
  c.check(scales.size() == static_cast<size_t>(x.dim()), "scales must have ", x.dim(),
          " values, got ", scales.size());
  std::vector<int64_t> sizes;
  for (int64_t a = 0; a < x.dim(); ++a) {
    c.check(scales[a] >= 1, "Upsample scales must be >= 1, got ", scales[a]);
    sizes.push_back(scaled_dim(scales[a], x.size(a)));
  }
  c.set_output(0, resize_core(c, o, x, scales, sizes, {}));
}

void grid_sample(OpContext& c) {
  const at::Tensor& x = c.input(0);
  const at::Tensor& grid = c.input(1);
  c.check(x.is_floating_point(), "X must be a floating-point tensor");
  c.check(x.dim() == 4 || x.dim() == 5, "only 2-D and 3-D spatial inputs are supported, got rank ",
          x.dim());
  c.check(grid.dim() == x.dim() && grid.size(0) == x.size(0) && grid.size(-1) == x.dim() - 2,
          "grid must have shape [N, out..., ", x.dim() - 2, "]");
  std::string mode = c.attr_string("mode", c.opset() >= 20 ? "linear" : "bilinear");
  int64_t interp;
  if (mode == "bilinear" || mode == "linear")
    interp = 0;
  else if (mode == "nearest")
    interp = 1;
  else if (mode == "bicubic" || mode == "cubic")
    interp = 2;
  else
    c.fail("unknown mode '", mode, "'");
  c.check(interp != 2 || x.dim() == 4, "cubic mode is supported for 2-D inputs only");
  std::string pad = c.attr_string("padding_mode", "zeros");
  int64_t padding;
  if (pad == "zeros")
    padding = 0;
  else if (pad == "border")
    padding = 1;
  else if (pad == "reflection")
    padding = 2;
  else
    c.fail("unknown padding_mode '", pad, "'");
  bool align = c.attr_int("align_corners", 0) != 0;
  at::ScalarType ct = at::promote_types(x.scalar_type(), at::kFloat);
  at::Tensor y = at::grid_sampler(x.to(ct), grid.to(ct), interp, padding, align);
  c.set_output(0, y.to(x.scalar_type()));
}

void affine_grid(OpContext& c) {
  const at::Tensor& theta = c.input(0);
  auto size = to_int_vector(c.input(1));
  c.check(theta.is_floating_point(), "theta must be a floating-point tensor");
  c.check(size.size() == 4 || size.size() == 5, "size must have 4 or 5 values");
  size_t nd = size.size() - 2;
  c.check(theta.dim() == 3 && theta.size(0) == size[0] &&
              theta.size(1) == static_cast<int64_t>(nd) &&
              theta.size(2) == static_cast<int64_t>(nd) + 1,
          "theta must be [N, ", nd, ", ", nd + 1, "], got shape ", theta.sizes());
  bool align = c.attr_int("align_corners", 0) != 0;
  auto opts = theta.options();
  auto coords = [&](int64_t n) {
    if (align) return at::linspace(-1, 1, n, opts);
    return (at::arange(n, opts) * 2 + 1) / static_cast<double>(n) - 1;
  };
  std::vector<int64_t> spatial(size.begin() + 2, size.end());
  for (int64_t s : spatial) c.check(s > 0, "size values must be positive");
  // Homogeneous base grid [..., (x, y[, z], 1)] with x along the last spatial dim.
  std::vector<at::Tensor> comps;
  for (size_t i = nd; i-- > 0;) {
    std::vector<int64_t> view(nd, 1);
    view[i] = spatial[i];
    comps.push_back(coords(spatial[i]).reshape(view).expand(spatial));
  }
  comps.push_back(at::ones(spatial, opts));
  at::Tensor base = at::stack(comps, -1).reshape({-1, static_cast<int64_t>(nd) + 1});
  at::Tensor grid = at::matmul(base, theta.transpose(1, 2));  // [N, P, nd]
  std::vector<int64_t> shape = {size[0]};
  shape.insert(shape.end(), spatial.begin(), spatial.end());
  shape.push_back(static_cast<int64_t>(nd));
  c.set_output(0, grid.reshape(shape));
}

// Channel rules: Resize keeps the channels when it does not scale them (sizes are rewritten).
void resize_channels(ChannelContext& c) {
  const Tracked* x = c.in(0);
  if (!x) return;
  if (x->axis != 1) return c.barrier("Resize tracked off the channel axis");
  for (size_t i = 1; i < c.num_inputs(); ++i)
    if (c.has_input(i) && (c.in(i) || !c.constant(i).defined()))
      return c.barrier("Resize with scales or sizes computed at run time");
  if (c.num_inputs() > 2 && c.has_input(2)) {
    at::Tensor scales = c.constant(2);
    if (scales.numel() > 1 && scales.to(at::kDouble).data_ptr<double>()[1] != 1.0)
      return c.barrier("Resize scales the channels");
  }
  if (c.num_inputs() > 3 && c.has_input(3)) {
    auto atoms = x->atoms;
    c.edit([atoms](ChannelEditor& e) {
      at::Tensor s = e.constant(3).clone();
      s.data_ptr<int64_t>()[1] = int64_t(e.kept(atoms).size());
      e.set_constant(3, s);
    });
  }
  c.set_out(0, *x);
}

}  // namespace

void register_resize(OpTable& t) {
  t.add_onnx({
      {"Resize", resize, resize_channels, {}, {3}},
      {"Upsample", upsample},
      {"GridSample", grid_sample},
      {"AffineGrid", affine_grid},
  });
}

}  // namespace lopper::ops
