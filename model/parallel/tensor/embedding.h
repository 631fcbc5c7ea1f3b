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
// The cross-entropy is charged as one fused kernel (model::crossentropy_*_cost:
// the logits read and the softmax written, then read again with dlogits
// written), or, `unfused`, as Megatron-LM's vocab_parallel_cross_entropy ran
// (megatron/mpu/cross_entropy.py, 2019 until --cross-entropy-loss-fusion in
// 2024, without --fp16-lm-cross-entropy): the logits cast to fp32
// (`output.float()` in post_language_model_processing), then one PyTorch
// kernel per step over this rank's N x Vl fp32 logits, each through HBM:
//   forward:  cast (read elem, write 4 B; none at fp32), max (read 4),
//             subtract the max in place (4 + 4), exp in place (4 + 4), sum
//             (read 4), divide by the sum in place (4 + 4): 32 B per logit,
//             plus elem + 4 for the cast;
//   backward: the saved softmax times the loss gradient in place (4 + 4),
//             then cast back to the logits' precision (read 4, write elem):
//             8 B per logit, plus 4 + elem for the cast.
// At bf16 (elem 2) 38 + 14 = 52 B per logit, where one fused kernel would
// move 10 (model::crossentropy_*_cost). The one-hot term, the target's logit
// and the per-row statistics are O(N) (4 B per row each way).
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
// `unfused`: charged as Megatron-LM's fp32 kernels (above).
float vocab_parallel_cross_entropy_forward(float* probs, float* losses, float* stats,
                                           const float* logits, const model::Token* targets,
                                           int64_t N, int Vl, int64_t v0, const TpContext& c,
                                           bool unfused = false);
// dlogits (N,Vl) += (probs - onehot(target if owned)) · dloss / N.
void vocab_parallel_cross_entropy_backward(float* dlogits, const float* probs,
                                           const model::Token* targets, float dloss, int64_t N,
                                           int Vl, int64_t v0, const model::Exec& ex,
                                           bool unfused = false);
// The costs of Megatron-LM's unfused fp32 kernels (above), at the logits'
// element size `elem`.
OpCost vocab_parallel_cross_entropy_forward_cost(int64_t N, int64_t Vl, int elem);
OpCost vocab_parallel_cross_entropy_backward_cost(int64_t N, int64_t Vl, int elem);

}  // namespace shardlab::parallel
