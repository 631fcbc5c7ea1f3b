// Chunk-pair attention kernels (block_attention.h). Plain loops over (b, h,
// query row): the models run here are small, and a fixed loop order keeps
// every result deterministic.
#include "model/parallel/context/block_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "model/parallel/attention_kernel.h"
#include "model/portable_math.h"

namespace shardlab::parallel {

namespace {

float dot(const float* a, const float* b, int n) {
  float s = 0;
  for (int i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// Where row t of sequence b, head h lives in each layout.
struct Rows {
  const BlockDims& d;
  int64_t row(int b, int64_t t) const { return int64_t{b} * d.T + t; }
  int64_t q(int b, int h, int64_t t) const { return row(b, t) * 3 * d.C() + int64_t{h} * d.HS; }
  int64_t k(int b, int h, int64_t t) const { return row(b, t) * d.KVW() + int64_t{d.kv_of(h)} * d.HS; }
  int64_t v(int b, int h, int64_t t) const { return row(b, t) * d.KVW() + d.KVC() + int64_t{d.kv_of(h)} * d.hv(); }
  int64_t out(int b, int h, int64_t t) const { return row(b, t) * d.C() + int64_t{h} * d.HS; }   // atty, datty
  int64_t acc(int b, int h, int64_t t) const { return row(b, t) * d.Cv() + int64_t{h} * d.hv(); }
  int64_t state(int b, int h, int64_t t) const { return (int64_t{b} * d.NH + h) * d.T + t; }
};

float scale_of(const BlockDims& d) { return 1.0f / std::sqrt(static_cast<float>(d.HS)); }

}  // namespace

void block_attention_forward(float* acc, float* m, float* l, const float* qkv, const float* kv,
                             const BlockDims& d, const ChunkPair& p) {
  const Rows at{d};
  const float scale = scale_of(d);
  std::vector<float> s(static_cast<size_t>(p.len));
  for (int b = 0; b < d.B; ++b) {
    for (int h = 0; h < d.NH; ++h) {
      for (int64_t i = 0; i < p.len; ++i) {
        const float* q = qkv + at.q(b, h, p.q0 + i);
        const int64_t keys = p.diagonal ? i + 1 : p.len;
        float block_max = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j < keys; ++j) {
          s[size_t(j)] = dot(q, kv + at.k(b, h, p.k0 + j), d.HS) * scale;
          block_max = std::max(block_max, s[size_t(j)]);
        }
        const int64_t st = at.state(b, h, p.q0 + i);
        const float m_new = std::max(m[st], block_max);
        const float rescale = model::pm::exp(m[st] - m_new);  // 0 for the first block (m = -inf)
        float* o = acc + at.acc(b, h, p.q0 + i);
        const int hv = d.hv();
        for (int c = 0; c < hv; ++c) o[c] *= rescale;
        float sum = 0;
        for (int64_t j = 0; j < keys; ++j) {
          const float e = model::pm::exp(s[size_t(j)] - m_new);
          sum += e;
          const float* v = kv + at.v(b, h, p.k0 + j);
          for (int c = 0; c < hv; ++c) o[c] += e * v[c];
        }
        l[st] = l[st] * rescale + sum;
        m[st] = m_new;
      }
    }
  }
}

void block_attention_finish(float* atty, float* lse, const float* acc, const float* m,
                            const float* l, const BlockDims& d) {
  const Rows at{d};
  for (int b = 0; b < d.B; ++b)
    for (int h = 0; h < d.NH; ++h)
      for (int64_t t = 0; t < d.T; ++t) {
        const int64_t st = at.state(b, h, t), o = at.out(b, h, t), a = at.acc(b, h, t);
        const float inv = 1.0f / l[st];
        for (int c = 0; c < d.hv(); ++c) atty[o + c] = acc[a + c] * inv;
        for (int c = d.hv(); c < d.HS; ++c) atty[o + c] = 0;  // MLA: v's padding
        lse[st] = m[st] + float(model::pm::log(double(l[st])));
      }
}

void block_attention_delta(float* delta, const float* datty, const float* atty, const BlockDims& d) {
  const Rows at{d};
  for (int b = 0; b < d.B; ++b)
    for (int h = 0; h < d.NH; ++h)
      for (int64_t t = 0; t < d.T; ++t)
        delta[at.state(b, h, t)] = dot(datty + at.out(b, h, t), atty + at.out(b, h, t), d.hv());
}

void block_attention_backward(float* dqkv, float* dkv, const float* datty, const float* qkv,
                              const float* kv, const float* lse, const float* delta,
                              const BlockDims& d, const ChunkPair& p) {
  const Rows at{d};
  const float scale = scale_of(d);
  for (int b = 0; b < d.B; ++b) {
    for (int h = 0; h < d.NH; ++h) {
      for (int64_t i = 0; i < p.len; ++i) {
        const float* q = qkv + at.q(b, h, p.q0 + i);
        const float* dout = datty + at.out(b, h, p.q0 + i);
        float* dq = dqkv + at.q(b, h, p.q0 + i);
        const int64_t st = at.state(b, h, p.q0 + i);
        const int64_t keys = p.diagonal ? i + 1 : p.len;
        for (int64_t j = 0; j < keys; ++j) {
          const float* k = kv + at.k(b, h, p.k0 + j);
          const float* v = kv + at.v(b, h, p.k0 + j);
          const float prob = model::pm::exp(dot(q, k, d.HS) * scale - lse[st]);
          const float ds = prob * (dot(dout, v, d.hv()) - delta[st]) * scale;
          float* dk = dkv + at.k(b, h, p.k0 + j);
          float* dv = dkv + at.v(b, h, p.k0 + j);
          if (d.hv() == d.HS) {
            for (int c = 0; c < d.HS; ++c) {
              dv[c] += prob * dout[c];
              dq[c] += ds * k[c];
              dk[c] += ds * q[c];
            }
          } else {  // MLA: v narrower than q and k
            for (int c = 0; c < d.hv(); ++c) dv[c] += prob * dout[c];
            for (int c = 0; c < d.HS; ++c) {
              dq[c] += ds * k[c];
              dk[c] += ds * q[c];
            }
          }
        }
      }
    }
  }
}

// A fused block (the ring's FlashAttention call) runs at the kernel's
// published rate for a len-query, len-key call: causal on the diagonal
// block, unmasked off it.
static void fused_rate(OpCost& c, OpCost::Attention pass, int64_t len, bool diagonal) {
  c.attention = pass;
  c.attention_seq = len;
  c.attention_causal = diagonal;
}

OpCost block_attention_forward_cost(const BlockDims& d, int64_t len, bool diagonal, int elem, bool on_chip) {
  const int64_t keys = diagonal ? (len + 1) / 2 : len;  // the mean keys per query
  const int64_t BH = int64_t{d.B} * d.NH;
  const double pairs = double(BH) * double(len) * double(keys);
  const double rows = double(BH) * double(len);
  const int64_t hv = d.hv();  // MLA: P·V and the accumulator at the values' width
  // q, k, v read; the output accumulator read and written; m and l in fp32.
  const double bytes = (rows * d.HS + double(BH) * keys * (d.HS + hv) + 2 * rows * hv) * elem + 8 * rows;
  OpCost c = attention_gemms(2 * pairs * (d.HS + hv) + 7 * pairs, bytes, {len, keys, d.HS, BH}, {len, hv, keys, BH},
                             on_chip);
  if (on_chip) fused_rate(c, OpCost::Attention::kForward, len, diagonal);
  return c;
}

OpCost block_attention_backward_cost(const BlockDims& d, int64_t len, bool diagonal, int elem, bool on_chip) {
  const int64_t keys = diagonal ? (len + 1) / 2 : len;
  const int64_t BH = int64_t{d.B} * d.NH;
  const double pairs = double(BH) * double(len) * double(keys);
  const double rows = double(BH) * double(len);
  const int64_t hv = d.hv();  // MLA: dout·vᵀ and dv at the values' width
  // q, dout, dq (read and written); k, v, dk and dv (read and written); lse, delta.
  const double bytes = (rows * (3 * d.HS + hv) + 3.0 * BH * keys * (d.HS + hv)) * elem + 8 * rows;
  // q·kᵀ and dout·vᵀ: (len × keys) outputs; dv, dq, dk: (· × HS) outputs.
  OpCost c = attention_gemms(2 * pairs * (3 * d.HS + 2 * hv) + 6 * pairs, bytes, {len, keys, d.HS, 2 * BH},
                             {len, hv, keys, 3 * BH}, on_chip);
  if (on_chip) fused_rate(c, OpCost::Attention::kBackward, len, diagonal);
  return c;
}

}  // namespace shardlab::parallel
