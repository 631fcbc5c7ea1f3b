// Every *_cost function (beside its kernel in model/kernels*.cc) against FLOPs and bytes
// counted by hand from its kernel, for small shapes whose totals can be
// checked on paper. The costs charge the virtual clock, so they are exact
// (integer-valued doubles): EXPECT_DOUBLE_EQ.
//
// Counting rules (model/kernel_cost.h): bytes = elements read + written
// in device memory × elem, plus 4 bytes per token id / int32 index and 8 per
// int64 index, whatever the precision. A buffer that backward accumulates
// into (+=) is read and written: 2 elements per element. Scratch that stays
// on chip (a row of the softmax, dpre in attention backward) is not counted.
// FLOPs: one per add, multiply, divide, compare, sqrt or exp; "exp(z - max)"
// of a softmax counts as one, so a softmax is 4 per element (max, exp, sum,
// normalise). Every formula now matches the literal count of its kernel
// (GELU forward, AdamW, the router and the MoE combine were fixed to it).
// GEMM-class ops also carry their GEMM shapes (m, n, k, batch) for the cost
// model's efficiency; everything else is elementwise (memory-bound).
//
// Size letters as in model/kernels.h.
#include <gtest/gtest.h>

#include "model/kernels.h"
#include "model/kernels_llama.h"

