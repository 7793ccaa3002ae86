// Shape-manipulating ops: Shape, Size, Reshape, Flatten, Squeeze, Unsqueeze, Transpose, Expand,
// Tile, Concat, Split, Slice, ConstantOfShape, Range, EyeLike, Trilu, DepthToSpace, SpaceToDepth.
#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/cpu/conv.h"
#include "ops/channels.h"
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
    if (!(x == y || x == 1 || y == 1))
      c.fail("shapes ", dims_str(a), " and ", dims_str(b), " do not broadcast");
    out[i] = x == 1 ? y : x;
  }
  return out;
}

// Axes from the attribute (opset < `input_since`) or from input `index`.
std::vector<int64_t> axes_arg(const OpContext& c, size_t index, int64_t input_since,
                              const char* name = "axes") {
  if (c.opset() >= input_since)
    return c.has_input(index) ? to_int_vector(c.input(index)) : std::vector<int64_t>{};
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

void shape_op(OpContext& c) {
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
}

void size_op(OpContext& c) {
  c.set_output(0, at::scalar_tensor(c.input(0).numel(), at::TensorOptions().dtype(at::kLong).device(
                                                            c.input(0).device())));
}

void reshape(OpContext& c) {
  const at::Tensor& x = c.input(0);
  std::vector<int64_t> shape = c.opset() >= 5 ? to_int_vector(c.input(1)) : c.attr_ints("shape");
  bool allowzero = c.opset() >= 14 && c.attr_int("allowzero", 0) != 0;
  c.set_output(0, x.reshape(reshape_target(c, x, std::move(shape), allowzero)));
}

void flatten(OpContext& c) {
  const at::Tensor& x = c.input(0);
  int64_t r = x.dim(), axis = c.attr_int("axis", 1);
  c.check(axis >= -r && axis <= r, "axis ", axis, " out of range for rank ", r);
  if (axis < 0) axis += r;
  int64_t a = 1, b = 1;
  for (int64_t i = 0; i < r; ++i) (i < axis ? a : b) *= x.size(i);
  c.set_output(0, x.reshape({a, b}));
}

void squeeze(OpContext& c) {
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
}

void unsqueeze(OpContext& c) {
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
}

void transpose(OpContext& c) {
  const at::Tensor& x = c.input(0);
  auto perm = c.attr_ints("perm");
  if (perm.empty())
    for (int64_t i = x.dim() - 1; i >= 0; --i) perm.push_back(i);
  if (static_cast<int64_t>(perm.size()) != x.dim())
    c.fail("perm ", dims_str(perm), " does not match rank ", x.dim());
  c.set_output(0, x.permute(perm));
}

void expand(OpContext& c) {
  const at::Tensor& x = c.input(0);
  auto shape = broadcast_shapes(c, sizes_of(x), to_int_vector(c.input(1)));
  check_output_fits(c, shape, x.scalar_type());  // a view, but whatever reads it allocates
  c.set_output(0, x.expand(shape));
}

void tile(OpContext& c) {
  const at::Tensor& x = c.input(0);
  auto reps = to_int_vector(c.input(1));
  c.check(static_cast<int64_t>(reps.size()) == x.dim(), "repeats has ", reps.size(),
          " entries for a rank-", x.dim(), " input");
  for (int64_t r : reps) c.check(r >= 0, "negative repeat ", r);
  std::vector<int64_t> shape = sizes_of(x);
  for (size_t i = 0; i < shape.size(); ++i)
    if (__builtin_mul_overflow(shape[i], reps[i], &shape[i])) shape[i] = INT64_MAX;
  check_output_fits(c, shape, x.scalar_type());
  c.set_output(0, x.dim() == 0 ? x.clone() : x.repeat(reps));
}

// Channel concatenation of float32 channels-last CPU tensors of one [N, -, H, W] (DenseNet's, at
// every layer) by lopper's kernel: blocks of pixels split over the threads, each input's channels
// into its slice (ATen's cat takes a generic strided copy for this layout, 2x the time; a memcpy
// per pixel and input, 3x). Undefined when the inputs are not all such tensors.
at::Tensor concat_channels_last(const std::vector<at::Tensor>& xs) {
  if (!kernels::cpu::channels_last_of_one_map(xs)) return {};
  int64_t channels = 0;
  for (const auto& x : xs) {
    if (x.requires_grad()) return {};
    channels += x.size(1);
  }
  // The identity as a per-channel affine map: x * 1 + (-0) is x, bit for bit (signed zeros,
  // infinities and NaN included).
  const std::vector<float> one(static_cast<size_t>(channels), 1.f);
  const std::vector<float> minus_zero(static_cast<size_t>(channels), -0.f);
  return kernels::cpu::concat_affine_nhwc(xs, one.data(), minus_zero.data(), {});
}

void concat(OpContext& c) {
  std::vector<at::Tensor> xs;
  for (size_t i = 0; i < c.num_inputs(); ++i)
    if (c.has_input(i)) xs.push_back(c.input(i));
  c.check(!xs.empty(), "needs at least one input");
  int64_t r = xs[0].dim();
  int64_t axis = normalize_axis(c, c.attr_int("axis"), r);
  for (const auto& x : xs)
    c.check(x.dim() == r, "inputs have different ranks (", r, " and ", x.dim(), ")");
  if (r == 4 && axis == 1 && c.prepack()) {
    if (at::Tensor y = concat_channels_last(xs); y.defined()) return c.set_output(0, y);
  }
  c.set_output(0, at::cat(xs, axis));
}

// ChannelShuffle(shape1, shape2, x1, ..., xn) = Reshape(Transpose(Reshape(Concat(x1, ..., xn,
// axis 1), shape1), perm 0,2,1,3,4), shape2): ShuffleNet's channel shuffle, made by the
// executor's fusion pass; attribute allowzero: the two Reshapes' own. Where shape1 is [n, g, c / g,
// h, w] and shape2 [n, c, h, w] of float32 CPU inputs whose channels lopper's kernel reads in place
// (channels-last, or a channel slice of such), the shuffle is written in one pass, channels-last;
// otherwise the nodes' own steps.
void channel_shuffle(OpContext& c) {
  c.check(c.num_inputs() >= 3, "needs two shapes and at least one input");
  std::vector<at::Tensor> xs;
  for (size_t i = 2; i < c.num_inputs(); ++i) xs.push_back(c.input(i));
  std::vector<int64_t> shape1 = to_int_vector(c.input(0)), shape2 = to_int_vector(c.input(1));
  const std::vector<int64_t> allowzero = c.attr_ints("allowzero", {0, 0});
  c.check(allowzero.size() == 2, "allowzero has ", allowzero.size(), " entries, not 2");
  const bool az1 = allowzero[0] != 0, az2 = allowzero[1] != 0;
  if (c.prepack() && kernels::cpu::pixel_rows_of_one_map(xs)) {
    int64_t channels = 0;
    for (const auto& x : xs) channels += x.size(1);
    const at::Tensor& x0 = xs[0];
    const std::vector<int64_t> in{x0.size(0), channels, x0.size(2), x0.size(3)};
    const auto t1 = reshape_target(c, in, shape1, az1);
    if (t1.size() == 5 && t1[0] == in[0] && t1[1] * t1[2] == channels && t1[3] == in[2] &&
        t1[4] == in[3]) {
      const auto t2 = reshape_target(c, {in[0], t1[2], t1[1], in[2], in[3]}, shape2, az2);
      if (t2 == in) return c.set_output(0, kernels::cpu::concat_shuffle_nhwc(xs, t1[1]));
    }
  }
  const int64_t r = xs[0].dim();
  for (const auto& x : xs)
    c.check(x.dim() == r, "inputs have different ranks (", r, " and ", x.dim(), ")");
  c.check(r >= 2, "cannot concatenate rank-", r, " inputs along axis 1");
  const at::Tensor x = xs.size() == 1 ? xs[0] : at::cat(xs, 1);
  const at::Tensor t = x.reshape(reshape_target(c, x, std::move(shape1), az1));
  c.check(t.dim() == 5, "perm [0, 2, 1, 3, 4] does not match rank ", t.dim());
  const at::Tensor u = t.permute({0, 2, 1, 3, 4});
  c.set_output(0, u.reshape(reshape_target(c, u, std::move(shape2), az2)));
}

void split(OpContext& c) {
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
      c.check(n >= 1 && dim % n == 0, "cannot split a dim of ", dim, " into ", n, " equal parts");
      split.assign(n, dim / n);
    }
  }
  c.check(static_cast<int64_t>(split.size()) == n, "split has ", split.size(), " entries for ", n,
          " outputs");
  int64_t total = 0;
  for (int64_t s : split) {
    c.check(s >= 0, "negative split ", s);
    total += s;
  }
  if (total != dim) c.fail("split ", dims_str(split), " does not sum to ", dim);
  auto parts = at::split_with_sizes(x, split, axis);
  for (int64_t i = 0; i < n; ++i) c.set_output(i, parts[i]);
}

