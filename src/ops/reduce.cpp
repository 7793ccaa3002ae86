// Reductions (Reduce*, ArgMax/ArgMin), the scans CumSum and CumProd, and TopK.
#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <limits>

#include "exec/pool_kernels.h"
#include "ops/channels.h"
#include "ops/op.h"

namespace lopper::ops {

namespace {

enum class Reduce { kSum, kMean, kMax, kMin, kProd, kL1, kL2, kLogSum, kLogSumExp, kSumSquare };

bool is_wide_unsigned(at::ScalarType t) {
  return t == at::kUInt16 || t == at::kUInt32 || t == at::kUInt64;
}

// An int64 key with the same order as the values (ATen lacks most uint16/32/64 kernels).
at::Tensor order_key(const at::Tensor& t) {
  if (t.scalar_type() == at::kUInt64)
    return at::bitwise_xor(t.to(at::kLong), std::numeric_limits<int64_t>::min());
  return is_wide_unsigned(t.scalar_type()) ? t.to(at::kLong) : t;
}
at::Tensor from_key(const at::Tensor& k, at::ScalarType st) {
  if (st == at::kUInt64) return at::bitwise_xor(k, std::numeric_limits<int64_t>::min()).to(st);
  return k.scalar_type() == st ? k : k.to(st);
}

at::Scalar int_limit(at::ScalarType st, bool max) {
  switch (st) {
    case at::kBool:
      return at::Scalar(max);
    case at::kByte:
      return at::Scalar(int64_t{max ? 255 : 0});
    case at::kChar:
      return at::Scalar(int64_t{max ? 127 : -128});
    case at::kShort:
      return at::Scalar(int64_t{max ? 32767 : -32768});
    case at::kUInt16:
      return at::Scalar(int64_t{max ? 65535 : 0});
    case at::kInt:
      return at::Scalar(
          int64_t{max ? std::numeric_limits<int32_t>::max() : std::numeric_limits<int32_t>::min()});
    case at::kUInt32:
      return at::Scalar(int64_t{max ? 4294967295LL : 0});
    case at::kUInt64:
      return max ? at::Scalar(std::numeric_limits<uint64_t>::max()) : at::Scalar(int64_t{0});
    default:
      return at::Scalar(max ? std::numeric_limits<int64_t>::max()
                            : std::numeric_limits<int64_t>::min());
  }
}

// The value a reduction over no elements gives (numpy's, as the ONNX reference does).
at::Tensor empty_value(Reduce kind, const at::Tensor& x, at::IntArrayRef shape) {
  at::ScalarType st = x.scalar_type();
  auto opts = x.options();
  bool fp = at::isFloatingType(st);
  double inf = std::numeric_limits<double>::infinity();
  switch (kind) {
    case Reduce::kMax:
      return fp ? at::full(shape, -inf, opts) : at::full(shape, int_limit(st, false), opts);
    case Reduce::kMin:
      return fp ? at::full(shape, inf, opts) : at::full(shape, int_limit(st, true), opts);
    case Reduce::kProd:
      return at::ones(shape, opts);
    case Reduce::kMean:
      return at::full(shape, std::numeric_limits<double>::quiet_NaN(), opts);
    case Reduce::kLogSum:
    case Reduce::kLogSumExp:
      return at::full(shape, -inf, opts);
    default:
      return at::zeros(shape, opts);
  }
}

// Reduces x over `dims` (non-empty, normalised, distinct).
at::Tensor reduce_dims(Reduce kind, const at::Tensor& x, std::vector<int64_t> dims, bool keep) {
  at::ScalarType st = x.scalar_type();
  std::vector<int64_t> out_shape;
  bool empty_reduced = false;
  for (int64_t d = 0; d < x.dim(); ++d) {
    bool r = std::find(dims.begin(), dims.end(), d) != dims.end();
    if (r && x.size(d) == 0) empty_reduced = true;
    if (!r)
      out_shape.push_back(x.size(d));
    else if (keep)
      out_shape.push_back(1);
  }
  if (empty_reduced) return empty_value(kind, x, out_shape);

  bool fp = at::isFloatingType(st) || at::isComplexType(st);
  // Integer math that ATen would promote (or not support) runs in int64 / double, then comes back.
  bool to_double = kind == Reduce::kMean || kind == Reduce::kL2 || kind == Reduce::kLogSum ||
                   kind == Reduce::kLogSumExp;
  at::Tensor v =
      fp ? x : (to_double ? x.to(at::kDouble) : (is_wide_unsigned(st) ? x.to(at::kLong) : x));
  at::Tensor r;
  switch (kind) {
    case Reduce::kSum:
      r = at::sum(v, dims, keep);
      break;
    case Reduce::kMean:
      r = at::mean(v, dims, keep);
      break;
    case Reduce::kMax:
      r = from_key(at::amax(order_key(x), dims, keep), st);
      break;
    case Reduce::kMin:
      r = from_key(at::amin(order_key(x), dims, keep), st);
      break;
    case Reduce::kProd: {
      std::sort(dims.rbegin(), dims.rend());
      r = v;
      for (int64_t d : dims) r = at::prod(r, d, keep);
      break;
    }
    case Reduce::kL1:
      r = at::sum(at::abs(v), dims, keep);
      break;
    case Reduce::kL2:
      r = at::sqrt(at::sum(v * v, dims, keep));
      break;
    case Reduce::kLogSum:
      r = at::log(at::sum(v, dims, keep));
      break;
    case Reduce::kLogSumExp:
      r = at::logsumexp(v, dims, keep);
      break;
    case Reduce::kSumSquare:
      r = at::sum(v * v, dims, keep);
      break;
  }
  return r.scalar_type() == st ? r : r.to(st);
}

void add_reduce(OpTable& t, const char* name, Reduce kind, int64_t axes_input_from) {
  t.add({"", name, [kind, axes_input_from](OpContext& c) {
           const at::Tensor& x = c.input(0);
           bool keep = c.attr_int("keepdims", 1) != 0;
           std::vector<int64_t> axes;
           bool have_axes = false;
           // Axes are an optional input from opset `axes_input_from`, an attribute before it.
           if (c.has_input(1) || c.opset() >= axes_input_from) {
             if (c.has_input(1)) {
               axes = to_int_vector(c.input(1));
               have_axes = !axes.empty();
             }
           } else {
             axes = c.attr_ints("axes");
             have_axes = !axes.empty();
           }
           if (!have_axes && c.attr_int("noop_with_empty_axes", 0) != 0) {
             // Reduce over no axes: each element on its own (Sum -> x, SumSquare -> x^2 ...).
             c.set_output(0, reduce_dims(kind, x.unsqueeze(0), {0}, false));
             return;
           }
           int64_t rank = x.dim();
           std::vector<int64_t> dims;
           if (!have_axes) {
             for (int64_t d = 0; d < rank; ++d) dims.push_back(d);
           } else {
             for (int64_t a : axes) {
               c.check(a >= -rank && a < rank, "axis ", a, " out of range for rank ", rank);
               int64_t d = a < 0 ? a + rank : a;
               if (std::find(dims.begin(), dims.end(), d) == dims.end()) dims.push_back(d);
             }
           }
           if (dims.empty()) {  // a 0-d input
             c.set_output(0, reduce_dims(kind, x.unsqueeze(0), {0}, false));
             return;
           }
           // The mean over the pixels of a channels-last activation (MnasNet's and EfficientNet's
           // x.mean([2, 3]) before the classifier): one pass, channels innermost.
           std::vector<int64_t> sorted = dims;
           std::sort(sorted.begin(), sorted.end());
           if (kind == Reduce::kMean && sorted == std::vector<int64_t>{2, 3})
             if (auto y = mean_over_pixels_by_kernel(c, x))
               return c.set_output(0, keep ? *y : y->view({x.size(0), x.size(1)}));
           c.set_output(0, reduce_dims(kind, x, dims, keep));
         }});
}

void add_arg(OpTable& t, const char* name, bool is_max) {
  t.add({"", name, [is_max](OpContext& c) {
           const at::Tensor& x = c.input(0);
           int64_t rank = x.dim();
           bool keep = c.attr_int("keepdims", 1) != 0;
           bool last = c.attr_int("select_last_index", 0) != 0;
           at::Tensor v = order_key(x.detach());
           if (rank == 0) v = v.reshape({1});
           int64_t axis = normalize_axis(c, c.attr_int("axis", 0), v.dim());
           c.check(v.size(axis) > 0, "cannot take ", is_max ? "ArgMax" : "ArgMin",
                   " over an empty axis");
           int64_t n = v.size(axis);
           if (last) v = at::flip(v, {axis});
           // ATen's argmax/argmin return the first extreme index.
           at::Tensor idx = is_max ? at::argmax(v, axis, true) : at::argmin(v, axis, true);
           if (last) idx = (n - 1) - idx;
           if (!keep) idx = idx.squeeze(axis);
           if (rank == 0) idx = idx.reshape({});
           c.set_output(0, idx);
         }});
}

// Channel rules: a reduction over other axes carries the channels (shifted when keepdims=0); a
// ReduceMean over the channel axis alone, keeping it, gives an untracked statistic; any other
// reduction over the channels is a barrier.
void reduce_channels(ChannelContext& c) {
  const Tracked* x = c.in(0);
  if (!x) return;
  const int64_t rank = int64_t(c.in_shape(0).size());
  std::vector<int64_t> axes = c.attr_ints("axes");
  if (c.num_inputs() > 1 && c.has_input(1)) {
    at::Tensor t = c.constant(1);
    if (!t.defined()) return c.barrier(c.node().op_type + " over axes computed at run time");
    axes = to_int_vector(t);
  }
  if (axes.empty()) {
    if (c.attr_int("noop_with_empty_axes", 0) != 0) return c.set_out(0, *x);
    return c.barrier(c.node().op_type + " over every axis");
  }
  const bool keep = c.attr_int("keepdims", 1) != 0;
  int64_t out = x->axis;
  for (int64_t a : axes) {
    if (a < 0) a += rank;
    if (a != x->axis) {
      if (a < x->axis && !keep) --out;
      continue;
    }
    // The mean over the channels alone, kept as an axis of 1 (RMSNorm's mean square, a
    // LayerNorm's mean and variance as exporters spell them out): a statistic per position that
    // broadcasts back over the channels; after pruning it covers the channels that stay, as
    // LayerNormalization's statistics do. Any other reduction over the channels is a barrier.
    if (c.node().op_type == "ReduceMean" && keep && axes.size() == 1) return;
    return c.barrier(c.node().op_type + " over the channels");
  }
  c.set_out(0, Tracked{out, x->atoms});
}

void cum_sum(OpContext& c) {
  const at::Tensor& x = c.input(0);
  auto axv = to_int_vector(c.input(1));
  c.check(axv.size() == 1, "axis must hold one value");
  int64_t rank = x.dim();
  at::Tensor v = rank == 0 ? x.reshape({1}) : x;
  int64_t axis = normalize_axis(c, axv[0], v.dim());
  bool exclusive = c.attr_int("exclusive", 0) != 0;
  bool reverse = c.attr_int("reverse", 0) != 0;
  at::ScalarType st = x.scalar_type();
  if (reverse) v = at::flip(v, {axis});
  at::Tensor r = at::cumsum(is_wide_unsigned(st) ? v.to(at::kLong) : v, axis);
  if (exclusive && v.size(axis) > 0) {
    // Shift by one along the axis: y[0] = 0, y[i] = x[0] + ... + x[i-1].
    at::Tensor zero = at::zeros_like(r.narrow(axis, 0, 1));
    r = at::cat({zero, r.narrow(axis, 0, v.size(axis) - 1)}, axis);
  }
  if (reverse) r = at::flip(r, {axis});
  if (rank == 0) r = r.reshape({});
  c.set_output(0, r.scalar_type() == st ? r : r.to(st));
}

void cum_prod(OpContext& c) {
  const at::Tensor& x = c.input(0);
  const at::Tensor& ax = c.input(1);
  c.check(ax.numel() == 1, "axis must be a scalar");
  c.check(x.dim() >= 1, "input must have rank >= 1");
  int64_t axis = normalize_axis(c, to_int_vector(ax)[0], x.dim());
  bool exclusive = c.attr_int("exclusive", 0) != 0;
  bool reverse = c.attr_int("reverse", 0) != 0;
  at::Tensor v = reverse ? x.flip({axis}) : x;
  int64_t n = v.size(axis);
  if (exclusive && n > 0) {
    at::Tensor ones = at::ones_like(v.narrow(axis, 0, 1));
    v = at::cat({ones, v.narrow(axis, 0, n - 1)}, axis);
  }
  at::Tensor y = at::cumprod(v, axis, x.scalar_type());
  if (reverse) y = y.flip({axis});
  c.set_output(0, y);
}

void top_k(OpContext& c) {
  const at::Tensor& x = c.input(0);
  int64_t k = 0;
  if (c.has_input(1)) {
    auto kv = to_int_vector(c.input(1));
    c.check(kv.size() == 1, "K must hold one value");
    k = kv[0];
  } else {
    k = c.attr_int("k");
  }
  int64_t rank = x.dim();
  c.check(rank >= 1, "input must have rank >= 1");
  int64_t axis = normalize_axis(c, c.attr_int("axis", -1), rank);
  c.check(k >= 0 && k <= x.size(axis), "K = ", k, " is out of range for axis of size ",
          x.size(axis));
  bool largest = c.attr_int("largest", 1) != 0;
  at::ScalarType st = x.scalar_type();
  bool keyed = is_wide_unsigned(st);
  at::Tensor v = keyed ? order_key(x) : x;
  // NOTE: a stable sort keeps equal values in index order: ties go to the lower index,
  // as ONNX asks (at::topk does not promise that).
  auto [sorted, idx] = at::sort(v, /*stable=*/true, axis, /*descending=*/largest);
  idx = idx.narrow(axis, 0, k);
  at::Tensor vals = keyed ? from_key(sorted.narrow(axis, 0, k), st) : at::gather(x, axis, idx);
  c.set_output(0, vals);
  if (c.num_outputs() > 1) c.set_output(1, idx);
}

}  // namespace

void register_reduce(OpTable& t) {
  add_reduce(t, "ReduceSum", Reduce::kSum, 13);
  add_reduce(t, "ReduceMean", Reduce::kMean, 18);
  add_reduce(t, "ReduceMax", Reduce::kMax, 18);
  add_reduce(t, "ReduceMin", Reduce::kMin, 18);
  add_reduce(t, "ReduceProd", Reduce::kProd, 18);
  add_reduce(t, "ReduceL1", Reduce::kL1, 18);
  add_reduce(t, "ReduceL2", Reduce::kL2, 18);
  add_reduce(t, "ReduceLogSum", Reduce::kLogSum, 18);
  add_reduce(t, "ReduceLogSumExp", Reduce::kLogSumExp, 18);
  add_reduce(t, "ReduceSumSquare", Reduce::kSumSquare, 18);
  add_arg(t, "ArgMax", true);
  add_arg(t, "ArgMin", false);
  t.add({"", "CumSum", cum_sum});
  t.add({"", "CumProd", cum_prod});
  t.add({"", "TopK", top_k});
  t.set_channels({"ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceLogSum",
                  "ReduceLogSumExp", "ReduceSumSquare"},
                 reduce_channels);
  t.set_shape_operands(
      {"ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
       "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"},
      {1});
}

}  // namespace lopper::ops
