// Tensor-indexing ops: Constant, Gather*, Scatter*, Pad, CenterCropPad, OneHot, NonZero, Compress,
// Unique, ReverseSequence, Dropout.
#include <algorithm>

#include "ops/channels.h"
#include "ops/op.h"

namespace lopper::ops {

namespace {

at::TensorOptions long_on(const at::Tensor& like) {
  return at::TensorOptions().dtype(at::kLong).device(like.device());
}

// Integer indices as int64 with negative entries wrapped by `dim`.
at::Tensor wrap_indices(const at::Tensor& idx, int64_t dim) {
  at::Tensor i = idx.to(at::kLong);
  return at::where(i < 0, i + dim, i);
}

void check_range(const OpContext& c, const at::Tensor& idx, int64_t dim) {
  if (idx.numel() == 0) return;
  bool ok = ((idx >= 0) & (idx < dim)).all().item<bool>();
  c.check(ok, "index out of range for a dim of size ", dim);
}

std::string reduction_of(const OpContext& c) {
  std::string r = c.attr_string("reduction", "none");
  c.check(r == "none" || r == "add" || r == "mul" || r == "max" || r == "min",
          "unknown reduction '", r, "'");
  return r;
}

at::Tensor scatter_elements(const OpContext& c, const at::Tensor& data, const at::Tensor& indices,
                            const at::Tensor& updates, int64_t axis, const std::string& red) {
  c.check(indices.dim() == data.dim() && updates.sizes() == indices.sizes(),
          "indices and updates must have the data's rank and the same shape");
  axis = normalize_axis(c, axis, data.dim());
  at::Tensor idx = wrap_indices(indices, data.size(axis));
  check_range(c, idx, data.size(axis));
  if (red == "none") return at::scatter(data, axis, idx, updates);
  const char* r = red == "add" ? "sum" : red == "mul" ? "prod" : red == "max" ? "amax" : "amin";
  return at::scatter_reduce(data, axis, idx, updates, r, /*include_self=*/true);
}

// Per-axis source index for padding `dim` by (b, e) >= 0 in a non-constant mode.
at::Tensor pad_index(const std::string& mode, int64_t dim, int64_t b, int64_t e,
                     const at::TensorOptions& lopts) {
  at::Tensor j = at::arange(-b, dim + e, lopts);
  if (mode == "edge") return j.clamp(0, dim - 1);
  if (mode == "wrap") return at::remainder(j, dim);
  // reflect
  if (dim == 1) return at::zeros_like(j);
  int64_t period = 2 * (dim - 1);
  at::Tensor m = at::remainder(j, period);
  return at::where(m >= dim, period - m, m);
}

void constant(OpContext& c) {
  at::Tensor v;
  auto dev = c.device();
  if (c.has_attr("value")) {
    v = c.attr_tensor("value");
  } else if (c.has_attr("value_float")) {
    v = at::scalar_tensor(c.attr_float("value_float", 0.f), at::kFloat);
  } else if (c.has_attr("value_floats")) {
    auto f = c.attr_floats("value_floats");
    v = at::tensor(f, at::TensorOptions().dtype(at::kFloat));
  } else if (c.has_attr("value_int")) {
    v = at::scalar_tensor(c.attr_int("value_int", 0), at::kLong);
  } else if (c.has_attr("value_ints")) {
    auto i = c.attr_ints("value_ints");
    v = at::tensor(i, at::TensorOptions().dtype(at::kLong));
  } else if (c.has_attr("sparse_value")) {
    c.fail("sparse_value is not supported");
  } else {
    c.fail("string constants are not supported (lopper holds numeric tensors only)");
  }
  c.set_output(0, v.to(dev));
}

void gather(OpContext& c) {
  const at::Tensor& x = c.input(0);
  const at::Tensor& ind = c.input(1);
  c.check(x.dim() >= 1, "data must be at least 1-D");
  int64_t axis = normalize_axis(c, c.attr_int("axis", 0), x.dim());
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().begin() + axis);
  for (int64_t d : ind.sizes()) shape.push_back(d);
  for (int64_t i = axis + 1; i < x.dim(); ++i) shape.push_back(x.size(i));
  at::Tensor idx;
  if (ind.device().is_cpu() && ind.numel() <= 64 && !at::isFloatingType(ind.scalar_type())) {
    // NOTE: the shape arithmetic exporters emit (Shape -> Gather of one dim) runs every
    // inference; checking a few indices here takes one ATen call instead of ten.
    std::vector<int64_t> v = to_int_vector(ind);
    for (int64_t& i : v) {
      if (i < 0) i += x.size(axis);
      c.check(i >= 0 && i < x.size(axis), "index out of range for a dim of size ", x.size(axis));
    }
    // One index, a 0-d tensor: the slice itself, a view (no copy; Swin's and ViT's q, k, v out
    // of one projection, read once each by the MatMul that follows).
    if (ind.dim() == 0) return c.set_output(0, x.select(axis, v[0]));
    idx = at::tensor(v, at::TensorOptions().dtype(at::kLong)).to(x.device());
  } else {
    idx = wrap_indices(ind, x.size(axis));
    check_range(c, idx, x.size(axis));
  }
  c.set_output(0, at::index_select(x, axis, idx.reshape({-1})).reshape(shape));
}

void gather_elements(OpContext& c) {
  const at::Tensor& x = c.input(0);
  const at::Tensor& ind = c.input(1);
  c.check(ind.dim() == x.dim(), "indices must have the data's rank");
  int64_t axis = normalize_axis(c, c.attr_int("axis", 0), x.dim());
  at::Tensor idx = wrap_indices(ind, x.size(axis));
  check_range(c, idx, x.size(axis));
  c.set_output(0, at::gather(x, axis, idx));
}

void gather_nd(OpContext& c) {
  const at::Tensor& x = c.input(0);
  const at::Tensor& ind = c.input(1);
  int64_t b = c.attr_int("batch_dims", 0);
  c.check(ind.dim() >= 1 && b >= 0 && b < std::min(x.dim(), ind.dim()), "bad batch_dims ", b,
          " for ranks ", x.dim(), " and ", ind.dim());
  int64_t k = ind.size(-1);
  c.check(b + k <= x.dim(), "index depth ", k, " too large for data rank ", x.dim());
  for (int64_t i = 0; i < b; ++i)
    c.check(x.size(i) == ind.size(i), "batch dims of data and indices differ");
  int64_t B = 1, P = 1, M = 1;
  for (int64_t i = 0; i < b; ++i) B *= x.size(i);
  for (int64_t i = b; i < ind.dim() - 1; ++i) M *= ind.size(i);
  std::vector<int64_t> rest, out_shape(ind.sizes().begin(), ind.sizes().end() - 1);
  for (int64_t i = b + k; i < x.dim(); ++i) rest.push_back(x.size(i));
  out_shape.insert(out_shape.end(), rest.begin(), rest.end());
  at::Tensor idx = ind.to(at::kLong).reshape({B, M, k});
  at::Tensor lin = at::zeros({B, M}, long_on(x));
  for (int64_t j = 0; j < k; ++j) {
    int64_t d = x.size(b + j);
    at::Tensor ij = wrap_indices(idx.select(2, j), d);
    check_range(c, ij, d);
    lin = lin * d + ij;
    P *= d;
  }
  std::vector<int64_t> flat = {B * P};
  flat.insert(flat.end(), rest.begin(), rest.end());
  at::Tensor base = at::arange(B, long_on(x)).unsqueeze(1) * P;
  at::Tensor sel = at::index_select(x.reshape(flat), 0, (base + lin).reshape({-1}));
  c.set_output(0, sel.reshape(out_shape));
}

void scatter_elements_op(OpContext& c) {
  c.set_output(0, scatter_elements(c, c.input(0), c.input(1), c.input(2), c.attr_int("axis", 0),
                                   reduction_of(c)));
}

void scatter(OpContext& c) {
  c.set_output(
      0, scatter_elements(c, c.input(0), c.input(1), c.input(2), c.attr_int("axis", 0), "none"));
}

void scatter_nd(OpContext& c) {
  const at::Tensor& x = c.input(0);
  const at::Tensor& ind = c.input(1);
  const at::Tensor& upd = c.input(2);
  std::string red = reduction_of(c);
  c.check(ind.dim() >= 1, "indices must be at least 1-D");
  int64_t k = ind.size(-1);
  c.check(k <= x.dim(), "index depth ", k, " too large for data rank ", x.dim());
  int64_t P = 1, M = 1;
  for (int64_t i = 0; i < ind.dim() - 1; ++i) M *= ind.size(i);
  std::vector<int64_t> flat = {0};
  std::vector<int64_t> uflat = {M};
  for (int64_t i = k; i < x.dim(); ++i) {
    flat.push_back(x.size(i));
    uflat.push_back(x.size(i));
  }
  at::Tensor idx = ind.to(at::kLong).reshape({M, k});
  at::Tensor lin = at::zeros({M}, long_on(x));
  for (int64_t j = 0; j < k; ++j) {
    int64_t d = x.size(j);
    at::Tensor ij = wrap_indices(idx.select(1, j), d);
    check_range(c, ij, d);
    lin = lin * d + ij;
    P *= d;
  }
  flat[0] = P;
  c.check(upd.numel() == numel_of(uflat), "updates have the wrong shape");
  at::Tensor xr = x.reshape(flat), ur = upd.reshape(uflat);
  at::Tensor y;
  if (red == "none") {
    y = at::index_copy(xr, 0, lin, ur);
  } else if (red == "add") {
    y = at::index_add(xr, 0, lin, ur);
  } else {
    y = at::index_reduce(xr, 0, lin, ur,
                         red == "mul"   ? "prod"
                         : red == "max" ? "amax"
                                        : "amin",
                         /*include_self=*/true);
  }
  c.set_output(0, y.reshape(x.sizes()));
}

void pad(OpContext& c) {
  const at::Tensor& x = c.input(0);
  int64_t r = x.dim();
  std::vector<int64_t> pads;
  std::string mode = c.attr_string("mode", "constant");
  double value = 0;
  std::vector<int64_t> axes;
  if (c.opset() >= 11) {
    pads = to_int_vector(c.input(1));
    if (c.has_input(2) && c.input(2).numel() > 0) value = to_double(c.input(2));
    if (c.has_input(3)) axes = to_int_vector(c.input(3));
  } else {
    pads = c.attr_ints(c.opset() >= 2 ? "pads" : "paddings");
    value = c.attr_float("value", 0.f);
  }
  if (axes.empty())
    for (int64_t i = 0; i < r; ++i) axes.push_back(i);
  c.check(pads.size() == 2 * axes.size(), "pads has ", pads.size(), " entries for ", axes.size(),
          " axes");
  std::vector<int64_t> begin(r, 0), end(r, 0);
  int64_t n = static_cast<int64_t>(axes.size());
  for (int64_t i = 0; i < n; ++i) {
    int64_t a = normalize_axis(c, axes[i], r);
    begin[a] = pads[i];
    end[a] = pads[i + n];
  }
  std::vector<int64_t> shape(r);
  for (int64_t a = 0; a < r; ++a)
    if (__builtin_add_overflow(x.size(a), begin[a], &shape[a]) ||
        __builtin_add_overflow(shape[a], end[a], &shape[a]))
      shape[a] = INT64_MAX;
  check_output_fits(c, shape, x.scalar_type());
  at::Tensor y = x;
  if (mode == "constant") {
    std::vector<int64_t> tp;
    for (int64_t a = r - 1; a >= 0; --a) {
      c.check(x.size(a) + begin[a] + end[a] >= 0, "pads crop more than axis ", a, " holds");
      tp.push_back(begin[a]);
      tp.push_back(end[a]);
    }
    c.set_output(0, at::constant_pad_nd(x, tp, value));
    return;
  }
  c.check(mode == "reflect" || mode == "edge" || mode == "wrap", "unknown mode '", mode, "'");
  // Crop negative pads first, then pad with an index per axis (differentiable; any rank).
  for (int64_t a = 0; a < r; ++a) {
    int64_t cb = std::max<int64_t>(0, -begin[a]), ce = std::max<int64_t>(0, -end[a]);
    if (cb || ce) {
      c.check(y.size(a) - cb - ce >= 0, "pads crop more than axis ", a, " holds");
      y = y.narrow(a, cb, y.size(a) - cb - ce);
    }
  }
  for (int64_t a = 0; a < r; ++a) {
    int64_t b = std::max<int64_t>(0, begin[a]), e = std::max<int64_t>(0, end[a]);
    if (!b && !e) continue;
    int64_t dim = y.size(a);
    c.check(dim > 0, "cannot pad an empty axis in ", mode, " mode");
    y = at::index_select(y, a, pad_index(mode, dim, b, e, long_on(y)));
  }
  c.set_output(0, y);
}

void center_crop_pad(OpContext& c) {
  const at::Tensor& x = c.input(0);
  auto shape = to_int_vector(c.input(1));
  int64_t rank = x.dim();
  std::vector<int64_t> axes;
  if (c.has_attr("axes")) {
    for (int64_t a : c.attr_ints("axes")) axes.push_back(normalize_axis(c, a, rank));
  } else {
    for (int64_t a = 0; a < rank; ++a) axes.push_back(a);
  }
  c.check(shape.size() == axes.size(), "shape has ", shape.size(), " values for ", axes.size(),
          " axes");
  std::vector<int64_t> begin(static_cast<size_t>(rank), 0), end(static_cast<size_t>(rank), 0);
  for (size_t i = 0; i < axes.size(); ++i) {
    c.check(shape[i] >= 0, "shape values must be non-negative");
    int64_t dim = x.size(axes[i]);
    int64_t d = shape[i] - dim;  // > 0: pad, < 0: crop
    int64_t mag = std::abs(d);
    int64_t half = mag / 2, rest = mag - half;
    begin[axes[i]] = d >= 0 ? half : -half;
    end[axes[i]] = d >= 0 ? rest : -rest;
  }
  std::vector<int64_t> out_shape = x.sizes().vec();
  for (size_t i = 0; i < axes.size(); ++i) out_shape[axes[i]] = shape[i];
  check_output_fits(c, out_shape, x.scalar_type());
  std::vector<int64_t> p;
  for (int64_t d = rank; d-- > 0;) {
    p.push_back(begin[d]);
    p.push_back(end[d]);
  }
  c.set_output(0, rank == 0 ? x : at::constant_pad_nd(x, p, 0));
}

void one_hot(OpContext& c) {
  const at::Tensor& ind = c.input(0);
  int64_t depth = static_cast<int64_t>(to_double(c.input(1)));
  const at::Tensor& values = c.input(2);
  c.check(depth > 0, "depth must be positive, got ", depth);
  c.check(values.numel() == 2, "values must hold [off, on]");
  int64_t r = ind.dim() + 1;
  int64_t axis = c.attr_int("axis", -1);
  c.check(axis >= -r && axis < r, "axis ", axis, " out of range for output rank ", r);
  if (axis < 0) axis += r;
  at::Tensor idx = ind.is_floating_point() ? ind.trunc().to(at::kLong) : ind.to(at::kLong);
  idx = wrap_indices(idx, depth).unsqueeze(axis);
  std::vector<int64_t> out = ind.sizes().vec();
  out.insert(out.begin() + axis, depth);
  check_output_fits(c, out, values.scalar_type());
  std::vector<int64_t> shape(r, 1);
  shape[axis] = depth;
  at::Tensor cls = at::arange(depth, long_on(ind)).reshape(shape);
  at::Tensor v = values.reshape({2});
  c.set_output(0, at::where(idx == cls, v[1], v[0]));
}

void non_zero(OpContext& c) {
  const at::Tensor& x = c.input(0);
  at::Tensor v = x.dim() == 0 ? x.reshape({1}) : x;
  at::Tensor nz = at::nonzero(v).t().contiguous();
  if (x.dim() == 0) nz = nz.narrow(0, 0, 0).reshape({0, nz.size(1)});
  c.set_output(0, nz);
}

void compress(OpContext& c) {
  at::Tensor x = c.input(0);
  at::Tensor cond = c.input(1).to(at::kBool).reshape({-1});
  int64_t axis = 0;
  if (c.has_attr("axis")) {
    axis = normalize_axis(c, c.attr_int("axis"), x.dim());
  } else {
    x = x.reshape({-1});
  }
  int64_t dim = x.size(axis);
  if (cond.size(0) > dim) cond = cond.narrow(0, 0, dim);
  at::Tensor idx = at::nonzero(cond).reshape({-1});
  c.set_output(0, at::index_select(x, axis, idx));
}

void unique(OpContext& c) {
  const at::Tensor& x = c.input(0);
  bool sorted = c.attr_int("sorted", 1) != 0;
  at::Tensor y, inv, counts;
  int64_t axis = -1;
  if (c.has_attr("axis")) {
    axis = normalize_axis(c, c.attr_int("axis"), x.dim());
    std::tie(y, inv, counts) = at::unique_dim(x.detach(), axis, true, true, true);
  } else {
    std::tie(y, inv, counts) = at::_unique2(x.detach().reshape({-1}), true, true, true);
  }
  inv = inv.reshape({-1});
  int64_t n = counts.size(0), m = inv.size(0);
  // First occurrence of each unique value: the smallest position that maps to it.
  at::Tensor first =
      at::full({n}, m, long_on(x)).scatter_reduce(0, inv, at::arange(m, long_on(x)), "amin", true);
  if (!sorted) {
    at::Tensor order = std::get<1>(at::sort(first));  // unique values by first occurrence
    at::Tensor rank = at::empty_like(order).scatter(0, order, at::arange(n, long_on(x)));
    y = at::index_select(y, axis < 0 ? 0 : axis, order);
    counts = counts.index_select(0, order);
    first = first.index_select(0, order);
    inv = rank.index_select(0, inv);
  }
  // ATen's unique has no derivative; under autograd the values are taken from x at their first
  // occurrence (the same values), so the gradient reaches x through the selection.
  if (x.requires_grad())
    y = at::index_select(axis < 0 ? x.reshape({-1}) : x, std::max<int64_t>(axis, 0), first);
  c.set_output(0, y);
  if (c.wants_output(1)) c.set_output(1, first);
  if (c.wants_output(2)) c.set_output(2, inv);
  if (c.wants_output(3)) c.set_output(3, counts.to(at::kLong));
}

void reverse_sequence(OpContext& c) {
  const at::Tensor& x = c.input(0);
  auto lens = to_int_vector(c.input(1));
  int64_t ta = normalize_axis(c, c.attr_int("time_axis", 0), x.dim());
  int64_t ba = normalize_axis(c, c.attr_int("batch_axis", 1), x.dim());
  c.check(ta != ba, "time_axis and batch_axis must differ");
  int64_t T = x.size(ta), B = x.size(ba);
  c.check(static_cast<int64_t>(lens.size()) == B, "sequence_lens has ", lens.size(),
          " entries for a batch of ", B);
  for (int64_t l : lens) c.check(l >= 0 && l <= T, "sequence length ", l, " out of range");
  at::Tensor tt = at::arange(T, long_on(x)).unsqueeze(1);                    // [T,1]
  at::Tensor len = at::tensor(lens, at::kLong).to(x.device()).unsqueeze(0);  // [1,B]
  at::Tensor src = at::where(tt < len, len - 1 - tt, tt);                    // [T,B]
  std::vector<int64_t> shape(x.dim(), 1);
  shape[ta] = T;
  shape[ba] = B;
  if (ta > ba) src = src.t();
  src = src.reshape(shape).expand(x.sizes());
  c.set_output(0, at::gather(x, ta, src));
}

void dropout(OpContext& c) {
  const at::Tensor& x = c.input(0);
  double ratio = 0.5;
  bool train = c.training();
  if (c.opset() >= 12) {
    if (c.has_input(1)) ratio = to_double(c.input(1));
    if (c.has_input(2)) train = to_int_vector(c.input(2).to(at::kLong))[0] != 0;
  } else {
    ratio = c.attr_float("ratio", 0.5f);
  }
  c.check(ratio >= 0 && ratio <= 1, "ratio must be in [0, 1], got ", ratio);
  // NOTE: the mask is bool from opset 10; before, it has the input's type.
  auto mask_type = c.opset() >= 10 ? at::kBool : x.scalar_type();
  if (!train || ratio == 0) {
    c.set_output(0, x);
    if (c.wants_output(1)) c.set_output(1, at::ones(x.sizes(), x.options().dtype(mask_type)));
    return;
  }
  c.check(x.is_floating_point(), "training dropout needs floating-point input");
  auto [y, mask] = at::native_dropout(x, ratio, true);
  c.set_output(0, y);
  if (c.wants_output(1)) c.set_output(1, mask.to(mask_type));
}

// Channel rules: Pad keeps the channels when it pads none; Gather along another axis carries them,
// and a Gather from a constant table (an embedding) makes the table's columns new atoms.
void pad_channels(ChannelContext& c) {
  const Tracked* x = c.in(0);
  if (!x) return;
  const int64_t rank = int64_t(c.in_shape(0).size());
  std::vector<int64_t> pads = c.attr_ints("pads"), axes;
  if (c.opset() >= 11) {
    at::Tensor p = c.constant(1);
    if (!p.defined()) return c.barrier("Pad amounts computed at run time");
    pads = to_int_vector(p);
    if (c.num_inputs() > 3 && c.has_input(3)) {
      at::Tensor a = c.constant(3);
      if (!a.defined()) return c.barrier("Pad axes computed at run time");
      axes = to_int_vector(a);
    }
  }
  if (axes.empty())
    for (int64_t i = 0; i < rank; ++i) axes.push_back(i);
  const int64_t k = int64_t(axes.size());
  for (int64_t i = 0; i < k && 2 * k <= int64_t(pads.size()); ++i)
    if ((axes[i] < 0 ? axes[i] + rank : axes[i]) == x->axis && (pads[i] != 0 || pads[i + k] != 0))
      return c.barrier("Pad pads the channels");
  c.set_out(0, *x);
}

void gather_channels(ChannelContext& c) {
  if (const Tracked* sh = c.shape_in(0)) {  // dims picked out of a shape vector
    at::Tensor idx = c.constant(1);
    if (!idx.defined()) return;
    const int64_t n = c.in_shape(0).empty() ? 0 : c.in_shape(0)[0];
    bool picks = false;
    for (int64_t i : to_int_vector(idx.reshape({-1}))) picks |= (i < 0 ? i + n : i) == sh->axis;
    if (!picks) c.independent_of(0);
    return;
  }
  const Tracked* x = c.in(0);
  const int64_t rank = int64_t(c.in_shape(0).size());
  int64_t axis = c.attr_int("axis", 0);
  if (axis < 0) axis += rank;
  const int64_t irank = int64_t(c.in_shape(1).size());
  if (c.in(1)) return c.barrier("Gather indices carry channels");
  if (!x) {
    at::Tensor table = c.constant(0);
    if (!table.defined() || table.dim() != 2 || axis != 0 || c.constant(1).defined()) return;
    auto out = c.fresh(table.size(1));  // an embedding's features
    c.slice(0, 1, out, ParamRole::kWeightOut);
    return c.set_out(0, Tracked{irank, out});
  }
  if (axis == x->axis) return c.barrier("Gather picks channels");
  c.set_out(0, Tracked{x->axis < axis ? x->axis : x->axis - 1 + irank, x->atoms});
}

}  // namespace

