// Graph rewrites for inference (internal): the executor runs a rewritten copy, the model itself is
// never changed.
#pragma once

#include "lopper/graph.h"

namespace lopper::exec {

/// A copy of `g` with BatchNormalization folded into the Conv before it, and each Conv's following
/// residual Add and activation fused into one ai.lopper.FusedConv node. `opset` is the model's
/// default-domain opset (Clip's bounds moved from attributes to inputs in opset 11).
ir::Graph fuse_for_inference(const ir::Graph& g, int64_t opset);

}  // namespace lopper::exec
