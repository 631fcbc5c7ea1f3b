// Expert parallelism through the trainer: sharded runs against the unsharded
// model for ep x dp x top-k x capacity, and the 4D tp x pp x dp x ep config.
#include <cstdio>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "moe_test_util.h"

#include "model/config.h"
#include "model/train/trainer.h"
#include "model/train/verify.h"
#include "runtime/profile.h"

namespace shardlab::train {
namespace {

TrainResult run(const TrainOptions& o) { return testing::run_moe(o); }

TrainOptions moe_options(int dp, int ep, int top_k, double capacity) {
  return testing::tiny_moe_options(dp, ep, top_k, capacity);
}

// Returns the sharded run (for its MoE report).
TrainResult expect_matches_unsharded(const TrainOptions& o) {
  TrainOptions ref = o;
  ref.parallel = {};
  const TrainResult a = run(o), b = run(ref);
  const VerifyResult r = compare_runs(a, b, model::ParamTable(o.model), {.grads = true});
  std::printf("tp %d pp %d dp %d ep %d top-k %d capacity %.2f M %d: loss rel diff %.2e, param rel L2 %.2e, "
              "grad rel L2 %.2e (tol 1e-5)\n",
              o.parallel.tp, o.parallel.pp, o.parallel.dp, o.parallel.ep, o.model.top_k, o.model.capacity_factor,
              o.micro_batches, r.max_loss_rel_diff, r.param_rel_l2, r.grad_rel_l2);
  EXPECT_TRUE(r.passed) << (r.first_mismatch ? r.first_mismatch->kind + " " + r.first_mismatch->name : "");
  EXPECT_LE(r.grad_rel_l2, 1e-5);
  return a;
}

using ExpertCase = std::tuple<int, int, int, double>;  // dp, ep, top-k, capacity factor

// dp {2, 4} x ep {2, 4} x top-k {1, 2} x capacity {off, 1.0}, only where ep
// divides dp (dp 2 x ep 4 is invalid): 3 (dp, ep) pairs x 4 = 12 cases.
std::vector<ExpertCase> valid_expert_cases() {
  std::vector<ExpertCase> cases;
  for (int dp : {2, 4})
    for (int ep : {2, 4})
      for (int top_k : {1, 2})
        for (double capacity : {0.0, 1.0})
          if (dp % ep == 0) cases.emplace_back(dp, ep, top_k, capacity);
  return cases;
}

TEST(ExpertVerifyGrid, ListsOnlyValidCases) {
  EXPECT_EQ(valid_expert_cases().size(), 12u);
  for (const auto& [dp, ep, top_k, capacity] : valid_expert_cases())
    EXPECT_NO_THROW(validate_parallel(moe_options(dp, ep, top_k, capacity))) << "dp " << dp << " ep " << ep;
}

class ExpertVerify : public ::testing::TestWithParam<ExpertCase> {};

TEST_P(ExpertVerify, MatchesTheUnshardedModel) {
  const auto [dp, ep, top_k, capacity] = GetParam();
  const TrainResult a = expect_matches_unsharded(moe_options(dp, ep, top_k, capacity));
  // Every device holds E/ep experts and reports the rows they processed.
  int64_t rows = 0, dropped = 0;
  for (const auto& device : a.moe) {
    ASSERT_FALSE(device.empty());
    EXPECT_EQ(device.front().received().size(), size_t(8 / ep));
    for (const auto& layer : device) {
      for (int64_t x : layer.received()) rows += x;
      dropped += layer.dropped;
    }
  }
  // Each token's top-k assignments are processed once, unless dropped.
  const int64_t assignments = int64_t(3) * 4 /*layers*/ * 8 * 32 * top_k;
  EXPECT_EQ(rows + dropped, assignments);
  if (capacity > 0) EXPECT_GT(dropped, 0) << "capacity 1.0 should drop some assignments";
  else EXPECT_EQ(dropped, 0);
}

std::string ep_name(const ::testing::TestParamInfo<ExpertVerify::ParamType>& info) {
  return "dp" + std::to_string(std::get<0>(info.param)) + "_ep" + std::to_string(std::get<1>(info.param)) + "_top" +
         std::to_string(std::get<2>(info.param)) + (std::get<3>(info.param) > 0 ? "_capacity" : "_nocap");
}

INSTANTIATE_TEST_SUITE_P(Grid, ExpertVerify, ::testing::ValuesIn(valid_expert_cases()), ep_name);

TEST(Expert4D, TpTimesPpTimesDpTimesEpMatchesTheUnshardedModel) {
  TrainOptions o = moe_options(2, 2, 2, 1.0);
  o.parallel.tp = 2;
  o.parallel.pp = 2;
  o.micro_batches = 4;
  o.parallel.sp = true;
  expect_matches_unsharded(o);
  o.parallel.sp = false;
  o.parallel.zero = 1;
  o.model.capacity_factor = 0;
  expect_matches_unsharded(o);
}

TEST(ExpertMemory, ExpertParametersPerDeviceAreOneOverEp) {
  TrainOptions o = moe_options(4, 1, 2, 0.0);
  o.steps = 1;
  o.keep_step0_grads = false;
  const auto dense_part = [&](const TrainResult& r) { return r.run.devices[0].peak_by_kind[int(MemKind::kParam)]; };
  const uint64_t replicated = dense_part(run(o));
  o.parallel.ep = 4;
  const uint64_t sharded = dense_part(run(o));
  // Expert bytes: 8 experts x 4 layers x (c_fc + c_proj with biases).
  const uint64_t C = 64, experts = 8ull * 4 * (2 * 4 * C * C + 4 * C + C) * 4;
  std::printf("params per device: dp 4 %llu B, dp 4 x ep 4 %llu B, experts %llu B\n",
              (unsigned long long)replicated, (unsigned long long)sharded, (unsigned long long)experts);
  EXPECT_EQ(replicated - sharded, experts - experts / 4);
}

TEST(ExpertReport, TokensPerExpertFollowTheRouterWhereverTheExpertsLive) {
  // The same training run with experts replicated (dp 4) and spread (dp 4 x ep 4):
  // the router makes the same decisions, so the global tokens per expert agree exactly.
  TrainOptions o = moe_options(4, 1, 2, 0.0);
  const TrainResult replicated = run(o);
  o.parallel.ep = 4;
  const TrainResult spread = run(o);
  ASSERT_EQ(replicated.moe_layers.size(), 4u);
  ASSERT_EQ(spread.moe_layers.size(), 4u);
  const int64_t assignments = int64_t(o.model.batch_size) * o.model.block_size * o.model.top_k;
  for (size_t l = 0; l < 4; ++l) {
    const auto& a = replicated.moe_layers[l];
    const auto& b = spread.moe_layers[l];
    EXPECT_EQ(a.tokens, b.tokens) << "layer " << l;
    ASSERT_EQ(b.tokens.size(), size_t(o.steps));
    for (size_t step = 0; step < b.tokens.size(); ++step) {
      int64_t total = 0, most = 0;
      for (int64_t x : b.tokens[step]) total += x, most = std::max(most, x);
      EXPECT_EQ(total, assignments);  // no capacity: every assignment is processed once
      EXPECT_DOUBLE_EQ(b.imbalance[step], double(most) / (double(total) / o.model.n_expert));
    }
  }
  std::printf("layer 3 step 0 tokens per expert:");
  for (int64_t x : spread.moe_layers[3].tokens[0]) std::printf(" %lld", (long long)x);
  std::printf(", max/mean %.3f\n", spread.moe_layers[3].imbalance[0]);
  // Only expert parallelism moves tokens between devices.
  for (size_t d = 0; d < 4; ++d) {
    EXPECT_EQ(replicated.a2a_time[d], 0);
    EXPECT_GT(spread.a2a_time[d], 0);
    for (const auto& layer : replicated.moe[d]) EXPECT_EQ(layer.a2a_sent_bytes, 0u);
    for (const auto& layer : spread.moe[d]) EXPECT_GT(layer.a2a_sent_bytes, 0u);
  }
}

}  // namespace
}  // namespace shardlab::train
