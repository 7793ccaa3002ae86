// Internal to src/data: the image folder dataset and the resize every dataset shares.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>

#include "lopper/data.h"

namespace lopper::data {

/// Resizes float images [B, C, H, W] to [B, C, h, w]: bilinear, antialiased (torchvision's
/// Resize(antialias=True)); `x` itself when it already has that size.
at::Tensor resize_images(const at::Tensor& x, int64_t h, int64_t w);

/// `folder:DIR` (`spec` is the whole spec, for names and errors; `dir` its folder).
std::shared_ptr<Dataset> open_folder(const std::string& spec, const std::string& dir,
                                     const std::string& split);

/// "[data] SPEC: 'PATH': no such file or directory" (the one wording for every missing input).
std::string no_such(const std::string& spec, const std::string& path);

}  // namespace lopper::data