void slice(OpContext& c) {
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
}

void constant_of_shape(OpContext& c) {
  auto shape = to_int_vector(c.input(0));
  for (int64_t d : shape)
    if (d < 0) c.fail("negative dim in shape ", dims_str(shape));
  at::Tensor v = c.has_attr("value") ? c.attr_tensor("value")
                                     : at::zeros({1}, at::TensorOptions().dtype(at::kFloat));
  c.check(v.numel() == 1, "value must hold one element");
  check_output_fits(c, shape, v.scalar_type());
  v = v.reshape({}).to(c.input(0).device());
  c.set_output(0, v.expand(shape).clone());
}

void range(OpContext& c) {
  const at::Tensor& s = c.input(0);
  auto type = s.scalar_type();
  auto opts = at::TensorOptions().dtype(type).device(s.device());
  if (at::isIntegralType(type, false)) {
    int64_t start = to_int_vector(s)[0], limit = to_int_vector(c.input(1))[0],
            delta = to_int_vector(c.input(2))[0];
    c.check(delta != 0, "delta must not be 0");
    double n = std::ceil(static_cast<double>(limit - start) / static_cast<double>(delta));
    int64_t count = std::max<int64_t>(0, static_cast<int64_t>(n));
    check_output_fits(c, {count}, at::kLong);
    at::Tensor i = at::arange(count, at::TensorOptions().dtype(at::kLong).device(s.device()));
    c.set_output(0, (i * delta + start).to(type));
    return;
  }
  double start = to_double(s), limit = to_double(c.input(1)), delta = to_double(c.input(2));
  c.check(delta != 0, "delta must not be 0");
  double n = std::ceil((limit - start) / delta);
  c.check(std::isfinite(n) && n < 9e18, "range is not finite");
  int64_t count = std::max<int64_t>(0, static_cast<int64_t>(n));
  check_output_fits(c, {count}, at::kDouble);
  // NOTE: the spec computes start + i * delta in the input type; double then cast is closest.
  at::Tensor i = at::arange(count, at::TensorOptions().dtype(at::kDouble).device(s.device()));
  c.set_output(0, (i * delta + start).to(opts.dtype()));
}

