// Mixture-of-Experts kernels: route -> dispatch -> experts -> combine
// (Megatron-core vocabulary). Included from kernels.h; same size letters and
// conventions (outputs first, backward accumulates with +=).
//
// Routing (RouterSpec): scores s = softmax(router logits) over the E experts
// (Router::kSoftmax) or sigmoid(logit) per expert (kSigmoid, DeepSeek-V3),
// kept in `probs`. Each token picks the K experts of highest s + bias
// (ties to the lower index, listed by descending key; the bias, aux-loss-free
// balancing's, steers the choice only; with groups, among the chosen groups'
// experts, RouterSpec); gates = those K scores, renormalised
// to sum to 1 when norm_topk (Mixtral's softmax over the top-K logits equals
// softmax + norm_topk), else the raw scores (DeepSeek-V2). Load-balancing loss
// aux = E · Σ_i f_i · P_i with f_i = (top-K assignments to expert i, counted
// before any capacity drop) / (N·K), a constant, and P_i = mean_n s'[n,i],
// s' = s normalised per row (softmax: s itself; sigmoid: s / Σ_e s, DeepSeek-V3's).
// With a capacity factor F > 0 each expert takes at most ⌈F·N·K/E⌉
// assignments in token order; later ones are dropped (slot = -1) and
// contribute nothing, while the kept gates keep their renormalised values.
//
// Aux-loss-free balancing (DeepSeek-V3, GPTConfig::router_bias_rate): the
// bias b (E) is a tensor of the model without a gradient. Its gradient slot
// carries the load signal instead: each backward adds E·load_e − N·K, i.e.
// E × (load_e − mean load) over the N·K top-K assignments of its rows
// (integers, exact in fp32), so the data-parallel gradient reduction sums
// the signal over the global batch (a positive factor: sums or means alike).
// After the step b_e −= rate · sign(signal_e), = b_e + rate · sign(mean − load_e).
#pragma once

#include <cstdint>

#include "model/config.h"
#include "model/sink.h"
#include "runtime/cost_model.h"

