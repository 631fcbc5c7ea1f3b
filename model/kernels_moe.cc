// MoE kernels: router (softmax, top-K, gates, aux loss), plan, dispatch,
// combine. Shapes use the letters declared in kernels.h.
#include <algorithm>
#include <cmath>
#include <vector>

#include "model/kernel_cost.h"
#include "model/kernels.h"
#include "model/portable_math.h"
#include "runtime/errors.h"

namespace shardlab::model {

using cost_terms::cost;
using cost_terms::gemm_cost;

int64_t expert_capacity(int64_t N, int E, int K, double capacity_factor) {
  if (capacity_factor <= 0) return N;
  const double cap = std::ceil(capacity_factor * static_cast<double>(N) * K / E);
  return std::min<int64_t>(N, static_cast<int64_t>(cap));
}

namespace {

template <typename Real>
void softmax_row(Real* p, const Real* z, int E) {
  const Real zmax = *std::max_element(z, z + E);
  Real sum = 0;
  for (int e = 0; e < E; ++e) {
    p[e] = pm::exp_of(z[e] - zmax);
    sum += p[e];
  }
  for (int e = 0; e < E; ++e) p[e] /= sum;
}

template <typename Real>
void score_row(Real* s, const Real* z, int E, Router score) {
  if (score == Router::kSoftmax) return softmax_row(s, z, E);
  for (int e = 0; e < E; ++e) s[e] = Real(1) / (Real(1) + pm::exp_of(-z[e]));
}

// The K largest key(e) over e in [begin, end) (descending; equal keys: lower
// index first), among the experts `allowed` flags (null: every one). O(K·n),
// no allocation: chosen experts are skipped by a scan of the K-long prefix.
template <typename Real, typename Key>
void top_k_keys(int32_t* chosen, const Key& key, int begin, int end, int K, const uint8_t* allowed) {
  for (int k = 0; k < K; ++k) {
    int best = -1;
    Real best_key = 0;
    for (int e = begin; e < end; ++e) {
      if ((allowed && !allowed[e]) || std::find(chosen, chosen + k, e) != chosen + k) continue;
      const Real v = key(e);
      if (best < 0 || v > best_key) best = e, best_key = v;  // strict: ties keep the lower index
    }
    chosen[k] = best;
  }
}

// The K largest keys s[e] + bias[e], among the experts of the group_top_k
// best groups when r.groups > 1 (RouterSpec, checked by GPTConfig::validate).
// Scratch (router_forward's, allocated once per call): the group keys (G),
// a flag per expert (E) and the picks (max(K, G)).
template <typename Real>
void top_k_row(int32_t* chosen, const Real* s, const Real* bias, int E, int K, const RouterSpec& r,
               std::vector<Real>& group_key, std::vector<uint8_t>& allowed, std::vector<int32_t>& picks) {
  auto key = [&](int e) { return bias ? s[e] + bias[e] : s[e]; };
  if (r.groups <= 1) return top_k_keys<Real>(chosen, key, 0, E, K, nullptr);
  const int G = r.groups, size = E / G, per_group = K / r.group_top_k;
  for (int g = 0; g < G; ++g) {  // a group's key: the sum of its per_group largest keys
    top_k_keys<Real>(picks.data(), key, g * size, (g + 1) * size, per_group, nullptr);
    Real sum = 0;
    for (int k = 0; k < per_group; ++k) sum += key(picks[size_t(k)]);
    group_key[size_t(g)] = sum;
  }
  auto by_group = [&](int g) { return group_key[size_t(g)]; };
  top_k_keys<Real>(picks.data(), by_group, 0, G, r.group_top_k, nullptr);
  std::fill(allowed.begin(), allowed.end(), uint8_t{0});
  for (int m = 0; m < r.group_top_k; ++m)
    std::fill_n(allowed.begin() + int64_t(picks[size_t(m)]) * size, size, uint8_t{1});
  top_k_keys<Real>(chosen, key, 0, E, K, allowed.data());
}

// Σ_e s[e] over the row: the aux loss's normaliser s' = s / Σ s (1 for softmax).
template <typename Real>
Real aux_norm(const Real* s, int E, Router score) {
  if (score == Router::kSoftmax) return Real(1);
  Real sum = 0;
  for (int e = 0; e < E; ++e) sum += s[e];
  return sum;
}

}  // namespace

template <typename Real>
Real router_forward(Real* probs, int32_t* expert, int32_t* slot, Real* gates, Real* frac,
                    const Real* logits, const Real* bias, int64_t N, int E, int K,
                    double capacity_factor, const RouterSpec& r) {
  SHARDLAB_CHECK(K >= 1 && K <= E, "router needs 1 <= K <= E");
  const int64_t cap = expert_capacity(N, E, K, capacity_factor);
  std::vector<int64_t> count(E, 0);   // assignments per expert (before drop)
  std::vector<double> pmean(E, 0.0);  // P_i * N
  std::vector<Real> group_key(size_t(std::max(r.groups, 1)));
  std::vector<uint8_t> allowed(r.groups > 1 ? size_t(E) : 0);
  std::vector<int32_t> picks(size_t(std::max(K, r.groups)));
  for (int64_t n = 0; n < N; ++n) {
    Real* p = probs + n * E;
    score_row(p, logits + n * E, E, r.score);
    int32_t* ex = expert + n * K;
    top_k_row(ex, p, bias, E, K, r, group_key, allowed, picks);
    Real denom = 1;
    if (r.norm_topk) {
      denom = 0;
      for (int k = 0; k < K; ++k) denom += p[ex[k]];
    }
    for (int k = 0; k < K; ++k) {
      gates[n * K + k] = p[ex[k]] / denom;
      const int64_t pos = count[ex[k]]++;
      slot[n * K + k] = pos < cap ? static_cast<int32_t>(pos) : -1;
    }
    const Real norm = aux_norm(p, E, r.score);
    for (int e = 0; e < E; ++e) pmean[e] += p[e] / norm;
  }
  double aux = 0;
  for (int e = 0; e < E; ++e) {
    const double f = static_cast<double>(count[e]) / (static_cast<double>(N) * K);
    frac[e] = static_cast<Real>(f);
    aux += f * pmean[e] / static_cast<double>(N);
  }
  return static_cast<Real>(E * aux);
}

template <typename Real>
void router_backward(Real* dlogits, const Real* dgates, Real daux, const Real* probs,
                     const int32_t* expert, const Real* frac, int64_t N, int E, int K,
                     const RouterSpec& r) {
  std::vector<Real> dp(E);  // one row of dL/ds, reused
  const Real aux_scale = daux * static_cast<Real>(E) / static_cast<Real>(N);
  for (int64_t n = 0; n < N; ++n) {
    const Real* p = probs + n * E;
    const int32_t* ex = expert + n * K;
    const Real* dg = dgates + n * K;
    // aux = (E/N) Σ_e f_e s_e / Σs: softmax (Σs = 1) d/ds_e = (E/N) f_e; sigmoid
    // d/ds_e = (E/N) (f_e − Σ_j f_j s'_j) / Σs.
    const Real norm = aux_norm(p, E, r.score);
    Real fs = 0;
    if (r.score == Router::kSigmoid)
      for (int e = 0; e < E; ++e) fs += frac[e] * p[e] / norm;
    for (int e = 0; e < E; ++e) dp[e] = aux_scale * (frac[e] - fs) / norm;
    if (r.norm_topk) {
      // gates_k = s[ex_k] / S  =>  ds[ex_k] += (dg_k − Σ_j dg_j·gates_j) / S
      Real S = 0;
      for (int k = 0; k < K; ++k) S += p[ex[k]];
      Real dot = 0;
      for (int k = 0; k < K; ++k) dot += dg[k] * p[ex[k]] / S;
      for (int k = 0; k < K; ++k) dp[ex[k]] += (dg[k] - dot) / S;
    } else {
      for (int k = 0; k < K; ++k) dp[ex[k]] += dg[k];  // gates_k = s[ex_k]
    }
    Real* dz = dlogits + n * E;
    if (r.score == Router::kSigmoid) {
      for (int e = 0; e < E; ++e) dz[e] += p[e] * (Real(1) - p[e]) * dp[e];
      continue;
    }
    Real pdp = 0;  // s = softmax(z)
    for (int e = 0; e < E; ++e) pdp += p[e] * dp[e];
    for (int e = 0; e < E; ++e) dz[e] += p[e] * (dp[e] - pdp);
  }
}

template <typename Real>
void router_bias_load(Real* signal, const int32_t* expert, int64_t N, int E, int K) {
  for (int64_t a = 0; a < N * K; ++a) signal[expert[a]] += Real(E);
  for (int e = 0; e < E; ++e) signal[e] -= static_cast<Real>(N * K);
}

OpCost router_bias_load_cost(int64_t N, int64_t E, int64_t K) {
  const double a = static_cast<double>(N) * K;  // reads the (N,K) choices, updates E sums
  return OpCost{a + E, 4.0 * a + 8.0 * E};
}

void router_bias_update(float* bias, const float* signal, int64_t n, double rate) {
  const auto r = static_cast<float>(rate);
  for (int64_t i = 0; i < n; ++i) bias[i] -= signal[i] > 0 ? r : (signal[i] < 0 ? -r : 0.0f);
}

void moe_expert_counts(int64_t* counts, const int32_t* expert, int64_t N, int E, int K) {
  std::fill(counts, counts + E, 0);
  for (int64_t a = 0; a < N * K; ++a) ++counts[expert[a]];
}

int64_t moe_apply_capacity(int32_t* slot, const int32_t* expert, const int64_t* earlier,
                           int64_t capacity, int64_t N, int K) {
  int64_t dropped = 0;
  for (int64_t a = 0; a < N * K; ++a) {
    if (slot[a] < 0 || earlier[expert[a]] + slot[a] < capacity) continue;
    slot[a] = -1;
    ++dropped;
  }
  return dropped;
}

int64_t moe_plan(int64_t* src, int64_t* offsets, const int32_t* expert, const int32_t* slot,
                 int64_t N, int E, int K) {
  std::fill(offsets, offsets + E + 1, 0);
  for (int64_t a = 0; a < N * K; ++a) {
    if (slot[a] >= 0) ++offsets[expert[a] + 1];
  }
  for (int e = 0; e < E; ++e) offsets[e + 1] += offsets[e];
  for (int64_t a = 0; a < N * K; ++a) {
    if (slot[a] >= 0) src[offsets[expert[a]] + slot[a]] = a;
  }
  return offsets[E];
}

template <typename Real>
void moe_dispatch_forward(Real* xe, const Real* x, const int64_t* src, int64_t M, int K, int C) {
  for (int64_t m = 0; m < M; ++m) {
    std::copy_n(x + (src[m] / K) * C, C, xe + m * C);
  }
}

template <typename Real>
void moe_dispatch_backward(Real* dx, const Real* dxe, const int64_t* src, int64_t M, int K, int C) {
  for (int64_t m = 0; m < M; ++m) {
    Real* d = dx + (src[m] / K) * C;
    const Real* g = dxe + m * C;
    for (int c = 0; c < C; ++c) d[c] += g[c];
  }
}

template <typename Real>
void moe_combine_forward(Real* out, const Real* ye, const Real* gates, const int64_t* src,
                         int64_t N, int64_t M, int K, int C) {
  std::fill(out, out + N * C, Real(0));
  for (int64_t m = 0; m < M; ++m) {
    Real* o = out + (src[m] / K) * C;
    const Real g = gates[src[m]];
    const Real* y = ye + m * C;
    for (int c = 0; c < C; ++c) o[c] += g * y[c];
  }
}

template <typename Real>
void moe_combine_backward(Real* dye, Real* dgates, const Real* dout, const Real* ye,
                          const Real* gates, const int64_t* src, int64_t M, int K, int C) {
  for (int64_t m = 0; m < M; ++m) {
    const Real* d = dout + (src[m] / K) * C;
    const Real* y = ye + m * C;
    Real* dy = dye + m * C;
    const Real g = gates[src[m]];
    Real dg = 0;
    for (int c = 0; c < C; ++c) {
      dy[c] += g * d[c];
      dg += d[c] * y[c];
    }
    dgates[src[m]] += dg;
  }
}

template <typename Real>
Real moe_aux_loss(const Real* frac, const Real* probs, int64_t N, int E, Router score) {
  std::vector<double> P(size_t(E), 0.0);
  for (int64_t t = 0; t < N; ++t) {
    const Real norm = aux_norm(probs + t * E, E, score);
    for (int e = 0; e < E; ++e) P[size_t(e)] += probs[t * E + e] / norm;
  }
  double aux = 0;
  for (int e = 0; e < E; ++e) aux += double(frac[e]) * P[size_t(e)] / double(N);
  return static_cast<Real>(E * aux);
}

OpCost router_forward_cost(int64_t N, int64_t E, int64_t K, int elem, const RouterSpec& r) {
  const double n = static_cast<double>(N);
  // softmax (4E), top-K scans (KE), gates (2K), the P_i statistics adds (E);
  // group-limited: each group's K/M best (K/M scans of its E/G: (K/M)·E in
  // all), their sums (K/M·G) and the M best groups (M scans of G)
  const double groups =
      r.groups > 1 ? double(K / r.group_top_k) * double(E + r.groups) + double(r.group_top_k) * r.groups : 0;
  return cost(n * (5.0 * E + K * E + 2.0 * K + groups), n * (2.0 * E + K) + E, elem, 8 * n * K);
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

#define SHARDLAB_INSTANTIATE_MOE(Real)                                                             \
  template Real moe_aux_loss(const Real*, const Real*, int64_t, int, Router);                      \
  template Real router_forward(Real*, int32_t*, int32_t*, Real*, Real*, const Real*, const Real*,  \
                               int64_t, int, int, double, const RouterSpec&);                      \
  template void router_backward(Real*, const Real*, Real, const Real*, const int32_t*,             \
                                const Real*, int64_t, int, int, const RouterSpec&);                \
  template void router_bias_load(Real*, const int32_t*, int64_t, int, int);                         \
  template void moe_dispatch_forward(Real*, const Real*, const int64_t*, int64_t, int, int);       \
  template void moe_dispatch_backward(Real*, const Real*, const int64_t*, int64_t, int, int);      \
  template void moe_combine_forward(Real*, const Real*, const Real*, const int64_t*, int64_t,      \
                                    int64_t, int, int);                                            \
  template void moe_combine_backward(Real*, Real*, const Real*, const Real*, const Real*,          \
                                     const int64_t*, int64_t, int, int);

SHARDLAB_INSTANTIATE_MOE(float)
SHARDLAB_INSTANTIATE_MOE(double)
#undef SHARDLAB_INSTANTIATE_MOE

}  // namespace shardlab::model
