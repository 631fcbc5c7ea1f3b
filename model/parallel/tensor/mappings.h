// Tensor-parallel communication as Megatron's conjugate pairs (mappings.py,
// picotron's tp_communications.py). Each region boundary is a pair of
// functions: what the forward does and what its backward does.
//
//   copy_to_tp_region               fwd: identity     bwd: all-reduce
//   reduce_from_tp_region           fwd: all-reduce   bwd: identity
//   gather_from_sequence_parallel   fwd: all-gather   bwd: reduce-scatter
//   reduce_scatter_to_sequence_par. fwd: reduce-scat. bwd: all-gather
//   scatter_to_sequence_parallel    fwd: split        bwd: all-gather
//
// Sequence-parallel layout: the N = B·T rows of an activation (row-major
// (N, C)) are split into tp contiguous blocks of N/tp rows; TP rank r holds
// rows [r·N/tp, (r+1)·N/tp). This is exactly the collectives' chunk layout
// (chunk_range) when N % tp == 0, so every SP collective works on the flat
// buffer with no reshuffling.
//
// `enter_*` / `exit_*` pick the pair of a column-parallel input / row-parallel
// output for the current mode (plain TP or sequence parallel).
//
// All collectives are the blocking forms: TP communication is on the critical
// path, so the compute stream waits for each result.
// Thread safety: called from the device's own thread, like the collectives.
#pragma once

#include <cstdint>

#include "collectives/collectives.h"
#include "model/parallel/layer_context.h"

namespace shardlab::parallel {

// What a TP layer needs besides its weights: the device (LayerContext), the
// TP group, the mode.
struct TpContext : LayerContext {
  const collectives::ProcessGroup* group = nullptr;
  bool sp = false;  // sequence parallelism
  // --tp-comm-overlap: the stream the overlapped collectives run on (below);
  // null: every collective blocks the compute stream.
  Stream* overlap = nullptr;

