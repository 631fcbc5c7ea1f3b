#include "model/infer/cached_attention.h"

#include <algorithm>
#include <cmath>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "model/host_split.h"
#include "model/kernel_cost.h"
#include "model/portable_math.h"

namespace shardlab::infer {

namespace {

#if defined(__AVX512F__)
// r[i] lane j <- r[j] lane i: a 16 × 16 transpose in registers (moves only).
inline void transpose16(__m512* r) {
  __m512 t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0x88);
    t[i + 4] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0xdd);
    t[i + 8] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0x88);
    t[i + 12] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0xdd);
  }
  for (int i = 0; i < 8; ++i) {
    r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
    r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd);
  }
}
#endif

}  // namespace

// Per (new token, head): the scores q·k of every key seen, each summed over
// i in order from 0; their maximum; p = exp((s - max)·scale), summed in key
// order; out = Σ_u (p_u / sum)·v_u in key order from 0. Blocks of 16 keys
// (scores) and 16 columns (context) keep their sums in vector registers,
// each lane the same operations in the same order as one key's or one
// column's scalar loop: the bits of the plain loops (tests/model/infer/
// cached_attention_test.cc). With AVX-512 and whole 16-column head blocks,
// 16 keys' rows are transposed in registers (moves only) so their scores
// take one vector multiply and add per column; elsewhere the same lanes in
// plain loops.
void cached_attention_forward(float* out, int64_t ld_out, const float* qkv, int64_t ld_qkv, const float* keys,
                              const float* values, int p0, int n, const model::GqaHeads& g) {
  constexpr int kLanes = 16;
  const int NHl = g.NHq, HS = g.HS;
  const int64_t KVC = int64_t{g.KVl} * HS;  // a cached row
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  float* const att = model::thread_scratch<float>(size_t(p0 + n)).data();
  for (int j = 0; j < n; ++j) {
    const int keys_seen = p0 + j + 1;  // causal: positions 0 .. p0 + j
    for (int h = 0; h < NHl; ++h) {
      const float* q = qkv + j * ld_qkv + h * HS;
      const int64_t kv = int64_t{g.kv_of(h)} * HS;
      const float* k = keys + kv;
      int u = 0;
#if defined(__AVX512F__)
      if (HS % kLanes == 0)  // 16 keys' rows, 16 columns at a time, turned into 16 columns of keys
        for (; u < keys_seen; u += kLanes) {
          const int keys = std::min(kLanes, keys_seen - u);  // the last block's missing rows: zeros
          __m512 dot = _mm512_setzero_ps();
          for (int i0 = 0; i0 < HS; i0 += kLanes) {
            __m512 r[kLanes];
            for (int t = 0; t < kLanes; ++t)  // masked, not branched: rows past the last read nothing
              r[t] = _mm512_maskz_loadu_ps(__mmask16(t < keys ? 0xffff : 0), k + (u + std::min(t, keys - 1)) * KVC + i0);
            transpose16(r);  // r[i] lane t: key u + t's column i0 + i
            for (int i = 0; i < kLanes; ++i) dot = _mm512_add_ps(dot, _mm512_mul_ps(_mm512_set1_ps(q[i0 + i]), r[i]));
          }
          _mm512_mask_storeu_ps(att + u, __mmask16((1u << keys) - 1), dot);
        }
#endif
      for (; u + kLanes <= keys_seen; u += kLanes) {
        float dot[kLanes] = {};
        for (int i = 0; i < HS; ++i)
          for (int t = 0; t < kLanes; ++t) dot[t] += q[i] * k[(u + t) * KVC + i];
        for (int t = 0; t < kLanes; ++t) att[u + t] = dot[t];
      }
      for (; u < keys_seen; ++u) {
        float dot = 0;
        for (int i = 0; i < HS; ++i) dot += q[i] * k[u * KVC + i];
        att[u] = dot;
      }
      float vmax = -INFINITY;
      for (u = 0; u < keys_seen; ++u) vmax = std::max(vmax, att[u]);
      for (u = 0; u < keys_seen; ++u) att[u] = model::pm::exp((att[u] - vmax) * scale);
      float sum = 0;
      for (u = 0; u < keys_seen; ++u) sum += att[u];
      for (u = 0; u < keys_seen; ++u) att[u] /= sum;
      float* o = out + j * ld_out + h * HS;
      const float* v = values + kv;
      int i0 = 0;
#if defined(__AVX512F__)
      for (; i0 + kLanes <= HS; i0 += kLanes) {
        __m512 acc = _mm512_setzero_ps();
        for (u = 0; u < keys_seen; ++u)
          acc = _mm512_add_ps(acc, _mm512_mul_ps(_mm512_set1_ps(att[u]), _mm512_loadu_ps(v + u * KVC + i0)));
        _mm512_storeu_ps(o + i0, acc);
      }
#endif
      for (; i0 + kLanes <= HS; i0 += kLanes) {
        float acc[kLanes] = {};
        for (u = 0; u < keys_seen; ++u)
          for (int t = 0; t < kLanes; ++t) acc[t] += att[u] * v[u * KVC + i0 + t];
        std::copy_n(acc, kLanes, o + i0);
      }
      for (int i = i0; i < HS; ++i) {
        float acc = 0;
        for (u = 0; u < keys_seen; ++u) acc += att[u] * v[u * KVC + i];
        o[i] = acc;
      }
    }
  }
}

