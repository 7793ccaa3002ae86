#include "kernels/cuda/pool_cuda.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <limits>

#include "kernels/cuda/pool.h"
#include "lopper/error.h"

namespace lopper::kernels::cuda {

bool max_pool2d_fits(const at::Tensor& x) {
  const auto t = x.scalar_type();
  return built() && x.is_cuda() && x.dim() == 4 &&
         (t == at::kFloat || t == at::kHalf || t == at::kBFloat16) &&
         (x.is_contiguous() || x.is_contiguous(at::MemoryFormat::ChannelsLast));
}

at::Tensor max_pool2d(const at::Tensor& x, at::IntArrayRef kernel, at::IntArrayRef stride,
                      at::IntArrayRef pad_begin, at::IntArrayRef dilation,
                      at::IntArrayRef out_size) {
  LOPPER_CHECK(max_pool2d_fits(x),
               "[cuda] max_pool2d takes a dense 4-D fp32/fp16/bf16 CUDA tensor (built with nvcc)");
  LOPPER_CHECK(kernel.size() == 2 && stride.size() == 2 && pad_begin.size() == 2 &&
                   dilation.size() == 2 && out_size.size() == 2,
               "[cuda] max_pool2d: kernel, stride, pads, dilation and output are 2-D");
  constexpr int64_t kMax = std::numeric_limits<int>::max();
  for (size_t i = 0; i < 2; ++i)
    LOPPER_CHECK(kernel[i] >= 1 && kernel[i] <= kMax && stride[i] >= 1 && stride[i] <= kMax &&
                     dilation[i] >= 1 && dilation[i] <= kMax && pad_begin[i] >= 0 &&
                     pad_begin[i] <= kMax && out_size[i] >= 0,
                 "[cuda] max_pool2d: bad geometry");
  // NCHW when x is both (C == 1 or a 1x1 map): one memory order serves either view.
  const bool cl = !x.is_contiguous();
  at::Tensor y = at::empty({x.size(0), x.size(1), out_size[0], out_size[1]},
                           x.options().memory_format(cl ? at::MemoryFormat::ChannelsLast
                                                        : at::MemoryFormat::Contiguous));
  MaxPool2dParams p;
  p.dtype = x.scalar_type() == at::kHalf       ? DType::kFloat16
            : x.scalar_type() == at::kBFloat16 ? DType::kBFloat16
                                               : DType::kFloat32;
  p.channels_last = cl;
  p.n = x.size(0), p.c = x.size(1), p.h = x.size(2), p.w = x.size(3);
  p.oh = out_size[0], p.ow = out_size[1];
  p.kh = int(kernel[0]), p.kw = int(kernel[1]), p.sh = int(stride[0]), p.sw = int(stride[1]);
  p.ph = int(pad_begin[0]), p.pw = int(pad_begin[1]), p.dh = int(dilation[0]);
  p.dw = int(dilation[1]);
  p.x = x.data_ptr(), p.y = y.data_ptr();
  const c10::cuda::CUDAGuard guard(x.device());
  launch_max_pool2d(p, c10::cuda::getCurrentCUDAStream().stream());
  return y;
}

}  // namespace lopper::kernels::cuda
