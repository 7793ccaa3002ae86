// The sparse kernels compiled for avx2 (see sparse_impl.h; the flags are set in CMakeLists.txt).
#define LOPPER_SPARSE_ISA 1
#define LOPPER_OPS_NAME kAvx2Ops
#define LOPPER_OPS_LABEL "avx2"
#include "kernels/cpu/sparse_impl.h"
