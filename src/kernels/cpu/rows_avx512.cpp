// The row-wise kernels compiled for avx512 (see rows_impl.h; the flags are set in CMakeLists.txt).
#define LOPPER_SPARSE_ISA 2
#define LOPPER_ROWS_OPS_NAME kRowsAvx512Ops
#define LOPPER_ROWS_OPS_LABEL "avx512"
#include "kernels/cpu/rows_impl.h"
