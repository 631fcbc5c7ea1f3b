// all_to_all across nodes in NCCL's p2p order (collectives/tuner.h
// p2p_order): every round a permutation, so each GPU's NIC sends and
// receives its off-node blocks back to back; exact virtual times by hand,
// the nccl-tests figures they stand for, results, folding and the tuner.
#include <set>
#include <string>

#include "collectives/tuner.h"
#include "runtime/link_model.h"
#include "tests/collectives/test_util.h"

namespace shardlab::collectives::testing {
namespace {

TEST(AllToAllNodes, EveryRoundIsAPermutationNodeMajorRailFirst) {
  const HardwareProfile p = nodes_of("a100-nvlink", 4);
  const int n = 32;
  const std::vector<int> members = first_ranks(n);
  std::vector<std::vector<int>> send(n), recv(n);
  for (int r = 0; r < n; ++r) p2p_order(p, members, r, send[size_t(r)], recv[size_t(r)]);
  for (int k = 0; k < n; ++k) {
    std::set<int> to, from;
    for (int r = 0; r < n; ++r) {
      const int t = send[size_t(r)][size_t(k)];
      to.insert(t);
      from.insert(recv[size_t(r)][size_t(k)]);
      // Round k's receiver hears from its round-k sender: r's target lists r as its source.
      EXPECT_EQ(recv[size_t(t)][size_t(k)], r) << "round " << k;
    }
    EXPECT_EQ(to.size(), size_t(n)) << "round " << k << ": two senders share a receiver";
    EXPECT_EQ(from.size(), size_t(n)) << "round " << k;
  }
  // Member 11 (node 1, GPU 3): rounds 0-7 on its node from GPU 3 on, then
  // node deltas 1, 3, 2 (NCCL's quadratic sequence 0, 1, 3, 6 = 2 mod 4),
  // each starting on its own rail (GPU 3 of the node).
  const std::vector<int> want = {11, 12, 13, 14, 15, 8,  9,  10, 19, 20, 21, 22, 23, 16, 17, 18,
                                 3,  4,  5,  6,  7,  0,  1,  2,  27, 28, 29, 30, 31, 24, 25, 26};
  EXPECT_EQ(send[11], want);
  // One node, or one member a node: the flat order me+k / me-k.
  std::vector<int> s, q;
  p2p_order(p, first_ranks(8), 5, s, q);
  EXPECT_EQ(s, (std::vector<int>{5, 6, 7, 0, 1, 2, 3, 4}));
  EXPECT_EQ(q, (std::vector<int>{5, 4, 3, 2, 1, 0, 7, 6}));
  p2p_order(p, std::vector<int>{0, 8, 16, 24}, 1, s, q);
  EXPECT_EQ(s, (std::vector<int>{1, 2, 3, 0}));
  // Interleaved nodes (members 0, 8, 1, 9): not whole blocks, flat.
  p2p_order(p, std::vector<int>{0, 8, 1, 9}, 0, s, q);
  EXPECT_EQ(s, (std::vector<int>{0, 1, 2, 3}));
}

Time all_to_all_time(const HardwareProfile& p, int n, size_t count, std::vector<int> representative = {}) {
  ClusterOptions opts;
  opts.world_size = n;
  opts.representative = std::move(representative);
  Cluster cluster(p, opts);
  RunResult r = cluster.run([&](Device& dev) {
    ProcessGroup g = ProcessGroup::world(dev);
    all_to_all(dev, g, Buffer::phantom(count), Buffer::phantom(count), {Algo::kDirect, std::nullopt});
  });
  return r.makespan();
}

constexpr size_t kGiBCount = (size_t{1} << 30) / 4;  // nccl-tests' 1 GiB of fp32 per rank

// By hand. Each GPU sends its n/8 * 8 - 8 off-node blocks (count/n floats)
// through its own NIC, one per round: the NIC's egress runs them back to
// back from the collective's start L, every receiver's ingress takes one a
// round, and the call ends when the last lands one IB hop a_IB later; the
// on-node blocks go over NVLink meanwhile (7 of 64 MiB at 300 GB/s: 1.6
// ms, under one IB block's 2.7 ms):
//   T = L + (n - 8) * w_IB(count/n * 4 B) + a_IB,
// L = 4 us launch + 8.4 us Simple base, a_IB = 9.6 us + 3 x 2 us proxy
// posts (DGX A100: AMD hosts), w_IB(x) = (x + ceil(x/4096) * 42 B) / 25 GB/s.
//   2 nodes: 64 MiB blocks, 67796992 B on the wire, 2711.87968 us:
//     12.4 + 8 * 2711.87968 + 15.6 = 21723.03744 us
//   4 nodes: 32 MiB, 33898496 B, 1355.93984 us: 12.4 + 24 * 1355.93984 + 15.6 = 32570.55616 us
// Before NCCL's order (me+1, me+2, ... on every member) all eight GPUs of
// node 0 sent their first off-node block to GPU 8 at once, whose ingress
// took them one after another: 2 nodes took 40.7 ms.
TEST(AllToAllNodes, OneGibTakesTheClosedFormExactly) {
  struct Case {
    int nodes;
    Time want_ps;
  };
  for (const Case& c : {Case{2, 21'723'037'440}, Case{4, 32'570'556'160}}) {
    const HardwareProfile p = nodes_of("a100-nvlink", c.nodes);
    const int n = 8 * c.nodes;
    const Link ib = ProfileLinkModel(p).link(0, 8);
    const Engine e = proto_engine(Proto::kSimple);
    const Time closed = collective_start(p, n, Proto::kSimple) +
                        Time(n - 8) * ib.wire_time(kGiBCount / size_t(n) * 4, e) + ib.latency_of(e);
    const Time t = all_to_all_time(p, n, kGiBCount);
    EXPECT_EQ(closed, c.want_ps) << c.nodes << " nodes";
    EXPECT_EQ(t, c.want_ps) << c.nodes << " nodes";
    EXPECT_EQ(t, predict_time(p, first_ranks(n), CollShape{OpKind::kAllToAll, kGiBCount, 4, 0, Proto::kSimple},
                              Algo::kDirect))
        << c.nodes << " nodes";
  }
}

// nccl-tests alltoall_perf: busbw = algbw * (n-1)/n, and across nodes "On 2
// nodes, 50% of the traffic is inter-node so you should see BusBW = 2x
// network bandwidth per GPU. As the number of nodes increases, it will go
// down to 1x [...] N/(N-1)x the bandwidth per GPU" (S. Jeaugey, NCCL's
// lead, nccl-tests#130); per NIC, NCCL's 24 GB/s for HDR ("We usually
// consider 24GB/s is the peak performance per 200G NIC", nccl-tests#119) and
// 46-48 GB/s for NDR (nccl-tests#290; "48-49GB/s per NIC", nccl-tests#267).
TEST(AllToAllNodes, OneGibBusBandwidthIsNodesOverNodesLessOneNics) {
  struct Case {
    const char* profile;
    int nodes;
    double nic_GBps;
  };
  for (const Case& c : {Case{"a100-nvlink", 2, 24.0}, Case{"a100-nvlink", 4, 24.0}, Case{"a100-nvlink", 8, 24.0},
                        Case{"h100-nvlink", 2, 47.0}, Case{"h100-nvlink", 4, 47.0}}) {
    const HardwareProfile p = nodes_of(c.profile, c.nodes);
    const int n = 8 * c.nodes;
    const Time t = all_to_all_time(p, n, kGiBCount);
    const double busbw = double(kGiBCount * 4) / to_seconds(t) / 1e9 * (n - 1) / n;
    const double want = c.nic_GBps * c.nodes / (c.nodes - 1);
    fmt::print("{} x{}: all_to_all 1 GiB busbw {:.2f} GB/s against N/(N-1) x {:.0f} = {:.1f} ({:+.1f}%; bound 10%)\n",
               c.profile, c.nodes, busbw, c.nic_GBps, want, (busbw / want - 1) * 100);
    EXPECT_NEAR(busbw, want, 0.10 * want) << c.profile << " x" << c.nodes;
  }
}

TEST(AllToAllNodes, ResultsAreEveryBlockInItsPlace) {
  // 2 nodes of 4 (a100-nvlink with 4 GPUs a node): block j of member r's
  // output is member j's block r, exactly, in NCCL's order as before.
  HardwareProfile p = nodes_of("a100-nvlink", 2);
  p.devices_per_node = 4;
  const int n = 8;
  const size_t block = 37;
  std::vector<std::vector<float>> got(n);
  run_on(
      n,
      [&](Device& dev) {
        ProcessGroup g = ProcessGroup::world(dev);
        std::vector<float> in(block * n), out(block * n, -1.0f);
        for (size_t i = 0; i < in.size(); ++i) in[i] = float(dev.rank() * 1000 + int(i));
        all_to_all(dev, g, Buffer{in.data(), in.size()}, Buffer{out.data(), out.size()},
                   {Algo::kDirect, std::nullopt});
        got[size_t(dev.rank())] = out;
      },
      p);
  double max_diff = 0;
  for (int r = 0; r < n; ++r)
    for (int j = 0; j < n; ++j)
      for (size_t i = 0; i < block; ++i)
        max_diff = std::max<double>(max_diff, std::abs(got[size_t(r)][size_t(j) * block + i] -
                                                       float(j * 1000 + int(size_t(r) * block + i))));
  fmt::print("all_to_all on 2 nodes of 4: max |difference| {} (tolerance 0)\n", max_diff);
  EXPECT_EQ(max_diff, 0.0);
}

TEST(AllToAllNodes, FoldedEqualsUnfolded) {
  // Nodes 1-3 folded onto node 0 (representative r % 8): the folded replay
  // (collectives/folded.cc) books NCCL's order as the members do.
  const HardwareProfile p = nodes_of("a100-nvlink", 4);
  std::vector<int> rep;
  for (int r = 0; r < 32; ++r) rep.push_back(r % 8);
  const size_t count = 32 * 4099;
  EXPECT_EQ(all_to_all_time(p, 32, count, rep), all_to_all_time(p, 32, count));
}

}  // namespace
}  // namespace shardlab::collectives::testing
