// Convolution geometry shared by Conv, ConvTranspose and the quantized convolutions (internal).
#pragma once

#include <ATen/ATen.h>

#include <vector>

#include "ops/op.h"

namespace lopper::ops {

struct ConvGeometry {
  std::vector<int64_t> kernel, strides, dilations, pads_begin, pads_end;
  int64_t group = 1;
};

/// Reads kernel_shape, strides, dilations, group, pads and auto_pad (resolved against the input's
/// spatial sizes; left to the caller for ConvTranspose), checking each against the weight.
ConvGeometry read_conv_geometry(const AttrReader& c, const at::Tensor& w,
                                at::IntArrayRef in_spatial, bool transposed);

/// Pads the spatial dims of [N, C, spatial...] with zeros (begin/end per spatial dim).
at::Tensor pad_spatial(const at::Tensor& x, const std::vector<int64_t>& begin,
                       const std::vector<int64_t>& end);

}  // namespace lopper::ops
