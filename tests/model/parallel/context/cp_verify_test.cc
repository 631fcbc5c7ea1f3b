// Context parallelism through the trainer: sharded runs against the unsharded
// model (losses per step, step-0 gradients, final parameters; tolerance 1e-5
// relative, verify's) for cp 2 and 4 alone and composed with TP (+SP), DP,
// ZeRO, PP and EP, up to tp × cp × ep × dp × pp on 32 virtual GPUs; and the
// check can fail when one cp rank's copy differs.
#include <cstdio>
#include <ostream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "model/config.h"
#include "model/train/trainer.h"
#include "model/train/verify.h"
#include "tests/model/train/train_test_util.h"

namespace shardlab::train {
namespace {

struct CpCase {
  const char* name;
  int cp, tp = 1, dp = 1, pp = 1, ep = 1, zero = 0, experts = 0, micro = 1;
  bool sp = false;
  parallel::CpComm comm = parallel::CpComm::kRing;
};

void PrintTo(const CpCase& c, std::ostream* os) { *os << c.name; }

TrainOptions options_for(const CpCase& c) {
  TrainOptions o = testing::small_options(c.experts);  // seq 32: chunks of 8 (cp 2) or 4 (cp 4)
  o.keep_step0_grads = true;
  o.parallel.cp = c.cp;
  o.parallel.cp_comm = c.comm;
  o.parallel.tp = c.tp, o.parallel.sp = c.sp, o.parallel.dp = c.dp, o.parallel.pp = c.pp;
  o.parallel.ep = c.ep, o.parallel.zero = c.zero;
  o.micro_batches = c.micro;
  if (c.dp * c.tp * c.cp * c.pp >= 32) {  // the 32-GPU case: a smaller model keeps it fast
    o.model.n_layer = 2;
    o.model.n_embd = 32;
    o.steps = 2;
  }
  return o;
}

const std::vector<CpCase>& cases() {
  using parallel::CpComm;
  static const std::vector<CpCase> all = {
      {"cp2", 2},
      {"cp4", 4},
      {"cp2_allgather", 2, 1, 1, 1, 1, 0, 0, 1, false, CpComm::kAllGather},
      {"cp4_allgather", 4, 1, 1, 1, 1, 0, 0, 1, false, CpComm::kAllGather},
      {"cp2_tp2_sp", 2, 2, 1, 1, 1, 0, 0, 1, true},
      {"cp4_tp2", 4, 2},
      {"cp2_dp2", 2, 1, 2},
      {"cp4_dp2_zero2", 4, 1, 2, 1, 1, 2},
      {"cp2_dp2_zero3", 2, 1, 2, 1, 1, 3},
      {"cp2_pp2", 2, 1, 1, 2, 1, 0, 0, 2},
      {"cp4_pp2", 4, 1, 1, 2, 1, 0, 0, 2},
      {"cp2_moe_dp2_ep2", 2, 1, 2, 1, 2, 0, 4},
      // tp 2 × cp 2 × ep 2 × dp 4 (edp 2) × pp 2: 32 devices, ep inside dp.
      {"tp2_cp2_ep2_dp4_pp2", 2, 2, 4, 2, 2, 0, 4, 2, true},
  };
  return all;
}

class CpVerify : public ::testing::TestWithParam<CpCase> {};

TEST_P(CpVerify, MatchesTheUnshardedModel) {
  const TrainOptions o = options_for(GetParam());
  const TrainResult a = testing::run(o), b = testing::run(testing::unsharded(o));
  const VerifyResult r = compare_runs(a, b, model::ParamTable(o.model), {.grads = true});
  std::printf("%s (%d devices): loss rel diff %.2e, param rel L2 %.2e, grad rel L2 %.2e (tol 1e-5)\n",
              GetParam().name, o.parallel.world(), r.max_loss_rel_diff, r.param_rel_l2, r.grad_rel_l2);
  EXPECT_TRUE(r.passed) << (r.first_mismatch ? r.first_mismatch->kind + " " + r.first_mismatch->name : "");
  EXPECT_LE(r.grad_rel_l2, 1e-5);
  EXPECT_TRUE(a.replica_mismatch.empty()) << a.replica_mismatch;
  ASSERT_EQ(a.cp.size(), size_t(o.parallel.world()));
  for (const TrainResult::CpTotals& t : a.cp) EXPECT_GT(t.exposed, 0) << "the K/V exchange is on the clock";
}

INSTANTIATE_TEST_SUITE_P(Grid, CpVerify, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(CpVerifyGrid, CasesAreValidAndCoverTheDoneWhen) {
  int big = 0;
  for (const CpCase& c : cases()) {
    EXPECT_NO_THROW(validate_parallel(options_for(c))) << c.name;
    big += options_for(c).parallel.world() == 32;
  }
  EXPECT_EQ(big, 1) << "one 5D case on 32 virtual GPUs";
}

// cp rank 1 holds the same weights as cp rank 0: a perturbed copy there is a
// replica mismatch named by its cp rank, and verify fails.
TEST(CpVerifyCanFail, APerturbedCpRankIsNamed) {
  TrainOptions o = options_for({"cp2_dp2", 2, 1, 2});
  o.corrupt_shard = "transformer.h.1.mlp.c_fc.weight:1";  // rank 1: dp 0, cp 1
  const TrainResult a = testing::run(o);
  std::printf("replica mismatch: %s\n", a.replica_mismatch.c_str());
  EXPECT_NE(a.replica_mismatch.find("transformer.h.1.mlp.c_fc.weight on dp rank 0 cp rank 1"), std::string::npos)
      << a.replica_mismatch;
}

}  // namespace
}  // namespace shardlab::train
