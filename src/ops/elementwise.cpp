// Elementwise ops: arithmetic, math, comparison, logic, bitwise, Where, variadic Max/Min/Sum/Mean,
// Clip, Cast/CastLike/BitCast, Identity. ONNX semantics (output dtypes, numpy broadcasting), not
// ATen's.
#include <ATen/ATen.h>

#include <cstdint>
#include <limits>

#include "ops/channels.h"
#include "ops/op.h"

namespace lopper::ops {

namespace {

bool is_wide_unsigned(at::ScalarType t) {
  return t == at::kUInt16 || t == at::kUInt32 || t == at::kUInt64;
}

// NOTE: ATen implements few kernels for uint16/32/64. Add, Sub, Mul, bitwise ops and shifts give
// the same low bits when done in int64, so those run there and convert back (which wraps).
at::Tensor widen(const at::Tensor& t) {
  return is_wide_unsigned(t.scalar_type()) ? t.to(at::kLong) : t;
}

// An int64 key with the same order as the values (uint64: flip the sign bit).
at::Tensor order_key(const at::Tensor& t) {
  if (t.scalar_type() == at::kUInt64)
    return at::bitwise_xor(t.to(at::kLong), std::numeric_limits<int64_t>::min());
  return widen(t);
}
at::Tensor from_key(const at::Tensor& k, at::ScalarType st) {
  if (st == at::kUInt64) return at::bitwise_xor(k, std::numeric_limits<int64_t>::min()).to(st);
  return k.scalar_type() == st ? k : k.to(st);
}

// Unsigned 64-bit division / remainder, done on the CPU (ATen has no uint64 kernels for them).
at::Tensor u64_divmod(const at::Tensor& a, const at::Tensor& b, bool div, const OpContext& c) {
  auto bt = at::broadcast_tensors({a, b});
  at::Tensor x = bt[0].detach().cpu().contiguous(), y = bt[1].detach().cpu().contiguous();
  at::Tensor out = at::empty(x.sizes(), x.options());
  const uint64_t* px = x.data_ptr<uint64_t>();
  const uint64_t* py = y.data_ptr<uint64_t>();
  uint64_t* po = out.data_ptr<uint64_t>();
  for (int64_t i = 0; i < x.numel(); ++i) {
    c.check(py[i] != 0, "integer division by zero");
    po[i] = div ? px[i] / py[i] : px[i] % py[i];
  }
  return out.to(a.device());
}

bool any_high_bit(const at::Tensor& t) {
  return t.numel() > 0 && (t.to(at::kLong) < 0).any().item<bool>();
}

at::Tensor int_div(const OpContext& c, const at::Tensor& a, const at::Tensor& b) {
  at::ScalarType st = a.scalar_type();
  if (st == at::kUInt64 && (any_high_bit(a) || any_high_bit(b))) return u64_divmod(a, b, true, c);
  if (at::isIntegralType(st, true) && widen(b).eq(0).any().item<bool>())
    c.fail("integer division by zero");
  return at::div(widen(a), widen(b), "trunc").to(st);
}

void binary(OpTable& t, const char* name, at::Tensor (*fn)(const at::Tensor&, const at::Tensor&)) {
  t.add({"", name, [fn](OpContext& c) {
           const at::Tensor& a = c.input(0);
           const at::Tensor& b = c.input(1);
           at::ScalarType st = a.scalar_type();
           at::Tensor r = fn(widen(a), widen(b));
           c.set_output(0, r.scalar_type() == st ? r : r.to(st));
         }});
}

void unary(OpTable& t, const char* name, at::Tensor (*fn)(const at::Tensor&)) {
  t.add({"", name, [fn](OpContext& c) {
           const at::Tensor& x = c.input(0);
           at::Tensor r = fn(x);
           c.set_output(0, r.scalar_type() == x.scalar_type() ? r : r.to(x.scalar_type()));
         }});
}

void compare(OpTable& t, const char* name, at::Tensor (*fn)(const at::Tensor&, const at::Tensor&)) {
  t.add({"", name, [fn](OpContext& c) {
           c.set_output(0, fn(order_key(c.input(0)), order_key(c.input(1))));
         }});
}

// Float -> float8 with ONNX's saturate rule (saturate: out-of-range values and infinities go to
// +-max; otherwise they give NaN, or Inf for E5M2).
at::Tensor cast_to(const at::Tensor& x, at::ScalarType to, bool saturate) {
  bool f8 = to == at::kFloat8_e4m3fn || to == at::kFloat8_e4m3fnuz || to == at::kFloat8_e5m2 ||
            to == at::kFloat8_e5m2fnuz;
  if (!f8 || x.scalar_type() == at::kBool || at::isComplexType(x.scalar_type())) return x.to(to);
  at::Tensor xf = x.scalar_type() == at::kDouble ? x : x.to(at::kFloat);
  double maxv = 0;
  switch (to) {
    case at::kFloat8_e4m3fn:
      maxv = 448.0;
      break;
    case at::kFloat8_e4m3fnuz:
      maxv = 240.0;
      break;
    default:
      maxv = 57344.0;
      break;
  }
  if (saturate) {
    return at::clamp(xf, -maxv, maxv).to(to);
  }
  if (to == at::kFloat8_e4m3fn) {
    // NOTE: ATen's e4m3fn conversion saturates; ONNX wants NaN past the rounding limit (464).
    at::Tensor over = at::isinf(xf) | (at::abs(xf) > 464.0);
    return at::where(over, at::full({}, std::numeric_limits<float>::quiet_NaN(), xf.options()), xf)
        .to(to);
  }
  return xf.to(to);
}

at::Tensor bitshift(const OpContext& c, const at::Tensor& a, const at::Tensor& b, bool left) {
  at::ScalarType st = a.scalar_type();
  c.check(at::isIntegralType(st, false), "BitShift needs integer inputs");
  int64_t bits = static_cast<int64_t>(c10::elementSize(st)) * 8;
  bool is_signed = st != at::kByte && st != at::kUInt16 && st != at::kUInt32 && st != at::kUInt64;
  at::Tensor x = a.to(at::kLong);
  at::Tensor s = b.to(at::kLong);  // uint64 counts past 2^63 turn negative: out of range too
  at::Tensor oor = (s < 0) | (s >= bits);
  at::Tensor sc = at::clamp(s, 0, bits - 1);
  at::Tensor zero = at::zeros({}, x.options());
  at::Tensor r;
  if (left) {
    r = at::where(oor, zero, at::bitwise_left_shift(x, sc));
  } else if (is_signed) {
    r = at::where(oor, at::where(x < 0, at::full({}, -1, x.options()), zero),
                  at::bitwise_right_shift(x, sc));
  } else {
    at::Tensor shifted = at::bitwise_right_shift(x, sc);
    if (st == at::kUInt64) {
      // Logical shift: clear the bits the arithmetic shift filled in.
      at::Tensor ones = at::full({}, -1, x.options());
      at::Tensor mask =
          at::bitwise_not(at::bitwise_left_shift(at::bitwise_left_shift(ones, 63 - sc), 1));
      shifted = at::bitwise_and(shifted, mask);
    }
    r = at::where(oor, zero, shifted);
  }
  return r.to(st);
}

at::Tensor variadic(const OpContext& c, at::Tensor (*fn)(const at::Tensor&, const at::Tensor&),
                    bool keyed) {
  c.check(c.num_inputs() >= 1, "needs at least one input");
  at::ScalarType st = c.input(0).scalar_type();
  at::Tensor acc = keyed ? order_key(c.input(0)) : widen(c.input(0));
  for (size_t i = 1; i < c.num_inputs(); ++i)
    acc = fn(acc, keyed ? order_key(c.input(i)) : widen(c.input(i)));
  if (c.num_inputs() == 1) acc = acc.expand(acc.sizes());  // a view, not the input itself
  return keyed ? from_key(acc, st) : (acc.scalar_type() == st ? acc : acc.to(st));
}

void divide(OpContext& c) {
  const at::Tensor& a = c.input(0);
  const at::Tensor& b = c.input(1);
  if (at::isFloatingType(a.scalar_type()) || at::isComplexType(a.scalar_type())) {
    at::Tensor r = at::div(a, b);
    c.set_output(0, r.scalar_type() == a.scalar_type() ? r : r.to(a.scalar_type()));
  } else {
    // ONNX (C semantics): integer division truncates toward zero.
    c.set_output(0, int_div(c, a, b));
  }
}

void modulo(OpContext& c) {
  const at::Tensor& a = c.input(0);
  const at::Tensor& b = c.input(1);
  at::ScalarType st = a.scalar_type();
  bool fmod = c.attr_int("fmod", 0) != 0;
  if (st == at::kUInt64 && (any_high_bit(a) || any_high_bit(b))) {
    c.set_output(0, u64_divmod(a, b, false, c));
    return;
  }
  if (at::isIntegralType(st, true) && widen(b).eq(0).any().item<bool>())
    c.fail("integer modulo by zero");
  // fmod=0: sign of the divisor (numpy mod); fmod=1: sign of the dividend (C fmod).
  at::Tensor r = fmod ? at::fmod(widen(a), widen(b)) : at::remainder(widen(a), widen(b));
  c.set_output(0, r.scalar_type() == st ? r : r.to(st));
}

void power(OpContext& c) {
  const at::Tensor& a = c.input(0);
  const at::Tensor& b = c.input(1);
  at::ScalarType st = a.scalar_type();
  at::Tensor r;
  if (at::isFloatingType(st) && b.numel() == 1 && b.device().is_cpu() && b.dim() <= a.dim() &&
      b.item<double>() == 2.0) {
    // NOTE: exporters write x^2 (RMSNorm, LayerNorm's variance) as Pow(x, 2.0): squared directly it
    // is one multiply, forward and backward, where pow's general kernel calls powf per element.
    // Exact either way. (A broadcast that would add dimensions takes the general path.)
    r = at::square(a);
  } else if (at::isFloatingType(st)) {
    r = at::pow(a, at::isFloatingType(b.scalar_type()) ? b : b.to(st));
  } else if (at::isFloatingType(b.scalar_type())) {
    r = at::pow(a.to(at::kDouble), b.to(at::kDouble));
  } else {
    r = at::pow(a.to(at::kLong), b.to(at::kLong));
  }
  // ONNX: the output has the base's type.
  c.set_output(0, r.scalar_type() == st ? r : r.to(st));
}

void negate(OpContext& c) {
  const at::Tensor& x = c.input(0);
  c.set_output(0, at::neg(widen(x)).to(x.scalar_type()));
}

void absolute(OpContext& c) {
  const at::Tensor& x = c.input(0);
  if (at::isIntegralType(x.scalar_type(), true) && x.scalar_type() != at::kChar &&
      x.scalar_type() != at::kShort && x.scalar_type() != at::kInt &&
      x.scalar_type() != at::kLong) {
    c.set_output(0, x.expand(x.sizes()));  // unsigned: |x| == x
    return;
  }
  c.set_output(0, at::abs(x));
}

void sign(OpContext& c) {
  const at::Tensor& x = c.input(0);
  c.set_output(0, at::sign(widen(x)).to(x.scalar_type()));
}

void is_nan(OpContext& c) { c.set_output(0, at::isnan(c.input(0))); }

void is_inf(OpContext& c) {
  const at::Tensor& x = c.input(0);
  bool neg = c.attr_int("detect_negative", 1) != 0;
  bool pos = c.attr_int("detect_positive", 1) != 0;
  if (neg && pos)
    c.set_output(0, at::isinf(x));
  else if (neg)
    c.set_output(0, at::isneginf(x));
  else if (pos)
    c.set_output(0, at::isposinf(x));
  else
    c.set_output(0, at::zeros(x.sizes(), x.options().dtype(at::kBool)));
}

void logical_and(OpContext& c) { c.set_output(0, at::logical_and(c.input(0), c.input(1))); }

void logical_or(OpContext& c) { c.set_output(0, at::logical_or(c.input(0), c.input(1))); }

void logical_xor(OpContext& c) { c.set_output(0, at::logical_xor(c.input(0), c.input(1))); }

void logical_not(OpContext& c) { c.set_output(0, at::logical_not(c.input(0))); }

void bit_shift(OpContext& c) {
  std::string dir = c.attr_string("direction", "");
  c.check(dir == "LEFT" || dir == "RIGHT", "direction must be LEFT or RIGHT, got '", dir, "'");
  c.set_output(0, bitshift(c, c.input(0), c.input(1), dir == "LEFT"));
}

void bitwise_not(OpContext& c) {
  const at::Tensor& x = c.input(0);
  c.set_output(0, at::bitwise_not(widen(x)).to(x.scalar_type()));
}

void where_op(OpContext& c) {
  const at::Tensor& x = c.input(1);
  at::Tensor r = at::where(c.input(0).to(at::kBool), x, c.input(2));
  c.set_output(0, r.scalar_type() == x.scalar_type() ? r : r.to(x.scalar_type()));
}

void elementwise_max(OpContext& c) {
  c.set_output(
      0, variadic(
             c, [](const at::Tensor& a, const at::Tensor& b) { return at::maximum(a, b); }, true));
}

void elementwise_min(OpContext& c) {
  c.set_output(
      0, variadic(
             c, [](const at::Tensor& a, const at::Tensor& b) { return at::minimum(a, b); }, true));
}

void variadic_sum(OpContext& c) {
  c.set_output(
      0, variadic(
             c, [](const at::Tensor& a, const at::Tensor& b) { return at::add(a, b); }, false));
}

void variadic_mean(OpContext& c) {
  at::Tensor s = variadic(
      c, [](const at::Tensor& a, const at::Tensor& b) { return at::add(a, b); }, false);
  at::ScalarType st = s.scalar_type();
  at::Tensor r = at::isFloatingType(st)
                     ? at::div(s, static_cast<double>(c.num_inputs()))
                     : at::div(widen(s), static_cast<int64_t>(c.num_inputs()), "trunc");
  c.set_output(0, r.scalar_type() == st ? r : r.to(st));
}

void clip(OpContext& c) {
  const at::Tensor& x = c.input(0);
  at::ScalarType st = x.scalar_type();
  if (c.opset() < 11) {
    float lo = c.attr_float("min", -std::numeric_limits<float>::infinity());
    float hi = c.attr_float("max", std::numeric_limits<float>::infinity());
    c.set_output(0, at::clamp(x, lo, hi));
    return;
  }
  std::optional<at::Tensor> lo, hi;
  if (c.has_input(1)) lo = order_key(c.input(1).to(st));
  if (c.has_input(2)) hi = order_key(c.input(2).to(st));
  if (!lo && !hi) {
    c.set_output(0, x.expand(x.sizes()));
    return;
  }
  if (is_wide_unsigned(st)) {
    c.set_output(0, from_key(at::clamp(order_key(x), lo, hi), st));
    return;
  }
  c.set_output(0, at::clamp(x, lo, hi));
}

void cast(OpContext& c) {
  at::ScalarType to = scalar_type_of(c, c.attr_int("to"));
  c.set_output(0, cast_to(c.input(0), to, c.attr_int("saturate", 1) != 0));
}

void cast_like(OpContext& c) {
  at::ScalarType to = c.input(1).scalar_type();
  c.set_output(0, cast_to(c.input(0), to, c.attr_int("saturate", 1) != 0));
}

void bitcast(OpContext& c) {
  const at::Tensor& x = c.input(0);
  at::ScalarType to = scalar_type_of(c, c.attr_int("to"));
  c.check(c10::elementSize(to) == c10::elementSize(x.scalar_type()),
          "BitCast needs types of the same width: ", c10::toString(x.scalar_type()), " -> ",
          c10::toString(to));
  c.set_output(0, x.contiguous().view(to).clone());
}

void identity(OpContext& c) { c.set_output(0, c.input(0)); }

}  // namespace

namespace {

// Cast to an integer type carries shape arithmetic unchanged.
std::optional<std::vector<ShapeEntry>> cast_arith(const ShapeArithContext& c) {
  const int64_t to = c.attr_int("to", 0);  // the integer types of onnx.TensorProto
  if (to != 2 && to != 3 && to != 4 && to != 5 && to != 6 && to != 7 && to != 12 && to != 13)
    return std::nullopt;
  return shape_rules::same(c);
}

}  // namespace

void register_elementwise(OpTable& t) {
  // --- arithmetic ---
  binary(t, "Add", [](const at::Tensor& a, const at::Tensor& b) { return at::add(a, b); });
  binary(t, "Sub", [](const at::Tensor& a, const at::Tensor& b) { return at::sub(a, b); });
  binary(t, "Mul", [](const at::Tensor& a, const at::Tensor& b) { return at::mul(a, b); });
  t.add({"", "Div", divide});
  t.add({"", "Mod", modulo});
  t.add({"", "Pow", power});
  // --- unary math ---
  t.add({"", "Neg", negate});
  t.add({"", "Abs", absolute});
  t.add({"", "Sign", sign});
  unary(t, "Reciprocal", [](const at::Tensor& x) { return at::reciprocal(x); });
  unary(t, "Sqrt", [](const at::Tensor& x) { return at::sqrt(x); });
  unary(t, "Exp", [](const at::Tensor& x) { return at::exp(x); });
  unary(t, "Log", [](const at::Tensor& x) { return at::log(x); });
  unary(t, "Floor", [](const at::Tensor& x) { return at::floor(x); });
  unary(t, "Ceil", [](const at::Tensor& x) { return at::ceil(x); });
  // at::round rounds half to even, as ONNX does.
  unary(t, "Round", [](const at::Tensor& x) { return at::round(x); });
  unary(t, "Erf", [](const at::Tensor& x) { return at::erf(x); });
  unary(t, "Sin", [](const at::Tensor& x) { return at::sin(x); });
  unary(t, "Cos", [](const at::Tensor& x) { return at::cos(x); });
  unary(t, "Tan", [](const at::Tensor& x) { return at::tan(x); });
  unary(t, "Asin", [](const at::Tensor& x) { return at::asin(x); });
  unary(t, "Acos", [](const at::Tensor& x) { return at::acos(x); });
  unary(t, "Atan", [](const at::Tensor& x) { return at::atan(x); });
  unary(t, "Sinh", [](const at::Tensor& x) { return at::sinh(x); });
  unary(t, "Cosh", [](const at::Tensor& x) { return at::cosh(x); });
  unary(t, "Asinh", [](const at::Tensor& x) { return at::asinh(x); });
  unary(t, "Acosh", [](const at::Tensor& x) { return at::acosh(x); });
  unary(t, "Atanh", [](const at::Tensor& x) { return at::atanh(x); });
  t.add({"", "IsNaN", is_nan});
  t.add({"", "IsInf", is_inf});
  // --- comparison (bool outputs) ---
  compare(t, "Equal", [](const at::Tensor& a, const at::Tensor& b) { return at::eq(a, b); });
  compare(t, "Less", [](const at::Tensor& a, const at::Tensor& b) { return at::lt(a, b); });
  compare(t, "LessOrEqual", [](const at::Tensor& a, const at::Tensor& b) { return at::le(a, b); });
  compare(t, "Greater", [](const at::Tensor& a, const at::Tensor& b) { return at::gt(a, b); });
  compare(t, "GreaterOrEqual",
          [](const at::Tensor& a, const at::Tensor& b) { return at::ge(a, b); });

  // --- logic ---
  t.add({"", "And", logical_and});
  t.add({"", "Or", logical_or});
  t.add({"", "Xor", logical_xor});
  t.add({"", "Not", logical_not});
  // --- bitwise ---
  t.add({"", "BitShift", bit_shift});
  binary(t, "BitwiseAnd",
         [](const at::Tensor& a, const at::Tensor& b) { return at::bitwise_and(a, b); });
  binary(t, "BitwiseOr",
         [](const at::Tensor& a, const at::Tensor& b) { return at::bitwise_or(a, b); });
  binary(t, "BitwiseXor",
         [](const at::Tensor& a, const at::Tensor& b) { return at::bitwise_xor(a, b); });
  t.add({"", "BitwiseNot", bitwise_not});
  // --- selection and variadic ---
  t.add({"", "Where", where_op});
  t.add({"", "Max", elementwise_max});
  t.add({"", "Min", elementwise_min});
  t.add({"", "Sum", variadic_sum});
  t.add({"", "Mean", variadic_mean});
  t.add({"", "Clip", clip});
  // --- types ---
  t.add({"", "Cast", cast});
  t.add({"", "CastLike", cast_like});
  t.add({"", "BitCast", bitcast});
  t.add({"", "Identity", identity});
  t.set_channels({"Add", "Sub", "Mul", "Div", "Mod", "Pow", "Where", "Max", "Min", "Sum", "Mean",
                  "Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual"},
                 channel_rules::broadcast);
  t.set_channels({"Neg",   "Abs",   "Sign",  "Reciprocal", "Sqrt", "Exp",      "Log",
                  "Floor", "Ceil",  "Round", "Erf",        "Sin",  "Cos",      "Tan",
                  "IsNaN", "IsInf", "Not",   "Clip",       "Cast", "CastLike", "Identity"},
                 channel_rules::same);
  t.set_shape_rule({"Add", "Sub", "Mul", "Div"}, shape_rules::arithmetic);
  t.set_shape_rule({"Identity"}, shape_rules::same);
  t.set_shape_rule({"Cast"}, cast_arith);
}

}  // namespace lopper::ops
