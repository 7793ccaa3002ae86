// The fused output stage of lopper's CPU kernels (internal; plain C++, shared by every ISA's
// tables).
#pragma once

namespace lopper::kernels::cpu {

/// Fused output stage: y = act(acc + bias[n]).
struct Epilogue {
  enum Act : int { kNone = 0, kRelu = 1, kClip = 2, kLeaky = 3 };
  const float* bias = nullptr;  // [n] or null
  int act = kNone;
  float lo = 0, hi = 0, alpha = 0;  // kClip bounds, kLeaky slope
};

}  // namespace lopper::kernels::cpu
