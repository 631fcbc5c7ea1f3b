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
// Size letters: B batch, T time, N = B·T, Nr residual rows on this rank (N/tp
// with SP, else N), C n_embd, NHl local heads, HS head size, Cl = NHl·HS,
// Fl = 4C/tp, E experts, K top-k, M kept MoE assignments.
// Backward accumulates into dinp and the gradient views, like model/layers.h.
#pragma once

#include <cstdint>
#include <vector>

#include "model/buffer.h"
#include "model/config.h"
#include "model/layers.h"
#include "model/parallel/local_model.h"
#include "model/parallel/tensor/mappings.h"

namespace shardlab::parallel {

template <typename T>
using Buf = model::Buffer<T>;

struct TpDims {
  int B = 0, T = 0, C = 0, NH = 0;  // global sizes
  int tp = 1;
  bool sp = false;
  int ep = 1;  // expert-parallel ranks exchanging tokens (expert/ep_dispatch.h)
  int64_t N() const { return static_cast<int64_t>(B) * T; }
  int64_t rows() const { return sp ? N() / tp : N(); }             // Nr
  int64_t row0(int rank) const { return sp ? rank * rows() : 0; }  // first global row held
  int NHl() const { return NH / tp; }
  int HS() const { return C / NH; }
  int Cl() const { return NHl() * HS(); }
  int Fl() const { return 4 * C / tp; }
};

// Rows the expert MLPs of one rank may process: N*K, or with expert
// parallelism ep*N*min(K, E/ep) (every peer's tokens routed to this rank).
int64_t expert_rows_max(const TpDims& d, const model::GPTConfig& config);

// What one MoE layer did in the last forward / backward, for the report.
struct MoeStats {
  int expert_begin = 0;    // first expert held (0 without EP)
  Buf<int64_t> received;   // (El) rows each held expert processed in the last forward
  int64_t dropped = 0;     // this rank's assignments over capacity in the last forward
  // Modeled bytes the forward's all-to-alls (dispatch + combine) sent to /
  // received from other ranks; backward moves exactly the same again.
  uint64_t a2a_sent_bytes = 0;
  uint64_t a2a_recv_bytes = 0;
};

// Adds one forward's block statistics into the step's (sizing it on first use).
void add_moe_stats(MoeStepStats& step, int layer, const MoeStats& forward);

struct TpMoeActs {
  Buf<float> logits, probs;   // (N,E)
  Buf<int32_t> expert, slot;  // (N,K)
  Buf<float> gates;           // (N,K)
  Buf<float> frac;            // (E)
  Buf<int64_t> src;           // (N*K), first M used
  Buf<int64_t> offsets;       // (E+1)
  int64_t M = 0;
  Buf<float> xe, ye;       // (N*K, C), first M rows used
  Buf<float> fc, fc_gelu;  // (Rx, Fl) Rx = expert_rows_max
  float aux = 0;
  // Global routing (TpContext::capacity_group): per expert, this rank's
  // assignments and the earlier replicas'; every replica's counts.
  Buf<int64_t> counts, earlier;  // (E)
  Buf<float> gathered;           // (dp*E)
  // Expert parallelism (expert/ep_dispatch.cc): the M rows go to the ranks owning their
  // experts; this rank's El experts run on the R rows it received, regrouped
  // expert-major (expert, then source rank, then the source's order).
  struct Ep {
    Buf<float> send_rows, recv_rows;             // (E), (ep*El) rows per (peer, expert)
    std::vector<size_t> send_elems, recv_elems;  // (ep) floats to / from each peer
    Buf<int64_t> offsets;                        // (El+1) expert-major rows of local experts
    Buf<int64_t> perm;                           // (Rx) expert-major row -> received row
    Buf<float> xl;                               // (Rx, C) expert inputs, kept for backward
    int64_t R = 0;
    int64_t row_elems = 0;  // saved elements per received row: C + 2·Fl
  } ep;
  MoeStats stats;
  void resize(const TpDims& d, const model::GPTConfig& config);
};

struct TpBlockActs {
  Buf<float> ln1, ln2;                      // (Nr,C)
  Buf<float> ln1_mean, ln1_rstd;            // (Nr)
  Buf<float> ln2_mean, ln2_rstd;            // (Nr)
  Buf<float> qkv;                           // (N,3Cl) local heads' [q | k | v]
  Buf<float> att;                           // (B,NHl,T,T)
  Buf<float> atty;                          // (N,Cl)
  Buf<float> attproj, res1, mlp_out, res2;  // (Nr,C)
  Buf<float> fc, fc_gelu;                   // (N,Fl) dense blocks
  TpMoeActs moe;                            // MoE blocks
  void resize(const TpDims& d, const model::GPTConfig& config, bool moe_block);
  int64_t saved_elements() const;  // what the block keeps for backward
};

// Scratch shared by all blocks, overwritten by each call.
struct TpScratch {
  Buf<float> full_in, full_dout, partial, rep, moe_out;  // (N,C)
  Buf<float> dres1, dln;                                 // (Nr,C)
  Buf<float> datty;                                      // (N,Cl)
  Buf<float> dqkv;                                       // (N,3Cl)
  Buf<float> dfc, dfc_gelu;                              // (max(N, Rx), Fl)
  Buf<float> dlogits;                                    // (N,E)
  Buf<float> dgates;                                     // (N,K)
  Buf<float> dxe, dye;                                   // (N*K, C)
  Buf<float> ep_xr, ep_yl;                               // (Rx, C) EP: received rows
  void resize(const TpDims& d, const model::GPTConfig& config);
};

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
                     const model::Exec& ex);

// x (Nr,C) -> a.res2 (Nr,C). Returns the block's aux loss (0 if dense).
float tp_block_forward(TpBlockActs& a, const model::BlockView<float>& p, const float* x,
                       const TpDims& d, const model::GPTConfig& config, TpScratch& s,
                       const TpContext& c);
// dinp (Nr,C) += d block / d x given dout (Nr,C); gradients into g.
void tp_block_backward(float* dinp, const model::BlockView<float>& g, TpScratch& s,
                       const float* dout, float daux, const TpBlockActs& a, const float* inp,
                       const model::BlockView<float>& p, const TpDims& d,
                       const model::GPTConfig& config, const TpContext& c);

// ---- MoE pieces shared by expert/moe.cc and expert/ep_dispatch.cc ------------------------------

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
                         const int64_t* offsets, int n, const TpDims& d, const model::Exec& ex);
// s.dye (M,C) and s.dgates (N,K) from dout (N,C) (combine backward).
void tp_moe_combine_backward(TpScratch& s, const float* dout, const TpMoeActs& a,
                             const TpDims& d, const model::GPTConfig& config,
                             const model::Exec& ex);
// Dispatch backward of s.dxe (M,C) into dexperts, and the router's backward
// (from s.dgates and daux) into drouter and g.router.
void tp_moe_route_backward(float* dexperts, float* drouter, const model::BlockView<float>& g,
                           TpScratch& s, float daux, const TpMoeActs& a, const float* inp,
                           const model::BlockView<float>& p, const TpDims& d,
                           const model::GPTConfig& config, const model::Exec& ex);

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
                     const model::GPTConfig& config, const TpContext& c);

}  // namespace shardlab::parallel
