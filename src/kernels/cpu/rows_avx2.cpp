// The row-wise kernels compiled for avx2 (see rows_impl.h; the flags are set in CMakeLists.txt).
#define LOPPER_SPARSE_ISA 1
#define LOPPER_ROWS_OPS_NAME kRowsAvx2Ops
#define LOPPER_ROWS_OPS_LABEL "avx2"
#include "kernels/cpu/rows_impl.h"
