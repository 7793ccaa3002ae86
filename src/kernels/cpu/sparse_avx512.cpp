// The sparse kernels compiled for avx512 (see sparse_impl.h; the flags are set in CMakeLists.txt).
#define LOPPER_SPARSE_ISA 2
#define LOPPER_OPS_NAME kAvx512Ops
#define LOPPER_OPS_LABEL "avx512"
#include "kernels/cpu/sparse_impl.h"
