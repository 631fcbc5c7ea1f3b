// GPT kernels on plain host buffers, llm.c style.
//
// Every kernel is a free function templated on the scalar type `Real` (float
// for training, double for gradient checks; explicit instantiations live in
// the .cc files). Arguments: outputs first, then saved activations, then
// inputs and weights, then sizes. Backward kernels take d-prefixed buffers and
// ACCUMULATE into them with +=, so callers zero gradients once per step.
// All buffers are row-major and contiguous unless a stride is stated.
//
// Size letters used in the shape comments:
//   B  batch (sequences)         T  sequence length (time)
//   N  rows = B*T tokens         C  channels (n_embd); OC output channels
//   NH attention heads           HS head size, C = NH*HS
//   V  vocabulary size           E  experts, K experts per token (top-k)
//   M  kept (token, expert) assignments of a MoE layer, M <= N*K
//
// Each kernel has a *_cost function returning the modeled FLOPs and bytes
// (reads + writes at `elem` bytes per element) used to charge the virtual
// clock: one code path for math and time. The layers call a kernel through
// its Exec overload, declared beside it: (ex, name, the kernel's arguments)
// runs it unless the run is phantom and charges its cost from the same sizes
// (Exec::run), so a kernel is never paired with another kernel's cost. Kernels never allocate
// inside their hot loops; Eigen GEMM does the heavy lifting (single-threaded, see
// EIGEN_DONT_PARALLELIZE).
#pragma once

#include <cstdint>

#include "model/sink.h"
#include "runtime/cost_model.h"

namespace shardlab::model {

using Token = int32_t;

// ---- Embedding: out = wte[inp] + wpe[t] (wpe / dwpe null: no position table) ---
template <typename Real>
void embedding_forward(Real* out,         // (B,T,C)
                       const Token* inp,  // (B,T)
                       const Real* wte,   // (V,C)
                       const Real* wpe,   // (>=T,C)
                       int B, int T, int C);
template <typename Real>
void embedding_backward(Real* dwte,        // (V,C)
                        Real* dwpe,        // (>=T,C)
                        const Real* dout,  // (B,T,C)
                        const Token* inp,  // (B,T)
                        int B, int T, int C);
OpCost embedding_forward_cost(int64_t B, int64_t T, int64_t C, int elem);
OpCost embedding_backward_cost(int64_t B, int64_t T, int64_t C, int elem);
template <typename Real>
void embedding_forward(const Exec& ex, const char* name, Real* out, const Token* inp,
                       const Real* wte, const Real* wpe, int B, int T, int C) {
  ex.run(name, embedding_forward_cost(B, T, C, ex.elem),
         [&] { embedding_forward(out, inp, wte, wpe, B, T, C); });
}
template <typename Real>
void embedding_backward(const Exec& ex, const char* name, Real* dwte, Real* dwpe, const Real* dout,
                        const Token* inp, int B, int T, int C) {
  ex.run(name, embedding_backward_cost(B, T, C, ex.elem),
         [&] { embedding_backward(dwte, dwpe, dout, inp, B, T, C); });
}

// ---- LayerNorm over the last dim, eps 1e-5, biased variance ------------------
inline constexpr double kLayerNormEps = 1e-5;
template <typename Real>
void layernorm_forward(Real* out,               // (N,C)
                       Real* mean, Real* rstd,  // (N) saved for backward
                       const Real* inp,         // (N,C)
                       const Real* weight,      // (C)
                       const Real* bias,        // (C)
                       int64_t N, int C);
template <typename Real>
void layernorm_backward(Real* dinp,                          // (N,C)
                        Real* dweight, Real* dbias,          // (C)
                        const Real* dout,                    // (N,C)
                        const Real* inp,                     // (N,C)
                        const Real* weight,                  // (C)
                        const Real* mean, const Real* rstd,  // (N)
                        int64_t N, int C);
OpCost layernorm_forward_cost(int64_t N, int64_t C, int elem);
OpCost layernorm_backward_cost(int64_t N, int64_t C, int elem);
template <typename Real>
void layernorm_forward(const Exec& ex, const char* name, Real* out, Real* mean, Real* rstd,
                       const Real* inp, const Real* weight, const Real* bias, int64_t N, int C) {
  ex.run(name, layernorm_forward_cost(N, C, ex.elem),
         [&] { layernorm_forward(out, mean, rstd, inp, weight, bias, N, C); });
}
template <typename Real>
void layernorm_backward(const Exec& ex, const char* name, Real* dinp, Real* dweight, Real* dbias,
                        const Real* dout, const Real* inp, const Real* weight, const Real* mean,
                        const Real* rstd, int64_t N, int C) {
  ex.run(name, layernorm_backward_cost(N, C, ex.elem),
         [&] { layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C); });
}

