// Dense kernels: embedding, layernorm, linear, GELU, residual, cross-entropy.
// Shapes use the letters declared in kernels.h.
#include "model/kernels.h"

#include <algorithm>
#include <cmath>

#include "model/gemm.h"
#include "model/host_split.h"
#include "model/kernel_cost.h"
#include "model/portable_math.h"
#include "runtime/errors.h"

namespace shardlab::model {

using cost_terms::cost;
using cost_terms::gemm_cost;

namespace {
// Split sizes on idle cores (host_split.h): rows and elements are independent
// in every kernel split here, so the bits do not depend on the split.
constexpr int64_t kRowChunk = 64;
constexpr int64_t kColChunk = 64;  // columns of a sum over rows (dbias, dweight), rows in order
constexpr int64_t kElemChunk = 16384;
}  // namespace

// ---- Embedding ----------------------------------------------------------------

template <typename Real>
void embedding_forward(Real* out, const Token* inp, const Real* wte, const Real* wpe, int B, int T,
                       int C) {
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      Real* o = out + (static_cast<int64_t>(b) * T + t) * C;
      const Real* we = wte + static_cast<int64_t>(inp[b * T + t]) * C;
      if (!wpe) {  // rotary positions (llama): the token embedding only
        std::copy_n(we, C, o);
        continue;
      }
      const Real* pe = wpe + static_cast<int64_t>(t) * C;
      for (int c = 0; c < C; ++c) o[c] = we[c] + pe[c];
    }
  }
}

template <typename Real>
void embedding_backward(Real* dwte, Real* dwpe, const Real* dout, const Token* inp, int B, int T,
                        int C) {
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      const Real* d = dout + (static_cast<int64_t>(b) * T + t) * C;
      Real* dwe = dwte + static_cast<int64_t>(inp[b * T + t]) * C;
      for (int c = 0; c < C; ++c) dwe[c] += d[c];
      if (!dwpe) continue;
      Real* dpe = dwpe + static_cast<int64_t>(t) * C;
      for (int c = 0; c < C; ++c) dpe[c] += d[c];
    }
  }
}

OpCost embedding_forward_cost(int64_t B, int64_t T, int64_t C, int elem) {
  const double N = static_cast<double>(B) * T;
  return cost(N * C, 2 * N * C + static_cast<double>(T) * C, elem, 4 * N);
}
OpCost embedding_backward_cost(int64_t B, int64_t T, int64_t C, int elem) {
  const double N = static_cast<double>(B) * T;
  return cost(2 * N * C, 3 * N * C + 2.0 * T * C, elem, 4 * N);
}

// ---- LayerNorm ----------------------------------------------------------------

// The row reductions are 16-lane sums (model/portable_math.h): a fixed order,
// so results are deterministic and the same on every host.

template <typename Real>
void layernorm_forward(Real* out, Real* mean, Real* rstd, const Real* inp, const Real* weight,
                       const Real* bias, int64_t N, int C) {
  const Real eps = static_cast<Real>(kLayerNormEps);
  for_chunks(N, kRowChunk, 8.0 * N * C, [=](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const Real* x = inp + n * C;
      const Real m = pm::sum(x, C) / C;
      const Real v = pm::lane_sum<Real>(C, [x, m](int64_t c) { return (x[c] - m) * (x[c] - m); }) / C;
      const Real s = Real(1) / std::sqrt(v + eps);
      Real* o = out + n * C;
      for (int c = 0; c < C; ++c) o[c] = (x[c] - m) * s * weight[c] + bias[c];
      mean[n] = m;
      rstd[n] = s;
    }
  });
}

