#include "model/serve/kv_blocks.h"

#include <algorithm>
#include <deque>
#include <map>
#include <random>

#include <gtest/gtest.h>

namespace shardlab::serve {
namespace {

TEST(KvBlocks, ASequenceGrowsABlockAtEachBoundary) {
  KvBlocks kv(10, 16);
  EXPECT_TRUE(kv.grow(7, 1));
  EXPECT_EQ(kv.table(7).size(), 1u);
  EXPECT_TRUE(kv.grow(7, 16));
  EXPECT_EQ(kv.table(7).size(), 1u);  // 16 tokens still fit one block
  EXPECT_TRUE(kv.grow(7, 17));
  EXPECT_EQ(kv.table(7).size(), 2u);
  EXPECT_EQ(kv.used_blocks(), 2);
  EXPECT_EQ(kv.missing(7, 64), 2);   // 4 blocks in all
  EXPECT_EQ(kv.missing(8, 64), 4);
}

TEST(KvBlocks, AFullCacheRefusesWithoutChangingAnything) {
  KvBlocks kv(3, 4);
  ASSERT_TRUE(kv.grow(1, 8));
  EXPECT_FALSE(kv.can_hold(2, 5));
  EXPECT_FALSE(kv.grow(2, 5));
  EXPECT_TRUE(kv.table(2).empty());
  EXPECT_EQ(kv.free_blocks(), 1);
  EXPECT_TRUE(kv.grow(2, 4));
  EXPECT_EQ(kv.free_blocks(), 0);
}

TEST(KvBlocks, ReleasedBlocksAreReusedAndTablesNeverShareABlock) {
  KvBlocks kv(4, 2);
  ASSERT_TRUE(kv.grow(1, 4));  // blocks 0, 1
  ASSERT_TRUE(kv.grow(2, 4));  // blocks 2, 3
  EXPECT_EQ(kv.table(1), (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(kv.table(2), (std::vector<int32_t>{2, 3}));
  kv.release(1);
  EXPECT_EQ(kv.free_blocks(), 2);
  EXPECT_TRUE(kv.table(1).empty());
  ASSERT_TRUE(kv.grow(3, 3));
  EXPECT_EQ(kv.table(3), (std::vector<int32_t>{0, 1}));
  kv.release(99);  // holds nothing: a no-op
  EXPECT_EQ(kv.used_blocks(), 4);
}

// The free list as the class comment states it, every block listed from
// the start: unnamed blocks (freed ones on top), then named ones oldest
// first; taking a named block evicts its name.
struct ReferenceBlocks {
  std::deque<int32_t> free;
  std::map<int32_t, int> refs;
  std::map<int32_t, uint64_t> name_of;
  std::map<uint64_t, int32_t> named;
  std::map<int, std::vector<int32_t>> tables;
  explicit ReferenceBlocks(int32_t n) {
    for (int32_t b = 0; b < n; ++b) free.push_back(b);
  }
  int32_t take() {
    const int32_t b = free.front();
    free.pop_front();
    if (const auto it = name_of.find(b); it != name_of.end()) {
      named.erase(it->second);
      name_of.erase(it);
    }
    refs[b] = 1;
    return b;
  }
  bool grow(int seq, int64_t need) {
    std::vector<int32_t>& t = tables[seq];
    if (need - int64_t(t.size()) > int64_t(free.size())) return false;
    while (int64_t(t.size()) < need) t.push_back(take());
    return true;
  }
  void release(int seq) {
    const auto it = tables.find(seq);
    if (it == tables.end()) return;
    for (auto b = it->second.rbegin(); b != it->second.rend(); ++b) {
      if (--refs[*b] > 0) continue;
      if (name_of.contains(*b)) {
        free.push_back(*b);
      } else {
        free.push_front(*b);
      }
    }
    tables.erase(it);
  }
};

TEST(KvBlocks, TakesTheBlocksTheFullFreeListGivesUnderRandomUse) {
  // Random grows, releases and names over a 40-block cache against the
  // reference: every table equal after every operation, so the blocks never
  // linked until used change no block id.
  std::mt19937 rng(5);
  KvBlocks kv(40, 2);
  ReferenceBlocks ref(40);
  int checked = 0;
  for (int op = 0; op < 4000; ++op) {
    const int seq = int(rng() % 8);
    const int what = int(rng() % 3);
    if (what == 0) {
      const int64_t tokens = int64_t(rng() % 24) + 1;
      const int64_t need = kv.blocks_for(tokens);
      ASSERT_EQ(kv.grow(seq, tokens), ref.grow(seq, std::max<int64_t>(need, int64_t(ref.tables[seq].size()))));
    } else if (what == 1) {
      kv.release(seq);
      ref.release(seq);
    } else if (!kv.table(seq).empty()) {
      const int64_t index = int64_t(rng() % kv.table(seq).size());
      const uint64_t hash = rng() % 50;
      const int32_t b = kv.table(seq)[size_t(index)];
      const bool fresh = !ref.name_of.contains(b) && !ref.named.contains(hash);
      ASSERT_EQ(kv.name(seq, index, hash), fresh);
      if (fresh) {
        ref.name_of[b] = hash;
        ref.named[hash] = b;
      }
    }
    for (int s = 0; s < 8; ++s) {
      const auto it = ref.tables.find(s);
      ASSERT_EQ(kv.table(s), it == ref.tables.end() ? std::vector<int32_t>{} : it->second) << "op " << op;
      ++checked;
    }
    ASSERT_EQ(kv.free_blocks(), int64_t(ref.free.size()));
  }
  std::printf("[kv_blocks] %d tables compared after 4000 random operations\n", checked);
}

TEST(KvBlocks, AHugeCacheCostsNothingUntilUsed) {
  // 2^31 - 1 blocks (a small model on a large device can have millions):
  // linking them all up front would take minutes and 60 GB of host memory.
  KvBlocks kv((int64_t(1) << 31) - 1, 16);
  EXPECT_EQ(kv.free_blocks(), (int64_t(1) << 31) - 1);
  ASSERT_TRUE(kv.grow(1, 48));
  EXPECT_EQ(kv.table(1), (std::vector<int32_t>{0, 1, 2}));
  kv.release(1);
  ASSERT_TRUE(kv.grow(2, 64));
  EXPECT_EQ(kv.table(2), (std::vector<int32_t>{0, 1, 2, 3}));  // freed ones first, then the lowest unused
}

}  // namespace
}  // namespace shardlab::serve
