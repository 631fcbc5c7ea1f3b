// The KV cache's modeled bytes per device are exactly
//   2 · layers_on_device · (heads / tp) · head_dim · tokens · element_bytes
// (the formula written out here, not read from the cache), for every split
// and precision, and the arena holds them as their own kind (kv_cache).
#include <gtest/gtest.h>

#include "model/infer/kv_cache.h"
#include "tests/model/infer/infer_test_util.h"

namespace shardlab::infer {
namespace {

using testing::run_generate;
using testing::small_config;

struct Case {
  int tp, pp, ep;
  bool moe;
  Precision precision;
};

// Generates 9 tokens after a 7-token prompt under k and expects every rank
// to hold `values` cached values a token and local layer, at k's precision.
void expect_cache_bytes(const model::GPTConfig& c, const Case& k, uint64_t values) {
  GenerateOptions o;
  o.model = c;
  o.prompt = {1, 2, 3, 4, 5, 6, 7};
  o.max_new_tokens = 9;
  o.tp = k.tp;
  o.pp = k.pp;
  o.ep = k.ep;
  const GenerateResult r = run_generate(o, k.precision);
  // The last token is never fed back: the cache holds prompt + new - 1.
  const uint64_t tokens = o.prompt.size() + uint64_t(o.max_new_tokens) - 1;
  const uint64_t elem = k.precision == Precision::kBf16 ? 2 : 4;
  const uint64_t layers = uint64_t(c.n_layer / k.pp);
  const uint64_t want = layers * values * tokens * elem;
  ASSERT_EQ(r.kv_bytes.size(), size_t(o.world()));
  for (int rank = 0; rank < o.world(); ++rank) {
    EXPECT_EQ(r.kv_bytes[size_t(rank)], want) << "tp " << k.tp << " pp " << k.pp << " rank " << rank;
    EXPECT_EQ(r.kv_tokens[size_t(rank)], int64_t(tokens));
    EXPECT_EQ(r.run.devices[size_t(rank)].peak_by_kind[int(MemKind::kKvCache)], want) << "rank " << rank;
  }
}

TEST(KvCache, BytesPerDeviceFollowTheFormula) {
  const std::vector<Case> cases = {{1, 1, 1, false, Precision::kFp32}, {2, 1, 1, false, Precision::kFp32},
                                   {1, 2, 1, false, Precision::kBf16}, {2, 2, 1, false, Precision::kBf16},
                                   {4, 1, 1, false, Precision::kFp32}, {1, 1, 2, true, Precision::kFp32}};
  for (const Case& k : cases) {
    const model::GPTConfig c = small_config(k.moe);
    const uint64_t heads = uint64_t(c.n_head / k.tp), head_dim = uint64_t(c.n_embd / c.n_head);
    expect_cache_bytes(c, k, 2 * heads * head_dim);  // K and V of this rank's heads
  }
}

// Multi-head latent attention caches one row [c (Lkv) | k_pe (Dr)] a token
// and layer, whole on every tp rank (the heads share it):
//   layers_on_device · (Lkv + Dr) · tokens · element_bytes
TEST(KvCache, MlaLatentRowsAreOnePlaneOnEveryTpRank) {
  for (const Case& k : std::vector<Case>{{1, 1, 1, false, Precision::kFp32}, {2, 1, 1, false, Precision::kBf16},
                                         {4, 2, 1, false, Precision::kFp32}})
    expect_cache_bytes(testing::mla_config(), k, 16 + 8);  // mla_config's Lkv + Dr, whatever tp
}

TEST(KvCache, AppendChargesAndReleaseReturnsTheArena) {
  ClusterOptions co;
  co.world_size = 1;
  Cluster cluster(load_profile("a100-nvlink"), co);
  cluster.run([](Device& dev) {
    KvCache cache(dev, {3, 2, 8});
    const int a = cache.add_sequence(10), b = cache.add_sequence(4);
    EXPECT_EQ(dev.arena().used(MemKind::kKvCache), 0u);  // reserved on the host, not charged
    EXPECT_EQ(cache.append(a, 6), 0);
    EXPECT_EQ(cache.append(a, 1), 6);
    EXPECT_EQ(cache.append(b, 4), 0);
    EXPECT_EQ(dev.arena().used(MemKind::kKvCache), 2u * 3 * 2 * 8 * 11 * 4);
    cache.release(a);
    EXPECT_EQ(dev.arena().used(MemKind::kKvCache), 2u * 3 * 2 * 8 * 4 * 4);
    EXPECT_EQ(cache.tokens(), 4);
    // Layer 1's keys of b follow layer 0's keys and values.
    EXPECT_EQ(cache.keys(b, 1) - cache.keys(b, 0), 2 * 4 * 16);
    EXPECT_EQ(cache.values(b, 1) - cache.keys(b, 1), 4 * 16);
  });
}

TEST(KvCache, TheModeledCapacityBoundsTheCache) {
  ClusterOptions co;
  co.world_size = 1;
  co.memory_bytes = 4096;
  Cluster cluster(load_profile("a100-nvlink"), co);
  EXPECT_THROW(cluster.run([](Device& dev) {
                 KvCache cache(dev, {4, 4, 16});
                 const int s = cache.add_sequence(64);
                 cache.append(s, 64);  // 2·4·64·64·4 bytes > 4 KiB
               }),
               RunError);
}

}  // namespace
}  // namespace shardlab::infer
