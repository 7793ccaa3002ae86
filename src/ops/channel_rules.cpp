// Channel rules shared by several op families: broadcasting elementwise ops, ops that keep their
// input's channels, per-channel spatial ops, and reshapes (Flatten after a Conv, heads split out of
// a hidden dimension).
#include <ATen/ATen.h>

#include <map>
#include <numeric>
#include <set>

#include "ops/channels.h"

namespace lopper::ops::channel_rules {

void broadcast(ChannelContext& c) {
  const auto& osh = c.out_shape(0);
  const int64_t rank = int64_t(osh.size());
  int64_t axis = -1;
  std::vector<int64_t> atoms;
  for (size_t i = 0; i < c.num_inputs(); ++i) {
    const Tracked* t = c.in(i);
    if (!t) continue;
    const auto& ish = c.in_shape(i);
    int64_t ax = t->axis + rank - int64_t(ish.size());
    if (ax < 0 || osh[ax] != ish[t->axis]) {  // a tracked axis that is broadcast away
      c.pin(t->atoms, "channels broadcast by " + c.node().op_type);
      continue;
    }
    if (axis < 0) {
      axis = ax, atoms = t->atoms;
    } else if (ax == axis) {
      c.couple(atoms, t->atoms);
    } else {
      c.barrier(c.node().op_type + " mixes two channel axes");
      return;
    }
  }
  if (axis < 0) return;
  for (size_t i = 0; i < c.num_inputs(); ++i) {
    if (!c.has_input(i) || c.in(i)) continue;
    const auto& ish = c.in_shape(i);
    int64_t ax = axis - (rank - int64_t(ish.size()));
    if (ax < 0 || ish[ax] == 1) continue;  // broadcast along the channels
    if (c.constant(i).defined())
      c.slice(i, ax, atoms, ParamRole::kOther);  // a per-channel constant (bias, scale, embedding)
    else
      c.pin(atoms, c.node().op_type + " meets an input whose channels are not tracked");
  }
  c.set_out(0, Tracked{axis, atoms});
}

void same(ChannelContext& c) {
  if (const Tracked* t = c.in(0)) {
    if (c.out_shape(0) != c.in_shape(0)) return c.barrier(c.node().op_type + " changes the shape");
    c.set_out(0, *t);
  }
}

void spatial(ChannelContext& c) {
  const Tracked* t = c.in(0);
  if (!t) return;
  for (size_t i = 1; i < c.num_inputs(); ++i)
    if (c.in(i)) return c.barrier(c.node().op_type + " with channels in a second input");
  if (t->axis != 1 || c.out_shape(0).size() < 2 || c.out_shape(0)[1] != c.in_shape(0)[1])
    return c.barrier(c.node().op_type + " acts across the channel axis");
  c.set_out(0, *t);
}

namespace {

std::vector<int64_t> prefix_products(const std::vector<int64_t>& s) {
  std::vector<int64_t> p(s.size() + 1, 1);
  for (size_t i = 0; i < s.size(); ++i) p[i + 1] = p[i] * s[i];
  return p;
}

}  // namespace

void reshape(ChannelContext& c, int64_t target_input) {
  const Tracked* t = c.in(0);
  if (!t) return;
  const auto& ish = c.in_shape(0);
  const auto& osh = c.out_shape(0);
  const int64_t a = t->axis;
  for (int64_t d : ish)
    if (d == 0) return c.barrier("reshape of an empty tensor");
  auto pin = prefix_products(ish), pout = prefix_products(osh);
  // The smallest run of input axes [i0, i1) around `a` whose elements form a run of output axes
  // [o0, o1) (equal products at both ends).
  int64_t i0 = a, i1 = a + 1;
  auto find_out = [&](int64_t p, bool last) {
    int64_t found = -1;
    for (int64_t k = 0; k <= int64_t(osh.size()); ++k)
      if (pout[k] == p) {
        found = k;
        if (!last) break;
      }
    return found;
  };
  while (i0 > 0 && find_out(pin[i0], true) < 0) --i0;
  while (i1 < int64_t(ish.size()) && find_out(pin[i1], false) < 0) ++i1;
  int64_t o0 = find_out(pin[i0], true), o1 = find_out(pin[i1], false);
  if (o0 < 0 || o1 < 0 || o1 <= o0) return c.barrier("reshape with no matching output axes");
  const int64_t total = pin[i1] / pin[i0];
  const int64_t in_stride = pin[i1] / pin[a + 1];
  const int64_t channels = ish[a];
  auto atom_of = [&](int64_t f) { return t->atoms[(f / in_stride) % channels]; };
  // Candidate output axes: the one whose index decides the atom with the fewest atoms merged
  // (a Flatten block needs none; a head split merges within heads or across them). Whole heads
  // take the outermost axis instead, unless it has 3 or fewer entries (packed q/k/v, k/v).
  int64_t best = -1;
  size_t best_merges = SIZE_MAX;
  int64_t outer = -1;
  for (int64_t k = o0; k < o1; ++k) {
    if (osh[k] <= 1) continue;
    if (outer < 0) outer = k;
    int64_t stride = pout[o1] / pout[k + 1];
    std::set<std::pair<int64_t, int64_t>> pairs;
    for (int64_t f = 0; f < total; ++f) pairs.insert({(f / stride) % osh[k], atom_of(f)});
    size_t merges = pairs.size() - size_t(osh[k]);
    if (merges < best_merges) best = k, best_merges = merges;
  }
  if (c.whole_heads() && outer >= 0 && best_merges > 0 && osh[outer] > 3) best = outer;
  if (best < 0) return c.barrier("reshape drops the channel axis");
  const int64_t n = osh[best], stride = pout[o1] / pout[best + 1];
  std::vector<int64_t> out_atoms(n, -1);
  for (int64_t f = 0; f < total; ++f) {
    int64_t j = (f / stride) % n;
    if (out_atoms[j] < 0)
      out_atoms[j] = atom_of(f);
    else if (out_atoms[j] != atom_of(f))
      c.couple({out_atoms[j]}, {atom_of(f)});
  }
  if (n < channels) c.mark_heads(out_atoms);  // channels grouped into blocks: heads
  if (target_input >= 0) {
    at::Tensor target = c.constant(size_t(target_input));
    const bool computed = !target.defined();
    if (computed) {
      // A target computed from shapes at run time (TorchScript's exports of attention): with
      // static input dims its value is the one seen in the analysis run, so it becomes a
      // constant with the new channel count.
      target = c.recorded(size_t(target_input));
      if (!target.defined() || c.attr_int("allowzero", 0) != 0)
        return c.barrier(c.node().op_type + " to a shape computed at run time");
      c.independent_of(size_t(target_input));
    }
    const int64_t k = best;
    c.edit([k, out_atoms, target_input, target, computed](ChannelEditor& e) {
      at::Tensor shape =
          (computed ? target : e.constant(size_t(target_input))).clone().to(at::kLong);
      auto* p = shape.data_ptr<int64_t>();
      if (p[k] > 0) p[k] = int64_t(e.kept(out_atoms).size());
      e.set_constant(size_t(target_input), shape);
    });
  }
  c.set_out(0, Tracked{best, out_atoms});
}

}  // namespace lopper::ops::channel_rules
