// Megatron tensor-parallel transformer blocks on one TP rank.
//
//   attention: ln_1 -> [enter] c_attn column-parallel (this rank's heads)
//              -> causal attention over the local heads
//              -> c_proj row-parallel (partial sums) -> [exit] -> + bias (once)
//   MLP:       ln_2 -> [enter] c_fc column-parallel -> GELU
//              -> c_proj row-parallel -> [exit] -> + bias
//   MoE:       ln_2 -> [enter] router (replicated, on the full rows)
//              -> dispatch -> each expert's MLP split like the dense one
//              -> all-reduce of the expert outputs (reduce_from_tp_region)
//              -> + expert biases -> combine -> scatter to SP rows
//
// [enter] / [exit] are the mode's region boundaries (tensor/mappings.h): without
// SP copy_to / reduce_from (all-reduce); with SP all-gather / reduce-scatter,
// and the LayerNorm / residual regions hold only this rank's Nr = N/tp rows.
// With SP the gathered LayerNorm outputs are not kept: backward gathers them
// again (Megatron does the same to keep activation memory at 1/tp).
//
// Size letters as in tensor/buffers.h.
// Backward accumulates into dinp and the gradient views, like model/layers.h.
#pragma once

#include <cstdint>

#include "model/config.h"
#include "model/layers.h"
#include "model/parallel/tensor/buffers.h"
#include "model/parallel/tensor/mappings.h"
#include "model/parallel/weight_grad.h"

namespace shardlab::parallel {

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
// c_proj bias (added once, after the reduction); saves fc, fc_gelu (rows,Fl).
void tp_mlp_partial_forward(float* partial, float* fc, float* fc_gelu,
                            const model::MlpView<float>& p, const float* inp, int64_t rows, int C,
                            int Fl, const model::Exec& ex);
// dinp (rows,C) += this rank's partial input gradient. dout (rows,C) is the
// complete output gradient, so g.c_proj.bias gets its whole gradient here.
void tp_mlp_backward(float* dinp, const model::MlpView<float>& g, float* dfc, float* dfc_gelu,
                     const float* dout, const float* inp, const float* fc, const float* fc_gelu,
                     const model::MlpView<float>& p, int64_t rows, int C, int Fl,
                     WeightGrads& wg, const model::Exec& ex);

// x (Nr,C) -> a.res2 (Nr,C). Returns the block's aux loss (0 if dense).
float tp_block_forward(TpBlockActs& a, const model::BlockView<float>& p, const float* x,
                       const TpDims& d, const model::GPTConfig& config, TpScratch& s,
                       const TpContext& c);
// dinp (Nr,C) += d block / d x given dout (Nr,C); gradients into g.
void tp_block_backward(float* dinp, const model::BlockView<float>& g, TpScratch& s,
                       const float* dout, float daux, const TpBlockActs& a, const float* inp,
                       const model::BlockView<float>& p, const TpDims& d,
                       const model::GPTConfig& config, WeightGrads& wg, const TpContext& c);

}  // namespace shardlab::parallel
