// Graph rewrites for inference (internal): the executor runs a rewritten copy, the model itself is
// never changed.
#pragma once

#include "lopper/graph.h"

namespace lopper::exec {

/// A copy of `g` with BatchNormalization folded into the Conv before it, and each Conv's following
/// residual Add and activation fused into one ai.lopper.FusedConv node; any other
/// BatchNormalization's activation into ai.lopper.FusedBatchNormalization, and a channel Concat
/// into the normalisation that alone reads it (ai.lopper.FusedConcatNorm); a MatMul by a constant
/// weight, its bias Add and activation into ai.lopper.FusedMatMul; GELU written with Erf into Gelu;
/// and grouped-query attention's repeat of key/value heads into the MatMul reading it
/// (ai.lopper.GroupedMatMul); a channel shuffle (Reshape to 5-D, Transpose, Reshape back) and the
/// channel Concat it alone reads into ai.lopper.ChannelShuffle; an inverted residual's 1x1
/// expansion, depthwise and 1x1 projection convolutions (two or three of them), or a ResNeXt
/// bottleneck's with its grouped middle one, into ai.lopper.ConvChain, the convolutions kept as its
/// "body" subgraph. `opset` is the model's default-domain opset (Clip's bounds moved from
/// attributes to inputs in opset 11).
ir::Graph fuse_for_inference(const ir::Graph& g, int64_t opset);

}  // namespace lopper::exec
