#include "kernels/cpu/parallel.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <vector>

namespace lopper::kernels::cpu {
namespace {

// A share of items [front, back) in one word: the owner takes `grain` from the front and thieves
// from the back with compare-and-swap, so the two never take the same item.
struct alignas(64) Share {
  std::atomic<uint64_t> bounds{0};
};

uint64_t pack(uint64_t front, uint64_t back) { return front | back << 32; }

// Takes up to `grain` items from the front (or back) of s into [*begin, *end), fewer as the share
// empties (half of what is left, down to an eighth of `grain`); false when none is left.
bool take(Share& s, bool front, int64_t grain, int64_t* begin, int64_t* end) {
  uint64_t old = s.bounds.load(std::memory_order_relaxed);
  const uint64_t full = static_cast<uint64_t>(grain), least = std::max<uint64_t>(1, full / 8);
  for (;;) {
    const uint64_t f = old & 0xffffffffu, b = old >> 32;
    if (f >= b) return false;
    const uint64_t g = std::min(full, std::max(least, (b - f + 1) / 2));
    const uint64_t cut = front ? std::min(b, f + g) : (b - f > g ? b - g : f);
    const uint64_t now = front ? pack(cut, b) : pack(f, cut);
    if (s.bounds.compare_exchange_weak(old, now, std::memory_order_acq_rel)) {
      *begin = static_cast<int64_t>(front ? f : cut);
      *end = static_cast<int64_t>(front ? cut : b);
      return true;
    }
  }
}

thread_local bool serial_here = false;

}  // namespace

SerialScope::SerialScope(bool serial) : before_(serial_here) { serial_here = before_ || serial; }
SerialScope::~SerialScope() { serial_here = before_; }

int64_t steal_grain(int64_t items) {
  return std::max<int64_t>(1, items / (kStealParts * at::get_num_threads()));
}

void parallel_steal(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  const int64_t threads =
      std::min<int64_t>(at::get_num_threads(), (n + grain - 1) / grain);  // a chunk or more each
  if (threads <= 1 || serial_here || n > int64_t{0xffffffff} || at::in_parallel_region()) {
    fn(0, n);
    return;
  }
  std::unique_ptr<Share[]> shares(new Share[static_cast<size_t>(threads)]);
  for (int64_t t = 0; t < threads; ++t)
    shares[t].bounds.store(
        pack(static_cast<uint64_t>(n * t / threads), static_cast<uint64_t>(n * (t + 1) / threads)));
  at::parallel_for(0, threads, 1, [&](int64_t t0, int64_t t1) {
    int64_t b = 0, e = 0;
    for (int64_t t = t0; t < t1; ++t)
      while (take(shares[t], true, grain, &b, &e)) fn(b, e);
    for (;;) {  // the share with the most left, from its back
      int64_t victim = -1, most = 0;
      for (int64_t v = 0; v < threads; ++v) {
        const uint64_t w = shares[v].bounds.load(std::memory_order_relaxed);
        const int64_t left = static_cast<int64_t>(w >> 32) - static_cast<int64_t>(w & 0xffffffffu);
        if (left > most) most = left, victim = v;
      }
      if (victim < 0) return;
      if (take(shares[victim], false, grain, &b, &e)) fn(b, e);
    }
  });
}

float* thread_scratch(int slot, size_t floats) {
  thread_local std::vector<float> bufs[2];
  auto& b = bufs[slot];
  if (b.size() < floats + 16) b.resize(floats + 16);
  const auto addr = reinterpret_cast<uintptr_t>(b.data());
  return b.data() + ((64 - addr % 64) % 64) / sizeof(float);
}

}  // namespace lopper::kernels::cpu
