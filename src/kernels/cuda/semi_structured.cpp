#include "kernels/cuda/semi_structured.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAConfig.h>
#include <ATen/cuda/CUDAContext.h>

#include "lopper/error.h"

namespace lopper::kernels::cuda {
namespace {

int64_t round_up(int64_t v, int64_t to) { return (v + to - 1) / to * to; }

// NOTE: the shapes both backends take for fp16/bf16: the sparse operand's rows a multiple of 32
// and its columns of 64 (CUTLASS; cuSPARSELt asks for 16 and 16), the dense operand's of 8.
constexpr int64_t kRowsAlign = 32, kColsAlign = 64, kBatchAlign = 8;

}  // namespace

bool is_two_four(const at::Tensor& w) {
  if (w.dim() != 2 || w.size(1) % 4 != 0 || w.numel() == 0) return false;
  at::Tensor nz = w.detach().ne(0);
  if (!nz.any().item<bool>()) return false;
  return nz.view({w.size(0), w.size(1) / 4, 4}).sum(-1).le(2).all().item<bool>();
}

bool semi_fits(const at::Tensor& w, at::ScalarType dtype) {
  return (dtype == at::kHalf || dtype == at::kBFloat16) && w.dim() == 2 &&
         w.size(1) % kColsAlign == 0 && is_two_four(w);
}

bool semi_compiled(SemiBackend b) {
  if (b == SemiBackend::kCutlass) return true;
#if AT_CUSPARSELT_ENABLED()
  return true;
#else
  return false;
#endif
}

SemiStructuredWeight::SemiStructuredWeight(SemiBackend backend, const at::Tensor& w,
                                           const at::Tensor& bias, at::ScalarType dtype,
                                           at::Device device)
    : backend_(backend), dtype_(dtype) {
  LOPPER_CHECK(device.is_cuda(), "[cuda] 2:4 weights live on a GPU, not ", device.str());
  LOPPER_CHECK(semi_fits(w, dtype),
               "[cuda] a 2:4 weight must be fp16 or bf16 with at most 2 "
               "nonzeros in every 4 inputs and inputs a multiple of 64");
  LOPPER_CHECK(semi_compiled(backend), "[cuda] this libtorch was built without ",
               semi_name(backend));
  if (backend == SemiBackend::kCutlass) {
    // NOTE: ATen's CUTLASS 2:4 kernels are built for compute capability 8.x alone: on a Hopper
    // (9.0) the product throws ("Supported only on GPUs with compute capability 8.x", seen on an
    // H100 with torch 2.11), so the weight is refused here, before any packing.
    const cudaDeviceProp* p =
        at::cuda::getDeviceProperties(device.has_index() ? device.index() : c10::DeviceIndex(0));
    LOPPER_CHECK(p->major == 8, "[cuda] ", semi_name(backend),
                 ": ATen's CUTLASS 2:4 kernels run on compute capability 8.x only, this GPU is ",
                 p->major, ".", p->minor);
  }
  n_ = w.size(0), k_ = w.size(1), n_pad_ = round_up(n_, kRowsAlign);
  at::Tensor wd = at::zeros({n_pad_, k_}, w.options().dtype(dtype).device(device));
  wd.narrow(0, 0, n_).copy_(w.detach());
  if (bias.defined()) {
    LOPPER_CHECK(bias.numel() == n_, "[cuda] bias has ", bias.numel(), " values for ", n_,
                 " outputs");
    bias_ = at::zeros({n_pad_}, wd.options());
    bias_.narrow(0, 0, n_).copy_(bias.detach().reshape({n_}));
  }
  try {
    if (backend == SemiBackend::kCusparselt) {
      packed_ = at::_cslt_compress(wd);
    } else {
      std::tie(packed_, meta_) = at::_to_sparse_semi_structured(wd);
    }
  } catch (const c10::Error& e) {
    throw Error(detail::concat("[cuda] ", semi_name(backend), " cannot take this weight on ",
                               device.str(), ": ", e.what_without_backtrace()));
  }
}

at::Tensor SemiStructuredWeight::linear(const at::Tensor& x_in) const {
  LOPPER_CHECK(x_in.is_cuda() && x_in.device() == packed_.device(), "[cuda] x must be on ",
               packed_.device().str());
  LOPPER_CHECK(x_in.dim() == 2 && x_in.size(1) == k_, "[cuda] x must be [m, ", k_, "]");
  LOPPER_CHECK(x_in.scalar_type() == dtype_, "[cuda] x must be ", at::toString(dtype_));
  const int64_t m = x_in.size(0), m_pad = round_up(std::max<int64_t>(m, 1), kBatchAlign);
  at::Tensor x = x_in.contiguous();
  if (m_pad != m) {
    at::Tensor xp = at::zeros({m_pad, k_}, x.options());
    xp.narrow(0, 0, m).copy_(x);
    x = xp;
  }
  at::Tensor y;  // [m_pad, n_pad]
  if (backend_ == SemiBackend::kCusparselt) {
    // W [n, k] . x^T [k, m], written transposed: [m, n] row-major, bias per output.
    const std::optional<at::Tensor> bias = bias_.defined() ? std::optional(bias_) : std::nullopt;
    // NOTE: the search only on the large products where it was seen to work (8192 x 8192 bf16,
    // batch 2048-8192 on an H200, torch 2.11: 1.19-1.41x cuBLAS, against 0.61-0.76x with the
    // default algorithm on an H100); on the GPU tests' small shapes cuSPARSELt's search failed
    // with an internal error, so smaller products keep the default algorithm.
    int64_t alg = 0;
    if (m_pad >= kSearchMin && n_pad_ >= kSearchMin && k_ >= kSearchMin) {
      std::lock_guard<std::mutex> lock(alg_mutex_);
      auto it = alg_.find(m_pad);
      if (it == alg_.end())
        it =
            alg_.emplace(m_pad, at::_cslt_sparse_mm_search(packed_, x.t(), bias, std::nullopt,
                                                           std::nullopt, /*transpose_result=*/true))
                .first;
      alg = it->second;
    }
    y = at::_cslt_sparse_mm(packed_, x.t(), bias, std::nullopt, std::nullopt,
                            /*transpose_result=*/true, alg);
  } else {
    y = at::_sparse_semi_structured_mm(packed_, meta_, x.t()).t();
    if (bias_.defined()) y = y + bias_;
  }
  if (m_pad == m && n_pad_ == n_) return y;
  return y.narrow(0, 0, m).narrow(1, 0, n_);
}

}  // namespace lopper::kernels::cuda
