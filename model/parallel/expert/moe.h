// MoE under tensor parallelism (moe.cc) and the pieces shared with expert
// parallelism (ep_dispatch.h): route -> dispatch -> experts -> combine.
// Shapes use the letters of dims.h.
// Thread safety: called from the device's own thread, like the collectives.
#pragma once

#include <vector>

#include "collectives/group.h"
#include "model/config.h"
#include "model/layers.h"
#include "model/parallel/dims.h"
#include "model/parallel/expert/moe_buffers.h"
#include "model/parallel/layer_context.h"
#include "model/parallel/weight_grad.h"

namespace shardlab::parallel {

// What an MoE layer needs besides its weights: the device (LayerContext) and
// its groups, and the assumptions of a phantom run.
struct ExpertContext : LayerContext {
  // The group each expert's MLP is split over like the dense MLP (the
  // block's TP group): one all-reduce over it completes the experts' outputs.
  const collectives::ProcessGroup* tp = nullptr;
  // Expert parallelism (expert/ep_dispatch.h): the ranks that exchange tokens, group rank
  // j holding experts [j·E/ep, (j+1)·E/ep). Null or size 1: every expert local.
  const collectives::ProcessGroup* ep = nullptr;
  // DeepEP's dispatcher (expert/ep_node_dispatch.h, --moe-dispatcher deepep):
  // the EP group's members on this device's node (ep_node, group rank l = its
  // place) and at its place on every node (ep_rail, group rank b = its node),
  // EP rank b·L + l. Null: Megatron's all-to-all dispatcher (ep_dispatch.h).
  const collectives::ProcessGroup* ep_node = nullptr;
  const collectives::ProcessGroup* ep_rail = nullptr;
  // The whole data-parallel group, members in data order (member d holds the
  // d-th block of the global batch's rows). When set (and of size > 1), MoE
  // routing follows the global batch exactly: f_i counts every replica's
  // assignments and capacity drops follow the global token order. Null: f_i
  // is averaged through OpSink::average_over_replicas (only with a
  // load-balancing loss, GPTConfig::aux_coef > 0) and capacity is local.
  const collectives::ProcessGroup* capacity_group = nullptr;
  // Where the expert-parallel all-to-alls add the compute-stream time they take.
  Time* a2a_time = nullptr;
  // Megatron's --overlap-moe-expert-parallel-comm: the token exchanges run
  // on this stream (the EP communication stream) instead of the compute
  // stream, and after posting one the device's program yields
  // (runtime/fiber.h Interleave) to the other micro-batch of its combined
  // forward-backward step; the compute stream waits for the exchange when
  // the program resumes. Null: on the compute stream, no yield.
  Stream* a2a_stream = nullptr;
  // Megatron's --delay-wgrad-compute (with a2a_stream): the experts' weight
  // gradients (routed and shared) of a backward are recorded here instead
  // of running in it, and run right after the backward's dispatch exchange
  // is posted, beside it on the compute stream (Megatron's
  // mlp.backward_dw after moe_dispatch's backward starts). Null: at once.
  WeightGrads* delayed_wgrad = nullptr;
  // Phantom runs (no router logits): the skew of the assumed routing. 0:
  // uniform; s > 0: expert e's share of first choices is proportional to
  // 1/(e+1)^s (Zipf), see expert/moe.cc phantom_route.
  double phantom_zipf = 0;

