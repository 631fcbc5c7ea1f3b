// The sizes of a sharded transformer block, and how each parallelism splits
// them: the shared vocabulary of tensor/, expert/ and context/ and of the
// block that composes them (block.h). Buf is the host buffer every one of
// them cuts its activations from.
//
// Size letters: B batch, T time (this rank's tokens of a sequence: T/cp), N = B·T, Nr residual rows on this rank (N/tp
// with SP, else N), C n_embd, NHl local heads, HS head size, Cl = NHl·HS,
// Fl = F/tp (F the MLP width, 4C by default), E experts, K top-k, M kept MoE assignments, Rx expert rows.
#pragma once

#include <cstdint>

#include "model/buffer.h"
#include "model/layers.h"

namespace shardlab::parallel {

template <typename T>
using Buf = model::Buffer<T>;

// The unsharded sizes (model::Dims: B, T, C, NH, N(), HS()) and how they are
// split: heads and the MLP width over tp, rows over tp with SP, experts over
// ep, time over cp.
struct ShardDims : model::Dims {
  int tp = 1;
  bool sp = false;
  int ep = 1;  // expert-parallel ranks exchanging tokens (expert/ep_dispatch.h)
  // Expert tensor parallelism 1 under tp > 1 (sp): every expert whole, each
  // TP rank routing its own Nr rows through an EP group drawn from tp x dp.
  // false: experts split over tp like the MLP, the N gathered rows routed.
  bool experts_whole = false;
  int64_t moe_rows() const { return experts_whole ? rows() : N(); }  // the rows the router sees
  // DeepEP's dispatcher (expert/ep_node_dispatch.h): the nodes the EP group
  // spans, ep / ep_nodes ranks on each; 0: the all-to-all dispatcher.
  int ep_nodes = 0;
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
  // parallelism the log-sum-exp of every query row (attention_core.h).
  int64_t att_elements() const {
    return int64_t{B} * NHl() * T * (cp > 1 || flash ? 1 : T);
  }
  bool flash = false;  // the core is FusedAttention: it keeps the log-sum-exp
  int64_t rows() const { return sp ? N() / tp : N(); }             // Nr
  int64_t row0(int rank) const { return sp ? rank * rows() : 0; }  // first global row held
  int NHl() const { return NH / tp; }
  int Cl() const { return NHl() * HS(); }
  int Cv() const { return NHl() * HV(); }  // the values' width of this rank's heads (o_proj's input)
  int Fl() const { return ffn() / tp; }
  bool rope = false;  // rotary positions in attention (llama): no position table
  // Grouped-query attention (llama): kv K/V heads (0: NH), split over tp by
  // K/V heads when tp divides them, else held whole by every rank (KVl = kv).
  int kv = 0;
  int KV() const { return kv > 0 ? kv : NH; }
  bool kv_split() const { return KV() % tp == 0; }
  int KVl() const { return kv_split() ? KV() / tp : KV(); }
  // The llama projection's local row [q (NHl·HS) | k (KVl·HS) | v (KVl·HS)].
  int qkv_width() const { return (NHl() + 2 * KVl()) * HS(); }
  // Query head h of this TP rank reads K/V head gqa().kv_of(h) of its local ones.
  model::GqaHeads gqa(int tp_rank) const {
    return {NHl(), KVl(), HS(), NH / KV(), tp_rank * NHl(), kv_split() ? tp_rank * KVl() : 0};
  }
  // Query heads share K/V heads (GQA, MQA): the core needs the repeat_kv copy
  // (false: every query head has its own K/V head and the rows are already [q | k | v]).
  bool kv_repeated() const { return KV() != NH; }
};

}  // namespace shardlab::parallel
