// Channel rules shared by several op families: broadcasting elementwise ops, ops that keep their
// input's channels, per-channel spatial ops, and reshapes (Flatten after a Conv, heads split out of
// a hidden dimension).
#include <ATen/ATen.h>

#include <algorithm>
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

// How many times each atom appears in `atoms`.
std::map<int64_t, int64_t> counts(const std::vector<int64_t>& atoms) {
  std::map<int64_t, int64_t> m;
  for (int64_t a : atoms) ++m[a];
  return m;
}

// A Reshape whose target is computed at run time (ShapeEntry): the channels land on output axis
// k with `out_atoms`; `in_axis` is the input's tracked axis. The target follows when its entry k
// is a constant's element (rewritten to the kept count), -1 (inferred), or a channel count that
// equals the kept count by itself (Shape(x)[2] * Shape(x)[3]), and no other entry depends on a
// channel count or copies the tracked input axis (a 0). Records the edit and returns "" then;
// otherwise what stops it.
std::string follow_target(ChannelContext& c, size_t ti, const std::vector<ShapeEntry>& entries,
                          int64_t k, const std::vector<int64_t>& out_atoms, int64_t in_axis) {
  using Kind = ShapeEntry::Kind;
  const auto& osh = c.out_shape(0);
  if (entries.size() != osh.size()) return "its length is not the output's rank";
  const bool allowzero = c.attr_int("allowzero", 0) != 0;
  for (size_t j = 0; j < entries.size(); ++j) {
    const ShapeEntry& e = entries[j];
    const std::string at = "its entry " + std::to_string(j) + " ";
    if (e.kind == Kind::kOther) return at + "is not followed: " + e.why;
    if (e.kind == Kind::kLiteral && e.value == 0 && !allowzero && int64_t(j) == in_axis)
      return at + "copies the input's channel axis (0)";
    if (int64_t(j) != k) {
      if (e.kind == Kind::kChannels) return at + "follows a channel count on an axis without one";
      continue;
    }
    if (e.kind == Kind::kLiteral && (e.value == -1 || e.value == osh[k])) continue;
    if (e.kind != Kind::kChannels) return at + "(the channels) is a size computed at run time";
    // num / den * (kept of e.atoms) == kept of out_atoms for any removal: atom by atom.
    auto want = counts(out_atoms), have = counts(e.atoms);
    for (const auto& [a, m] : want)
      if (have[a] * e.num != m * e.den) return at + "counts other channels than the axis holds";
    for (const auto& [a, m] : have)
      if (m > 0 && !want.count(a)) return at + "counts other channels than the axis holds";
  }
  const ShapeEntry& e = entries[k];
  if (e.kind == Kind::kLiteral && e.value > 0)
    c.edit([ti, e, out_atoms](ChannelEditor& ed) {
      const int64_t kept = int64_t(ed.kept(out_atoms).size());
      if (kept != int64_t(out_atoms.size())) ed.set_shape_entry(ti, e, kept);
    });
  c.independent_of(ti);  // what follows the channels does so by itself
  return "";
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
  // take the outermost axis instead when it has more than 3 entries (3 or fewer: packed q/k/v,
  // k/v), or when what each of its entries holds is the head_dim of an earlier head split
  // (grouped-query attention: 2 key/value heads of the query heads' head_dim).
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
  const int64_t per_outer = outer >= 0 ? pout[o1] / pout[outer + 1] : 0;
  if (c.whole_heads() && outer >= 0 && best_merges > 0 &&
      (osh[outer] > 3 || c.head_dim_seen(per_outer)))
    best = outer;
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
  // Channels grouped into blocks: heads (of `stride` features when whole heads were taken).
  if (n < channels) c.mark_heads(out_atoms, best == outer ? stride : 0);
  if (target_input >= 0) {
    const size_t ti = size_t(target_input);
    const int64_t k = best;
    at::Tensor target = c.constant(ti);
    if (target.defined()) {
      c.edit([k, out_atoms, ti](ChannelEditor& e) {
        at::Tensor shape = e.constant(ti).clone().to(at::kLong);
        auto* p = shape.data_ptr<int64_t>();
        if (p[k] > 0) p[k] = int64_t(e.kept(out_atoms).size());
        e.set_constant(ti, shape);
      });
    } else {
      // A target computed at run time (TorchScript's and torch.export's attention): followed
      // entry by entry; failing that, with static input dims its value is the one seen in the
      // analysis run, so it becomes a constant with the new channel count.
      const std::vector<ShapeEntry>* entries = c.shape_entries(ti);
      std::string why = entries ? follow_target(c, ti, *entries, k, out_atoms, a)
                                : "it is not a shape lopper can read";
      if (!why.empty()) {
        target = c.recorded(ti);
        const std::string barrier = c.node().op_type + " to a shape computed at run time (" + why;
        if (!target.defined())
          return c.barrier(barrier +
                           "); export the model with static input shapes to prune across it");
        if (c.attr_int("allowzero", 0) != 0) return c.barrier(barrier + ", and allowzero is set)");
        c.independent_of(ti);
        c.edit([k, out_atoms, ti, target](ChannelEditor& e) {
          at::Tensor shape = target.clone().to(at::kLong);
          auto* p = shape.data_ptr<int64_t>();
          if (p[k] > 0) p[k] = int64_t(e.kept(out_atoms).size());
          e.set_constant(ti, shape);
        });
      }
    }
  }
  c.set_out(0, Tracked{best, out_atoms});
}

}  // namespace lopper::ops::channel_rules

