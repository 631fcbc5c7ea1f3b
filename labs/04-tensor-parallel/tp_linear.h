// Lab 4: Megatron's column- and row-parallel linear layers on one TP rank,
// the functions you write (tp_linear.cc in this folder).
//
// The unsharded layer is out (N,OC) = inp (N,C) · weightᵀ + bias, weight
// (OC,C) as torch stores it. Over a TP group of tp ranks, rank r holds:
//   column-parallel: rows [r·OCl, (r+1)·OCl) of weight and bias, OCl = OC/tp;
//                    the input is replicated, the output is split by columns.
//   row-parallel:    columns [r·Cl, (r+1)·Cl) of weight (stored (OC,Cl)),
//                    Cl = C/tp, and the whole bias; the input is split by
//                    columns (a column-parallel layer's output), the output
//                    is complete on every rank.
// Gradient buffers arrive zeroed; write the gradients into them. Tools:
// model::linear_forward / model::linear_backward (model/kernels.h) for the
// math and collectives::all_reduce (collectives/collectives.h) over `tp`.
#pragma once

#include <cstdint>

#include "collectives/group.h"
#include "runtime/device.h"

namespace shardlab::labs {

void column_parallel_forward(Device& dev, const collectives::ProcessGroup& tp,
                             float* out,           // (N,OCl) this rank's columns of out
                             const float* inp,     // (N,C) replicated
                             const float* weight,  // (OCl,C)
                             const float* bias,    // (OCl)
                             int64_t N, int C, int OCl);
void column_parallel_backward(Device& dev, const collectives::ProcessGroup& tp,
                              float* dinp,     // (N,C) the complete input gradient, on every rank
                              float* dweight,  // (OCl,C)
                              float* dbias,    // (OCl)
                              const float* dout,    // (N,OCl) this rank's columns of dout
                              const float* inp,     // (N,C)
                              const float* weight,  // (OCl,C)
                              int64_t N, int C, int OCl);

void row_parallel_forward(Device& dev, const collectives::ProcessGroup& tp,
                          float* out,           // (N,OC) complete, on every rank
                          const float* inp,     // (N,Cl) this rank's columns of the input
                          const float* weight,  // (OC,Cl)
                          const float* bias,    // (OC) replicated: add it once
                          int64_t N, int Cl, int OC);
void row_parallel_backward(Device& dev, const collectives::ProcessGroup& tp,
                           float* dinp,          // (N,Cl) this rank's columns of the input gradient
                           float* dweight,       // (OC,Cl)
                           float* dbias,         // (OC) the complete bias gradient
                           const float* dout,    // (N,OC) replicated
                           const float* inp,     // (N,Cl)
                           const float* weight,  // (OC,Cl)
                           int64_t N, int Cl, int OC);

}  // namespace shardlab::labs
