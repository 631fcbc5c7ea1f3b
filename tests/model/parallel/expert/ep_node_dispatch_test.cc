// DeepEP's dispatcher (model/parallel/expert/ep_node_dispatch.h, --moe-dispatcher
// deepep): the node layout it needs, real math against the unsharded model
// and against Megatron's all-to-all dispatcher on nodes of 2 devices (so a
// small EP group spans nodes), bit-identical to the all-to-all on one node,
// the bytes it moves counted by hand, and folded phantom runs equal to
// unfolded ones.
#include <cmath>
#include <cstdio>
#include <vector>

#include <gtest/gtest.h>

#include "moe_test_util.h"

#include "model/config.h"
#include "model/parallel/expert/ep_node_dispatch.h"
#include "model/train/trainer.h"
#include "model/train/verify.h"
#include "runtime/errors.h"
#include "runtime/profile.h"

namespace shardlab::train {
namespace {

using parallel::MoeDispatcher;

TrainResult run(const TrainOptions& o, int per_node) { return testing::run_moe(o, per_node); }

// ep_verify_test's tiny MoE with `dispatcher`.
TrainOptions moe_options(int dp, int ep, MoeDispatcher dispatcher) {
  TrainOptions o = testing::tiny_moe_options(dp, ep);
  o.parallel.moe_dispatcher = dispatcher;
  return o;
}

TEST(EpNodes, SplitsAGroupIntoEqualRunsOfNodes) {
  const parallel::EpNodes two = parallel::ep_nodes({0, 1, 2, 3}, 2);
  EXPECT_TRUE(two.error.empty());
  EXPECT_EQ(two.nodes, 2);
  EXPECT_EQ(two.per_node, 2);
  const parallel::EpNodes rail = parallel::ep_nodes({0, 2, 4, 6}, 2);  // tp 2: one a node
  EXPECT_EQ(rail.nodes, 4);
  EXPECT_EQ(rail.per_node, 1);
  EXPECT_EQ(parallel::ep_nodes({0, 1, 2, 3}, 8).nodes, 1);
  EXPECT_FALSE(parallel::ep_nodes({0, 1, 2, 3, 4, 5}, 4).error.empty());  // 4 then 2
  EXPECT_FALSE(parallel::ep_nodes({0, 4, 1, 5}, 4).error.empty());        // node 0 twice
  EXPECT_FALSE(parallel::ep_nodes({0, 1, 2, 3}, 3).error.empty());        // 3 on node 0, then 1
  EXPECT_EQ(parallel::ep_nodes({0, 1, 3, 4}, 3).nodes, 2);                 // 2 and 2
  EXPECT_EQ(parallel::ep_node_members({0, 1, 2, 3}, 2, 3), (std::vector<int>{2, 3}));
  EXPECT_EQ(parallel::ep_rail_members({0, 1, 2, 3}, 2, 3), (std::vector<int>{1, 3}));
  EXPECT_EQ(parallel::ep_rail_members({0, 2, 4, 6}, 1, 4), (std::vector<int>{0, 2, 4, 6}));
}

// verify's comparison of `a` against `b`, printed; returns it.
VerifyResult compare(const TrainResult& a, const TrainResult& b, const TrainOptions& o, const char* what) {
  const VerifyResult r = compare_runs(a, b, model::ParamTable(o.model), {.grads = true});
  std::printf("%s (tp %d dp %d ep %d): loss rel diff %.2e, param rel L2 %.2e, grad rel L2 %.2e\n", what,
              o.parallel.tp, o.parallel.dp, o.parallel.ep, r.max_loss_rel_diff, r.param_rel_l2, r.grad_rel_l2);
  return r;
}

// Across nodes the per-node sums change the order of the gate-weighted sum:
// within 1e-5 of the unsharded model (ep_verify_test's bound) and of the
// all-to-all dispatcher. Two layouts on nodes of 2: dp 4 x ep 4 (2 nodes
// of 2 EP ranks: rail and node exchanges both move rows) and tp 2 x dp 4 x
// ep 4 with SP (one EP rank a node: the experts split over TP, the rail
// exchange alone).
TEST(DeepEp, AcrossNodesMatchesTheUnshardedModelAndTheAllToAll) {
  for (int tp : {1, 2}) {
    TrainOptions o = moe_options(4, 4, MoeDispatcher::kDeepEp);
    o.parallel.tp = tp;
    o.parallel.sp = tp > 1;
    const TrainResult deepep = run(o, 2);
    TrainOptions ref = o;
    ref.parallel = {};
    const VerifyResult u = compare(deepep, run(ref, 2), o, "deepep vs unsharded");
    EXPECT_TRUE(u.passed);
    EXPECT_LE(u.grad_rel_l2, 1e-5);
    TrainOptions all = o;
    all.parallel.moe_dispatcher = MoeDispatcher::kAllToAll;
    const VerifyResult v = compare(deepep, run(all, 2), o, "deepep vs alltoall");
    EXPECT_LE(v.param_rel_l2, 1e-5);
    EXPECT_LE(v.max_loss_rel_diff, 1e-5);
    // The relays moved rows: every device sent and received expert rows.
    for (const auto& device : deepep.moe)
      for (const auto& layer : device) EXPECT_GT(layer.a2a_sent_bytes, 0u);
  }
}

// On one node the rail is the device itself and each token's sum is the
// all-to-all's, term for term: bit-identical parameters and losses.
TEST(DeepEp, OnOneNodeIsBitIdenticalToTheAllToAll) {
  const TrainOptions o = moe_options(4, 4, MoeDispatcher::kDeepEp);
  TrainOptions all = o;
  all.parallel.moe_dispatcher = MoeDispatcher::kAllToAll;
  const TrainResult a = run(o, 8), b = run(all, 8);
  const VerifyResult r = compare(a, b, o, "deepep vs alltoall on one node");
  EXPECT_EQ(r.param_rel_l2, 0.0);
  EXPECT_EQ(r.max_loss_rel_diff, 0.0);
}

// The bytes one forward sends to other devices, by hand: phantom uniform
// routing sends token n to experts n mod 8 and (n + 4) mod 8 (expert/moe.cc),
// one on each node of 4 experts. So each token crosses once to the other
// node's relay (C + 2K floats), the relays hand half their 2N rows to the
// other rank of the node (C each), the owners return them (C each) and one
// row a token crosses back (C): N·(C + 2K + 3C) elements, N·(C + 2K + C)
// of them between nodes, where the all-to-all sends 3/4 of the 2N rows each
// way, 3·N·C, the N rows of the other node's experts between nodes, 2·N·C:
// no gain when every token reaches every node. Backward moves the same
// again (the report doubles the forward).
TEST(DeepEp, MovesEachTokenToANodeOnceCountedByHand) {
  for (MoeDispatcher d : {MoeDispatcher::kDeepEp, MoeDispatcher::kAllToAll}) {
    TrainOptions o = moe_options(4, 4, d);
    o.phantom = true;
    o.steps = 1;
    o.keep_step0_grads = false;
    o.model.aux_coef = 0;
    const TrainResult r = run(o, 2);
    const int64_t N = 2 * 32, C = 64, K = 2;  // 8 sequences over dp 4
    const int64_t elements = d == MoeDispatcher::kDeepEp ? N * (C + 2 * K + 3 * C) : 3 * N * C;
    const int64_t internode = d == MoeDispatcher::kDeepEp ? N * (C + 2 * K + C) : 2 * N * C;
    const uint64_t elem = element_size(ClusterOptions{}.precision);
    for (size_t dev = 0; dev < r.moe.size(); ++dev) {
      ASSERT_EQ(r.moe[dev].size(), 4u);
      for (const auto& layer : r.moe[dev]) {
        EXPECT_EQ(layer.a2a_sent_bytes, 2 * uint64_t(elements) * elem)
            << parallel::moe_dispatcher_name(d) << " device " << dev << " layer " << layer.layer;
        EXPECT_EQ(layer.a2a_internode_sent_bytes, 2 * uint64_t(internode) * elem)
            << parallel::moe_dispatcher_name(d) << " device " << dev << " layer " << layer.layer;
      }
    }
    std::printf("%s: %llu bytes a layer and step (forward and backward), %llu of them between nodes\n",
                parallel::moe_dispatcher_name(d), (unsigned long long)r.moe[0][0].a2a_sent_bytes,
                (unsigned long long)r.moe[0][0].a2a_internode_sent_bytes);
  }
}

// Folded phantom runs are exact: dp 8 x ep 4 on nodes of 2 (edp pairs and
// the EP group's rails fold), the same step time as every device running.
TEST(DeepEp, FoldedPhantomRunEqualsTheUnfoldedOne) {
  TrainOptions o = moe_options(8, 4, MoeDispatcher::kDeepEp);
  o.model.batch_size = 16;
  o.phantom = true;
  o.steps = 2;
  o.keep_step0_grads = false;
  o.model.aux_coef = 0;
  const TrainResult folded = run(o, 2);
  o.fold = false;
  const TrainResult unfolded = run(o, 2);
  std::printf("folded: %d of %d devices ran (%s); step %lld ps\n", folded.running_devices, o.parallel.world(),
              folded.folded.c_str(), (long long)folded.steps.back().virtual_end);
  EXPECT_LT(folded.running_devices, unfolded.running_devices);
  ASSERT_EQ(folded.steps.size(), unfolded.steps.size());
  for (size_t s = 0; s < folded.steps.size(); ++s) EXPECT_EQ(folded.steps[s].virtual_end, unfolded.steps[s].virtual_end);
  for (size_t dev = 0; dev < folded.moe.size(); ++dev)
    for (size_t l = 0; l < folded.moe[dev].size(); ++l)
      EXPECT_EQ(folded.moe[dev][l].a2a_sent_bytes, unfolded.moe[dev][l].a2a_sent_bytes) << dev << " " << l;
}

// A group that does not sit on its nodes in equal runs is refused before
// the run: dp 3 x ep 3 on nodes of 2 has 2 EP ranks on the first node and 1
// on the second. Without expert parallelism the dispatcher has nothing to do.
TEST(DeepEp, RefusesLayoutsItCannotRelay) {
  TrainOptions o = moe_options(3, 3, MoeDispatcher::kDeepEp);
  o.model.n_expert = 6;
  o.model.batch_size = 6;
  EXPECT_THROW(run(o, 2), ConfigError);
  TrainOptions none = moe_options(4, 1, MoeDispatcher::kDeepEp);
  EXPECT_THROW(validate_parallel(none), ConfigError);
}

}  // namespace
}  // namespace shardlab::train
