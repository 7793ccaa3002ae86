// oneDNN's convolution and matrix-product primitives called directly: made once per layer, run with
// a handful of C calls. libtorch carries oneDNN inside, reachable only through ATen's mkldnn ops,
// which build a descriptor, hash it and look the primitive up in a cache at every call: 23-27 us a
// call on top of the primitive's own time (AMD EPYC Zen 4, 2 threads, bf16; a 14x14 384->64 1x1
// layer took 47 us through ATen and 24 us here), as much as a small layer's arithmetic.
//
// The library is the PyPI wheel onednn-cpu-gomp (oneDNN 3.2 built on GNU OpenMP: it shares the
// libgomp libtorch loaded, so one thread pool), loaded when first asked for: without it lopper runs
// as before (available() says why not). This code includes that wheel's headers only, never
// libtorch's (a different oneDNN version), and speaks of tensors by pointer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace lopper::dnnl {

/// Whether oneDNN's library is loaded (the first call tries): the path in LOPPER_DNNL_LIBRARY
/// ("off": never), the build's venv, the venv beside libtorch's libgomp, the loader's search path.
bool available();
/// Why available() is false ("" when it is true).
std::string unavailable_reason();

/// An activation inside the primitive (one that keeps a NaN a NaN; see ops/onednn).
enum class Eltwise { kNone, kLeakyRelu, kLogistic, kTanh, kGeluErf, kGeluTanh, kHardswish, kSwish };

struct ConvSpec {
  int64_t n = 1, c = 0, h = 0, w = 0;  // input, channels-last (NHWC in memory)
  int64_t k = 0, kh = 1, kw = 1;       // outputs and kernel
  int64_t sh = 1, sw = 1, ph = 0, pw = 0, dh = 1, dw = 1, groups = 1;
  bool bf16 = false;      // input, weight, bias, residual and output all bf16 (else float32)
  bool bias = false;      // a bias [k]
  bool residual = false;  // y = act(conv + bias + residual), the residual y's shape, channels-last
  Eltwise act = Eltwise::kNone;
  float alpha = 0.f;  // kLeakyRelu's slope
  int64_t out_h() const { return (h + 2 * ph - dh * (kh - 1) - 1) / sh + 1; }
  int64_t out_w() const { return (w + 2 * pw - dw * (kw - 1) - 1) / sw + 1; }
};

/// One layer's primitive and its weights, reordered once into the layout the primitive reads.
/// run() may be called from several threads at once (each call its own memory objects, stream and
/// scratchpad).
class Conv {
 public:
  /// `weight` [k, c / groups, kh, kw] contiguous, `bias` [k], in the spec's type. Throws
  /// std::runtime_error naming the problem where oneDNN makes no primitive for the spec.
  Conv(const ConvSpec& spec, const void* weight, const void* bias);
  ~Conv();
  Conv(const Conv&) = delete;
  Conv& operator=(const Conv&) = delete;

  const ConvSpec& spec() const { return spec_; }
  /// The bytes of scratch memory run() needs.
  size_t scratchpad_bytes() const;
  /// oneDNN's name for the implementation it picked (e.g. "brgconv_1x1:avx512_core_amx").
  const std::string& implementation() const { return impl_; }
  /// y (the spec's output, channels-last) = act(conv(x) + bias + residual); residual null unless
  /// the spec has one; scratch scratchpad_bytes() long.
  void run(const void* x, const void* residual, void* y, void* scratch) const;

 private:
  struct Impl;
  ConvSpec spec_;
  std::string impl_;
  std::unique_ptr<Impl> p_;
};

struct LinearSpec {
  int64_t m = 0, k = 0, n = 0;  // y [m, n] = x [m, k] . w^T, w [n, k]
  bool bf16 = false;            // x, w, bias and y all bf16 (else float32)
  bool bias = false;            // a bias [n]
  Eltwise act = Eltwise::kNone;
  float alpha = 0.f;
};

/// A linear layer's matrix-product primitive for one row count, its weight reordered once.
class Linear {
 public:
  /// `weight` [n, k] contiguous, `bias` [n], in the spec's type; throws as Conv's does.
  Linear(const LinearSpec& spec, const void* weight, const void* bias);
  ~Linear();
  Linear(const Linear&) = delete;
  Linear& operator=(const Linear&) = delete;

  const LinearSpec& spec() const { return spec_; }
  size_t scratchpad_bytes() const;
  const std::string& implementation() const { return impl_; }
  /// y [m, n] (rows contiguous) = act(x [m, k] . w^T + bias).
  void run(const void* x, void* y, void* scratch) const;

 private:
  struct Impl;
  LinearSpec spec_;
  std::string impl_;
  std::unique_ptr<Impl> p_;
};

struct AttentionSpec {
  int64_t heads = 0, sq = 0, sk = 0, d = 0, dv = 0;
  bool bf16 = false;  // Q, K, V, the probabilities and y bf16 (else float32); scores float32
  bool operator==(const AttentionSpec&) const = default;
};

/// An attention's two products for one shape, as batched matrix-product primitives over the heads:
/// scores = Q . K^T and y = P . V, with Q [sq, heads, d], K [sk, heads, d], V [sk, heads, dv] and
/// y [sq, heads, dv] packed (a row's heads side by side, the layout oneDNN's brgemm kernels take,
/// AMX's where the CPU has it), scores [heads, sq, sk] float32 and P [heads, sq, sk] in the spec's
/// type. The softmax between is the caller's. run calls may come from several threads at once.
class AttentionProducts {
 public:
  /// Throws std::runtime_error naming the problem where oneDNN makes no primitive for the spec.
  explicit AttentionProducts(const AttentionSpec& spec);
  ~AttentionProducts();
  AttentionProducts(const AttentionProducts&) = delete;
  AttentionProducts& operator=(const AttentionProducts&) = delete;

  const AttentionSpec& spec() const { return spec_; }
  /// The bytes of scratch memory either product needs.
  size_t scratchpad_bytes() const;
  /// oneDNN's names for the two implementations, "scores / output".
  const std::string& implementation() const { return impl_; }
  void scores(const void* q, const void* k, float* scores, void* scratch) const;
  void output(const void* p, const void* v, void* y, void* scratch) const;

 private:
  struct Impl;
  AttentionSpec spec_;
  std::string impl_;
  std::unique_ptr<Impl> p_;
};

}  // namespace lopper::dnnl
