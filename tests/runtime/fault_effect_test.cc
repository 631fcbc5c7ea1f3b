// What each fault does to a run, exactly: slowed links against the
// alpha-beta formula computed here from the profile's numbers, a straggler's
// kernels, a smaller arena, and a dead device or downed link stopping every
// thread with one message naming the device, the step and what was in flight.
#include <cmath>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "collectives/collectives.h"
#include "collectives/mesh.h"
#include "runtime/cluster.h"
#include "runtime/errors.h"
#include "runtime/fault.h"

namespace shardlab {
namespace {

namespace coll = collectives;

std::shared_ptr<const FaultPlan> plan(const std::vector<std::string>& specs, int world) {
  return std::make_shared<const FaultPlan>(parse_faults(specs), world);
}

// The a100-nvlink intra-node link's numbers, read off the profile: latency,
// bytes per second, and the bytes on the wire of a message (NCCL's SM packets).
// The rings run on plain sends (Proto::kPlain): the alpha-beta forms below, with
// the kernel launch alone as the start (the profile's protocols would add theirs).
struct Nvlink {
  HardwareProfile p = load_profile("a100-nvlink");
  Time a = Time(std::llround(p.intra.latency_us * 1e6));
  uint64_t bps = uint64_t(std::llround(p.intra.bandwidth_GBps * 1e9));
  Time launch = Time(std::llround(p.device.collective_launch_us * 1e6));
  uint64_t wire(uint64_t bytes) const {
    const uint64_t payload = uint64_t(p.intra.sm_payload_bytes);
    return bytes + (bytes + payload - 1) / payload * uint64_t(p.intra.packet_header_bytes);
  }
  // ceil(wire bytes * 1e12 / rate) picoseconds.
  Time w(uint64_t bytes, uint64_t rate) const {
    __extension__ using u128 = unsigned __int128;  // GCC's; __extension__ keeps -Wpedantic quiet
    const u128 num = u128(wire(bytes)) * 1'000'000'000'000u;
    return Time((num + rate - 1) / rate);
  }
};

// Runs one phantom ring all_reduce of `count` floats on `world` devices at
// `step`; returns the latest device end.
Time ring_all_reduce(const Nvlink& n, int world, size_t count, std::shared_ptr<const FaultPlan> faults,
                     int step = 0) {
  Cluster c(n.p, {.world_size = world, .faults = std::move(faults)});
  const coll::DeviceMesh mesh({.dp = world});
  const RunResult r = c.run([&](Device& d) {
    d.set_step(step);
    coll::all_reduce(d, mesh.group(d.rank(), "dp"), coll::Buffer::phantom(count), coll::ReduceOp::kSum,
                     {.algo = coll::Algo::kRing, .proto = coll::Proto::kPlain});
  });
  return r.makespan();
}

TEST(FaultEffect, TwoRankRingThroughASlowLinkIsTheAlphaBetaFormula) {
  const Nvlink n;
  const size_t count = 1 << 20;  // 4 MiB: two 2 MiB chunks
  const uint64_t chunk = count / 2 * 4;
  // L + 2(n-1)(a + W/B): with B at a quarter on the only link.
  EXPECT_EQ(ring_all_reduce(n, 2, count, nullptr), n.launch + 2 * (n.a + n.w(chunk, n.bps)));
  EXPECT_EQ(ring_all_reduce(n, 2, count, plan({"slow-link:0-1:bw=0.25"}, 2)),
            n.launch + 2 * (n.a + n.w(chunk, n.bps / 4)));
  EXPECT_EQ(ring_all_reduce(n, 2, count, plan({"slow-link:1-0:lat_us=+5"}, 2)),
            n.launch + 2 * (n.a + 5'000'000 + n.w(chunk, n.bps)));
}

TEST(FaultEffect, FourRankRingWithOneSlowNicIsBoundByItsTwoLinks) {
  // dp 4, device 1's NIC at a quarter: links 0->1 and 1->2 take v = W/(B/4)
  // per chunk, 2->3 and 3->0 w = W/B. Each slow link carries all 2(n-1) = 6
  // chunks back to back (v > 4a + 2w, so the fast half never starves them),
  // and the last chunk crosses both: L + 2a + 6v.
  const Nvlink n;
  const size_t count = 4 << 20;  // 16 MiB, 4 MiB chunks
  const uint64_t chunk = count / 4 * 4;
  const Time v = n.w(chunk, n.bps / 4), w = n.w(chunk, n.bps);
  ASSERT_GT(v, 4 * n.a + 2 * w);
  EXPECT_EQ(ring_all_reduce(n, 4, count, nullptr), n.launch + 6 * (n.a + w));
  EXPECT_EQ(ring_all_reduce(n, 4, count, plan({"slow-nic:1:bw=0.25"}, 4)), n.launch + 2 * n.a + 6 * v);
  // Latency only: the longest chain of 6 hops crosses the two slow links
  // twice each (0->1, 1->2, 2->3, 3->0, 0->1, 1->2): 4 extra latencies.
  const Time x = 5'000'000;
  EXPECT_EQ(ring_all_reduce(n, 4, count, plan({"slow-nic:1:lat_us=+5"}, 4)), n.launch + 6 * (n.a + w) + 4 * x);
}

TEST(FaultEffect, ASlowLinkFromAStepLeavesEarlierStepsAlone) {
  const Nvlink n;
  const auto faults = plan({"slow-nic:1:bw=0.25,from_step=2"}, 4);
  const Time before = ring_all_reduce(n, 4, 1 << 20, nullptr, 1);
  EXPECT_EQ(ring_all_reduce(n, 4, 1 << 20, faults, 1), before);
  EXPECT_GT(ring_all_reduce(n, 4, 1 << 20, faults, 2), before);
}

TEST(FaultEffect, AStragglersKernelsTakeFTimesAsLongAndTheOthersWait) {
  const Nvlink n;
  const OpCost op{2e9, 4e8};  // 2 GFLOP, 400 MB: some hundreds of microseconds
  Time d = 0, slow = 0, fast = 0, rank0_end = 0;
  Cluster c(n.p, {.world_size = 2, .faults = plan({"straggler:1:compute=3,from_step=1"}, 2)});
  const coll::DeviceMesh mesh({.dp = 2});
  c.run([&](Device& dev) {
    if (dev.rank() == 0) d = dev.cost().duration(op);  // one writer: the same for both ranks
    dev.set_step(1);
    const Time t = dev.run(dev.compute(), "kernel", op);
    (dev.rank() == 1 ? slow : fast) = t;
    float x = 1;
    coll::all_reduce(dev, mesh.group(dev.rank(), "dp"), coll::Buffer(&x, 1), coll::ReduceOp::kSum,
                     {.algo = coll::Algo::kRing, .proto = coll::Proto::kPlain});
    if (dev.rank() == 0) rank0_end = dev.now();
  });
  EXPECT_EQ(fast, d);
  EXPECT_EQ(slow, 3 * d);
  // Rank 0 waits for rank 1's first chunk, sent at 3d + L; its own second
  // chunk then queues behind it on the port: 3d + L + a + 2w (one float, 4 B).
  EXPECT_EQ(rank0_end, 3 * d + n.launch + n.a + 2 * n.w(4, n.bps));
}

TEST(FaultEffect, MemoryPressureShrinksOneArena) {
  const Nvlink n;
  Cluster c(n.p, {.world_size = 2, .memory_bytes = 1 << 30, .faults = plan({"memory:1:capacity=0.25"}, 2)});
  const RunResult r = c.run([](Device&) {});
  EXPECT_EQ(r.devices[0].capacity_bytes, uint64_t{1} << 30);
  EXPECT_EQ(r.devices[1].capacity_bytes, uint64_t{1} << 28);
  EXPECT_THROW(Cluster(n.p, {.world_size = 2, .memory_bytes = 1 << 30, .faults = plan({"memory:1:capacity=2GiB"}, 2)}),
               ConfigError);
  EXPECT_THROW(Cluster(n.p, {.world_size = 2, .faults = plan({"slow-nic:3:bw=0.5"}, 4)}), ConfigError);
}

// Four steps of a dp all-reduce; the run's error message.
std::string fatal_run(const std::vector<std::string>& specs, bool p2p = false) {
  const Nvlink n;
  Cluster c(n.p, {.world_size = 4, .faults = plan(specs, 4)});
  const coll::DeviceMesh mesh({.dp = 4});
  try {
    c.run([&](Device& d) {
      for (int step = 0; step < 4; ++step) {
        d.set_step(step);
        if (p2p && d.rank() < 2) {  // a point-to-point pair outside any collective
          if (d.rank() == 0) d.send(d.comm(), 1, 99, {}, 64);
          if (d.rank() == 1) d.recv(d.comm(), 0, 99);
        }
        coll::all_reduce(d, mesh.group(d.rank(), "dp"), coll::Buffer::phantom(1024), coll::ReduceOp::kSum,
                         {.algo = coll::Algo::kRing, .proto = coll::Proto::kPlain});
      }
    });
  } catch (const RunError& e) {
    EXPECT_TRUE(e.device_failure()) << e.what();
    EXPECT_FALSE(e.input_error());
    return e.what();
  }
  return "finished";
}

TEST(FaultEffect, ADeadDeviceStopsEveryThreadNamingStepAndCollective) {
  EXPECT_EQ(fatal_run({"dead:2:step=2"}),
            "device 2 died at step 2 during all_reduce (ring) on dp[0,1,2,3] (its send to device 3); resume from "
            "a checkpoint without it");
  EXPECT_EQ(fatal_run({"dead:1:step=1"}, /*p2p=*/true),
            "device 1 died at step 1 during a point-to-point transfer (its receive from device 0); resume from a "
            "checkpoint without it");
}

TEST(FaultEffect, ADownedLinkIsReportedByItsLowerEnd) {
  EXPECT_EQ(fatal_run({"link-down:3-0:step=1"}),
            "link 3-0 went down at step 1 during all_reduce (ring) on dp[0,1,2,3] (device 0's receive from device 3)");
  // A link the program never uses after its step changes nothing.
  EXPECT_EQ(fatal_run({"link-down:0-2:step=1"}), "finished");
}

}  // namespace
}  // namespace shardlab
