// Dense kernels: embedding, layernorm, linear, GELU, residual, cross-entropy.
// Shapes use the letters declared in kernels.h.
#include "model/kernels.h"

#include <algorithm>
#include <cmath>

#include "model/gemm.h"
#include "model/portable_math.h"
#include "runtime/errors.h"

namespace shardlab::model {

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

// ---- LayerNorm ----------------------------------------------------------------

// The row reductions are 16-lane sums (model/portable_math.h): a fixed order,
// so results are deterministic and the same on every host.

template <typename Real>
void layernorm_forward(Real* out, Real* mean, Real* rstd, const Real* inp, const Real* weight,
                       const Real* bias, int64_t N, int C) {
  const Real eps = static_cast<Real>(kLayerNormEps);
  for (int64_t n = 0; n < N; ++n) {
    const Real* x = inp + n * C;
    const Real m = pm::sum(x, C) / C;
    const Real v = pm::lane_sum<Real>(C, [x, m](int64_t c) { return (x[c] - m) * (x[c] - m); }) / C;
    const Real s = Real(1) / std::sqrt(v + eps);
    Real* o = out + n * C;
    for (int c = 0; c < C; ++c) o[c] = (x[c] - m) * s * weight[c] + bias[c];
    mean[n] = m;
    rstd[n] = s;
  }
}

template <typename Real>
void layernorm_backward(Real* dinp, Real* dweight, Real* dbias, const Real* dout, const Real* inp,
                        const Real* weight, const Real* mean, const Real* rstd, int64_t N, int C) {
  for (int64_t n = 0; n < N; ++n) {
    const Real m = mean[n];
    const Real s = rstd[n];
    const Real* d = dout + n * C;
    const Real* x = inp + n * C;
    // Two reductions: mean(dnorm) and mean(dnorm * norm), dnorm = weight * dout.
    const Real dnorm_mean = pm::lane_sum<Real>(C, [=](int64_t c) { return weight[c] * d[c]; }) / C;
    const Real dnorm_norm_mean =
        pm::lane_sum<Real>(C, [=](int64_t c) { return weight[c] * d[c] * ((x[c] - m) * s); }) / C;
    Real* di = dinp + n * C;
    for (int c = 0; c < C; ++c) {
      const Real norm = (x[c] - m) * s;
      dbias[c] += d[c];
      dweight[c] += norm * d[c];
      di[c] += (weight[c] * d[c] - dnorm_mean - norm * dnorm_norm_mean) * s;
    }
  }
}

// ---- Linear -------------------------------------------------------------------

template <typename Real>
void linear_forward(Real* out, const Real* inp, const Real* weight, const Real* bias, int64_t N,
                    int C, int OC) {
  gemm_nt(out, OC, inp, C, weight, C, N, OC, C);
  if (bias == nullptr) return;
  for (int64_t n = 0; n < N; ++n) {
    Real* y = out + n * OC;
    for (int o = 0; o < OC; ++o) y[o] += bias[o];
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
  for (int64_t n = 0; n < N; ++n) {  // rows in order, vectorised across the columns
    const Real* dy = dout + n * OC;
    for (int o = 0; o < OC; ++o) dbias[o] += dy[o];
  }
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
  for (int64_t i = 0; i < n; ++i) {
    const Real x = inp[i];
    out[i] = Real(0.5) * x * (Real(1) + pm::tanh_of(s * (x + k * (x * x * x))));
  }
}

template <typename Real>
void gelu_backward(Real* dinp, const Real* dout, const Real* inp, int64_t n) {
  const Real s = static_cast<Real>(kGeluScale), k = static_cast<Real>(kGeluCubic);
  for (int64_t i = 0; i < n; ++i) {
    const Real x = inp[i];
    const Real th = pm::tanh_of(s * (x + k * (x * x * x)));
    // d/dx [x/2 (1 + tanh u)] = (1 + tanh u)/2 + x/2 (1 - tanh² u) du/dx
    dinp[i] += (Real(0.5) * (Real(1) + th) +
                Real(0.5) * x * (Real(1) - th * th) * s * (Real(1) + Real(3) * k * (x * x))) *
               dout[i];
  }
}

// ---- Residual -----------------------------------------------------------------

template <typename Real>
void residual_forward(Real* out, const Real* inp1, const Real* inp2, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = inp1[i] + inp2[i];
}

template <typename Real>
void residual_backward(Real* dinp1, Real* dinp2, const Real* dout, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    dinp1[i] += dout[i];
    dinp2[i] += dout[i];
  }
}

// ---- Cross-entropy ------------------------------------------------------------

template <typename Real>
Real crossentropy_forward(Real* probs, Real* losses, const Real* logits, const Token* targets,
                          int64_t N, int V) {
  double total = 0;
  for (int64_t n = 0; n < N; ++n) {
    const Real* z = logits + n * V;
    Real* p = probs + n * V;
    const Real zmax = pm::max(z, V);
    for (int v = 0; v < V; ++v) p[v] = pm::exp_of(z[v] - zmax);
    const Real sum = pm::sum(p, V);
    const Real inv = Real(1) / sum;
    for (int v = 0; v < V; ++v) p[v] *= inv;
    const Token y = targets[n];
    SHARDLAB_CHECK(y >= 0 && y < V, "target token out of range");
    losses[n] = static_cast<Real>(pm::log(double(sum))) + zmax - z[y];  // -log softmax(z)[y], stable
    total += losses[n];
  }
  return static_cast<Real>(total / static_cast<double>(N));
}

template <typename Real>
void crossentropy_backward(Real* dlogits, const Real* probs, const Token* targets, Real dloss,
                           int64_t N, int V) {
  const Real scale = dloss / static_cast<Real>(N);
  for (int64_t n = 0; n < N; ++n) {
    const Real* p = probs + n * V;
    Real* d = dlogits + n * V;
    for (int v = 0; v < V; ++v) d[v] += p[v] * scale;
    d[targets[n]] -= scale;
  }
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
  template void gelu_forward(Real*, const Real*, int64_t);                                       \
  template void gelu_backward(Real*, const Real*, const Real*, int64_t);                         \
  template void residual_forward(Real*, const Real*, const Real*, int64_t);                      \
  template void residual_backward(Real*, Real*, const Real*, int64_t);                           \
  template Real crossentropy_forward(Real*, Real*, const Real*, const Token*, int64_t, int);     \
  template void crossentropy_backward(Real*, const Real*, const Token*, Real, int64_t, int);

SHARDLAB_INSTANTIATE_DENSE(float)
SHARDLAB_INSTANTIATE_DENSE(double)
#undef SHARDLAB_INSTANTIATE_DENSE

}  // namespace shardlab::model
