// The attention of one query chunk over one key/value chunk, the unit of
// context parallelism (cp_attention.h), in the flash-attention form: the
// forward keeps a running maximum m and sum l per query row and accumulates
// the unnormalized output (online softmax); the backward recomputes the
// probabilities from the saved log-sum-exp, so no T×T matrix is kept.
//
// Layouts (letters of dims.h, T the local tokens of a sequence):
//   qkv   (B·T, 3·Cl)  the local [q | k | v] rows, query chunk at rows q0..q0+len
//   kv    (B·T, 2·KV·HS) a rank's [k | v] rows of its KV K/V heads (its own,
//                       or a peer's from the ring), key chunk at rows
//                       k0..k0+len of every sequence; query head h reads
//                       K/V head kv_of(h) (GQA: G query heads per K/V head)
//   acc   (B·T, Cl)    the unnormalized output; m, l, lse (B, NHl, T)
//   dkv   (B·T, 2·KV·HS) the gradient of kv, accumulated (over a group's heads too)
//
// `diagonal`: the two chunks hold the same positions, so query i sees keys
// 0..i of the chunk (the causal mask); otherwise every key is earlier.
#pragma once

#include <cstdint>

#include "runtime/cost_model.h"

namespace shardlab::parallel {

struct ChunkPair {
  int64_t q0 = 0, k0 = 0;  // first row of the query and of the key chunk in a sequence
  int64_t len = 0;         // tokens per chunk
  bool diagonal = false;
};

struct BlockDims {
  int B = 0, T = 0, NH = 0, HS = 0;  // NH: local heads
  // Grouped-query attention: the kv rows hold KV heads (0: NH, one per
  // query head); local query head h is global head q0 + h, and global query
  // heads g·G .. g·G + G − 1 share K/V head g.
  int KV = 0, G = 1, q0 = 0;
  // MLA: the values' head size (0: HS). q and k keep HS; v, the output
  // accumulator and the kv rows' v part are HV wide, so the ring carries
  // what a GPU would; the core's qkv and atty rows stay padded to HS
  // (attention_core.h): v's padding is not read, atty's is written zero.
  int HV = 0;
  int hv() const { return HV > 0 ? HV : HS; }
  int64_t C() const { return int64_t{NH} * HS; }
  int64_t KVC() const { return int64_t{KV > 0 ? KV : NH} * HS; }
  int64_t KVV() const { return int64_t{KV > 0 ? KV : NH} * hv(); }
  int64_t KVW() const { return KVC() + KVV(); }   // a kv row: [k (KVC) | v (KVV)]
  int64_t Cv() const { return int64_t{NH} * hv(); }  // an accumulator row
  int kv_of(int h) const { return (q0 + h) / G - q0 / G; }
};

// m starts at -inf, l and acc at 0 for every row; each pair updates them.
void block_attention_forward(float* acc, float* m, float* l, const float* qkv, const float* kv,
                             const BlockDims& d, const ChunkPair& p);
// atty = acc / l and lse = m + log(l), every row (each saw at least its own key).
void block_attention_finish(float* atty, float* lse, const float* acc, const float* m,
                            const float* l, const BlockDims& d);
// delta (B, NH, T) = Σ over a head's features of datty ⊙ atty (FlashAttention's D).
void block_attention_delta(float* delta, const float* datty, const float* atty, const BlockDims& d);
// dqkv's q columns and dkv += the pair's gradients.
void block_attention_backward(float* dqkv, float* dkv, const float* datty, const float* qkv,
                              const float* kv, const float* lse, const float* delta,
                              const BlockDims& d, const ChunkPair& p);

// The kernel of one pair: q·kᵀ and p·v as GEMMs of (len × len) per head,
// online softmax; a diagonal pair does half the work (half the keys per
// query on average: the kernel skips the tiles above the diagonal).
// `on_chip` (--attention fused): one FlashAttention kernel per pair, whose
// scores stay in the SMs, so each GEMM is charged its tiles' time, not its
// operands' HBM time (attention_gemms); otherwise each GEMM is charged at
// the larger of the two, its len × keys scores written out and read back.
OpCost block_attention_forward_cost(const BlockDims& d, int64_t len, bool diagonal, int elem, bool on_chip);
// Recomputes q·kᵀ, dout·vᵀ; dv, dq, dk: five GEMMs of the pair's size.
OpCost block_attention_backward_cost(const BlockDims& d, int64_t len, bool diagonal, int elem, bool on_chip);

}  // namespace shardlab::parallel
