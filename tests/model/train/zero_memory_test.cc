// ZeRO's memory, exactly: the gradient and optimizer bytes each device's
// arena peaks at, against figures computed here from the bucket layout
// (planned by hand from the parameter table, not by DataParallel):
//   gradients   ZeRO 0: every element; ZeRO-1: every element of the padded
//               buckets (Megatron pads each to a multiple of lcm(dp, 128));
//               ZeRO-2: the owned chunks of the padded buckets plus the
//               largest padded bucket (reduced in place before it is
//               dropped), capped at the padded buffer
//   optimizer   AdamW's two fp32 moments of the owned chunks (padded: the
//               same on every rank; every element without ZeRO)
#include <algorithm>
#include <cstdio>
#include <numeric>
#include <vector>

#include <gtest/gtest.h>

#include "model/params.h"
#include "tests/model/train/train_test_util.h"

namespace shardlab::train {
namespace {

using testing::bucket_sizes;
using testing::owned;
using testing::padded;
using testing::run;
using testing::small_options;

TEST(ZeroMemory, GradientAndOptimizerPeaksAreExact) {
  TrainOptions o = small_options(0);
  o.steps = 1;
  o.parallel.dp = 4;
  o.parallel.bucket_mb = 0.15;  // 150 kB: a handful of buckets of unequal size
  const model::ParamTable table(o.model);
  const int64_t n = table.numel();
  const std::vector<int64_t> buckets = bucket_sizes(table, o.parallel.bucket_mb * 1e6);
  const int64_t largest = *std::max_element(buckets.begin(), buckets.end());
  std::printf("%lld parameters in %zu buckets, largest %lld\n", (long long)n, buckets.size(), (long long)largest);
  ASSERT_GE(buckets.size(), 3u);
  ASSERT_LT(largest * 2, n) << "the bound must be below the unsharded figure to mean anything";
  for (int zero : {0, 1, 2}) {
    o.parallel.zero = zero;
    const TrainResult r = run(o);
    for (int rank = 0; rank < o.parallel.dp; ++rank) {
      const DeviceStats& d = r.run.devices[size_t(rank)];
      // ZeRO-1/2 at dp 4: every bucket padded to a multiple of 128.
      const std::vector<int64_t> pad = zero == 0 ? buckets : padded(buckets, o.parallel.dp);
      const int64_t total = std::accumulate(pad.begin(), pad.end(), int64_t{0});
      const int64_t own = zero == 0 ? n : owned(pad, o.parallel.dp, rank);
      const int64_t held = zero == 2 ? std::min(total, own + *std::max_element(pad.begin(), pad.end())) : total;
      const uint64_t grad = d.peak_by_kind[int(MemKind::kGrad)];
      const uint64_t opt = d.peak_by_kind[int(MemKind::kOptimizer)];
      std::printf("  ZeRO-%d rank %d: grad peak %llu B (want %lld x 4 = %lld, %.3f of unsharded), optimizer %llu B "
                  "(want 2 x %lld x 4)\n",
                  zero, rank, (unsigned long long)grad, (long long)held, (long long)(held * 4), double(held) / n,
                  (unsigned long long)opt, (long long)own);
      EXPECT_EQ(grad, uint64_t(held) * 4) << "ZeRO-" << zero << " rank " << rank;
      EXPECT_EQ(opt, uint64_t(own) * 2 * 4) << "ZeRO-" << zero << " rank " << rank;
    }
  }
}

}  // namespace
}  // namespace shardlab::train
