#include "ops/op.h"

namespace lopper::ops {

void register_loss(OpTable& t) {}

}  // namespace lopper::ops
