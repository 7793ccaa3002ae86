#include "exec/allocator.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <malloc.h>

#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "lopper/memory.h"

namespace lopper::exec {
namespace {

constexpr size_t kAlignment = 64;                    // what ATen's own CPU allocator guarantees
constexpr size_t kMinCached = size_t(64) << 10;      // smaller blocks: malloc is fine
constexpr size_t kMaxCachedTotal = size_t(4) << 30;  // never hold more than this unused
constexpr size_t kMaxSlack = 2;                      // a block serves sizes down to half its own

class CachingCpuAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    void* p = nullptr;
    if (n >= kMinCached) {
      n = (n + 4095) / 4096 * 4096;
      std::lock_guard<std::mutex> lock(mu_);
      // The most recently freed block of n to kMaxSlack * n bytes: still in the caches.
      auto best = free_.end();
      for (auto it = free_.lower_bound(n); it != free_.end() && it->first <= n * kMaxSlack; ++it)
        if (!it->second.empty() &&
            (best == free_.end() || it->second.back().stamp > best->second.back().stamp))
          best = it;
      if (best != free_.end()) {
        p = best->second.back().p;
        best->second.pop_back();
        n = best->first;
        cached_ -= n;
      }
    }
    if (!p && n > 0) {
      if (posix_memalign(&p, kAlignment, n) != 0) throw OutOfMemory(n);
    }
    if (n >= kMinCached) {
      std::lock_guard<std::mutex> lock(mu_);
      size_of_[p] = n;
    }
    return {p, p, &CachingCpuAllocator::release, c10::Device(c10::DeviceType::CPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &CachingCpuAllocator::release; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

  // Frees every cached block.
  void empty() {
    std::vector<void*> blocks;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& [n, ps] : free_)
        for (const Block& b : ps) blocks.push_back(b.p);
      free_.clear();
      cached_ = 0;
    }
    for (void* p : blocks) std::free(p);
    // glibc keeps freed heap memory in its arenas (blocks under its mmap threshold, which grows
    // to 32 MiB as large blocks are freed): hand what it can back too.
    malloc_trim(0);
  }

  static CachingCpuAllocator& instance() {
    static CachingCpuAllocator* a = new CachingCpuAllocator();  // outlives every tensor
    return *a;
  }

 private:
  static void release(void* p) {
    if (!p) return;
    auto& self = instance();
    {
      std::lock_guard<std::mutex> lock(self.mu_);
      auto it = self.size_of_.find(p);
      if (it != self.size_of_.end()) {
        size_t n = it->second;
        self.size_of_.erase(it);
        if (self.cached_ + n <= kMaxCachedTotal) {
          self.free_[n].push_back({p, ++self.stamp_});
          self.cached_ += n;
          return;
        }
      }
    }
    std::free(p);
  }

  struct Block {
    void* p;
    uint64_t stamp;  // when it was freed
  };
  std::mutex mu_;
  std::map<size_t, std::vector<Block>> free_;  // size -> unused blocks, the last freed last
  uint64_t stamp_ = 0;
  std::unordered_map<void*, size_t> size_of_;  // live cached-size blocks
  size_t cached_ = 0;
};

}  // namespace

void install_caching_cpu_allocator() {
  static std::once_flag once;
  std::call_once(once, [] { c10::SetCPUAllocator(&CachingCpuAllocator::instance(), 1); });
}

void empty_cpu_cache() { CachingCpuAllocator::instance().empty(); }

}  // namespace lopper::exec
