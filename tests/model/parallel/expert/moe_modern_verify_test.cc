// Modern MoE under each parallelism, one case each (the routers rotate over
// the cases; moe_modern_full_test.cc runs every router under every one),
// the 5D mix on 32 virtual GPUs, and where the shared experts live: split
// over TP like the dense MLP, replicated over EP.
#include <cstdint>
#include <string>
#include <vector>

#include "moe_modern_verify.h"

namespace shardlab::train::testing {
namespace {

const std::vector<ModernCase>& cases() {
  static const std::vector<ModernCase> all = {
      {{"tp2_sp", 2, 1, 1, 1, 1, 1, 0, true}, kRouters[2]},
      {{"ep2_dp2", 1, 2, 1, 2}, kRouters[3]},
      {{"dp2_zero1", 1, 2, 1, 1, 1, 1, 1}, kRouters[1]},
      {{"pp2", 1, 1, 2, 1, 1, 2}, kRouters[0]},
      {{"cp2", 1, 1, 1, 1, 2}, kRouters[2]},
      // tp 2 × cp 2 × ep 2 × dp 4 (edp 2) × pp 2: 32 devices, ep inside dp.
      {{"tp2_cp2_ep2_dp4_pp2", 2, 4, 2, 2, 2, 2, 0, true}, kRouters[2]},
  };
  return all;
}

class ModernMoeVerify : public ::testing::TestWithParam<ModernCase> {};

TEST_P(ModernMoeVerify, MatchesTheUnshardedModel) { expect_matches_unsharded(GetParam()); }

INSTANTIATE_TEST_SUITE_P(OnePerParallelism, ModernMoeVerify, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name(); });

TEST(ModernMoeVerifyGrid, CasesAreValidAndOneIsThe5DMixOn32Gpus) {
  int big = 0;
  for (const ModernCase& c : cases()) {
    EXPECT_NO_THROW(validate_parallel(modern_options(c))) << c.name();
    big += modern_options(c).parallel.world() == 32;
  }
  EXPECT_EQ(big, 1);
}

uint64_t param_bytes(TrainOptions o, int shared) {
  o.model.n_shared_expert = shared;
  o.steps = 1;
  o.keep_step0_grads = false;
  return run(o).run.devices[0].peak_by_kind[int(MemKind::kParam)];
}

// Adding 2 shared experts (one MLP of width Fs = 64 on C = 64, fp32) to each
// of the 3 MoE blocks (block 0 is dense) adds per device: c_fc (Fs, C) and its bias split over
// TP, c_proj (C, Fs) split over TP, its bias (C) whole; nothing divided by EP.
TEST(ModernMoeMemory, SharedExpertsAreSplitOverTpAndReplicatedOverEp) {
  const uint64_t C = 64, Fs = 64, blocks = 3;
  for (const auto& [tp, ep] : {std::pair{1, 1}, std::pair{2, 1}, std::pair{1, 2}, std::pair{2, 2}}) {
    TrainOptions o = modern_options({{"mem", tp, 2, 1, ep}, kRouters[0]});
    const uint64_t added = param_bytes(o, 2) - param_bytes(o, 0);
    const uint64_t expected = blocks * 4 * ((2 * Fs * C + Fs) / tp + C);
    std::printf("tp %d ep %d: 2 shared experts add %llu B of parameters per device (by hand %llu B)\n", tp, ep,
                (unsigned long long)added, (unsigned long long)expected);
    EXPECT_EQ(added, expected) << "tp " << tp << " ep " << ep;
  }
}

// Phantom, uniform routing (token n's k-th choice is expert (n·K + k) mod 16),
// ep 2 (experts 0-7 on rank 0): at K = 8 each token's 8 experts sit on one
// rank, that of n mod 2; at K = 2 on rank (n mod 8) / 4. Either way half of a
// rank's N = 4·32 tokens go off-rank with K rows each, and the combine sends
// as many back: per forward N·K rows of C = 64 fp32, and backward as much.
TEST(ModernMoePhantom, AllToAllBytesScaleWithTopK) {
  for (int K : {2, 8}) {
    TrainOptions o = modern_options({{"ep2_dp2", 1, 2, 1, 2}, kRouters[2]});
    o.model.top_k = K;
    o.phantom = true;
    o.steps = 1;
    o.keep_step0_grads = false;
    const TrainResult r = run(o);
    const uint64_t N = 4 * 32, C = 64, expected = 2 * N * K * C * 4;
    ASSERT_EQ(r.moe.size(), 2u);
    for (const auto& device : r.moe) {
      ASSERT_EQ(device.size(), 3u);  // blocks 1-3
      for (const auto& layer : device) EXPECT_EQ(layer.a2a_sent_bytes, expected) << "top-" << K;
    }
    std::printf("phantom top-%d: %llu B sent per MoE block per device per step (by hand %llu B)\n", K,
                (unsigned long long)r.moe[0][0].a2a_sent_bytes, (unsigned long long)expected);
  }
}

}  // namespace
}  // namespace shardlab::train::testing
