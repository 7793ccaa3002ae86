// liblopper_cuda.so's entry point: the Library of library.h over this folder's kernels and ATen's
// CUDA products, and the NCCL process group for data parallel (src/train/distributed.cpp).
#include "kernels/cuda/library.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAFunctions.h>

// NOTE: ProcessGroupNCCL::Options holds NCCL's ncclConfig_t by value, whose size changes between
// NCCL versions: this file must see the nccl.h the wheel was built with (its pinned nvidia-nccl
// package, put first on the include path by CMakeLists.txt); nccl_device() verifies it.
#if defined(USE_C10D_NCCL)
#define LOPPER_HAVE_NCCL 1
#include <torch/csrc/cuda/nccl.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <cstdlib>

#include "kernels/cuda/pool_cuda.h"
#include "kernels/cuda/semi_structured.h"
#include "kernels/cuda/sparse_cuda.h"
#include "lopper/error.h"

namespace lopper::kernels::cuda {
namespace {

class CudaLibrary final : public Library {
 public:
  void synchronize() const override { cuda::synchronize(); }
  std::string device_name(int index) const override { return cuda::device_name(index); }
  bool kernels_built() const override { return built(); }

  bool sparse_fits(const at::Tensor& w) const override { return SparseWeightCuda::fits(w); }
  std::shared_ptr<PackedLinear> pack_sparse(const at::Tensor& w, const at::Tensor& bias,
                                            at::ScalarType dtype,
                                            at::Device device) const override {
    return std::make_shared<SparseWeightCuda>(w, bias, dtype, device);
  }

  bool is_two_four(const at::Tensor& w) const override { return cuda::is_two_four(w); }
  bool semi_fits(const at::Tensor& w, at::ScalarType dtype) const override {
    return cuda::semi_fits(w, dtype);
  }
  bool semi_compiled(SemiBackend b) const override { return cuda::semi_compiled(b); }
  std::shared_ptr<PackedLinear> pack_semi(SemiBackend b, const at::Tensor& w,
                                          const at::Tensor& bias, at::ScalarType dtype,
                                          at::Device device) const override {
    return std::make_shared<SemiStructuredWeight>(b, w, bias, dtype, device);
  }

  bool max_pool2d_fits(const at::Tensor& x) const override { return cuda::max_pool2d_fits(x); }
  at::Tensor max_pool2d(const at::Tensor& x, at::IntArrayRef kernel, at::IntArrayRef stride,
                        at::IntArrayRef pad_begin, at::IntArrayRef dilation,
                        at::IntArrayRef out_size) const override {
    return cuda::max_pool2d(x, kernel, stride, pad_begin, dilation, out_size);
  }

  long nccl_device(const std::string& me, const std::string& device, long index) const override {
#ifdef LOPPER_HAVE_NCCL
    // The wheel's torch::cuda::nccl::version() is the nccl.h it was compiled with (a constant).
    const uint64_t ours = (uint64_t(NCCL_MAJOR) << 32) | (uint64_t(NCCL_MINOR) << 16) | NCCL_PATCH;
    const uint64_t wheel = torch::cuda::nccl::version();
    LOPPER_CHECK(ours == wheel, me, "lopper was compiled against nccl.h ", NCCL_MAJOR, ".",
                 NCCL_MINOR, ".", NCCL_PATCH, " but libtorch against ", wheel >> 32, ".",
                 (wheel >> 16) & 0xffff, ".", wheel & 0xffff,
                 ": rebuild with the torch wheel's nvidia-nccl headers first on the include path");
    LOPPER_CHECK(at::cuda::is_available(), me, "device '", device,
                 "' needs NCCL on a GPU, but CUDA is unavailable (no GPU or driver)");
    const long count = long(c10::cuda::device_count());
    if (index < 0) index = long(c10::cuda::current_device());
    LOPPER_CHECK(index < count, me, "device '", device, "' does not exist: ", count,
                 " GPU(s) visible");
    return index;
#else
    throw Error(detail::concat(me, "device '", device,
                               "' needs NCCL, but the linked libtorch was built without it"));
#endif
  }

  c10::intrusive_ptr<c10d::Backend> nccl_backend(const c10::intrusive_ptr<c10d::Store>& store,
                                                 int rank, int world,
                                                 std::chrono::milliseconds timeout,
                                                 long index) const override {
#ifdef LOPPER_HAVE_NCCL
    c10::cuda::set_device(c10::DeviceIndex(index));
    // NOTE: without blocking wait, NCCL's watchdog handles a timed-out or failed collective by
    // aborting the whole process; with it, wait() throws here and the error is ours to report. A
    // value the user set is kept.
    ::setenv("TORCH_NCCL_BLOCKING_WAIT", "1", 0);
    auto opts = c10d::ProcessGroupNCCL::Options::create();
    opts->timeout = timeout;
    return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, world, opts);
#else
    throw Error("[dist] the linked libtorch was built without NCCL");
#endif
  }
};

}  // namespace
}  // namespace lopper::kernels::cuda

extern "C" __attribute__((visibility("default"))) const lopper::kernels::cuda::Library*
lopper_cuda_library(int abi) {
  static const lopper::kernels::cuda::CudaLibrary library;
  return abi == lopper::kernels::cuda::kLibraryAbi ? &library : nullptr;
}
