// The dense NHWC convolution kernels compiled for avx2 (see conv_impl.h; the flags are set in
// CMakeLists.txt).
#define LOPPER_SPARSE_ISA 1
#define LOPPER_CONV_OPS_NAME kConvAvx2Ops
#define LOPPER_CONV_OPS_LABEL "avx2"
#include "kernels/cpu/conv_impl.h"
