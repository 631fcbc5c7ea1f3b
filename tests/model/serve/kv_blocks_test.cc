#include "model/serve/kv_blocks.h"

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

}  // namespace
}  // namespace shardlab::serve
