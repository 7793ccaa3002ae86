// Random generators: RandomNormal, RandomUniform, RandomNormalLike, RandomUniformLike, Bernoulli.
// All are registered non-deterministic, so they are never constant-folded.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <optional>

#include "ops/op.h"

namespace lopper::ops {

namespace {

std::optional<at::Generator> seeded(const OpContext& c) {
  if (!c.has_attr("seed")) return std::nullopt;
  float seed = c.attr_float("seed", 0.f);
  return at::detail::createCPUGenerator(static_cast<uint64_t>(static_cast<int64_t>(seed)));
}

at::ScalarType random_dtype(const OpContext& c, at::ScalarType def) {
  at::ScalarType t = c.has_attr("dtype") ? scalar_type_of(c, c.attr_int("dtype")) : def;
  c.check(at::isFloatingType(t), "dtype must be a floating type");
  return t;
}

// Draws on the CPU (where a seed is honoured) in double, then casts and moves.
at::Tensor draw(const OpContext& c, bool normal, at::IntArrayRef shape, at::ScalarType t) {
  auto gen = seeded(c);
  auto cpu = at::TensorOptions().dtype(at::kDouble);
  at::Tensor r;
  if (normal) {
    double mean = c.attr_float("mean", 0.f), sd = c.attr_float("scale", 1.f);
    r = at::normal(mean, sd, shape, gen, cpu);
  } else {
    double lo = c.attr_float("low", 0.f), hi = c.attr_float("high", 1.f);
    c.check(hi >= lo, "high must be >= low");
    r = at::empty(shape, cpu).uniform_(lo, hi, gen);
  }
  return r.to(c.device(), t);
}

std::vector<int64_t> random_shape(const OpContext& c) {
  auto shape = c.attr_ints("shape");
  c.check(c.has_attr("shape"), "missing required attribute 'shape'");
  for (int64_t d : shape) c.check(d >= 0, "shape must be non-negative");
  check_output_fits(c, shape, random_dtype(c, at::kFloat));
  return shape;
}

void bernoulli(OpContext& c) {
  const at::Tensor& p = c.input(0);
  c.check(p.is_floating_point(), "input must be a floating-point tensor");
  at::ScalarType t = c.has_attr("dtype") ? scalar_type_of(c, c.attr_int("dtype")) : p.scalar_type();
  auto gen = seeded(c);
  at::Tensor u = at::empty(p.sizes(), at::TensorOptions().dtype(at::kDouble)).uniform_(0, 1, gen);
  at::Tensor pc = p.detach().to(at::kCPU, at::kDouble);
  c.set_output(0, (u < pc).to(c.device(), t));
}

void random_normal(OpContext& c) {
  c.set_output(0, draw(c, true, random_shape(c), random_dtype(c, at::kFloat)));
}

void random_uniform(OpContext& c) {
  c.set_output(0, draw(c, false, random_shape(c), random_dtype(c, at::kFloat)));
}

void random_normal_like(OpContext& c) {
  const at::Tensor& x = c.input(0);
  c.set_output(0, draw(c, true, x.sizes(), random_dtype(c, x.scalar_type())));
}

void random_uniform_like(OpContext& c) {
  const at::Tensor& x = c.input(0);
  c.set_output(0, draw(c, false, x.sizes(), random_dtype(c, x.scalar_type())));
}

}  // namespace

void register_random(OpTable& t) {
  t.add({"", "RandomNormal", random_normal, {}, false});
  t.add({"", "RandomUniform", random_uniform, {}, false});
  t.add({"", "RandomNormalLike", random_normal_like, {}, false});
  t.add({"", "RandomUniformLike", random_uniform_like, {}, false});
  t.add({"", "Bernoulli", bernoulli, {}, false});
}

}  // namespace lopper::ops