namespace shardlab::model {

// Group-limited routing (DeepSeek-V2/V3's device- and node-limited routing,
// Megatron-core's --moe-router-num-groups / --moe-router-group-topk): the E
// experts form `groups` groups of E/groups consecutive experts; a group's key
// is the sum of its K/group_top_k largest keys (s + bias); each token keeps the
// group_top_k groups of largest key (ties to the lower index) and picks its K
// experts among theirs only. groups == 1: every expert (no limit).
struct RouterSpec {
  Router score = Router::kSoftmax;
  bool norm_topk = true;
  int groups = 1, group_top_k = 1;  // GPTConfig::moe_groups_fit() holds (validate)
  static RouterSpec of(const GPTConfig& c) { return {c.router, c.moe_norm_topk, c.moe_groups, c.moe_group_top_k}; }
};

// Assignments one expert may take: ⌈F·N·K/E⌉, or N (no limit) when F <= 0.
int64_t expert_capacity(int64_t N, int E, int K, double capacity_factor);

template <typename Real>
Real router_forward(Real* probs,         // (N,E) scores s
                    int32_t* expert,     // (N,K) chosen experts
                    int32_t* slot,       // (N,K) row in the expert's queue, -1 dropped
                    Real* gates,         // (N,K)
                    Real* frac,          // (E) f_i, constant in backward
                    const Real* logits,  // (N,E) router logits (x · Wrᵀ)
                    const Real* bias,    // (E) selection bias, or null
                    int64_t N, int E, int K, double capacity_factor, const RouterSpec& r);
// dgates: gradient of the loss w.r.t. gates; daux: w.r.t. the returned aux.
template <typename Real>
void router_backward(Real* dlogits,       // (N,E)
                     const Real* dgates,  // (N,K)
                     Real daux,
                     const Real* probs,      // (N,E)
                     const int32_t* expert,  // (N,K)
                     const Real* frac,       // (E)
                     int64_t N, int E, int K, const RouterSpec& r);
OpCost router_forward_cost(int64_t N, int64_t E, int64_t K, int elem, const RouterSpec& r = {});
// The load-balancing loss for given fractions: E · Σ_i frac[i] · P_i with P_i
// the mean of s'[:, i] over the N rows (after frac was averaged over
// data-parallel replicas or counted over the global batch).
template <typename Real>
Real moe_aux_loss(const Real* frac,   // (E)
                  const Real* probs,  // (N,E) scores s
                  int64_t N, int E, Router score);
OpCost router_backward_cost(int64_t N, int64_t E, int64_t K, int elem);
// Under data parallelism the load-balancing loss's f_i must count the whole
// global batch: averages `frac` (E) over the replicas in place when the loss
// exists (aux_coef != 0) and the run has replicas; returns whether it did
// (then aux is recomputed with moe_aux_loss). Without the loss f_i reaches
// nothing but the reported aux, so the replicas skip the all-reduce (one per
// MoE block and micro-batch) and each reports its own.
inline bool average_fractions_over_replicas(float* frac, int E, const GPTConfig& config, const Exec& ex) {
  return config.aux_coef != 0 && ex.sink && ex.sink->average_over_replicas(frac, E);
}
// signal (E) += E·load_e − N·K: load_e = the assignments of `expert` to e.
template <typename Real>
void router_bias_load(Real* signal, const int32_t* expert, int64_t N, int E, int K);
OpCost router_bias_load_cost(int64_t N, int64_t E, int64_t K);
// bias (n) −= rate · sign(signal): the step's update (sign(0) = 0).
void router_bias_update(float* bias, const float* signal, int64_t n, double rate);
template <typename Real>
void router_bias_load(const Exec& ex, const char* name, Real* signal, const int32_t* expert, int64_t N, int E,
                      int K) {
  ex.run(name, router_bias_load_cost(N, E, K), [&] { router_bias_load(signal, expert, N, E, K); });
}
template <typename Real>  // kernels.h: the Exec overloads
void router_backward(const Exec& ex, const char* name, Real* dlogits, const Real* dgates, Real daux,
                     const Real* probs, const int32_t* expert, const Real* frac, int64_t N, int E,
                     int K, const RouterSpec& r) {
  ex.run(name, router_backward_cost(N, E, K, ex.elem),
         [&] { router_backward(dlogits, dgates, daux, probs, expert, frac, N, E, K, r); });
}

// Capacity over a batch split in consecutive parts (data parallelism): this
// part's assignments come after `earlier[e]` assignments of the earlier parts
// to expert e, in the global token order. counts (E) = this part's top-K
// assignments per expert (before any drop).
void moe_expert_counts(int64_t* counts,        // (E)
                       const int32_t* expert,  // (N,K)
                       int64_t N, int E, int K);
// With slots numbered locally (router_forward without a capacity), drops
// every assignment whose global position earlier[e] + slot reaches `capacity`,
// exactly as router_forward on the whole batch would. Returns the drops.
int64_t moe_apply_capacity(int32_t* slot,          // (N,K) in/out
                           const int32_t* expert,  // (N,K)
                           const int64_t* earlier,  // (E)
                           int64_t capacity, int64_t N, int K);

// Dispatch plan: the M kept assignments grouped by expert (ascending), token
// order within an expert. Row m of the expert buffers is assignment src[m]
// (= n*K + k); expert e owns rows offsets[e] .. offsets[e+1]-1. Returns M.
int64_t moe_plan(int64_t* src,           // (N*K), first M used
                 int64_t* offsets,       // (E+1)
                 const int32_t* expert,  // (N,K)
                 const int32_t* slot,    // (N,K)
                 int64_t N, int E, int K);

// xe[m] = x[src[m] / K]
template <typename Real>
void moe_dispatch_forward(Real* xe,            // (M,C)
                          const Real* x,       // (N,C)
                          const int64_t* src,  // (M)
                          int64_t M, int K, int C);
template <typename Real>
void moe_dispatch_backward(Real* dx,            // (N,C)
                           const Real* dxe,     // (M,C)
                           const int64_t* src,  // (M)
                           int64_t M, int K, int C);
// out[n] = Σ over kept assignments a = (n,k) of gates[a] · ye[row of a],
// summed in row order (expert order); rows of out without any kept
// assignment are 0. out is overwritten.
template <typename Real>
void moe_combine_forward(Real* out,           // (N,C)
                         const Real* ye,      // (M,C)
                         const Real* gates,   // (N,K)
                         const int64_t* src,  // (M)
                         int64_t N, int64_t M, int K, int C);
template <typename Real>
void moe_combine_backward(Real* dye,           // (M,C)
                          Real* dgates,        // (N,K)
                          const Real* dout,    // (N,C)
                          const Real* ye,      // (M,C)
                          const Real* gates,   // (N,K)
                          const int64_t* src,  // (M)
                          int64_t M, int K, int C);
OpCost moe_dispatch_cost(int64_t M, int64_t C, int elem);  // forward or backward
OpCost moe_combine_forward_cost(int64_t N, int64_t M, int64_t C, int elem);
OpCost moe_combine_backward_cost(int64_t M, int64_t C, int elem);
template <typename Real>
void moe_dispatch_forward(const Exec& ex, const char* name, Real* xe, const Real* x,
                          const int64_t* src, int64_t M, int K, int C) {
  ex.run(name, moe_dispatch_cost(M, C, ex.elem),
         [&] { moe_dispatch_forward(xe, x, src, M, K, C); });
}
template <typename Real>
void moe_dispatch_backward(const Exec& ex, const char* name, Real* dx, const Real* dxe,
                           const int64_t* src, int64_t M, int K, int C) {
  ex.run(name, moe_dispatch_cost(M, C, ex.elem),
         [&] { moe_dispatch_backward(dx, dxe, src, M, K, C); });
}
template <typename Real>
void moe_combine_forward(const Exec& ex, const char* name, Real* out, const Real* ye,
                         const Real* gates, const int64_t* src, int64_t N, int64_t M, int K,
                         int C) {
  ex.run(name, moe_combine_forward_cost(N, M, C, ex.elem),
         [&] { moe_combine_forward(out, ye, gates, src, N, M, K, C); });
}
template <typename Real>
void moe_combine_backward(const Exec& ex, const char* name, Real* dye, Real* dgates,
                          const Real* dout, const Real* ye, const Real* gates, const int64_t* src,
                          int64_t M, int K, int C) {
  ex.run(name, moe_combine_backward_cost(M, C, ex.elem),
         [&] { moe_combine_backward(dye, dgates, dout, ye, gates, src, M, K, C); });
}

}  // namespace shardlab::model