namespace lopper::ops::shape_rules {

using Entries = std::vector<ShapeEntry>;
using Kind = ShapeEntry::Kind;

Entries via(Entries e, size_t hop) {
  for (auto& x : e)
    if (x.kind == Kind::kLiteral) x.hops.insert(x.hops.begin(), hop);
  return e;
}

ShapeEntry other(std::vector<int64_t> atoms, std::string why) {
  ShapeEntry e;
  e.kind = Kind::kOther, e.atoms = std::move(atoms), e.why = std::move(why);
  return e;
}

std::optional<Entries> same(const ShapeArithContext& c) {
  auto e = c.entries(0);
  if (!e || int64_t(e->size()) != c.out_numel(0)) return std::nullopt;
  return via(std::move(*e), 0);
}

namespace {

// a (op) b for one entry each: Mul, Div, Add, Sub.
ShapeEntry combine(const std::string& op, const ShapeEntry& a, const ShapeEntry& b,
                   const std::string& where) {
  const bool ca = a.kind == Kind::kChannels, cb = b.kind == Kind::kChannels;
  std::vector<int64_t> atoms = a.atoms;
  atoms.insert(atoms.end(), b.atoms.begin(), b.atoms.end());
  if (a.kind == Kind::kOther || b.kind == Kind::kOther) {
    ShapeEntry r = a.kind == Kind::kOther ? a : b;
    r.atoms = atoms;
    return r;
  }
  const std::string mixed = "it is " + op + " of channel counts at node '" + where + "'";
  ShapeEntry r;
  if (ca || cb) {
    if (ca && cb) return other(atoms, mixed);
    const ShapeEntry& ch = ca ? a : b;
    const int64_t v = ca ? b.value : a.value;
    r = ch;
    if (op == "Mul" && v > 0) {
      r.num *= v, r.value *= v;
    } else if (op == "Div" && ca && v > 0 && ch.value % v == 0) {
      r.den *= v, r.value /= v;
    } else {
      return other(atoms, mixed);
    }
    const int64_t d = std::gcd(r.num, r.den);
    r.num /= d, r.den /= d;
    return r;
  }
  r.kind = a.kind == Kind::kDim || b.kind == Kind::kDim ? Kind::kDim : Kind::kConstant;
  if (op == "Mul") {
    r.value = a.value * b.value;
  } else if (op == "Add") {
    r.value = a.value + b.value;
  } else if (op == "Sub") {
    r.value = a.value - b.value;
  } else {
    if (b.value == 0) return other({}, "it divides by zero at node '" + where + "'");
    r.value = a.value / b.value;
  }
  return r;
}

}  // namespace

std::optional<Entries> arithmetic(const ShapeArithContext& c) {
  if (c.num_inputs() != 2) return std::nullopt;
  auto a = c.entries(0), b = c.entries(1);
  if (!a || !b || a->empty() || b->empty()) return std::nullopt;
  const size_t len = std::max(a->size(), b->size());
  if ((a->size() != len && a->size() != 1) || (b->size() != len && b->size() != 1) ||
      int64_t(len) != c.out_numel(0))
    return std::nullopt;
  Entries out;
  for (size_t i = 0; i < len; ++i)
    out.push_back(combine(c.node().op_type, (*a)[a->size() == 1 ? 0 : i],
                          (*b)[b->size() == 1 ? 0 : i], c.node().label()));
  return out;
}

}  // namespace lopper::ops::shape_rules
