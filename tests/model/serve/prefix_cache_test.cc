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
  // Request 0's third block (its last 2 prompt tokens and the first 2 it
  // produced, at its last decode) is named too; request 1 fills no block of its own.
  EXPECT_EQ(on.cached, (std::vector<int32_t>{0, 1, 2}));
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

// A model that counts: each sampling entry's token is its last input + 1.
struct Counting final : StepExecutor {
  LinearStep time;
  StepOutcome run_step(std::span<const BatchEntry> batch) override {
    StepOutcome o = time.run_step(batch);
    for (const BatchEntry& e : batch)
      if (e.samples) o.tokens.push_back(e.tokens.back() + 1);
    return o;
  }
  void cache_block(int seq, int64_t first, int tokens, int32_t block) override {
    time.cache_block(seq, first, tokens, block);
  }
};

// The blocks of produced tokens are named too (as vLLM caches them): A's
// prompt 1..8 produces 9..17 and leaves 1..16 in 4 full blocks of 4; B, the
// next turn of that conversation (1..16, then 100, 101, 102) arriving at
// 100 after A ended, finds 4 blocks cached, 16 tokens, and prefills 3:
// 1 + 0.01 · 3 = 1.03 (the prompt's 2 blocks alone would leave 11: 1.11).
TEST(PrefixCache, TheProducedTokensBlocksAreCachedToo) {
  Request a{0, 0, 8, 9}, b{1, 100, 19, 1};
  for (model::Token t = 1; t <= 16; ++t) (t <= 8 ? a.prompt : b.prompt).push_back(t);
  b.prompt.insert(b.prompt.begin(), a.prompt.begin(), a.prompt.end());
  b.prompt.insert(b.prompt.end(), {100, 101, 102});
  ASSERT_EQ(b.prompt.size(), 19u);
  Counting ex;
  const ReplicaResult r = simulate_replica({a, b}, cached(true), ex);
  EXPECT_EQ(r.requests[0].tokens, (std::vector<model::Token>{9, 10, 11, 12, 13, 14, 15, 16, 17}));
  EXPECT_DOUBLE_EQ(r.requests[0].finish_s, 1.08 + 8 * 1.01);
  EXPECT_EQ(ex.time.cached, (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(r.requests[1].cached_tokens, 16);
  EXPECT_DOUBLE_EQ(r.requests[1].finish_s, 100 + 1.03);
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
