// Ring broadcast and reduce across nodes run a chain on every channel
// (ring.cc channel_chain_*, tuner.h RingPlan): exact results from every
// root, the same bits under any host schedule, each NIC carrying at most
// its channels' pieces, and a 1 GiB broadcast at the NICs' rate, predicted
// exactly by the tuner. Before, one chain crossed the nodes through one NIC:
// 24.7 GB/s on 2 DGX A100 nodes.
#include <map>
#include <string>

#include "collectives/tuner.h"
#include "runtime/link_model.h"
#include "tests/collectives/test_util.h"

namespace shardlab::collectives::testing {
namespace {

constexpr int kRanks = 16;  // 2 nodes of 8

// Integer inputs: any order of addition gives the same floats, so every
// channel's chain (each summing its piece in its own order) must give the
// serial reference exactly.
void check_rooted(Failures& f, Device& dev, const ProcessGroup& g, size_t count, int root) {
  const CollOptions ring{Algo::kRing, std::nullopt};
  std::vector<float> data = g.rank() == root ? int_inputs(root, count) : std::vector<float>(count, -99.f);
  broadcast(dev, g, data, root, ring);
  check_range(f, fmt::format("broadcast count {} root {} rank {}", count, root, g.rank()), data.data(), count,
              [&](size_t i) { return int_input(root, i); });
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kAvg}) {
    const std::vector<float> in = int_inputs(g.rank(), count, 3);
    std::vector<float> out(g.rank() == root ? count : 0, -99.f);
    reduce(dev, g, in, out, root, op, ring);
    if (g.rank() == root)
      check_range(f, fmt::format("reduce {} count {} root {}", reduce_op_name(op), count, root), out.data(), count,
                  [&](size_t i) { return reference(op, kRanks, i, 3); });
  }
}

TEST(ChainChannels, BroadcastAndReduceAreExactFromEveryRoot) {
  const HardwareProfile p = nodes_of("a100-nvlink", 2);
  ASSERT_EQ(ring_plan(p, first_ranks(kRanks)).channels, 16);
  Failures f;
  run_on(kRanks, [&](Device& dev) {
    const ProcessGroup g = ProcessGroup::world(dev);
    for (size_t count : {size_t{0}, size_t{1}, size_t{15}, size_t{37}, size_t{5003}})
      for (int root : {0, 5, 8, 15}) check_rooted(f, dev, g, count, root);
  }, p);
  f.expect_none();
}

// Interleaved members (8, 0, 9, 1, ...): the plan follows the group order.
TEST(ChainChannels, InterleavedGroupsAreExactToo) {
  Failures f;
  run_on(kRanks, [&](Device& dev) {
    std::vector<int> interleaved;
    for (int i = 0; i < 8; ++i) interleaved.insert(interleaved.end(), {8 + i, i});
    const ProcessGroup g(interleaved, dev.rank());
    ASSERT_FALSE(ring_plan(dev.profile(), g.members()).single());
    check_rooted(f, dev, g, 4099, 3);
  }, nodes_of("a100-nvlink", 2));
  f.expect_none();
}

// The bits and the virtual times do not depend on the host's thread schedule.
TEST(ChainChannels, SameBitsAndTimesUnderAnyHostSchedule) {
  const HardwareProfile p = nodes_of("a100-nvlink", 2);
  auto once = [&](FabricHooks* hooks) {
    std::vector<std::vector<float>> out(kRanks);
    std::vector<Time> end(kRanks);
    run_on(kRanks, [&](Device& dev) {
      const ProcessGroup g = ProcessGroup::world(dev);
      std::vector<float> in(3001), acc(g.rank() == 2 ? in.size() : 0);
      for (size_t i = 0; i < in.size(); ++i) in[i] = 1.0f / float(1 + i + 7 * size_t(g.rank()));  // sums that round
      reduce(dev, g, in, acc, 2, ReduceOp::kSum, {Algo::kRing, std::nullopt});
      broadcast(dev, g, in, 11, {Algo::kRing, std::nullopt});
      out[size_t(dev.rank())] = g.rank() == 2 ? acc : in;
      end[size_t(dev.rank())] = dev.comm().now();
    }, p, hooks);
    return std::make_pair(out, end);
  };
  const auto a = once(nullptr);
  RandomSleeps shake(7);
  const auto b = once(&shake);
  EXPECT_EQ(a.first, b.first);
  EXPECT_EQ(a.second, b.second);
}

