// The llama family's kernels: RMSNorm, SwiGLU, RoPE, repeat_kv. Shapes use
// the letters of kernels_llama.h.
#include "model/kernels_llama.h"

#include <algorithm>
#include <cmath>

#include "model/kernel_cost.h"

namespace shardlab::model {

using cost_terms::cost;

// ---- RMSNorm ------------------------------------------------------------------

template <typename Real>
void rmsnorm_forward(Real* out, Real* rstd, const Real* inp, const Real* weight, int64_t N, int C,
                     double eps) {
  for (int64_t n = 0; n < N; ++n) {
    const Real* x = inp + n * C;
    Real* o = out + n * C;
    double ss = 0;
    for (int c = 0; c < C; ++c) ss += double(x[c]) * x[c];
    const Real r = static_cast<Real>(1.0 / std::sqrt(ss / C + eps));
    for (int c = 0; c < C; ++c) o[c] = x[c] * r * weight[c];
    rstd[n] = r;
  }
}

// y_c = w_c x_c r with r = (mean x² + eps)^(-1/2), dr/dx_j = −r³ x_j / C:
// dx_j = r (w_j g_j − x_j r² · Σ_c g_c w_c x_c / C); dw_c = Σ_n g_c x_c r.
template <typename Real>
void rmsnorm_backward(Real* dinp, Real* dweight, const Real* dout, const Real* inp, const Real* weight,
                      const Real* rstd, int64_t N, int C) {
  for (int64_t n = 0; n < N; ++n) {
    const Real* x = inp + n * C;
    const Real* g = dout + n * C;
    Real* dx = dinp + n * C;
    const Real r = rstd[n];
    Real dot = 0;
    for (int c = 0; c < C; ++c) dot += g[c] * weight[c] * x[c];
    const Real k = r * r * dot / static_cast<Real>(C);
    for (int c = 0; c < C; ++c) {
      dx[c] += r * (weight[c] * g[c] - x[c] * k);
      dweight[c] += g[c] * x[c] * r;
    }
  }
}

// ---- QK-norm --------------------------------------------------------------------

template <typename Real>
void head_rmsnorm_forward(Real* x, Real* saved, Real* rstd, const Real* weight, int64_t N, int heads, int HS,
                          int64_t stride, double eps) {
  for (int64_t n = 0; n < N; ++n)
    for (int h = 0; h < heads; ++h) {
      Real* v = x + n * stride + int64_t{h} * HS;
      const int64_t i = n * heads + h;
      std::copy_n(v, HS, saved + i * HS);
      double ss = 0;
      for (int c = 0; c < HS; ++c) ss += double(v[c]) * v[c];
      const Real r = static_cast<Real>(1.0 / std::sqrt(ss / HS + eps));
      for (int c = 0; c < HS; ++c) v[c] = v[c] * r * weight[c];
      rstd[i] = r;
    }
}

// rmsnorm_backward's rule per (row, head), writing dx in place.
template <typename Real>
void head_rmsnorm_backward(Real* dx, Real* dweight, const Real* saved, const Real* weight, const Real* rstd,
                           int64_t N, int heads, int HS, int64_t stride) {
  for (int64_t n = 0; n < N; ++n)
    for (int h = 0; h < heads; ++h) {
      const int64_t i = n * heads + h;
      Real* g = dx + n * stride + int64_t{h} * HS;
      const Real* xin = saved + i * HS;
      const Real r = rstd[i];
      Real dot = 0;
      for (int c = 0; c < HS; ++c) dot += g[c] * weight[c] * xin[c];
      const Real k = r * r * dot / static_cast<Real>(HS);
      for (int c = 0; c < HS; ++c) {
        dweight[c] += g[c] * xin[c] * r;
        g[c] = r * (weight[c] * g[c] - xin[c] * k);
      }
    }
}

// ---- SwiGLU -------------------------------------------------------------------

namespace {
template <typename Real>
Real sigmoid(Real x) {
  return Real(1) / (Real(1) + std::exp(-x));
}
}  // namespace

template <typename Real>
void swiglu_forward(Real* out, const Real* gate_up, int64_t N, int F) {
  for (int64_t n = 0; n < N; ++n) {
    const Real* g = gate_up + n * 2 * F;
    const Real* u = g + F;
    Real* o = out + n * F;
    for (int f = 0; f < F; ++f) o[f] = g[f] * sigmoid(g[f]) * u[f];
  }
}

// silu'(g) = s (1 + g (1 − s)) with s = sigmoid(g).
template <typename Real>
void swiglu_backward(Real* dgate_up, const Real* dout, const Real* gate_up, int64_t N, int F) {
  for (int64_t n = 0; n < N; ++n) {
    const Real* g = gate_up + n * 2 * F;
    const Real* u = g + F;
    const Real* d = dout + n * F;
    Real* dg = dgate_up + n * 2 * F;
    Real* du = dg + F;
    for (int f = 0; f < F; ++f) {
      const Real s = sigmoid(g[f]);
      dg[f] += d[f] * u[f] * s * (Real(1) + g[f] * (Real(1) - s));
      du[f] += d[f] * g[f] * s;
    }
  }
}

// ---- RoPE ---------------------------------------------------------------------

namespace {

// sign +1: the rotation, −1: its inverse (the transpose).
template <typename Real>
void rope_rotate(Real* out, const Real* inp, const int64_t* positions, int B, int T, int heads, int HS,
                 int64_t stride, double theta, double sign) {
  const int half = HS / 2;
  for (int t = 0; t < T; ++t) {
    const double pos = static_cast<double>(positions ? positions[t] : t);
    for (int i = 0; i < half; ++i) {
      const double angle = pos * std::pow(theta, -2.0 * i / HS);
      const Real c = static_cast<Real>(std::cos(angle)), s = static_cast<Real>(sign * std::sin(angle));
      for (int b = 0; b < B; ++b) {
        const int64_t row = (int64_t{b} * T + t) * stride;
        for (int h = 0; h < heads; ++h) {
          const int64_t at = row + int64_t{h} * HS + i;
          const Real x1 = inp[at], x2 = inp[at + half];
          out[at] = x1 * c - x2 * s;
          out[at + half] = x2 * c + x1 * s;
        }
      }
    }
  }
}

}  // namespace

template <typename Real>
void rope_forward(Real* out, const Real* inp, const int64_t* positions, int B, int T, int heads, int HS,
                  int64_t stride, double theta) {
  rope_rotate(out, inp, positions, B, T, heads, HS, stride, theta, 1.0);
}

template <typename Real>
void rope_backward(Real* dinp, const Real* dout, const int64_t* positions, int B, int T, int heads, int HS,
                   int64_t stride, double theta) {
  rope_rotate(dinp, dout, positions, B, T, heads, HS, stride, theta, -1.0);
}

// ---- repeat_kv ----------------------------------------------------------------

namespace {

// Calls f(offset in the compact rows, offset in the repeated rows, count) for
// every run repeat_kv copies: per row, q whole, then each query head's k and v.
template <class F>
void for_repeat_kv_runs(int64_t N, const GqaHeads& g, F&& f) {
  const int64_t HS = g.HS, Cq = int64_t{g.NHq} * HS, KVC = int64_t{g.KVl} * HS;
  for (int64_t n = 0; n < N; ++n) {
    const int64_t in = n * g.in_width(), out = n * g.out_width();
    f(in, out, Cq);
    for (int h = 0; h < g.NHq; ++h) {
      const int64_t kv = int64_t{g.kv_of(h)} * HS;
      f(in + Cq + kv, out + Cq + h * HS, HS);            // k
      f(in + Cq + KVC + kv, out + 2 * Cq + h * HS, HS);  // v
    }
  }
}

}  // namespace

template <typename Real>
void repeat_kv_forward(Real* out, const Real* in, int64_t N, const GqaHeads& g) {
  for_repeat_kv_runs(N, g, [&](int64_t i, int64_t o, int64_t count) { std::copy_n(in + i, count, out + o); });
}

template <typename Real>
void repeat_kv_backward(Real* din, const Real* dout, int64_t N, const GqaHeads& g) {
  for_repeat_kv_runs(N, g, [&](int64_t i, int64_t o, int64_t count) {
    for (int64_t k = 0; k < count; ++k) din[i + k] += dout[o + k];
  });
}

// ---- Costs --------------------------------------------------------------------

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

// Unfused, per element (n = N·C) in forward: x² (read x, write), its row
// mean (read), + eps and rsqrt (per row), x · r (read x and r, write), · w
// (read, write). Backward, as autograd runs it: d(· w) = dy · w, and dw as
// dy · x̂ then its sum over rows; d(x · r) = g · r, and dr as g · x then
// its row sum; rsqrt's and the mean's gradients (per row, then expanded
// over the row), x²'s (2 · x · g), and the two gradients of x added.
OpChain<6> rmsnorm_unfused_forward_costs(int64_t N, int64_t C, int elem) {
  const double n = static_cast<double>(N) * C, rows = static_cast<double>(N);
  return {cost(n, 2 * n, elem), cost(n, n + rows, elem), cost(rows, 2 * rows, elem),
          cost(2 * rows, 2 * rows, elem), cost(n, 2 * n + rows, elem), cost(n, 2 * n + C, elem)};
}
OpChain<10> rmsnorm_unfused_backward_costs(int64_t N, int64_t C, int elem) {
  const double n = static_cast<double>(N) * C, rows = static_cast<double>(N);
  return {cost(n, 2 * n + C, elem),    cost(n, 3 * n, elem),     cost(n, n + C, elem),
          cost(n, 2 * n + rows, elem), cost(n, 3 * n, elem),     cost(n, n + rows, elem),
          cost(3 * rows, 3 * rows, elem), cost(n, rows + n, elem), cost(2 * n, 3 * n, elem),
          cost(n, 3 * n, elem)};
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
// Unfused: silu (5 per element: the sigmoid and · gate; read gate, write s),
// then s · up (read both, write). Backward: ds = d · up and dup = d · s
// (each reads two, writes one), dgate = ds · s'(gate) (the sigmoid again
// and 5 more; reads ds and gate, writes), and the chunk's cat of dgate and
// dup into the [gate | up] gradient (reads and writes 2F per row).
OpChain<2> swiglu_unfused_forward_costs(int64_t N, int64_t F, int elem) {
  const double nf = static_cast<double>(N) * F;
  return {cost(5 * nf, 2 * nf, elem), cost(nf, 3 * nf, elem)};
}
OpChain<4> swiglu_unfused_backward_costs(int64_t N, int64_t F, int elem) {
  const double nf = static_cast<double>(N) * F;
  return {cost(nf, 3 * nf, elem), cost(nf, 3 * nf, elem), cost(9 * nf, 3 * nf, elem), cost(0, 4 * nf, elem)};
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

#define SHARDLAB_INSTANTIATE_LLAMA_KERNELS(Real)                                                          \
  template void rmsnorm_forward(Real*, Real*, const Real*, const Real*, int64_t, int, double);            \
  template void rmsnorm_backward(Real*, Real*, const Real*, const Real*, const Real*, const Real*,        \
                                 int64_t, int);                                                           \
  template void swiglu_forward(Real*, const Real*, int64_t, int);                                         \
  template void swiglu_backward(Real*, const Real*, const Real*, int64_t, int);                           \
  template void head_rmsnorm_forward(Real*, Real*, Real*, const Real*, int64_t, int, int, int64_t, double); \
  template void head_rmsnorm_backward(Real*, Real*, const Real*, const Real*, const Real*, int64_t, int, int,  \
                                      int64_t);                                                               \
  template void rope_forward(Real*, const Real*, const int64_t*, int, int, int, int, int64_t, double);   \
  template void rope_backward(Real*, const Real*, const int64_t*, int, int, int, int, int64_t, double);  \
  template void repeat_kv_forward(Real*, const Real*, int64_t, const GqaHeads&);                          \
  template void repeat_kv_backward(Real*, const Real*, int64_t, const GqaHeads&);

SHARDLAB_INSTANTIATE_LLAMA_KERNELS(float)
SHARDLAB_INSTANTIATE_LLAMA_KERNELS(double)
#undef SHARDLAB_INSTANTIATE_LLAMA_KERNELS

}  // namespace shardlab::model
