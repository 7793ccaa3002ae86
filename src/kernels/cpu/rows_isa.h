// The per-ISA entry points of lopper's row-wise kernels (internal): each of rows_scalar.cpp,
// rows_avx2.cpp and rows_avx512.cpp compiles rows_impl.h with its own target flags and exports one
// table of these; rows.cpp picks the table of the active ISA.
// NOTE: plain C++ only across this boundary, as for sparse_isa.h.
#pragma once

#include <cstdint>

namespace lopper::kernels::cpu {

struct RowsIsaOps {
  const char* name;
  /// y[r] = softmax(scale * x[r]) for rows [r0, r1) of n floats (contiguous rows; y may be x).
  void (*softmax)(const float* x, float* y, int64_t r0, int64_t r1, int64_t n, float scale);
};

extern const RowsIsaOps kRowsScalarOps;
extern const RowsIsaOps kRowsAvx2Ops;
extern const RowsIsaOps kRowsAvx512Ops;

}  // namespace lopper::kernels::cpu
