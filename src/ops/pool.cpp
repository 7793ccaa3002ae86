#include "ops/op.h"

namespace lopper::ops {

void register_pool(OpTable& t) {}

}  // namespace lopper::ops
