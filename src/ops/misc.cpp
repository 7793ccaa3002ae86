#include "ops/op.h"

namespace lopper::ops {

void register_misc(OpTable& t) {}

}  // namespace lopper::ops
