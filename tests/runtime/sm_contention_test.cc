// SM contention (Device::note_collective, Device::compute_end): a compute
// kernel overlapping a collective on another stream runs at
// (sm_count - blocks) / sm_count of its speed over the overlap. Expected
// ends are worked out by hand with sm_count 100.
#include <vector>

#include <gtest/gtest.h>

#include "collectives/collectives.h"
#include "runtime/cluster.h"
#include "support/bounded_run.h"
#include "tests/runtime/test_util.h"

namespace shardlab {
namespace {

using testing::bounded_run;

HardwareProfile hundred_sms() {
  HardwareProfile p = testing::simple_profile();
  p.device.gemm.sm_count = 100;
  p.device.gemm.tiles = {{128, 128}};
  return p;
}

// Runs `body` on one device of `p` and returns what it recorded.
template <class Body>
std::vector<Time> on_one_device(const HardwareProfile& p, Body body) {
  std::vector<Time> out;
  Cluster c(p, {.world_size = 1});
  bounded_run(c, [&](Device& d) { out = body(d); });
  return out;
}

TEST(SmContention, WithoutCollectivesAKernelTakesItsWork) {
  const auto t = on_one_device(hundred_sms(), [](Device& d) { return std::vector<Time>{d.compute_end(0, 1000)}; });
  EXPECT_EQ(t[0], 1000);
}

TEST(SmContention, InsideACollectiveTheKernelRunsOnTheFreeSms) {
  const auto t = on_one_device(hundred_sms(), [](Device& d) {
    d.note_collective(0, 1000, 20);
    // 400 ps of work on 80 of 100 SMs: 400 * 100 / 80 = 500.
    const Time inside = d.compute_end(0, 400);
    // 1000 ps from 0: [0, 1000) does 800 of it, the last 200 at full speed.
    const Time across = d.compute_end(0, 1000);
    return std::vector<Time>{inside, across};
  });
  EXPECT_EQ(t[0], 500);
  EXPECT_EQ(t[1], 1200);
}

TEST(SmContention, ACollectiveStartingMidKernelSlowsOnlyTheOverlap) {
  const auto t = on_one_device(hundred_sms(), [](Device& d) {
    d.note_collective(200, 700, 50);
    // [0, 200): 200 done; [200, 700) at half speed: 250 more (450); 150 left
    // at full speed: 700 + 150 = 850.
    return std::vector<Time>{d.compute_end(0, 600)};
  });
  EXPECT_EQ(t[0], 850);
}

TEST(SmContention, ConcurrentCollectivesAddTheirBlocksUpToAllButOneSm) {
  const auto t = on_one_device(hundred_sms(), [](Device& d) {
    d.note_collective(0, 1000, 30);
    d.note_collective(0, 1000, 20);
    const Time half = d.compute_end(0, 100);  // 50 free SMs: 200
    d.note_collective(0, 1000, 150);          // capped: 1 SM left
    const Time one = d.compute_end(0, 3);     // 3 * 100 / 1 = 300
    return std::vector<Time>{half, one};
  });
  EXPECT_EQ(t[0], 200);
  EXPECT_EQ(t[1], 300);
}

TEST(SmContention, EndsRoundUpToAPicosecondAndPastCollectivesAreDropped) {
  const auto t = on_one_device(hundred_sms(), [](Device& d) {
    d.note_collective(0, 100, 3);
    const Time rounded = d.compute_end(0, 1);  // 100 SM-ps on 97 SMs: ceil(1.03) = 2
    const Time after = d.compute_end(100, 50);  // the collective ended at 100
    return std::vector<Time>{rounded, after};
  });
  EXPECT_EQ(t[0], 2);
  EXPECT_EQ(t[1], 150);
}

TEST(SmContention, AProfileWithoutAnSmCountHasNone) {
  const auto t = on_one_device(testing::simple_profile(), [](Device& d) {
    d.note_collective(0, 1000, 20);
    return std::vector<Time>{d.compute_end(0, 400)};
  });
  EXPECT_EQ(t[0], 400);
}

// Through the collectives: an all-reduce of two ranks on one node (one
// channel: collectives/tuner.h RingPlan) on the comm stream from time 0
// holds 1 of 100 SMs for its ~1 us (one hop); a 0.1 us memory-bound kernel
// (1e5 bytes at 1000 GB/s) on the compute stream from 0 then ends at
// ceil(1e5 * 100 / 99) = 101011 ps. On the compute stream, or without an
// SM count, the collective does not slow it.
Time kernel_after_all_reduce(const HardwareProfile& p, bool on_compute) {
  Time end = 0;
  Cluster c(p, {.world_size = 2});
  bounded_run(c, [&](Device& d) {
    std::vector<float> x(4, 1.0f);
    collectives::CollOptions o;
    o.after = Event{0};
    if (on_compute) o.stream = &d.compute();
    const collectives::Work w =
        collectives::iall_reduce(d, collectives::ProcessGroup::world(d), collectives::ConstBuffer(x.data(), x.size()),
                                 collectives::Buffer(x.data(), x.size()), collectives::ReduceOp::kSum, o);
    const Time start = on_compute ? d.compute().now() : 0;
    const Time e = d.run(d.compute(), "kernel", OpCost{0, 1e5}) - start;
    if (!on_compute) { EXPECT_GT(d.comm().now(), e) << "the all-reduce outlasts the kernel"; }
    if (d.rank() == 0) end = e;
    w.wait(d.compute());
  });
  return end;
}

TEST(SmContention, AnAllReduceOnTheCommStreamSlowsTheKernelUnderIt) {
  EXPECT_EQ(kernel_after_all_reduce(hundred_sms(), false), 101011);
  EXPECT_EQ(kernel_after_all_reduce(hundred_sms(), true), 100000);
  EXPECT_EQ(kernel_after_all_reduce(testing::simple_profile(), false), 100000);
}

}  // namespace
}  // namespace shardlab