// The outputs never overlap each other or the inputs (dx, the norm's
// gradients, and dout are distinct buffers at every call): saying so with
// __restrict lets GCC vectorise the per-column loops, which it otherwise left
// scalar ("complicated access pattern"). Columns are independent, so the
// same bits.
//
// On idle cores (host_split.h) the rows' input gradients split over rows,
// then dweight and dbias over columns, each column summed over the rows in
// order as on one core: the same bits. On one core, one pass does both.
template <typename Real>
void layernorm_backward(Real* __restrict dinp, Real* __restrict dweight, Real* __restrict dbias,
                        const Real* dout, const Real* inp, const Real* weight, const Real* mean,
                        const Real* rstd, int64_t N, int C) {
  // dweight and dbias over columns [c0, c1) for row n
  const auto params = [=](int64_t n, int64_t c0, int64_t c1) {
    const Real m = mean[n], s = rstd[n];
    const Real* d = dout + n * C;
    const Real* x = inp + n * C;
    for (int64_t c = c0; c < c1; ++c) {
      dbias[c] += d[c];
      dweight[c] += (x[c] - m) * s * d[c];
    }
  };
  // row n's input gradient, and its dweight and dbias if `with_params`
  const auto row = [=](int64_t n, bool with_params) {
    const Real m = mean[n];
    const Real s = rstd[n];
    const Real* d = dout + n * C;
    const Real* x = inp + n * C;
    // Two reductions: mean(dnorm) and mean(dnorm * norm), dnorm = weight * dout.
    const Real dnorm_mean = pm::lane_sum<Real>(C, [=](int64_t c) { return weight[c] * d[c]; }) / C;
    const Real dnorm_norm_mean =
        pm::lane_sum<Real>(C, [=](int64_t c) { return weight[c] * d[c] * ((x[c] - m) * s); }) / C;
    Real* di = dinp + n * C;
    if (!with_params) {
      for (int c = 0; c < C; ++c) di[c] += (weight[c] * d[c] - dnorm_mean - (x[c] - m) * s * dnorm_norm_mean) * s;
      return;
    }
    for (int c = 0; c < C; ++c) {  // params(n, 0, C) in the same pass
      const Real norm = (x[c] - m) * s;
      dbias[c] += d[c];
      dweight[c] += norm * d[c];
      di[c] += (weight[c] * d[c] - dnorm_mean - norm * dnorm_norm_mean) * s;
    }
  };
  const double work = 14.0 * double(N) * C;
  if (!split_wanted(N, kRowChunk, work)) {
    for (int64_t n = 0; n < N; ++n) row(n, true);
    return;
  }
  for_chunks(N, kRowChunk, work, [=](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) row(n, false);
  });
  for_chunks(C, kColChunk, work, [=](int64_t c0, int64_t c1) {
    for (int64_t n = 0; n < N; ++n) params(n, c0, c1);
  });
}

// At the profile's LayerNorm share of the memory rate (OpCost::Pass).
OpCost layernorm_forward_cost(int64_t N, int64_t C, int elem) {
  const double n = static_cast<double>(N);
  OpCost c = cost(8 * n * C, 2 * n * C + 2.0 * C + 2 * n, elem);
  c.pass = OpCost::Pass::kLayerNormForward;
  return c;
}
OpCost layernorm_backward_cost(int64_t N, int64_t C, int elem) {
  const double n = static_cast<double>(N);
  OpCost c = cost(14 * n * C, 4 * n * C + 5.0 * C + 2 * n, elem);
  c.pass = OpCost::Pass::kLayerNormBackward;
  return c;
}

// ---- Linear -------------------------------------------------------------------

template <typename Real>
void linear_forward(Real* out, const Real* inp, const Real* weight, const Real* bias, int64_t N,
                    int C, int OC) {
  if (bias == nullptr) {
    gemm_nt(out, OC, inp, C, weight, C, N, OC, C);
  } else {
    gemm_nt_bias(out, inp, weight, bias, N, OC, C);  // the bias add's bits, in the GEMM's pass
  }
}

template <typename Real>
void linear_backward(Real* dinp, Real* dweight, Real* dbias, const Real* dout, const Real* inp,
                     const Real* weight, int64_t N, int C, int OC) {
  if (dinp != nullptr) linear_backward_input(dinp, dout, weight, N, C, OC);
  linear_backward_weight(dweight, dbias, dout, inp, N, C, OC);
}

template <typename Real>
void linear_backward_input(Real* dinp, const Real* dout, const Real* weight, int64_t N, int C,
                           int OC) {
  gemm_nn_acc(dinp, dout, weight, N, C, OC);
}

template <typename Real>
void linear_backward_weight(Real* dweight, Real* dbias, const Real* dout, const Real* inp,
                            int64_t N, int C, int OC) {
  gemm_tn_acc(dweight, dout, inp, N, OC, C);
  if (dbias == nullptr) return;
  // rows in order, vectorised across the columns; columns split on idle cores
  for_chunks(OC, kColChunk, double(N) * OC, [=](int64_t o0, int64_t o1) {
    for (int64_t n = 0; n < N; ++n) {
      const Real* dy = dout + n * OC;
      for (int64_t o = o0; o < o1; ++o) dbias[o] += dy[o];
    }
  });
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

OpCost fp8_cast_transpose_cost(int64_t elements) {
  // Per element: scale and clamp, and the running |max| (2 flops); read BF16,
  // write the FP8 copy and its transpose.
  const double n = static_cast<double>(elements);
  return {2 * n, n * (2 + 2 * kFp8Bytes)};
}
OpCost fp8_quant_cost(int64_t elements) {
  const double n = static_cast<double>(elements);
  return {2 * n, n * (2 + kFp8Bytes)};
}

// ---- GELU (tanh) --------------------------------------------------------------
// tanh is the project's own (model/portable_math.h): branch-free, so the
// loops vectorise, and the same bits on every host.

namespace {
constexpr double kGeluScale = 0.7978845608028654;  // sqrt(2/pi)
constexpr double kGeluCubic = 0.044715;
}  // namespace

template <typename Real>
void gelu_forward(Real* out, const Real* inp, int64_t n) {
  const Real s = static_cast<Real>(kGeluScale), k = static_cast<Real>(kGeluCubic);
  for_chunks(n, kElemChunk, 9.0 * n, [=](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const Real x = inp[i];
      out[i] = Real(0.5) * x * (Real(1) + pm::tanh_of(s * (x + k * (x * x * x))));
    }
  });
}