void eye_like(OpContext& c) {
  const at::Tensor& x = c.input(0);
  c.check(x.dim() == 2, "input must be 2-D, got rank ", x.dim());
  auto type = c.has_attr("dtype") ? scalar_type_of(c, c.attr_int("dtype")) : x.scalar_type();
  int64_t k = c.attr_int("k", 0);
  auto lopts = at::TensorOptions().dtype(at::kLong).device(x.device());
  at::Tensor rows = at::arange(x.size(0), lopts).unsqueeze(1);
  at::Tensor cols = at::arange(x.size(1), lopts).unsqueeze(0);
  c.set_output(0, (cols - rows == k).to(type));
}

void trilu(OpContext& c) {
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
}

// DepthToSpace's and SpaceToDepth's 4-D input: its dims, the block size and the mode.
struct BlockDims {
  int64_t b, n, ch, h, w;
  std::string mode;
};

BlockDims block_dims(OpContext& c, const at::Tensor& x) {
  c.check(x.dim() == 4, "input must be 4-D, got rank ", x.dim());
  BlockDims d{c.attr_int("blocksize"), x.size(0), x.size(1), x.size(2), x.size(3), ""};
  d.mode = c.attr_string("mode", "DCR");
  return d;
}

// Whether `mode` is DCR (else CRD; the op fails on any other).
bool is_dcr(OpContext& c, const std::string& mode) {
  if (mode != "DCR" && mode != "CRD") c.fail("unknown mode '", mode, "'");
  return mode == "DCR";
}

