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
  // dp 8 x tp 3 (24 devices): the dp group {0, 3, ..., 21} holds devices
  // 0, 3, 6 of node 0, 1, 4, 7 of node 1 and 2, 5 of node 2: its members
  // see other numbers of NVLink peers and other rails (and the tp group
  // {6, 7, 8} straddles nodes 0 and 1).
  in.mesh = {.tp = 3, .dp = 8};
  plan = fold_plan(in, p);
  EXPECT_FALSE(plan.dp);
  EXPECT_FALSE(plan.tp);
  in.mesh = {.tp = 2, .dp = 8};  // dp 8 x tp 2: devices 0, 2, 4, 6 of each of two nodes
  plan = fold_plan(in, p);
  EXPECT_TRUE(plan.dp);
  EXPECT_TRUE(plan.tp);
  in.moe = true;  // MoE: tp peers are not folded
  EXPECT_FALSE(fold_plan(in, p).tp);
  // Context parallelism: the cp ranks fold with tp and dp (one node: the
  // ring's hops are all NVLink), except for MoE models and uneven ZeRO chunks
  // (the gradients' cp-dp group holds the chunks).
  in = {.mesh = {.tp = 2, .cp = 2, .dp = 2}};
  plan = fold_plan(in, p);
  EXPECT_TRUE(plan.dp && plan.tp && plan.cp);
  EXPECT_FALSE(plan.cp_by_place);
  EXPECT_EQ(plan.running(), 1);
  EXPECT_EQ(plan.describe(), "dp, cp and tp folded: 1 of 8 devices run, each folded device reports its "
                             "representative's figures");
  in.uneven_chunks = true;
  EXPECT_FALSE(fold_plan(in, p).cp);
  in.uneven_chunks = false;
  in.cp_gathers = true;  // --cp-comm allgather: the same kernels in another order
  EXPECT_FALSE(fold_plan(in, p).cp);
  in.cp_gathers = false;
  in.moe = true;
  EXPECT_FALSE(fold_plan(in, p).cp);
}

// A folded replica's own groups (those its representative does not share)
// must sit on the hardware as the representative's do: the replay never
// runs them. tp 3 x pp 2 x dp 2 on nodes of 8: every dp group is uniform
// ({0, 3} in node 0, {6, 9} over two nodes), but dp rank 0's second-stage
// tp group is {6, 7 | 8} and dp rank 1's {9, 10, 11}. So dp does not fold
// (tp's groups are asymmetric themselves). On 4-NIC nodes (a NIC for each
// pair of GPUs) tp 4 x dp 2 folds: {0..3} and {4..7} sit alike, two NICs
// each with two of their GPUs on each.
TEST(FoldPlan, ReplicasGroupsMustSitAlike) {
  HardwareProfile p = load_profile("a100-nvlink");
  p.nodes = 2;
  FoldPlan plan = fold_plan({.mesh = {.tp = 3, .dp = 2, .pp = 2}}, p);
  EXPECT_FALSE(plan.dp);
  EXPECT_FALSE(plan.tp);
  EXPECT_TRUE(plan.representative.empty());
  plan = fold_plan({.mesh = {.tp = 2, .dp = 2, .pp = 3}}, p);  // 12 devices: every group placed alike
  EXPECT_TRUE(plan.dp && plan.tp) << plan.describe();
  // pp 3 x dp 2 x tp 2 is alike; dp 3 x tp 2 x pp 2 (12 devices) puts dp
  // rank 1's second-stage tp group on {8, 9} (node 1) and dp rank 0's on
  // {6, 7} (node 0), their pipeline groups {2 | 8} and {0 | 6}: placed
  // differently, so dp does not fold, tp alone does.
  plan = fold_plan({.mesh = {.tp = 2, .dp = 3, .pp = 2}}, p);
  EXPECT_FALSE(plan.dp) << plan.describe();
  EXPECT_TRUE(plan.tp) << plan.describe();
  HardwareProfile four_nics = load_profile("a100-nvlink-4nic");
  four_nics.nodes = 1;
  EXPECT_TRUE(fold_plan({.mesh = {.tp = 4, .dp = 2}}, four_nics).dp);
}

