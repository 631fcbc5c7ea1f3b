// bench.h and p2p_bench.h: the measurements behind `shardlab collectives` and
// `shardlab p2p`, as library values.
#include "collectives/bench.h"

#include <cmath>
#include <limits>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "collectives/p2p_bench.h"
#include "runtime/profile.h"

namespace shardlab::collectives {
namespace {

BenchRow one(const BenchOptions& o, uint64_t bytes) {
  std::vector<DeviceTrace> traces;
  Time offset = 0;
  return bench_collective(load_profile("a100-nvlink"), o, bytes, traces, offset);
}

TEST(CollectivesBench, CheckedResultsAreExactAndACorruptOneIsCaught) {
  BenchOptions o;
  o.op = OpKind::kAllReduce;
  o.ranks = 4;
  o.check = true;
  const BenchRow ok = one(o, 4096);
  EXPECT_EQ(ok.count, 1024u);
  EXPECT_EQ(ok.bytes, 4096u);
  EXPECT_GT(ok.time, 0);
  ASSERT_TRUE(ok.max_error.has_value());
  EXPECT_EQ(*ok.max_error, 0.0);
  o.corrupt = 1000.f;
  const BenchRow bad = one(o, 4096);
  ASSERT_TRUE(bad.max_error.has_value());
  EXPECT_GT(*bad.max_error, 900.0);  // |1000 - the true sum|, the sum's inputs being at most 4 x 1 in size
  EXPECT_EQ(bad.time, ok.time);      // the corruption is after the timed collective
  o.corrupt = std::numeric_limits<float>::quiet_NaN();
  const BenchRow nan = one(o, 4096);
  EXPECT_TRUE(std::isinf(*nan.max_error));
  const nlohmann::json j = bench_json({ok, nan}, o, "a100-nvlink");
  EXPECT_EQ(j["rows"][0]["max_error"], 0.0);
  EXPECT_EQ(j["rows"][1]["max_error"], "inf");
  EXPECT_EQ(j["op"], "all_reduce");
  EXPECT_EQ(j["ranks"], 4);
}

TEST(CollectivesBench, CountsRoundDownToTheRanksAndBusBandwidthFollowsNcclTests) {
  BenchOptions o;
  o.op = OpKind::kReduceScatter;
  o.ranks = 3;
  const BenchRow r = one(o, 4096);
  EXPECT_EQ(r.count, 1023u);  // 1024 floats, a multiple of 3
  EXPECT_EQ(r.bytes, 4092u);
  const Bandwidth b = bandwidth(r, o);
  const double algbw = 4092.0 / to_seconds(r.time) / 1e9;
  EXPECT_NEAR(b.algbw, algbw, 1e-12 * algbw);
  EXPECT_NEAR(b.busbw, algbw * 2.0 / 3.0, 1e-12 * algbw);  // (n-1)/n
  o.op = OpKind::kAllReduce;
  EXPECT_NEAR(bandwidth(r, o).busbw, algbw * 4.0 / 3.0, 1e-12 * algbw);  // 2(n-1)/n
  EXPECT_TRUE(reduces(OpKind::kReduce));
  EXPECT_FALSE(reduces(OpKind::kAllGather));
}

TEST(P2pBench, RowsPerSizeAndTheLinkTheyCross) {
  const HardwareProfile p = load_profile("a100-nvlink");
  ASSERT_GT(p.total_devices(), p.devices_per_node);
  const P2pResult intra = bench_p2p(p, {0, 1, false, false, 0}, {4, 1 << 20});
  ASSERT_EQ(intra.rows.size(), 2u);
  EXPECT_TRUE(intra.intra);
  EXPECT_EQ(intra.rows[1].bytes, uint64_t(1) << 20);
  // One-way latency is at least the link's; a 1 MiB window stays under its line rate.
  EXPECT_GE(intra.rows[0].latency_us, p.intra.latency_us);
  EXPECT_GT(intra.rows[1].bandwidth_GBps, 0);
  EXPECT_LE(intra.rows[1].bandwidth_GBps, p.intra.bandwidth_GBps);
  const P2pResult inter = bench_p2p(p, {0, p.devices_per_node, false, false, 0}, {4});
  EXPECT_FALSE(inter.intra);
  const nlohmann::json j = p2p_json(inter, {0, p.devices_per_node, false, false, 0}, p.name);
  EXPECT_EQ(j["link"], "inter");
  EXPECT_EQ(j["rows"][0]["bytes"], 4);
  EXPECT_EQ(j["rows"][0]["latency_us"], inter.rows[0].latency_us);
}

}  // namespace
}  // namespace shardlab::collectives