  int tp() const { return group->size(); }
  int rank() const { return group->rank(); }
};

// ---- The pairs ----------------------------------------------------------------

// Identity forward (the input is already replicated); nothing to do.
inline void copy_to_tp_region_fwd() {}
// out (n) = Σ_ranks partial (n): each rank's partial input gradient; out may alias partial.
void copy_to_tp_region_bwd(const TpContext& c, const float* partial, float* out, int64_t n);

// out (n) = Σ_ranks partial (n); partial may alias out.
void reduce_from_tp_region_fwd(const TpContext& c, const float* partial, float* out, int64_t n);
// Identity backward (the gradient is already replicated); nothing to do.
inline void reduce_from_tp_region_bwd() {}

// full (tp·n_local) = concatenation of every rank's local (n_local).
void gather_from_sequence_parallel_fwd(const TpContext& c, const float* local, float* full,
                                       int64_t n_local);
// dlocal (n_local) = my rows of Σ_ranks dfull (tp·n_local). dfull is clobbered.
void gather_from_sequence_parallel_bwd(const TpContext& c, float* dfull, float* dlocal,
                                       int64_t n_local);

// local (n_local) = my rows of Σ_ranks partial (tp·n_local). partial is clobbered.
void reduce_scatter_to_sequence_parallel_fwd(const TpContext& c, float* partial, float* local,
                                             int64_t n_local);
// dfull (tp·n_local) = concatenation of every rank's dlocal.
void reduce_scatter_to_sequence_parallel_bwd(const TpContext& c, const float* dlocal, float* dfull,
                                             int64_t n_local);

// local (n_local) = my rows of full (already replicated), no communication.
void scatter_to_sequence_parallel_fwd(const TpContext& c, const float* full, float* local,
                                      int64_t n_local);

// ---- Region boundaries for the current mode -----------------------------------
// rows_local: Nr (= N/tp with SP, N without); width: columns of the activation.

// Input of a column-parallel linear: (Nr, width) -> the full (N, width).
// Without SP returns `local` itself (copy_to, identity); with SP gathers into `full`.
const float* enter_column_parallel(const TpContext& c, const float* local, float* full,
                                   int64_t rows_local, int width);
// Backward of the above: partial full-row gradient (N, width) -> dlocal (Nr, width)
// (overwritten). Without SP all-reduce; with SP reduce-scatter. dfull may be clobbered.
void enter_column_parallel_bwd(const TpContext& c, float* dfull, float* dlocal, int64_t rows_local,
                               int width);
// Output of a row-parallel linear: partial (N, width) -> out (Nr, width).
// Without SP all-reduce; with SP reduce-scatter. partial is clobbered.
void exit_row_parallel(const TpContext& c, float* partial, float* out, int64_t rows_local,
                       int width);
// Backward of the above: dlocal (Nr, width) -> the full (N, width) gradient.
// Without SP returns dlocal itself; with SP all-gathers into dfull.
const float* exit_row_parallel_bwd(const TpContext& c, const float* dlocal, float* dfull,
                                   int64_t rows_local, int width);

// ---- Communication overlap (--tp-comm-overlap) --------------------------------
// Transformer Engine's userbuffers as NeMo runs them (ub_tp_comm_overlap;
// TE's initialize_ub methods, NeMo's ub_cfg_h100_*.yaml SM counts): with SP,
// the collective around each of a block's TP GEMMs runs on a side stream,
// pipelined with the GEMM, instead of blocking the compute stream. Only the
// transformer layers' linears (TE modules): the embedding and the LM head
// stay blocking. The data are the blocking forms' (one collective, the same
// bits); only the time differs. Each collective's duration D (its launch,
// latency and transfers, as the blocking form would take) is split evenly
// over its chunks. Without overlap (tp_overlapping false) each is the
// blocking form above.
bool tp_overlapping(const TpContext& c);

// ring_exchange (qkv_fprop, fc1_fprop; proj_dgrad, fc2_dgrad): the
// all-gather feeding the next GEMM, which runs as tp chunks of N/tp rows:
// chunk 0 is this rank's own rows (ready at once), chunk k arrives k·D/(tp-1)
// after the ring starts. The exchange is copy-engine p2p (num_sm 1).
// Forward: the input of a column-parallel linear (enter_column_parallel).
const float* gather_into_gemm(const TpContext& c, const float* local, float* full, int64_t rows_local, int width);
// Backward: the output gradient of a row-parallel linear (exit_row_parallel_bwd).
const float* gather_into_gemm_bwd(const TpContext& c, const float* dlocal, float* dfull, int64_t rows_local,
                                  int width);

// pipeline (proj_fprop, fc2_fprop): the reduce-scatter of the GEMM just
// charged, in kTpOverlapSplits chunks, chunk k's reduce-scatter (D/splits)
// starting when the GEMM's chunk k is done and the previous one has left; the
// GEMM ran on sm_count - kTpOverlapPipelineSms SMs (set_sm_margin). The
// compute stream waits for the last chunk: exposed, one chunk's D/splits when
// the GEMM is the longer. Replaces exit_row_parallel.
inline constexpr int kTpOverlapSplits = 4;           // num_splits
inline constexpr int kTpOverlapPipelineSms = 24;     // num_sm
void reduce_scatter_after_gemm(const TpContext& c, float* partial, float* out, int64_t rows_local, int width);

// bulk (qkv_dgrad, fc1_dgrad): the backward's re-gather of a column-parallel
// linear's input (for its wgrad), started now on the side stream; the compute
// stream goes on (its kernels share the SMs with it: `sms`).
const float* gather_for_wgrad(const TpContext& c, const float* local, float* full, int64_t rows_local, int width,
                              int sms);
// bulk (qkv_wgrad, fc1_wgrad): the input gradient's reduce-scatter, overlapped
// with the wgrad GEMM just charged (it starts with it: the dgrad before it
// produced the data), which ran on sm_count - sms SMs while they overlapped.
// The compute stream waits for it. Replaces enter_column_parallel_bwd.
void reduce_scatter_beside_wgrad(const TpContext& c, float* dfull, float* dlocal, int64_t rows_local, int width,
                                 int sms);

}  // namespace shardlab::parallel
