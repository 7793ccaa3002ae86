// Signal-processing ops: DFT, STFT, HannWindow, HammingWindow, BlackmanWindow, MelWeightMatrix.
#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "ops/op.h"

namespace lopper::ops {

namespace {

// A [..., 1] real or [..., 2] complex-as-real signal as a real or complex ATen tensor (without the
// last dim), in float32 or float64.
at::Tensor to_signal(const OpContext& c, const at::Tensor& x) {
  c.check(x.is_floating_point(), "input must be a floating-point tensor");
  c.check(x.dim() >= 2 && (x.size(-1) == 1 || x.size(-1) == 2),
          "input's last dim must be 1 (real) or 2 (complex), got shape ", x.sizes());
  at::ScalarType ct = at::promote_types(x.scalar_type(), at::kFloat);
  at::Tensor xc = x.to(ct);
  if (x.size(-1) == 1) return xc.squeeze(-1);
  return at::view_as_complex(xc.contiguous());
}

void dft(OpContext& c) {
  const at::Tensor& x = c.input(0);
  at::Tensor sig = to_signal(c, x);
  int64_t rank = x.dim();
  int64_t axis =
      c.opset() >= 20 ? (c.has_input(2) ? scalar_int(c, 2, "axis") : -2) : c.attr_int("axis", 1);
  axis = normalize_axis(c, axis, rank);
  c.check(axis < rank - 1, "axis must not be the last (real/imaginary) dim");
  bool inverse = c.attr_int("inverse", 0) != 0;
  bool onesided = c.attr_int("onesided", 0) != 0;
  int64_t n = inverse && onesided ? 2 * (x.size(axis) - 1) : x.size(axis);
  if (c.has_input(1) && c.input(1).numel() > 0) n = scalar_int(c, 1, "dft_length");
  c.check(n >= 1, "dft_length must be positive, got ", n);
  at::Tensor y;
  if (inverse && onesided) {
    if (!sig.is_complex()) sig = at::complex(sig, at::zeros_like(sig));
    y = at::fft_irfft(sig, n, axis).unsqueeze(-1);
  } else if (inverse) {
    y = at::view_as_real(at::fft_ifft(sig, n, axis));
  } else {
    at::Tensor f = at::fft_fft(sig, n, axis);
    if (onesided) f = f.narrow(axis, 0, n / 2 + 1);
    y = at::view_as_real(f);
  }
  c.set_output(0, y.to(x.scalar_type()).contiguous());
}

void stft(OpContext& c) {
  const at::Tensor& x = c.input(0);
  c.check(x.dim() == 3, "signal must be [batch, length, 1 or 2], got shape ", x.sizes());
  at::Tensor sig = to_signal(c, x);  // [B, L]
  int64_t len = sig.size(1);
  int64_t step = scalar_int(c, 1, "frame_step");
  c.check(step > 0, "frame_step must be positive, got ", step);
  at::Tensor window = c.has_input(2) ? c.input(2) : at::Tensor();
  int64_t fl = len;
  if (c.has_input(3))
    fl = scalar_int(c, 3, "frame_length");
  else if (window.defined())
    fl = window.numel();
  if (window.defined())
    c.check(window.dim() == 1 && window.size(0) == fl, "window must have ", fl,
            " elements, got shape ", window.sizes());
  c.check(fl >= 1 && fl <= len, "frame_length ", fl, " must be in [1, ", len, "]");
  bool onesided = c.attr_int("onesided", 1) != 0;
  at::Tensor frames = sig.unfold(1, fl, step);  // [B, F, fl]
  if (window.defined()) frames = frames * window.to(at::promote_types(x.scalar_type(), at::kFloat));
  at::Tensor f = at::fft_fft(frames, fl, -1);
  if (onesided) f = f.narrow(-1, 0, fl / 2 + 1);
  c.set_output(0, at::view_as_real(f).to(x.scalar_type()).contiguous());
}

enum class Window { kHann, kHamming, kBlackman };

void window_op(OpContext& c, Window kind) {
  int64_t size = scalar_int(c, 0, "size");
  c.check(size >= 0, "size must be non-negative, got ", size);
  at::ScalarType out = scalar_type_of(c, c.attr_int("output_datatype", 1));
  bool periodic = c.attr_int("periodic", 1) != 0;
  double n1 = periodic ? static_cast<double>(size) : static_cast<double>(size - 1);
  at::Tensor n = at::arange(size, at::TensorOptions().dtype(at::kDouble).device(c.device()));
  at::Tensor y;
  if (kind == Window::kHann) {
    y = at::sin(n * (M_PI / n1)).square();
  } else if (kind == Window::kHamming) {
    double alpha = 25.0 / 46.0;
    y = alpha - at::cos(n * (2 * M_PI / n1)) * (1 - alpha);
  } else {
    y = 0.42 - 0.5 * at::cos(n * (2 * M_PI / n1)) + 0.08 * at::cos(n * (4 * M_PI / n1));
  }
  c.set_output(0, y.to(out));
}

// Registers the window op `name` (HannWindow, HammingWindow, BlackmanWindow).
void add_window(OpTable& t, const char* name, Window kind) {
  t.add({"", name, [kind](OpContext& c) { window_op(c, kind); }});
}

void mel_weight_matrix(OpContext& c) {
  int64_t bins = scalar_int(c, 0, "num_mel_bins");
  int64_t dft_length = scalar_int(c, 1, "dft_length");
  int64_t rate = scalar_int(c, 2, "sample_rate");
  c.check(bins > 0 && dft_length > 0 && rate > 0,
          "num_mel_bins, dft_length and sample_rate must be positive");
  double lo = to_double(c.input(3)), hi = to_double(c.input(4));
  at::ScalarType out = scalar_type_of(c, c.attr_int("output_datatype", 1));
  int64_t spec_bins = dft_length / 2 + 1;
  double lo_mel = 2595 * std::log1p(lo / 700) / std::log(10.0);
  double hi_mel = 2595 * std::log1p(hi / 700) / std::log(10.0);
  double step = (hi_mel - lo_mel) / static_cast<double>(bins + 2);
  std::vector<int64_t> fb(static_cast<size_t>(bins + 2));
  for (int64_t i = 0; i < bins + 2; ++i) {
    double hz = 700 * std::expm1((static_cast<double>(i) * step + lo_mel) / 2595 * std::log(10.0));
    fb[i] = static_cast<int64_t>(
        std::floor(static_cast<double>(dft_length + 1) * hz / static_cast<double>(rate)));
  }
  at::Tensor m = at::zeros({spec_bins, bins}, at::kDouble);
  auto a = m.accessor<double, 2>();
  auto in_range = [&](int64_t j) { return j >= 0 && j < spec_bins; };
  for (int64_t i = 0; i < bins; ++i) {
    int64_t l = fb[i], ce = fb[i + 1], r = fb[i + 2];
    if (ce - l == 0) {
      if (in_range(ce)) a[ce][i] = 1;
    } else {
      for (int64_t j = l; j <= ce; ++j)
        if (in_range(j)) a[j][i] = static_cast<double>(j - l) / static_cast<double>(ce - l);
    }
    if (r - ce > 0)
      for (int64_t j = ce; j < r; ++j)
        if (in_range(j)) a[j][i] = static_cast<double>(r - j) / static_cast<double>(r - ce);
  }
  c.set_output(0, m.to(c.device(), out));
}

}  // namespace

void register_signal(OpTable& t) {
  t.add({"", "DFT", dft});
  t.add({"", "STFT", stft});
  add_window(t, "HannWindow", Window::kHann);
  add_window(t, "HammingWindow", Window::kHamming);
  add_window(t, "BlackmanWindow", Window::kBlackman);
  t.add({"", "MelWeightMatrix", mel_weight_matrix});
}

}  // namespace lopper::ops
