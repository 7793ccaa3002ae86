#include "kernels/cuda/sparse_cuda.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>

#include "kernels/cuda/sparse_gemv.h"
#include "lopper/error.h"

namespace lopper::kernels::cuda {

void synchronize() { c10::cuda::device_synchronize(); }

std::string device_name(int index) {
  const cudaDeviceProp* p = at::cuda::getDeviceProperties(index < 0 ? c10::cuda::current_device()
                                                                    : c10::DeviceIndex(index));
  return detail::concat("GPU ", p->name, " sm_", p->major, p->minor);
}

bool SparseWeightCuda::fits(const at::Tensor& w) {
  return w.dim() == 2 && w.size(1) <= 65536 && w.is_floating_point();
}

SparseWeightCuda::SparseWeightCuda(const at::Tensor& w, const at::Tensor& bias,
                                   at::ScalarType dtype, at::Device device)
    : dtype_(dtype) {
  LOPPER_CHECK(fits(w),
               "[cuda] a sparse weight must be 2-D floating point with at most 65536 "
               "inputs");
  LOPPER_CHECK(dtype == at::kFloat || dtype == at::kHalf || dtype == at::kBFloat16,
               "[cuda] sparse weights are fp32, fp16 or bf16");
  at::Tensor wc = w.detach().to(at::kCPU, at::kFloat).contiguous();
  n_ = wc.size(0), k_ = wc.size(1);
  at::Tensor nz = wc.ne(0);
  at::Tensor idx = nz.nonzero();  // [nnz, 2], row-major order: by row, then column
  nnz_ = idx.size(0);
  at::Tensor counts = nz.sum(1, /*keepdim=*/false, at::kLong);
  // Each row padded to a multiple of kVec entries, so the kernel reads kVec values and indices
  // with one aligned vector load. A padding entry is a zero at the row's last real column.
  at::Tensor padded = (counts + (kVec - 1)).div(kVec, "floor") * kVec;
  at::Tensor ptr = at::zeros({n_ + 1}, at::kLong), real = at::zeros({n_ + 1}, at::kLong);
  if (n_ > 0) {
    ptr.narrow(0, 1, n_).copy_(padded.cumsum(0));
    real.narrow(0, 1, n_).copy_(counts.cumsum(0));
  }
  const int64_t stored = ptr[n_].item<int64_t>();
  LOPPER_CHECK(stored < (int64_t(1) << 31), "[cuda] too many nonzeros for 32-bit row offsets");
  at::Tensor row = idx.select(1, 0), col_real = idx.select(1, 1);
  at::Tensor slot_row = at::repeat_interleave(at::arange(n_, at::kLong), padded);
  at::Tensor last = (real.narrow(0, 1, n_) - 1).clamp_min(0);  // the row's last real entry
  at::Tensor col = nnz_ ? col_real.index_select(0, last).index_select(0, slot_row)
                        : at::zeros({stored}, at::kLong);
  at::Tensor val = at::zeros({stored}, at::kFloat);
  at::Tensor dest =
      at::arange(nnz_, at::kLong) - real.index_select(0, row) + ptr.index_select(0, row);
  col.index_copy_(0, dest, col_real);
  val.index_copy_(0, dest, wc.masked_select(nz));
  // NOTE: indices up to 65535 stored as the bits of int16 (ATen has no uint16 arithmetic here).
  ptr_ = ptr.to(at::kInt).to(device);
  col_ = col.to(at::kInt).to(at::kShort).to(device);
  val_ = val.to(dtype).to(device);
  if (bias.defined()) {
    LOPPER_CHECK(bias.numel() == n_, "[cuda] bias has ", bias.numel(), " values for ", n_,
                 " outputs");
    bias_ = bias.detach().reshape({n_}).to(device, dtype).contiguous();
  }
}

at::Tensor SparseWeightCuda::linear(const at::Tensor& x_in) const {
  LOPPER_CHECK(built(), "[cuda] lopper was built without nvcc: no CUDA kernels of its own");
  LOPPER_CHECK(x_in.is_cuda() && x_in.device() == val_.device(), "[cuda] x must be on ",
               val_.device().str());
  LOPPER_CHECK(x_in.dim() == 2 && x_in.size(1) == k_, "[cuda] x must be [m, ", k_, "]");
  LOPPER_CHECK(x_in.scalar_type() == dtype_, "[cuda] x must be ", at::toString(dtype_));
  at::Tensor x = x_in.stride(1) == 1 ? x_in : x_in.contiguous();
  const int64_t m = x.size(0);
  at::Tensor y = at::empty({m, n_}, x.options());
  const auto dtype = dtype_ == at::kHalf       ? DType::kFloat16
                     : dtype_ == at::kBFloat16 ? DType::kBFloat16
                                               : DType::kFloat32;
  void* stream = c10::cuda::getCurrentCUDAStream(x.device().index()).stream();
  const int64_t elem = x.element_size();
  for (int64_t m0 = 0; m0 < m; m0 += kMaxRows) {
    SparseGemvParams p;
    p.dtype = dtype;
    p.n = n_, p.k = k_, p.m = std::min<int64_t>(kMaxRows, m - m0);
    p.row_ptr = ptr_.data_ptr<int32_t>();
    p.col = reinterpret_cast<const uint16_t*>(col_.data_ptr<int16_t>());
    p.val = val_.data_ptr();
    p.x = static_cast<const char*>(x.data_ptr()) + m0 * x.stride(0) * elem;
    p.ldx = x.stride(0);
    p.bias = bias_.defined() ? bias_.data_ptr() : nullptr;
    p.y = static_cast<char*>(y.data_ptr()) + m0 * n_ * elem;
    p.ldy = n_;
    launch_sparse_gemv(p, stream);
  }
  return y;
}

}  // namespace lopper::kernels::cuda
