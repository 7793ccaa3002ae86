#include "kernels/cpu/bf16.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

namespace lopper::kernels::cpu {

// NOTE: plain loops the compiler vectorises, one build per ISA.
__attribute__((target_clones("arch=skylake-avx512", "avx2", "default"))) void widen_span(
    const uint16_t* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = from_bf16(x[i]);
}

__attribute__((target_clones("arch=skylake-avx512", "avx2", "default"))) void narrow_span(
    const float* x, uint16_t* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = to_bf16(x[i]);
}

namespace {

__attribute__((target_clones("arch=skylake-avx512", "avx2", "default"))) void relu_span(uint16_t* y,
                                                                                        int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t v = y[i];
    // negative (sign bit) and not NaN (exponent all ones, mantissa nonzero) -> +0
    y[i] = (v & 0x8000u) && (v & 0x7FFFu) <= 0x7F80u ? uint16_t(0) : v;
  }
}

__attribute__((target_clones("arch=skylake-avx512", "avx2", "default"))) void clamp_span(
    uint16_t* y, int64_t n, float lo, float hi) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = from_bf16(y[i]);
    y[i] = to_bf16(v < lo ? lo : v > hi ? hi : v);  // NaN: both false, kept
  }
}

// Whether t's elements fill its storage span without gaps or overlap, in some order of its dims
// (contiguous, channels-last, ...): then an elementwise pass over the span converts it in place of
// the layout.
bool dense(const at::Tensor& t) { return t.is_non_overlapping_and_dense(); }

constexpr int64_t kGrain = 1 << 15;

}  // namespace

at::Tensor widen_bf16(const at::Tensor& x) {
  if (!x.defined() || x.scalar_type() != at::kBFloat16) return x;
  if (!x.device().is_cpu() || !dense(x)) return x.to(at::kFloat);
  at::Tensor y = at::empty_strided(x.sizes(), x.strides(), x.options().dtype(at::kFloat));
  const auto* xp = reinterpret_cast<const uint16_t*>(x.data_ptr());
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, x.numel(), kGrain,
                   [&](int64_t b, int64_t e) { widen_span(xp + b, yp + b, e - b); });
  return y;
}

bool relu_bf16_(const at::Tensor& y) {
  if (!y.defined() || y.scalar_type() != at::kBFloat16 || !y.device().is_cpu() || !dense(y))
    return false;
  auto* p = reinterpret_cast<uint16_t*>(y.data_ptr());
  at::parallel_for(0, y.numel(), kGrain, [&](int64_t b, int64_t e) { relu_span(p + b, e - b); });
  return true;
}

bool clamp_bf16_(const at::Tensor& y, float lo, float hi) {
  if (!y.defined() || y.scalar_type() != at::kBFloat16 || !y.device().is_cpu() || !dense(y))
    return false;
  auto* p = reinterpret_cast<uint16_t*>(y.data_ptr());
  at::parallel_for(0, y.numel(), kGrain,
                   [&](int64_t b, int64_t e) { clamp_span(p + b, e - b, lo, hi); });
  return true;
}

at::Tensor narrow_to_bf16(const at::Tensor& y) {
  if (!y.defined() || y.scalar_type() != at::kFloat) return y;
  if (!y.device().is_cpu() || !dense(y)) return y.to(at::kBFloat16);
  at::Tensor x = at::empty_strided(y.sizes(), y.strides(), y.options().dtype(at::kBFloat16));
  const float* yp = y.data_ptr<float>();
  auto* xp = reinterpret_cast<uint16_t*>(x.data_ptr());
  at::parallel_for(0, y.numel(), kGrain,
                   [&](int64_t b, int64_t e) { narrow_span(yp + b, xp + b, e - b); });
  return x;
}

}  // namespace lopper::kernels::cpu
