// The local math of Megatron's column- and row-parallel layers: what one
// rank computes on its slice of the weights, with no communication (the
// parallelism that splits the layer adds its own: tensor/mappings.h for the
// TP blocks, expert/moe.cc for the experts split over TP).
//
//   MLP: c_fc column-parallel (Fl = F/tp of its output columns) -> GELU
//        -> c_proj row-parallel: a partial sum of the output, without the
//        c_proj bias (added once, after the reduction).
//   SwiGLU (llama, `swiglu`): c_fc is the fused [gate | up] (2·Fl rows: this
//        rank's Fl of gate_proj, then of up_proj; no bias) -> silu(gate)·up
//        -> c_proj = down_proj row-parallel (no bias).
//
// Shapes use the letters of dims.h.
// Backward accumulates into dinp and the gradient views, like model/layers.h.
// Thread safety: free functions on the caller's buffers.
#pragma once

#include <algorithm>
#include <cstdint>

#include "model/layers.h"
#include "model/parallel/weight_grad.h"

namespace shardlab::parallel {

// Clears a backward's output before it accumulates; phantom buffers (null)
// have no storage: nothing to clear.
inline void zero(float* p, int64_t n) {
  if (p) std::fill(p, p + n, 0.0f);
}

// The kernel names of a linear layer's two backward GEMMs.
struct LinearNames {
  const char* dgrad;  // the input gradient (B)
  const char* wgrad;  // the weight gradient (W)
  // Whether the layer has a bias: its W charges the bias gradient. Stated,
  // not read off dbias, which is null in a phantom run.
  bool bias = true;
};
// Backward of a linear layer in its two GEMMs: dinp (N,C) += dout·weight now
// (B), and dweight (OC,C) += doutᵀ·inp, dbias (OC) += sums of dout (may be
// null) through `wg` (W: now, or later for a zero-bubble schedule).
void linear_backward_split(float* dinp, float* dweight, float* dbias, const float* dout,
                           const float* inp, const float* weight, int64_t N, int C, int OC,
                           LinearNames names, WeightGrads& wg, const model::Exec& ex);

// out (N,OC) += bias (OC) on every row; charged as `name`.
void add_bias_rows(float* out, const float* bias, int64_t N, int OC, const char* name,
                   const model::Exec& ex);

// MLP with c_fc column-parallel and c_proj row-parallel over `rows` rows:
// partial (rows,C) = this rank's share of c_proj(gelu(c_fc(inp))), WITHOUT the
// c_proj bias (added once, after the reduction); saves fc (rows,Fl; SwiGLU
// rows,2·Fl), fc_gelu (rows,Fl).
void tp_mlp_partial_forward(float* partial, float* fc, float* fc_gelu,
                            const model::MlpView<float>& p, const float* inp, int64_t rows, int C,
                            int Fl, const model::Exec& ex, bool swiglu = false);
// dinp (rows,C) += this rank's partial input gradient. dout (rows,C) is the
// complete output gradient, so g.c_proj.bias gets its whole gradient here.
void tp_mlp_backward(float* dinp, const model::MlpView<float>& g, float* dfc, float* dfc_gelu,
                     const float* dout, const float* inp, const float* fc, const float* fc_gelu,
                     const model::MlpView<float>& p, int64_t rows, int C, int Fl,
                     WeightGrads& wg, const model::Exec& ex, bool swiglu = false);

}  // namespace shardlab::parallel