// ---- Linear: out = inp · weightᵀ + bias, weight (out, in) as torch ------------
// `bias` / `dbias` may be null (no bias). `dinp` may be null (not needed).
template <typename Real>
void linear_forward(Real* out,           // (N,OC)
                    const Real* inp,     // (N,C)
                    const Real* weight,  // (OC,C)
                    const Real* bias,    // (OC) or null
                    int64_t N, int C, int OC);
template <typename Real>
void linear_backward(Real* dinp,          // (N,C) or null
                     Real* dweight,       // (OC,C)
                     Real* dbias,         // (OC) or null
                     const Real* dout,    // (N,OC)
                     const Real* inp,     // (N,C)
                     const Real* weight,  // (OC,C)
                     int64_t N, int C, int OC);
// The two halves of linear_backward, as two GEMMs (cuBLAS's dgrad and wgrad):
// B, the input gradient, and W, the weight (and bias) gradient. A
// zero-bubble pipeline runs W later; linear_backward is B then W, bit for bit.
template <typename Real>
void linear_backward_input(Real* dinp,          // (N,C) +=
                           const Real* dout,    // (N,OC)
                           const Real* weight,  // (OC,C)
                           int64_t N, int C, int OC);
template <typename Real>
void linear_backward_weight(Real* dweight,     // (OC,C) +=
                            Real* dbias,       // (OC) += or null
                            const Real* dout,  // (N,OC)
                            const Real* inp,   // (N,C)
                            int64_t N, int C, int OC);
