// The llama family's kernels (RMSNorm, SwiGLU, rotary embeddings, the K/V
// head sharing of grouped-query attention), llm.c style like kernels.h:
// templated on Real, outputs first, backward kernels ACCUMULATE (+=) unless
// stated. Each has its *_cost beside it (defined in kernels_llama.cc) and an
// Exec overload (ex, name, the kernel's arguments) that runs it unless the
// run is phantom and charges that cost (Exec::run), as kernels.h's do.
//
// Size letters as in kernels.h, plus F the MLP width, KV the K/V heads, and
// G = NH/KV the query heads sharing one K/V head.
#pragma once

#include <cstdint>

#include "model/sink.h"
#include "runtime/cost_model.h"

namespace shardlab::model {

// ---- RMSNorm (Zhang & Sennrich 2019; Hugging Face's LlamaRMSNorm) -----------
// out = inp · rstd · weight, rstd = 1/sqrt(mean(inp²) + eps), no bias, no mean.
template <typename Real>
void rmsnorm_forward(Real* out,           // (N,C)
                     Real* rstd,          // (N) saved for backward
                     const Real* inp,     // (N,C)
                     const Real* weight,  // (C)
                     int64_t N, int C, double eps);
template <typename Real>
void rmsnorm_backward(Real* dinp,          // (N,C)
                      Real* dweight,       // (C)
                      const Real* dout,    // (N,C)
                      const Real* inp,     // (N,C)
                      const Real* weight,  // (C)
                      const Real* rstd,    // (N)
                      int64_t N, int C);
// Half a LayerNorm's work: no mean, no bias (and a single saved statistic).
OpCost rmsnorm_forward_cost(int64_t N, int64_t C, int elem);
OpCost rmsnorm_backward_cost(int64_t N, int64_t C, int elem);
// Unfused (KernelFusions::norm off): the ops of Llama's reference RMSNorm,
// x · rsqrt(mean(x²) + eps) · w, each a kernel, and in backward the kernels
// autograd runs for them (kernels_llama.cc has the counts; the fp32 casts of
// the reference are not counted).
OpChain<6> rmsnorm_unfused_forward_costs(int64_t N, int64_t C, int elem);
OpChain<10> rmsnorm_unfused_backward_costs(int64_t N, int64_t C, int elem);

// ---- QK-norm (Qwen3's q_norm and k_norm): RMSNorm over each head -------------
// In place over `heads` heads of HS features starting at x in every row of
// `stride` elements (the projection's q or k heads): x = x · rstd · weight,
// one rstd per (row, head), weight (HS) shared by the heads. The forward
// keeps the input in `saved` (N·heads·HS, contiguous) for the backward,
// which overwrites dx (the gradient of the output, in place) with the
// input's and accumulates dweight. Costs: rmsnorm's over N·heads rows of HS.
template <typename Real>
void head_rmsnorm_forward(Real* x, Real* saved, Real* rstd, const Real* weight, int64_t N, int heads, int HS,
                          int64_t stride, double eps);
template <typename Real>
void head_rmsnorm_backward(Real* dx, Real* dweight, const Real* saved, const Real* weight, const Real* rstd,
                           int64_t N, int heads, int HS, int64_t stride);

// ---- SwiGLU (Shazeer 2020): out = silu(gate) · up ----------------------------
// gate_up row n holds gate (F) then up (F): the fused [gate | up] GEMM output.
template <typename Real>
void swiglu_forward(Real* out,            // (N,F)
                    const Real* gate_up,  // (N,2F)
                    int64_t N, int F);
template <typename Real>
void swiglu_backward(Real* dgate_up,       // (N,2F)
                     const Real* dout,     // (N,F)
                     const Real* gate_up,  // (N,2F)
                     int64_t N, int F);
OpCost swiglu_forward_cost(int64_t N, int64_t F, int elem);
OpCost swiglu_backward_cost(int64_t N, int64_t F, int elem);
// Unfused (KernelFusions::swiglu off): Megatron-LM's swiglu without its
// fusion, chunk(x, 2) then silu(x[0]) * x[1]: two kernels forward, four in
// backward (the product's two gradients, silu's, and the chunk's cat).
OpChain<2> swiglu_unfused_forward_costs(int64_t N, int64_t F, int elem);
OpChain<4> swiglu_unfused_backward_costs(int64_t N, int64_t F, int elem);

// ---- Rotary position embedding (Su et al. 2021), rotate-half convention -----
// As Hugging Face's Llama: for a head vector x of HS features, half = HS/2,
// angle_i = pos · theta^(-2i/HS), and
//   out[i]        = x[i] cos − x[i + half] sin
//   out[i + half] = x[i + half] cos + x[i] sin        (i < half).
// Rotates `heads` consecutive heads of every row n = b·T + t, at features
// [0, heads·HS) of a row of `stride` elements, by position positions[t]:
// a context-parallel rank passes the global positions of its local tokens
// (positions null: t).
// RoPE is orthogonal: its backward is the inverse rotation. Both WRITE
// (out may be inp), they do not accumulate.
template <typename Real>
void rope_forward(Real* out, const Real* inp, const int64_t* positions, int B, int T, int heads, int HS,
                  int64_t stride, double theta);
template <typename Real>
void rope_backward(Real* dinp, const Real* dout, const int64_t* positions, int B, int T, int heads, int HS,
                   int64_t stride, double theta);
OpCost rope_cost(int64_t N, int64_t heads, int64_t HS, int elem);  // either direction

// ---- Grouped-query attention: K/V heads shared by G query heads -------------
// From a projection's rows [q (NHq·HS) | k (KVl·HS) | v (KVl·HS)] to the
// multi-head layout [q | k | v] of NHq heads each (the attention kernels'),
// query head h reading K/V head (q0 + h)/G − kv0: q0 is the global index of
// the first local query head and kv0 of the first local K/V head (0, 0
// unsharded; a TP rank holding all K/V heads passes kv0 0). This is Hugging
// Face's and Megatron-LM's repeat_kv / repeat_interleave before an unfused
// core attention. Backward sums each K/V head's G copies (accumulates).
struct GqaHeads {
  int NHq = 0, KVl = 0, HS = 0, G = 1, q0 = 0, kv0 = 0;
  int64_t in_width() const { return int64_t{NHq + 2 * KVl} * HS; }
  int64_t out_width() const { return 3 * int64_t{NHq} * HS; }
  int kv_of(int h) const { return (q0 + h) / G - kv0; }
};
template <typename Real>
void repeat_kv_forward(Real* out,       // (N, 3·NHq·HS)
                       const Real* in,  // (N, (NHq + 2·KVl)·HS)
                       int64_t N, const GqaHeads& g);
template <typename Real>
void repeat_kv_backward(Real* din,        // (N, (NHq + 2·KVl)·HS)
                        const Real* dout,  // (N, 3·NHq·HS)
                        int64_t N, const GqaHeads& g);
OpCost repeat_kv_cost(int64_t N, const GqaHeads& g, int elem);  // either direction

// ---- Exec overloads: run unless phantom, charge the cost as `name` -----------
// Unfused (ex.fusions), the same math charged as the chain's kernels, each
// under `name`.
template <typename Real>
void rmsnorm_forward(const Exec& ex, const char* name, Real* out, Real* rstd, const Real* inp,
                     const Real* weight, int64_t N, int C, double eps) {
  if (ex.fusions.norm)
    ex.run(name, rmsnorm_forward_cost(N, C, ex.elem), [&] { rmsnorm_forward(out, rstd, inp, weight, N, C, eps); });
  else
    ex.run_chain(name, rmsnorm_unfused_forward_costs(N, C, ex.elem),
                 [&] { rmsnorm_forward(out, rstd, inp, weight, N, C, eps); });
}
template <typename Real>
void rmsnorm_backward(const Exec& ex, const char* name, Real* dinp, Real* dweight, const Real* dout,
                      const Real* inp, const Real* weight, const Real* rstd, int64_t N, int C) {
  auto math = [&] { rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, N, C); };
  if (ex.fusions.norm)
    ex.run(name, rmsnorm_backward_cost(N, C, ex.elem), math);
  else
    ex.run_chain(name, rmsnorm_unfused_backward_costs(N, C, ex.elem), math);
}
template <typename Real>
void head_rmsnorm_forward(const Exec& ex, const char* name, Real* x, Real* saved, Real* rstd, const Real* weight,
                          int64_t N, int heads, int HS, int64_t stride, double eps) {
  ex.run(name, rmsnorm_forward_cost(N * heads, HS, ex.elem),
         [&] { head_rmsnorm_forward(x, saved, rstd, weight, N, heads, HS, stride, eps); });
}
template <typename Real>
void head_rmsnorm_backward(const Exec& ex, const char* name, Real* dx, Real* dweight, const Real* saved,
                           const Real* weight, const Real* rstd, int64_t N, int heads, int HS, int64_t stride) {
  ex.run(name, rmsnorm_backward_cost(N * heads, HS, ex.elem),
         [&] { head_rmsnorm_backward(dx, dweight, saved, weight, rstd, N, heads, HS, stride); });
}
// QK-norm of a projection's rows (N, (NHq + 2·KVl)·HS): q's heads with
// q_norm, then k's with k_norm, in place; their inputs kept in pre (q's
// N·NHq·HS, then k's N·KVl·HS) and rstd (N·NHq, then N·KVl).
template <typename Real>
void qk_norm_forward(const Exec& ex, Real* qkv, Real* pre, Real* rstd, const Real* q_norm, const Real* k_norm,
                     int64_t N, const GqaHeads& g, double eps) {
  const int64_t W = g.in_width(), Cq = int64_t{g.NHq} * g.HS;
  head_rmsnorm_forward(ex, "attn.q_norm.fwd", qkv, pre, rstd, q_norm, N, g.NHq, g.HS, W, eps);
  head_rmsnorm_forward(ex, "attn.k_norm.fwd", qkv + Cq, pre + N * Cq, rstd + N * g.NHq, k_norm, N, g.KVl, g.HS, W,
                       eps);
}
// dqkv: the gradient of the normalized q and k, made their inputs' in place;
// dq_norm and dk_norm accumulate.
template <typename Real>
void qk_norm_backward(const Exec& ex, Real* dqkv, Real* dq_norm, Real* dk_norm, const Real* pre, const Real* q_norm,
                      const Real* k_norm, const Real* rstd, int64_t N, const GqaHeads& g) {
  const int64_t W = g.in_width(), Cq = int64_t{g.NHq} * g.HS;
  head_rmsnorm_backward(ex, "attn.q_norm.bwd", dqkv, dq_norm, pre, q_norm, rstd, N, g.NHq, g.HS, W);
  head_rmsnorm_backward(ex, "attn.k_norm.bwd", dqkv + Cq, dk_norm, pre + N * Cq, k_norm, rstd + N * g.NHq, N, g.KVl,
                        g.HS, W);
}
template <typename Real>
void swiglu_forward(const Exec& ex, const char* name, Real* out, const Real* gate_up, int64_t N, int F) {
  auto math = [&] { swiglu_forward(out, gate_up, N, F); };
  if (ex.fusions.swiglu)
    ex.run(name, swiglu_forward_cost(N, F, ex.elem), math);
  else
    ex.run_chain(name, swiglu_unfused_forward_costs(N, F, ex.elem), math);
}
template <typename Real>
void swiglu_backward(const Exec& ex, const char* name, Real* dgate_up, const Real* dout, const Real* gate_up,
                     int64_t N, int F) {
  auto math = [&] { swiglu_backward(dgate_up, dout, gate_up, N, F); };
  if (ex.fusions.swiglu)
    ex.run(name, swiglu_backward_cost(N, F, ex.elem), math);
  else
    ex.run_chain(name, swiglu_unfused_backward_costs(N, F, ex.elem), math);
}
template <typename Real>
void rope_forward(const Exec& ex, const char* name, Real* out, const Real* inp, const int64_t* positions, int B,
                  int T, int heads, int HS, int64_t stride, double theta) {
  ex.run(name, rope_cost(int64_t{B} * T, heads, HS, ex.elem),
         [&] { rope_forward(out, inp, positions, B, T, heads, HS, stride, theta); });
}
template <typename Real>
void rope_backward(const Exec& ex, const char* name, Real* dinp, const Real* dout, const int64_t* positions,
                   int B, int T, int heads, int HS, int64_t stride, double theta) {
  ex.run(name, rope_cost(int64_t{B} * T, heads, HS, ex.elem),
         [&] { rope_backward(dinp, dout, positions, B, T, heads, HS, stride, theta); });
}
template <typename Real>
void repeat_kv_forward(const Exec& ex, const char* name, Real* out, const Real* in, int64_t N, const GqaHeads& g) {
  ex.run(name, repeat_kv_cost(N, g, ex.elem), [&] { repeat_kv_forward(out, in, N, g); });
}
template <typename Real>
void repeat_kv_backward(const Exec& ex, const char* name, Real* din, const Real* dout, int64_t N,
                        const GqaHeads& g) {
  ex.run(name, repeat_kv_cost(N, g, ex.elem), [&] { repeat_kv_backward(din, dout, N, g); });
}

}  // namespace shardlab::model
