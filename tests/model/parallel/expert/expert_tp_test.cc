// Expert tensor parallelism 1 (--expert-tp 1, ParallelOptions::expert_tp):
// every expert whole on its rank, the EP group drawn from tp x dp (tp
// fastest), each TP rank routing its own sequence-parallel rows. Real math
// against the unsharded model (both families, shared experts, capacity in
// the global token order, a pipeline, the distributed optimizer, DeepEP's
// dispatcher across nodes of 2), which experts each device holds, the bytes
// the exchanges move counted by hand, a folded phantom run equal to the
// unfolded one, and the layouts it refuses.
#include <cstdio>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "moe_test_util.h"

#include "model/config.h"
#include "model/parallel/layout.h"
#include "model/train/parallel_plan.h"
#include "model/train/trainer.h"
#include "model/train/verify.h"
#include "runtime/errors.h"
#include "runtime/profile.h"

namespace shardlab::train {
namespace {

using parallel::MoeDispatcher;

TrainResult run(const TrainOptions& o, int per_node) { return testing::run_moe(o, per_node); }

// ep_verify_test's tiny MoE on tp x dp with SP and whole experts.
TrainOptions whole(int tp, int dp, int ep) {
  TrainOptions o = testing::tiny_moe_options(dp, ep);
  o.parallel.tp = tp;
  o.parallel.sp = tp > 1;
  o.parallel.expert_tp = 1;
  return o;
}

// verify's comparison of `a` against `b`, printed; returns it.
VerifyResult compare(const TrainResult& a, const TrainResult& b, const TrainOptions& o, const std::string& what) {
  const VerifyResult r = compare_runs(a, b, model::ParamTable(o.model), {.grads = true});
  std::printf("%s (tp %d dp %d ep %d pp %d): loss rel diff %.2e, param rel L2 %.2e, grad rel L2 %.2e (bound 1e-5)\n",
              what.c_str(), o.parallel.tp, o.parallel.dp, o.parallel.ep, o.parallel.pp, r.max_loss_rel_diff,
              r.param_rel_l2, r.grad_rel_l2);
  return r;
}

TrainOptions unsharded(const TrainOptions& o) {
  TrainOptions ref = o;
  ref.parallel = {};
  return ref;
}

// Whole experts compute what the unsharded model does, within ep_verify_test's
// 1e-5 (losses, parameters and the step-0 gradients): the TP ranks route
// different rows, so the router's gradient sums over TP, the aux loss is
// their mean and a capacity drops in the global order over tp x dp.
TEST(ExpertTp, WholeExpertsMatchTheUnshardedModel) {
  struct Case {
    const char* name;
    TrainOptions o;
  };
  std::vector<Case> cases;
  cases.push_back({"gpt, ep over tp and dp", whole(2, 2, 4)});
  {
    TrainOptions o = whole(2, 2, 2);  // ep = tp: one replica's TP ranks exchange
    o.model.family = model::Family::kLlama;
    o.model.n_kv_head = 2;
    o.model.n_shared_expert = 1;
    cases.push_back({"llama with a shared expert, ep = tp", o});
  }
  {
    TrainOptions o = whole(2, 4, 4);  // a capacity: drops follow the global token order over tp x dp
    o.model.capacity_factor = 1.0;
    cases.push_back({"capacity 1.0", o});
  }
  {
    TrainOptions o = whole(2, 2, 4);
    o.parallel.pp = 2;
    o.micro_batches = 2;
    o.parallel.zero = 1;
    o.parallel.distributed_optimizer = true;
    cases.push_back({"pipeline and distributed optimizer", o});
  }
  for (const Case& c : cases) {
    const TrainResult a = run(c.o, 8);
    const VerifyResult r = compare(a, run(unsharded(c.o), 8), c.o, c.name);
    EXPECT_TRUE(r.passed) << c.name;
    EXPECT_LE(r.grad_rel_l2, 1e-5) << c.name;
  }
}

// DeepEP's dispatcher over an EP group of tp x dp ranks on nodes of 2 (each
// node one replica's TP pair): against the unsharded model and the all-to-all.
TEST(ExpertTp, DeepEpAcrossNodesMatchesTheAllToAll) {
  TrainOptions o = whole(2, 4, 8);
  o.parallel.moe_dispatcher = MoeDispatcher::kDeepEp;
  const TrainResult deepep = run(o, 2);
  EXPECT_TRUE(compare(deepep, run(unsharded(o), 2), o, "deepep vs unsharded").passed);
  TrainOptions all = o;
  all.parallel.moe_dispatcher = MoeDispatcher::kAllToAll;
  const VerifyResult v = compare(deepep, run(all, 2), o, "deepep vs alltoall");
  EXPECT_LE(v.param_rel_l2, 1e-5);
  EXPECT_LE(v.max_loss_rel_diff, 1e-5);
  uint64_t internode = 0;
  for (const auto& device : deepep.moe)
    for (const auto& layer : device) internode += layer.a2a_internode_sent_bytes;
  EXPECT_GT(internode, 0u);  // the group spans 4 nodes
}

// Megatron's expert rank order: the EP group is tp x ep/tp consecutive ranks
// (the mesh's "tp-ep"), so device (tp t, ep coordinate e) holds the El
// experts of expert rank t + tp·e, whole; each device reports its own.
TEST(ExpertTp, EachDeviceHoldsWholeExpertsOfItsPlaceInTpTimesDp) {
  TrainOptions o = whole(2, 4, 4);  // mesh ep 2: ranks tp + 2·(ep + 2·edp)
  o.steps = 1;
  validate_parallel(o);
  EXPECT_EQ(o.parallel.mesh_ep(), 2);
  EXPECT_STREQ(o.parallel.ep_dims(), "tp-ep");
  const collectives::DeviceMesh mesh(o.parallel.mesh_shape());
  const std::vector<int> expected_rank{0, 1, 2, 3, 0, 1, 2, 3};
  for (int r = 0; r < mesh.size(); ++r) {
    EXPECT_EQ(expert_rank(o.parallel, mesh.coords(r)), expected_rank[size_t(r)]) << r;
    EXPECT_EQ(mesh.group_ranks(r, "tp-ep"), (std::vector<int>{r / 4 * 4, r / 4 * 4 + 1, r / 4 * 4 + 2, r / 4 * 4 + 3}));
  }
  const TrainResult t = run(o, 8);
  for (size_t dev = 0; dev < t.moe.size(); ++dev)
    for (const auto& layer : t.moe[dev]) EXPECT_EQ(layer.expert_begin, 2 * expected_rank[dev]) << dev;
  // The layout: whole experts, not replicated over tp (each TP rank holds its own).
  parallel::LayoutFilter f;
  f.experts_whole = true;
  f.expert_begin = 2;
  f.expert_end = 4;
  const parallel::ShardLayout layout(o.model, 2, 1, f);
  int experts = 0;
  for (const parallel::ShardSpec& s : layout.shards()) {
    if (!s.expert) continue;
    ++experts;
    EXPECT_EQ(s.local_shape, s.global_shape) << s.name;
    EXPECT_FALSE(s.tp_replicated) << s.name;
    EXPECT_NE(s.name.find(".experts.2.") == std::string::npos, s.name.find(".experts.3.") == std::string::npos)
        << s.name;
  }
  EXPECT_EQ(experts, 4 * 2 * 4);  // 4 blocks x 2 experts x (c_fc, c_proj) x (weight, bias)
}

// The bytes a forward sends, by hand. Phantom uniform routing sends token n
// to experts n mod 8 and (n + 4) mod 8 (expert/moe.cc): with ep 4 each rank
// holds 2 of the 8, so 3/4 of a rank's rows leave it, each way. Whole
// experts route a rank's Nr = N/tp rows; split experts (the default) route
// all N gathered rows on every TP rank: tp times the bytes.
TEST(ExpertTp, EachRankSendsItsOwnRowsCountedByHand) {
  for (int expert_tp : {1, 2}) {
    TrainOptions o = whole(2, 4, 4);
    o.parallel.expert_tp = expert_tp;
    if (expert_tp == 2) o.parallel.ep = 4;  // over dp (4) at each tp rank
    o.phantom = true;
    o.steps = 1;
    o.keep_step0_grads = false;
    o.model.aux_coef = 0;
    o.fold = false;
    const TrainResult r = run(o, 8);
    const int64_t N = 2 * 32, C = 64, K = 2;  // 8 sequences over dp 4
    const int64_t rows = expert_tp == 1 ? N / 2 : N;
    const int64_t elements = 2 * rows * K * 3 / 4 * C;  // dispatch and combine
    const uint64_t elem = element_size(ClusterOptions{}.precision);
    for (size_t dev = 0; dev < r.moe.size(); ++dev) {
      ASSERT_EQ(r.moe[dev].size(), 4u);
      for (const auto& layer : r.moe[dev])
        EXPECT_EQ(layer.a2a_sent_bytes, 2 * uint64_t(elements) * elem)  // backward moves the same
            << "expert_tp " << expert_tp << " device " << dev << " layer " << layer.layer;
    }
    std::printf("expert_tp %d: %llu bytes a layer and step (forward and backward); step %lld ps\n", expert_tp,
                (unsigned long long)r.moe[0][0].a2a_sent_bytes, (long long)r.steps.back().virtual_end);
  }
}

// Folded phantom runs are exact: tp 2 x dp 8 x ep 4 (the replicas fold),
// the same step time and bytes as every device running.
TEST(ExpertTp, FoldedPhantomRunEqualsTheUnfoldedOne) {
  TrainOptions o = whole(2, 8, 4);
  o.model.batch_size = 16;
  o.model.n_shared_expert = 1;
  o.phantom = true;
  o.steps = 2;
  o.keep_step0_grads = false;
  o.model.aux_coef = 0;
  const TrainResult folded = run(o, 8);
  o.fold = false;
  const TrainResult unfolded = run(o, 8);
  std::printf("folded: %d of %d devices ran (%s); step %lld ps\n", folded.running_devices, o.parallel.world(),
              folded.folded.c_str(), (long long)folded.steps.back().virtual_end);
  EXPECT_LT(folded.running_devices, unfolded.running_devices);
  ASSERT_EQ(folded.steps.size(), unfolded.steps.size());
  for (size_t s = 0; s < folded.steps.size(); ++s) EXPECT_EQ(folded.steps[s].virtual_end, unfolded.steps[s].virtual_end);
  ASSERT_EQ(folded.moe.size(), unfolded.moe.size());
  for (size_t dev = 0; dev < folded.moe.size(); ++dev)
    for (size_t l = 0; l < folded.moe[dev].size(); ++l) {
      EXPECT_EQ(folded.moe[dev][l].a2a_sent_bytes, unfolded.moe[dev][l].a2a_sent_bytes) << dev << " " << l;
      EXPECT_EQ(folded.moe[dev][l].expert_begin, unfolded.moe[dev][l].expert_begin) << dev << " " << l;
    }
}

// What whole experts cannot run is one ConfigError before any thread starts.
TEST(ExpertTp, RefusesLayoutsItCannotRun) {
  const auto refused = [](const TrainOptions& o, const char* why) {
    try {
      validate_parallel(o);
      ADD_FAILURE() << why << ": accepted";
    } catch (const ConfigError& e) {
      std::printf("%s: %s\n", why, e.what());
    }
  };
  TrainOptions o = whole(2, 2, 4);
  o.parallel.expert_tp = 3;
  refused(o, "expert_tp neither 1 nor tp");
  o = whole(2, 2, 4);
  o.parallel.sp = false;
  refused(o, "without sp");
  o = whole(4, 2, 2);
  refused(o, "ep below tp");
  o = whole(2, 2, 6);
  o.model.n_expert = 12;
  refused(o, "ep not dividing tp x dp");
  o = whole(2, 2, 4);
  o.model.n_expert = 0;
  o.parallel.ep = 1;
  refused(o, "a dense model");
  o = whole(2, 2, 4);
  o.parallel.cp = 2;
  refused(o, "cp > 1");
  TrainOptions fine = whole(2, 2, 4);
  EXPECT_NO_THROW(validate_parallel(fine));
  fine.parallel.expert_tp = 2;  // = tp: the default layout
  fine.parallel.ep = 2;
  EXPECT_NO_THROW(validate_parallel(fine));
  EXPECT_FALSE(fine.parallel.experts_whole());
}

}  // namespace
}  // namespace shardlab::train