  bool expert_parallel() const { return ep != nullptr && ep->size() > 1; }
  bool node_dispatch() const { return expert_parallel() && ep_node != nullptr && ep_rail != nullptr; }
  bool global_routing() const { return capacity_group != nullptr && capacity_group->size() > 1; }
};

// A phantom run's local routing (no capacity over dp; expert/moe.cc
// phantom_route: uniform, or Zipf-skewed by `zipf`) and its dispatch plan:
// per-expert assignments `filled` (E, before the capacity), `offsets`
// (E + 1) and M, a function of the arguments alone. plan_phantom_routing
// computes it; phantom_plan keeps the thread's last one and recomputes it
// only for other arguments (tp_moe_route: every MoE layer and micro-batch
// of a phantom run routes alike, at DeepSeek-V3's N 4,096 and top-8 two
// passes over 32,768 assignments each).
struct PhantomPlan {
  int64_t N = -1;
  int E = 0, K = 0;
  double capacity = 0, zipf = 0;
  int groups = 1, group_top_k = 1;  // GPTConfig::moe_groups, moe_group_top_k
  std::vector<int64_t> filled, offsets;
  int64_t M = 0;
  std::vector<int64_t> src;  // (M) the kept assignments n·K + k, grouped by expert (moe_plan)
};
PhantomPlan plan_phantom_routing(int64_t N, int E, int K, double capacity, double zipf, int groups = 1,
                                 int group_top_k = 1);
const PhantomPlan& phantom_plan(int64_t N, int E, int K, double capacity, double zipf, int groups = 1,
                                int group_top_k = 1);

// The routed experts' activation again (Megatron's moe_act recomputation):
// fc_gelu from fc over the rows each local expert ran in the last forward,
// the forward's kernels (tp_experts_forward: one per expert).
void tp_experts_activation_forward(TpMoeActs& a, const ShardDims& d, const model::GPTConfig& config,
                                   const model::Exec& ex);
// The elements that activation's output (fc_gelu) keeps for backward.
int64_t experts_activation_elements(const TpMoeActs& a, const ShardDims& d, const model::GPTConfig& config);

// Router (replicated) on the full rows, then the dispatch plan (a.M, a.src,
// a.offsets over all E experts; a.routed points at the plan's src, also in a
// phantom run) and a.stats.dropped. Global routing with
// c.capacity_group: one all-gather of per-expert counts gives f_i of the
// global batch and capacity drops in the global token order.
void tp_moe_route(TpMoeActs& a, const model::BlockView<float>& p, const float* inp,
                  const ShardDims& d, const model::GPTConfig& config, const ExpertContext& c);
// a.xe (M,C) = the input rows of the planned assignments, grouped by expert.
void tp_moe_dispatch(TpMoeActs& a, const float* inp, const ShardDims& d,
                     const model::GPTConfig& config, const model::Exec& ex);
// out (N,C) = gate-weighted sum of a.ye (M,C) per token; returns a.aux.
float tp_moe_combine(float* out, const TpMoeActs& a, const ShardDims& d,
                     const model::GPTConfig& config, const model::Exec& ex);
// ye (R,C) = the experts' complete outputs on xe (R,C), rows grouped by
// expert (offsets (n+1)), experts[0..n) split over TP (Fel = expert_fl of
// their columns here): partial MLPs, one all-reduce over TP, biases. Saves
// fc (R,Fel; swiglu: the llama family's SwiGLU experts, [gate | up] (R,2·Fel),
// no biases) and fc_gelu (R,Fel).
void tp_experts_forward(float* ye, float* fc, float* fc_gelu,
                        const std::vector<model::MlpView<float>>& experts, const float* xe,
                        const int64_t* offsets, int n, int Fel, const ShardDims& d, const ExpertContext& c,
                        bool swiglu);
// dxe (R,C) (overwritten) = this rank's partial input gradients; weights into g.
void tp_experts_backward(float* dxe, const std::vector<model::MlpView<float>>& g,
                         MoeScratch& s, const float* dye, const float* xe, const float* fc,
                         const float* fc_gelu, const std::vector<model::MlpView<float>>& p,
                         const int64_t* offsets, int n, int Fel, const ShardDims& d, WeightGrads& wg,
                         const model::Exec& ex, bool swiglu);
// Shared experts (no-ops without): out (N,C) += their output on every row of
// inp (N,C), split over TP like the dense MLP (c_fc, or SwiGLU's gate and up, column-, c_proj
// row-parallel, one all-reduce of the (N,C) partials over TP, then the
// c_proj bias). Replicated over EP ranks: each runs them on its own rows.
// Saves a.shared_fc, a.shared_fc_gelu (N,Fsl), a.shared_out.
void tp_shared_experts_forward(float* out, TpMoeActs& a, const model::BlockView<float>& p,
                               const float* inp, const ShardDims& d, const model::GPTConfig& config,
                               const ExpertContext& c);
// dexperts (N,C) += this rank's partial input gradient (summed over TP by
// the caller, with the routed experts'); weights into g.shared.
void tp_shared_experts_backward(float* dexperts, const model::BlockView<float>& g, MoeScratch& s,
                                const float* dout, const TpMoeActs& a, const float* inp,
                                const model::BlockView<float>& p, const ShardDims& d,
                                const model::GPTConfig& config, WeightGrads& wg, const model::Exec& ex);
// s.dye (M,C) and s.dgates (N,K) from dout (N,C) (combine backward).
void tp_moe_combine_backward(MoeScratch& s, const float* dout, const TpMoeActs& a,
                             const ShardDims& d, const model::GPTConfig& config,
                             const model::Exec& ex);
// The router's backward (from s.dgates and daux) into drouter and g.router.
void tp_moe_router_backward(float* drouter, const model::BlockView<float>& g, MoeScratch& s, float daux,
                            const TpMoeActs& a, const float* inp, const model::BlockView<float>& p,
                            const ShardDims& d, const model::GPTConfig& config, WeightGrads& wg,
                            const model::Exec& ex);
// Dispatch backward of s.dxe (M,C) into dexperts, and the router's backward
// (from s.dgates and daux) into drouter and g.router.
void tp_moe_route_backward(float* dexperts, float* drouter, const model::BlockView<float>& g,
                           MoeScratch& s, float daux, const TpMoeActs& a, const float* inp,
                           const model::BlockView<float>& p, const ShardDims& d,
                           const model::GPTConfig& config, WeightGrads& wg, const model::Exec& ex);

// MoE MLP on the full rows (expert/moe.cc). out (N,C) is complete and identical on
// every rank. Returns aux. With c.expert_parallel() the block (block.h) calls
// ep_moe_forward / ep_moe_backward (expert/ep_dispatch.h) instead, same contract.
float tp_moe_forward(float* out, TpMoeActs& a, const model::BlockView<float>& p, const float* inp,
                     const ShardDims& d, const model::GPTConfig& config, const ExpertContext& c);
// dexperts (N,C) += this rank's partial input gradient through the experts
// (to be summed over TP); drouter (N,C) += the router's (complete, replicated).
void tp_moe_backward(float* dexperts, float* drouter, const model::BlockView<float>& g,
                     MoeScratch& s, const float* dout, float daux, const TpMoeActs& a,
                     const float* inp, const model::BlockView<float>& p, const ShardDims& d,
                     const model::GPTConfig& config, WeightGrads& wg, const ExpertContext& c);

}  // namespace shardlab::parallel
