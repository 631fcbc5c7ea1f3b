// cached_attention_forward's blocked loops (16 keys' scores, 16 columns'
// context sums in vector registers) against the plain loops they replaced,
// bit for bit: decode (one new token) and prefill-like steps, head sizes
// below, at and past a block of 16, key counts around 16-key blocks, and
// grouped-query heads.
#include "model/infer/cached_attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "model/portable_math.h"

namespace shardlab::infer {
namespace {

// The kernel before session 21, verbatim: one key's score, one column's sum at a time.
void plain(float* out, int64_t ld_out, const float* qkv, int64_t ld_qkv, const float* keys, const float* values,
           int p0, int n, const model::GqaHeads& g) {
  const int NHl = g.NHq, HS = g.HS;
  const int64_t KVC = int64_t{g.KVl} * HS;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  std::vector<float> att(size_t(p0 + n));
  for (int j = 0; j < n; ++j) {
    const int keys_seen = p0 + j + 1;
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

TEST(CachedAttention, BlockedLoopsGiveThePlainLoopsBits) {
  std::mt19937 gen(21);
  std::normal_distribution<float> z(0.0f, 2.0f);
  int cases = 0, differ = 0;
  for (const int HS : {8, 16, 20, 32, 48})
    for (const auto& [NHq, KVl] : {std::pair{1, 1}, std::pair{4, 4}, std::pair{4, 2}})
      for (const int p0 : {0, 1, 14, 15, 16, 17, 31, 40})
        for (const int n : {1, 3, 17}) {
          model::GqaHeads g;
          g.NHq = NHq, g.KVl = KVl, g.HS = HS, g.G = NHq / KVl;
          const int64_t KVC = int64_t{KVl} * HS, ld_qkv = int64_t{NHq + 2 * KVl} * HS + 3, ld_out = NHq * HS + 5;
          std::vector<float> qkv(size_t(n * ld_qkv)), keys(size_t((p0 + n) * KVC)), values(keys.size());
          for (auto* v : {&qkv, &keys, &values})
            for (float& x : *v) x = z(gen);
          std::vector<float> want(size_t(n * ld_out), 9.0f), got(want);
          plain(want.data(), ld_out, qkv.data(), ld_qkv, keys.data(), values.data(), p0, n, g);
          cached_attention_forward(got.data(), ld_out, qkv.data(), ld_qkv, keys.data(), values.data(), p0, n, g);
          ++cases;
          if (std::memcmp(want.data(), got.data(), want.size() * sizeof(float)) != 0) {
            ++differ;
            ADD_FAILURE() << "HS " << HS << " heads " << NHq << "/" << KVl << " p0 " << p0 << " n " << n;
          }
        }
  std::printf("cached attention: %d of %d shapes differ from the plain loops (tolerance 0 bits)\n", differ, cases);
}

}  // namespace
}  // namespace shardlab::infer
