// Context parallelism's activation memory, exactly. A block's attention
// inputs are the local heads' [q | k | v] rows of this rank's tokens:
// B·(T/cp)·3·C/tp elements; the attention core keeps the log-sum-exp of
// every query row, B·(NH/tp)·(T/cp), instead of the (T, T) probabilities.
// Every other saved activation is per token too, so a device's activation
// peak halves exactly from cp 2 to cp 4.
#include <cstdio>

#include <gtest/gtest.h>

#include "model/parallel/block.h"
#include "tests/model/train/train_test_util.h"

namespace shardlab::train {
namespace {

TEST(CpMemory, AttentionInputsPerDeviceFallAsOneOverCp) {
  const int B = 4, T = 64, C = 128, NH = 4, tp = 2;
  for (int cp : {1, 2, 4}) {
    parallel::ShardDims d{{B, T / cp, C, NH, 4 * C}, tp, false, 1};
    d.cp = cp;
    parallel::BlockActs a;
    a.resize(d, model::preset("tiny"), false);
    const uint64_t qkv_bytes = uint64_t(a.qkv.size()) * 4;
    const uint64_t want = uint64_t(B) * T * 3 * C * 4 / tp / cp;
    const uint64_t att_want = cp == 1 ? uint64_t(B) * (NH / tp) * T * T : uint64_t(B) * (NH / tp) * (T / cp);
    std::printf("cp %d: qkv %llu B per device (closed form %llu B), attention state %zu elements (want %llu)\n", cp,
                (unsigned long long)qkv_bytes, (unsigned long long)want, a.att.size(), (unsigned long long)att_want);
    EXPECT_EQ(qkv_bytes, want);
    EXPECT_EQ(uint64_t(a.att.size()), att_want);
    EXPECT_EQ(uint64_t(a.atty.size()) * 4, uint64_t(B) * T * C * 4 / tp / cp);
  }
}

uint64_t activation_peak(int cp, int rank) {
  TrainOptions o = testing::small_options();
  o.steps = 1;
  o.parallel.cp = cp;
  const TrainResult r = testing::run(o);
  return r.run.devices[size_t(rank)].peak_by_kind[int(MemKind::kActivation)];
}

// (cp 1 printed for comparison: the unsharded model, with the (T, T) probabilities.)
TEST(CpMemory, ActivationPeakHalvesFromCp2ToCp4) {
  const uint64_t cp1 = activation_peak(1, 0), cp2 = activation_peak(2, 0);
  for (int rank = 0; rank < 4; ++rank) {
    const uint64_t cp4 = activation_peak(4, rank);
    std::printf("rank %d: activation peak cp 1 %llu B, cp 2 %llu B, cp 4 %llu B\n", rank, (unsigned long long)cp1,
                (unsigned long long)cp2, (unsigned long long)cp4);
    EXPECT_EQ(cp2, 2 * cp4) << "rank " << rank;
  }
}

}  // namespace
}  // namespace shardlab::train