OpCost linear_forward_cost(int64_t N, int64_t C, int64_t OC, bool bias, int elem);
OpCost linear_backward_cost(int64_t N, int64_t C, int64_t OC, bool bias, int elem);
OpCost linear_backward_input_cost(int64_t N, int64_t C, int64_t OC, int elem);
OpCost linear_backward_weight_cost(int64_t N, int64_t C, int64_t OC, bool bias, int elem);
// Transformer Engine's FP8 linear (Exec::fp8_linear): its GEMMs read FP8
// operands (OpCost::fp8), and before them a cast_transpose kernel (amax
// fused in, as TE's) turns a BF16 operand of `elements` into FP8 and FP8ᵀ
// (Hopper's FP8 GEMM takes only the TN layout, so wgrad needs the
// transposes): forward the layer's input, backward its output gradient. The
// weights' FP8 copies are cast once per step (train/optimizer_step.cc).
OpCost fp8_cast_transpose_cost(int64_t elements);
// FP8 inference (Exec::fp8_inference): vLLM's dynamic per-token quantization
// of a linear's BF16 input of `elements` (scaled_fp8_quant: each row's |max|,
// then scale and clamp): read BF16, write FP8; the per-row scales are noise.
OpCost fp8_quant_cost(int64_t elements);
inline OpCost te_linear_cost(const Exec& ex, OpCost c, int64_t cast_elements) {
  if (!ex.fp8_linear) return c;
  if (cast_elements > 0 && ex.fp8_inference)
    ex.op("fp8.quant", fp8_quant_cost(cast_elements));
  else if (cast_elements > 0)
    ex.op("fp8.cast_transpose", fp8_cast_transpose_cost(cast_elements));
  c.fp8 = true;
  return c;
}
// The Exec overloads state whether the layer has a bias by which overload
// they call (or by `bias` for the gradient): a phantom run's bias pointers
// are null, so the cost cannot be read off them.
template <typename Real>
void linear_forward(const Exec& ex, const char* name, Real* out, const Real* inp,
                    const Real* weight, const Real* bias, int64_t N, int C, int OC) {
  ex.run(name, te_linear_cost(ex, linear_forward_cost(N, C, OC, true, ex.elem), N * C),
         [&] { linear_forward(out, inp, weight, bias, N, C, OC); });
}
template <typename Real>  // without a bias
void linear_forward(const Exec& ex, const char* name, Real* out, const Real* inp,
                    const Real* weight, int64_t N, int C, int OC) {
  ex.run(name, te_linear_cost(ex, linear_forward_cost(N, C, OC, false, ex.elem), N * C),
         [&] { linear_forward(out, inp, weight, static_cast<const Real*>(nullptr), N, C, OC); });
}
template <typename Real>
void linear_backward(const Exec& ex, const char* name, bool bias, Real* dinp, Real* dweight,
                     Real* dbias, const Real* dout, const Real* inp, const Real* weight, int64_t N,
                     int C, int OC) {
  ex.run(name, te_linear_cost(ex, linear_backward_cost(N, C, OC, bias, ex.elem), N * OC),
         [&] { linear_backward(dinp, dweight, dbias, dout, inp, weight, N, C, OC); });
}
template <typename Real>
void linear_backward_input(const Exec& ex, const char* name, Real* dinp, const Real* dout,
                           const Real* weight, int64_t N, int C, int OC) {
  ex.run(name, te_linear_cost(ex, linear_backward_input_cost(N, C, OC, ex.elem), N * OC),
         [&] { linear_backward_input(dinp, dout, weight, N, C, OC); });
}
template <typename Real>
void linear_backward_weight(const Exec& ex, const char* name, bool bias, Real* dweight, Real* dbias,
                            const Real* dout, const Real* inp, int64_t N, int C, int OC) {
  ex.run(name, te_linear_cost(ex, linear_backward_weight_cost(N, C, OC, bias, ex.elem), 0),
         [&] { linear_backward_weight(dweight, dbias, dout, inp, N, C, OC); });
}

// ---- Causal multi-head self-attention on the fused [q | k | v] layout --------
// qkv row (b,t) holds q (C) then k (C) then v (C); head h uses features
// h*HS .. (h+1)*HS-1 of each. out (b,t) is the heads concatenated. Scale
// 1/sqrt(HS). A tensor-parallel rank passes its local NH (C = NH*HS local).
// att may be null: the forward keeps each (b, h) block in per-thread scratch
// only, and the backward recomputes it (q·kᵀ and the softmax as the forward
// computes them: the same bits), trading one score GEMM for B·NH·T·T saved.
template <typename Real>
void attention_forward(Real* out,        // (B,T,C)
                       Real* att,        // (B,NH,T,T) softmax probs, saved; or null
                       const Real* qkv,  // (B,T,3C)
                       int B, int T, int NH, int HS);
template <typename Real>
void attention_backward(Real* dqkv,        // (B,T,3C)
                        const Real* dout,  // (B,T,C)
                        const Real* qkv,   // (B,T,3C)
                        const Real* att,   // (B,NH,T,T), or null: recomputed
                        int B, int T, int NH, int HS);
// Both, for a backward that recomputes the forward's output: out (B,T,C) =
// attention_forward's (att null), and dqkv += attention_backward's for dout,
// with the probabilities computed once per (batch, head) for both. The same
// bits as the two calls.
template <typename Real>
void attention_forward_backward(Real* out, Real* dqkv, const Real* dout, const Real* qkv, int B, int T,
                                int NH, int HS);
