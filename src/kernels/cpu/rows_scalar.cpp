// The row-wise kernels compiled for scalar (see rows_impl.h; the flags are set in CMakeLists.txt).
#define LOPPER_SPARSE_ISA 0
#define LOPPER_ROWS_OPS_NAME kRowsScalarOps
#define LOPPER_ROWS_OPS_LABEL "scalar"
#include "kernels/cpu/rows_impl.h"
