// Standalone check of the NHWC direct and depthwise convolution kernels
// (src/kernels/cpu/conv_impl.h) while they are not yet wired into the executor (issue 22): random
// shapes (strides, padding, dilation, pixel strides wider than the channels, odd channel counts,
// bias, residual, every activation) against a double-precision reference, then a timing of typical
// MobileNetV2 and ResNet layers on one thread. Not part of the build:
//   g++ -std=c++20 -O3 -DLOPPER_SPARSE_ISA=1 -mavx2 -mfma -Isrc bench/kernels/conv_check.cpp -o
//   /tmp/conv_check (LOPPER_SPARSE_ISA=0 with no -m flags for the scalar version)
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "kernels/cpu/conv_impl.h"

using namespace lopper::kernels::cpu;
using T = Wide;

namespace {

// Random shapes against a double-precision reference: `depthwise` checks dw_rows (one input
// channel per output), else conv_rows. Every output channel must match and the padding between
// pixels (strides wider than the channels) stay untouched.
int check(bool depthwise) {
  std::mt19937 rng(depthwise ? 2 : 1);
  std::uniform_real_distribution<float> U(-1, 1);
  int fails = 0, cases = 0;
  for (int it = 0; it < (depthwise ? 500 : 400); ++it) {
    ConvShape s;
    s.n = 1 + rng() % 2;
    s.h = 1 + rng() % (depthwise ? 10 : 12);
    s.w = 1 + rng() % (depthwise ? 12 : 15);
    s.c = 1 + rng() % (depthwise ? 70 : 20);
    s.k = depthwise ? s.c : 1 + rng() % 40;
    s.kh = 1 + rng() % (depthwise ? 5 : 3);
    s.kw = 1 + rng() % (depthwise ? 5 : 4);
    s.sh = 1 + rng() % 2;
    s.sw = 1 + rng() % 2;
    s.ph = rng() % (depthwise ? 3 : 2);
    s.pw = rng() % 3;
    s.dh = 1 + rng() % 2;
    s.dw = 1 + rng() % 2;
    s.oh = (s.h + 2 * s.ph - (s.kh - 1) * s.dh - 1) / s.sh + 1;
    s.ow = (s.w + 2 * s.pw - (s.kw - 1) * s.dw - 1) / s.sw + 1;
    if (s.oh <= 0 || s.ow <= 0) continue;
    const int64_t cin = depthwise ? 1 : s.c;  // input channels per output channel
    const int64_t xs = s.c + rng() % 3, ys = s.k + rng() % 3;
    s.x_stride = xs;
    s.y_stride = ys;
    s.r_stride = s.k;
    bool use_res = rng() % 2, use_bias = rng() % 2;
    int act = rng() % 4;
    std::vector<float> x(s.n * s.h * s.w * xs), w(s.k * cin * s.kh * s.kw), b(s.k),
        r(s.n * s.oh * s.ow * s.k), y(s.n * s.oh * s.ow * ys, 777.f);
    for (auto& v : x) v = U(rng);
    for (auto& v : w) v = U(rng);
    for (auto& v : b) v = U(rng);
    for (auto& v : r) v = U(rng);
    Epilogue e;
    e.bias = use_bias ? b.data() : nullptr;
    e.act = act;
    e.lo = -0.3f;
    e.hi = 0.4f;
    e.alpha = 0.1f;
    const float* res = use_res ? r.data() : nullptr;
    if (depthwise) {
      std::vector<float> packed(dw_padded(s.c, T::W) * s.kh * s.kw);
      dw_pack(w.data(), s, T::W, packed.data());
      dw_rows<T>(x.data(), packed.data(), y.data(), res, s, e, 0, s.n * s.oh);
    } else {
      const int NB = ConvTraits<T>::kNB;
      std::vector<float> packed(conv_blocks(s, NB) * NB * s.kh * s.kw * s.c);
      conv_pack(w.data(), s, NB, packed.data());
      conv_rows<T>(x.data(), packed.data(), y.data(), res, s, e, 0, s.n * s.oh);
    }
    ++cases;
    for (int64_t n = 0; n < s.n; ++n)
      for (int64_t oy = 0; oy < s.oh; ++oy)
        for (int64_t ox = 0; ox < s.ow; ++ox) {
          const int64_t pix = (n * s.oh + oy) * s.ow + ox;
          for (int64_t k = 0; k < ys; ++k) {
            float got = y[pix * ys + k];
            if (k >= s.k) {
              if (got != 777.f) {
                ++fails;
                printf("overwrote pad\n");
              }
              continue;
            }
            double acc = use_bias ? b[k] : 0;
            for (int64_t c = 0; c < cin; ++c)
              for (int64_t i = 0; i < s.kh; ++i)
                for (int64_t j = 0; j < s.kw; ++j) {
                  int64_t iy = oy * s.sh - s.ph + i * s.dh, ix = ox * s.sw - s.pw + j * s.dw;
                  if (iy < 0 || iy >= s.h || ix < 0 || ix >= s.w) continue;
                  acc += double(x[((n * s.h + iy) * s.w + ix) * xs + (depthwise ? k : c)]) *
                         w[((k * cin + c) * s.kh + i) * s.kw + j];
                }
            if (use_res) acc += r[pix * s.k + k];
            if (act == 1) acc = std::max(acc, 0.0);
            if (act == 2) acc = std::min(std::max(acc, -0.3), 0.4);
            if (act == 3) acc = acc > 0 ? acc : 0.1 * acc;
            if (std::fabs(acc - got) > 1e-4 * (1 + std::fabs(acc))) {
              if (fails < 5)
                printf("case %d: mismatch at n%ld oy%ld ox%ld k%ld: %f vs %f\n", it, n, oy, ox, k,
                       got, acc);
              ++fails;
            }
          }
        }
  }
  printf("%s: %d cases, %d mismatches\n", depthwise ? "depthwise" : "direct", cases, fails);
  return fails;
}

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
void run(const char* name, int64_t h, int64_t c, int64_t k, int64_t kk, int64_t st, bool dw) {
  ConvShape s;
  s.h = s.w = h;
  s.c = c;
  s.k = dw ? c : k;
  s.kh = s.kw = kk;
  s.sh = s.sw = st;
  s.ph = s.pw = kk / 2;
  s.oh = s.ow = (h + 2 * s.ph - kk) / st + 1;
  std::vector<float> x(h * h * c, 0.5f), w(s.k * (dw ? 1 : c) * kk * kk, 0.1f),
      y(s.oh * s.ow * s.k), b(s.k, 0.f);
  std::vector<float> p(dw ? dw_padded(c, T::W) * kk * kk
                          : conv_blocks(s, ConvTraits<T>::kNB) * ConvTraits<T>::kNB * kk * kk * c);
  if (dw)
    dw_pack(w.data(), s, T::W, p.data());
  else
    conv_pack(w.data(), s, ConvTraits<T>::kNB, p.data());
  Epilogue e;
  e.bias = b.data();
  e.act = Epilogue::kRelu;
  double best = 1e9;
  for (int r = 0; r < 30; ++r) {
    double t0 = now();
    if (dw)
      dw_rows<T>(x.data(), p.data(), y.data(), nullptr, s, e, 0, s.oh);
    else
      conv_rows<T>(x.data(), p.data(), y.data(), nullptr, s, e, 0, s.oh);
    best = std::min(best, now() - t0);
  }
  double flops = 2.0 * s.oh * s.ow * s.k * (dw ? 1 : c) * kk * kk;
  printf("%-28s %8.1f us  %6.1f GFLOP/s\n", name, best * 1e6, flops / best * 1e-9);
}
void timings() {
  run("1x1 56x56 12->72", 56, 12, 72, 1, 1, false);
  run("1x1 56x56 72->12", 56, 72, 12, 1, 1, false);
  run("1x1 14x14 192->32", 14, 192, 32, 1, 1, false);
  run("1x1 7x7 480->1280", 7, 480, 1280, 1, 1, false);
  run("3x3 56x56 64->64", 56, 64, 64, 3, 1, false);
  run("3x3 s2 224 3->16", 224, 3, 16, 3, 2, false);
  run("dw3x3 112x112 48", 112, 48, 48, 3, 1, true);
  run("dw3x3 56x56 72 s1", 56, 72, 72, 3, 1, true);
  run("dw3x3 28x28 96 s2", 56, 96, 96, 3, 2, true);
  run("dw3x3 7x7 480", 7, 480, 480, 3, 1, true);
}

}  // namespace

int main() {
  const int fails = check(false) + check(true);
  if (fails == 0) timings();
  return fails != 0;
}