void depth_to_space(OpContext& c) {
  const at::Tensor& x = c.input(0);
  const auto [b, n, ch, h, w, mode] = block_dims(c, x);
  c.check(b > 0 && ch % (b * b) == 0, "channels ", ch, " not divisible by blocksize^2");
  const at::Tensor y = is_dcr(c, mode)
                           ? x.reshape({n, b, b, ch / (b * b), h, w}).permute({0, 3, 4, 1, 5, 2})
                           : x.reshape({n, ch / (b * b), b, b, h, w}).permute({0, 1, 4, 2, 5, 3});
  c.set_output(0, y.reshape({n, ch / (b * b), h * b, w * b}));
}

void space_to_depth(OpContext& c) {
  const at::Tensor& x = c.input(0);
  const auto [b, n, ch, h, w, mode] = block_dims(c, x);
  c.check(b > 0 && h % b == 0 && w % b == 0, "spatial dims not divisible by blocksize ", b);
  const at::Tensor y = x.reshape({n, ch, h / b, b, w / b, b});
  c.set_output(0, (is_dcr(c, mode) ? y.permute({0, 3, 5, 1, 2, 4}) : y.permute({0, 1, 3, 5, 2, 4}))
                      .reshape({n, ch * b * b, h / b, w / b}));
}

// Channel rules for shape ops. Reshape's target shape is its input 1 (rewritten when channels
// go); Flatten, Squeeze and Unsqueeze have none.
void reshape_channels(ChannelContext& c) { channel_rules::reshape(c, 1); }
void flatten_channels(ChannelContext& c) { channel_rules::reshape(c, -1); }

void transpose_channels(ChannelContext& c) {
  const Tracked* x = c.in(0);
  if (!x) return;
  const int64_t rank = int64_t(c.in_shape(0).size());
  std::vector<int64_t> perm = c.attr_ints("perm");
  if (perm.empty())
    for (int64_t i = rank - 1; i >= 0; --i) perm.push_back(i);
  for (int64_t j = 0; j < int64_t(perm.size()); ++j)
    if (perm[j] == x->axis) return c.set_out(0, Tracked{j, x->atoms});
  c.barrier("Transpose without a valid perm");
}