// Counts the full T×T products (as dense GPU kernels do). HV: the values'
// head size when it differs from the scores' (MLA; 0: HS) -- the cost only:
// the host kernels run on v padded to HS.
OpCost attention_forward_cost(int64_t B, int64_t T, int64_t NH, int64_t HS, int elem, int64_t HV = 0);
OpCost attention_backward_cost(int64_t B, int64_t T, int64_t NH, int64_t HS, int elem, int64_t HV = 0);
template <typename Real>
void attention_forward(const Exec& ex, const char* name, Real* out, Real* att, const Real* qkv,
                       int B, int T, int NH, int HS) {
  ex.run(name, attention_forward_cost(B, T, NH, HS, ex.elem),
         [&] { attention_forward(out, att, qkv, B, T, NH, HS); });
}
template <typename Real>
void attention_backward(const Exec& ex, const char* name, Real* dqkv, const Real* dout,
                        const Real* qkv, const Real* att, int B, int T, int NH, int HS) {
  ex.run(name, attention_backward_cost(B, T, NH, HS, ex.elem),
         [&] { attention_backward(dqkv, dout, qkv, att, B, T, NH, HS); });
}
// The same work as the kernels an unfused attention runs (Megatron-LM's
// core attention: a batched GEMM for the scores, a fused scale-mask-softmax,
// a batched GEMM for the context), whose times add: scores, softmax,
// context forward; context, softmax, scores backward. The T×T scores go
// through device memory between them.
struct AttentionCosts {
  OpCost scores, softmax, context;
};
AttentionCosts attention_forward_costs(int64_t B, int64_t T, int64_t NH, int64_t HS, int elem, int64_t HV = 0);
AttentionCosts attention_backward_costs(int64_t B, int64_t T, int64_t NH, int64_t HS, int elem, int64_t HV = 0);
// Unfused softmax (KernelFusions::softmax off, Megatron-LM without
// --masked-softmax-fusion): the scale rides in the scores GEMM (baddbmm's
// alpha), the causal mask is a masked_fill of its own (this cost: one op per
// score, read and write T×T), then the softmax; in backward masked_fill's
// gradient is another such pass, after the softmax's.
OpCost attention_mask_cost(int64_t B, int64_t T, int64_t NH, int elem);

// ---- GELU, tanh approximation (nanoGPT nn.GELU(approximate='tanh')) ---------
template <typename Real>
void gelu_forward(Real* out, const Real* inp, int64_t n);  // (n)
template <typename Real>
void gelu_backward(Real* dinp, const Real* dout, const Real* inp, int64_t n);
// Both at once from the pre-activation alone, one tanh per element, for a
// backward that recomputes GELU(x): x (the pre-activation on entry) becomes
// GELU(x) in place, and dinp (holding dout on entry) becomes
// dinp = 0 + dGELU·dout. The bits of gelu_forward and of gelu_backward into
// a zeroed dinp. In place, so the recomputed GELU needs no (N, 4C) buffer of
// its own: the backward's last reader of the saved pre-activation is this.
template <typename Real>
void gelu_forward_backward(Real* x, Real* dinp, int64_t n);
OpCost gelu_forward_cost(int64_t n, int elem);
OpCost gelu_backward_cost(int64_t n, int elem);
template <typename Real>
void gelu_forward(const Exec& ex, const char* name, Real* out, const Real* inp, int64_t n) {
  ex.run(name, gelu_forward_cost(n, ex.elem), [&] { gelu_forward(out, inp, n); });
}
template <typename Real>
void gelu_backward(const Exec& ex, const char* name, Real* dinp, const Real* dout, const Real* inp,
                   int64_t n) {
  ex.run(name, gelu_backward_cost(n, ex.elem), [&] { gelu_backward(dinp, dout, inp, n); });
}

