// Prefix caching: the block pool's sharing and LRU eviction, and the
// scheduler skipping exactly the cached tokens' prefill (times by hand with
// a step of 1 s + 0.01 s per token).
#include <gtest/gtest.h>

#include "model/serve/kv_blocks.h"
#include "model/serve/scheduler.h"
#include "support/config_error.h"
#include "tests/model/serve/linear_step.h"

namespace shardlab::serve {
namespace {

TEST(PrefixCache, ABlockNameCoversItsTokensAndItsParent) {
  const std::vector<uint64_t> a = {1, 2, 3, 4, 5}, b = {1, 2, 9, 4, 5}, c = {9, 2, 3, 4};
  const std::vector<uint64_t> ha = block_hashes(a, 2), hb = block_hashes(b, 2), hc = block_hashes(c, 2);
  ASSERT_EQ(ha.size(), 2u);  // full blocks only
  EXPECT_EQ(ha[0], hb[0]);
  EXPECT_NE(ha[1], hb[1]);  // its own tokens differ
  EXPECT_NE(ha[1], hc[1]);  // same tokens (3, 4), another parent
  EXPECT_EQ(block_hashes(std::vector<uint64_t>{2, 1}, 2), block_hashes(std::vector<uint64_t>{2, 1}, 2));
  EXPECT_NE(block_hashes(std::vector<uint64_t>{2, 1}, 2), block_hashes(std::vector<uint64_t>{1, 2}, 2));
}

// 4 blocks of 2 tokens. Unnamed free blocks go first; then the least
// recently freed named block, a sequence's last block before its first.
TEST(PrefixCache, SharedBlocksAreCountedOnceAndEvictedLeastRecentlyUsed) {
  KvBlocks kv(4, 2);
  const std::vector<uint64_t> h = {101, 102};
  ASSERT_TRUE(kv.grow(1, 4));  // blocks 0, 1
  EXPECT_TRUE(kv.name(1, 0, h[0]));
  EXPECT_TRUE(kv.name(1, 1, h[1]));
  ASSERT_TRUE(kv.grow(2, 2));      // block 2
  EXPECT_FALSE(kv.name(2, 0, h[0]));  // another block has the name
  ASSERT_TRUE(kv.grow_shared(3, h, 2, 5));  // 0 and 1 shared, block 3 its own
  EXPECT_EQ(kv.table(3), (std::vector<int32_t>{0, 1, 3}));
  EXPECT_EQ(kv.used_blocks(), 4);
  kv.release(1);
  kv.release(3);  // 3 unnamed: free first; then 1, then 0 (named, kept)
  EXPECT_EQ(kv.free_blocks(), 3);
  EXPECT_EQ(kv.cached_prefix(h), 2);
  ASSERT_TRUE(kv.grow(4, 2));
  EXPECT_EQ(kv.table(4), (std::vector<int32_t>{3}));
  EXPECT_TRUE(kv.take_evicted().empty());
  ASSERT_TRUE(kv.grow(5, 2));
  EXPECT_EQ(kv.table(5), (std::vector<int32_t>{1}));  // the prefix's last block goes first
  EXPECT_EQ(kv.take_evicted(), (std::vector<int32_t>{1}));
  EXPECT_EQ(kv.cached_prefix(h), 1);
  // Block 0 is free but cached: sharing it takes it off the free list, so
  // one more block is needed than the 1 left.
  EXPECT_FALSE(kv.grow_shared(6, h, 1, 3));
  EXPECT_TRUE(kv.table(6).empty());
  EXPECT_EQ(kv.free_blocks(), 1);
  ASSERT_TRUE(kv.grow_shared(6, h, 1, 2));
  ASSERT_TRUE(kv.grow_shared(7, h, 1, 2));  // two holders of block 0
  EXPECT_EQ(kv.free_blocks(), 0);
  kv.release(6);
  EXPECT_EQ(kv.free_blocks(), 0);
  kv.release(7);
  EXPECT_EQ(kv.free_blocks(), 1);
  EXPECT_EQ(kv.cached_prefix(h), 1);
}

SchedulerOptions cached(bool on) {
  SchedulerOptions o;
  o.kv_blocks = 100;
  o.kv_block = 4;
  o.prefix_caching = on;
  return o;
}

// Both prompts are 10 tokens, the first 8 of prefix 0 (two blocks of 4).
// Step 1 prefills request 0 (1.10); its two full blocks are named. Request
// 1 arrives at 0.5 and in step 2 (beside 0's decode) prefills only its last
// 2 tokens on the 8 cached: 1 + 0.01 · 3 = 1.03, first token at 2.13
// (without caching 1 + 0.01 · 11: 2.21).
TEST(PrefixCache, AHitSkipsExactlyTheCachedTokensPrefill) {
  const std::vector<Request> reqs = {{0, 0, 10, 3, {}, 0, 8}, {1, 0.5, 10, 2, {}, 0, 8}};
  LinearStep on, off;
  const ReplicaResult r = simulate_replica(reqs, cached(true), on);
  const ReplicaResult n = simulate_replica(reqs, cached(false), off);
  EXPECT_DOUBLE_EQ(r.requests[1].first_token_s, 1.10 + 1.03);
  EXPECT_DOUBLE_EQ(n.requests[1].first_token_s, 1.10 + 1.11);
  EXPECT_DOUBLE_EQ(r.requests[1].finish_s, 1.10 + 1.03 + 1.02);
  ASSERT_EQ(on.batches[1].size(), 2u);
  const BatchEntry& e = on.batches[1][1];
  EXPECT_EQ(e.context, 8);
  EXPECT_EQ(e.new_tokens, 2);
  EXPECT_EQ(e.prefix_blocks, (std::vector<int32_t>{0, 1}));  // request 0's
  EXPECT_EQ(on.cached, (std::vector<int32_t>{0, 1}));  // request 1's blocks hold unshared tokens
  EXPECT_EQ(r.requests[1].cached_tokens, 8);
  EXPECT_EQ(r.prefix_query_tokens, 20);
  EXPECT_EQ(r.prefix_hit_tokens, 8);
  EXPECT_EQ(n.prefix_query_tokens, 0);
}

// Another prefix shares nothing; the same prompt twice still computes its
// last token: 8 tokens, a hit of (8 - 1) / 4 = 1 block, 4 tokens prefilled.
TEST(PrefixCache, OnlyTheSamePrefixHitsAndTheLastTokenIsComputed) {
  const std::vector<Request> other = {{0, 0, 10, 1, {}, 0, 8}, {1, 0.5, 10, 1, {}, 1, 8}};
  LinearStep a;
  EXPECT_EQ(simulate_replica(other, cached(true), a).prefix_hit_tokens, 0);
  const std::vector<Request> same = {{0, 0, 8, 1, {}, 0, 8}, {1, 0.5, 8, 1, {}, 0, 8}};
  LinearStep b;
  const ReplicaResult r = simulate_replica(same, cached(true), b);
  EXPECT_EQ(r.prefix_hit_tokens, 4);
  ASSERT_EQ(b.batches.size(), 2u);
  EXPECT_EQ(b.batches[1][0].new_tokens, 4);
  EXPECT_DOUBLE_EQ(r.requests[1].finish_s, 1.08 + 1.04);
}

TEST(PrefixCache, StaticBatchingIsRefused) {
  SchedulerOptions o = cached(true);
  o.batching = Batching::kStatic;
  LinearStep ex;
  EXPECT_NE(testing::config_error_of([&] { simulate_replica({{0, 0, 4, 1}}, o, ex); }).find("`prefix_caching`"),
            std::string::npos);
}

}  // namespace
}  // namespace shardlab::serve
