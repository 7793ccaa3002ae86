#include "ops/op.h"

namespace lopper::ops {

void register_rnn(OpTable& t) {}

}  // namespace lopper::ops
