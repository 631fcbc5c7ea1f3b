// InferPlan: the split checked once, and the facts generate and serving
// read off it. Expected ranks are worked out by hand from the mesh order
// "tp-cp-ep-dp-pp" (tp varies fastest, pp slowest; dp = ep, so each ep rank
// is one replica of the batch).
#include "model/infer/infer_plan.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/errors.h"
#include "runtime/profile.h"
#include "tests/model/infer/infer_test_util.h"

namespace shardlab::infer {
namespace {

using testing::small_config;

TEST(InferPlan, WorldMeshAndSamplerOfADenseSplit) {
  const InferPlan p(small_config(false), 2, 2, 1);
  EXPECT_EQ(p.world, 4);
  EXPECT_EQ(p.mesh.size(), 4);
  // rank = tp + 2·pp: the last stage's tp rank 0 is rank 2.
  EXPECT_EQ(p.sampler, 2);
  EXPECT_EQ(p.mesh.coords(3).tp, 1);
  EXPECT_EQ(p.mesh.coords(3).pp, 1);
  const parallel::StagePlacement last = p.placement(1);
  EXPECT_EQ(last.pp, 2);
  EXPECT_EQ(last.rank, 1);
}

TEST(InferPlan, ExpertReplicasSitBetweenTpAndPp) {
  // tp 2, ep 2, pp 2: rank = tp + 2·ep + 4·pp; the sampler is tp 0, ep 0 of pp 1.
  const InferPlan p(small_config(true), 2, 2, 2);
  EXPECT_EQ(p.world, 8);
  EXPECT_EQ(p.sampler, 4);
  EXPECT_EQ(p.mesh.coords(6).ep, 1);
  EXPECT_EQ(p.mesh.coords(6).pp, 1);
  EXPECT_TRUE(p.moe);
}

TEST(InferPlan, BadSplitsAreConfigErrorsBeforeAnyMesh) {
  EXPECT_THROW(InferPlan(small_config(false), 3, 1, 1), ConfigError);  // 3 does not divide 4 heads
  EXPECT_THROW(InferPlan(small_config(false), 1, 1, 2), ConfigError);  // ep needs experts
  EXPECT_THROW(InferPlan(small_config(false), 1, 5, 1), ConfigError);  // 5 stages for 4 blocks
  EXPECT_THROW(InferPlan(small_config(false), 0, 1, 1), ConfigError);
}

TEST(InferPlan, TheClusterMustHaveWorldDevices) {
  const InferPlan p(small_config(false), 2, 1, 1);
  ClusterOptions o;
  o.world_size = 3;
  const Cluster cluster(builtin_profiles().front(), o);
  try {
    p.check_cluster(cluster, "generate");
    FAIL() << "a 3-device cluster passed for tp 2";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()), "generate needs 2 devices (tp 2 x pp 1 x ep 1), the cluster has 3");
  }
}

TEST(InferPlan, TpPeersOfADenseModelFoldOntoTpRankZero) {
  const HardwareProfile& profile = builtin_profiles().front();  // one node: uniform links
  EXPECT_EQ(InferPlan(small_config(false), 2, 2, 1).fold_representatives(profile),
            (std::vector<int>{0, 0, 2, 2}));
  // MoE: the router and experts differ between tp peers, nothing folds.
  EXPECT_TRUE(InferPlan(small_config(true), 2, 1, 1).fold_representatives(profile).empty());
}

}  // namespace
}  // namespace shardlab::infer