// A cp group over two nodes with two members on each (tp 4 x cp 4 on nodes
// of 8: cp group {0, 4, 8, 12}) folds by place: cp rank i is played by cp
// rank i mod 2 (its ring sends over NVLink from cp ranks 0 and 2, over the
// NIC from 1 and 3). One member per node (tp 8 x cp 2) folds fully.
TEST(FoldPlan, CpOverNodesFoldsByPlace) {
  HardwareProfile p = load_profile("a100-nvlink");
  p.nodes = 2;
  const FoldPlan plan = fold_plan({.mesh = {.tp = 4, .cp = 4}}, p);
  EXPECT_TRUE(plan.cp && plan.cp_by_place && plan.tp);
  EXPECT_EQ(plan.running(), 2);
  for (int r = 0; r < 16; ++r) EXPECT_EQ(plan.representative[size_t(r)], r / 4 % 2 * 4) << r;
  const FoldPlan full = fold_plan({.mesh = {.tp = 8, .cp = 2}}, p);
  EXPECT_TRUE(full.cp && !full.cp_by_place);
  EXPECT_EQ(full.running(), 1);
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
  const FoldPlan plan = fold_plan({.mesh = {.tp = 2, .ep = 2, .dp = 4}, .moe = true, .routes_alike = true}, p);
  EXPECT_TRUE(plan.dp);
  EXPECT_FALSE(plan.tp);  // MoE: tp stays unfolded
  EXPECT_EQ(plan.running(), 2);
  for (int r = 0; r < 8; ++r) EXPECT_EQ(plan.representative[size_t(r)], r % 2) << r;
}

// Groups over several nodes with several members on each fold when every
// node holds the same local devices: issue 29's DeepSeek-V3 mesh (pp 16,
// ep 64, dp 128 on 2,048 GPUs, 8 per node) has dp groups of 16 nodes x 8,
// ep groups of 8 nodes x 8 and edp pairs on two nodes; one thread per
// stage runs. With 6 devices per node the groups lose that symmetry (the
// first dp group, 128 = 21 nodes x 6 + 2, ends on a node with 2 of it).
TEST(FoldPlan, GroupsOverSeveralFullNodesFold) {
  HardwareProfile p = load_profile("h100-nvlink");
  p.nodes = 256;
  const FoldInput in{.mesh = {.ep = 64, .dp = 128, .pp = 16}, .moe = true, .routes_alike = true};
  const FoldPlan plan = fold_plan(in, p);
  EXPECT_TRUE(plan.dp);
  EXPECT_EQ(plan.running(), 16);
  for (int r = 0; r < 2048; ++r) EXPECT_EQ(plan.representative[size_t(r)], r / 128 * 128) << r;
  // By place: rank r of stage s (r = 128 s + dp index) is played by the
  // device at its local place (r mod 8) on its dp group's first node
  // (128 s .. 128 s + 7): 8 threads per stage.
  const FoldPlan places = weaker(plan, in.mesh, p);
  EXPECT_TRUE(places.dp && places.by_place);
  EXPECT_EQ(places.running(), 128);
  for (int r = 0; r < 2048; ++r) EXPECT_EQ(places.representative[size_t(r)], r / 128 * 128 + r % 8) << r;
  EXPECT_TRUE(weaker(places, in.mesh, p).representative.empty());  // tp 1: nothing left to fold
  p.devices_per_node = 6;
  p.nodes = 342;
  EXPECT_FALSE(fold_plan(in, p).dp);
}