template <typename Real>
void gelu_backward(Real* dinp, const Real* dout, const Real* inp, int64_t n) {
  const Real s = static_cast<Real>(kGeluScale), k = static_cast<Real>(kGeluCubic);
  for_chunks(n, kElemChunk, 20.0 * n, [=](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const Real x = inp[i];
      const Real th = pm::tanh_of(s * (x + k * (x * x * x)));
      // d/dx [x/2 (1 + tanh u)] = (1 + tanh u)/2 + x/2 (1 - tanh² u) du/dx
      dinp[i] += (Real(0.5) * (Real(1) + th) +
                  Real(0.5) * x * (Real(1) - th * th) * s * (Real(1) + Real(3) * k * (x * x))) *
                 dout[i];
    }
  });
}

template <typename Real>
void gelu_forward_backward(Real* __restrict inout, Real* __restrict dinp, int64_t n) {
  const Real s = static_cast<Real>(kGeluScale), k = static_cast<Real>(kGeluCubic);
  for_chunks(n, kElemChunk, 24.0 * n, [=](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const Real x = inout[i];
      const Real th = pm::tanh_of(s * (x + k * (x * x * x)));
      inout[i] = Real(0.5) * x * (Real(1) + th);  // gelu_forward's expression
      // gelu_backward's, += into zeros (0 + v: -0 becomes +0, as there)
      dinp[i] = Real(0) + (Real(0.5) * (Real(1) + th) +
                           Real(0.5) * x * (Real(1) - th * th) * s * (Real(1) + Real(3) * k * (x * x))) *
                              dinp[i];
    }
  });
}

OpCost gelu_forward_cost(int64_t n, int elem) { return cost(9.0 * n, 2.0 * n, elem); }
OpCost gelu_backward_cost(int64_t n, int elem) { return cost(20.0 * n, 4.0 * n, elem); }

// ---- Residual -----------------------------------------------------------------

template <typename Real>
void residual_forward(Real* out, const Real* inp1, const Real* inp2, int64_t n) {
  for_chunks(n, kElemChunk, 1.0 * n, [=](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) out[i] = inp1[i] + inp2[i];
  });
}

template <typename Real>
void residual_backward(Real* dinp1, Real* dinp2, const Real* dout, int64_t n) {
  for_chunks(n, kElemChunk, 2.0 * n, [=](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      dinp1[i] += dout[i];
      dinp2[i] += dout[i];
    }
  });
}

OpCost residual_forward_cost(int64_t n, int elem) { return cost(1.0 * n, 3.0 * n, elem); }
OpCost residual_backward_cost(int64_t n, int elem) { return cost(2.0 * n, 5.0 * n, elem); }
OpCost dropout_forward_cost(int64_t n, int elem) { return cost(2.0 * n, 2.0 * n, elem, 1.0 * n); }
OpCost dropout_backward_cost(int64_t n, int elem) { return cost(1.0 * n, 2.0 * n, elem, 1.0 * n); }
// Per element: + bias, the dropout's compare and scale, + residual; reads x
// and the residual, writes out (and the mask).
OpCost bias_dropout_add_cost(int64_t n, int64_t bias_width, bool dropout, int elem) {
  const double e = static_cast<double>(n);
  return cost(e * (1 + (bias_width > 0) + 2 * dropout), 3 * e + double(bias_width), elem, dropout ? e : 0);
}

// ---- Cross-entropy ------------------------------------------------------------

namespace {
// exp(z - zmax) into e (e may be z), returning its sum: softmax_row before
// the normalization.
// The max is read from a local, not through zmax: e's stores might alias the
// reference, so GCC would reload it every element and not vectorise the loop
// (8 ns per exp, 5.7% of a tiny step).
template <typename Real>
Real exp_sum_row(Real* e, const Real* z, int V, Real& zmax) {
  const Real m = pm::max(z, V);
  zmax = m;
  for (int v = 0; v < V; ++v) e[v] = pm::exp_of(z[v] - m);
  return pm::sum(e, V);
}
// Row n's softmax into p (p may be z: in place), as the forward saves it;
// returns the row's sum of exponents and its max through zmax.
template <typename Real>
Real softmax_row(Real* p, const Real* z, int V, Real& zmax) {
  const Real sum = exp_sum_row(p, z, V, zmax);
  const Real inv = Real(1) / sum;
  for (int v = 0; v < V; ++v) p[v] *= inv;
  return sum;
}
}  // namespace

