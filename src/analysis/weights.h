// layer_weight (lopper/analysis.h) over an ir::GraphIndex: the passes that look up every layer's
// weight (cost analysis, the prunable weights) do so in constant time a node. Internal header.
#pragma once

#include "ir/index.h"
#include "lopper/analysis.h"

namespace lopper {

/// What layer_weight(g, n) returns, `index` being an index of g.
const ir::Initializer* layer_weight(const ir::GraphIndex& index, const ir::Node& n);

}  // namespace lopper
