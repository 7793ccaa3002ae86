// The pooling layers lopper's own kernels take (see pool_kernels.h).
#include "exec/pool_kernels.h"

#include "kernels/cpu/pool.h"
#include "kernels/cuda/library.h"

namespace lopper::ops {
namespace {

bool cpu_float_or_bf16(const at::Tensor& x) {
  return x.device().is_cpu() && (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16);
}

}  // namespace

std::optional<at::Tensor> max_pool2d_by_kernel(OpContext& c, const at::Tensor& x,
                                               const MaxPool2dWindow& w) {
  // NOTE: lopper's NHWC kernel checks each tap against the input, so it takes any padding,
  // symmetric or not, and ceil mode's overhang (ResNet's 3x3/2 pool of a 112-pixel image drops its
  // end padding: ATen would pad a copy first and compute the argmax too, 10x the time).
  if (x.dim() == 4 && cpu_float_or_bf16(x) && c.prepack() &&
      x.is_contiguous(at::MemoryFormat::ChannelsLast))
    return kernels::cpu::max_pool2d_nhwc(x, w.kernel, w.strides, w.pad_begin, w.dilations, w.out);
  // The same on a GPU, NCHW or NHWC, fp32/fp16/bf16 (ATen's writes int64 indices too); it has no
  // backward, so not under autograd.
  if (x.dim() == 4 && !c.grad_mode() && x.is_cuda()) {
    const kernels::cuda::Library& lib = kernels::cuda::need_library();
    if (lib.max_pool2d_fits(x))
      return lib.max_pool2d(x, w.kernel, w.strides, w.pad_begin, w.dilations, w.out);
  }
  return std::nullopt;
}

std::optional<at::Tensor> mean_over_pixels_by_kernel(OpContext& c, const at::Tensor& x) {
  if (x.dim() == 4 && cpu_float_or_bf16(x) && c.prepack() && x.numel() > 0 &&
      x.is_contiguous(at::MemoryFormat::ChannelsLast))
    return kernels::cpu::mean_over_pixels_nhwc(x);
  return std::nullopt;
}

}  // namespace lopper::ops
