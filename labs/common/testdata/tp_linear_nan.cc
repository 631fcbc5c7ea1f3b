// Lab 4's reference solution with one NaN in the column-parallel layer's
// bias gradient: the grader must fail it (test labs.lab_04.nan_fails). A
// NaN compares false with everything, so a max difference taken as
// std::max(worst, |got - want|) keeps `worst` and lets the NaN pass.
#include "labs/04-tensor-parallel/tp_linear.h"

#define column_parallel_backward solution_column_parallel_backward
#include "labs/solutions/04-tensor-parallel/tp_linear.cc"
#undef column_parallel_backward

#include <limits>

namespace shardlab::labs {

void column_parallel_backward(Device& dev, const collectives::ProcessGroup& tp, float* dinp,
                              float* dweight, float* dbias, const float* dout, const float* inp,
                              const float* weight, int64_t N, int C, int OCl) {
  solution_column_parallel_backward(dev, tp, dinp, dweight, dbias, dout, inp, weight, N, C, OCl);
  dbias[0] = std::numeric_limits<float>::quiet_NaN();
}

}  // namespace shardlab::labs