// After an asymmetric collective: dp and tp, then dp alone (a
// representative per tp rank: tp peers at other places in a collective over
// tp-dp end apart where dp's members do not), then tp alone, then nothing.
TEST(FoldPlan, WeakerDropsTpThenDpThenEverything) {
  HardwareProfile p = load_profile("a100-nvlink");
  const collectives::MeshShape mesh{.tp = 2, .dp = 4};
  const FoldPlan both = fold_plan({.mesh = mesh}, p);
  ASSERT_TRUE(both.dp && both.tp);
  EXPECT_EQ(both.running(), 1);
  const FoldPlan dp_only = weaker(both, mesh, p);
  EXPECT_TRUE(dp_only.dp && !dp_only.tp && dp_only.tp_held);
  EXPECT_EQ(dp_only.running(), 2);  // one per tp rank
  for (int r = 0; r < 8; ++r) EXPECT_EQ(dp_only.representative[size_t(r)], r % 2) << r;
  EXPECT_EQ(dp_only.describe(), "dp folded: 2 of 8 devices run, each folded device reports its representative's figures");
  const FoldPlan tp_only = weaker(dp_only, mesh, p);
  EXPECT_FALSE(tp_only.dp);
  EXPECT_TRUE(tp_only.tp && !tp_only.tp_held);
  EXPECT_EQ(tp_only.running(), 4);  // one per dp rank
  EXPECT_TRUE(weaker(tp_only, mesh, p).representative.empty());
  EXPECT_EQ(weaker(tp_only, mesh, p).describe(), "nothing folded");
}

// Megatron-core's pipelined weak-scaling rows in small: tp 8 fills a node,
// dp 4 puts one member on each of four nodes, pp 2. The full fold runs a
// thread per stage; dp by place is not needed (one member per node), so
// the next plan keeps dp and drops tp: a thread per local place and stage,
// each playing its twins on the stage's other nodes.
TEST(FoldPlan, WeakerKeepsDpOverNodesWithoutTp) {
  HardwareProfile p = load_profile("h100-nvlink");
  p.nodes = 8;
  const collectives::MeshShape mesh{.tp = 8, .dp = 4, .pp = 2};
  const FoldPlan both = fold_plan({.mesh = mesh}, p);
  ASSERT_TRUE(both.dp && both.tp && !both.spans_nodes);
  EXPECT_EQ(both.running(), 2);
  const FoldPlan places = weaker(both, mesh, p);
  EXPECT_TRUE(places.dp && !places.tp);
  EXPECT_EQ(places.running(), 16);
  for (int r = 0; r < 64; ++r) EXPECT_EQ(places.representative[size_t(r)], r / 32 * 32 + r % 8) << r;
}

// With cp folded (FoldingError from a ring or a collective): without tp
// first (tp peers' collectives may end apart where dp's and cp's do not),
// then without cp (tp folded again), then as without cp.
TEST(FoldPlan, WeakerDropsTpThenCp) {
  HardwareProfile p = load_profile("a100-nvlink");
  const collectives::MeshShape mesh{.tp = 2, .cp = 2, .dp = 2};
  const FoldPlan all = fold_plan({.mesh = mesh}, p);
  ASSERT_TRUE(all.dp && all.tp && all.cp);
  const FoldPlan no_tp = weaker(all, mesh, p);
  EXPECT_TRUE(no_tp.dp && no_tp.cp && !no_tp.tp);
  EXPECT_EQ(no_tp.running(), 2);  // one per tp rank
  const FoldPlan no_cp = weaker(no_tp, mesh, p);
  EXPECT_TRUE(no_cp.dp && no_cp.tp && !no_cp.cp);
  EXPECT_EQ(no_cp.running(), 2);  // one per cp rank
  const FoldPlan dp_alone = weaker(no_cp, mesh, p);  // as without cp: tp, then dp
  EXPECT_TRUE(dp_alone.dp && !dp_alone.tp && !dp_alone.cp);
  EXPECT_EQ(dp_alone.running(), 4);  // one per tp and cp rank
  const FoldPlan tp_only = weaker(dp_alone, mesh, p);
  EXPECT_TRUE(tp_only.tp && !tp_only.dp && !tp_only.cp);
  EXPECT_EQ(tp_only.running(), 4);
  EXPECT_TRUE(weaker(tp_only, mesh, p).representative.empty());
  // Without tp to drop, cp goes first.
  const collectives::MeshShape cp_dp{.cp = 2, .dp = 2};
  const FoldPlan dp_only = weaker(fold_plan({.mesh = cp_dp}, p), cp_dp, p);
  EXPECT_TRUE(dp_only.dp && !dp_only.cp && !dp_only.tp);
  EXPECT_EQ(dp_only.running(), 2);
}

}  // namespace
}  // namespace shardlab::engine
