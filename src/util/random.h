// Seed mixing shared by everything that derives a generator's seed from (seed, counter).
#pragma once

#include <cstdint>

namespace lopper {

/// splitmix64's finaliser: spreads every bit of `z` over the result, so that nearby inputs give
/// unrelated seeds (ATen's CPU generator keeps only the low 32 bits of a seed).
inline uint64_t splitmix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

}  // namespace lopper
