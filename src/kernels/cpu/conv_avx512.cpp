// The dense NHWC convolution kernels compiled for avx512 (see conv_impl.h; the flags are set in
// CMakeLists.txt).
#define LOPPER_SPARSE_ISA 2
#define LOPPER_CONV_OPS_NAME kConvAvx512Ops
#define LOPPER_CONV_OPS_LABEL "avx512"
#include "kernels/cpu/conv_impl.h"
