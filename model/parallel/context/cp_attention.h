// CpAttention: the attention core under context parallelism (--cp N).
//
// Every sequence is cut into 2N chunks of T/(2N) tokens; cp rank i holds
// chunks i and 2N−1−i (causal load balancing, as Megatron-core and
// Transformer Engine lay it out: every rank does the same attention work).
// The layers around attention are per token and run on the local rows; the
// position embedding reads each row's global position (ShardDims::position).
// Attention needs every earlier key, so the keys and values travel (with
// grouped-query attention only the K/V heads, KV·HS per token each, not their
// copies for every query head):
//
//   ring       (Liu et al., ring attention; Megatron-core's CP) N steps; at
//              step s a rank holds the [k | v] rows of cp rank (i−s) mod N,
//              sends them on to rank i+1 and receives the next block from
//              rank i−1 by point to point on the ring's own stream (of kind
//              StreamKind::kCpComm) while the compute stream runs the
//              block's chunk pairs (online softmax, block_attention.h).
//              Backward sends the blocks around again; each rank computes
//              its dK/dV contribution to the block it holds into a fresh
//              buffer, then adds the partial sum that came from rank i−1
//              (which travelled during this compute) and sends the sum on;
//              a last hop returns it to its owner.
//   allgather  (Llama 3) an all-gather of every rank's [k | v] rows on the
//              compute stream, then the same chunk pairs; backward gathers
//              again and reduce-scatters dK/dV.
//
// Of the 4 chunk pairs of (my chunks) × (a block's chunks), those with later
// keys are skipped, same-position pairs are diagonal (half the work): each
// step costs every rank the same, 2 full pairs.
//
// The ring's stream is its own, not the device's communication stream:
// Transformer Engine sends the blocks with torch.distributed isend/irecv
// over the cp group (context_parallel.py, flash_attn_p2p_communicate), and
// PyTorch runs each process group's NCCL work on that group's own stream
// (ProcessGroupNCCL), so the ring never waits behind the data-parallel
// gradient reduce-scatter that Megatron launches on the dp group's stream
// during backward. On a port the two share the bandwidth (runtime/port.h).
//
// `exposed()` is the compute stream's wait for K/V blocks (ring: a block
// not yet arrived, the last dK/dV hop; allgather: the collectives), summed
// over the calls — the part of the communication the kernels do not hide.
//
// The buffers are charged to the arena as activations while a call runs:
// the ring holds two K/V blocks (four with dK/dV in backward), which shrink
// as 1/cp; the all-gather every rank's, the whole sequence's K/V at any cp.
//
// Folding (model/engine/fold.h). In a phantom run whose cp ranks fold, a
// ring transfer whose receiver is folded is not posted to it: the
// representative books its own send as the unfolded run does and hands
// the same message to the running devices whose predecessor on their ring
// is a member it plays (Device::isend_folded), as if that member had sent
// it. That is exact when every member it plays sends over the link this
// device sends over, receives over the link it receives over, from a
// member played by the same device as its own predecessor: fold() checks
// that before the run and throws FoldingError otherwise.
//
// Thread safety: one instance per device thread (the buffers are scratch).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "collectives/group.h"
#include "collectives/mesh.h"
#include "model/parallel/attention_core.h"
#include "model/parallel/context/block_attention.h"
#include "model/parallel/context/cp_comm.h"

namespace shardlab::parallel {

class CpAttention final : public AttentionCore {
 public:
  // tp_rank: this rank's place in its TP group, which of the query heads it
  // holds (grouped-query attention: which K/V heads they read). `fused`
  // (--attention fused): the chunk pairs' scores stay on chip
  // (block_attention_forward_cost's on_chip).
  CpAttention(const collectives::ProcessGroup& cp, CpComm comm, int tp_rank = 0, bool fused = false)
      : cp_(cp), comm_(comm), tp_rank_(tp_rank), fused_(fused) {}

  void forward(float* atty, float* att, const float* qkv, const ShardDims& d,
               const LayerContext& c) const override;
  void backward(float* dqkv, const float* datty, const float* qkv, const float* atty,
                const float* att, const ShardDims& d, const LayerContext& c) const override;
  bool fused() const override { return fused_; }

  // A folded phantom run (dev.folding()): checks that every rank `dev`
  // plays runs its ring as `dev` does (mesh: the run's; its cp groups) and
  // plans where this device's ring sends go. Throws FoldingError if not.
  void fold(const Device& dev, const collectives::DeviceMesh& mesh);

  Time exposed() const { return exposed_; }
  uint64_t sent_bytes() const { return sent_bytes_; }  // modeled bytes of the ring's sends

 private:
  // The chunk pairs of my chunks over the block of cp rank `src`, in order.
  void forward_block(const float* qkv, const float* kv, int src, const ShardDims& d,
                     const LayerContext& c) const;
  void backward_block(float* dqkv, float* dkv, const float* datty, const float* qkv,
                      const float* kv, const float* lse, int src, const ShardDims& d,
                      const LayerContext& c) const;
  // The chunk kernels' sizes: with grouped-query attention (d.kv_repeated())
  // the K/V heads this rank's query heads read, once each.
  BlockDims block_dims(const ShardDims& d) const;
  int64_t kv_elements(const ShardDims& d) const;  // a K/V block: N · 2 · KV · HS
  // kv (N, 2·KV·HS) = the [k | v] of each K/V head from the repeated qkv (N, 3·Cl).
  void pack_kv(float* kv, const float* qkv, const ShardDims& d, const LayerContext& c) const;
  // The ring's stream on this device (made at the first ring call).
  Stream& ring(const LayerContext& c) const;
  // Ring transfers on the ring's stream, tagged by the call, what
  // travels (0 K/V, 1 dK/dV) and the ring step; join_compute makes the
  // compute stream wait for what arrived (the wait counted as exposed).
  Tag tag(int what, int step) const { return kRingTag + (call_ << 16) + (uint64_t(what) << 8) + uint64_t(step); }
  void send_next(const float* data, int64_t n, Tag t, const LayerContext& c) const;
  void recv_prev(float* into, int64_t n, Tag t, const LayerContext& c) const;
  void join_compute(const LayerContext& c) const;
  void gather_kv(const float* qkv, const ShardDims& d, const LayerContext& c) const;
  void ring_forward(const float* qkv, const ShardDims& d, const LayerContext& c) const;
  void ring_backward(float* dqkv, const float* datty, const float* qkv, const float* lse,
                     const ShardDims& d, const LayerContext& c) const;

  static constexpr Tag kRingTag = 0x4350'5247'0000'0000ull;  // "CPRG"
  collectives::ProcessGroup cp_;
  CpComm comm_;
  int tp_rank_ = 0;
  bool fused_ = false;
  // fold(): whether this device's ring sends go by isend_folded, and where.
  bool fold_sends_ = false;
  std::vector<Device::Delivery> deliveries_;
  mutable std::unique_ptr<Stream> ring_;
  mutable Buf<float> kv_, kv_next_, dkv_, dkv_in_, acc_, m_, l_, delta_, all_kv_, all_dkv_;
  mutable uint64_t call_ = 0;  // forward and backward calls so far (the same on every cp rank)
  mutable Time exposed_ = 0;
  mutable uint64_t sent_bytes_ = 0;
};

}  // namespace shardlab::parallel
