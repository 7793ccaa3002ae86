// Row-wise kernels (rows_isa.h), written once over the vector types of vec_impl.h and compiled per
// ISA by rows_scalar.cpp, rows_avx2.cpp and rows_avx512.cpp, which define LOPPER_SPARSE_ISA,
// LOPPER_ROWS_OPS_NAME and LOPPER_ROWS_OPS_LABEL.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>

#include "kernels/cpu/rows_isa.h"
#include "kernels/cpu/vec_impl.h"

namespace lopper::kernels::cpu {
namespace {

// Softmax of each row in three passes over it (it stays in L1): the largest scaled value, the
// exponentials of the scaled values minus it (stored) and their sum, then the products by the
// sum's reciprocal. NaN anywhere in a row makes the row NaN (as ATen's); a row of -inf only is
// NaN (0 / 0, as ATen's). exp_of clamps at -87.3: a value that far below the row's largest gets
// e^-87.3 (1e-38) instead of 0.
template <class T>
void softmax_rows(const float* x, float* y, int64_t r0, int64_t r1, int64_t n, float scale) {
  using V = typename T::V;
  constexpr int W = T::W;
  const V s = T::set1(scale);
  const float ninf = -std::numeric_limits<float>::infinity();
  for (int64_t r = r0; r < r1; ++r) {
    const float* xr = x + r * n;
    float* yr = y + r * n;
    V m = T::set1(ninf);
    int64_t j = 0;
    for (; j + W <= n; j += W) m = T::max_nan(m, T::mul(T::load(xr + j), s));
    float lanes[W];
    T::store(lanes, m);
    float mx = ninf;
    for (int i = 0; i < W && mx == mx; ++i)  // the lanes' largest (a NaN kept)
      if (lanes[i] > mx || lanes[i] != lanes[i]) mx = lanes[i];
    for (; j < n && mx == mx; ++j) {
      const float v = xr[j] * scale;
      if (v > mx || v != v) mx = v;
    }
    const V vm = T::set1(mx);
    V sum = T::zero();
    j = 0;
    for (; j + W <= n; j += W) {
      const V e = T::exp(T::fma(T::load(xr + j), s, T::sub(T::zero(), vm)));
      T::store(yr + j, e);
      sum = T::add(sum, e);
    }
    float total = T::hsum(sum);
    if (j < n) {
      const int left = int(n - j);
      const V e = T::exp(T::fma(T::loadm(xr + j, left), s, T::sub(T::zero(), vm)));
      float lane[W];
      T::store(lane, e);
      for (int i = 0; i < left; ++i) total += lane[i];
      T::storem(yr + j, e, left);
    }
    const V inv = T::set1(1.f / total);
    j = 0;
    for (; j + W <= n; j += W) T::store(yr + j, T::mul(T::load(yr + j), inv));
    if (j < n) T::storem(yr + j, T::mul(T::loadm(yr + j, int(n - j)), inv), int(n - j));
  }
}

}  // namespace

extern const RowsIsaOps LOPPER_ROWS_OPS_NAME;
const RowsIsaOps LOPPER_ROWS_OPS_NAME = {
    LOPPER_ROWS_OPS_LABEL, [](const float* x, float* y, int64_t r0, int64_t r1, int64_t n,
                              float scale) { softmax_rows<Wide>(x, y, r0, r1, n, scale); }};

}  // namespace lopper::kernels::cpu
