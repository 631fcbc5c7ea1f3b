// Disaggregated serving: the K and V's way over the links (kv_transfer.h),
// by hand, and a request's phases on two replicas with a linear step cost.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "model/serve/kv_transfer.h"
#include "model/serve/serving.h"
#include "support/config_error.h"
#include "tests/model/serve/linear_step.h"

namespace shardlab::serve {
namespace {

// Two nodes of two GPUs: NVLink 2 us + 300 GB/s inside a node, a NIC per GPU
// at 5 us + 25 GB/s across, no packet overhead, no PCIe tree.
HardwareProfile two_by_two() {
  HardwareProfile p = load_profile("a100-nvlink");
  p.nodes = 2;
  p.devices_per_node = 2;
  p.intra = {2.0, 300};
  p.inter = {5.0, 25};
  p.nics.clear();
  p.pcie = {};
  return p;
}

Time ps(double seconds) { return Time(std::llround(seconds * 1e12)); }

// One device a replica, 1000 bytes of K and V a token: prefill replica 0 is
// device 0; decode replicas 0, 1, 2 are devices 1 (same node), 2 and 3.
// A 30-token prompt is 30,000 bytes:
//   NVLink  2 us + 30,000 / 300e9 s = 2 us + 0.1 us = 2.1 us
//   NIC     5 us + 30,000 / 25e9 s  = 5 us + 1.2 us = 6.2 us
// The second transfer leaves the prefill replica when its port is free,
// after the first one's 0.1 us on the wire (the latency overlaps).
TEST(KvTransfer, BytesOverTheLinkRatePlusLatencyByHand) {
  KvTransfer t(two_by_two(), 1, 3, {1000});
  EXPECT_TRUE(t.same_node(0, 0));
  EXPECT_FALSE(t.same_node(0, 1));
  const Handoff a = t.send(0, 0, 30, 1.0);
  EXPECT_EQ(a.bytes, 30000u);
  EXPECT_EQ(ps(a.transfer_s), 2'100'000);  // ps
  EXPECT_EQ(ps(a.start_s), ps(1.0));
  EXPECT_EQ(ps(a.arrive_s), ps(1.0) + 2'100'000);
  const Handoff b = t.send(0, 1, 30, 1.0);
  EXPECT_EQ(ps(b.transfer_s), 6'200'000);
  EXPECT_EQ(ps(b.start_s), ps(1.0) + 100'000);  // after a's wire time
  EXPECT_EQ(ps(b.arrive_s), ps(1.0) + 100'000 + 6'200'000);
  // A replica of two devices: every rank's pair at once, the slowest rank's
  // time (rank 1 holds 3000 bytes a token: 90,000 bytes, 0.3 us on NVLink).
  KvTransfer two(two_by_two(), 1, 1, {1000, 3000});
  const Handoff c = two.send(0, 0, 30, 0);  // devices 0, 1 to 2, 3: across the nodes
  EXPECT_EQ(c.bytes, 120000u);
  EXPECT_EQ(ps(c.transfer_s), 5'000'000 + 3'600'000);  // 90,000 / 25e9 = 3.6 us
  EXPECT_NE(testing::config_error_of([] { KvTransfer(two_by_two(), 2, 1, {1, 1}); }).find("the profile has 4"),
            std::string::npos);
}

ServeOptions split(int prefill, int decode) {
  ServeOptions o;
  o.disaggregate = {prefill, decode};
  o.scheduler.kv_blocks = 100;
  o.scheduler.kv_block = 16;
  return o;
}

// One request, prompt 30, output 4, at 0; a step costs 1 + 0.01 per token.
//   prefill replica   prefill 30 tokens: [0, 1.3], the first token
//   the transfer      30,000 bytes on NVLink: 2.1 us, arriving 1.3 + 2.1e-6
//   decode replica    3 decode steps of 1.01 from the arrival
// TTFT = 1.3 + 2.1e-6 (the transfer included), TPOT 1.01.
TEST(Disaggregated, ARequestsPhasesByHand) {
  LinearStep ex;
  KvTransfer t(two_by_two(), 1, 1, {1000});
  const std::vector<StepExecutor*> one{&ex};
  const ServeResult r = simulate_serving({{0, 0, 30, 4}}, split(1, 1), one, &t);
  ASSERT_EQ(r.replicas.size(), 2u);
  ASSERT_EQ(ex.batches.size(), 4u);
  EXPECT_EQ(ex.batches[0][0].new_tokens, 30);
  const BatchEntry& first = ex.batches[1][0];  // the decode replica's first step
  EXPECT_TRUE(first.handed);
  EXPECT_EQ(first.context, 30);
  EXPECT_EQ(first.new_tokens, 1);
  EXPECT_EQ(first.draw, 1);  // its second token
  const Handoff& h = r.handoffs[0];
  EXPECT_EQ(ps(h.ready_s), ps(1.3));
  EXPECT_EQ(ps(h.transfer_s), 2'100'000);
  const RequestRecord& q = r.requests[0];
  const double ttft = 1.3 + 2.1e-6, finish = ttft + 3 * 1.01;
  std::printf("TTFT %.12f s (by hand %.12f), finish %.12f s (by hand %.12f)\n", q.first_token_s, ttft, q.finish_s,
              finish);
  EXPECT_NEAR(q.first_token_s, ttft, 1e-12);  // picosecond rounding of the clock
  EXPECT_NEAR(q.finish_s, finish, 1e-12);
  EXPECT_NEAR(r.summary.tpot_s.p50, 1.01, 1e-12);
  EXPECT_EQ(q.replica, 1);
  EXPECT_EQ(r.phases.kv_bytes, 30000u);
  EXPECT_EQ(r.phases.transfers, 1);
  EXPECT_NEAR(r.phases.prefill_ttft_s.p50, 1.3, 1e-12);
}

// A decode replica holds what arrives until its blocks are free: 3 blocks of
// 16 hold one request of 30 + 4 - 1 tokens at a time. The prefill replica
// (3 blocks too) prefills the first alone ([0, 1.3]), then the second with
// the third ([1.3, 2.7], 40 tokens: 1 + 0.4); the second arrives at the
// decode replica at 2.7 + 2.1 us and waits for the first to finish (at
// 1.3 + 2.1 us + 3 · 1.01 = 4.33); the third (one output token) ends with
// its prefill.
TEST(Disaggregated, ADecodeReplicaAdmitsWhatArrivedWhenItHasBlocks) {
  LinearStep ex;
  KvTransfer t(two_by_two(), 1, 1, {1000});
  ServeOptions o = split(1, 1);
  o.scheduler.kv_blocks = 3;
  const std::vector<StepExecutor*> one{&ex};
  const ServeResult r = simulate_serving({{0, 0, 30, 4}, {1, 0, 30, 4}, {2, 0, 10, 1}}, o, one, &t);
  EXPECT_EQ(r.phases.transfers, 2);
  EXPECT_NEAR(r.requests[2].finish_s, 1.3 + 1.4, 1e-12);  // the second prefill step: 40 tokens
  const double first_done = r.requests[0].finish_s;
  EXPECT_NEAR(first_done, 1.3 + 2.1e-6 + 3 * 1.01, 1e-12);
  EXPECT_NEAR(r.requests[1].finish_s, first_done + 3 * 1.01, 1e-12);
  EXPECT_EQ(r.summary.requests, 3);
}

TEST(Disaggregated, RefusesWhatItDoesNotBuild) {
  LinearStep ex;
  KvTransfer t(two_by_two(), 1, 1, {1000});
  std::vector<StepExecutor*> one{&ex};
  ServeOptions o = split(1, 1);
  o.scheduler.batching = Batching::kStatic;
  EXPECT_NE(testing::config_error_of([&] { simulate_serving({{0, 0, 4, 2}}, o, one, &t); }).find("continuous"),
            std::string::npos);
  o = split(1, 1);
  o.scheduler.speculative = 2;
  EXPECT_NE(testing::config_error_of([&] { simulate_serving({{0, 0, 4, 2}}, o, one, &t); }).find("`speculative`"),
            std::string::npos);
  for (const char* bad : {"prefill=1", "prefill=0,decode=1", "prefill=1,decode=0", "prefill=1,decode=1,decode=2",
                          "prefill=x,decode=1", "prefill=-1,decode=1", "prefill=1e9,decode=1", "fill=1,decode=1",
                          "prefill=1;decode=1", "", "prefill=1,decode=1,"})
    EXPECT_NE(testing::config_error_of([&] { parse_disaggregate(bad); }).find("`disaggregate`"), std::string::npos)
        << bad;
  EXPECT_EQ(parse_disaggregate("decode=3,prefill=2").decode, 3);
}

}  // namespace
}  // namespace shardlab::serve
