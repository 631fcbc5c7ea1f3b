// Lab 4 exercise: column- and row-parallel linear layers, forward and
// backward, with the conjugate communication pair of each.
// Fill in the four TODOs, then run `make lab-4`. README.md explains the pairs.
#include "labs/04-tensor-parallel/tp_linear.h"

#include "collectives/collectives.h"
#include "model/kernels.h"

namespace shardlab::labs {

void column_parallel_forward(Device& dev, const collectives::ProcessGroup& tp, float* out,
                             const float* inp, const float* weight, const float* bias, int64_t N,
                             int C, int OCl) {
  // TODO: this rank's columns of out. Which communication does the forward
  // of a column-parallel layer need?
}

void column_parallel_backward(Device& dev, const collectives::ProcessGroup& tp, float* dinp,
                              float* dweight, float* dbias, const float* dout, const float* inp,
                              const float* weight, int64_t N, int C, int OCl) {
  // TODO: dweight and dbias from this rank's columns; dinp is the sum over
  // the ranks of each one's partial input gradient.
}

void row_parallel_forward(Device& dev, const collectives::ProcessGroup& tp, float* out,
                          const float* inp, const float* weight, const float* bias, int64_t N,
                          int Cl, int OC) {
  // TODO: each rank computes a partial out from its columns; the complete
  // out is their sum, plus the bias once.
}

void row_parallel_backward(Device& dev, const collectives::ProcessGroup& tp, float* dinp,
                           float* dweight, float* dbias, const float* dout, const float* inp,
                           const float* weight, int64_t N, int Cl, int OC) {
  // TODO: dinp, dweight and dbias from the replicated dout. Which
  // communication does this backward need?
}

}  // namespace shardlab::labs