model::AttentionCosts cached_attention_costs(const std::vector<AttendShape>& seqs, int64_t NHl,
                                             int64_t HS, int elem, int kv_elem) {
  double ql = 0, l = 0, q = 0;  // Σ q·L, Σ L, Σ q over the sequences
  for (const AttendShape& s : seqs) {
    ql += double(s.q) * double(s.L);
    l += double(s.L);
    q += double(s.q);
  }
  const double h = double(NHl), hs = double(HS), e = elem, kv = kv_elem > 0 ? kv_elem : elem;
  model::AttentionCosts c;
  c.scores = {2 * h * ql * hs, h * ((q * hs + ql) * e + l * hs * kv)};
  c.softmax = {5 * h * ql, 2 * h * ql * e};
  c.context = {2 * h * ql * hs, h * ((ql + q * hs) * e + l * hs * kv)};
  return c;
}

// Plain loops in a fixed order (the latent cache is small in the models
// that run on values here).
void mla_cached_attention_forward(float* out, int64_t ld_out, const float* q, int64_t ld_q, const float* latents,
                                  const float* kv_up, int p0, int n, const model::MlaHeads& h, int Lkv) {
  const int Dn = h.Dn, Dr = h.Dr, Dv = h.Dv, HS = h.HS(), R = Lkv + Dr;  // R: a cached row
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  thread_local std::vector<float> qa, ctx, att;  // reused: no allocation per call
  qa.resize(static_cast<size_t>(Lkv));
  ctx.resize(static_cast<size_t>(Lkv));
  att.resize(static_cast<size_t>(p0 + n));
  for (int j = 0; j < n; ++j) {
    const int keys_seen = p0 + j + 1;  // causal: the cached rows up to this token's own
    for (int hd = 0; hd < h.NH; ++hd) {
      const float* qn = q + int64_t{j} * ld_q + int64_t{hd} * HS;
      const float* qpe = qn + Dn;
      const float* wk = kv_up + int64_t{hd} * (Dn + Dv) * Lkv;  // W_UK(h): Dn rows of Lkv
      const float* wv = wk + int64_t{Dn} * Lkv;                 // W_UV(h): Dv rows of Lkv
      std::fill(qa.begin(), qa.end(), 0.0f);
      for (int d = 0; d < Dn; ++d)
        for (int i = 0; i < Lkv; ++i) qa[size_t(i)] += qn[d] * wk[int64_t{d} * Lkv + i];
      float maxv = -INFINITY;
      for (int u = 0; u < keys_seen; ++u) {
        const float* row = latents + int64_t{u} * R;
        float sc = 0;
        for (int i = 0; i < Lkv; ++i) sc += qa[size_t(i)] * row[i];
        for (int r = 0; r < Dr; ++r) sc += qpe[r] * row[Lkv + r];
        att[size_t(u)] = sc;
        maxv = std::max(maxv, sc);
      }
      float sum = 0;  // the project's exp: the same bits on every host (portable_math.h)
      for (int u = 0; u < keys_seen; ++u) sum += att[size_t(u)] = model::pm::exp((att[size_t(u)] - maxv) * scale);
      std::fill(ctx.begin(), ctx.end(), 0.0f);
      for (int u = 0; u < keys_seen; ++u) {
        const float p = att[size_t(u)] / sum;
        const float* row = latents + int64_t{u} * R;
        for (int i = 0; i < Lkv; ++i) ctx[size_t(i)] += p * row[i];
      }
      float* o = out + int64_t{j} * ld_out + int64_t{hd} * Dv;
      for (int v = 0; v < Dv; ++v) {
        float acc = 0;
        for (int i = 0; i < Lkv; ++i) acc += wv[int64_t{v} * Lkv + i] * ctx[size_t(i)];
        o[v] = acc;
      }
    }
  }
}

