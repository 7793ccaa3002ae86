#include "ops/op.h"

namespace lopper::ops {

void register_control(OpTable& t) {}

}  // namespace lopper::ops