// Expand's shape at the channel axis: a constant's entry equal to the channel count is rewritten
// to the kept count (1 broadcasts and follows by itself). A shape computed at run time (a dynamic
// export's repeat of grouped-query key/value heads: Concat(Shape(x)[0], [kv_heads], [n_rep],
// Shape(x)[1], [head_dim])) is followed entry by entry: the entry at the channel axis is a
// literal (rewritten) or 1, and no other entry depends on a channel count.
void expand_channels(ChannelContext& c) {
  using Kind = ShapeEntry::Kind;
  const Tracked* x = c.in(0);
  if (!x) return;
  const int64_t out_rank = int64_t(c.out_shape(0).size());
  const int64_t out_axis = x->axis + out_rank - int64_t(c.in_shape(0).size());
  const int64_t old = int64_t(x->atoms.size());
  auto atoms = x->atoms;
  at::Tensor shape = c.constant(1);
  if (!shape.defined()) {
    const std::vector<ShapeEntry>* entries = c.shape_entries(1);
    const std::string runtime = "Expand to a shape computed at run time";
    if (!entries) return c.barrier(runtime + " (not one lopper can read)");
    const int64_t k = out_axis - (out_rank - int64_t(entries->size()));
    for (size_t j = 0; j < entries->size(); ++j) {
      const ShapeEntry& e = (*entries)[j];
      const std::string at = " (its entry " + std::to_string(j) + " ";
      if (e.kind == Kind::kOther)
        return c.barrier(runtime + at + "is not followed: " + e.why + ")");
      if (e.kind == Kind::kChannels) return c.barrier(runtime + at + "follows a channel count)");
      if (int64_t(j) == k && !(e.kind == Kind::kLiteral && (e.value == old || e.value == 1)))
        return c.barrier(runtime + at + "(the channels) is a size computed at run time)");
    }
    if (k >= 0 && (*entries)[size_t(k)].value == old && old != 1) {
      const ShapeEntry e = (*entries)[size_t(k)];
      c.edit([e, atoms, old](ChannelEditor& ed) {
        const int64_t kept = int64_t(ed.kept(atoms).size());
        if (kept != old) ed.set_shape_entry(1, e, kept);
      });
    }
    c.independent_of(1);
    return c.set_out(0, Tracked{out_axis, atoms});
  }
  const int64_t k = out_axis - (out_rank - shape.numel());
  if (k >= 0 && to_int_vector(shape)[k] == old)
    c.edit([k, atoms](ChannelEditor& e) {
      at::Tensor s = e.constant(1).clone();
      s.data_ptr<int64_t>()[k] = int64_t(e.kept(atoms).size());
      e.set_constant(1, s);
    });
  c.set_out(0, Tracked{out_axis, x->atoms});
}

void concat_channels(ChannelContext& c) {
  const int64_t rank = int64_t(c.out_shape(0).size());
  int64_t axis = c.attr_int("axis");
  if (axis < 0) axis += rank;
  int64_t other = -1;  // a tracked axis other than the concatenated one
  bool along = false;
  for (size_t i = 0; i < c.num_inputs(); ++i)
    if (const Tracked* t = c.in(i)) {
      if (t->axis == axis) {
        along = true;
      } else if (other < 0 || other == t->axis) {
        other = t->axis;
      } else {
        return c.barrier("Concat of inputs tracked on different axes");
      }
    }
  if (along && other >= 0) return c.barrier("Concat of inputs tracked on different axes");
  if (along) {  // channels side by side: offsets follow from the kept counts
    std::vector<int64_t> out;
    for (size_t i = 0; i < c.num_inputs(); ++i) {
      std::vector<int64_t> part;
      if (const Tracked* t = c.in(i)) {
        part = t->atoms;
      } else {
        part = c.fresh(c.in_shape(i)[axis]);
        c.pin(part, "concatenated with channels that are not tracked");
      }
      out.insert(out.end(), part.begin(), part.end());
    }
    return c.set_out(0, Tracked{axis, out});
  }
  if (other >= 0) channel_rules::broadcast(c);  // same channels in every input
}

void split_channels(ChannelContext& c) {
  const Tracked* x = c.in(0);
  if (!x) return;
  const int64_t rank = int64_t(c.in_shape(0).size());
  int64_t axis = c.attr_int("axis", 0);
  if (axis < 0) axis += rank;
  if (axis != x->axis) {
    for (size_t o = 0; o < c.num_outputs(); ++o) c.set_out(o, *x);
    return;
  }
  if (c.has_input(1) && !c.constant(1).defined())
    return c.barrier("Split sizes computed at run time");
  std::vector<std::vector<int64_t>> parts;
  int64_t at = 0;
  for (size_t o = 0; o < c.num_outputs(); ++o) {
    int64_t n = c.out_shape(o).empty() ? 0 : c.out_shape(o)[axis];
    parts.emplace_back(x->atoms.begin() + at, x->atoms.begin() + at + n);
    c.set_out(o, Tracked{axis, parts.back()});
    at += n;
  }
  const bool as_input = c.opset() >= 13;
  c.edit([parts, as_input](ChannelEditor& e) {
    std::vector<int64_t> sizes;
    for (const auto& p : parts) sizes.push_back(int64_t(e.kept(p).size()));
    auto& attrs = e.node().attrs;
    attrs.erase(std::remove_if(attrs.begin(), attrs.end(),
                               [](const ir::Attribute& a) { return a.name == "num_outputs"; }),
                attrs.end());
    if (as_input) return e.set_constant(1, at::tensor(sizes, at::kLong));
    for (auto& a : attrs)
      if (a.name == "split") return void(a.ints = sizes);
    attrs.push_back(ir::ints_attr("split", sizes));
  });
}

