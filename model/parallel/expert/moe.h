// MoE under tensor parallelism (moe.cc) and the pieces shared with expert
// parallelism (ep_dispatch.h): route -> dispatch -> experts -> combine.
// Shapes use the letters of tensor/buffers.h.
#pragma once

#include <vector>

#include "model/config.h"
#include "model/layers.h"
#include "model/parallel/tensor/buffers.h"
#include "model/parallel/tensor/mappings.h"
#include "model/parallel/weight_grad.h"

namespace shardlab::parallel {

// Adds one forward's block statistics into the step's (sizing it on first use).
void add_moe_stats(MoeStepStats& step, int layer, const MoeStats& forward);


// Router (replicated) on the full rows, then the dispatch plan (a.M, a.src,
// a.offsets over all E experts) and a.stats.dropped. Global routing with
// c.capacity_group: one all-gather of per-expert counts gives f_i of the
// global batch and capacity drops in the global token order.
void tp_moe_route(TpMoeActs& a, const model::BlockView<float>& p, const float* inp,
                  const TpDims& d, const model::GPTConfig& config, const TpContext& c);
// a.xe (M,C) = the input rows of the planned assignments, grouped by expert.
void tp_moe_dispatch(TpMoeActs& a, const float* inp, const TpDims& d,
                     const model::GPTConfig& config, const model::Exec& ex);
// out (N,C) = gate-weighted sum of a.ye (M,C) per token; returns a.aux.
float tp_moe_combine(float* out, const TpMoeActs& a, const TpDims& d,
                     const model::GPTConfig& config, const model::Exec& ex);
// ye (R,C) = the experts' complete outputs on xe (R,C), rows grouped by
// expert (offsets (n+1)), experts[0..n) split over TP: partial MLPs, one
// all-reduce over TP, biases. Saves fc, fc_gelu (R,Fl).
void tp_experts_forward(float* ye, float* fc, float* fc_gelu,
                        const std::vector<model::MlpView<float>>& experts, const float* xe,
                        const int64_t* offsets, int n, const TpDims& d, const TpContext& c);
// dxe (R,C) (overwritten) = this rank's partial input gradients; weights into g.
void tp_experts_backward(float* dxe, const std::vector<model::MlpView<float>>& g,
                         TpScratch& s, const float* dye, const float* xe, const float* fc,
                         const float* fc_gelu, const std::vector<model::MlpView<float>>& p,
                         const int64_t* offsets, int n, const TpDims& d, WeightGrads& wg,
                         const model::Exec& ex);
// s.dye (M,C) and s.dgates (N,K) from dout (N,C) (combine backward).
void tp_moe_combine_backward(TpScratch& s, const float* dout, const TpMoeActs& a,
                             const TpDims& d, const model::GPTConfig& config,
                             const model::Exec& ex);
// Dispatch backward of s.dxe (M,C) into dexperts, and the router's backward
// (from s.dgates and daux) into drouter and g.router.
void tp_moe_route_backward(float* dexperts, float* drouter, const model::BlockView<float>& g,
                           TpScratch& s, float daux, const TpMoeActs& a, const float* inp,
                           const model::BlockView<float>& p, const TpDims& d,
                           const model::GPTConfig& config, WeightGrads& wg, const model::Exec& ex);

// MoE MLP on the full rows (expert/moe.cc). out (N,C) is complete and identical on
// every rank. Returns aux. With c.expert_parallel() tp_block_* call
// ep_moe_forward / ep_moe_backward (expert/ep_dispatch.h) instead, same contract.
float tp_moe_forward(float* out, TpMoeActs& a, const model::BlockView<float>& p, const float* inp,
                     const TpDims& d, const model::GPTConfig& config, const TpContext& c);
// dexperts (N,C) += this rank's partial input gradient through the experts
// (to be summed over TP); drouter (N,C) += the router's (complete, replicated).
void tp_moe_backward(float* dexperts, float* drouter, const model::BlockView<float>& g,
                     TpScratch& s, const float* dout, float daux, const TpMoeActs& a,
                     const float* inp, const model::BlockView<float>& p, const TpDims& d,
                     const model::GPTConfig& config, WeightGrads& wg, const TpContext& c);

}  // namespace shardlab::parallel
