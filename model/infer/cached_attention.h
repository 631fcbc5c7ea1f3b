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
#include "model/kernels_mla.h"

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

// The three kernels' costs over a batch: activations (q, scores,
// probabilities, outputs) at `elem` bytes, the cached keys and values read
// at `kv_elem` (0: elem; an FP8 cache: 1, dequantized in the kernel).
model::AttentionCosts cached_attention_costs(const std::vector<AttendShape>& seqs, int64_t NHl,
                                             int64_t HS, int elem, int kv_elem = 0);

// Multi-head latent attention (DeepSeek-V2/V3, GPTConfig::is_mla) of n new
// tokens over a sequence's latent cache (kv_cache.h: a row [c (Lkv) | k_pe
// (Dr)] a token, shared by the heads), in the absorbed form of DeepSeek-V2
// (sec. 2.1.2) that FlashMLA and vLLM's MLA decode run: head h's query
// without position goes through its key up-projection into the latent
// space, q~ = W_UK(h)ᵀ·q_nope (W_UK(h): kv_b_proj's Dn k rows of head h),
// the scores are (q~·c + q_pe·k_pe)/√(Dn + Dr), the context stays latent
// (Σ p·c) and W_UV(h) (the head's Dv v rows) takes it to the head's values.
// The same function as the training model's up-projected attention
// (model/layers_mla.cc) up to rounding. q (n rows, stride ld_q): per local
// head [q_nope (Dn) | rotated q_pe (Dr)]; kv_up: this rank's (NH·(Dn + Dv),
// Lkv) rows of kv_b_proj; out (n, NH·Dv), row stride ld_out.
void mla_cached_attention_forward(float* out, int64_t ld_out, const float* q, int64_t ld_q, const float* latents,
                                  const float* kv_up, int p0, int n, const model::MlaHeads& h, int Lkv);

// The kernels of one step's MLA attention. A decode sequence (one new
// token) runs absorbed: q_absorb (a batched GEMM per head, Dn -> Lkv), the
// scores over Lkv + Dr features, the softmax, the latent context (Lkv) and
// v_up (a batched GEMM per head, Lkv -> Dv); the cache is read once per
// sequence for all heads (they share it, as FlashMLA's tiles do). A prefill
// sequence (several new tokens) up-projects its cached latents instead
// (kv_up: L rows through kv_b_proj) and attends on heads of Dn + Dr with
// values of Dv, as vLLM's MLA prefill does: absorbed, its scores would cost
// (Lkv + Dr)/(Dn + Dr) times the FLOPs (3x for DeepSeek-V3's 576/192) where
// prefill is compute-bound. Zero costs: no sequence of that kind. The
// decode kernels read the cached rows at `kv_elem` bytes (0: elem; an FP8
// cache: 1, FlashMLA's FP8 kernel); the prefill's kv_up reads them as
// activations (vLLM dequantizes an FP8 cache's latents first; that copy is
// not charged).
struct MlaAttendCosts {
  OpCost kv_up, q_absorb, scores, softmax, context, v_up;
};
MlaAttendCosts mla_cached_attention_costs(const std::vector<AttendShape>& seqs, const model::MlaHeads& h, int Lkv,
                                          int elem, int kv_elem = 0);

}  // namespace shardlab::infer
