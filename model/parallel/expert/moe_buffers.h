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
  // received from other ranks; backward moves the same again (DeepEP's
  // dispatcher: its backward's rail rows carry K values a token fewer,
  // C + K out and C back instead of C + 2K and C).
  uint64_t a2a_sent_bytes = 0;
  uint64_t a2a_recv_bytes = 0;
  uint64_t a2a_internode_sent_bytes = 0;  // of a2a_sent_bytes, to ranks on other nodes
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
    int64_t row_gemm_inputs = 0;  // of which the FP8 GEMMs' inputs: C + Fel
  } ep;
  // DeepEP's dispatcher (expert/ep_node_dispatch.cc; ShardDims::ep_nodes > 0):
  // a token crosses to each node that holds one of its experts once (the
  // rail exchange to the rank at this place there, the relay), the relay
  // hands it to the node's owners (the node exchange, one row per (token,
  // expert): rows `ep` above, over the node group) and sums their weighted
  // outputs before they cross back. Nn nodes of L ranks, En = L·El experts a node.
  struct Node {
    Buf<float> send_counts, recv_counts;         // (Nn·(1+En)) per node: tokens, then rows per node expert
    std::vector<size_t> rail_send, rail_recv;    // (Nn) rows to / from each node's relay (tokens)
    std::vector<size_t> node_send, node_recv;    // (L) floats to / from each rank of the node
    Buf<int64_t> tokens;                         // (sent) source: the token of each row sent, node-major
    Buf<int64_t> token_offsets;                  // (Nn+1)
    Buf<int64_t> row_token;                      // (Rn) relay: row -> received token
    Buf<int32_t> row_slot;                       // (Rn) relay: row -> the token's choice k
    Buf<float> row_gate;                         // (Rn) relay: row's gate
    Buf<float> y;                                // (Rn, C) relay: the owners' outputs, kept for backward
    int64_t sent = 0, U = 0, Rn = 0;             // rows sent, tokens relayed, rows relayed
    int C = 0;                                   // the row width; 0: the all-to-all dispatcher
  } node;
  // The kept assignments n·K + k grouped by expert (a.M of them): src, or in
  // a phantom run the plan's (moe.cc; valid until this thread routes again).
  const int64_t* routed = nullptr;
  MoeStats stats;
  void resize(const ShardDims& d, const model::GPTConfig& config);
  // What the layer keeps for backward (with EP the rows its experts
  // received in the last forward). fp8 (a Precision::kFp8 run): the inputs
  // of the experts' FP8 GEMMs (their rows for fc1, the activation's output
  // for fc2, the shared experts' too) are kept as Transformer Engine's
  // grouped linears keep them, in FP8: half a 2 B element (rounded up).
  int64_t saved_elements(bool fp8 = false) const;
};

// Scratch of the MoE layers' backward (and of EP's received rows), shared
// by all MoE blocks, overwritten by each call.
struct MoeScratch {
  Buf<float> dfc, dfc_gelu;  // the wider of (Rx, Fel) and (N, Fsl)
  Buf<float> dlogits;        // (N,E)
  Buf<float> dgates;         // (N,K)
  Buf<float> dxe, dye;       // (N*K, C)
  Buf<float> ep_xr, ep_yl;   // (Rx, C) EP: received rows
  // DeepEP's dispatcher: the rows a source sends to / receives from the
  // relays (N·min(K, Nn) rows of C + 2K), and a relay's (Nn·N rows of C + 2K).
  Buf<float> node_src, node_relay;
  std::vector<size_t> rail_send, rail_recv;  // (Nn) the rail exchange's floats to / from each node
  void resize(const ShardDims& d, const model::GPTConfig& config);
};

}  // namespace shardlab::parallel
