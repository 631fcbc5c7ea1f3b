// Vocab-parallel embedding, tied LM head and cross-entropy (Megatron's
// VocabParallelEmbedding and vocab_parallel_cross_entropy).
//
// TP rank r owns the vocabulary rows [v0, v0 + Vl) of wte (Vl = V/tp,
// v0 = r·Vl). Embedding: each rank looks up the tokens it owns, zeros
// elsewhere, and the region exit (all-reduce, or reduce-scatter with SP) sums
// them: exactly one rank contributes a nonzero, so the sum is exact. The
// position embedding (replicated) is then added on this rank's rows.
//
// LM head: logits (N,Vl) = ln_f(x) · wte_localᵀ, never gathered. The loss
// per row is log Σ_v exp(z_v - m) + m - z_target with m the global max:
//   1. all-reduce(max) of the local row maxima            (N)
//   2. all-reduce(sum) of [local Σ exp(z - m) | z_target if owned, else 0]  (2N)
// and backward dlogits = (softmax - onehot) · dloss/N on the local columns.
//
// Size letters: N = B·T rows, Nr rows held (N/tp with SP), C, Vl.
#pragma once

#include <cstdint>

#include "model/kernels.h"
#include "model/parallel/dims.h"
#include "model/parallel/tensor/mappings.h"

namespace shardlab::parallel {

// encoded (Nr,C) = wte[inp] + wpe[t] for this rank's rows. partial (N,C) scratch.
void vocab_parallel_embedding_forward(float* encoded, float* partial, const model::Token* inp,
                                      const float* wte, const float* wpe, int64_t v0, int Vl,
                                      const ShardDims& d, const TpContext& c);
// dwte (Vl,C) += rows of the owned tokens; dwpe (T,C) += this rank's rows of dx.
// dx (Nr,C); dfull (N,C) scratch.
void vocab_parallel_embedding_backward(float* dwte, float* dwpe, float* dfull, const float* dx,
                                       const model::Token* inp, int64_t v0, int Vl,
                                       const ShardDims& d, const TpContext& c);

// Returns the mean loss over the N rows (the same bits on every rank).
// probs (N,Vl) saved; losses (N); stats (3N) scratch; logits (N,Vl).
float vocab_parallel_cross_entropy_forward(float* probs, float* losses, float* stats,
                                           const float* logits, const model::Token* targets,
                                           int64_t N, int Vl, int64_t v0, const TpContext& c);
// dlogits (N,Vl) += (probs - onehot(target if owned)) · dloss / N.
void vocab_parallel_cross_entropy_backward(float* dlogits, const float* probs,
                                           const model::Token* targets, float dloss, int64_t N,
                                           int Vl, int64_t v0, const model::Exec& ex);

}  // namespace shardlab::parallel
