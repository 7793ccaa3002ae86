#include "ops/op.h"

namespace lopper::ops {

void register_conv(OpTable& t) {}

}  // namespace lopper::ops