// [start, end) of a step-1 Slice along an axis of n entries, with ONNX's clamping.
std::pair<int64_t, int64_t> slice_bounds(int64_t start, int64_t end, int64_t n) {
  auto clampi = [n](int64_t v) { return std::clamp<int64_t>(v < 0 ? v + n : v, 0, n); };
  const int64_t s = clampi(start);
  return {s, std::max(s, clampi(end))};
}

// A Slice of a shape vector: the channel count is in the result or it is not.
void slice_of_shape(ChannelContext& c, const Tracked& sh) {
  if (c.opset() < 10 || !c.constant(1).defined() || !c.constant(2).defined()) return;
  auto starts = to_int_vector(c.constant(1)), ends = to_int_vector(c.constant(2));
  if (starts.size() != 1 ||
      (c.has_input(4) && to_int_vector(c.constant(4)) != std::vector<int64_t>{1}))
    return;
  const int64_t n = c.in_shape(0).empty() ? 0 : c.in_shape(0)[0];
  const auto [s, e] = slice_bounds(starts[0], ends[0], n);
  if (sh.axis >= s && sh.axis < e)
    c.set_shape_out(0, Tracked{sh.axis - s, sh.atoms});
  else
    c.independent_of(0);
}

void slice_channels(ChannelContext& c) {
  if (const Tracked* sh = c.shape_in(0)) return slice_of_shape(c, *sh);
  const Tracked* x = c.in(0);
  if (!x) return;
  const int64_t rank = int64_t(c.in_shape(0).size());
  const bool legacy = c.opset() < 10;  // starts/ends/axes as attributes
  std::vector<int64_t> starts, ends, axes, steps;
  if (legacy) {
    starts = c.attr_ints("starts"), ends = c.attr_ints("ends"), axes = c.attr_ints("axes");
  } else {
    for (size_t i = 1; i < c.num_inputs(); ++i)
      if (c.has_input(i) && (c.in(i) || !c.constant(i).defined()))
        return c.barrier("Slice bounds computed at run time");
    starts = to_int_vector(c.constant(1)), ends = to_int_vector(c.constant(2));
    if (c.has_input(3)) axes = to_int_vector(c.constant(3));
    if (c.has_input(4)) steps = to_int_vector(c.constant(4));
  }
  if (axes.empty())
    for (size_t i = 0; i < starts.size(); ++i) axes.push_back(int64_t(i));
  int64_t which = -1;
  for (size_t i = 0; i < axes.size(); ++i)
    if ((axes[i] < 0 ? axes[i] + rank : axes[i]) == x->axis) which = int64_t(i);
  if (which < 0) return c.set_out(0, *x);
  if (!steps.empty() && steps[which] != 1) return c.barrier("Slice of the channels with a step");
  const auto [s, e] = slice_bounds(starts[which], ends[which], int64_t(x->atoms.size()));
  std::vector<int64_t> all = x->atoms;
  c.set_out(0, Tracked{x->axis, std::vector<int64_t>(all.begin() + s, all.begin() + e)});
  c.edit([all, s, e, which, legacy](ChannelEditor& ed) {
    int64_t ns = 0, ne = 0;
    for (int64_t i = 0; i < e; ++i)
      if (!ed.removed(all[i])) (i < s ? ns : ne)++;
    ne += ns;
    if (legacy) {
      for (auto& a : ed.node().attrs) {
        if (a.name == "starts") a.ints[which] = ns;
        if (a.name == "ends") a.ints[which] = ne;
      }
      return;
    }
    for (auto [input, v] : {std::pair<size_t, int64_t>{1, ns}, {2, ne}}) {
      at::Tensor t = ed.constant(input).clone().to(at::kLong);
      t.data_ptr<int64_t>()[which] = v;
      ed.set_constant(input, t.to(ed.constant(input).scalar_type()));
    }
  });
}

