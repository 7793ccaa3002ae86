// bfloat16 <-> float32 for one value, as the kernels inline it (internal). Plain C++, no ATen: the
// per-ISA kernel files include it too.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>

namespace lopper::kernels::cpu {

/// The float a bfloat16's bits stand for (exact).
inline float from_bf16(uint16_t v) { return std::bit_cast<float>(uint32_t(v) << 16); }

/// `v` rounded to the nearest bfloat16, ties to even (as c10::BFloat16 and vcvtneps2bf16); a NaN
/// stays a (quiet) NaN. Branch-free, so that loops over it vectorise.
inline uint16_t to_bf16(float v) {
  const uint32_t u = std::bit_cast<uint32_t>(v);
  return v != v ? uint16_t(0x7FC0) : uint16_t((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

/// The two bfloat16 at p (any alignment) as one 32-bit word, p[0] in the low half: the pair a
/// bfloat16 dot product (vdpbf16ps) multiplies per lane.
inline uint32_t bf16_pair(const uint16_t* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

}  // namespace lopper::kernels::cpu
