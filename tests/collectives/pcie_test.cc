// The PCIe tree of an 8x A100 PCIe server (profile a100-pcie-8, runtime
// "pcie"): which links a message crosses, a collective step's share of the
// shared ones, and the ring all_reduce it gives, every expected value
// derived by hand from those rules (tolerance 0: integer picoseconds).
#include <numeric>

#include "collectives/tuner.h"
#include "runtime/link_model.h"
#include "tests/collectives/test_util.h"

namespace shardlab::collectives::testing {
namespace {

// GPUs {0,1} {2,3} behind switches 0, 1 on socket 0; {4,5} {6,7} behind
// switches 2, 3 on socket 1. GPU links and uplinks 32 GB/s, sockets 16 GB/s.
TEST(PcieTreeTest, PathsTakeTheirSlowestLink) {
  const HardwareProfile p = load_profile("a100-pcie-8");
  const ProfileLinkModel links(p);
  EXPECT_EQ(links.link(0, 1).bytes_per_second, 32'000'000'000u);  // one switch
  EXPECT_EQ(links.link(1, 2).bytes_per_second, 32'000'000'000u);  // two uplinks of 32 GB/s
  EXPECT_EQ(links.link(3, 4).bytes_per_second, 16'000'000'000u);  // the inter-socket link
  EXPECT_EQ(links.link(7, 0).bytes_per_second, 16'000'000'000u);
  EXPECT_EQ(links.link(0, 1).port, LinkClass::kIntra);
  // Across nodes: the NIC of the GPU's switch, shared by its pair (12.5 GB/s each).
  EXPECT_EQ(links.link(0, 8).bytes_per_second, 12'500'000'000u);
  EXPECT_EQ(links.link(0, 8).port, LinkClass::kInter);
}

TEST(PcieTreeTest, AStepSharesEachSharedLinkBetweenTheFlowsCrossingIt) {
  const ProfileLinkModel links(load_profile("a100-pcie-8"));
  const std::vector<int> all = first_ranks(8);
  // The ring (distance 1): 3 -> 4 is the only flow from socket 0 to 1.
  EXPECT_EQ(links.shared_rate(3, 4, all, 1), 16'000'000'000u);
  EXPECT_EQ(links.shared_rate(1, 2, all, 1), 32'000'000'000u);
  EXPECT_EQ(links.shared_rate(0, 1, all, 1), 0u);  // inside a switch: nothing shared
  // Distance 2: 0 -> 2 and 1 -> 3 both leave switch 0 (16 each); 2 -> 4 and
  // 3 -> 5 both cross the sockets (8 each).
  EXPECT_EQ(links.shared_rate(0, 2, all, 2), 16'000'000'000u);
  EXPECT_EQ(links.shared_rate(2, 4, all, 2), 8'000'000'000u);
  // Distance 4 (the tree's first halving step): all four GPUs of socket 0
  // cross to socket 1 at once, 4 GB/s each.
  EXPECT_EQ(links.shared_rate(0, 4, all, 4), 4'000'000'000u);
  EXPECT_EQ(links.shared_rate(5, 1, all, 4), 4'000'000'000u);
  // Another node's flows do not share this node's links.
  EXPECT_EQ(links.shared_rate(0, 8, first_ranks(16), 8), 0u);
  // A profile without a tree: no cap.
  EXPECT_EQ(ProfileLinkModel(load_profile("a100-pcie")).shared_rate(3, 4, all, 1), 0u);
}

Time ring_all_reduce_time(const HardwareProfile& p, int n, size_t count) {
  ClusterOptions opts;
  opts.world_size = n;
  Cluster cluster(p, opts);
  RunResult r = cluster.run([&](Device& dev) {
    all_reduce(dev, ProcessGroup::world(dev), Buffer::phantom(count), ReduceOp::kSum, {Algo::kRing, std::nullopt});
  });
  return r.makespan();
}

// Ring all_reduce of S bytes over the 8 GPUs in order 0..7 crosses the
// sockets twice (3 -> 4, 7 -> 0). Those two hops run at 16 GB/s, the others
// at 32, so GPUs 3 and 7 keep their egress busy: each sends 2(n-1) = 14
// messages back to back from the start L, and the last lands a later:
//   T = L + 14 w16(S/8) + a,  w16(x) = (x + ceil(x/128) * 24 B) / 16 GB/s.
// NCCL's Simple protocol (the least time at these sizes; PCIe has no
// LL128): L = 4 us launch + 8.4 us base, a = 5.7 us (PCIe hop), full rate.
// 1 GiB: x = 134217728 B, 159383552 B on the wire, 9961.472 us each:
//   12.4 us + 14 * 9961.472 us + 5.7 us = 139478.708 us.
// 128 MiB: x = 16777216 B, 19922944 B on the wire, 1245.184 us each:
//   12.4 + 14 * 1245.184 + 5.7 = 17450.676 us.
TEST(PcieTreeTest, RingAllReduceIsBoundByTheInterSocketHops) {
  const HardwareProfile p = load_profile("a100-pcie-8");
  struct Case {
    size_t bytes;
    Time want_ps;
  };
  for (const Case& c : {Case{size_t{1} << 30, 139'478'708'000}, Case{size_t{128} << 20, 17'450'676'000}}) {
    const size_t count = c.bytes / 4;
    const Time t = ring_all_reduce_time(p, 8, count);
    EXPECT_EQ(t, c.want_ps) << c.bytes;
    const CollShape s{OpKind::kAllReduce, count, 4, 0};
    EXPECT_EQ(predict_time(p, first_ranks(8), s, Algo::kRing), t) << c.bytes;
    // The tree's halving step at distance 4 shares the inter-socket link
    // four ways: auto keeps NCCL's ring on this box.
    EXPECT_EQ(select_algo(p, first_ranks(8), s), Algo::kRing) << c.bytes;
    fmt::print("a100-pcie-8 ring all_reduce {} B: {} ps (by hand {} ps), busbw {:.2f} GB/s\n", c.bytes, t,
               c.want_ps, double(c.bytes) / double(t) * 1e12 / 1e9 * 14.0 / 8.0);
  }
}

// The tuner's replay charges the same caps as the run, for every algorithm,
// op and size, inside the node and across two of them: tolerance 0.
TEST(PcieTreeTest, PredictionEqualsTheRunForEveryAlgorithm) {
  HardwareProfile p = load_profile("a100-pcie-8");
  Time worst = 0;
  int cases = 0;
  for (int n : {4, 8, 16}) {
    for (size_t count : {size_t{3}, size_t{1000}, size_t{1} << 18, size_t{3'000'001}}) {
      for (OpKind op : {OpKind::kAllReduce, OpKind::kReduceScatter, OpKind::kAllGather, OpKind::kBroadcast}) {
        for (Algo a : {Algo::kRing, Algo::kTree, Algo::kDirect}) {
          const CollShape s{op, count - count % size_t(n) + size_t(n), 4, 0};
          ClusterOptions opts;
          opts.world_size = n;
          Cluster cluster(p, opts);
          RunResult r = cluster.run([&](Device& dev) {
            ProcessGroup g = ProcessGroup::world(dev);
            const CollOptions o{a, std::nullopt};
            const size_t part = s.count / size_t(n);
            if (op == OpKind::kAllReduce) all_reduce(dev, g, Buffer::phantom(s.count), ReduceOp::kSum, o);
            if (op == OpKind::kReduceScatter)
              reduce_scatter(dev, g, Buffer::phantom(s.count), Buffer::phantom(part), ReduceOp::kSum, o);
            if (op == OpKind::kAllGather) all_gather(dev, g, Buffer::phantom(part), Buffer::phantom(s.count), o);
            if (op == OpKind::kBroadcast) broadcast(dev, g, Buffer::phantom(s.count), 0, o);
          });
          Time end = 0;
          for (const auto& d : r.devices) end = std::max(end, d.comm_end);
          const Time want = predict_time(p, first_ranks(n), s, a);
          worst = std::max(worst, std::abs(want - end));
          EXPECT_EQ(end, want) << n << " ranks " << op_kind_name(op) << " " << s.count << " " << algo_name(a);
          ++cases;
        }
      }
    }
  }
  fmt::print("a100-pcie-8: {} cases, max |predicted - run| {} ps (tolerance 0)\n", cases, worst);
}

TEST(PcieTreeTest, FoldingRefusesGroupsInsideATree) {
  // Members of one node see different paths: the folded replay is refused
  // (train() then runs unfolded), one line naming the tree.
  const HardwareProfile p = load_profile("a100-pcie-8");
  ClusterOptions opts;
  opts.world_size = 8;
  for (int r = 0; r < 8; ++r) opts.representative.push_back(r % 4);
  Cluster cluster(p, opts);
  try {
    cluster.run([&](Device& dev) {
      all_reduce(dev, ProcessGroup::world(dev), Buffer::phantom(1024), ReduceOp::kSum, {Algo::kRing, std::nullopt});
    });
    ADD_FAILURE() << "folding over a PCIe tree ran";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("PCIe tree"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace shardlab::collectives::testing