namespace shardlab::model {
namespace {

constexpr int kF32 = 4;  // bytes per element

void ExpectShape(const GemmShape& g, int64_t m, int64_t n, int64_t k, int64_t batch) {
  EXPECT_EQ(g.m, m);
  EXPECT_EQ(g.n, n);
  EXPECT_EQ(g.k, k);
  EXPECT_EQ(g.batch, batch);
}
constexpr int kB16 = 2;

// B=2 sequences of T=3 tokens: N=6 rows of C=4 channels.
constexpr double B = 2, T = 3, N = B * T, C = 4;

TEST(KernelCost, Embedding) {
  // forward: out[n] = wte[inp[n]] + wpe[t]: one add per output element.
  // reads N wte rows + the T wpe rows (shared by the B sequences, counted
  // once), writes out; N token ids.
  const OpCost f = embedding_forward_cost(2, 3, 4, kF32);
  EXPECT_DOUBLE_EQ(f.flops, N * C);                                  // 24
  EXPECT_DOUBLE_EQ(f.bytes, (N * C + T * C + N * C) * kF32 + 4 * N);  // 60 elements, 264 B
  // backward: dwte[inp[n]] += dout[n]; dwpe[t] += dout[n]: two adds per element.
  // reads dout; read-modify-writes the N dwte rows and the T dwpe rows.
  const OpCost b = embedding_backward_cost(2, 3, 4, kF32);
  EXPECT_DOUBLE_EQ(b.flops, 2 * N * C);                                    // 48
  EXPECT_DOUBLE_EQ(b.bytes, (N * C + 2 * N * C + 2 * T * C) * kF32 + 4 * N);  // 96 elements, 408 B
  // bf16 halves the element bytes, not the token ids.
  EXPECT_DOUBLE_EQ(embedding_forward_cost(2, 3, 4, kB16).bytes, 60.0 * kB16 + 4 * N);
  EXPECT_DOUBLE_EQ(embedding_forward_cost(2, 3, 4, kB16).flops, f.flops);
}

TEST(KernelCost, LayerNorm) {
  // forward per element: mean Σx (1); variance x - m, square, Σ (3); output
  // x - m, · rstd, · weight, + bias (4) -> 8. reads inp, weight, bias;
  // writes out, mean, rstd.
  const OpCost f = layernorm_forward_cost(6, 4, kF32);
  EXPECT_DOUBLE_EQ(f.flops, 8 * N * C);                                  // 192
  EXPECT_DOUBLE_EQ(f.bytes, (N * C + 2 * C + N * C + 2 * N) * kF32);     // 68 elements, 272 B
  // backward per element: norm = (x - m)·s (2), dnorm = w·d (1), Σ dnorm (1),
  // dnorm·norm and Σ (2), dbias += d (1), dweight += norm·d (2),
  // dinp += (dnorm - mean - norm·mean2)·s (5) -> 14.
  // reads dout, inp, weight, mean, rstd; read-modify-writes dinp, dweight, dbias.
  const OpCost b = layernorm_backward_cost(6, 4, kF32);
  EXPECT_DOUBLE_EQ(b.flops, 14 * N * C);  // 336
  EXPECT_DOUBLE_EQ(b.bytes, (N * C + N * C + C + 2 * N + 2 * N * C + 2 * C + 2 * C) * kF32);  // 128, 512 B
}

TEST(KernelCost, Linear) {
  constexpr double OC = 5;
  // forward: out = inp · weightᵀ (+ bias): 2·N·C·OC (+ N·OC).
  // reads inp (N,C), weight (OC,C) (, bias); writes out (N,OC).
  const OpCost f = linear_forward_cost(6, 4, 5, true, kF32);
  EXPECT_DOUBLE_EQ(f.flops, 2 * N * C * OC + N * OC);                  // 270
  EXPECT_DOUBLE_EQ(f.bytes, (N * C + OC * C + OC + N * OC) * kF32);     // 79 elements, 316 B
  const OpCost f0 = linear_forward_cost(6, 4, 5, false, kF32);
  EXPECT_DOUBLE_EQ(f0.flops, 2 * N * C * OC);                           // 240
  EXPECT_DOUBLE_EQ(f0.bytes, (N * C + OC * C + N * OC) * kF32);         // 74 elements, 296 B
  // class and shape: out[N,OC] = inp[N,C]·weightᵀ: m = N, n = OC, k = C.
  EXPECT_EQ(f.op_class, OpClass::kGemm);
  ExpectShape(f.gemm, 6, 5, 4, 1);
  EXPECT_TRUE(f.gemm2.empty());
  // backward: dinp += dout · weight (2·N·C·OC), dweight += doutᵀ · inp
  // (2·N·C·OC), dbias += Σ_n dout (N·OC). reads dout, inp, weight;
  // read-modify-writes dinp, dweight (, dbias).
  const OpCost b = linear_backward_cost(6, 4, 5, true, kF32);
  EXPECT_DOUBLE_EQ(b.flops, 4 * N * C * OC + N * OC);  // 510
  EXPECT_DOUBLE_EQ(b.bytes, (N * OC + N * C + OC * C + 2 * N * C + 2 * OC * C + 2 * OC) * kF32);  // 172, 688 B
  const OpCost b0 = linear_backward_cost(6, 4, 5, false, kF32);
  EXPECT_DOUBLE_EQ(b0.flops, 4 * N * C * OC);  // 480
  EXPECT_DOUBLE_EQ(b0.bytes, (N * OC + N * C + OC * C + 2 * N * C + 2 * OC * C) * kF32);  // 162, 648 B
  // fused backward: dinp[N,C] = dout[N,OC]·weight (k = OC), dweight[OC,C] = doutᵀ·inp (k = N).
  EXPECT_EQ(b.op_class, OpClass::kGemm);
  ExpectShape(b.gemm, 6, 4, 5, 1);
  ExpectShape(b.gemm2, 5, 4, 6, 1);
  // the split halves (B and W) are one GEMM each, with the same FLOPs as the fused pair.
  const OpCost bi = linear_backward_input_cost(6, 4, 5, kF32);
  const OpCost bw = linear_backward_weight_cost(6, 4, 5, true, kF32);
  EXPECT_DOUBLE_EQ(bi.flops + bw.flops, b.flops);
  ExpectShape(bi.gemm, 6, 4, 5, 1);
  ExpectShape(bw.gemm, 5, 4, 6, 1);
  EXPECT_TRUE(bi.gemm2.empty() && bw.gemm2.empty());
}

TEST(KernelCost, Attention) {
  // B=2, T=3, NH=2, HS=3: C = 6, BH = 4 score blocks of T×T = 9.
  constexpr double NH = 2, HS = 3, BH = B * NH, TT = T * T, NC = B * T * NH * HS;
  // forward, counting the full T×T products (dense GPU kernels; the CPU kernel
  // skips the masked half of att·v): q·kᵀ 2·TT·HS, att·v 2·TT·HS per block;
  // softmax 5 per score (scale, max, exp, sum, normalise).
  // reads qkv (3·NC); writes att (BH·TT) and out (NC).
  const OpCost f = attention_forward_cost(2, 3, 2, 3, kF32);
  EXPECT_DOUBLE_EQ(f.flops, BH * (4 * TT * HS + 5 * TT));         // 612
  EXPECT_DOUBLE_EQ(f.bytes, (3 * NC + BH * TT + NC) * kF32);      // 180 elements, 720 B
  // backward: dv += attᵀ·dout, datt = dout·vᵀ, dq += dpre·k, dk += dpreᵀ·q
  // (4 × 2·TT·HS); softmax backward 5 per score (att·datt and Σ, datt - dot,
  // · att, · scale). reads dout, qkv, att; read-modify-writes dqkv (2·3·NC).
  const OpCost b = attention_backward_cost(2, 3, 2, 3, kF32);
  EXPECT_DOUBLE_EQ(b.flops, BH * (8 * TT * HS + 5 * TT));                    // 1044
  EXPECT_DOUBLE_EQ(b.bytes, (NC + 3 * NC + BH * TT + 2 * 3 * NC) * kF32);   // 396 elements, 1584 B
  // batched GEMMs over the BH = 4 blocks: q·kᵀ is [T,T] over HS, att·v [T,HS] over T;
  // backward datt [T,T] over HS, then dv, dq, dk: three [T,HS] over T. Their FLOPs are
  // the 2·TT·HS terms above.
  EXPECT_EQ(f.op_class, OpClass::kGemm);
  ExpectShape(f.gemm, 3, 3, 3, 4);
  ExpectShape(f.gemm2, 3, 3, 3, 4);
  EXPECT_DOUBLE_EQ(f.gemm.flops() + f.gemm2.flops(), BH * 4 * TT * HS);
  ExpectShape(b.gemm, 3, 3, 3, 4);
  ExpectShape(b.gemm2, 3, 3, 3, 12);
  EXPECT_DOUBLE_EQ(b.gemm.flops() + b.gemm2.flops(), BH * 8 * TT * HS);
}

TEST(KernelCost, GeluAndResidual) {
  constexpr double n = 10;
  // GELU forward per element: x³ (2), ·0.044715, + x, ·√(2/π), tanh, 1 +,
  // 0.5·x, · -> 9 operations (the model charged 10 before the fix).
  // reads inp, writes out.
  const OpCost gf = gelu_forward_cost(10, kF32);
  EXPECT_DOUBLE_EQ(gf.flops, 9 * n);  // 90
  EXPECT_EQ(gf.op_class, OpClass::kElementwise);
  EXPECT_DOUBLE_EQ(gf.bytes, (n + n) * kF32);  // 80 B
  // GELU backward per element: tanh u recomputed (6), 0.5·(1 + th) (2),
  // 1 - th² (2), 0.5·x (1), · (1), · √(2/π) (1), 1 + 3k·x² (3), · (1), + (1),
  // · dout (1), += (1) -> 20. reads dout, inp; read-modify-writes dinp.
  const OpCost gb = gelu_backward_cost(10, kF32);
  EXPECT_DOUBLE_EQ(gb.flops, 20 * n);
  EXPECT_DOUBLE_EQ(gb.bytes, (n + n + 2 * n) * kF32);  // 160 B
  // residual forward: one add; reads two inputs, writes out.
  const OpCost rf = residual_forward_cost(10, kF32);
  EXPECT_DOUBLE_EQ(rf.flops, n);
  EXPECT_DOUBLE_EQ(rf.bytes, 3 * n * kF32);  // 120 B
  // residual backward: dinp1 += dout, dinp2 += dout; reads dout, RMW both.
  const OpCost rb = residual_backward_cost(10, kF32);
  EXPECT_DOUBLE_EQ(rb.flops, 2 * n);
  EXPECT_DOUBLE_EQ(rb.bytes, (n + 2 * n + 2 * n) * kF32);  // 200 B
}

TEST(KernelCost, Dropout) {
  constexpr double n = 10;
  // forward: draw u, compare with p, scale kept x -> 2 per element; reads x,
  // writes y at elem bytes and the mask at 1 byte.
  const OpCost f = dropout_forward_cost(10, kB16);
  EXPECT_DOUBLE_EQ(f.flops, 2 * n);
  EXPECT_EQ(f.op_class, OpClass::kElementwise);
  EXPECT_DOUBLE_EQ(f.bytes, 2 * n * kB16 + n);  // 50 B
  // backward: dx = dy · mask / (1 - p): reads dy and the mask, writes dx.
  const OpCost b = dropout_backward_cost(10, kB16);
  EXPECT_DOUBLE_EQ(b.flops, n);
  EXPECT_DOUBLE_EQ(b.bytes, 2 * n * kB16 + n);
}

TEST(KernelCost, CrossEntropy) {
  constexpr double V = 7, NV = N * V;
  // forward: a softmax per row (4 per logit); the per-row log and loss are
  // not charged. reads logits; writes probs and losses; N target ids.
  const OpCost f = crossentropy_forward_cost(6, 7, kF32);
  EXPECT_DOUBLE_EQ(f.flops, 4 * NV);                              // 168
  EXPECT_DOUBLE_EQ(f.bytes, (NV + NV + N) * kF32 + 4 * N);        // 90 elements, 384 B
  // backward: dlogits += probs · (dloss/N) (2 per logit); the -scale at the
  // target is not charged. reads probs; read-modify-writes dlogits; targets.
  const OpCost b = crossentropy_backward_cost(6, 7, kF32);
  EXPECT_DOUBLE_EQ(b.flops, 2 * NV);                              // 84
  EXPECT_DOUBLE_EQ(b.bytes, (NV + 2 * NV) * kF32 + 4 * N);        // 126 elements, 528 B
}

TEST(KernelCost, Router) {
  constexpr double E = 4, K = 2;
  // forward per row: softmax over E (4·E), top-K by K scans of E (K·E
  // compares), gates: Σ of K probs and K divides (2·K), and the P_i
  // statistics, pmean[e] += p[e]: E adds per row (charged since the fix) ->
  // 5·E + K·E + 2·K. reads logits; writes probs, gates and frac (E); expert
  // and slot are int32 (N,K) each.
  const OpCost f = router_forward_cost(6, 4, 2, kF32);
  EXPECT_DOUBLE_EQ(f.flops, N * (5 * E + K * E + 2 * K));                         // 6 · 32 = 192
  EXPECT_DOUBLE_EQ(f.bytes, (N * E + N * E + N * K + E) * kF32 + 2 * 4 * N * K);  // 64 elements + 96 B = 352 B
  // Group-limited (2 groups of 2, 1 kept, K = 2): each group's K/M = 2 best
  // (2 scans of its 2 experts: 2·E = 8 compares in all), their 2 sums of 2
  // (K/M·G = 4 adds) and the best group (M·G = 2 compares): 14 more a row;
  // the bytes are the same (the row's probs are read once, as before).
  RouterSpec grouped;
  grouped.groups = 2, grouped.group_top_k = 1;
  const OpCost g = router_forward_cost(6, 4, 2, kF32, grouped);
  EXPECT_DOUBLE_EQ(g.flops, N * (5 * E + K * E + 2 * K + 14));
  EXPECT_DOUBLE_EQ(g.bytes, f.bytes);
  // backward per row: dp = aux·frac (E), softmax backward Σ p·dp (2·E) and
  // p·(dp - Σ) accumulated (3·E) -> 6·E; gates backward: S = Σ p[ex_k] (K
  // adds), dot += dg·p/S (3·K), dp[ex_k] += (dg - dot)/S (3·K) -> 7·K (the
  // model charged 6·K before the fix).
  // reads probs, dgates, frac; read-modify-writes dlogits; reads expert (int32).
  const OpCost b = router_backward_cost(6, 4, 2, kF32);
  EXPECT_DOUBLE_EQ(b.flops, N * (6 * E + 7 * K));  // 6 · 38 = 228
  EXPECT_DOUBLE_EQ(b.bytes, (N * E + 2 * N * E + N * K + E) * kF32 + 4 * N * K);     // 88 elements + 48 B = 400 B
}

TEST(KernelCost, MoEDispatchAndCombine) {
  constexpr double M = 9, MC = M * C;  // 9 kept assignments of N=6 tokens, C=4
  // dispatch, one cost for forward and backward, charged as the backward:
  // dx[src/K] += dxe[m] (M·C adds); reads dxe, read-modify-writes the M dx
  // rows; src is int64 (M). (The forward copy does 0 flops and 2·M·C elements.)
  const OpCost d = moe_dispatch_cost(9, 4, kF32);
  EXPECT_DOUBLE_EQ(d.flops, MC);                           // 36
  EXPECT_DOUBLE_EQ(d.bytes, (MC + 2 * MC) * kF32 + 8 * M);  // 108 elements + 72 B = 504 B
  // combine forward: out[src/K] += gate · ye[m] (2·M·C). The kernel reads
  // ye (M·C) and gates (M), zero-fills out (N·C written), then reads and
  // writes an out row per assignment (2·M·C): N·C + 3·M·C + M = 24 + 108 + 9
  // = 141 elements (the model charged 2·M·C + N·C + M = 105 before the fix).
  const OpCost cf = moe_combine_forward_cost(6, 9, 4, kF32);
  EXPECT_DOUBLE_EQ(cf.flops, 2 * MC);                               // 72
  EXPECT_DOUBLE_EQ(cf.bytes, (N * C + 3 * MC + M) * kF32 + 8 * M);  // 141 elements + 72 B = 636 B
  // combine backward: dye[m] += gate · dout (2·M·C), dgates += Σ dout·ye
  // (2·M·C). reads dout rows and ye; read-modify-writes dye; reads gates,
  // read-modify-writes dgates (M each); src int64.
  const OpCost cb = moe_combine_backward_cost(9, 4, kF32);
  EXPECT_DOUBLE_EQ(cb.flops, 4 * MC);                                       // 144
  EXPECT_DOUBLE_EQ(cb.bytes, (MC + MC + 2 * MC + M + 2 * M) * kF32 + 8 * M);  // 171 elements + 72 B = 756 B
}

TEST(KernelCost, OptimizerAndNorms) {
  constexpr double n = 10;
  // AdamW per element: decay (1), lerp m (3), v = β2·v + (1-β2)·g² (4),
  // sqrt(v)/√bc2 + eps (3), m/denom · step and -= (3) -> 14 operations (the
  // model charged 12 before the fix). reads p, m, v, g; writes p, m, v.
  const OpCost a = adamw_update_cost(10, kF32);
  EXPECT_DOUBLE_EQ(a.flops, 14 * n);  // 140
  EXPECT_EQ(a.op_class, OpClass::kElementwise);
  EXPECT_DOUBLE_EQ(a.bytes, (4 * n + 3 * n) * kF32);  // 280 B
  // sum of squares: x·x and + per element; reads x.
  const OpCost s = sum_squares_cost(10, kF32);
  EXPECT_DOUBLE_EQ(s.flops, 2 * n);
  EXPECT_DOUBLE_EQ(s.bytes, n * kF32);
  // scale in place: one multiply; reads and writes x.
  const OpCost k = scale_inplace_cost(10, kF32);
  EXPECT_DOUBLE_EQ(k.flops, n);
  EXPECT_DOUBLE_EQ(k.bytes, 2 * n * kF32);
}

TEST(KernelCost, CostsAreLinearInTheBatch) {
  // Doubling B doubles every per-row term (a cheap guard against a size letter
  // swapped in a formula: T·C terms of the embedding do not scale with B).
  const OpCost l1 = linear_forward_cost(6, 4, 5, true, kF32), l2 = linear_forward_cost(12, 4, 5, true, kF32);
  EXPECT_DOUBLE_EQ(l2.flops, 2 * l1.flops);
  EXPECT_DOUBLE_EQ(l2.bytes - l1.bytes, (6 * 4 + 6 * 5) * kF32);  // inp and out rows only
  const OpCost e1 = embedding_forward_cost(2, 3, 4, kF32), e2 = embedding_forward_cost(4, 3, 4, kF32);
  EXPECT_DOUBLE_EQ(e2.bytes - e1.bytes, (2 * N * C) * kF32 + 4 * N);  // wpe is not re-read
}

}  // namespace
}  // namespace shardlab::model

