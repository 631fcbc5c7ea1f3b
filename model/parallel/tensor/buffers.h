// The activation and scratch buffers of the tensor-parallel blocks (and of
// the MoE layers inside them), and the sizes they are cut from.
//
// Size letters: B batch, T time (this rank's tokens of a sequence: T/cp), N = B·T, Nr residual rows on this rank (N/tp
// with SP, else N), C n_embd, NHl local heads, HS head size, Cl = NHl·HS,
// Fl = F/tp (F the MLP width, 4C by default), E experts, K top-k, M kept MoE assignments, Rx expert rows.
#pragma once

#include <cstdint>
#include <vector>

#include "model/buffer.h"
#include "model/config.h"
#include "model/layers.h"
#include "model/parallel/local_model.h"

namespace shardlab::parallel {

template <typename T>
using Buf = model::Buffer<T>;

// The unsharded sizes (model::Dims: B, T, C, NH, N(), HS()) and how they are split.
struct TpDims : model::Dims {
  int tp = 1;
  bool sp = false;
  int ep = 1;  // expert-parallel ranks exchanging tokens (expert/ep_dispatch.h)
  // Context parallelism: T is this rank's share of each sequence, chunks
  // cp_rank and 2·cp−1−cp_rank of the 2·cp chunks of T/2 tokens (causal load
  // balancing, Megatron-core's and Transformer Engine's layout).
  int cp = 1, cp_rank = 0;
  // The position in the whole sequence of local time t (wpe's row, the causal mask).
  int64_t position(int64_t t) const {
    if (cp == 1) return t;
    const int64_t c = T / 2;
    return t < c ? cp_rank * c + t : (2 * cp - 1 - cp_rank) * c + (t - c);
  }
  // The attention core's saved state: the probabilities, or under context
  // parallelism the log-sum-exp of every query row (tensor/attention.h).
  int64_t att_elements() const {
    return int64_t{B} * NHl() * T * (cp > 1 ? 1 : T);
  }
  int64_t rows() const { return sp ? N() / tp : N(); }             // Nr
  int64_t row0(int rank) const { return sp ? rank * rows() : 0; }  // first global row held
  int NHl() const { return NH / tp; }
  int Cl() const { return NHl() * HS(); }
  int Fl() const { return ffn() / tp; }
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

// The routing buffers are the unsharded model's (model/layers.h); the expert
// activations fc, fc_gelu are (Rx, Fl), Rx = expert_rows_max.
struct TpMoeActs : model::MoeActs<float> {
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
  Buf<float> att;                           // TpDims::att_elements()
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

}  // namespace shardlab::parallel
