// The dense NHWC convolution kernels compiled for scalar (see conv_impl.h; the flags are set in
// CMakeLists.txt).
#define LOPPER_SPARSE_ISA 0
#define LOPPER_CONV_OPS_NAME kConvScalarOps
#define LOPPER_CONV_OPS_LABEL "scalar"
#include "kernels/cpu/conv_impl.h"
