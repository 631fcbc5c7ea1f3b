// Attention of new tokens over a sequence's cached keys and values (the
// decode kernel, and prefill's when the cache was empty).
//
// Sequence i of a step brings n_i new tokens at positions [p_i, p_i + n_i);
// their keys and values are already appended to the cache (kv_cache.h), so
// new token j attends to the cached rows 0 .. p_i + j (causal). Per head:
// softmax(q·kᵀ/√HS)·v over those rows, the same function as the training
// kernel (model/kernels.h attention_forward) computes on the whole sequence.
//
// Costs: one kernel each for the scores, the softmax and the context over
// the whole batch (as a batched decode kernel runs every sequence at once),
// each a roofline over its summed work (OpClass::kElementwise): at decode a
// query row reads all L cached keys and values, so the time grows with the
// context length L_i = p_i + n_i. Per sequence and local head (q = n_i):
//   scores   2·q·L·HS flops;  reads q (q·HS) and K (L·HS), writes q·L scores
//   softmax  5·q·L flops;     reads and writes q·L
//   context  2·q·L·HS flops;  reads q·L probabilities and V (L·HS), writes q·HS
//
// Size letters: NHl local heads, HS head size, Cl = NHl·HS, KVl the local
// K/V heads (NHl for multi-head attention).
#pragma once

#include <cstdint>
#include <vector>

#include "model/kernels.h"
#include "model/kernels_llama.h"

namespace shardlab::infer {

// The shape of one sequence in a step: q new tokens, L = keys attended by the last.
struct AttendShape {
  int64_t q = 0, L = 0;
};

// The K/V heads a rank caches out of those its projection computes (`held`):
// the ones its query heads read, heads q0 .. q0 + NHq - 1 over G each. Split
// over tp (tp divides the K/V heads) that is all of them; replicated (fewer
// K/V heads than tp, where every rank computes them all) only their own, as
// vLLM keeps max(1, kv/tp) per rank: tiny-llama's 2 over tp 4 cache one
// each, not two (which would give the GQA model less KV room than a
// multi-head one at the same tp).
inline model::GqaHeads cached_kv_heads(const model::GqaHeads& held) {
  model::GqaHeads g = held;
  g.kv0 = held.q0 / held.G;
  g.KVl = (held.q0 + held.NHq - 1) / held.G - g.kv0 + 1;
  return g;
}

// out (n, Cl) (row stride ld_out) = attention of the n new tokens whose q
// rows lead the rows of qkv (row stride ld_qkv: [q | k | v]) over keys /
// values (p0 + n, KVl·HS): query head h reads cached head g.kv_of(h)
// (grouped-query attention; multi-head: KVl = NHq, G = 1).
void cached_attention_forward(float* out, int64_t ld_out, const float* qkv, int64_t ld_qkv, const float* keys,
                              const float* values, int p0, int n, const model::GqaHeads& g);

model::AttentionCosts cached_attention_costs(const std::vector<AttendShape>& seqs, int64_t NHl,
                                             int64_t HS, int elem);

}  // namespace shardlab::infer
