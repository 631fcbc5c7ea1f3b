// Fold planning over a mesh shape (model/engine/fold.h): which ranks one
// thread may play, from the mesh, the run's two asymmetries and the links.
#include "model/engine/fold.h"

#include <gtest/gtest.h>

#include "runtime/profile.h"

namespace shardlab::engine {
namespace {

TEST(FoldPlan, FoldsOnlyWhatIsProvablySymmetric) {
  HardwareProfile p = load_profile("a100-nvlink");  // 8 devices per node
  p.nodes = 8;
  FoldInput in{.mesh = {.tp = 4, .dp = 2}};
  FoldPlan plan = fold_plan(in, p);
  EXPECT_TRUE(plan.dp && plan.tp);
  EXPECT_EQ(plan.running(), 1);
  in.uneven_chunks = true;  // ZeRO over a bucket dp does not divide: owned chunks differ in size
  EXPECT_FALSE(fold_plan(in, p).dp);
  in.uneven_chunks = false;
  in.mesh = {.tp = 2, .dp = 8};  // dp 8 x tp 2: dp groups span two nodes, four members each
  plan = fold_plan(in, p);
  EXPECT_FALSE(plan.dp);
  EXPECT_TRUE(plan.tp);
  in.moe = true;  // MoE: tp peers are not folded
  EXPECT_FALSE(fold_plan(in, p).tp);
  in = {.mesh = {.tp = 2, .cp = 2, .dp = 2}};  // context parallelism: nothing folds
  EXPECT_TRUE(fold_plan(in, p).representative.empty());
}

// Expert parallelism keeps the dp replicas apart (serving's replica: dp = ep).
TEST(FoldPlan, ExpertParallelismKeepsDpUnfolded) {
  const HardwareProfile p = load_profile("a100-nvlink");
  const FoldPlan plan = fold_plan({.mesh = {.tp = 2, .ep = 2, .dp = 2}}, p);
  EXPECT_FALSE(plan.dp);
  EXPECT_TRUE(plan.tp);
  EXPECT_EQ(plan.running(), 2);
}

// Uniform phantom routing: the ep ranks run alike and fold with dp (every
// dp rank, whatever its ep index, played by rank dp 0).
TEST(FoldPlan, UniformExpertsFoldWithDp) {
  const HardwareProfile p = load_profile("a100-nvlink");
  const FoldPlan plan = fold_plan({.mesh = {.tp = 2, .ep = 2, .dp = 4}, .moe = true, .uniform_experts = true}, p);
  EXPECT_TRUE(plan.dp);
  EXPECT_FALSE(plan.tp);  // MoE: tp stays unfolded
  EXPECT_EQ(plan.running(), 2);
  for (int r = 0; r < 8; ++r) EXPECT_EQ(plan.representative[size_t(r)], r % 2) << r;
}

// After an asymmetric collective: dp and tp, then tp alone, then nothing.
TEST(FoldPlan, WeakerDropsDpThenEverything) {
  HardwareProfile p = load_profile("a100-nvlink");
  const collectives::MeshShape mesh{.tp = 2, .dp = 2};
  const FoldPlan both = fold_plan({.mesh = mesh}, p);
  ASSERT_TRUE(both.dp && both.tp);
  const FoldPlan tp_only = weaker(both, mesh);
  EXPECT_FALSE(tp_only.dp);
  EXPECT_TRUE(tp_only.tp);
  EXPECT_EQ(tp_only.running(), 2);
  EXPECT_TRUE(weaker(tp_only, mesh).representative.empty());
  EXPECT_EQ(weaker(tp_only, mesh).describe(), "nothing folded");
}

}  // namespace
}  // namespace shardlab::engine
