// The inference rewrites (internal), one per file: each `apply(graph, opset) -> changed` finds its
// pattern in the graph and rewrites every match, leaving the outputs as they were (to float
// rounding: a folded weight is rounded once). fuse_for_inference runs them in passes()' order.
#pragma once

#include <cstdint>
#include <vector>

#include "lopper/graph.h"

namespace lopper::exec::fusion {

struct Pass {
  const char* name;
  bool (*apply)(ir::Graph& g, int64_t opset);
};

/// The passes in the order fuse_for_inference runs them: a later one may match what an earlier
/// one wrote (a FusedConv's residual, a ScaledSoftmax inside an attention).
const std::vector<Pass>& passes();

/// Constant nodes, and Identity nodes of initializers (how exporters share deduplicated weights),
/// become initializers, so the passes after (and the executor) see them as constants.
bool constants_to_initializers(ir::Graph& g, int64_t opset);
/// BatchNormalization after a Conv whose output nothing else reads: folded into its weights.
bool fold_batchnorm(ir::Graph& g, int64_t opset);
/// Conv [+ residual Add] [+ activation] -> ai.lopper.FusedConv(x, W, B [, residual]).
bool fuse_conv(ir::Graph& g, int64_t opset);
/// A FusedConv whose residual is a Conv's output read by nothing else (ResNet's downsample): the
/// residual's bias moves into the FusedConv's.
bool move_residual_bias(ir::Graph& g, int64_t opset);
/// BatchNormalization that no Conv absorbed + activation -> ai.lopper.FusedBatchNormalization.
bool fuse_batchnorm_activation(ir::Graph& g, int64_t opset);
/// Concat along the channels read only by a normalisation -> ai.lopper.FusedConcatNorm.
bool fuse_concat_norm(ir::Graph& g, int64_t opset);
/// A channel shuffle ([Concat ->] Reshape to 5-D -> Transpose -> Reshape) ->
/// ai.lopper.ChannelShuffle.
bool fuse_channel_shuffle(ir::Graph& g, int64_t opset);
/// An inverted residual's [1x1 ->] depthwise [-> 1x1] convolutions, or a ResNeXt bottleneck's
/// with a grouped middle one of 2, 4 or 8 channels a group -> ai.lopper.ConvChain.
bool fuse_conv_chain(ir::Graph& g, int64_t opset);
/// GELU written out with Erf -> Gelu.
bool fuse_gelu(ir::Graph& g, int64_t opset);
/// MatMul by a constant weight (or Gemm as a Linear layer) [+ bias Add] [+ activation] ->
/// ai.lopper.FusedMatMul.
bool fuse_matmul(ir::Graph& g, int64_t opset);
/// Grouped-query attention's repeat of key/value heads read by a MatMul ->
/// ai.lopper.GroupedMatMul.
bool fuse_grouped_matmul(ir::Graph& g, int64_t opset);
/// RMSNorm written out, as PyTorch exports LLaMA's -> RMSNormalization.
bool fuse_rms_norm(ir::Graph& g, int64_t opset);
/// Softmax of attention's scores scaled by constants -> ai.lopper.ScaledSoftmax.
bool fuse_scaled_softmax(ir::Graph& g, int64_t opset);
/// MatMul(Softmax(MatMul(Q, Kt)), V) -> ai.lopper.ScaledAttention.
bool fuse_attention(ir::Graph& g, int64_t opset);
/// Add whose sum a LayerNormalization normalises -> ai.lopper.AddLayerNormalization.
bool fuse_add_layer_norm(ir::Graph& g, int64_t opset);

}  // namespace lopper::exec::fusion
