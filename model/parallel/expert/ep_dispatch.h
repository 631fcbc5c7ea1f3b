// Expert parallelism: the MoE experts of every MoE block are spread over the
// ranks of an EP group, and tokens travel to their experts and back through
// all-to-all (Megatron-core's all-to-all token dispatcher).
//
//   route (replicated router, local rows; capacity in the global token order)
//   -> dispatch: rows grouped by expert = grouped by owning rank
//   -> counts all-to-all ("moe.counts.a2a": rows per (peer, local expert))
//   -> all_to_all_v of the rows ("moe.dispatch.a2a")
//   -> regroup expert-major ("moe.permute.fwd") -> local experts, each split
//      over TP as in expert/moe.cc -> back to source order ("moe.unpermute.fwd")
//   -> all_to_all_v back ("moe.combine.a2a") -> gate-weighted combine
//
// Backward is the mirror: combine backward, all_to_all_v of dye
// ("moe.combine.a2a.bwd"), experts' backward, all_to_all_v of dxe
// ("moe.dispatch.a2a.bwd"), dispatch and router backward. So four all-to-alls
// of token rows per MoE layer per micro-batch (plus the small counts one),
// each moving exactly the rows the router chose (modeled bytes = rows · C ·
// element size). They run on the compute stream (c.on_compute()): the
// experts cannot start before the rows arrive.
//
// Layout: EP group rank j holds experts [j·El, (j+1)·El), El = E/ep (the
// TpLayout built with LayoutFilter{expert_begin, expert_end}); its view's
// BlockView::experts lists them in order. The EP group's ranks hold different
// data-parallel shards of the batch; each expert's weight gradient sums the
// contributions of every token the group sent it, so expert gradients are
// reduced over the expert-data-parallel group with SUM and scaled by 1/dp
// (DataParallel's ExpertGrads).
//
// Size letters as in dims.h, plus El experts per rank and R rows this
// rank's experts received (at most Rx = ep·N·min(K, El)).
// Thread safety: called from the device's own thread, like the collectives.
#pragma once

#include "model/config.h"
#include "model/layers.h"
#include "model/parallel/expert/moe.h"

namespace shardlab::parallel {

// Same contract as tp_moe_forward (out (N,C) complete on every TP rank,
// returns aux), with the experts of p.experts local and c.ep exchanging rows.
// s: scratch for the received rows.
float ep_moe_forward(float* out, TpMoeActs& a, MoeScratch& s, const model::BlockView<float>& p,
                     const float* inp, const ShardDims& d, const model::GPTConfig& config,
                     const ExpertContext& c);
// Same contract as tp_moe_backward.
void ep_moe_backward(float* dexperts, float* drouter, const model::BlockView<float>& g,
                     MoeScratch& s, const float* dout, float daux, const TpMoeActs& a,
                     const float* inp, const model::BlockView<float>& p, const ShardDims& d,
                     const model::GPTConfig& config, WeightGrads& wg, const ExpertContext& c);

}  // namespace shardlab::parallel
