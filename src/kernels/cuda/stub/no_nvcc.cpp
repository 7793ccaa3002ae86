// Built instead of the .cu kernels when CMake found no nvcc: the ATen-facing API stays, and says
// so when asked to run a kernel.
#include "kernels/cuda/pool.h"
#include "kernels/cuda/sparse_gemv.h"
#include "lopper/error.h"

namespace lopper::kernels::cuda {

bool built() { return false; }

void launch_sparse_gemv(const SparseGemvParams&, void*) {
  throw Error("[cuda] lopper was built without nvcc: no CUDA kernels of its own");
}

void launch_max_pool2d(const MaxPool2dParams&, void*) {
  throw Error("[cuda] lopper was built without nvcc: no CUDA kernels of its own");
}

}  // namespace lopper::kernels::cuda