template <typename Real>
Real crossentropy_forward(Real* probs, Real* losses, const Real* logits, const Token* targets,
                          int64_t N, int V) {
  for (int64_t n = 0; n < N; ++n) SHARDLAB_CHECK(targets[n] >= 0 && targets[n] < V, "target token out of range");
  for_chunks(N, kRowChunk, 4.0 * N * V, [=](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const Real* z = logits + n * V;
      Real zmax;
      // Not saved (null): the loss needs only the sum of exponents, so the
      // row is never normalized.
      const Real sum = probs ? softmax_row(probs + n * V, z, V, zmax)
                             : exp_sum_row(thread_scratch<Real>(size_t(V)).data(), z, V, zmax);
      losses[n] = static_cast<Real>(pm::log(double(sum))) + zmax - z[targets[n]];  // -log softmax(z)[y], stable
    }
  });
  double total = 0;  // in row order, after the split
  for (int64_t n = 0; n < N; ++n) total += losses[n];
  return static_cast<Real>(total / static_cast<double>(N));
}

template <typename Real>
void crossentropy_backward(Real* dlogits, const Real* probs, const Token* targets, Real dloss,
                           int64_t N, int V) {
  const Real scale = dloss / static_cast<Real>(N);
  for_chunks(N, kRowChunk, 2.0 * N * V, [=](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const Real* p = probs + n * V;
      Real* d = dlogits + n * V;
      for (int v = 0; v < V; ++v) d[v] += p[v] * scale;
      d[targets[n]] -= scale;
    }
  });
}

template <typename Real>
void crossentropy_backward_in_place(Real* logits, const Token* targets, Real dloss, int64_t N, int V) {
  const Real scale = dloss / static_cast<Real>(N);
  for_chunks(N, kRowChunk, 6.0 * N * V, [=](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      Real* d = logits + n * V;
      Real zmax;
      // The forward's probs (exp · (1/sum), bit for bit) times scale, in one
      // pass; 0 + as += into zeros gives (-0 becomes +0).
      const Real inv = Real(1) / exp_sum_row(d, d, V, zmax);
      for (int v = 0; v < V; ++v) d[v] = Real(0) + (d[v] * inv) * scale;
      d[targets[n]] -= scale;
    }
  });
}

OpCost crossentropy_forward_cost(int64_t N, int64_t V, int elem) {
  const double nv = static_cast<double>(N) * V;
  return cost(4 * nv, 2 * nv + N, elem, 4.0 * N);
}
OpCost crossentropy_backward_cost(int64_t N, int64_t V, int elem) {
  const double nv = static_cast<double>(N) * V;
  return cost(2 * nv, 3 * nv, elem, 4.0 * N);
}

// ---- Explicit instantiations --------------------------------------------------

#define SHARDLAB_INSTANTIATE_DENSE(Real)                                                         \
  template void embedding_forward(Real*, const Token*, const Real*, const Real*, int, int, int); \
  template void embedding_backward(Real*, Real*, const Real*, const Token*, int, int, int);      \
  template void layernorm_forward(Real*, Real*, Real*, const Real*, const Real*, const Real*,    \
                                  int64_t, int);                                                 \
  template void layernorm_backward(Real*, Real*, Real*, const Real*, const Real*, const Real*,   \
                                   const Real*, const Real*, int64_t, int);                      \
  template void linear_forward(Real*, const Real*, const Real*, const Real*, int64_t, int, int); \
  template void linear_backward(Real*, Real*, Real*, const Real*, const Real*, const Real*,      \
                                int64_t, int, int);                                              \
  template void linear_backward_input(Real*, const Real*, const Real*, int64_t, int, int);       \
  template void linear_backward_weight(Real*, Real*, const Real*, const Real*, int64_t, int, int); \
  template void crossentropy_backward_in_place(Real*, const Token*, Real, int64_t, int);           \
  template void gelu_forward(Real*, const Real*, int64_t);                                       \
  template void gelu_backward(Real*, const Real*, const Real*, int64_t);                         \
  template void gelu_forward_backward(Real*, Real*, int64_t);                                     \
  template void residual_forward(Real*, const Real*, const Real*, int64_t);                      \
  template void residual_backward(Real*, Real*, const Real*, int64_t);                           \
  template Real crossentropy_forward(Real*, Real*, const Real*, const Token*, int64_t, int);     \
  template void crossentropy_backward(Real*, const Real*, const Token*, Real, int64_t, int);

SHARDLAB_INSTANTIATE_DENSE(float)
SHARDLAB_INSTANTIATE_DENSE(double)
#undef SHARDLAB_INSTANTIATE_DENSE

}  // namespace shardlab::model
