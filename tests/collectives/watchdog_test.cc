// A collective that cannot complete is a deadlock the watchdog reports,
// naming who waits for whom, instead of a hang: one member skips an
// all_reduce, or two groups are entered in mismatched orders. bounded_run
// turns a hang (a watchdog that missed it) into a loud failure.
#include <string>
#include <vector>

#include "support/bounded_run.h"
#include "tests/collectives/test_util.h"

namespace shardlab::collectives::testing {
namespace {

using shardlab::testing::bounded_run;

// Runs the program, expects the watchdog's RunError and returns its message.
// `rendezvous`: ClusterOptions::rendezvous (false: the collectives' messages).
std::string deadlock_message(int n, const Cluster::Program& program, bool rendezvous = true) {
  ClusterOptions opts;
  opts.world_size = n;
  opts.rendezvous = rendezvous;
  opts.watchdog_period = std::chrono::milliseconds(20);
  Cluster cluster(uniform_profile(n), opts);
  try {
    bounded_run(cluster, program);
  } catch (const RunError& e) {
    EXPECT_EQ(e.rank(), -1) << "a deadlock is nobody's exception: " << e.what();
    EXPECT_FALSE(e.input_error()) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "the run completed: no deadlock reported";
  return "";
}

bool has(const std::string& m, const std::string& s) { return m.find(s) != std::string::npos; }

TEST(Watchdog, AMemberSkippingAnAllReduceIsReportedAsADeadlock) {
  // Ring over 0 -> 1 -> 2 -> 3 -> 0: member 3 returns without joining, so 0
  // never hears from its left neighbour 3, and 1, 2 stall behind 0 and 1.
  const std::string m = deadlock_message(4, [](Device& dev) {
    ProcessGroup g = ProcessGroup::world(dev);
    if (dev.rank() == 3) return;  // the bug under test: skips the collective
    std::vector<float> x = int_inputs(dev.rank(), 64);
    all_reduce(dev, g, x, ReduceOp::kSum, {Algo::kRing, std::nullopt});
  }, /*rendezvous=*/false);
  std::printf("[watchdog] %s\n", m.c_str());
  EXPECT_TRUE(has(m, "deadlock")) << m;
  EXPECT_TRUE(has(m, "device 0 waits for a message from device 3")) << m;
  EXPECT_TRUE(has(m, "which has finished")) << m;
  EXPECT_TRUE(has(m, "device 1 waits for a message from device 0")) << m;
  EXPECT_TRUE(has(m, "device 2 waits for a message from device 1")) << m;
  EXPECT_FALSE(has(m, "device 3 waits")) << m;
}

TEST(Watchdog, AMemberSkippingAMeetingIsReportedAsADeadlock) {
  // The same bug with the collectives' rendezvous (collectives/rendezvous.h):
  // 0, 1 and 2 sleep at the meeting, and each names the member that never
  // came, whatever order they arrived in.
  const std::string m = deadlock_message(4, [](Device& dev) {
    ProcessGroup g = ProcessGroup::world(dev);
    if (dev.rank() == 3) return;
    std::vector<float> x = int_inputs(dev.rank(), 64);
    all_reduce(dev, g, x, ReduceOp::kSum, {Algo::kRing, std::nullopt});
  });
  std::printf("[watchdog] %s\n", m.c_str());
  for (int r = 0; r < 3; ++r)
    EXPECT_TRUE(has(m, fmt::format("device {} waits for a message from device 3", r))) << m;
  EXPECT_TRUE(has(m, "which has finished")) << m;
  EXPECT_FALSE(has(m, "device 3 waits")) << m;
}

TEST(Watchdog, GroupsEnteredInMismatchedOrderAreReportedAsADeadlock) {
  // tp=2 x dp=2: tp groups {0,1} {2,3}, dp groups {0,2} {1,3}. Devices 0 and 3
  // all_reduce over tp then dp, devices 1 and 2 over dp then tp: each waits
  // for a partner that is inside the other group, a cycle 0 -> 1 -> 3 -> 2 -> 0.
  const std::string m = deadlock_message(4, [](Device& dev) {
    DeviceMesh mesh(MeshShape{.tp = 2, .dp = 2});
    ProcessGroup tp = mesh.group(dev.rank(), "tp"), dp = mesh.group(dev.rank(), "dp");
    std::vector<float> x = int_inputs(dev.rank(), 64);
    const bool tp_first = dev.rank() == 0 || dev.rank() == 3;
    for (const ProcessGroup* g : tp_first ? std::vector{&tp, &dp} : std::vector{&dp, &tp}) {
      all_reduce(dev, *g, x, ReduceOp::kSum, {Algo::kRing, std::nullopt});
    }
  });
  std::printf("[watchdog] %s\n", m.c_str());
  EXPECT_TRUE(has(m, "deadlock: every live device is blocked")) << m;
  EXPECT_TRUE(has(m, "device 0 waits for a message from device 1")) << m;
  EXPECT_TRUE(has(m, "device 1 waits for a message from device 3")) << m;
  EXPECT_TRUE(has(m, "device 3 waits for a message from device 2")) << m;
  EXPECT_TRUE(has(m, "device 2 waits for a message from device 0")) << m;
  EXPECT_FALSE(has(m, "which has finished")) << m;
}

TEST(Watchdog, TheSameProgramInMatchingOrderCompletes) {
  // Control for the test above: same groups, same order on every device.
  Failures f;
  ClusterOptions opts;
  opts.world_size = 4;
  opts.watchdog_period = std::chrono::milliseconds(20);
  Cluster cluster(uniform_profile(4), opts);
  bounded_run(cluster, [&](Device& dev) {
    DeviceMesh mesh(MeshShape{.tp = 2, .dp = 2});
    ProcessGroup tp = mesh.group(dev.rank(), "tp"), dp = mesh.group(dev.rank(), "dp");
    std::vector<float> x = int_inputs(dev.rank(), 64);
    all_reduce(dev, tp, x, ReduceOp::kSum, {Algo::kRing, std::nullopt});
    all_reduce(dev, dp, x, ReduceOp::kSum, {Algo::kRing, std::nullopt});
    check_range(f, "tp then dp", x.data(), x.size(), [](size_t i) { return reference(ReduceOp::kSum, 4, i); });
  });
  f.expect_none();
}

}  // namespace
}  // namespace shardlab::collectives::testing
