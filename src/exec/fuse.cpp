#include "exec/fuse.h"

#include "exec/fusion/passes.h"

namespace lopper::exec {

namespace fusion {

const std::vector<Pass>& passes() {
  static const std::vector<Pass> list{
      {"constants_to_initializers", constants_to_initializers},
      {"fold_batchnorm", fold_batchnorm},
      {"fuse_conv", fuse_conv},
      {"move_residual_bias", move_residual_bias},
      {"fuse_batchnorm_activation", fuse_batchnorm_activation},
      {"fuse_concat_norm", fuse_concat_norm},
      {"fuse_channel_shuffle", fuse_channel_shuffle},
      {"fuse_conv_chain", fuse_conv_chain},
      {"fuse_gelu", fuse_gelu},
      {"fuse_matmul", fuse_matmul},
      {"fuse_grouped_matmul", fuse_grouped_matmul},
      {"fuse_rms_norm", fuse_rms_norm},
      {"fuse_scaled_softmax", fuse_scaled_softmax},
      {"fuse_attention", fuse_attention},
      {"fuse_add_layer_norm", fuse_add_layer_norm},
  };
  return list;
}

}  // namespace fusion

ir::Graph fuse_for_inference(const ir::Graph& src, int64_t opset) {
  ir::Graph g = src;
  for (const auto& pass : fusion::passes()) pass.apply(g, opset);
  return g;
}

}  // namespace lopper::exec
