// Whole training runs are deterministic under host jitter: the same run with
// random host sleeps injected at every send and receive (FabricHooks, as in
// tests/runtime and tests/collectives) gives bit-identical losses, gradient
// norms, final parameters and per-device virtual times. Covers the paths
// whose host order varies most: DP buckets overlapping backward, pipeline
// point-to-point, expert-parallel all-to-alls and ZeRO-2's reduce-scatter and
// all-gather.
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/model/train/train_test_util.h"

namespace shardlab::train {
namespace {

using testing::RandomSleeps;
using testing::run;
using testing::small_options;

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

void expect_identical_under_jitter(TrainOptions o, const char* what) {
  o.steps = 2;
  const TrainResult plain = run(o);
  RandomSleeps sleeps(uint64_t(std::hash<std::string>{}(what)));
  const TrainResult shaken = run(o, &sleeps);
  std::printf("%s: %lld host sleeps injected; losses %.9g %.9g; device 0 ends at %.3f us\n", what,
              (long long)sleeps.naps(), plain.steps[0].loss, plain.steps[1].loss,
              to_us(plain.run.devices[0].end()));
  EXPECT_GT(sleeps.naps(), 0);
  ASSERT_EQ(plain.steps.size(), shaken.steps.size());
  for (size_t s = 0; s < plain.steps.size(); ++s) {
    // Exact: bit-identical doubles (they come from identical fp32 math).
    EXPECT_EQ(plain.steps[s].loss, shaken.steps[s].loss) << what << " step " << s;
    EXPECT_EQ(plain.steps[s].grad_norm, shaken.steps[s].grad_norm) << what << " step " << s;
    EXPECT_EQ(plain.steps[s].virtual_end, shaken.steps[s].virtual_end) << what << " step " << s;
  }
  EXPECT_TRUE(same_bits(plain.final_params, shaken.final_params)) << what << ": final parameters differ";
  EXPECT_EQ(plain.replica_mismatch, "") << what;
  testing::expect_same_device_times(plain.run, shaken.run, what);
  for (size_t d = 0; d < plain.run.devices.size(); ++d) {
    for (size_t s = 0; s < plain.phases[d].size(); ++s) {
      EXPECT_EQ(plain.phases[d][s].start, shaken.phases[d][s].start) << what << " device " << d << " step " << s;
      EXPECT_EQ(plain.phases[d][s].end, shaken.phases[d][s].end) << what << " device " << d << " step " << s;
      EXPECT_EQ(plain.phases[d][s].busy, shaken.phases[d][s].busy) << what << " device " << d << " step " << s;
    }
  }
}

TEST(JitterDeterminism, DataParallelBucketsOverlappingBackward) {
  TrainOptions o = small_options(0);
  o.parallel.dp = 4;
  o.parallel.bucket_mb = 0.02;  // 20 kB: a dozen buckets launched during backward
  o.parallel.overlap = true;
  expect_identical_under_jitter(o, "dp 4, 20 kB buckets, overlap");
}

TEST(JitterDeterminism, PipelinePointToPoint) {
  TrainOptions o = small_options(0);
  o.parallel.pp = 4;
  o.parallel.schedule = parallel::ScheduleKind::k1F1B;
  o.micro_batches = 8;
  expect_identical_under_jitter(o, "pp 4, 1f1b, M 8");
}

TEST(JitterDeterminism, ExpertParallelAllToAll) {
  TrainOptions o = small_options(4);
  o.parallel.dp = 4;
  o.parallel.ep = 4;
  expect_identical_under_jitter(o, "dp 4 x ep 4, MoE");
}

TEST(JitterDeterminism, Zero2ReduceScatterAndGather) {
  TrainOptions o = small_options(0);
  o.parallel.dp = 4;
  o.parallel.zero = 2;
  o.parallel.bucket_mb = 0.05;
  o.micro_batches = 2;  // reduce-scattered every micro-batch
  expect_identical_under_jitter(o, "dp 4, ZeRO-2, 50 kB buckets, 2 micro-batches");
}

}  // namespace
}  // namespace shardlab::train
