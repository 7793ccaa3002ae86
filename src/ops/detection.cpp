// Object-detection ops: RoiAlign, NonMaxSuppression.
#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "ops/op.h"

namespace lopper::ops {

namespace {

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
  if (c.has_input(2) && c.input(2).numel() > 0)
    max_out = std::max<int64_t>(0, scalar_int(c, 2, "max_output_boxes_per_class"));
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

void register_detection(OpTable& t) {
  t.add({"", "RoiAlign", roi_align});
  t.add({"", "NonMaxSuppression", non_max_suppression});
}

}  // namespace lopper::ops
