// Control flow: If, Loop, Scan. Bodies run through the executor (OpContext::run_subgraph), which
// resolves names read from enclosing scopes.
#include <algorithm>

#include "lopper/onnx_io.h"
#include "ops/op.h"

namespace lopper::ops {

namespace {

bool truth(const OpContext& c, const at::Tensor& t, const char* what) {
  c.check(t.numel() == 1, what, " must hold one element, got ", t.numel());
  return t.detach().reshape({}).to(at::kCPU).to(at::kBool).item<bool>();
}

// An empty stack of a body output that never ran: [0, declared dims...] when they are known.
at::Tensor empty_stack(const ir::ValueInfo& v, const at::Device& device) {
  std::vector<int64_t> shape = {0};
  at::ScalarType type = at::kFloat;
  if (v.type.is_tensor()) {
    if (v.type.elem_type != ir::DType::kUndefined) {
      try {
        type = onnx::to_scalar_type(v.type.elem_type);
      } catch (const Error&) {
      }
    }
    if (v.type.has_shape) {
      bool ok = true;
      for (const auto& d : v.type.dims) ok &= d.is_static();
      if (ok)
        for (const auto& d : v.type.dims) shape.push_back(d.value);
    }
  }
  return at::empty(shape, at::TensorOptions().dtype(type).device(device));
}

// Scan-8: a batch axis 0 on every input and output, optional sequence_lens (input 0), and one
// direction per scan input. Steps past a batch entry's length leave zeros in the scan outputs.
void scan8(OpContext& c) {
  const ir::Graph& body = c.attr_graph("body");
  int64_t m = c.attr_int("num_scan_inputs");
  int64_t n_in = static_cast<int64_t>(c.num_inputs()) - 1;
  c.check(m >= 1 && m <= n_in, "num_scan_inputs ", m, " out of range");
  int64_t n_state = n_in - m;
  int64_t n_out = static_cast<int64_t>(body.outputs.size()) - n_state;
  c.check(n_out >= 0, "body has too few outputs");
  auto dirs = c.attr_ints("directions", std::vector<int64_t>(m, 0));
  c.check(static_cast<int64_t>(dirs.size()) == m, "directions has the wrong length");
  const at::Tensor& first = c.input(1 + n_state);
  c.check(first.dim() >= 2, "scan inputs need batch and sequence axes");
  int64_t B = first.size(0), T = first.size(1);
  std::vector<int64_t> lens(B, T);
  if (c.has_input(0)) lens = to_int_vector(c.input(0));
  c.check(static_cast<int64_t>(lens.size()) == B, "sequence_lens has the wrong length");
  std::vector<std::vector<at::Tensor>> states(n_state), ys(n_out);
  for (int64_t b = 0; b < B; ++b) {
    c.check(lens[b] >= 0 && lens[b] <= T, "sequence length ", lens[b], " out of range");
    std::vector<at::Tensor> st;
    for (int64_t i = 0; i < n_state; ++i) st.push_back(c.input(1 + i).select(0, b));
    std::vector<std::vector<at::Tensor>> outs_t(n_out);
    for (int64_t t = 0; t < lens[b]; ++t) {
      std::vector<at::Tensor> in = st;
      for (int64_t j = 0; j < m; ++j)
        in.push_back(
            c.input(1 + n_state + j).select(0, b).select(0, dirs[j] ? lens[b] - 1 - t : t));
      auto outs = c.run_subgraph(body, in);
      c.check(static_cast<int64_t>(outs.size()) == n_state + n_out, "body produced ", outs.size(),
              " outputs");
      for (int64_t i = 0; i < n_state; ++i) st[i] = outs[i];
      for (int64_t k = 0; k < n_out; ++k) outs_t[k].push_back(outs[n_state + k]);
    }
    for (int64_t i = 0; i < n_state; ++i) states[i].push_back(st[i]);
    for (int64_t k = 0; k < n_out; ++k) {
      c.check(!outs_t[k].empty(), "a batch entry of length 0 leaves scan output ", k, " unknown");
      at::Tensor y = at::stack(outs_t[k], 0);
      if (lens[b] < T) {
        std::vector<int64_t> pad(2 * (y.dim() - 1), 0);
        pad.push_back(0);
        pad.push_back(T - lens[b]);
        y = at::constant_pad_nd(y, pad, 0);
      }
      ys[k].push_back(y);
    }
  }
  for (int64_t i = 0; i < n_state && i < static_cast<int64_t>(c.num_outputs()); ++i)
    c.set_output(i, at::stack(states[i], 0));
  for (int64_t k = 0; k < n_out && n_state + k < static_cast<int64_t>(c.num_outputs()); ++k)
    c.set_output(n_state + k, at::stack(ys[k], 0));
}

void if_op(OpContext& c) {
  bool cond = truth(c, c.input(0), "cond");
  const ir::Graph& g = c.attr_graph(cond ? "then_branch" : "else_branch");
  auto outs = c.run_subgraph(g, {});
  c.check(outs.size() == c.num_outputs(), "branch '", g.name, "' produced ", outs.size(),
          " outputs, the node names ", c.num_outputs());
  for (size_t i = 0; i < outs.size(); ++i) c.set_output(i, outs[i]);
}

void loop(OpContext& c) {
  const ir::Graph& body = c.attr_graph("body");
  bool has_max = c.has_input(0), has_cond = c.has_input(1);
  int64_t max_trip = has_max ? to_int_vector(c.input(0))[0] : 0;
  bool cond = has_cond ? truth(c, c.input(1), "cond") : true;
  size_t n_carried = c.num_inputs() > 2 ? c.num_inputs() - 2 : 0;
  std::vector<at::Tensor> carried;
  for (size_t i = 0; i < n_carried; ++i) carried.push_back(c.input(2 + i));
  c.check(body.outputs.size() >= 1 + n_carried, "body has ", body.outputs.size(), " outputs for ",
          n_carried, " loop-carried values");
  size_t n_scan = body.outputs.size() - 1 - n_carried;
  c.check(c.num_outputs() <= n_carried + n_scan, "node names more outputs than the body makes");
  std::vector<std::vector<at::Tensor>> scans(n_scan);
  auto lopts = at::TensorOptions().dtype(at::kLong).device(c.device());
  auto bopts = at::TensorOptions().dtype(at::kBool).device(c.device());
  for (int64_t i = 0; (!has_max || i < max_trip) && cond; ++i) {
    std::vector<at::Tensor> in = {at::scalar_tensor(i, lopts), at::scalar_tensor(cond, bopts)};
    in.insert(in.end(), carried.begin(), carried.end());
    auto outs = c.run_subgraph(body, in);
    c.check(outs.size() == 1 + n_carried + n_scan, "body produced ", outs.size(), " outputs");
    cond = truth(c, outs[0], "the body's cond output");
    for (size_t k = 0; k < n_carried; ++k) carried[k] = outs[1 + k];
    for (size_t k = 0; k < n_scan; ++k) scans[k].push_back(outs[1 + n_carried + k]);
  }
  for (size_t k = 0; k < n_carried && k < c.num_outputs(); ++k) c.set_output(k, carried[k]);
  for (size_t k = 0; k < n_scan && n_carried + k < c.num_outputs(); ++k) {
    if (scans[k].empty()) {
      c.set_output(n_carried + k, empty_stack(body.outputs[1 + n_carried + k], c.device()));
      continue;
    }
    for (const auto& s : scans[k])
      c.check(s.sizes() == scans[k][0].sizes(), "scan output ", k,
              " changes shape between iterations");
    c.set_output(n_carried + k, at::stack(scans[k], 0));
  }
}

void scan(OpContext& c) {
  if (c.opset() < 9) return scan8(c);
  const ir::Graph& body = c.attr_graph("body");
  int64_t m = c.attr_int("num_scan_inputs");
  int64_t n_in = static_cast<int64_t>(c.num_inputs());
  c.check(m >= 1 && m <= n_in, "num_scan_inputs ", m, " out of range");
  int64_t n_state = n_in - m;
  int64_t n_out = static_cast<int64_t>(body.outputs.size()) - n_state;
  c.check(n_out >= 0, "body has too few outputs");
  auto in_axes = c.attr_ints("scan_input_axes", std::vector<int64_t>(m, 0));
  auto in_dirs = c.attr_ints("scan_input_directions", std::vector<int64_t>(m, 0));
  auto out_axes = c.attr_ints("scan_output_axes", std::vector<int64_t>(n_out, 0));
  auto out_dirs = c.attr_ints("scan_output_directions", std::vector<int64_t>(n_out, 0));
  c.check(static_cast<int64_t>(in_axes.size()) == m && static_cast<int64_t>(in_dirs.size()) == m &&
              static_cast<int64_t>(out_axes.size()) == n_out &&
              static_cast<int64_t>(out_dirs.size()) == n_out,
          "scan axis/direction attributes have the wrong length");
  std::vector<at::Tensor> state, xs;
  for (int64_t i = 0; i < n_state; ++i) state.push_back(c.input(i));
  int64_t T = -1;
  for (int64_t j = 0; j < m; ++j) {
    const at::Tensor& x = c.input(n_state + j);
    in_axes[j] = normalize_axis(c, in_axes[j], x.dim());
    int64_t len = x.size(in_axes[j]);
    c.check(T < 0 || len == T, "scan inputs differ in length");
    T = len;
    xs.push_back(x);
  }
  std::vector<std::vector<at::Tensor>> ys(n_out);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<at::Tensor> in = state;
    for (int64_t j = 0; j < m; ++j)
      in.push_back(xs[j].select(in_axes[j], in_dirs[j] ? T - 1 - t : t));
    auto outs = c.run_subgraph(body, in);
    c.check(static_cast<int64_t>(outs.size()) == n_state + n_out, "body produced ", outs.size(),
            " outputs");
    for (int64_t i = 0; i < n_state; ++i) state[i] = outs[i];
    for (int64_t k = 0; k < n_out; ++k) ys[k].push_back(outs[n_state + k]);
  }
  for (int64_t i = 0; i < n_state && i < static_cast<int64_t>(c.num_outputs()); ++i)
    c.set_output(i, state[i]);
  for (int64_t k = 0; k < n_out && n_state + k < static_cast<int64_t>(c.num_outputs()); ++k) {
    at::Tensor y;
    if (ys[k].empty()) {
      y = empty_stack(body.outputs[n_state + k], c.device());
    } else {
      if (out_dirs[k]) std::reverse(ys[k].begin(), ys[k].end());
      y = at::stack(ys[k], 0);
    }
    int64_t axis = out_axes[k];
    int64_t r = y.dim();
    c.check(axis >= -r && axis < r, "scan_output_axes entry ", axis, " out of range");
    if (axis < 0) axis += r;
    c.set_output(n_state + k, axis == 0 ? y : y.movedim(0, axis));
  }
}

}  // namespace

void register_control(OpTable& t) {
  t.add({"", "If", if_op});
  t.add({"", "Loop", loop});
  t.add({"", "Scan", scan});
}

}  // namespace lopper::ops
