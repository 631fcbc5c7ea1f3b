// Mixture-of-Experts kernels: route -> dispatch -> experts -> combine
// (Megatron-core vocabulary). Included from kernels.h; same size letters and
// conventions (outputs first, backward accumulates with +=).
//
// Routing: probs = softmax(router logits) over E experts; each token picks the
// K experts of highest prob (ties to the lower index, listed by descending
// prob); gates = those K probs renormalised to sum to 1. Load-balancing loss
// aux = E · Σ_i f_i · P_i with f_i = (top-K assignments to expert i, counted
// before any capacity drop) / (N·K), a constant, and P_i = mean_n probs[n,i].
// With a capacity factor F > 0 each expert takes at most ⌈F·N·K/E⌉
// assignments in token order; later ones are dropped (slot = -1) and
// contribute nothing, while the kept gates keep their renormalised values.
#pragma once

#include <cstdint>

#include "model/sink.h"
#include "runtime/cost_model.h"

namespace shardlab::model {

// Assignments one expert may take: ⌈F·N·K/E⌉, or N (no limit) when F <= 0.
int64_t expert_capacity(int64_t N, int E, int K, double capacity_factor);

template <typename Real>
Real router_forward(Real* probs,         // (N,E) softmax over experts
                    int32_t* expert,     // (N,K) chosen experts
                    int32_t* slot,       // (N,K) row in the expert's queue, -1 dropped
                    Real* gates,         // (N,K) renormalised probs
                    Real* frac,          // (E) f_i, constant in backward
                    const Real* logits,  // (N,E) router logits (x · Wrᵀ)
                    int64_t N, int E, int K, double capacity_factor);
// dgates: gradient of the loss w.r.t. gates; daux: w.r.t. the returned aux.
template <typename Real>
void router_backward(Real* dlogits,       // (N,E)
                     const Real* dgates,  // (N,K)
                     Real daux,
                     const Real* probs,      // (N,E)
                     const int32_t* expert,  // (N,K)
                     const Real* frac,       // (E)
                     int64_t N, int E, int K);
OpCost router_forward_cost(int64_t N, int64_t E, int64_t K, int elem);
// The load-balancing loss for given fractions: E · Σ_i frac[i] · P_i with P_i
// the mean of probs[:, i] over the N rows (after frac was averaged over
// data-parallel replicas or counted over the global batch).
template <typename Real>
Real moe_aux_loss(const Real* frac,   // (E)
                  const Real* probs,  // (N,E)
                  int64_t N, int E);
OpCost router_backward_cost(int64_t N, int64_t E, int64_t K, int elem);
template <typename Real>  // kernels.h: the Exec overloads
void router_backward(const Exec& ex, const char* name, Real* dlogits, const Real* dgates, Real daux,
                     const Real* probs, const int32_t* expert, const Real* frac, int64_t N, int E,
                     int K) {
  ex.run(name, router_backward_cost(N, E, K, ex.elem),
         [&] { router_backward(dlogits, dgates, daux, probs, expert, frac, N, E, K); });
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
