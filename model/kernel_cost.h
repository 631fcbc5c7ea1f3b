// The terms of the kernels' *_cost functions (kernels.h), shared by the files
// that define each cost beside its kernel: FLOPs and bytes read + written in
// device memory at `elem` bytes per element (token and index arrays count 4
// or 8 bytes whatever the precision), the op's class and, for GEMMs, their
// shapes (C[m,n] = A[m,k]·B[k,n], batch times). These charge the virtual clock.
// Thread safety: pure functions.
#pragma once

#include "runtime/cost_model.h"

namespace shardlab::model::cost_terms {

inline OpCost cost(double flops, double elements, int elem, double index_bytes = 0) {
  return OpCost{flops, elements * elem + index_bytes};
}
inline OpCost gemm_cost(OpCost c, GemmShape g, GemmShape g2 = {}) {
  c.op_class = OpClass::kGemm;
  c.gemm = g;
  c.gemm2 = g2;
  return c;
}

}  // namespace shardlab::model::cost_terms