namespace shardlab::model {
namespace {

// The llama kernels (kernels_llama.h), counted by hand like the rest.
TEST(KernelCost, LlamaRmsNormIsCheaperThanLayerNorm) {
  // forward: per element x·x, Σ, ·rstd, ·w (4); per row /C, +eps, sqrt, 1/ (4).
  // reads inp (24), weight (4); writes out (24), rstd (6).
  const OpCost f = rmsnorm_forward_cost(6, 4, kF32);
  EXPECT_DOUBLE_EQ(f.flops, 4 * N * C + 4 * N);             // 120
  EXPECT_DOUBLE_EQ(f.bytes, (N * C + C + N * C + N) * kF32);  // 58 elements
  // backward: per element 3 (Σ g·w·x) + 5 (dx) + 3 (dw) = 11; per row 3.
  // reads dout, inp (48), weight (4), rstd (6); read-modify-writes dinp (48), dweight (8).
  const OpCost b = rmsnorm_backward_cost(6, 4, kF32);
  EXPECT_DOUBLE_EQ(b.flops, 11 * N * C + 3 * N);                                  // 282
  EXPECT_DOUBLE_EQ(b.bytes, (2 * N * C + C + N + 2 * N * C + 2 * C) * kF32);  // 114 elements
  EXPECT_LT(f.flops, layernorm_forward_cost(6, 4, kF32).flops);
  EXPECT_LT(f.bytes, layernorm_forward_cost(6, 4, kF32).bytes);
  EXPECT_LT(b.flops, layernorm_backward_cost(6, 4, kF32).flops);
  EXPECT_LT(b.bytes, layernorm_backward_cost(6, 4, kF32).bytes);
  EXPECT_EQ(f.op_class, OpClass::kElementwise);
}

TEST(KernelCost, LlamaSwigluRopeRepeatKv) {
  // SwiGLU over N=6 rows of F=5: 6 flops per output, reads 2F writes F per row.
  const double F = 5;
  EXPECT_DOUBLE_EQ(swiglu_forward_cost(6, 5, kF32).flops, 6 * N * F);
  EXPECT_DOUBLE_EQ(swiglu_forward_cost(6, 5, kF32).bytes, 3 * N * F * kF32);
  EXPECT_DOUBLE_EQ(swiglu_backward_cost(6, 5, kF32).flops, 14 * N * F);
  EXPECT_DOUBLE_EQ(swiglu_backward_cost(6, 5, kF32).bytes, 7 * N * F * kF32);
  // RoPE on 3 heads of 4 features: per pair 4 products and 2 adds (3 per
  // feature); reads x and one cos and one sin per pair, writes x.
  const double n = N * 3 * 4;
  EXPECT_DOUBLE_EQ(rope_cost(6, 3, 4, kB16).flops, 3 * n);
  EXPECT_DOUBLE_EQ(rope_cost(6, 3, 4, kB16).bytes, 3 * n * kB16);
  EXPECT_EQ(rope_cost(6, 3, 4, kB16).op_class, OpClass::kElementwise);
  // repeat_kv of 4 query heads over 2 K/V heads of 3: reads (4 + 2·2)·3 = 24,
  // writes 3·4·3 = 36 per row; a copy, no FLOPs.
  const GqaHeads g{4, 2, 3, 2, 0, 0};
  EXPECT_DOUBLE_EQ(repeat_kv_cost(6, g, kF32).flops, 0);
  EXPECT_DOUBLE_EQ(repeat_kv_cost(6, g, kF32).bytes, N * (24 + 36) * kF32);
}

}  // namespace
}  // namespace shardlab::model
