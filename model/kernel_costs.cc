// Modeled cost of every kernel: FLOPs and bytes read + written in device
// memory at `elem` bytes per element (token and index arrays count 4 or 8
// bytes whatever the precision), the op's class and, for GEMMs, their shapes
// (C[m,n] = A[m,k]·B[k,n], batch times). These charge the virtual clock.
#include "model/kernels.h"
#include "model/kernels_llama.h"
#include "model/kernels_moe.h"
#include "model/optimizer.h"

namespace shardlab::model {
namespace {
OpCost cost(double flops, double elements, int elem, double index_bytes = 0) {
  return OpCost{flops, elements * elem + index_bytes};
}
OpCost gemm_cost(OpCost c, GemmShape g, GemmShape g2 = {}) {
  c.op_class = OpClass::kGemm;
  c.gemm = g;
  c.gemm2 = g2;
  return c;
}
}  // namespace

OpCost embedding_forward_cost(int64_t B, int64_t T, int64_t C, int elem) {
  const double N = static_cast<double>(B) * T;
  return cost(N * C, 2 * N * C + static_cast<double>(T) * C, elem, 4 * N);
}
OpCost embedding_backward_cost(int64_t B, int64_t T, int64_t C, int elem) {
  const double N = static_cast<double>(B) * T;
  return cost(2 * N * C, 3 * N * C + 2.0 * T * C, elem, 4 * N);
}

OpCost layernorm_forward_cost(int64_t N, int64_t C, int elem) {
  const double n = static_cast<double>(N);
  return cost(8 * n * C, 2 * n * C + 2.0 * C + 2 * n, elem);
}
OpCost layernorm_backward_cost(int64_t N, int64_t C, int elem) {
  const double n = static_cast<double>(N);
  return cost(14 * n * C, 4 * n * C + 5.0 * C + 2 * n, elem);
}

// RMSNorm per element: x·x and Σ (2), x·rstd·w (2) -> 4, LayerNorm's 8;
// per row mean, + eps, sqrt, 1/ (4). Reads x and w, writes y and rstd.
OpCost rmsnorm_forward_cost(int64_t N, int64_t C, int elem) {
  const double n = static_cast<double>(N);
  return cost(4 * n * C + 4 * n, 2 * n * C + 1.0 * C + n, elem);
}
// Per element: Σ g·w·x (3), dx += r·(w·g − x·k) (5), dw += g·x·r (3) -> 11;
// per row k = r·r·dot/C (3). Reads dout, x, w, rstd; read-modify-writes
// dinp and dweight.
OpCost rmsnorm_backward_cost(int64_t N, int64_t C, int elem) {
  const double n = static_cast<double>(N);
  return cost(11 * n * C + 3 * n, 4 * n * C + 3.0 * C + n, elem);
}

// silu(gate)·up per output: sigmoid (negate, exp, add, divide: 4), ·gate,
// ·up -> 6; reads gate and up, writes out. Backward per output: the sigmoid
// again (4), dgate += d·u·s·(1 + g·(1 − s)) (7), dup += d·g·s (3) -> 14;
// reads dout, gate, up and read-modify-writes dgate and dup.
OpCost swiglu_forward_cost(int64_t N, int64_t F, int elem) {
  const double nf = static_cast<double>(N) * F;
  return cost(6 * nf, 3 * nf, elem);
}
OpCost swiglu_backward_cost(int64_t N, int64_t F, int elem) {
  const double nf = static_cast<double>(N) * F;
  return cost(14 * nf, 7 * nf, elem);
}

// Elementwise: per feature 2 products and 1 add or subtract; reads x and
// the cos/sin table (one of each per pair: a GPU kernel reads a cached
// table, the host recomputes it), writes x.
OpCost rope_cost(int64_t N, int64_t heads, int64_t HS, int elem) {
  const double n = static_cast<double>(N) * heads * HS;
  return cost(3 * n, 3 * n, elem);
}

// A copy: reads the compact rows, writes the expanded ones (backward: the
// reverse, accumulating).
OpCost repeat_kv_cost(int64_t N, const GqaHeads& g, int elem) {
  return cost(0, static_cast<double>(N) * (g.in_width() + g.out_width()), elem);
}

OpCost linear_forward_cost(int64_t N, int64_t C, int64_t OC, bool bias, int elem) {
  const double n = static_cast<double>(N);
  const double flops = 2 * n * C * OC + (bias ? n * OC : 0);
  // out[N,OC] = inp[N,C] · weightᵀ[C,OC]; the bias add is the GEMM's epilogue.
  return gemm_cost(
      cost(flops, n * C + static_cast<double>(OC) * C + (bias ? OC : 0) + n * OC, elem),
      {N, OC, C});
}
OpCost linear_backward_cost(int64_t N, int64_t C, int64_t OC, bool bias, int elem) {
  const double n = static_cast<double>(N);
  const double w = static_cast<double>(OC) * C;
  const double flops = 4 * n * C * OC + (bias ? n * OC : 0);
  // read dout, inp, weight; read-modify-write dinp, dweight, dbias.
  // dinp[N,C] = dout[N,OC]·weight[OC,C]; dweight[OC,C] = doutᵀ[OC,N]·inp[N,C].
  return gemm_cost(
      cost(flops, n * OC + n * C + w + 2 * n * C + 2 * w + (bias ? 2.0 * OC : 0), elem), {N, C, OC},
      {OC, C, N});
}
OpCost linear_backward_input_cost(int64_t N, int64_t C, int64_t OC, int elem) {
  const double n = static_cast<double>(N);
  // read dout, weight; read-modify-write dinp. dinp[N,C] = dout[N,OC]·weight[OC,C].
  return gemm_cost(cost(2 * n * C * OC, n * OC + static_cast<double>(OC) * C + 2 * n * C, elem),
                   {N, C, OC});
}
OpCost linear_backward_weight_cost(int64_t N, int64_t C, int64_t OC, bool bias, int elem) {
  const double n = static_cast<double>(N);
  const double w = static_cast<double>(OC) * C;
  // read dout, inp; read-modify-write dweight, dbias. dweight[OC,C] = doutᵀ[OC,N]·inp[N,C].
  const double flops = 2 * n * C * OC + (bias ? n * OC : 0);
  return gemm_cost(cost(flops, n * OC + n * C + 2 * w + (bias ? 2.0 * OC : 0), elem), {OC, C, N});
}

OpCost attention_forward_cost(int64_t B, int64_t T, int64_t NH, int64_t HS, int elem) {
  const double bh = static_cast<double>(B) * NH;
  const double tt = static_cast<double>(T) * T;
  const double NC = static_cast<double>(B) * T * NH * HS;
  // per (batch, head): q·kᵀ [T,T] over HS, then att·v [T,HS] over T; the softmax in between.
  const int64_t BH = B * NH;
  return gemm_cost(cost(4 * bh * tt * HS + 5 * bh * tt, 3 * NC + bh * tt + NC, elem),
                   {T, T, HS, BH}, {T, HS, T, BH});
}
OpCost attention_backward_cost(int64_t B, int64_t T, int64_t NH, int64_t HS, int elem) {
  const double bh = static_cast<double>(B) * NH;
  const double tt = static_cast<double>(T) * T;
  const double NC = static_cast<double>(B) * T * NH * HS;
  // per (batch, head): datt = dout·vᵀ [T,T] over HS; dv = attᵀ·dout, dq = dpre·k and
  // dk = dpreᵀ·q, three [T,HS] over T.
  const int64_t BH = B * NH;
  return gemm_cost(cost(8 * bh * tt * HS + 5 * bh * tt, NC + 3 * NC + bh * tt + 6 * NC, elem),
                   {T, T, HS, BH}, {T, HS, T, 3 * BH});
}

AttentionCosts attention_forward_costs(int64_t B, int64_t T, int64_t NH, int64_t HS, int elem) {
  const double bh = static_cast<double>(B) * NH, tt = static_cast<double>(T) * T;
  const double NC = static_cast<double>(B) * T * NH * HS;
  const int64_t BH = B * NH;
  return {
      // scores = q·kᵀ: read q and k, write the T×T scores
      gemm_cost(cost(2 * bh * tt * HS, 2 * NC + bh * tt, elem), {T, T, HS, BH}),
      // scale, causal mask, max, exp, sum, normalize: read and write T×T
      cost(5 * bh * tt, 2 * bh * tt, elem),
      // context = att·v: read att and v, write (T, HS) per head
      gemm_cost(cost(2 * bh * tt * HS, bh * tt + 2 * NC, elem), {T, HS, T, BH}),
  };
}

AttentionCosts attention_backward_costs(int64_t B, int64_t T, int64_t NH, int64_t HS, int elem) {
  const double bh = static_cast<double>(B) * NH, tt = static_cast<double>(T) * T;
  const double NC = static_cast<double>(B) * T * NH * HS;
  const int64_t BH = B * NH;
  return {
      // dq = dpre·k, dk = dpreᵀ·q: read dpre, q, k; write dq, dk
      gemm_cost(cost(4 * bh * tt * HS, bh * tt + 4 * NC, elem), {T, HS, T, 2 * BH}),
      // dpre = att ⊙ (datt − rowsum(datt ⊙ att)) · scale: read att, datt; write dpre
      cost(5 * bh * tt, 3 * bh * tt, elem),
      // datt = dout·vᵀ, dv = attᵀ·dout: read dout, v, att; write datt, dv
      gemm_cost(cost(4 * bh * tt * HS, 3 * NC + 2 * bh * tt, elem), {T, T, HS, BH},
                {T, HS, T, BH}),
  };
}

OpCost gelu_forward_cost(int64_t n, int elem) { return cost(9.0 * n, 2.0 * n, elem); }
OpCost gelu_backward_cost(int64_t n, int elem) { return cost(20.0 * n, 4.0 * n, elem); }

OpCost residual_forward_cost(int64_t n, int elem) { return cost(1.0 * n, 3.0 * n, elem); }
OpCost residual_backward_cost(int64_t n, int elem) { return cost(2.0 * n, 5.0 * n, elem); }

OpCost dropout_forward_cost(int64_t n, int elem) { return cost(2.0 * n, 2.0 * n, elem, 1.0 * n); }
OpCost dropout_backward_cost(int64_t n, int elem) { return cost(1.0 * n, 2.0 * n, elem, 1.0 * n); }

OpCost crossentropy_forward_cost(int64_t N, int64_t V, int elem) {
  const double nv = static_cast<double>(N) * V;
  return cost(4 * nv, 2 * nv + N, elem, 4.0 * N);
}
OpCost crossentropy_backward_cost(int64_t N, int64_t V, int elem) {
  const double nv = static_cast<double>(N) * V;
  return cost(2 * nv, 3 * nv, elem, 4.0 * N);
}

OpCost router_forward_cost(int64_t N, int64_t E, int64_t K, int elem) {
  const double n = static_cast<double>(N);
  // softmax (4E), top-K scans (KE), gates (2K), the P_i statistics adds (E)
  return cost(n * (5.0 * E + K * E + 2.0 * K), n * (2.0 * E + K) + E, elem, 8 * n * K);
}
OpCost router_backward_cost(int64_t N, int64_t E, int64_t K, int elem) {
  const double n = static_cast<double>(N);
  return cost(n * (6.0 * E + 7.0 * K), n * (3.0 * E + K) + E, elem, 4 * n * K);
}

OpCost moe_dispatch_cost(int64_t M, int64_t C, int elem) {
  const double mc = static_cast<double>(M) * C;
  return cost(mc, 3 * mc, elem, 8.0 * M);  // counts the backward's accumulate
}
OpCost moe_combine_forward_cost(int64_t N, int64_t M, int64_t C, int elem) {
  const double mc = static_cast<double>(M) * C;
  // reads ye and gates; zero-fills out (N·C), then reads and writes an out row per assignment
  return cost(2 * mc, mc + M + static_cast<double>(N) * C + 2 * mc, elem, 8.0 * M);
}
OpCost moe_combine_backward_cost(int64_t M, int64_t C, int elem) {
  const double mc = static_cast<double>(M) * C;
  return cost(4 * mc, 4 * mc + 3.0 * M, elem, 8.0 * M);
}

OpCost adamw_update_cost(int64_t n, int elem) {
  // read p, m, v, g; write p, m, v (states kept at the modeled element size)
  return cost(14.0 * n, 7.0 * n, elem);
}
OpCost sum_squares_cost(int64_t n, int elem) { return cost(2.0 * n, 1.0 * n, elem); }
OpCost scale_inplace_cost(int64_t n, int elem) { return cost(1.0 * n, 2.0 * n, elem); }

}  // namespace shardlab::model
