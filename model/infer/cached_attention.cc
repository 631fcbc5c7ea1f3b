#include "model/infer/cached_attention.h"

#include <algorithm>
#include <cmath>

#include "model/portable_math.h"

namespace shardlab::infer {

void cached_attention_forward(float* out, int64_t ld_out, const float* qkv, int64_t ld_qkv, const float* keys,
                              const float* values, int p0, int n, const model::GqaHeads& g) {
  const int NHl = g.NHq, HS = g.HS;
  const int64_t KVC = int64_t{g.KVl} * HS;  // a cached row
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  std::vector<float> att(size_t(p0 + n));
  for (int j = 0; j < n; ++j) {
    const int keys_seen = p0 + j + 1;  // causal: positions 0 .. p0 + j
    for (int h = 0; h < NHl; ++h) {
      const float* q = qkv + j * ld_qkv + h * HS;
      const int64_t kv = int64_t{g.kv_of(h)} * HS;
      float vmax = -INFINITY;
      for (int u = 0; u < keys_seen; ++u) {
        const float* k = keys + u * KVC + kv;
        float dot = 0;
        for (int i = 0; i < HS; ++i) dot += q[i] * k[i];
        att[size_t(u)] = dot;
        vmax = std::max(vmax, dot);
      }
      float sum = 0;
      for (int u = 0; u < keys_seen; ++u) sum += att[size_t(u)] = model::pm::exp((att[size_t(u)] - vmax) * scale);
      float* o = out + j * ld_out + h * HS;
      std::fill(o, o + HS, 0.0f);
      for (int u = 0; u < keys_seen; ++u) {
        const float a = att[size_t(u)] / sum;
        const float* v = values + u * KVC + kv;
        for (int i = 0; i < HS; ++i) o[i] += a * v[i];
      }
    }
  }
}

model::AttentionCosts cached_attention_costs(const std::vector<AttendShape>& seqs, int64_t NHl,
                                             int64_t HS, int elem) {
  double ql = 0, l = 0, q = 0;  // Σ q·L, Σ L, Σ q over the sequences
  for (const AttendShape& s : seqs) {
    ql += double(s.q) * double(s.L);
    l += double(s.L);
    q += double(s.q);
  }
  const double h = double(NHl), hs = double(HS), e = elem;
  model::AttentionCosts c;
  c.scores = {2 * h * ql * hs, h * (q * hs + l * hs + ql) * e};
  c.softmax = {5 * h * ql, 2 * h * ql * e};
  c.context = {2 * h * ql * hs, h * (ql + l * hs + q * hs) * e};
  return c;
}

}  // namespace shardlab::infer
