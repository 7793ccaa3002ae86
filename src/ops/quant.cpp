// Quantization ops: QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear, MatMulInteger,
// ConvInteger, QLinearMatMul, QLinearConv.
#include <ATen/ATen.h>

#include <limits>

#include "ops/conv_geometry.h"
#include "ops/op.h"

namespace lopper::ops {

namespace {

// Integer range of a quantized type; false when `t` is not an integer quantized type.
bool int_range(at::ScalarType t, double& lo, double& hi) {
  struct Range {
    at::ScalarType type;
    double lo, hi;
  };
  static constexpr Range kRanges[] = {
      {at::kByte, 0, 255},
      {at::kChar, -128, 127},
      {at::kUInt16, 0, 65535},
      {at::kShort, -32768, 32767},
      {at::kInt, std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max()},
      {at::kUInt32, 0, std::numeric_limits<uint32_t>::max()},
  };
  for (const Range& r : kRanges)
    if (r.type == t) {
      lo = r.lo;
      hi = r.hi;
      return true;
    }
  return false;
}

bool is_float8(at::ScalarType t) {
  return t == at::kFloat8_e4m3fn || t == at::kFloat8_e4m3fnuz || t == at::kFloat8_e5m2 ||
         t == at::kFloat8_e5m2fnuz;
}

double float8_max(at::ScalarType t) {
  if (t == at::kFloat8_e4m3fn) return 448.0;
  if (t == at::kFloat8_e4m3fnuz) return 240.0;
  return 57344.0;  // e5m2, e5m2fnuz
}

// Scale or zero point made broadcastable to `shape` (per tensor, per axis, or blocked).
at::Tensor qparam(const OpContext& c, const at::Tensor& v, at::IntArrayRef shape, int64_t axis_attr,
                  int64_t block, const char* what) {
  if (v.dim() == 0) return v;
  if (v.numel() == 1 && block == 0) return v.reshape({});
  int64_t rank = static_cast<int64_t>(shape.size());
  c.check(rank > 0, what, " must be a scalar for a 0-d input");
  int64_t axis = normalize_axis(c, axis_attr, rank);
  if (block == 0) {
    c.check(v.dim() == 1 && v.size(0) == shape[axis], what, " must be a scalar or have ",
            shape[axis], " elements along axis ", axis, ", got shape ", v.sizes());
    std::vector<int64_t> dims(static_cast<size_t>(rank), 1);
    dims[axis] = v.size(0);
    return v.reshape(dims);
  }
  c.check(block > 0, "block_size must be positive, got ", block);
  c.check(v.dim() == rank, what, " must have rank ", rank, " for blocked quantization");
  for (int64_t d = 0; d < rank; ++d) {
    if (d == axis)
      c.check(v.size(d) == (shape[d] + block - 1) / block, what, " has ", v.size(d),
              " blocks along axis ", axis, ", expected ", (shape[d] + block - 1) / block);
    else
      c.check(v.size(d) == shape[d], what, " shape ", v.sizes(), " does not match input ", shape);
  }
  return v.repeat_interleave(block, axis).narrow(axis, 0, shape[axis]);
}

void quantize_linear(OpContext& c) {
  const at::Tensor& x = c.input(0);
  const at::Tensor& scale = c.input(1);
  at::Tensor zp = c.has_input(2) ? c.input(2) : at::Tensor();
  int64_t axis = c.attr_int("axis", 1);
  int64_t block = c.attr_int("block_size", 0);
  at::ScalarType out = at::kByte;
  int64_t odt = c.attr_int("output_dtype", 0);
  if (odt != 0) out = scalar_type_of(c, odt);
  if (zp.defined()) {
    c.check(odt == 0 || zp.scalar_type() == out, "output_dtype does not match y_zero_point's type");
    out = zp.scalar_type();
  }
  c.check(scale.is_floating_point() || scale.scalar_type() == at::kInt,
          "y_scale must be a floating-point tensor");
  at::ScalarType ct = at::promote_types(x.scalar_type(), scale.scalar_type());
  if (!at::isFloatingType(ct)) ct = at::kFloat;
  int64_t precision = c.attr_int("precision", 0);
  if (precision != 0) ct = scalar_type_of(c, precision);
  at::Tensor s = qparam(c, scale, x.sizes(), axis, block, "y_scale").to(ct);
  at::Tensor q = x.to(ct) / s;
  double lo = 0, hi = 0;
  if (int_range(out, lo, hi)) {
    at::Tensor r = at::round(q).to(at::kDouble);
    if (zp.defined()) r = r + qparam(c, zp, x.sizes(), axis, block, "y_zero_point").to(at::kDouble);
    c.set_output(0, at::clamp(r, lo, hi).to(out));
  } else if (is_float8(out)) {
    at::Tensor f = q.to(at::kFloat);
    if (c.attr_int("saturate", 1) != 0) f = at::clamp(f, -float8_max(out), float8_max(out));
    c.set_output(0, f.to(out));
  } else {
    c.fail("unsupported output type ", c10::toString(out));
  }
}

void dequantize_linear(OpContext& c) {
  const at::Tensor& x = c.input(0);
  const at::Tensor& scale = c.input(1);
  int64_t axis = c.attr_int("axis", 1);
  int64_t block = c.attr_int("block_size", 0);
  c.check(scale.is_floating_point(), "x_scale must be a floating-point tensor");
  at::ScalarType out = scale.scalar_type();
  int64_t odt = c.attr_int("output_dtype", 0);
  if (odt != 0) out = scalar_type_of(c, odt);
  double lo = 0, hi = 0;
  c.check(int_range(x.scalar_type(), lo, hi) || is_float8(x.scalar_type()),
          "unsupported input type ", c10::toString(x.scalar_type()));
  at::ScalarType ct = at::promote_types(at::kFloat, scale.scalar_type());
  at::Tensor dx = x.to(ct);
  if (c.has_input(2) && !is_float8(x.scalar_type())) {
    const at::Tensor& zp = c.input(2);
    c.check(zp.scalar_type() == x.scalar_type(), "x_zero_point's type differs from x's");
    dx = dx - qparam(c, zp, x.sizes(), axis, block, "x_zero_point").to(ct);
  }
  at::Tensor y = dx * qparam(c, scale, x.sizes(), axis, block, "x_scale").to(ct);
  c.set_output(0, y.to(out));
}

void dynamic_quantize_linear(OpContext& c) {
  const at::Tensor& x = c.input(0);
  c.check(x.is_floating_point(), "x must be a floating-point tensor");
  at::Tensor xf = x.to(at::kFloat);
  at::Tensor zero = at::zeros({}, xf.options());
  at::Tensor mx = x.numel() ? at::maximum(xf.max(), zero) : zero;
  at::Tensor mn = x.numel() ? at::minimum(xf.min(), zero) : zero;
  at::Tensor range = at::where(mx == mn, at::ones({}, xf.options()), mx - mn);
  at::Tensor scale = range / 255.0f;
  at::Tensor zp = at::round(at::clamp(-mn / scale, 0, 255));
  at::Tensor y = at::clamp(at::round(xf / scale) + zp, 0, 255);
  c.set_output(0, y.to(at::kByte));
  if (c.wants_output(1)) c.set_output(1, scale.to(x.scalar_type()));
  if (c.wants_output(2)) c.set_output(2, zp.to(at::kByte));
}

void check_int8(const OpContext& c, const at::Tensor& t, const char* what) {
  c.check(t.scalar_type() == at::kByte || t.scalar_type() == at::kChar, what,
          " must be int8 or uint8, got ", c10::toString(t.scalar_type()));
}

// Zero point / scale of the left matrix operand: a vector of M values is per row.
at::Tensor row_param(const at::Tensor& v, const at::Tensor& a) {
  if (v.dim() == 1 && v.numel() > 1 && a.dim() >= 2 && v.size(0) == a.size(-2))
    return v.unsqueeze(-1);
  return v;
}

// NOTE: integer products are accumulated in float64: exact for 8-bit operands (|sum| < 2^53) and
// available on every device, unlike integer matmul/convolution on CUDA.
// (a - a's zero point) @ (b - b's zero point) in float64, the zero points the op's inputs
// `a_zero` and `b_zero` when present; messages name the operands `a_name` and `b_name`.
at::Tensor int_matmul(const OpContext& c, const at::Tensor& a, const at::Tensor& b,
                      const char* a_name, const char* b_name, size_t a_zero, size_t b_zero) {
  check_int8(c, a, a_name);
  check_int8(c, b, b_name);
  c.check(a.dim() >= 1 && b.dim() >= 1, "inputs must be at least 1-D");
  int64_t ka = a.size(-1), kb = b.dim() == 1 ? b.size(0) : b.size(-2);
  c.check(ka == kb, "inner dimensions differ: ", ka, " vs ", kb);
  at::Tensor ad = a.to(at::kDouble), bd = b.to(at::kDouble);
  if (c.has_input(a_zero)) ad = ad - row_param(c.input(a_zero), a).to(at::kDouble);
  if (c.has_input(b_zero)) bd = bd - c.input(b_zero).to(at::kDouble);
  return at::matmul(ad, bd);
}

void matmul_integer(OpContext& c) {
  const at::Tensor& a = c.input(0);
  const at::Tensor& b = c.input(1);
  c.set_output(0, int_matmul(c, a, b, "A", "B", 2, 3).to(at::kInt));
}

void qlinear_matmul(OpContext& c) {
  const at::Tensor& a = c.input(0);
  at::Tensor acc = int_matmul(c, a, c.input(3), "a", "b", 2, 5);
  at::ScalarType st = c.input(1).scalar_type();
  c.check(at::isFloatingType(st), "a_scale must be a floating-point tensor");
  at::Tensor mult = row_param(c.input(1), a).to(st) * c.input(4).to(st) / c.input(6).to(st);
  at::Tensor r = acc * mult.to(at::kDouble);
  at::ScalarType out = a.scalar_type();
  if (c.has_input(7)) {
    out = c.input(7).scalar_type();
    r = r + c.input(7).to(at::kDouble);
  }
  double lo = 0, hi = 0;
  c.check(int_range(out, lo, hi), "unsupported output type ", c10::toString(out));
  c.set_output(0, at::clamp(at::round(r), lo, hi).to(out));
}

// Convolution of (x - x_zp) and (w - w_zp) in float64; padding holds zeros after the shift.
at::Tensor int_conv(const OpContext& c, const at::Tensor& x, const at::Tensor& w,
                    const at::Tensor& xzp, const at::Tensor& wzp, const at::Tensor& bias) {
  check_int8(c, x, "x");
  check_int8(c, w, "w");
  c.check(x.dim() >= 3 && x.dim() <= 5, "input must be 3-D to 5-D, got ", x.dim(), "-D");
  c.check(w.dim() == x.dim(), "weight rank ", w.dim(), " != input rank ", x.dim());
  ConvGeometry g = read_conv_geometry(c, w, x.sizes().slice(2), false);
  c.check(x.size(1) == w.size(1) * g.group && w.size(0) % g.group == 0,
          "channels do not match: input ", x.size(1), ", weight ", w.sizes(), ", group ", g.group);
  at::Tensor xd = x.to(at::kDouble), wd = w.to(at::kDouble);
  if (xzp.defined()) {
    c.check(xzp.numel() == 1, "x_zero_point must be a scalar");
    xd = xd - xzp.reshape({}).to(at::kDouble);
  }
  if (wzp.defined()) {
    if (wzp.numel() == 1) {
      wd = wd - wzp.reshape({}).to(at::kDouble);
    } else {
      c.check(wzp.dim() == 1 && wzp.size(0) == w.size(0), "w_zero_point must be a scalar or have ",
              w.size(0), " elements");
      std::vector<int64_t> shape(static_cast<size_t>(w.dim()), 1);
      shape[0] = w.size(0);
      wd = wd - wzp.to(at::kDouble).reshape(shape);
    }
  }
  at::Tensor in = pad_spatial(xd, g.pads_begin, g.pads_end);
  at::Tensor b;
  if (bias.defined()) {
    c.check(bias.dim() == 1 && bias.size(0) == w.size(0), "bias must be [", w.size(0), "]");
    b = bias.to(at::kDouble);
  }
  std::vector<int64_t> zeros(g.strides.size(), 0);
  return at::convolution(in, wd, b, g.strides, zeros, g.dilations, false, zeros, g.group);
}

void conv_integer(OpContext& c) {
  at::Tensor xzp = c.has_input(2) ? c.input(2) : at::Tensor();
  at::Tensor wzp = c.has_input(3) ? c.input(3) : at::Tensor();
  c.set_output(0, int_conv(c, c.input(0), c.input(1), xzp, wzp, at::Tensor()).to(at::kInt));
}

void qlinear_conv(OpContext& c) {
  const at::Tensor& x = c.input(0);
  const at::Tensor& w = c.input(3);
  at::Tensor xzp = c.has_input(2) ? c.input(2) : at::Tensor();
  at::Tensor wzp = c.has_input(5) ? c.input(5) : at::Tensor();
  at::Tensor bias = c.has_input(8) ? c.input(8) : at::Tensor();
  at::Tensor acc = int_conv(c, x, w, xzp, wzp, bias);
  at::ScalarType st = c.input(1).scalar_type();
  c.check(at::isFloatingType(st), "x_scale must be a floating-point tensor");
  at::Tensor ws = c.input(4).to(st);
  if (ws.numel() > 1) {
    c.check(ws.dim() == 1 && ws.size(0) == w.size(0), "w_scale must be a scalar or have ",
            w.size(0), " elements");
    std::vector<int64_t> shape(static_cast<size_t>(x.dim()), 1);
    shape[1] = w.size(0);
    ws = ws.reshape(shape);
  } else {
    ws = ws.reshape({});
  }
  at::Tensor mult = c.input(1).to(st).reshape({}) * ws / c.input(6).to(st).reshape({});
  at::Tensor r = acc * mult.to(at::kDouble);
  at::ScalarType out = x.scalar_type();
  if (c.has_input(7)) {
    out = c.input(7).scalar_type();
    r = r + c.input(7).reshape({}).to(at::kDouble);
  }
  double lo = 0, hi = 0;
  c.check(int_range(out, lo, hi), "unsupported output type ", c10::toString(out));
  c.set_output(0, at::clamp(at::round(r), lo, hi).to(out));
}

int64_t matmul_integer_macs(const MacContext& m) {
  if (m.in_shapes.size() < 2 || m.out_shapes.empty() || m.in_shapes[0].empty()) return 0;
  return numel_of(m.out_shapes[0]) * m.in_shapes[0].back();
}

int64_t qlinear_matmul_macs(const MacContext& m) {
  if (m.in_shapes.size() < 4 || m.out_shapes.empty() || m.in_shapes[0].empty()) return 0;
  return numel_of(m.out_shapes[0]) * m.in_shapes[0].back();
}

int64_t conv_macs_at(const MacContext& m, size_t w_index) {
  if (m.in_shapes.size() <= w_index || m.out_shapes.empty() || m.out_shapes[0].size() < 3) return 0;
  const auto& w = m.in_shapes[w_index];
  int64_t per_output = 1;
  for (size_t i = 1; i < w.size(); ++i) per_output *= w[i];
  return numel_of(m.out_shapes[0]) * per_output;
}

int64_t conv_integer_macs(const MacContext& m) { return conv_macs_at(m, 1); }
int64_t qlinear_conv_macs(const MacContext& m) { return conv_macs_at(m, 3); }

}  // namespace

void register_quant(OpTable& t) {
  t.add({"", "QuantizeLinear", quantize_linear});
  t.add({"", "DequantizeLinear", dequantize_linear});
  t.add({"", "DynamicQuantizeLinear", dynamic_quantize_linear});
  t.add({"", "MatMulInteger", matmul_integer, matmul_integer_macs});
  t.add({"", "ConvInteger", conv_integer, conv_integer_macs});
  t.add({"", "QLinearMatMul", qlinear_matmul, qlinear_matmul_macs});
  t.add({"", "QLinearConv", qlinear_conv, qlinear_conv_macs});
}

}  // namespace lopper::ops
