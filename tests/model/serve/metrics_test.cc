#include "model/serve/metrics.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "model/serve/serving.h"

namespace shardlab::serve {
namespace {

// numpy.percentile([5, 1, 4, 2, 3], [50, 90, 99]) = 3, 4.6, 4.96.
TEST(ServeMetrics, PercentilesInterpolateAsNumpy) {
  const Percentiles p = percentiles({5, 1, 4, 2, 3});
  EXPECT_DOUBLE_EQ(p.p50, 3);
  EXPECT_NEAR(p.p90, 4.6, 1e-12);
  EXPECT_NEAR(p.p99, 4.96, 1e-12);
  EXPECT_DOUBLE_EQ(p.mean, 3);
  EXPECT_DOUBLE_EQ(p.max, 5);
  EXPECT_EQ(percentiles({}).p99, 0);
}

TEST(ServeMetrics, SummaryFromRecords) {
  ReplicaResult r;
  r.requests = {{0, 0, 0.0, 1.0, 3.0, 10, 3, 0}, {1, 0, 1.0, 1.5, 1.5, 20, 1, 0}};
  r.usage = {{1.0, 1.0, 4, 2, 0, 30}, {3.0, 2.0, 2, 1, 0, 1}};
  r.steps = 2;
  const ServeSummary s = summarize({r}, 8, 16);
  EXPECT_EQ(s.requests, 2);
  EXPECT_DOUBLE_EQ(s.ttft_s.p50, 0.75);      // 1.0 and 0.5
  EXPECT_DOUBLE_EQ(s.tpot_s.mean, 1.0);      // (3 - 1) / 2; the 1-token request has none
  EXPECT_DOUBLE_EQ(s.e2e_s.max, 3.0);
  EXPECT_DOUBLE_EQ(s.makespan_s, 3.0);
  EXPECT_DOUBLE_EQ(s.requests_per_s, 2.0 / 3.0);
  EXPECT_DOUBLE_EQ(s.output_tokens_per_s, 4.0 / 3.0);
  EXPECT_DOUBLE_EQ(s.total_tokens_per_s, 34.0 / 3.0);
  EXPECT_EQ(s.kv_capacity_tokens, 128);
  EXPECT_DOUBLE_EQ(s.kv_peak_use, 0.5);
  EXPECT_DOUBLE_EQ(s.kv_mean_use, (0.5 * 1.0 + 0.25 * 2.0) / 3.0);
  const nlohmann::json j = summary_json(s);
  EXPECT_DOUBLE_EQ(j["tpot_s"]["mean"].get<double>(), 1.0);
  EXPECT_EQ(j["kv_capacity_tokens_per_replica"].get<int64_t>(), 128);
}

// vLLM's plan: (capacity · utilization − weights − activations) / (bytes per token · block).
TEST(ServeMetrics, KvBlocksOnADevice) {
  // 80 GiB at 0.9, 26 GB of weights, 2 GB of activations, 0.8 MB per token, blocks of 16.
  const double cap = 80.0 * (1 << 30), per_token = 819200;
  const int64_t blocks = kv_blocks_on_device(cap, 0.9, 26e9, 2e9, per_token, 16);
  EXPECT_EQ(blocks, int64_t((cap * 0.9 - 28e9) / (per_token * 16)));
  EXPECT_EQ(kv_blocks_on_device(30e9, 0.9, 26e9, 2e9, per_token, 16), 0);
  // Blocks are named by 32-bit ids: a tiny model's 32 bytes of KV per token
  // in blocks of one on 80 GiB would be 2.4 billion blocks; the pool holds
  // kMaxKvBlocks (`serve --kv-block 1` on such a model failed an internal
  // check, "KV block count out of range", until session 34's serve fuzzer).
  EXPECT_GT(cap * 0.9 / 32, double(kMaxKvBlocks));
  EXPECT_EQ(kv_blocks_on_device(cap, 0.9, 0, 0, 32, 1), kMaxKvBlocks);
  EXPECT_EQ(kMaxKvBlocks, 2147483647);
}

}  // namespace
}  // namespace shardlab::serve