void shape_channels(ChannelContext& c) {
  const Tracked* x = c.in(0);
  if (!x) return;
  const int64_t rank = int64_t(c.in_shape(0).size());
  int64_t start = c.attr_int("start", 0), end = c.attr_int("end", rank);
  if (start < 0) start += rank;
  if (end < 0) end += rank;
  // The channel count becomes data: whatever is computed from it is followed (ops/channels.h).
  if (x->axis >= start && x->axis < end) c.set_shape_out(0, Tracked{x->axis - start, x->atoms});
}

}  // namespace

std::vector<int64_t> reshape_target(const AttrReader& c, const std::vector<int64_t>& sizes,
                                    std::vector<int64_t> shape, bool allowzero) {
  const int64_t rank = static_cast<int64_t>(sizes.size()), numel = numel_of(sizes);
  if (!allowzero)  // (before the copies, so that the message gives the shape as written)
    for (size_t i = 0; i < shape.size(); ++i)
      if (shape[i] == 0 && static_cast<int64_t>(i) >= rank)
        c.fail("shape ", dims_str(shape), " copies dim ", i, " of a rank-", rank, " input");
  int64_t infer = -1, known = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == 0 && !allowzero) shape[i] = sizes[i];
    if (shape[i] == -1) {
      if (infer >= 0) c.fail("shape ", dims_str(shape), " has more than one -1");
      infer = static_cast<int64_t>(i);
      continue;
    }
    if (shape[i] < 0) c.fail("shape ", dims_str(shape), " has a negative dim");
    known *= shape[i];
  }
  if (infer >= 0) {
    if (known == 0 || numel % known != 0)
      c.fail("cannot reshape ", dims_str(sizes), " to ", dims_str(shape));
    shape[infer] = numel / known;
  }
  if (numel_of(shape) != numel) c.fail("cannot reshape ", dims_str(sizes), " to ", dims_str(shape));
  return shape;
}

std::vector<int64_t> reshape_target(const AttrReader& c, const at::Tensor& x,
                                    std::vector<int64_t> shape, bool allowzero) {
  return reshape_target(c, sizes_of(x), std::move(shape), allowzero);
}