// Bytes each node's NICs send across nodes in one phantom broadcast from
// rank 0: channel c leaves node 0 from GPU c mod 8 and node 1 likewise,
// except where the chain ends before the ring's closing hop (node 1's GPU 7
// on channels 7 and 15, whose ring enters node 0 at the root). So every NIC
// carries at most 2 of the 16 pieces: S/8, where one chain put all S on one.
TEST(ChainChannels, EveryNicCarriesAtMostTwoPieces) {
  const HardwareProfile p = nodes_of("a100-nvlink", 2);
  const size_t count = 16 * 1024 * 16;  // 1 MiB of fp32, 16 pieces of 64 KiB
  ClusterOptions opts;
  opts.world_size = kRanks;
  opts.trace = true;
  Cluster cluster(p, opts);
  RunResult r = cluster.run([&](Device& dev) {
    broadcast(dev, ProcessGroup::world(dev), Buffer::phantom(count), 0, {Algo::kRing, std::nullopt});
  });
  std::map<int, uint64_t> bytes;  // node * 100 + NIC
  for (const auto& t : r.traces)
    for (const TraceEvent& e : t.events)
      if (std::string_view(e.name) == "send" && p.node_of(e.peer) != p.node_of(t.rank))
        bytes[p.node_of(t.rank) * 100 + p.nic_of(t.rank)] += e.bytes;
  const uint64_t piece = count * 4 / 16;
  for (int nic = 0; nic < 8; ++nic) {
    EXPECT_EQ(bytes[nic], 2 * piece) << "node 0 NIC " << nic;
    EXPECT_EQ(bytes[100 + nic], nic == 7 ? 0 : 2 * piece) << "node 1 NIC " << nic;
  }
}

// 1 GiB on 2 nodes: every byte enters node 1 through one of its 8 NICs, so
// the NICs' wire rate (24.75 GB/s each after the 42-byte headers of 4 KiB
// packets) bounds algbw (= nccl-tests' busbw for broadcast and reduce) at
// 198 GB/s; the chains' pipeline fill (n + k - 2 chunk times for k = 128
// chunks a channel, 16 hops) costs about 10% of it. The tuner's replay
// gives the same time exactly.
TEST(ChainChannels, OneGibAtTheNicsRateAndPredictedExactly) {
  const HardwareProfile p = nodes_of("a100-nvlink", 2);
  const size_t count = size_t{1} << 28;  // 1 GiB of fp32
  const Link nic = ProfileLinkModel(p).link(0, 8);
  const double bound = 8.0 * double(4096) / to_seconds(nic.wire_time(4096, Engine::kSm)) / 1e9;
  for (OpKind op : {OpKind::kBroadcast, OpKind::kReduce}) {
    ClusterOptions opts;
    opts.world_size = kRanks;
    Cluster cluster(p, opts);
    const RunResult r = cluster.run([&](Device& dev) {
      const ProcessGroup g = ProcessGroup::world(dev);
      const CollOptions o{.algo = Algo::kRing, .proto = Proto::kSimple};
      if (op == OpKind::kBroadcast)
        broadcast(dev, g, Buffer::phantom(count), 0, o);
      else
        reduce(dev, g, Buffer::phantom(count), g.rank() == 0 ? Buffer::phantom(count) : Buffer{}, 0, ReduceOp::kSum, o);
    });
    const double bw = double(count * 4) / to_seconds(r.makespan()) / 1e9;
    fmt::print("{} 1 GiB on 2 DGX A100 nodes: {:.2f} GB/s (NICs' bound {:.2f}, {:.1f}%)\n", op_kind_name(op), bw,
               bound, 100 * bw / bound);
    EXPECT_LE(bw, bound);
    EXPECT_GE(bw, 0.85 * bound) << "not every rail carries the buffer";
    const Time predicted =
        predict_time(p, first_ranks(kRanks), CollShape{op, count, 4, 0, Proto::kSimple}, Algo::kRing);
    EXPECT_EQ(predicted, r.makespan());
  }
}

}  // namespace
}  // namespace shardlab::collectives::testing
