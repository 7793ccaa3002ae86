#include "ops/op.h"

namespace lopper::ops {

void register_signal(OpTable& t) {}

}  // namespace lopper::ops