namespace {

using Entries = std::vector<ShapeEntry>;
using Kind = ShapeEntry::Kind;

// Shape: an entry per dimension: the tracked axis's channel count follows the channels, a size
// of a tensor whose shape follows them is not followed, any other a run-time size.
std::optional<Entries> shape_arith(const ShapeArithContext& c) {
  if (c.num_inputs() == 0 || c.out_rank(0) < 0) return std::nullopt;  // not seen in the run
  const auto& sh = c.in_shape(0);
  const int64_t r = int64_t(sh.size());
  auto clampi = [r](int64_t v) { return std::clamp<int64_t>(v < 0 ? v + r : v, 0, r); };
  const int64_t s = clampi(c.attr_int("start", 0)), e = clampi(c.attr_int("end", r));
  const Tracked* t = c.in(0);
  const std::vector<int64_t>* d = c.depends_on(0);
  Entries out;
  for (int64_t i = s; i < e; ++i) {
    ShapeEntry x;
    x.value = sh[i];
    if (t && t->axis == i) {
      x.kind = Kind::kChannels, x.atoms = t->atoms;
    } else if (d) {
      x = shape_rules::other(
          *d, "it is a size of '" + c.node().inputs[0] + "', whose shape follows channel counts");
      x.value = sh[i];
    } else {
      x.kind = Kind::kDim;
    }
    out.push_back(std::move(x));
  }
  return out;
}

// Slice of a vector along its one axis, by constant bounds.
std::optional<Entries> slice_arith(const ShapeArithContext& c) {
  auto e = c.entries(0);
  if (!e) return std::nullopt;
  const auto& in = c.node().inputs;
  std::vector<int64_t> starts, ends, axes, steps;
  if (c.opset() < 10) {
    if (!c.has_attr("starts") || !c.has_attr("ends")) return std::nullopt;
    starts = c.attr_ints("starts"), ends = c.attr_ints("ends"), axes = c.attr_ints("axes");
  } else {
    auto a = c.constant_values(1), b = c.constant_values(2);
    if (!a || !b) return std::nullopt;
    starts = *a, ends = *b;
    if (in.size() > 3 && !in[3].empty()) {
      auto x = c.constant_values(3);
      if (!x) return std::nullopt;
      axes = *x;
    }
    if (in.size() > 4 && !in[4].empty()) {
      auto x = c.constant_values(4);
      if (!x) return std::nullopt;
      steps = *x;
    }
  }
  if (starts.size() != 1 || ends.size() != 1 || axes.size() > 1 || steps.size() > 1 ||
      (!axes.empty() && axes[0] != 0 && axes[0] != -1))
    return std::nullopt;
  const int64_t len = int64_t(e->size()), step = steps.empty() ? 1 : steps[0];
  if (step == 0) return std::nullopt;
  auto clampi = [&](int64_t v, int64_t lo, int64_t hi) {
    return std::clamp<int64_t>(v < 0 ? v + len : v, lo, hi);
  };
  const int64_t s = step > 0 ? clampi(starts[0], 0, len) : clampi(starts[0], 0, len - 1);
  const int64_t end = step > 0 ? clampi(ends[0], 0, len) : clampi(ends[0], -1, len - 1);
  Entries out;
  for (int64_t i = s; step > 0 ? i < end : i > end; i += step) out.push_back((*e)[i]);
  if (int64_t(out.size()) != c.out_numel(0)) return std::nullopt;
  return shape_rules::via(std::move(out), 0);
}

// Concat of vectors: their entries one after another.
std::optional<Entries> concat_arith(const ShapeArithContext& c) {
  if (c.out_rank(0) != 1) return std::nullopt;
  Entries out;
  for (size_t i = 0; i < c.num_inputs(); ++i) {
    auto e = c.entries(i);
    if (!e) return std::nullopt;
    e = shape_rules::via(std::move(*e), i);
    out.insert(out.end(), e->begin(), e->end());
  }
  if (int64_t(out.size()) != c.out_numel(0)) return std::nullopt;
  return out;
}

}  // namespace

void register_shape(OpTable& t) {
  t.add_onnx({
      {"Shape", shape_op, shape_channels, shape_arith},
      {"Size", size_op},
      {"Reshape", reshape, reshape_channels, shape_rules::same, {1}},
      {"Flatten", flatten, flatten_channels, shape_rules::same},
      {"Squeeze", squeeze, flatten_channels, shape_rules::same, {1}},
      {"Unsqueeze", unsqueeze, flatten_channels, shape_rules::same, {1}},
      {"Transpose", transpose, transpose_channels},
      {"Expand", expand, expand_channels, {}, {1}},
      {"Tile", tile, {}, {}, {1}},
      {"Concat", concat, concat_channels, concat_arith},
      {"Split", split, split_channels, {}, {1}},
      {"Slice", slice, slice_channels, slice_arith, {1, 2, 3, 4}},
      {"ConstantOfShape", constant_of_shape, {}, {}, {0}},
      {"Range", range},
      {"EyeLike", eye_like},
      {"Trilu", trilu},
      {"DepthToSpace", depth_to_space},
      {"SpaceToDepth", space_to_depth},
  });
  t.add({"ai.lopper", "ChannelShuffle", channel_shuffle});
}

}  // namespace lopper::ops
