// ParallelContext: one group object per member list, whatever the spec.
#include <gtest/gtest.h>

#include "collectives/collectives.h"
#include "collectives/mesh.h"
#include "model/parallel/parallel_context.h"
#include "runtime/cluster.h"
#include "runtime/profile.h"

namespace shardlab::parallel {
namespace {

using collectives::DeviceMesh;

TEST(ParallelContext, TheSameMembersGiveTheSameGroupObject) {
  const DeviceMesh mesh({.tp = 2, .ep = 1, .dp = 2, .pp = 2});
  ParallelContext ctx(mesh, 5);  // tp 1, dp 0, pp 1
  const collectives::ProcessGroup& tp = ctx.group("tp");
  EXPECT_EQ(&tp, &ctx.group("tp"));
  EXPECT_EQ(&tp, &ctx.group("tp-cp"));   // cp = 1: the same members
  EXPECT_EQ(&ctx.group("dp"), &ctx.group("edp"));  // ep = 1: dp and edp coincide
  EXPECT_EQ(&ctx.group("dp"), &ctx.group(mesh.group_ranks(5, "dp"), "another name"));
  EXPECT_NE(&tp, &ctx.group("dp"));
  EXPECT_EQ(tp.members(), (std::vector<int>{4, 5}));
  EXPECT_EQ(ctx.group("pp").members(), (std::vector<int>{1, 5}));
  EXPECT_EQ(ctx.size(), 3u);  // tp, dp, pp
  // Rank 5 is the last stage of pipeline {1, 5}: the embedding group is that pair.
  ASSERT_NE(ctx.embedding(1), nullptr);
  EXPECT_EQ(ctx.embedding(1), &ctx.group("pp"));  // pp = 2: first and last are the whole pipeline
}

TEST(ParallelContext, EmbeddingGroupIsTheFirstAndLastStage) {
  const DeviceMesh mesh({.tp = 1, .ep = 1, .dp = 1, .pp = 4});
  ParallelContext first(mesh, 0), middle(mesh, 1), last(mesh, 3);
  ASSERT_NE(first.embedding(3), nullptr);
  EXPECT_EQ(first.embedding(3)->members(), (std::vector<int>{0, 3}));
  EXPECT_EQ(middle.embedding(3), nullptr);
  EXPECT_EQ(last.embedding(3)->members(), (std::vector<int>{0, 3}));
  const DeviceMesh flat({.tp = 2});
  ParallelContext none(flat, 0);
  EXPECT_EQ(none.embedding(0), nullptr);
  // A V (ZB-V, DualPipeV): rank 0 holds the first and the last stage, one copy.
  EXPECT_EQ(first.embedding(0), nullptr);
  EXPECT_EQ(last.embedding(0), nullptr);
}

// Two specs with the same members share one collective sequence: collectives
// issued through either interleave without mixing their messages.
TEST(ParallelContext, AliasedSpecsShareOneCollectiveSequence) {
  const DeviceMesh mesh({.tp = 2, .ep = 1, .dp = 2});
  ClusterOptions o;
  o.world_size = 4;
  Cluster cluster(builtin_profiles().front(), o);
  std::vector<float> sums(4, 0);
  cluster.run([&](Device& dev) {
    ParallelContext ctx(mesh, dev.rank());
    float a = float(dev.rank() + 1), b = float(10 * (dev.rank() + 1));
    collectives::all_reduce(dev, ctx.group("dp"), collectives::Buffer(&a, 1));
    collectives::all_reduce(dev, ctx.group("edp"), collectives::Buffer(&b, 1));
    EXPECT_EQ(ctx.group("dp").sequence(), 2u);
    sums[size_t(dev.rank())] = a + b;
  });
  // dp groups {0,2} and {1,3}: a = 1+3 or 2+4, b = 10x that.
  EXPECT_EQ(sums, (std::vector<float>{44, 66, 44, 66}));
}

}  // namespace
}  // namespace shardlab::parallel
