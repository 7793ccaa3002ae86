// The fused output stage of lopper's CPU kernels (internal; plain C++, shared by every ISA's
// tables).
#pragma once

namespace lopper::kernels::cpu {

/// Fused output stage: y = act(acc + bias[n]).
/// kHardSwish: x * clamp(x / 6 + 1/2, 0, 1) (ONNX HardSwish); kHardSigmoid: clamp(alpha * x +
/// beta, 0, 1); kSigmoid: 1 / (1 + e^-x); kSilu: x * sigmoid(x) (Mul(x, Sigmoid(x)), SiLU/swish);
/// kGelu: x / 2 * (1 + erf(x / sqrt(2))) (ONNX Gelu, approximate "none"; BERT's FFN).
struct Epilogue {
  enum Act : int {
    kNone = 0,
    kRelu = 1,
    kClip = 2,
    kLeaky = 3,
    kHardSwish = 4,
    kHardSigmoid = 5,
    kSigmoid = 6,
    kSilu = 7,
    kGelu = 8
  };
  const float* bias = nullptr;  // [n] or null
  int act = kNone;
  float lo = 0, hi = 0, alpha = 0, beta = 0;  // kClip bounds, kLeaky slope, kHardSigmoid's line
};

}  // namespace lopper::kernels::cpu
