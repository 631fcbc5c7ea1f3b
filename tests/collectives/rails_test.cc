// Channels over every rail (collectives/tuner.h RingPlan): the channel rule,
// which NIC each channel's node-crossing hop uses, exact virtual times, the
// nccl-tests figures they stand for, and unchanged results.
#include <map>
#include <random>
#include <set>
#include <string>
#include <tuple>

#include "collectives/tuner.h"
#include "runtime/link_model.h"
#include "tests/collectives/test_util.h"

namespace shardlab::collectives::testing {
namespace {

TEST(RailsTest, ChannelCountFollowsNcclsRule) {
  // One ring per NIC, duplicated (NCCL graph/search.cc, graph/connect.cc):
  // 2 x rails, at most 32, a multiple of the members per node.
  struct Case {
    const char* profile;
    int nodes, ranks, rails, channels;
  };
  for (const Case& c : {Case{"a100-nvlink", 2, 16, 8, 16}, Case{"a100-nvlink", 8, 64, 8, 16},
                        Case{"a100-nvlink-4nic", 2, 16, 4, 8}, Case{"h100-nvlink", 2, 16, 8, 16}}) {
    const RingPlan plan = ring_plan(nodes_of(c.profile, c.nodes), first_ranks(c.ranks));
    EXPECT_EQ(plan.rails, c.rails) << c.profile << " x" << c.nodes;
    EXPECT_EQ(plan.channels, c.channels) << c.profile << " x" << c.nodes;
  }
  // One node, or one member per node: the single ring in group order.
  EXPECT_TRUE(ring_plan(nodes_of("a100-nvlink", 2), first_ranks(8)).single());
  EXPECT_TRUE(ring_plan(nodes_of("a100-nvlink", 4), std::vector<int>{0, 8, 16, 24}).single());
  // Two members per node, on two NICs: 4 channels; sharing one NIC: 2.
  EXPECT_EQ(ring_plan(nodes_of("a100-nvlink", 2), std::vector<int>{0, 4, 8, 12}).channels, 4);
  EXPECT_EQ(ring_plan(nodes_of("a100-nvlink-4nic", 2), std::vector<int>{0, 1, 8, 9}).channels, 2);
}

TEST(RailsTest, EveryChannelIsARingThatLeavesEachNodeFromAnotherGpu) {
  const HardwareProfile p = nodes_of("a100-nvlink", 2);
  const int n = 16;
  const RingPlan plan = ring_plan(p, first_ranks(n));
  std::set<int> exits;
  for (int c = 0; c < plan.channels; ++c) {
    std::set<int> seen;
    int crossings = 0;
    for (int q = 0; q < n; ++q) {
      const int from = plan.at(c, q, n), to = plan.at(c, q + 1, n);
      seen.insert(from);
      EXPECT_EQ(plan.next(c, from, n), to);
      EXPECT_EQ(plan.prev(c, to, n), from);
      if (p.node_of(from) != p.node_of(to)) {
        ++crossings;
        if (c < 8) exits.insert(p.nic_of(from) + 8 * p.node_of(from));
      }
    }
    EXPECT_EQ(seen.size(), size_t(n)) << "channel " << c;
    EXPECT_EQ(crossings, 2) << "channel " << c;
  }
  // Channels 0..7 leave the two nodes through 16 different NICs.
  EXPECT_EQ(exits.size(), 16u);
}

// Bytes each NIC sends across nodes in one phantom all_reduce, from the trace.
std::map<int, uint64_t> nic_bytes(const HardwareProfile& p, int n, size_t count) {
  ClusterOptions opts;
  opts.world_size = n;
  opts.trace = true;
  Cluster cluster(p, opts);
  RunResult r = cluster.run([&](Device& dev) {
    ProcessGroup g = ProcessGroup::world(dev);
    all_reduce(dev, g, Buffer::phantom(count), ReduceOp::kSum, {Algo::kRing, std::nullopt});
  });
  std::map<int, uint64_t> bytes;  // node * 100 + NIC
  for (const auto& t : r.traces)
    for (const TraceEvent& e : t.events)
      if (std::string_view(e.name) == "send" && p.node_of(e.peer) != p.node_of(t.rank))
        bytes[p.node_of(t.rank) * 100 + p.nic_of(t.rank)] += e.bytes;
  return bytes;
}

TEST(RailsTest, NodeCrossingSendsUseEveryNicEqually) {
  const size_t count = 16 * 16 * 1024;  // 1 MiB of fp32, divisible into 16 x 16 pieces
  for (const char* name : {"a100-nvlink", "a100-nvlink-4nic"}) {
    const HardwareProfile p = nodes_of(name, 2);
    const auto bytes = nic_bytes(p, 16, count);
    ASSERT_EQ(bytes.size(), size_t(2 * p.nic_count())) << name;
    // Ring all_reduce: 2(n-1) steps; every node sends 2(n-1) pieces per
    // channel across (one crossing per node per channel), C channels of
    // count/n/C elements, spread evenly over its NICs.
    const uint64_t per_nic = uint64_t{2 * 15} * count * 4 / 16 / static_cast<uint64_t>(p.nic_count());
    for (const auto& [nic, b] : bytes) EXPECT_EQ(b, per_nic) << name << " node/NIC " << nic;
  }
}

double busbw(const HardwareProfile& p, int n, Time t, uint64_t bytes) {
  return static_cast<double>(bytes) / to_seconds(t) / 1e9 * 2.0 * (n - 1) / n;
}

Time all_reduce_time(const HardwareProfile& p, int n, size_t count) {
  ClusterOptions opts;
  opts.world_size = n;
  Cluster cluster(p, opts);
  RunResult r = cluster.run([&](Device& dev) {
    ProcessGroup g = ProcessGroup::world(dev);
    all_reduce(dev, g, Buffer::phantom(count), ReduceOp::kSum, {Algo::kRing, std::nullopt});
  });
  return r.makespan();
}

// The 1 GiB fp32 ring all_reduce of nccl-tests on `nodes` nodes of 8 GPUs.
constexpr size_t kGiBCount = (size_t{1} << 30) / 4;

// The closed form of the channel ring (tuner.h RingPlan) when the
// node-crossing hops are the bottleneck. Every channel steps on its own
// lane (Ctx::open_lanes), so a GPU's NIC never waits for the other
// channels' hops: the piece a GPU sends across at step k+1 came to it over
// NVLink at step k (it leaves its node on that channel, so its predecessor
// there is on its node), and one NVLink hop (Simple: 3.4 us + w_NV of a
// piece at 300 GB/s) is shorter than the C/k pieces its NIC sends a step.
// So each NIC sends its 2(n-1) x C/k messages of ceil(ceil(count/n)/C)
// elements back to back from the collective's start L (the launch and the
// protocol's base latency), and the op ends when the last of them lands,
// one IB hop latency later:
//   T = L + 2(n-1) * (C/k) * w_IB(ceil(ceil(count/n)/C) * 4 B) + a_IB,
// w_IB at the protocol's share of the GPU's share of its NIC (link_model.h).
// (Before the lanes, every step of every channel waited for the slowest
// channel's IB hop: T was L + 2(n-1) * (a_IB + (C/k) * w_IB).)
Time closed_form(const HardwareProfile& p, int n, size_t count, Proto proto) {
  const RingPlan plan = ring_plan(p, first_ranks(n));
  const Link ib = ProfileLinkModel(p).link(0, p.devices_per_node);
  const size_t slice = (count + size_t(n) - 1) / size_t(n);
  const size_t piece = (slice + size_t(plan.channels) - 1) / size_t(plan.channels);
  const int per_gpu = plan.channels / p.devices_per_node;
  const Engine e = proto_engine(proto);
  return collective_start(p, n, proto) + Time(2 * (n - 1)) * Time(per_gpu) * ib.wire_time(piece * 4, e) +
         ib.latency_of(e);
}

TEST(RailsTest, OneGibAllReduceTakesTheClosedFormExactly) {
  struct Case {
    const char* profile;
    int nodes;
    Time want_ps;
  };
  // NCCL's Simple protocol at 1 GiB (auto's choice: LL128's 0.92 of the
  // rate costs more than its lesser latency): L = 4 us launch + 8.4 us base,
  // a_IB = 9.6 us (NCCL's Simple network hop) + 3 proxy posts (links.inter.
  // proxy_us: DGX A100's AMD hosts 2 us, the 4-NIC nodes' Intel hosts 1 us):
  // 15.6 us and 12.6 us; w_IB(x) = (x + ceil(x/4096) * 42 B) / rate.
  // DGX A100 (16 channels, 2 per GPU, 25 GB/s NICs): piece = 1 GiB / n / 16.
  //   2 nodes: 4 MiB pieces, 4237312 B on the wire, 169.49248 us:
  //     12.4 + 30 * 2 * 169.49248 + 15.6 = 10197.5488 us
  //   4 nodes: 2 MiB, 2118656 B, 84.74624 us: 12.4 + 62 * 2 * 84.74624 + 15.6 = 10536.53376 us
  //   8 nodes: 1 MiB, 1059328 B, 42.37312 us: 12.4 + 126 * 2 * 42.37312 + 15.6 = 10706.02624 us
  // 4-NIC nodes (8 channels, 1 per GPU, 12.5 GB/s each): piece = 1 GiB / n / 8.
  //   2 nodes: 8 MiB, 8474624 B, 677.96992 us: 12.4 + 30 * 677.96992 + 12.6 = 20364.0976 us
  //   4 nodes: 4 MiB, 4237312 B, 338.98496 us: 12.4 + 62 * 338.98496 + 12.6 = 21042.06752 us
  //   8 nodes: 2 MiB, 2118656 B, 169.49248 us: 12.4 + 126 * 169.49248 + 12.6 = 21381.05248 us
  // The NICs' wire time grows with n only as 2(n-1)/n: busbw stays flat with
  // the node count (197.56 GB/s on 2, 4 and 8 DGX A100 nodes), as NCCL's does.
  for (const Case& c : {Case{"a100-nvlink", 2, 10'197'548'800}, Case{"a100-nvlink", 4, 10'536'533'760},
                        Case{"a100-nvlink", 8, 10'706'026'240}, Case{"a100-nvlink-4nic", 2, 20'364'097'600},
                        Case{"a100-nvlink-4nic", 4, 21'042'067'520}, Case{"a100-nvlink-4nic", 8, 21'381'052'480}}) {
    const HardwareProfile p = nodes_of(c.profile, c.nodes);
    const int n = 8 * c.nodes;
    const Time t = all_reduce_time(p, n, kGiBCount);
    EXPECT_EQ(t, c.want_ps) << c.profile << " x" << c.nodes;
    EXPECT_EQ(t, closed_form(p, n, kGiBCount, Proto::kSimple)) << c.profile << " x" << c.nodes;
    EXPECT_EQ(t, predict_time(p, first_ranks(n), CollShape{OpKind::kAllReduce, kGiBCount, 4, 0}, Algo::kRing))
        << c.profile << " x" << c.nodes;
  }
}

// nccl-tests#119's shape: 3 nodes of 8 A100 SXM4 with 4 HDR NICs each
// (a100-nvlink-4nic), all_reduce of 128 MiB, reported peak ~96 GB/s busbw
// (average 84.8 over every size from 8 B, in 1 MiB steps: latency-bound
// sizes included, so not comparable with one size). By hand: n = 24, 8
// channels (2 x 4 rails), one per GPU; slice ceil(33554432/24) = 1398102,
// piece ceil(1398102/8) = 174763 floats = 699052 B, + 171 x 42 B of IB
// headers = 706234 B at the GPU's half of its NIC (12.5 GB/s), 46 of them
// back to back on every GPU's NIC (closed_form above):
//   Simple: 12.4 us + 46 x 56,498,720 ps + 9.6 + 3 x 1 us = 2,623,941,120 ps
//   LL128:  14 us + 46 x ceil(706234e12 / 11.5e9) = 61,411,653 ps + 4.0 + 1 us = 2,843,936,038 ps
// (the last IB hop: NCCL's hop latency and the proxy's posts on these
// nodes' Intel hosts, 1 us each, three under Simple). auto takes Simple:
// busbw 98.0 GB/s, 2.1% over the ~96 peak. (Before the
// channels had lanes of their own, every step waited for an IB hop: LL128,
// 85.10 GB/s, 11.4% under.)
TEST(RailsTest, FourNicNodesAtNcclTests119sShape) {
  const HardwareProfile p = nodes_of("a100-nvlink-4nic", 3);
  const size_t count = (size_t{128} << 20) / 4;
  const Time t = all_reduce_time(p, 24, count);
  EXPECT_EQ(t, 2'623'941'120);
  EXPECT_EQ(t, closed_form(p, 24, count, Proto::kSimple));
  EXPECT_EQ(closed_form(p, 24, count, Proto::kLL128), 2'843'936'038);
  const double bw = busbw(p, 24, t, count * 4);
  fmt::print("a100-nvlink-4nic x3, 128 MiB: model {:.2f} GB/s busbw, nccl-tests#119 peak ~96 ({:+.1f}%)\n", bw,
             (bw / 96.0 - 1) * 100);
  EXPECT_NEAR(bw, 96.0, 0.10 * 96.0);
}

// nccl-tests all_reduce_perf busbw at 1 GiB, the public figures (README
// "Collectives across nodes"). Separate from the exact times above: these
// are the model's agreement with hardware, to within 10%.
TEST(RailsTest, OneGibBusBandwidthIsWithinTenPercentOfPublicFigures) {
  struct Case {
    const char* profile;
    int nodes;
    double public_GBps;
    const char* source;
  };
  for (const Case& c : {
           Case{"a100-nvlink", 1, 232.54, "nccl-tests#175: one A100 SXM node, 232.54 GB/s"},
           Case{"a100-nvlink", 2, 192.0, "NVIDIA/nccl#812: DGX A100, 8x200Gb/s IB, 192 GB/s"},
           Case{"a100-nvlink", 4, 192.0, "NVIDIA/nccl#812 (NCCL's ring busbw does not fall with nodes)"},
           Case{"a100-nvlink", 8, 192.0, "NVIDIA/nccl#812 (NCCL's ring busbw does not fall with nodes)"},
           // NCCL's own model for 4 HDR NICs: 4 channels x 24 GB/s (nccl#1048 "theoretical value (96 GB/s)").
           // Measured on that system: 86 GB/s; the model is 14% above it (README: not met).
           Case{"a100-nvlink-4nic", 2, 96.0, "NVIDIA/nccl#1048: NCCL's figure for 4 HDR NICs"},
           // Measured: two HGX A100 with four ConnectX-6 200 Gb/s, 1-8 GiB, "91GB/s in busbw" (model +8.7%).
           Case{"a100-nvlink-4nic", 2, 91.0, "nccl-tests#100: 2 HGX A100, 4 x 200 Gb/s, 91 GB/s"},
           // One DGX H100 node over NVLink 4 / NVSwitch: "~370 GB/s" (model 357.8, -3.3%).
           Case{"h100-nvlink", 1, 370.0, "nccl-tests#212: one 8-GPU H100 SXM node, ~370 GB/s"},
           // "For NDR @ 400Gbps you should see 46-48GB/s per NIC" (AddyLaddy, nccl-tests#290): 8 x 47.
           Case{"h100-nvlink", 2, 376.0, "nccl-tests#290: 8 NDR NICs x 46-48 GB/s"},
           Case{"h100-nvlink", 4, 376.0, "nccl-tests#290: 8 NDR NICs x 46-48 GB/s"},
           Case{"h100-nvlink", 8, 376.0, "nccl-tests#290: 8 NDR NICs x 46-48 GB/s"},
       }) {
    const HardwareProfile p = nodes_of(c.profile, c.nodes);
    const int n = 8 * c.nodes;
    const double bw = busbw(p, n, all_reduce_time(p, n, kGiBCount), kGiBCount * 4);
    fmt::print("{} x{}: {:.2f} GB/s against {:.1f} ({:+.1f}%; bound 10%)\n", c.profile, c.nodes, bw, c.public_GBps,
               (bw / c.public_GBps - 1) * 100);
    EXPECT_NEAR(bw, c.public_GBps, 0.10 * c.public_GBps) << c.profile << " x" << c.nodes << ": " << c.source;
  }
}

// Another 4-NIC node, not a built-in profile: NVIDIA/nccl#1368, 5 nodes of
// 8 H100 with 4 x 400 Gb/s RoCE NICs (NCCL_IB_HCA lists four), ring
// all_reduce_perf up to 1 GiB: "ring bandwidth (190GB/s)". h100-nvlink with
// its NICs shared by GPU pairs as a100-nvlink-4nic's are (each NIC 50 GB/s,
// RoCE's framing not modeled apart from InfiniBand's): 8 channels, two per
// NIC, busbw 197.5 (+3.9%), as NCCL's ring busbw is the node's NICs' sum
// (4 x 47.5 measured). The same issue's tree (150 GB/s) is not checked:
// the tree runs only on --algo dbtree here (README).
TEST(RailsTest, FourNicH100NodesAtNccl1368sRing) {
  HardwareProfile p = nodes_of("h100-nvlink", 5);
  p.nics = {{0, 1}, {2, 3}, {4, 5}, {6, 7}};
  EXPECT_EQ(ring_plan(p, first_ranks(40)).channels, 8);
  const double bw = busbw(p, 40, all_reduce_time(p, 40, kGiBCount), kGiBCount * 4);
  fmt::print("h100-nvlink, 4 NICs a node, x5: {:.2f} GB/s busbw, NVIDIA/nccl#1368 190 ({:+.1f}%)\n", bw,
             (bw / 190.0 - 1) * 100);
  EXPECT_NEAR(bw, 197.5, 0.05);
  EXPECT_NEAR(bw, 190.0, 0.10 * 190.0);
}

TEST(RailsTest, BusBandwidthDoesNotFallWithTheNodeCount) {
  // closed_form: busbw = S * 2(n-1)/n / (L + 2(n-1)(C/k) w_IB(S/(nC)) + a_IB)
  // ~ S / (n (C/k) w_IB(S/(nC))), and n * w_IB(S/(nC)) does not depend on n
  // (S/(nC) stays a multiple of the 4096 B packet here): from 2 to 8 nodes
  // busbw changes only by the start and the last hop, L + a_IB = 28 us of
  // ~10.2 ms on DGX A100 and ~5.1 ms on DGX H100: under 0.1%. Stepping
  // together, 8 DGX A100 nodes gave 7.6% less than 2.
  for (const char* name : {"a100-nvlink", "h100-nvlink"}) {
    const double two = busbw(nodes_of(name, 2), 16, all_reduce_time(nodes_of(name, 2), 16, kGiBCount), kGiBCount * 4);
    const double eight = busbw(nodes_of(name, 8), 64, all_reduce_time(nodes_of(name, 8), 64, kGiBCount), kGiBCount * 4);
    fmt::print("{}: 1 GiB busbw {:.2f} GB/s on 2 nodes, {:.2f} on 8 (max difference {:.3f}%)\n", name, two, eight,
               (two - eight) / two * 100);
    EXPECT_NEAR(eight, two, 1e-3 * two) << name;
  }
}

TEST(RailsTest, FoldedMembersReplayTheChannelsExactly) {
  // Node 1's GPUs folded onto node 0's (representative r % 8): every
  // collective on the 16-rank group goes through run_folded, which replays
  // the channels; the times equal the unfolded run's, rank by rank, and so
  // do the comm streams' busy time (the unfolded run merges its channel
  // lanes' spans into the stream, Ctx::finish; the folded one marks the
  // replayed spans) and, traced, the transfers each running rank records.
  const HardwareProfile p = nodes_of("a100-nvlink-4nic", 2);
  struct Out {
    std::vector<Time> ends, busy;
    std::vector<std::vector<std::tuple<std::string, Time, Time, uint64_t, int>>> events;
    bool operator==(const Out&) const = default;
  };
  auto run = [&](bool fold, bool trace) {
    ClusterOptions opts;
    opts.world_size = 16;
    opts.trace = trace;
    if (fold)
      for (int r = 0; r < 16; ++r) opts.representative.push_back(r % 8);
    Cluster cluster(p, opts);
    RunResult r = cluster.run([&](Device& dev) {
      ProcessGroup g = ProcessGroup::world(dev);
      const CollOptions ring{Algo::kRing, std::nullopt};
      all_reduce(dev, g, Buffer::phantom(3 << 20), ReduceOp::kSum, ring);
      const size_t count = 16 * 4099;
      reduce_scatter(dev, g, Buffer::phantom(count), Buffer::phantom(count / 16), ReduceOp::kSum, ring);
      all_gather(dev, g, Buffer::phantom(count / 16), Buffer::phantom(count), ring);
      all_reduce(dev, g, Buffer::phantom(12345), ReduceOp::kSum, ring);
    });
    Out out;
    for (int rank = 0; rank < 8; ++rank) {  // the ranks that run in both
      out.ends.push_back(r.devices[size_t(rank)].end());
      out.busy.push_back(r.devices[size_t(rank)].comm_busy);
    }
    for (const auto& t : r.traces) {
      if (t.rank >= 8) continue;
      auto& ev = out.events.emplace_back();
      for (const TraceEvent& e : t.events) ev.emplace_back(e.name, e.start, e.end, e.bytes, e.peer);
    }
    return out;
  };
  const Out unfolded = run(false, false);
  EXPECT_EQ(run(true, false), unfolded);
  const Out traced = run(false, true);
  EXPECT_EQ(run(true, true), traced);
  EXPECT_EQ(traced.ends, unfolded.ends);  // tracing changes no time
  EXPECT_EQ(traced.busy, unfolded.busy);
  ASSERT_EQ(traced.events.size(), 8u);
  for (const auto& ev : traced.events) EXPECT_GT(ev.size(), 100u);  // 4 calls x 2 x 30 steps x 2 channels
}

TEST(RailsTest, ChannelsLeaveSumsOfIntegersBitForBitAsOneRing) {
  // Integer inputs: every order of addition gives the same floats, so the
  // channel ring's result equals the serial reference (and the single ring's).
  const int n = 16;
  const size_t count = 5003;  // uneven over 16 members and over 16 channels
  Failures f;
  run_on(n, [&](Device& dev) {
    ProcessGroup g = ProcessGroup::world(dev);
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
      std::vector<float> x = int_inputs(dev.rank(), count);
      all_reduce(dev, g, x, op, {Algo::kRing, std::nullopt});
      check_range(f, fmt::format("all_reduce {} rank {}", reduce_op_name(op), dev.rank()), x.data(), count,
                  [&](size_t i) { return reference(op, n, i); });
      std::vector<float> in = int_inputs(dev.rank(), count, 1);
      const Range mine = chunk_range(count, n, g.rank());
      std::vector<float> part(size_t(mine.size));
      reduce_scatter(dev, g, in, part, op, {Algo::kRing, std::nullopt});
      check_range(f, fmt::format("reduce_scatter rank {}", dev.rank()), part.data(), part.size(),
                  [&](size_t i) { return reference(op, n, size_t(mine.begin) + i, 1); });
    }
    std::vector<float> out(count);
    const Range mine = chunk_range(count, n, g.rank());
    std::vector<float> own(out.begin(), out.begin());
    for (int64_t i = mine.begin; i < mine.end(); ++i) own.push_back(int_input(dev.rank(), size_t(i)));
    all_gather(dev, g, own, out, {Algo::kRing, std::nullopt});
    check_range(f, fmt::format("all_gather rank {}", dev.rank()), out.data(), count, [&](size_t i) {
      for (int r = 0; r < n; ++r)
        if (chunk_range(count, n, r).contains(int64_t(i))) return int_input(r, i);
      return 0.f;
    });
  }, nodes_of("a100-nvlink", 2));
  f.expect_none();
}

TEST(RailsTest, GroupsInAnyOrderAndSubsetsOfNodesReduceCorrectly) {
  // Members interleaved across nodes (8, 0, 9, 1, ...) and a data-parallel-like
  // group of 4 GPUs on each of 2 nodes: member i still owns chunk i.
  const int n = 16;
  const size_t count = 997;
  Failures f;
  run_on(n, [&](Device& dev) {
    std::vector<int> interleaved;
    for (int i = 0; i < 8; ++i) interleaved.insert(interleaved.end(), {8 + i, i});
    const ProcessGroup g(interleaved, dev.rank());
    ASSERT_EQ(ring_plan(dev.profile(), g.members()).channels, 16);
    std::vector<float> x = int_inputs(g.rank(), count);
    all_reduce(dev, g, x, ReduceOp::kSum, {Algo::kRing, std::nullopt});
    check_range(f, fmt::format("interleaved rank {}", dev.rank()), x.data(), count,
                [&](size_t i) { return reference(ReduceOp::kSum, n, i); });
    if (dev.rank() % 2 == 0) {  // ranks 0, 2, 4, 6 and 8, 10, 12, 14
      std::vector<int> even;
      for (int r = 0; r < n; r += 2) even.push_back(r);
      const ProcessGroup h(even, dev.rank());
      ASSERT_EQ(ring_plan(dev.profile(), h.members()).channels, 8);
      const Range mine = chunk_range(count, h.size(), h.rank());
      std::vector<float> in = int_inputs(h.rank(), count, 2), part(size_t(mine.size));
      reduce_scatter(dev, h, in, part, ReduceOp::kSum, {Algo::kRing, std::nullopt});
      check_range(f, fmt::format("even rank {}", dev.rank()), part.data(), part.size(),
                  [&](size_t i) { return reference(ReduceOp::kSum, h.size(), size_t(mine.begin) + i, 2); });
    }
  }, nodes_of("a100-nvlink", 2));
  f.expect_none();
}

TEST(RailsTest, ChannelResultsAreTheSameBitsOnEveryMemberAndEveryRun) {
  // Random floats (order matters): every member holds the same bits, and a
  // second run gives them again.
  const int n = 16;
  auto run = [&] {
    std::vector<std::vector<float>> results(static_cast<size_t>(n));
    run_on(n, [&](Device& dev) {
      ProcessGroup g = ProcessGroup::world(dev);
      std::mt19937 rng(static_cast<uint32_t>(dev.rank()));
      std::uniform_real_distribution<float> u(-1, 1);
      std::vector<float> x(4099);
      for (float& v : x) v = u(rng);
      all_reduce(dev, g, x, ReduceOp::kSum, {Algo::kRing, std::nullopt});
      results[static_cast<size_t>(dev.rank())] = x;
    }, nodes_of("a100-nvlink-4nic", 2));
    return results;
  };
  const auto first = run();
  for (size_t r = 1; r < first.size(); ++r) EXPECT_EQ(first[r], first[0]) << "rank " << r;
  EXPECT_EQ(run(), first);
}

}  // namespace
}  // namespace shardlab::collectives::testing
