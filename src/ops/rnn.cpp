// Recurrent ops: LSTM, GRU, RNN. A per-timestep loop of ATen ops, so autograd flows through.
#include <ATen/ATen.h>

#include <algorithm>
#include <cctype>
#include <string>

#include "ops/op.h"

namespace lopper::ops {

namespace {

enum class Cell { kRnn, kGru, kLstm };

int64_t gates_of(Cell cell) { return cell == Cell::kLstm ? 4 : cell == Cell::kGru ? 3 : 1; }

// One ONNX RNN activation function with its alpha/beta.
struct Act {
  std::string name;  // lower case
  double alpha = 0, beta = 0;
  at::Tensor operator()(const at::Tensor& x) const {
    if (name == "sigmoid") return at::sigmoid(x);
    if (name == "tanh") return at::tanh(x);
    if (name == "relu") return at::relu(x);
    if (name == "affine") return x * alpha + beta;
    if (name == "leakyrelu") return at::where(x >= 0, x, x * alpha);
    if (name == "thresholdedrelu") return at::where(x > alpha, x, at::zeros_like(x));
    if (name == "scaledtanh") return at::tanh(x * beta) * alpha;
    if (name == "hardsigmoid") return at::clamp(x * alpha + beta, 0, 1);
    if (name == "elu") return at::where(x >= 0, x, (at::exp(x) - 1) * alpha);
    if (name == "softsign") return x / (x.abs() + 1);
    return at::softplus(x);  // "softplus"
  }
};

// Parses `activations`/`activation_alpha`/`activation_beta`. Alpha and beta values are consumed in
// order by the functions that take them (as ONNX Runtime does); absent ones take the defaults of
// the corresponding ONNX operators.
std::vector<Act> parse_acts(const OpContext& c, std::vector<std::string> defaults, int64_t dirs) {
  size_t per = defaults.size();
  std::vector<std::string> names;
  if (c.has_attr("activations")) names = c.attr_strings("activations");
  if (names.empty()) {
    for (int64_t d = 0; d < dirs; ++d) names.insert(names.end(), defaults.begin(), defaults.end());
  } else if (names.size() == per && dirs == 2) {
    std::vector<std::string> twice = names;
    names.insert(names.end(), twice.begin(), twice.end());
  }
  c.check(names.size() == per * static_cast<size_t>(dirs), "expected ", per * dirs,
          " activations, got ", names.size());
  auto alphas = c.attr_floats("activation_alpha");
  auto betas = c.attr_floats("activation_beta");
  size_t ia = 0, ib = 0;
  std::vector<Act> out;
  for (const auto& n : names) {
    Act a;
    a.name = n;
    std::transform(a.name.begin(), a.name.end(), a.name.begin(),
                   [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
    double def_a = 0, def_b = 0;
    bool uses_a = false, uses_b = false;
    if (a.name == "affine") {
      uses_a = uses_b = true;
      def_a = 1.0;
    } else if (a.name == "leakyrelu") {
      uses_a = true;
      def_a = 0.01;
    } else if (a.name == "thresholdedrelu" || a.name == "elu") {
      uses_a = true;
      def_a = 1.0;
    } else if (a.name == "scaledtanh") {
      uses_a = uses_b = true;
      def_a = def_b = 1.0;
    } else if (a.name == "hardsigmoid") {
      uses_a = uses_b = true;
      def_a = 0.2;
      def_b = 0.5;
    } else if (a.name != "sigmoid" && a.name != "tanh" && a.name != "relu" &&
               a.name != "softsign" && a.name != "softplus") {
      c.fail("unsupported activation '", n, "'");
    }
    a.alpha = uses_a ? (ia < alphas.size() ? alphas[ia++] : def_a) : 0.0;
    a.beta = uses_b ? (ib < betas.size() ? betas[ib++] : def_b) : 0.0;
    out.push_back(a);
  }
  return out;
}

void rnn_common(OpContext& c, Cell cell) {
  const int64_t G = gates_of(cell);
  at::Tensor x = c.input(0);
  const at::Tensor& w = c.input(1);
  const at::Tensor& r = c.input(2);
  c.check(x.is_floating_point(), "X must be a floating-point tensor");
  c.check(x.dim() == 3, "X must have rank 3, got ", x.dim());
  c.check(w.dim() == 3 && r.dim() == 3, "W and R must have rank 3");
  int64_t layout = c.attr_int("layout", 0);
  c.check(layout == 0 || layout == 1, "layout must be 0 or 1, got ", layout);
  if (layout == 1) x = x.transpose(0, 1);
  const int64_t T = x.size(0), B = x.size(1), I = x.size(2);
  std::string direction = c.attr_string("direction", "forward");
  c.check(direction == "forward" || direction == "reverse" || direction == "bidirectional",
          "unknown direction '", direction, "'");
  const int64_t D = direction == "bidirectional" ? 2 : 1;
  const int64_t H = r.size(2);
  if (c.has_attr("hidden_size"))
    c.check(c.attr_int("hidden_size") == H, "hidden_size ", c.attr_int("hidden_size"),
            " does not match R's last dim ", H);
  c.check(w.size(0) == D && w.size(1) == G * H && w.size(2) == I, "W must have shape [", D, ",",
          G * H, ",", I, "], got ", w.sizes());
  c.check(r.size(0) == D && r.size(1) == G * H, "R must have shape [", D, ",", G * H, ",", H,
          "], got ", r.sizes());
  const auto dt = x.scalar_type();
  auto opts = x.options();
  at::Tensor bias;
  if (c.has_input(3)) {
    bias = c.input(3).to(dt);
    c.check(bias.dim() == 2 && bias.size(0) == D && bias.size(1) == 2 * G * H,
            "B must have shape [", D, ",", 2 * G * H, "], got ", bias.sizes());
  }
  at::Tensor lens;  // [B] int64 on the device, or undefined (all T)
  if (c.has_input(4)) {
    const at::Tensor& sl = c.input(4);
    c.check(sl.numel() == B, "sequence_lens must have ", B, " elements, got ", sl.numel());
    auto v = to_int_vector(sl);
    bool all_full = true;
    for (int64_t l : v) {
      c.check(l >= 0 && l <= T, "sequence_lens value ", l, " out of range [0, ", T, "]");
      all_full = all_full && l == T;
    }
    if (!all_full) lens = sl.reshape({B}).to(x.device(), at::kLong);
  }
  auto state_in = [&](size_t idx, const char* what) {
    at::Tensor s;
    if (c.has_input(idx)) {
      s = c.input(idx).to(dt);
      if (layout == 1 && s.dim() == 3) s = s.transpose(0, 1);
      c.check(s.dim() == 3 && s.size(0) == D && s.size(1) == B && s.size(2) == H, what,
              " has shape ", c.input(idx).sizes(), ", expected num_directions ", D, ", batch ", B,
              ", hidden ", H);
    } else {
      s = at::zeros({D, B, H}, opts);
    }
    return s;
  };
  at::Tensor h0 = state_in(5, "initial_h");
  at::Tensor c0;
  at::Tensor peep;
  if (cell == Cell::kLstm) {
    c0 = state_in(6, "initial_c");
    if (c.has_input(7)) {
      peep = c.input(7).to(dt);
      c.check(peep.dim() == 2 && peep.size(0) == D && peep.size(1) == 3 * H, "P must have shape [",
              D, ",", 3 * H, "], got ", peep.sizes());
    }
  }
  bool has_clip = c.has_attr("clip");
  double clip = c.attr_float("clip", 0.f);
  if (has_clip) c.check(clip > 0, "clip must be positive, got ", clip);
  auto clamp = [&](const at::Tensor& t) { return has_clip ? at::clamp(t, -clip, clip) : t; };
  std::vector<std::string> defaults =
      cell == Cell::kLstm  ? std::vector<std::string>{"Sigmoid", "Tanh", "Tanh"}
      : cell == Cell::kGru ? std::vector<std::string>{"Sigmoid", "Tanh"}
                           : std::vector<std::string>{"Tanh"};
  auto acts = parse_acts(c, defaults, D);
  const size_t per = defaults.size();
  bool linear_before_reset = cell == Cell::kGru && c.attr_int("linear_before_reset", 0) != 0;
  bool input_forget = cell == Cell::kLstm && c.attr_int("input_forget", 0) != 0;

  std::vector<at::Tensor> ys, hs, cs;
  for (int64_t d = 0; d < D; ++d) {
    bool reverse = direction == "reverse" || d == 1;
    const Act* f = &acts[d * per];
    at::Tensor wd = w[d].to(dt), rd = r[d].to(dt);
    // Input projections for all steps at once: [T, B, G*H].
    at::Tensor xw = at::matmul(x, wd.t());
    at::Tensor wb, rb;
    if (bias.defined()) {
      wb = bias[d].narrow(0, 0, G * H);
      rb = bias[d].narrow(0, G * H, G * H);
      xw = xw + wb;
    }
    at::Tensor h = h0[d], cst = cell == Cell::kLstm ? c0[d] : at::Tensor();
    at::Tensor pi, po, pf;
    if (peep.defined()) {
      pi = peep[d].narrow(0, 0, H);
      po = peep[d].narrow(0, H, H);
      pf = peep[d].narrow(0, 2 * H, H);
    }
    std::vector<at::Tensor> outs(static_cast<size_t>(T));
    for (int64_t s = 0; s < T; ++s) {
      int64_t t = reverse ? T - 1 - s : s;
      at::Tensor xt = xw[t];
      at::Tensor h_new, c_new;
      if (cell == Cell::kRnn) {
        at::Tensor pre = xt + at::matmul(h, rd.t());
        if (rb.defined()) pre = pre + rb;
        h_new = f[0](clamp(pre));
      } else if (cell == Cell::kGru) {
        at::Tensor xz = xt.narrow(1, 0, H), xr = xt.narrow(1, H, H), xh = xt.narrow(1, 2 * H, H);
        at::Tensor rzr = rd.narrow(0, 0, 2 * H), rh = rd.narrow(0, 2 * H, H);
        at::Tensor hr = at::matmul(h, rzr.t());
        if (rb.defined()) hr = hr + rb.narrow(0, 0, 2 * H);
        at::Tensor z = f[0](clamp(xz + hr.narrow(1, 0, H)));
        at::Tensor rg = f[0](clamp(xr + hr.narrow(1, H, H)));
        at::Tensor hh;
        if (linear_before_reset) {
          at::Tensor lin = at::matmul(h, rh.t());
          if (rb.defined()) lin = lin + rb.narrow(0, 2 * H, H);
          hh = xh + rg * lin;
        } else {
          hh = xh + at::matmul(rg * h, rh.t());
          if (rb.defined()) hh = hh + rb.narrow(0, 2 * H, H);
        }
        at::Tensor ht = f[1](clamp(hh));
        h_new = (1 - z) * ht + z * h;
      } else {
        at::Tensor g = xt + at::matmul(h, rd.t());
        if (rb.defined()) g = g + rb;
        at::Tensor gi = g.narrow(1, 0, H), go = g.narrow(1, H, H), gf = g.narrow(1, 2 * H, H),
                   gc = g.narrow(1, 3 * H, H);
        if (pi.defined()) {
          gi = gi + pi * cst;
          gf = gf + pf * cst;
        }
        at::Tensor it = f[0](clamp(gi));
        at::Tensor ft = input_forget ? 1 - it : f[0](clamp(gf));
        at::Tensor ct = f[1](clamp(gc));
        c_new = ft * cst + it * ct;
        if (po.defined()) go = go + po * c_new;
        at::Tensor ot = f[0](clamp(go));
        h_new = ot * f[2](c_new);
      }
      if (lens.defined()) {
        // Steps past a sequence's length keep the state and output zeros.
        at::Tensor valid = (lens > t).unsqueeze(1);
        at::Tensor y = at::where(valid, h_new, at::zeros_like(h_new));
        h = at::where(valid, h_new, h);
        if (cell == Cell::kLstm) cst = at::where(valid, c_new, cst);
        outs[static_cast<size_t>(t)] = y;
      } else {
        h = h_new;
        if (cell == Cell::kLstm) cst = c_new;
        outs[static_cast<size_t>(t)] = h_new;
      }
    }
    ys.push_back(T > 0 ? at::stack(outs, 0) : at::zeros({0, B, H}, opts));  // [T, B, H]
    hs.push_back(h);
    if (cell == Cell::kLstm) cs.push_back(cst);
  }
  if (c.wants_output(0)) {
    at::Tensor y = at::stack(ys, 1);  // [T, D, B, H]
    if (layout == 1) y = y.permute({2, 0, 1, 3});
    c.set_output(0, y.contiguous());
  }
  auto state_out = [&](std::vector<at::Tensor>& v) {
    at::Tensor s = at::stack(v, 0);  // [D, B, H]
    if (layout == 1) s = s.transpose(0, 1);
    return s.contiguous();
  };
  if (c.wants_output(1)) c.set_output(1, state_out(hs));
  if (cell == Cell::kLstm && c.wants_output(2)) c.set_output(2, state_out(cs));
}

int64_t rnn_macs_common(const MacContext& m, int64_t gates) {
  if (m.in_shapes.size() < 3) return 0;
  const auto& x = m.in_shapes[0];
  const auto& w = m.in_shapes[1];
  const auto& r = m.in_shapes[2];
  if (x.size() != 3 || w.size() != 3 || r.size() != 3) return 0;
  int64_t seq = x[0], batch = x[1];
  if (m.attr_int("layout", 0) == 1) std::swap(seq, batch);
  int64_t dirs = w[0], input = w[2], hidden = r[2];
  return gates * (input + hidden) * hidden * batch * seq * dirs;
}

void lstm_forward(OpContext& c) { rnn_common(c, Cell::kLstm); }
void gru_forward(OpContext& c) { rnn_common(c, Cell::kGru); }
void rnn_forward(OpContext& c) { rnn_common(c, Cell::kRnn); }
int64_t lstm_macs(const MacContext& m) { return rnn_macs_common(m, 4); }
int64_t gru_macs(const MacContext& m) { return rnn_macs_common(m, 3); }
int64_t rnn_macs(const MacContext& m) { return rnn_macs_common(m, 1); }

}  // namespace

void register_rnn(OpTable& t) {
  t.add({"", "LSTM", lstm_forward, lstm_macs});
  t.add({"", "GRU", gru_forward, gru_macs});
  t.add({"", "RNN", rnn_forward, rnn_macs});
}

}  // namespace lopper::ops
