// Signal and image-geometry ops: DFT, STFT, HannWindow, HammingWindow, BlackmanWindow,
// MelWeightMatrix, Det, Col2Im, CenterCropPad, AffineGrid, RoiAlign, NonMaxSuppression.
#include <ATen/ATen.h>

#include <algorithm>
#include <limits>
#include <cmath>
#include <numeric>

#include "ops/op.h"

namespace lopper::ops {

namespace {

int64_t scalar_int(const OpContext& c, size_t i, const char* what) {
  const at::Tensor& t = c.input(i);
  c.check(t.numel() == 1, what, " must be a scalar, got shape ", t.sizes());
  return to_int_vector(t)[0];
}

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
  int64_t axis = c.opset() >= 20 ? (c.has_input(2) ? scalar_int(c, 2, "axis") : -2)
                                 : c.attr_int("axis", 1);
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
  if (c.has_input(3)) fl = scalar_int(c, 3, "frame_length");
  else if (window.defined()) fl = window.numel();
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
    fb[i] = static_cast<int64_t>(std::floor(static_cast<double>(dft_length + 1) * hz /
                                            static_cast<double>(rate)));
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

void det(OpContext& c) {
  const at::Tensor& x = c.input(0);
  c.check(x.is_floating_point(), "input must be a floating-point tensor");
  c.check(x.dim() >= 2 && x.size(-1) == x.size(-2), "input must be [*, M, M], got shape ",
          x.sizes());
  at::ScalarType ct = at::promote_types(x.scalar_type(), at::kFloat);
  c.set_output(0, at::linalg_det(x.to(ct)).to(x.scalar_type()));
}

void col2im(OpContext& c) {
  const at::Tensor& x = c.input(0);
  auto image = to_int_vector(c.input(1));
  auto block = to_int_vector(c.input(2));
  size_t nd = image.size();
  c.check(nd >= 1 && block.size() == nd, "image_shape and block_shape must have the same length");
  c.check(x.dim() == 3, "input must be [N, C*prod(block_shape), L], got shape ", x.sizes());
  auto dil = c.attr_ints("dilations", std::vector<int64_t>(nd, 1));
  auto strides = c.attr_ints("strides", std::vector<int64_t>(nd, 1));
  auto pads = c.attr_ints("pads", std::vector<int64_t>(2 * nd, 0));
  c.check(dil.size() == nd && strides.size() == nd && pads.size() == 2 * nd,
          "dilations/strides/pads have the wrong length");
  int64_t kprod = 1;
  std::vector<int64_t> padded(nd), blocks(nd);
  int64_t lprod = 1;
  for (size_t i = 0; i < nd; ++i) {
    c.check(block[i] > 0 && dil[i] > 0 && strides[i] > 0 && image[i] > 0 && pads[i] >= 0 &&
                pads[i + nd] >= 0,
            "sizes, dilations and strides must be positive, pads non-negative");
    kprod *= block[i];
    padded[i] = image[i] + pads[i] + pads[i + nd];
    blocks[i] = (padded[i] - (dil[i] * (block[i] - 1) + 1)) / strides[i] + 1;
    c.check(blocks[i] >= 1, "no complete block fits along dim ", i);
    lprod *= blocks[i];
  }
  c.check(x.size(1) % kprod == 0, "input dim 1 (", x.size(1),
          ") is not divisible by the block size ", kprod);
  c.check(x.size(2) == lprod, "input has ", x.size(2), " blocks, expected ", lprod);
  int64_t ch = x.size(1) / kprod, n = x.size(0);
  std::vector<int64_t> out_shape{n, ch};
  out_shape.insert(out_shape.end(), padded.begin(), padded.end());
  check_output_fits(c, out_shape, x.scalar_type());
  int64_t pprod = numel_of(padded);
  // Flat index into the padded image of every (kernel offset, block) pair.
  at::Tensor idx = at::empty({kprod, lprod}, at::kLong);
  auto a = idx.accessor<int64_t, 2>();
  std::vector<int64_t> k(nd, 0), l(nd, 0);
  for (int64_t ki = 0; ki < kprod; ++ki) {
    int64_t rem = ki;
    for (size_t i = nd; i-- > 0;) {
      k[i] = rem % block[i];
      rem /= block[i];
    }
    for (int64_t li = 0; li < lprod; ++li) {
      int64_t r2 = li;
      for (size_t i = nd; i-- > 0;) {
        l[i] = r2 % blocks[i];
        r2 /= blocks[i];
      }
      int64_t flat = 0;
      for (size_t i = 0; i < nd; ++i) flat = flat * padded[i] + l[i] * strides[i] + k[i] * dil[i];
      a[ki][li] = flat;
    }
  }
  at::Tensor src = x.reshape({n, ch, kprod * lprod});
  at::Tensor out = at::zeros({n, ch, pprod}, x.options());
  out = at::index_add(out, 2, idx.reshape({-1}).to(x.device()), src);
  std::vector<int64_t> shape = {n, ch};
  shape.insert(shape.end(), padded.begin(), padded.end());
  out = out.reshape(shape);
  for (size_t i = 0; i < nd; ++i) out = out.narrow(static_cast<int64_t>(2 + i), pads[i], image[i]);
  c.set_output(0, out.contiguous());
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

void affine_grid(OpContext& c) {
  const at::Tensor& theta = c.input(0);
  auto size = to_int_vector(c.input(1));
  c.check(theta.is_floating_point(), "theta must be a floating-point tensor");
  c.check(size.size() == 4 || size.size() == 5, "size must have 4 or 5 values");
  size_t nd = size.size() - 2;
  c.check(theta.dim() == 3 && theta.size(0) == size[0] &&
              theta.size(1) == static_cast<int64_t>(nd) && theta.size(2) == static_cast<int64_t>(nd) + 1,
          "theta must be [N, ", nd, ", ", nd + 1, "], got shape ", theta.sizes());
  bool align = c.attr_int("align_corners", 0) != 0;
  auto opts = theta.options();
  auto coords = [&](int64_t n) {
    if (align) return at::linspace(-1, 1, n, opts);
    return (at::arange(n, opts) * 2 + 1) / static_cast<double>(n) - 1;
  };
  std::vector<int64_t> spatial(size.begin() + 2, size.end());
  for (int64_t s : spatial) c.check(s > 0, "size values must be positive");
  // Homogeneous base grid [..., (x, y[, z], 1)] with x along the last spatial dim.
  std::vector<at::Tensor> comps;
  for (size_t i = nd; i-- > 0;) {
    std::vector<int64_t> view(nd, 1);
    view[i] = spatial[i];
    comps.push_back(coords(spatial[i]).reshape(view).expand(spatial));
  }
  comps.push_back(at::ones(spatial, opts));
  at::Tensor base = at::stack(comps, -1).reshape({-1, static_cast<int64_t>(nd) + 1});
  at::Tensor grid = at::matmul(base, theta.transpose(1, 2));  // [N, P, nd]
  std::vector<int64_t> shape = {size[0]};
  shape.insert(shape.end(), spatial.begin(), spatial.end());
  shape.push_back(static_cast<int64_t>(nd));
  c.set_output(0, grid.reshape(shape));
}

void roi_align(OpContext& c) {
  const at::Tensor& x = c.input(0);
  c.check(x.is_floating_point() && x.dim() == 4, "X must be a 4-D floating-point tensor");
  const at::Tensor& rois = c.input(1);
  c.check(rois.dim() == 2 && rois.size(1) == 4, "rois must be [num_rois, 4], got ", rois.sizes());
  auto bidx = to_int_vector(c.input(2));
  int64_t nr = rois.size(0);
  c.check(static_cast<int64_t>(bidx.size()) == nr, "batch_indices must have ", nr, " elements");
  std::string ctm = c.attr_string("coordinate_transformation_mode",
                                  c.opset() >= 16 ? "half_pixel" : "output_half_pixel");
  c.check(ctm == "half_pixel" || ctm == "output_half_pixel",
          "unknown coordinate_transformation_mode '", ctm, "'");
  std::string mode = c.attr_string("mode", "avg");
  c.check(mode == "avg" || mode == "max", "unknown mode '", mode, "'");
  int64_t ph = c.attr_int("output_height", 1), pw = c.attr_int("output_width", 1);
  int64_t sr = c.attr_int("sampling_ratio", 0);
  float scale = c.attr_float("spatial_scale", 1.0f);
  c.check(ph > 0 && pw > 0 && sr >= 0, "output sizes must be positive, sampling_ratio >= 0");
  bool half = ctm == "half_pixel";
  int64_t nb = x.size(0), ch = x.size(1), h = x.size(2), w = x.size(3);
  at::Tensor rc = rois.detach().to(at::kCPU, at::kFloat).contiguous();
  auto ra = rc.accessor<float, 2>();
  // Sampling grid sizes per roi; samples are padded to the largest grid (weight 0, masked).
  std::vector<int64_t> gh(nr), gw(nr);
  std::vector<float> sh(nr), sw(nr), bh(nr), bw(nr);
  int64_t smax = 1;
  for (int64_t r = 0; r < nr; ++r) {
    c.check(bidx[r] >= 0 && bidx[r] < nb, "batch index ", bidx[r], " out of range");
    float off = half ? 0.5f : 0.f;
    float x0 = ra[r][0] * scale - off, y0 = ra[r][1] * scale - off;
    float x1 = ra[r][2] * scale - off, y1 = ra[r][3] * scale - off;
    float rw = x1 - x0, rh = y1 - y0;
    if (!half) {
      rw = std::max(rw, 1.0f);
      rh = std::max(rh, 1.0f);
    }
    sh[r] = y0;
    sw[r] = x0;
    bh[r] = rh / static_cast<float>(ph);
    bw[r] = rw / static_cast<float>(pw);
    gh[r] = sr > 0 ? sr : static_cast<int64_t>(std::ceil(rh / static_cast<float>(ph)));
    gw[r] = sr > 0 ? sr : static_cast<int64_t>(std::ceil(rw / static_cast<float>(pw)));
    gh[r] = std::max<int64_t>(gh[r], 0);
    gw[r] = std::max<int64_t>(gw[r], 0);
    smax = std::max(smax, gh[r] * gw[r]);
  }
  int64_t total = nr * ph * pw * smax;
  at::Tensor pos = at::zeros({4, total}, at::kLong);
  at::Tensor wts = at::zeros({4, total}, at::kDouble);
  at::Tensor valid = at::zeros({total}, at::kBool);
  at::Tensor count = at::ones({nr}, at::kDouble);
  auto pa = pos.accessor<int64_t, 2>();
  auto wa = wts.accessor<double, 2>();
  auto va = valid.accessor<bool, 1>();
  auto ca = count.accessor<double, 1>();
  for (int64_t r = 0; r < nr; ++r) {
    ca[r] = static_cast<double>(std::max<int64_t>(gh[r] * gw[r], 1));
    int64_t base_off = bidx[r] * h * w;
    for (int64_t py = 0; py < ph; ++py)
      for (int64_t px = 0; px < pw; ++px) {
        int64_t s = 0;
        for (int64_t iy = 0; iy < gh[r]; ++iy) {
          float yy = sh[r] + static_cast<float>(py) * bh[r] +
                     (static_cast<float>(iy) + 0.5f) * bh[r] / static_cast<float>(gh[r]);
          for (int64_t ix = 0; ix < gw[r]; ++ix, ++s) {
            float xx = sw[r] + static_cast<float>(px) * bw[r] +
                       (static_cast<float>(ix) + 0.5f) * bw[r] / static_cast<float>(gw[r]);
            int64_t k = ((r * ph + py) * pw + px) * smax + s;
            va[k] = true;
            float yv = yy, xv = xx;
            if (yv < -1.0f || yv > static_cast<float>(h) || xv < -1.0f ||
                xv > static_cast<float>(w)) {
              for (int q = 0; q < 4; ++q) pa[q][k] = base_off;
              continue;  // weights stay 0
            }
            yv = std::max(yv, 0.f);
            xv = std::max(xv, 0.f);
            int64_t yl = static_cast<int64_t>(yv), xl = static_cast<int64_t>(xv), yhi, xhi;
            if (yl >= h - 1) {
              yhi = yl = h - 1;
              yv = static_cast<float>(yl);
            } else {
              yhi = yl + 1;
            }
            if (xl >= w - 1) {
              xhi = xl = w - 1;
              xv = static_cast<float>(xl);
            } else {
              xhi = xl + 1;
            }
            float ly = yv - static_cast<float>(yl), lx = xv - static_cast<float>(xl);
            float hy = 1.f - ly, hx = 1.f - lx;
            pa[0][k] = base_off + yl * w + xl;
            pa[1][k] = base_off + yl * w + xhi;
            pa[2][k] = base_off + yhi * w + xl;
            pa[3][k] = base_off + yhi * w + xhi;
            wa[0][k] = hy * hx;
            wa[1][k] = hy * lx;
            wa[2][k] = ly * hx;
            wa[3][k] = ly * lx;
          }
        }
      }
  }
  at::Tensor table = x.permute({0, 2, 3, 1}).reshape({nb * h * w, ch});  // [pixels, C]
  at::Tensor posd = pos.to(x.device()), wd = wts.to(x.device(), x.scalar_type());
  std::vector<at::Tensor> terms;
  for (int64_t q = 0; q < 4; ++q)
    terms.push_back(table.index_select(0, posd[q]) * wd[q].unsqueeze(1));  // [total, C]
  at::Tensor y;
  if (mode == "avg") {
    at::Tensor sum = (terms[0] + terms[1] + terms[2] + terms[3]).reshape({nr, ph, pw, smax, ch});
    y = sum.sum(3) / count.to(x.device(), x.scalar_type()).reshape({nr, 1, 1, 1});
  } else {
    at::Tensor m = at::maximum(at::maximum(terms[0], terms[1]), at::maximum(terms[2], terms[3]));
    at::Tensor vd = valid.to(x.device()).unsqueeze(1);
    m = at::where(vd, m, at::full({}, -std::numeric_limits<double>::infinity(), m.options()));
    y = std::get<0>(m.reshape({nr, ph, pw, smax, ch}).max(3));
    // A roi with no samples (an empty sampling grid) outputs 0.
    at::Tensor empty_roi = at::zeros({nr}, at::kBool);
    auto ea = empty_roi.accessor<bool, 1>();
    for (int64_t r = 0; r < nr; ++r) ea[r] = gh[r] * gw[r] == 0;
    y = at::where(empty_roi.to(x.device()).reshape({nr, 1, 1, 1}), at::zeros_like(y), y);
  }
  c.set_output(0, y.permute({0, 3, 1, 2}).contiguous());
}

void non_max_suppression(OpContext& c) {
  const at::Tensor& boxes = c.input(0);
  const at::Tensor& scores = c.input(1);
  c.check(boxes.dim() == 3 && boxes.size(2) == 4, "boxes must be [batch, boxes, 4], got ",
          boxes.sizes());
  c.check(scores.dim() == 3 && scores.size(0) == boxes.size(0) && scores.size(2) == boxes.size(1),
          "scores must be [batch, classes, boxes], got ", scores.sizes());
  int64_t max_out = 0;
  if (c.has_input(2) && c.input(2).numel() > 0) max_out = std::max<int64_t>(0, scalar_int(c, 2, "max_output_boxes_per_class"));
  float iou_th = 0.f, score_th = 0.f;
  if (c.has_input(3) && c.input(3).numel() > 0) iou_th = static_cast<float>(to_double(c.input(3)));
  bool has_score = c.has_input(4) && c.input(4).numel() > 0;
  if (has_score) score_th = static_cast<float>(to_double(c.input(4)));
  int64_t cpb = c.attr_int("center_point_box", 0);
  c.check(cpb == 0 || cpb == 1, "center_point_box must be 0 or 1");
  at::Tensor bx = boxes.detach().to(at::kCPU, at::kFloat).contiguous();
  at::Tensor sc = scores.detach().to(at::kCPU, at::kFloat).contiguous();
  auto ba = bx.accessor<float, 3>();
  auto sa = sc.accessor<float, 3>();
  int64_t nbatch = bx.size(0), nbox = bx.size(1), ncls = sc.size(1);
  std::vector<int64_t> out;
  auto suppress = [&](int64_t b, int64_t i, int64_t j) {
    float x1min, x1max, x2min, x2max, y1min, y1max, y2min, y2max;
    if (cpb == 0) {
      x1min = std::min(ba[b][i][1], ba[b][i][3]);
      x1max = std::max(ba[b][i][1], ba[b][i][3]);
      x2min = std::min(ba[b][j][1], ba[b][j][3]);
      x2max = std::max(ba[b][j][1], ba[b][j][3]);
      y1min = std::min(ba[b][i][0], ba[b][i][2]);
      y1max = std::max(ba[b][i][0], ba[b][i][2]);
      y2min = std::min(ba[b][j][0], ba[b][j][2]);
      y2max = std::max(ba[b][j][0], ba[b][j][2]);
    } else {
      x1min = ba[b][i][0] - ba[b][i][2] / 2;
      x1max = ba[b][i][0] + ba[b][i][2] / 2;
      x2min = ba[b][j][0] - ba[b][j][2] / 2;
      x2max = ba[b][j][0] + ba[b][j][2] / 2;
      y1min = ba[b][i][1] - ba[b][i][3] / 2;
      y1max = ba[b][i][1] + ba[b][i][3] / 2;
      y2min = ba[b][j][1] - ba[b][j][3] / 2;
      y2max = ba[b][j][1] + ba[b][j][3] / 2;
    }
    float ixmin = std::max(x1min, x2min), ixmax = std::min(x1max, x2max);
    if (ixmax <= ixmin) return false;
    float iymin = std::max(y1min, y2min), iymax = std::min(y1max, y2max);
    if (iymax <= iymin) return false;
    float inter = (ixmax - ixmin) * (iymax - iymin);
    if (inter <= 0) return false;
    float a1 = (x1max - x1min) * (y1max - y1min), a2 = (x2max - x2min) * (y2max - y2min);
    float uni = a1 + a2 - inter;
    if (a1 <= 0 || a2 <= 0 || uni <= 0) return false;
    return inter / uni > iou_th;
  };
  for (int64_t b = 0; b < nbatch; ++b)
    for (int64_t k = 0; k < ncls; ++k) {
      std::vector<int64_t> cand;
      for (int64_t i = 0; i < nbox; ++i)
        if (!has_score || sa[b][k][i] > score_th) cand.push_back(i);
      std::stable_sort(cand.begin(), cand.end(),
                       [&](int64_t p, int64_t q) { return sa[b][k][p] > sa[b][k][q]; });
      std::vector<int64_t> kept;
      for (int64_t i : cand) {
        if (static_cast<int64_t>(kept.size()) >= max_out) break;
        bool ok = true;
        for (int64_t j : kept)
          if (suppress(b, i, j)) {
            ok = false;
            break;
          }
        if (ok) {
          kept.push_back(i);
          out.insert(out.end(), {b, k, i});
        }
      }
    }
  int64_t n = static_cast<int64_t>(out.size()) / 3;
  at::Tensor y = at::empty({n, 3}, at::kLong);
  if (n > 0) std::copy(out.begin(), out.end(), y.data_ptr<int64_t>());
  c.set_output(0, y.to(c.device()));
}

}  // namespace

void register_signal(OpTable& t) {
  t.add({"", "DFT", dft});
  t.add({"", "STFT", stft});
  t.add({"", "HannWindow", [](OpContext& c) { window_op(c, Window::kHann); }});
  t.add({"", "HammingWindow", [](OpContext& c) { window_op(c, Window::kHamming); }});
  t.add({"", "BlackmanWindow", [](OpContext& c) { window_op(c, Window::kBlackman); }});
  t.add({"", "MelWeightMatrix", mel_weight_matrix});
  t.add({"", "Det", det});
  t.add({"", "Col2Im", col2im});
  t.add({"", "CenterCropPad", center_crop_pad});
  t.add({"", "AffineGrid", affine_grid});
  t.add({"", "RoiAlign", roi_align});
  t.add({"", "NonMaxSuppression", non_max_suppression});
}

}  // namespace lopper::ops