namespace {

// Gather of a vector's entries by constant indices (axis 0).
std::optional<std::vector<ShapeEntry>> gather_arith(const ShapeArithContext& c) {
  auto e = c.entries(0);
  auto idx = c.constant_values(1);
  if (!e || !idx || c.attr_int("axis", 0) != 0 || c.num_inputs() < 2) return std::nullopt;
  std::vector<ShapeEntry> out;
  const int64_t len = int64_t(e->size());
  for (int64_t i : *idx) {
    if (i < 0) i += len;
    if (i < 0 || i >= len) return std::nullopt;
    out.push_back((*e)[i]);
  }
  if (int64_t(out.size()) != c.out_numel(0)) return std::nullopt;
  return shape_rules::via(std::move(out), 0);
}

}  // namespace

void register_tensor(OpTable& t) {
  t.add_onnx({
      {"Constant", constant},
      {"Gather", gather, gather_channels, gather_arith},
      {"GatherElements", gather_elements},
      {"GatherND", gather_nd},
      {"ScatterElements", scatter_elements_op},
      {"Scatter", scatter},
      {"ScatterND", scatter_nd},
      {"Pad", pad, pad_channels, {}, {1, 3}},
      {"CenterCropPad", center_crop_pad, {}, {}, {1}},
      {"OneHot", one_hot},
      {"NonZero", non_zero},
      {"Compress", compress},
      {"Unique", unique},
      {"ReverseSequence", reverse_sequence},
      {"Dropout", dropout, channel_rules::same},
  });
}

}  // namespace lopper::ops
