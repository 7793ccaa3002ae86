// Shape-manipulating ops: Shape, Size, Reshape, Flatten, Squeeze, Unsqueeze, Transpose, Expand,
// Tile, Concat, Split, Slice, ConstantOfShape, Range, EyeLike, Trilu, DepthToSpace, SpaceToDepth.
#include <algorithm>
#include <cmath>
#include <limits>

#include "ops/op.h"

namespace lopper::ops {

namespace {

at::Tensor int64_vector(const std::vector<int64_t>& v, const at::Device& device) {
  return at::tensor(v, at::TensorOptions().dtype(at::kLong)).to(device);
}

std::vector<int64_t> sizes_of(const at::Tensor& t) { return t.sizes().vec(); }

std::string dims_str(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + "]";
}

// ONNX (numpy) broadcast of two shapes; fails naming the node when they do not broadcast.
std::vector<int64_t> broadcast_shapes(const OpContext& c, const std::vector<int64_t>& a,
                                      const std::vector<int64_t>& b) {
  size_t n = std::max(a.size(), b.size());
  std::vector<int64_t> out(n);
  for (size_t i = 0; i < n; ++i) {
    int64_t x = i < n - a.size() ? 1 : a[i - (n - a.size())];
    int64_t y = i < n - b.size() ? 1 : b[i - (n - b.size())];
    c.check(x == y || x == 1 || y == 1, "shapes ", dims_str(a), " and ", dims_str(b),
            " do not broadcast");
    out[i] = x == 1 ? y : x;
  }
  return out;
}

// Axes from the attribute (opset < `input_since`) or from input `index`.
std::vector<int64_t> axes_arg(const OpContext& c, size_t index, int64_t input_since,
                              const char* name = "axes") {
  if (c.opset() >= input_since) return c.has_input(index) ? to_int_vector(c.input(index))
                                                         : std::vector<int64_t>{};
  return c.attr_ints(name);
}

// Slices `x` along `axis` with ONNX's clamping rules.
at::Tensor slice_axis(const OpContext& c, const at::Tensor& x, int64_t axis, int64_t start,
                      int64_t end, int64_t step) {
  c.check(step != 0, "slice step must not be 0");
  int64_t dim = x.size(axis);
  if (start < 0) start += dim;
  if (end < 0) end += dim;
  if (step > 0) {
    start = std::clamp<int64_t>(start, 0, dim);
    end = std::clamp<int64_t>(end, 0, dim);
    if (end <= start) return x.narrow(axis, 0, 0);
    return x.slice(axis, start, end, step);
  }
  start = std::clamp<int64_t>(start, 0, dim - 1);
  end = std::clamp<int64_t>(end, -1, dim - 1);
  if (dim == 0 || start <= end) return x.narrow(axis, 0, 0);
  int64_t s = -step;
  int64_t n = (start - end + s - 1) / s;
  int64_t last = start - (n - 1) * s;
  return x.slice(axis, last, start + 1, s).flip({axis});
}

void register_shape_ops(OpTable& t) {
  t.add({"", "Shape", [](OpContext& c) {
    auto s = sizes_of(c.input(0));
    int64_t r = static_cast<int64_t>(s.size());
    int64_t start = c.attr_int("start", 0), end = c.attr_int("end", r);
    if (start < 0) start += r;
    if (end < 0) end += r;
    start = std::clamp<int64_t>(start, 0, r);
    end = std::clamp<int64_t>(end, 0, r);
    std::vector<int64_t> out;
    for (int64_t i = start; i < end; ++i) out.push_back(s[i]);
    c.set_output(0, int64_vector(out, c.input(0).device()));
  }});

  t.add({"", "Size", [](OpContext& c) {
    c.set_output(0, at::scalar_tensor(c.input(0).numel(),
                                      at::TensorOptions().dtype(at::kLong).device(c.input(0).device())));
  }});

  t.add({"", "Reshape", [](OpContext& c) {
    const at::Tensor& x = c.input(0);
    std::vector<int64_t> shape = c.opset() >= 5 ? to_int_vector(c.input(1)) : c.attr_ints("shape");
    bool allowzero = c.opset() >= 14 && c.attr_int("allowzero", 0) != 0;
    int64_t infer = -1, known = 1;
    for (size_t i = 0; i < shape.size(); ++i) {
      if (shape[i] == 0 && !allowzero) {
        c.check(static_cast<int64_t>(i) < x.dim(), "shape ", dims_str(shape), " copies dim ", i,
                " of a rank-", x.dim(), " input");
        shape[i] = x.size(static_cast<int64_t>(i));
      }
      if (shape[i] == -1) {
        c.check(infer < 0, "shape ", dims_str(shape), " has more than one -1");
        infer = static_cast<int64_t>(i);
        continue;
      }
      c.check(shape[i] >= 0, "shape ", dims_str(shape), " has a negative dim");
      known *= shape[i];
    }
    if (infer >= 0) {
      c.check(known != 0 && x.numel() % known == 0, "cannot reshape ", dims_str(sizes_of(x)),
              " to ", dims_str(shape));
      shape[infer] = x.numel() / known;
    }
    c.check(numel_of(shape) == x.numel(), "cannot reshape ", dims_str(sizes_of(x)), " to ",
            dims_str(shape));
    c.set_output(0, x.reshape(shape));
  }});

  t.add({"", "Flatten", [](OpContext& c) {
    const at::Tensor& x = c.input(0);
    int64_t r = x.dim(), axis = c.attr_int("axis", 1);
    c.check(axis >= -r && axis <= r, "axis ", axis, " out of range for rank ", r);
    if (axis < 0) axis += r;
    int64_t a = 1, b = 1;
    for (int64_t i = 0; i < r; ++i) (i < axis ? a : b) *= x.size(i);
    c.set_output(0, x.reshape({a, b}));
  }});

  t.add({"", "Squeeze", [](OpContext& c) {
    const at::Tensor& x = c.input(0);
    auto axes = axes_arg(c, 1, 13);
    std::vector<int64_t> out;
    std::vector<bool> drop(x.dim(), false);
    if (axes.empty()) {
      for (int64_t i = 0; i < x.dim(); ++i) drop[i] = x.size(i) == 1;
    } else {
      for (int64_t a : axes) {
        a = normalize_axis(c, a, x.dim());
        c.check(x.dim() > 0 && x.size(a) == 1, "cannot squeeze axis ", a, " of size ",
                x.dim() ? x.size(a) : 0);
        drop[a] = true;
      }
    }
    for (int64_t i = 0; i < x.dim(); ++i)
      if (!drop[i]) out.push_back(x.size(i));
    c.set_output(0, x.reshape(out));
  }});

  t.add({"", "Unsqueeze", [](OpContext& c) {
    const at::Tensor& x = c.input(0);
    auto axes = axes_arg(c, 1, 13);
    int64_t r = x.dim() + static_cast<int64_t>(axes.size());
    std::vector<bool> ins(r, false);
    for (int64_t a : axes) {
      c.check(a >= -r && a < r, "axis ", a, " out of range for output rank ", r);
      if (a < 0) a += r;
      c.check(!ins[a], "axis ", a, " repeated");
      ins[a] = true;
    }
    std::vector<int64_t> out;
    int64_t k = 0;
    for (int64_t i = 0; i < r; ++i) out.push_back(ins[i] ? 1 : x.size(k++));
    c.set_output(0, x.reshape(out));
  }});

  t.add({"", "Transpose", [](OpContext& c) {
    const at::Tensor& x = c.input(0);
    auto perm = c.attr_ints("perm");
    if (perm.empty())
      for (int64_t i = x.dim() - 1; i >= 0; --i) perm.push_back(i);
    c.check(static_cast<int64_t>(perm.size()) == x.dim(), "perm ", dims_str(perm),
            " does not match rank ", x.dim());
    c.set_output(0, x.permute(perm));
  }});

  t.add({"", "Expand", [](OpContext& c) {
    const at::Tensor& x = c.input(0);
    auto shape = broadcast_shapes(c, sizes_of(x), to_int_vector(c.input(1)));
    c.set_output(0, x.expand(shape));
  }});

  t.add({"", "Tile", [](OpContext& c) {
    const at::Tensor& x = c.input(0);
    auto reps = to_int_vector(c.input(1));
    c.check(static_cast<int64_t>(reps.size()) == x.dim(), "repeats has ", reps.size(),
            " entries for a rank-", x.dim(), " input");
    for (int64_t r : reps) c.check(r >= 0, "negative repeat ", r);
    c.set_output(0, x.dim() == 0 ? x.clone() : x.repeat(reps));
  }});

  t.add({"", "Concat", [](OpContext& c) {
    std::vector<at::Tensor> xs;
    for (size_t i = 0; i < c.num_inputs(); ++i)
      if (c.has_input(i)) xs.push_back(c.input(i));
    c.check(!xs.empty(), "needs at least one input");
    int64_t r = xs[0].dim();
    int64_t axis = normalize_axis(c, c.attr_int("axis"), r);
    for (const auto& x : xs)
      c.check(x.dim() == r, "inputs have different ranks (", r, " and ", x.dim(), ")");
    c.set_output(0, at::cat(xs, axis));
  }});

  t.add({"", "Split", [](OpContext& c) {
    const at::Tensor& x = c.input(0);
    int64_t axis = normalize_axis(c, c.attr_int("axis", 0), x.dim());
    int64_t dim = x.size(axis);
    int64_t n = static_cast<int64_t>(c.num_outputs());
    std::vector<int64_t> split;
    if (c.opset() >= 13) {
      if (c.has_input(1)) split = to_int_vector(c.input(1));
    } else {
      split = c.attr_ints("split");
    }
    if (split.empty()) {
      if (c.opset() >= 18 && c.has_attr("num_outputs")) {
        int64_t k = c.attr_int("num_outputs");
        c.check(k >= 1 && k == n, "num_outputs ", k, " but the node has ", n, " outputs");
        int64_t chunk = (dim + k - 1) / k;
        for (int64_t i = 0; i < k; ++i)
          split.push_back(std::max<int64_t>(0, std::min(chunk, dim - i * chunk)));
      } else {
        c.check(n >= 1 && dim % n == 0, "cannot split a dim of ", dim, " into ", n,
                " equal parts");
        split.assign(n, dim / n);
      }
    }
    c.check(static_cast<int64_t>(split.size()) == n, "split has ", split.size(),
            " entries for ", n, " outputs");
    int64_t total = 0;
    for (int64_t s : split) {
      c.check(s >= 0, "negative split ", s);
      total += s;
    }
    c.check(total == dim, "split ", dims_str(split), " does not sum to ", dim);
    auto parts = at::split_with_sizes(x, split, axis);
    for (int64_t i = 0; i < n; ++i) c.set_output(i, parts[i]);
  }});

  t.add({"", "Slice", [](OpContext& c) {
    at::Tensor x = c.input(0);
    std::vector<int64_t> starts, ends, axes, steps;
    if (c.opset() >= 10) {
      starts = to_int_vector(c.input(1));
      ends = to_int_vector(c.input(2));
      if (c.has_input(3)) axes = to_int_vector(c.input(3));
      if (c.has_input(4)) steps = to_int_vector(c.input(4));
    } else {
      starts = c.attr_ints("starts");
      ends = c.attr_ints("ends");
      axes = c.attr_ints("axes");
    }
    c.check(starts.size() == ends.size(), "starts and ends differ in length");
    if (axes.empty())
      for (size_t i = 0; i < starts.size(); ++i) axes.push_back(static_cast<int64_t>(i));
    if (steps.empty()) steps.assign(starts.size(), 1);
    c.check(axes.size() == starts.size() && steps.size() == starts.size(),
            "starts, ends, axes and steps differ in length");
    std::vector<bool> seen(x.dim(), false);
    for (size_t i = 0; i < starts.size(); ++i) {
      int64_t a = normalize_axis(c, axes[i], x.dim());
      c.check(x.dim() > 0 && !seen[a], "axis ", axes[i], " repeated or invalid");
      seen[a] = true;
      x = slice_axis(c, x, a, starts[i], ends[i], steps[i]);
    }
    c.set_output(0, x);
  }});

  t.add({"", "ConstantOfShape", [](OpContext& c) {
    auto shape = to_int_vector(c.input(0));
    for (int64_t d : shape) c.check(d >= 0, "negative dim in shape ", dims_str(shape));
    at::Tensor v = c.has_attr("value") ? c.attr_tensor("value")
                                       : at::zeros({1}, at::TensorOptions().dtype(at::kFloat));
    c.check(v.numel() == 1, "value must hold one element");
    v = v.reshape({}).to(c.input(0).device());
    c.set_output(0, v.expand(shape).clone());
  }});

  t.add({"", "Range", [](OpContext& c) {
    const at::Tensor& s = c.input(0);
    auto type = s.scalar_type();
    auto opts = at::TensorOptions().dtype(type).device(s.device());
    if (at::isIntegralType(type, false)) {
      int64_t start = to_int_vector(s)[0], limit = to_int_vector(c.input(1))[0],
              delta = to_int_vector(c.input(2))[0];
      c.check(delta != 0, "delta must not be 0");
      double n = std::ceil(static_cast<double>(limit - start) / static_cast<double>(delta));
      int64_t count = std::max<int64_t>(0, static_cast<int64_t>(n));
      at::Tensor i = at::arange(count, at::TensorOptions().dtype(at::kLong).device(s.device()));
      c.set_output(0, (i * delta + start).to(type));
      return;
    }
    double start = to_double(s), limit = to_double(c.input(1)), delta = to_double(c.input(2));
    c.check(delta != 0, "delta must not be 0");
    double n = std::ceil((limit - start) / delta);
    c.check(std::isfinite(n), "range is not finite");
    int64_t count = std::max<int64_t>(0, static_cast<int64_t>(n));
    // NOTE: the spec computes start + i * delta in the input type; double then cast is closest.
    at::Tensor i = at::arange(count, at::TensorOptions().dtype(at::kDouble).device(s.device()));
    c.set_output(0, (i * delta + start).to(opts.dtype()));
  }});

  t.add({"", "EyeLike", [](OpContext& c) {
    const at::Tensor& x = c.input(0);
    c.check(x.dim() == 2, "input must be 2-D, got rank ", x.dim());
    auto type = c.has_attr("dtype") ? scalar_type_of(c, c.attr_int("dtype")) : x.scalar_type();
    int64_t k = c.attr_int("k", 0);
    auto lopts = at::TensorOptions().dtype(at::kLong).device(x.device());
    at::Tensor rows = at::arange(x.size(0), lopts).unsqueeze(1);
    at::Tensor cols = at::arange(x.size(1), lopts).unsqueeze(0);
    c.set_output(0, (cols - rows == k).to(type));
  }});

  t.add({"", "Trilu", [](OpContext& c) {
    const at::Tensor& x = c.input(0);
    c.check(x.dim() >= 2, "input must be at least 2-D, got rank ", x.dim());
    int64_t k = c.has_input(1) ? to_int_vector(c.input(1))[0] : 0;
    bool upper = c.attr_int("upper", 1) != 0;
    // NOTE: a mask keeps every dtype working (at::triu lacks some integer/bool kernels on CUDA).
    int64_t n = x.size(-2), m = x.size(-1);
    auto lopts = at::TensorOptions().dtype(at::kLong).device(x.device());
    at::Tensor d = at::arange(m, lopts).unsqueeze(0) - at::arange(n, lopts).unsqueeze(1);
    at::Tensor keep = upper ? d >= k : d <= k;
    c.set_output(0, at::where(keep, x, at::zeros({}, x.options())));
  }});

  t.add({"", "DepthToSpace", [](OpContext& c) {
    const at::Tensor& x = c.input(0);
    c.check(x.dim() == 4, "input must be 4-D, got rank ", x.dim());
    int64_t b = c.attr_int("blocksize");
    std::string mode = c.attr_string("mode", "DCR");
    int64_t n = x.size(0), ch = x.size(1), h = x.size(2), w = x.size(3);
    c.check(b > 0 && ch % (b * b) == 0, "channels ", ch, " not divisible by blocksize^2");
    at::Tensor y;
    if (mode == "DCR") {
      y = x.reshape({n, b, b, ch / (b * b), h, w}).permute({0, 3, 4, 1, 5, 2});
    } else if (mode == "CRD") {
      y = x.reshape({n, ch / (b * b), b, b, h, w}).permute({0, 1, 4, 2, 5, 3});
    } else {
      c.fail("unknown mode '", mode, "'");
    }
    c.set_output(0, y.reshape({n, ch / (b * b), h * b, w * b}));
  }});

  t.add({"", "SpaceToDepth", [](OpContext& c) {
    const at::Tensor& x = c.input(0);
    c.check(x.dim() == 4, "input must be 4-D, got rank ", x.dim());
    int64_t b = c.attr_int("blocksize");
    std::string mode = c.attr_string("mode", "DCR");
    int64_t n = x.size(0), ch = x.size(1), h = x.size(2), w = x.size(3);
    c.check(b > 0 && h % b == 0 && w % b == 0, "spatial dims not divisible by blocksize ", b);
    at::Tensor y = x.reshape({n, ch, h / b, b, w / b, b});
    if (mode == "DCR") {
      y = y.permute({0, 3, 5, 1, 2, 4});
    } else if (mode == "CRD") {
      y = y.permute({0, 1, 3, 5, 2, 4});
    } else {
      c.fail("unknown mode '", mode, "'");
    }
    c.set_output(0, y.reshape({n, ch * b * b, h / b, w / b}));
  }});
}

}  // namespace

void register_shape(OpTable& t) { register_shape_ops(t); }

}  // namespace lopper::ops
