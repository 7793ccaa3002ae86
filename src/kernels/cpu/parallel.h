// Work split between the CPU threads, with stealing (internal).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

namespace lopper::kernels::cpu {

/// Runs fn(begin, end) over the items [0, n) on the intra-op threads. Thread t starts on the t-th
/// of equal shares, front to back, as at::parallel_for would split them (what a layer's thread
/// writes, the next layer's same thread reads), `grain` items at a time; a thread whose share is
/// done takes from the back of the share with the most left. As a share empties, the chunks taken
/// from it shrink to half of what is left, down to an eighth of `grain`, so that the threads
/// finish together. A thread slowed by another process on its core, or late to wake, no longer
/// holds up the layer.
/// NOTE: with `grain`-sized chunks to the end, the last chunk (a quarter of a share) left one
/// thread waiting: a bf16 14x14 256 -> 256 3x3 layer spent 11% of its time in the OpenMP barrier
/// and took 592 us; with the shrinking chunks 533 (AMD EPYC Zen 4, 2 threads).
/// Inside a parallel region or a SerialScope, or with one thread or one chunk: fn(0, n) on the
/// caller.
/// NOTE: with at::parallel_for's fixed halves, RegNet's grouped layers left the second thread
/// spinning in the OpenMP barrier for 10% of the run while the first finished its half.
void parallel_steal(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

/// While one is alive on a thread, parallel_steal on that thread runs fn(0, n) itself: for work
/// smaller than what waking the other threads costs (a few microseconds).
class SerialScope {
 public:
  explicit SerialScope(bool serial);
  ~SerialScope();
  SerialScope(const SerialScope&) = delete;
  SerialScope& operator=(const SerialScope&) = delete;

 private:
  bool before_;
};

/// A scratch buffer of the calling thread (slot 0 or 1), at least `floats` long and aligned to 64
/// bytes, that only grows: large per-call allocations would be returned to the system and
/// page-faulted back in on every run, and a vector load that straddles two lines costs two. Its
/// contents are the caller's until the thread's next call for the same slot.
float* thread_scratch(int slot, size_t floats);

/// Chunks a thread's share is cut in: a late thread's work can be taken in quarters (each call sets
/// up again what its items share: eighths cost small layers more than they gained).
constexpr int64_t kStealParts = 4;

/// The grain that cuts `items` into kStealParts chunks a thread (at least one item).
int64_t steal_grain(int64_t items);

}  // namespace lopper::kernels::cpu
