// The sparse kernels compiled for scalar (see sparse_impl.h; the flags are set in CMakeLists.txt).
#define LOPPER_SPARSE_ISA 0
#define LOPPER_OPS_NAME kScalarOps
#define LOPPER_OPS_LABEL "scalar"
#include "kernels/cpu/sparse_impl.h"
