// lopper's CUDA code (its own kernels, the 2:4 products on the sparse tensor cores, NCCL) is a
// shared library of its own, liblopper_cuda.so, which links libtorch_cuda and through it cuBLAS,
// cuDNN, NCCL ...: 400 MB mapped and 0.18 s at every start of a process that links them. lopper's
// library links the CPU half of libtorch only and loads liblopper_cuda.so when a CUDA device is
// asked for (cuda_available(), lopper::load_cuda()), so a CPU run maps none of it.
//
// NOTE: ATen asks once for its CUDA hooks and keeps the answer: a process that touched CUDA
// (at::manual_seed does) before libtorch_cuda was loaded stays without CUDA. The CLI loads this
// library before it does anything else when its --device names a GPU; the Python package finds
// libtorch_cuda loaded by `import torch`; a program that links lopper::lopper links this library.
//
// This header is shared by both sides: the interface (Library) and the loader (library()) are
// compiled into lopper's library, the implementation into liblopper_cuda.so (library.cpp beside).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

namespace c10d {
class Backend;
class Store;
}  // namespace c10d

namespace lopper::kernels::cuda {

/// A weight packed for one of the GPU products: y [m, n] = x [m, k] . w^T + bias.
class PackedLinear {
 public:
  virtual ~PackedLinear() = default;
  /// x on the weight's device in its dtype.
  virtual at::Tensor linear(const at::Tensor& x) const = 0;
};

/// The two ways to the sparse tensor cores behind ATen.
enum class SemiBackend { kCusparselt, kCutlass };

inline const char* semi_name(SemiBackend b) {
  return b == SemiBackend::kCusparselt ? "cuda-2:4-cusparselt" : "cuda-2:4-cutlass";
}

/// What liblopper_cuda.so gives lopper's library. Every tensor is a CUDA tensor unless named.
class Library {
 public:
  virtual ~Library() = default;

  virtual void synchronize() const = 0;
  /// "GPU <name> sm_<major><minor>" of device `index` (-1: the current one).
  virtual std::string device_name(int index) const = 0;
  /// True when lopper's own kernels (sparse GEMV, max pooling) were compiled (nvcc found).
  virtual bool kernels_built() const = 0;

  /// lopper's unstructured-sparse product (CSR, 16-bit column indices), for up to kMaxRows rows
  /// a launch: w [n, k] (any device) fits when 2-D floating point with k <= 65536.
  virtual bool sparse_fits(const at::Tensor& w) const = 0;
  virtual std::shared_ptr<PackedLinear> pack_sparse(const at::Tensor& w, const at::Tensor& bias,
                                                    at::ScalarType dtype,
                                                    at::Device device) const = 0;

  /// The 2:4 products: w [n, k] (any device) with at most 2 nonzeros in every 4 inputs.
  virtual bool is_two_four(const at::Tensor& w) const = 0;
  /// 2:4, fp16/bf16 and inputs a multiple of 64.
  virtual bool semi_fits(const at::Tensor& w, at::ScalarType dtype) const = 0;
  /// True when the linked libtorch has the backend.
  virtual bool semi_compiled(SemiBackend b) const = 0;
  /// Throws lopper::Error when the weight does not fit or the backend refuses it.
  virtual std::shared_ptr<PackedLinear> pack_semi(SemiBackend b, const at::Tensor& w,
                                                  const at::Tensor& bias, at::ScalarType dtype,
                                                  at::Device device) const = 0;

  /// lopper's 2-D max pooling (values only): x dense 4-D fp32/fp16/bf16, NCHW or NHWC.
  virtual bool max_pool2d_fits(const at::Tensor& x) const = 0;
  virtual at::Tensor max_pool2d(const at::Tensor& x, at::IntArrayRef kernel, at::IntArrayRef stride,
                                at::IntArrayRef pad_begin, at::IntArrayRef dilation,
                                at::IntArrayRef out_size) const = 0;

  /// NCCL for data parallel: checks that this build's nccl.h is libtorch's and that GPU `index`
  /// (-1: the current one) exists; returns its index. `me` and `device` name the rank and the
  /// device in the errors.
  virtual long nccl_device(const std::string& me, const std::string& device, long index) const = 0;
  /// A ProcessGroupNCCL on GPU `index` over `store`.
  virtual c10::intrusive_ptr<c10d::Backend> nccl_backend(
      const c10::intrusive_ptr<c10d::Store>& store, int rank, int world,
      std::chrono::milliseconds timeout, long index) const = 0;
};

/// Bumped whenever Library changes: a liblopper_cuda.so of another build is refused.
constexpr int kLibraryAbi = 1;

/// liblopper_cuda.so, loaded on the first call (thread-safe, once): nullptr when it cannot be
/// loaded (load_error() says why). Looked for at $LOPPER_CUDA_LIBRARY, among the loaded objects,
/// beside the executable or shared object lopper's library is in, in ../lib from there, where
/// this build wrote it, and on the library search path.
const Library* library();
/// Why library() returned nullptr ("" when it did not).
std::string load_error();
/// library(), or a lopper::Error naming why it could not be loaded.
const Library& need_library();

}  // namespace lopper::kernels::cuda

/// liblopper_cuda.so's one entry point: its Library when built for `abi`, else nullptr.
extern "C" const lopper::kernels::cuda::Library* lopper_cuda_library(int abi);
