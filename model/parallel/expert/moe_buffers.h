// The activation and scratch buffers of an MoE layer (expert/moe.h,
// expert/ep_dispatch.h), its statistics for the report, and the rows its
// experts may process. Shapes use the letters of dims.h.
#pragma once

#include <cstdint>
#include <vector>

#include "model/config.h"
#include "model/layers.h"
#include "model/parallel/dims.h"
#include "model/parallel/local_model.h"

namespace shardlab::parallel {

// Rows the expert MLPs of one rank may process: N*K, or with expert
// parallelism ep*N*min(K, E/ep) (every peer's tokens routed to this rank).
int64_t expert_rows_max(const ShardDims& d, const model::GPTConfig& config);
// This rank's columns of one routed expert's MLP (Fel = moe_ffn_hidden()/tp)
// and of the shared experts' MLP (Fsl = shared_ffn_hidden()/tp, 0: none).
int expert_fl(const ShardDims& d, const model::GPTConfig& config);
int shared_fl(const ShardDims& d, const model::GPTConfig& config);
// The saved pre-activation's width for an MLP of Fl columns: 2·Fl for the
// llama family's SwiGLU ([gate | up]), Fl for GELU.
int fc_width(const model::GPTConfig& config, int Fl);

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

// The routing buffers are the unsharded model's (model/layers.h); the expert
// activations fc (Rx, fc_width), fc_gelu (Rx, Fel), Rx = expert_rows_max; the shared
// experts' shared_fc (N, fc_width), shared_fc_gelu (N, Fsl) and shared_out (N, C).
struct TpMoeActs : model::MoeActs<float> {
  // Global routing (ExpertContext::capacity_group): per expert, this rank's
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
    int64_t row_elems = 0;  // saved elements per received row: C + fc_width + Fel
  } ep;
  MoeStats stats;
  void resize(const ShardDims& d, const model::GPTConfig& config);
  // What the layer keeps for backward (with EP the rows its experts
  // received in the last forward).
  int64_t saved_elements() const;
};

// Scratch of the MoE layers' backward (and of EP's received rows), shared
// by all MoE blocks, overwritten by each call.
struct MoeScratch {
  Buf<float> dfc, dfc_gelu;  // the wider of (Rx, Fel) and (N, Fsl)
  Buf<float> dlogits;        // (N,E)
  Buf<float> dgates;         // (N,K)
  Buf<float> dxe, dye;       // (N*K, C)
  Buf<float> ep_xr, ep_yl;   // (Rx, C) EP: received rows
  void resize(const ShardDims& d, const model::GPTConfig& config);
};

}  // namespace shardlab::parallel
