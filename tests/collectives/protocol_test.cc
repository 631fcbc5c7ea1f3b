// NCCL's protocols (LL, LL128, Simple) as the profile's "protocols" give them
// (runtime/profile_protocols.cc, NCCL's graph/tuning.cc): every message of a
// collective takes its protocol's hop latency and its share of the link's
// rate, the collective its launch and the protocol's base latency. Expected
// times are derived by hand from those rules (tolerance 0: integer
// picoseconds); the small-message comparison with public nccl-tests figures
// states its tolerance.
#include <numeric>

#include <nlohmann/json.hpp>

#include "collectives/bench.h"
#include "collectives/tuner.h"
#include "runtime/link_model.h"
#include "tests/collectives/test_util.h"

namespace shardlab::collectives::testing {
namespace {

// DGX A100 with NCCL's protocols (every built-in profile carries them): the
// collective's launch is the kernel launch alone (4 us, as every kernel's),
// the protocol adds its start.
HardwareProfile nccl_a100() { return load_profile("a100-nvlink"); }

// Every built-in profile runs NCCL's protocols, LL128 only on NVLink nodes,
// after a 4 us launch.
TEST(ProtocolTest, BuiltInProfilesCarryNcclsProtocols) {
  for (const HardwareProfile& p : builtin_profiles()) {
    const bool pcie = p.name == "a100-pcie" || p.name == "a100-pcie-8";
    const std::vector<ProtocolSpec> want = nccl_protocols(pcie);
    ASSERT_EQ(p.protocols.size(), want.size()) << p.name;
    for (size_t q = 0; q < want.size(); ++q) {
      EXPECT_EQ(p.protocols[q].base_latency_us, want[q].base_latency_us) << p.name;
      for (int c = 0; c < kNumLinkClasses; ++c) {
        EXPECT_EQ(p.protocols[q].hop_latency_us[c], want[q].hop_latency_us[c]) << p.name;
        EXPECT_EQ(p.protocols[q].bw_share[c], want[q].bw_share[c]) << p.name;
      }
    }
    EXPECT_EQ(p.protocols[1].usable(LinkClass::kIntra), !pcie) << p.name;
    EXPECT_EQ(p.device.collective_launch_us, 4.0) << p.name;
  }
}

Time run_all_reduce(const HardwareProfile& p, int n, size_t count, Algo algo, Proto proto) {
  CollOptions opt{algo, std::nullopt};
  opt.proto = proto;
  const RunResult r = run_on(
      n, [&](Device& dev) { all_reduce(dev, ProcessGroup::world(dev), Buffer::phantom(count), ReduceOp::kSum, opt); },
      p);
  return r.makespan();
}

// Ring all_reduce of 32 KiB (8192 floats) over the 8 GPUs of one DGX A100:
// 14 steps of a 4096-byte chunk, 4096 + 32 x 32 = 5120 bytes on NVLink.
//   LL:     start 4 + 3.6 us;  a 0.47 us; w = 5120 B / (300 GB/s x 1/4)  = 68266.67 -> 68267 ps
//   LL128:  start 4 + 10 us;   a 1.9 us;  w = 5120 B / (300 GB/s x 0.92) = 18550.72 -> 18551 ps
//   Simple: start 4 + 8.4 us;  a 3.4 us;  w = 5120 B / 300 GB/s          = 17066.67 -> 17067 ps
// T = start + 14 (a + w).
TEST(ProtocolTest, RingAllReduceTakesEachProtocolsLatencyAndRate) {
  const HardwareProfile p = nccl_a100();
  struct Case {
    Proto proto;
    Time want;
  };
  for (const Case& c : {Case{Proto::kLL, 7'600'000 + 14 * (470'000 + 68'267)},
                        Case{Proto::kLL128, 14'000'000 + 14 * (1'900'000 + 18'551)},
                        Case{Proto::kSimple, 12'400'000 + 14 * (3'400'000 + 17'067)}}) {
    const Time t = run_all_reduce(p, 8, 8192, Algo::kRing, c.proto);
    EXPECT_EQ(t, c.want) << proto_name(c.proto);
    CollShape s{OpKind::kAllReduce, 8192, 4, 0, c.proto};
    EXPECT_EQ(predict_time(p, first_ranks(8), s, Algo::kRing), t) << proto_name(c.proto);
    fmt::print("ring all_reduce 32 KiB on 8 A100, {}: {} ps (by hand {} ps)\n", proto_name(c.proto), t, c.want);
  }
}

// Across nodes the inter-node hops take the network's latency: 2 GPUs on two
// nodes, all_reduce of 8 floats by the ring, Simple: 2 steps of one 16-byte
// chunk over InfiniBand (16 + 42 header bytes = 58 B at 25 GB/s: 2320 ps),
// a = 9.6 us: T = 4 + 8.4 + 2 (9.6 us + 2320 ps).
TEST(ProtocolTest, InterNodeHopsTakeTheNetworksLatency) {
  HardwareProfile p = nccl_a100();
  p.devices_per_node = 1;
  p.nodes = 2;
  EXPECT_EQ(run_all_reduce(p, 2, 8, Algo::kRing, Proto::kSimple), 12'400'000 + 2 * (9'600'000 + 2'320));
}

// auto picks the protocol with the algorithm: LL for a few bytes (least
// latency), LL128 in the middle (1.5 us less per NVLink hop than Simple for
// 8% of the bandwidth), Simple for large buffers (full bandwidth). Each
// choice is also the least of the nine predicted times.
TEST(ProtocolTest, AutoPicksLLThenLL128ThenSimpleAsSizeGrows) {
  const HardwareProfile p = nccl_a100();
  const std::vector<int> m = first_ranks(8);
  struct Case {
    size_t count;
    Proto want;
  };
  for (const Case& c : {Case{2, Proto::kLL}, Case{size_t{1} << 18, Proto::kLL128}, Case{size_t{1} << 26, Proto::kSimple}}) {
    const CollShape s{OpKind::kAllReduce, c.count, 4, 0};
    const Choice best = select(p, m, s);
    EXPECT_EQ(best.proto, c.want) << c.count;
    for (Algo a : candidate_algos(s.op))
      for (Proto q : candidate_protos(p, m)) {
        if (a == Algo::kDbtree && !dbtree_applies(p, m, s)) continue;  // one node: auto never weighs it
        CollShape one = s;
        one.proto = q;
        EXPECT_LE(best.time, predict_time(p, m, one, a)) << c.count << " " << algo_name(a) << " " << proto_name(q);
      }
    EXPECT_EQ(run_all_reduce(p, 8, c.count, Algo::kAuto, Proto::kAuto), best.time) << c.count;
    fmt::print("auto, {} B on 8 A100: {} {}, {:.3f} us\n", c.count * 4, algo_name(best.algo), proto_name(best.proto),
               to_us(best.time));
  }
}

// LL128 is NCCL's only over NVLink: a PCIe node offers LL and Simple.
TEST(ProtocolTest, PcieNodesHaveNoLL128) {
  const HardwareProfile pcie = load_profile("a100-pcie-8");
  EXPECT_EQ(candidate_protos(pcie, first_ranks(8)), (std::vector<Proto>{Proto::kLL, Proto::kSimple}));
  // Across nodes alone (one GPU of each of two nodes) the NIC carries LL128.
  EXPECT_EQ(candidate_protos(pcie, std::vector<int>{0, 8}),
            (std::vector<Proto>{Proto::kLL, Proto::kLL128, Proto::kSimple}));
  EXPECT_EQ(candidate_protos(nccl_a100(), first_ranks(8)),
            (std::vector<Proto>{Proto::kLL, Proto::kLL128, Proto::kSimple}));
  // Every built-in profile carries NCCL's protocols; a profile without them plain sends alone.
  EXPECT_EQ(candidate_protos(load_profile("a100-nvlink"), first_ranks(8)),
            (std::vector<Proto>{Proto::kLL, Proto::kLL128, Proto::kSimple}));
  EXPECT_EQ(candidate_protos(load_profile("a100-pcie"), first_ranks(8)), (std::vector<Proto>{Proto::kLL, Proto::kSimple}));
  EXPECT_EQ(candidate_protos(uniform_profile(8), first_ranks(8)), std::vector<Proto>{Proto::kPlain});
}

// The JSON form round-trips, and a bad field is one line naming it.
TEST(ProtocolTest, ProfileJsonCarriesTheProtocols) {
  const HardwareProfile p = nccl_a100();
  nlohmann::json j = profile_to_json(p);
  EXPECT_DOUBLE_EQ(j["protocols"]["LL128"]["intra"]["bw_share"].get<double>(), 0.92);
  const HardwareProfile back = profile_from_json(j, "test");
  ASSERT_EQ(back.protocols.size(), 3u);
  EXPECT_EQ(back.protocols[1].hop_latency_us[1], 4.0);
  nlohmann::json bad = j;
  bad["protocols"]["LL"]["inter"]["bw_share"] = 2;
  EXPECT_THROW(
      {
        try {
          profile_from_json(bad, "test");
        } catch (const ConfigError& e) {
          EXPECT_STREQ(e.what(), "profile test: field \"protocols.LL.inter.bw_share\" must be a number in [0, 1]");
          throw;
        }
      },
      ConfigError);
  bad = j;
  bad["protocols"]["LL"]["intra"]["latency"] = 1;
  EXPECT_THROW(profile_from_json(bad, "test"), ConfigError);
  bad = j;
  bad["protocols"].erase("Simple");
  EXPECT_THROW(profile_from_json(bad, "test"), ConfigError);
}

// Small-message latency against public nccl-tests figures. The one at hand:
// all_reduce of 32 B on 2 A100 SXM4 over NVLink takes 10.1 us (NVIDIA/nccl#583).
// The model: auto runs direct LL, start 4 + 3.6 us, one hop of 0.47 us and a
// 64-byte LL wire message (854 ps): 8.070854 us. Tolerance 25%: the model
// leaves out the host's loop between nccl-tests' back-to-back launches.
TEST(ProtocolTest, SmallMessageLatencyNearPublicFigures) {
  const HardwareProfile p = nccl_a100();
  const Time t = run_all_reduce(p, 2, 8, Algo::kAuto, Proto::kAuto);
  EXPECT_EQ(t, 7'600'000 + 470'000 + 854);
  const double measured_us = 10.1;
  const double err = to_us(t) / measured_us - 1;
  fmt::print("all_reduce 32 B on 2 A100: model {:.3f} us, nccl-tests 10.1 us (NVIDIA/nccl#583): {:+.1f}% (tolerance 25%)\n",
             to_us(t), err * 100);
  EXPECT_LE(std::abs(err), 0.25);
}

// README "Small-message latency": all_reduce of 8 B to 64 KiB on one DGX
// A100 node (8 GPUs) and on two (16), auto's choice. Below 32 KiB on one
// node and 8 KiB on two, auto runs direct LL: every member posts its buffer
// to the n-1 others at once, so the time is the start L (4 us launch + LL's
// 3.6 us) plus the slowest port's queue: on one node the NVLink egress and
// ingress each carry n-1 = 7 messages, L + a_NV + 7 w_NV(S) exactly (LL's
// hops: 0.47 us NVLink, 2.7 us network; w at LL's quarter of the rate, its
// 8-byte flag per 8 bytes of data, the link's packet headers). On two
// nodes each NIC sends and receives 8 messages, but a member takes its
// receives in group order (r-1, r-2, ...), not in arrival order, so the
// time lies between the NIC's 8 messages and all 15 in a row:
// L + a_IB + 8 w_IB(S) <= T <= L + a_IB + 15 w_IB(S); the tuner's replay
// gives it exactly.
TEST(ProtocolTest, SmallMessageLatencyTableIsDirectLLByHand) {
  const HardwareProfile one = nccl_a100();
  HardwareProfile two = nccl_a100();
  two.nodes = 2;
  const ProfileLinkModel links(two);
  const Link nv = links.link(0, 1), ib = links.link(0, 8);
  const Engine ll = proto_engine(Proto::kLL);
  const Time L = collective_start(one, 8, Proto::kLL);
  EXPECT_EQ(L, 7'600'000);
  fmt::print("| size | 1 node (8 GPUs) | time (us) | 2 nodes (16 GPUs) | time (us) |\n");
  for (size_t bytes = 8; bytes <= 64 * 1024; bytes *= 2) {
    const size_t count = bytes / 4;
    const Time t1 = run_all_reduce(one, 8, count, Algo::kAuto, Proto::kAuto);
    const Time t2 = run_all_reduce(two, 16, count, Algo::kAuto, Proto::kAuto);
    const CollShape shape{OpKind::kAllReduce, count, 4, 0};
    const Choice c1 = select(one, std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}, shape);
    std::vector<int> sixteen(16);
    std::iota(sixteen.begin(), sixteen.end(), 0);
    const Choice c2 = select(two, sixteen, shape);
    fmt::print("| {} B | {}, {} | {:.2f} | {}, {} | {:.2f} |\n", bytes, algo_name(c1.algo), proto_name(c1.proto),
               to_us(t1), algo_name(c2.algo), proto_name(c2.proto), to_us(t2));
    EXPECT_EQ(t1, c1.time) << bytes;
    EXPECT_EQ(t2, c2.time) << bytes;
    if (bytes < 32 * 1024) {
      EXPECT_EQ(c1.algo, Algo::kDirect) << bytes;
      EXPECT_EQ(c1.proto, Proto::kLL) << bytes;
      EXPECT_EQ(t1, L + nv.latency_of(ll) + 7 * nv.wire_time(bytes, ll)) << bytes << " B on one node";
    }
    if (bytes < 8 * 1024) {
      EXPECT_EQ(c2.algo, Algo::kDirect) << bytes;
      EXPECT_EQ(c2.proto, Proto::kLL) << bytes;
      EXPECT_GE(t2, L + ib.latency_of(ll) + 8 * ib.wire_time(bytes, ll)) << bytes << " B on two nodes";
      EXPECT_LE(t2, L + ib.latency_of(ll) + 15 * ib.wire_time(bytes, ll)) << bytes << " B on two nodes";
    }
  }
}

// nccl-tests#150: all_reduce_perf on 2 nodes of A100 80GB, one GPU each, HDR
// InfiniBand: 8 B 19.90 us, 16 B 20.67, 32 B 19.16, 64 B 19.36 (out of
// place). The model (direct LL, one message each way): L + a_IB + w_IB(S) =
// 7.6 + 2.7 us + a few ns, about 10.3 us: half the measured time. NCCL's
// tuning-model latencies (what the profile takes) price the algorithms
// against each other; the measured time also holds the network proxy's
// work (a CPU thread posts every network send and polls its completion)
// and the host's loop between nccl-tests' launches, neither modeled.
// Recorded here, not hidden (README "Small-message latency").
TEST(ProtocolTest, TwoNodesOneGpuEachSmallMessagesAgainstNcclTests150) {
  HardwareProfile p = nccl_a100();
  p.nodes = 2;
  const Link ib = ProfileLinkModel(p).link(0, 8);
  const Engine ll = proto_engine(Proto::kLL);
  const struct {
    size_t bytes;
    double measured_us;
  } rows[] = {{8, 19.90}, {16, 20.67}, {32, 19.16}, {64, 19.36}};
  for (const auto& r : rows) {
    ClusterOptions opts;
    opts.world_size = 16;
    Cluster cluster(p, opts);
    const RunResult res = cluster.run([&](Device& dev) {
      if (dev.rank() % 8 != 0) return;
      const ProcessGroup g(std::vector<int>{0, 8}, dev.rank());
      all_reduce(dev, g, Buffer::phantom(r.bytes / 4), ReduceOp::kSum, {});
    });
    const Time t = res.makespan();
    EXPECT_EQ(t, 7'600'000 + ib.latency_of(ll) + ib.wire_time(r.bytes, ll)) << r.bytes;
    const double err = to_us(t) / r.measured_us - 1;
    fmt::print("all_reduce {} B, 2 nodes x 1 A100: model {:.2f} us, nccl-tests#150 {:.2f} us ({:+.0f}%)\n", r.bytes,
               to_us(t), r.measured_us, err * 100);
    EXPECT_LT(to_us(t), r.measured_us);  // what is left out only adds time
  }
}

}  // namespace
}  // namespace shardlab::collectives::testing