MlaAttendCosts mla_cached_attention_costs(const std::vector<AttendShape>& seqs, const model::MlaHeads& h, int Lkv,
                                          int elem, int kv_elem) {
  // Σ q, Σ q·L and Σ L over the decode (0) and the prefill (1) sequences.
  double q[2] = {0, 0}, ql[2] = {0, 0}, l[2] = {0, 0};
  for (const AttendShape& s : seqs) {
    const int k = s.q > 1;
    q[k] += double(s.q);
    ql[k] += double(s.q) * double(s.L);
    l[k] += double(s.L);
  }
  const double H = h.NH, Dn = h.Dn, Dv = h.Dv, HS = h.HS(), lat = Lkv, R = lat + h.Dr, e = elem;
  const double kv = kv_elem > 0 ? kv_elem : elem;  // the cached latent rows' bytes an element
  using model::cost_terms::cost;
  using model::cost_terms::gemm_cost;
  MlaAttendCosts c;
  if (q[0] > 0) {  // absorbed
    const auto Q = int64_t(q[0]);
    c.q_absorb = gemm_cost(cost(2 * H * q[0] * Dn * lat, q[0] * H * Dn + H * Dn * lat + q[0] * H * lat, elem),
                           {Q, Lkv, h.Dn, h.NH});
    c.v_up = gemm_cost(cost(2 * H * q[0] * lat * Dv, q[0] * H * lat + H * Dv * lat + q[0] * H * Dv, elem),
                       {Q, h.Dv, Lkv, h.NH});
  }
  if (q[1] > 0) {  // up-projected
    const double W = H * (Dn + Dv);
    c.kv_up = gemm_cost(cost(2 * l[1] * lat * W, l[1] * lat + W * lat + l[1] * W, elem),
                        {int64_t(l[1]), int64_t(W), Lkv, 1});
  }
  c.scores = {2 * H * (ql[0] * R + ql[1] * HS),
              (q[0] * H * R + H * ql[0] + H * (q[1] * HS + l[1] * HS + ql[1])) * e + l[0] * R * kv};
  c.softmax = {5 * H * (ql[0] + ql[1]), 2 * H * (ql[0] + ql[1]) * e};
  c.context = {2 * H * (ql[0] * lat + ql[1] * Dv),
               (H * ql[0] + q[0] * H * lat + H * (ql[1] + l[1] * Dv + q[1] * Dv)) * e + l[0] * lat * kv};
  return c;
}

}  // namespace shardlab::infer