// ---- Residual: out = inp1 + inp2 ---------------------------------------------
template <typename Real>
void residual_forward(Real* out, const Real* inp1, const Real* inp2, int64_t n);
template <typename Real>
void residual_backward(Real* dinp1, Real* dinp2, const Real* dout, int64_t n);
OpCost residual_forward_cost(int64_t n, int elem);
template <typename Real>
void residual_forward(const Exec& ex, const char* name, Real* out, const Real* inp1,
                      const Real* inp2, int64_t n) {
  ex.run(name, residual_forward_cost(n, ex.elem), [&] { residual_forward(out, inp1, inp2, n); });
}
// Dropout over n elements (PyTorch's, as Megatron-LM 2021 ran it): the
// forward draws the mask, reads x, writes y and a 1-byte mask; the backward
// reads dy and the mask, writes dx. Memory bound.
OpCost dropout_forward_cost(int64_t n, int elem);
OpCost dropout_backward_cost(int64_t n, int elem);
OpCost residual_backward_cost(int64_t n, int elem);
// Megatron-LM's fused bias-dropout-add (KernelFusions::bias_dropout_add):
// out = residual + dropout(x + bias) over n elements in one kernel, bias of
// `bias_width` elements (0: none), the dropout's 1-byte mask written if any.
OpCost bias_dropout_add_cost(int64_t n, int64_t bias_width, bool dropout, int elem);

// ---- Softmax cross-entropy, mean over the N rows -----------------------------
// Returns mean_n losses[n]. Backward: dlogits += (probs - onehot) * dloss / N.
// probs may be null (not saved): the in-place backward recomputes them.
template <typename Real>
Real crossentropy_forward(Real* probs,           // (N,V) softmax, saved, or null
                          Real* losses,          // (N) per-token -log p
                          const Real* logits,    // (N,V)
                          const Token* targets,  // (N)
                          int64_t N, int V);
template <typename Real>
void crossentropy_backward(Real* dlogits,         // (N,V)
                           const Real* probs,     // (N,V)
                           const Token* targets,  // (N)
                           Real dloss, int64_t N, int V);
// The same dlogits, written over the logits the forward read (no saved
// probs): the softmax recomputed row by row as the forward computes it, then
// 0 + p * dloss / N less the target's, the bits of crossentropy_backward into
// zeros. Charged as crossentropy_backward (the recomputation is host-only).
template <typename Real>
void crossentropy_backward_in_place(Real* logits,  // (N,V) in: logits, out: dlogits
                                    const Token* targets, Real dloss, int64_t N, int V);
OpCost crossentropy_forward_cost(int64_t N, int64_t V, int elem);
OpCost crossentropy_backward_cost(int64_t N, int64_t V, int elem);
// Returns the loss, 0 in a phantom run.
template <typename Real>
Real crossentropy_forward(const Exec& ex, const char* name, Real* probs, Real* losses,
                          const Real* logits, const Token* targets, int64_t N, int V) {
  Real loss = 0;
  ex.run(name, crossentropy_forward_cost(N, V, ex.elem),
         [&] { loss = crossentropy_forward(probs, losses, logits, targets, N, V); });
  return loss;
}
template <typename Real>
void crossentropy_backward(const Exec& ex, const char* name, Real* dlogits, const Real* probs,
                           const Token* targets, Real dloss, int64_t N, int V) {
  ex.run(name, crossentropy_backward_cost(N, V, ex.elem),
         [&] { crossentropy_backward(dlogits, probs, targets, dloss, N, V); });
}
template <typename Real>
void crossentropy_backward_in_place(const Exec& ex, const char* name, Real* logits, const Token* targets,
                                    Real dloss, int64_t N, int V) {
  ex.run(name, crossentropy_backward_cost(N, V, ex.elem),
         [&] { crossentropy_backward_in_place(logits, targets, dloss, N, V); });
}

}  // namespace shardlab::model

#include "model/kernels_moe.h"
#include "model/optimizer.h"
