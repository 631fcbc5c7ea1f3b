// Lab 4 reference solution: column- and row-parallel linear layers.
//
//   column-parallel  fwd: identity (copy_to_tp_region)   bwd: all-reduce of dinp
//   row-parallel     fwd: all-reduce (reduce_from_tp_region)   bwd: identity
#include "labs/04-tensor-parallel/tp_linear.h"

#include "collectives/collectives.h"
#include "model/kernels.h"

namespace shardlab::labs {

void column_parallel_forward(Device& dev, const collectives::ProcessGroup& tp, float* out,
                             const float* inp, const float* weight, const float* bias, int64_t N,
                             int C, int OCl) {
  model::linear_forward(out, inp, weight, bias, N, C,
                        OCl);  // the input is replicated: no communication
}

void column_parallel_backward(Device& dev, const collectives::ProcessGroup& tp, float* dinp,
                              float* dweight, float* dbias, const float* dout, const float* inp,
                              const float* weight, int64_t N, int C, int OCl) {
  model::linear_backward(dinp, dweight, dbias, dout, inp, weight, N, C, OCl);
  collectives::all_reduce(dev, tp, collectives::Buffer(dinp, static_cast<size_t>(N * C)));
}

void row_parallel_forward(Device& dev, const collectives::ProcessGroup& tp, float* out,
                          const float* inp, const float* weight, const float* bias, int64_t N,
                          int Cl, int OC) {
  model::linear_forward<float>(out, inp, weight, nullptr, N, Cl, OC);  // partial, no bias
  collectives::all_reduce(dev, tp, collectives::Buffer(out, static_cast<size_t>(N * OC)));
  for (int64_t i = 0; i < N; ++i)
    for (int o = 0; o < OC; ++o) out[i * OC + o] += bias[o];
}

void row_parallel_backward(Device& dev, const collectives::ProcessGroup& tp, float* dinp,
                           float* dweight, float* dbias, const float* dout, const float* inp,
                           const float* weight, int64_t N, int Cl, int OC) {
  // dout is replicated, so every rank computes its columns of dinp and the
  // whole bias gradient: no communication.
  model::linear_backward(dinp, dweight, dbias, dout, inp, weight, N, Cl, OC);
}

}  // namespace shardlab::labs
