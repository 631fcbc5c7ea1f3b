// NCCL's double binary tree all_reduce across nodes (Algo::kDbtree,
// collectives/dbtree.cc, tuner.h TreePlan): the node trees against NCCL's
// trees.cc, the channels' chains and NICs, exact virtual times derived by
// hand, the tuner's prediction equal to the run, deterministic results equal
// to the ring's, and folded runs equal to unfolded ones.
#include <atomic>
#include <chrono>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <tuple>

#include "collectives/tuner.h"
#include "runtime/link_model.h"
#include "tests/collectives/test_util.h"

namespace shardlab::collectives::testing {
namespace {

// GPU 0 of each of `nodes` nodes of 8: one member per node.
std::vector<int> one_per_node(int nodes) {
  std::vector<int> v;
  for (int i = 0; i < nodes; ++i) v.push_back(8 * i);
  return v;
}

CollOptions dbtree_opts(Proto proto = Proto::kAuto) {
  CollOptions o;
  o.algo = Algo::kDbtree;
  o.proto = proto;
  return o;
}

// Runs one all_reduce of `count` phantom elements on `members` of a cluster
// of p.nodes x 8 GPUs; returns the latest member's end.
Time run_time(const HardwareProfile& p, const std::vector<int>& members, size_t count, const CollOptions& opt) {
  ClusterOptions opts;
  opts.world_size = p.nodes * p.devices_per_node;
  Cluster cluster(p, opts);
  std::vector<Time> ends(static_cast<size_t>(opts.world_size), 0);
  cluster.run([&](Device& dev) {
    const auto it = std::find(members.begin(), members.end(), dev.rank());
    if (it == members.end()) return;
    ProcessGroup g(members, dev.rank(), "dp");
    all_reduce(dev, g, Buffer::phantom(count), ReduceOp::kSum, opt);
    ends[size_t(dev.rank())] = dev.now();
  });
  return *std::max_element(ends.begin(), ends.end());
}

TEST(DbtreeTest, NodeTreesAreNcclsDoubleBinaryTree) {
  // NCCL trees.cc's illustration, 12 ranks: 0 - 8; 8: 4, 10; 4: 2, 6; 2: 1, 3;
  // 6: 5, 7; 10: 9, 11 (the root has one child, its child 1).
  struct Want {
    int rank, up, d0, d1;
  };
  for (const Want& w : {Want{0, -1, -1, 8}, Want{8, 0, 4, 10}, Want{4, 8, 2, 6}, Want{2, 4, 1, 3},
                        Want{6, 4, 5, 7}, Want{10, 8, 9, 11}, Want{1, 2, -1, -1}, Want{11, 10, -1, -1}}) {
    const BtreeNode b = btree(12, w.rank);
    EXPECT_EQ(std::tie(b.up, b.d0, b.d1), std::tie(w.up, w.d0, w.d1)) << "rank " << w.rank;
  }
  // 14 ranks: 12's parent would be 16, out of range: 8; 12's children 10 and 13 (12 + 1, as 14 is out).
  EXPECT_EQ(btree(14, 12).up, 8);
  EXPECT_EQ(btree(14, 12).d0, 10);
  EXPECT_EQ(btree(14, 12).d1, 13);
  // Tree 1, even count: the mirror (rank plays 11 - rank): root 11, its child 3.
  EXPECT_EQ(dtree(12, 11, 1).up, -1);
  EXPECT_EQ(dtree(12, 11, 1).d1, 3);
  EXPECT_EQ(dtree(12, 3, 1).up, 11);
  // Odd count: shifted by one: 13 ranks, root 1 with child 9; 0 plays 12 (parent 8 + 1 = 9).
  EXPECT_EQ(dtree(13, 1, 1).up, -1);
  EXPECT_EQ(dtree(13, 1, 1).d1, 9);
  EXPECT_EQ(dtree(13, 0, 1).up, 9);
  // Each tree spans the nodes; with an even count no node is interior in
  // both trees (NCCL's point: each node's NIC forwards one tree's traffic).
  for (int N = 2; N <= 33; ++N) {
    int both = 0;
    for (int t = 0; t < 2; ++t) {
      int roots = 0, edges = 0;
      for (int v = 0; v < N; ++v) {
        const BtreeNode b = dtree(N, v, t);
        roots += b.up < 0;
        for (int d : {b.d0, b.d1})
          if (d >= 0) {
            ++edges;
            EXPECT_EQ(dtree(N, d, t).up, v) << N << " nodes, tree " << t;
          }
      }
      EXPECT_EQ(roots, 1) << N;
      EXPECT_EQ(edges, N - 1) << N;
    }
    for (int v = 0; v < N; ++v) {
      const BtreeNode a = dtree(N, v, 0), b = dtree(N, v, 1);
      both += (a.d0 >= 0 || a.d1 >= 0) && (b.d0 >= 0 || b.d1 >= 0);
    }
    if (N % 2 == 0) {
      EXPECT_EQ(both, 0) << N << " nodes";
    }
  }
}

TEST(DbtreeTest, ChannelsChainEveryNodeAndCrossOnTheChainsFirstTwoGpus) {
  const HardwareProfile p = nodes_of("a100-nvlink", 4);
  const int n = 32;
  const TreePlan plan = tree_plan(p, first_ranks(n));
  // h = min(2 x 8 rails, 32) / 2 = 8 channels per tree (a multiple of 8 GPUs).
  ASSERT_EQ(plan.channels, 16);
  std::set<int> heads;
  for (int c = 0; c < plan.channels; ++c) {
    const int s = c % 8;  // the chain starts at local GPU s
    for (int i = 0; i < n; ++i) {
      const int up = plan.parent(c, i, n);
      if (up < 0) continue;
      if (p.node_of(up) == p.node_of(i)) {
        EXPECT_EQ((i - up + 8) % 8, 1) << "channel " << c << ": the chain runs s, s+1, ...";
      } else {
        // Crossing: leaves from the chain's head, enters at its head or second GPU.
        EXPECT_EQ(i % 8, s) << "channel " << c;
        EXPECT_TRUE(up % 8 == s || up % 8 == (s + 1) % 8) << "channel " << c;
        if (c < 8) heads.insert(i);
      }
    }
    EXPECT_EQ(plan.root_height[size_t(c)], plan.height[size_t(c * n + (c < 8 ? s : 24 + s))]) << c;
  }
  // Tree 0's crossings leave nodes 1-3 from all 8 GPUs of each: every NIC.
  EXPECT_EQ(heads.size(), 24u);
  // One member per node: two channels (one per tree); one node: no plan.
  EXPECT_EQ(tree_plan(p, one_per_node(4)).channels, 2);
  EXPECT_FALSE(tree_plan(p, first_ranks(8)).applies());
  EXPECT_FALSE(tree_plan(p, std::vector<int>{0, 1, 8}).applies());  // uneven
}

// a100-nvlink under NCCL's Simple protocol (profile "protocols"): the
// collective starts L = 4 us launch + 8.4 us base latency after the call;
// an IB hop has latency a = 9.6 us (NCCL's Simple network hop) + 3 x 2 us
// (the proxy's three posts on DGX A100's AMD hosts, links.inter.proxy_us) =
// 15.6 us, and a message of x bytes holds a port
// for w(x) = (x + ceil(x / 4096) * 42 B headers) / 25 GB/s (one 200 Gb/s
// NIC per GPU). One member per node: C = 2 channels, tree 0 (root node 0)
// and tree 1 (root the mirror's node N-1), each half the buffer.
constexpr Time kL = 12'400'000, kA = 15'600'000;
Time w_ib(uint64_t bytes) {
  const uint64_t wire = bytes + (bytes + 4095) / 4096 * 42;
  return static_cast<Time>((wire * 1'000'000'000'000ull + 25'000'000'000ull - 1) / 25'000'000'000ull);
}

TEST(DbtreeTest, TwoAndFourNodesTakeTheirHandDerivedTimes) {
  const CollOptions simple = dbtree_opts(Proto::kSimple);
  // The profile's figures the derivation uses.
  const HardwareProfile p2 = nodes_of("a100-nvlink", 2);
  const Link ib = ProfileLinkModel(p2).link(0, 8);
  ASSERT_EQ(ib.latency_of(proto_engine(Proto::kSimple)), kA);
  ASSERT_EQ(collective_start(p2, 2, Proto::kSimple), kL);
  ASSERT_EQ(ib.wire_time(2048, proto_engine(Proto::kSimple)), w_ib(2048));

  // 2 nodes, 1024 floats: 512 per channel, one chunk of 2048 B. Node 0
  // sends tree 1's half up at L while node 1 sends tree 0's; each root adds
  // at L + a + w and sends back down: T = L + 2a + 2w(2048 B).
  {
    const Time want = kL + 2 * kA + 2 * w_ib(2048);
    EXPECT_EQ(want, 43'767'200);
    const std::vector<int> m = one_per_node(2);
    EXPECT_EQ(run_time(p2, m, 1024, simple), want);
    EXPECT_EQ(predict_time(p2, m, {OpKind::kAllReduce, 1024, 4, 0, Proto::kSimple}, Algo::kDbtree), want);
  }
  // 2 nodes, 2^20 floats: 2 MiB per channel in 4 chunks of 512 KiB. The
  // leaf's sends of the chunks leave back to back (L + j w) and reach the
  // root at L + a + (j+1) w; the root's sends down leave from L + a + 4w
  // back to back and the last lands at L + 2a + 8w.
  {
    const Time want = kL + 2 * kA + 8 * w_ib(512 * 1024);
    EXPECT_EQ(want, 213'092'480);
    const std::vector<int> m = one_per_node(2);
    EXPECT_EQ(run_time(p2, m, size_t{1} << 20, simple), want);
    EXPECT_EQ(predict_time(p2, m, {OpKind::kAllReduce, size_t{1} << 20, 4, 0, Proto::kSimple}, Algo::kDbtree),
              want);
  }
  // 4 nodes, 1024 floats (one chunk of 2048 B per channel). Tree 0: 0 - 2,
  // 2: 1, 3; tree 1 (mirror): 3 - 1, 1: 2, 0. Every node is a leaf of one
  // tree and sends up at L. An interior node takes its two children's
  // messages one after the other on its ingress port (L + a + w, L + a + 2w)
  // and sends the sum up: it reaches the root at L + 2a + 3w; the root sends
  // down at once, the interior node has it at L + 3a + 4w and sends it to
  // its two children back to back: the second lands at L + 4a + 6w.
  {
    const HardwareProfile p4 = nodes_of("a100-nvlink", 4);
    const Time want = kL + 4 * kA + 6 * w_ib(2048);
    EXPECT_EQ(want, 75'301'600);
    const std::vector<int> m = one_per_node(4);
    EXPECT_EQ(run_time(p4, m, 1024, simple), want);
    EXPECT_EQ(predict_time(p4, m, {OpKind::kAllReduce, 1024, 4, 0, Proto::kSimple}, Algo::kDbtree), want);
  }
}

TEST(DbtreeTest, TunerPredictsEveryRunToThePicosecond) {
  struct Case {
    const char* profile;
    int nodes;
    std::vector<int> members;
  };
  const std::vector<Case> cases = {
      {"a100-nvlink", 2, first_ranks(16)},
      {"a100-nvlink", 3, {0, 4, 8, 12, 16, 20}},  // odd: the shifted tree; 2 per node on 2 NICs
      {"a100-nvlink-4nic", 2, {0, 1, 2, 3, 8, 9, 10, 11}},
      {"a100-nvlink", 5, one_per_node(5)},
      {"h100-nvlink", 4, first_ranks(32)},
  };
  for (const Case& c : cases) {
    const HardwareProfile p = nodes_of(c.profile, c.nodes);
    for (size_t count : {size_t{1}, size_t{1000}, size_t{77777}, size_t{3} << 20})
      for (Proto q : {Proto::kLL, Proto::kLL128, Proto::kSimple}) {
        const Time want = predict_time(p, c.members, {OpKind::kAllReduce, count, 4, 0, q}, Algo::kDbtree);
        EXPECT_EQ(run_time(p, c.members, count, dbtree_opts(q)), want)
            << c.profile << " x" << c.nodes << " " << c.members.size() << " members, " << count << " "
            << proto_name(q);
      }
  }
}

TEST(DbtreeTest, SumsOfIntegersEqualTheRingsBitForBit) {
  const HardwareProfile p = nodes_of("a100-nvlink", 3);
  const std::vector<int> members = {0, 3, 8, 11, 16, 19};
  const int n = 6;
  const size_t count = 5003;  // uneven over the channels and chunks
  Failures f;
  ClusterOptions opts;
  opts.world_size = 24;
  Cluster cluster(p, opts);
  cluster.run([&](Device& dev) {
    if (std::find(members.begin(), members.end(), dev.rank()) == members.end()) return;
    ProcessGroup g(members, dev.rank(), "dp");
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kAvg}) {
      std::vector<float> x = int_inputs(g.rank(), count), ring = x;
      all_reduce(dev, g, x, op, dbtree_opts());
      all_reduce(dev, g, ring, op, {Algo::kRing, std::nullopt});
      check_range(f, fmt::format("dbtree {} member {}", reduce_op_name(op), g.rank()), x.data(), count,
                  [&](size_t i) { return reference(op, n, i); });
      if (std::memcmp(x.data(), ring.data(), count * sizeof(float)) != 0 && op != ReduceOp::kAvg)
        f.add(fmt::format("dbtree {} member {}: bits differ from the ring's", reduce_op_name(op), g.rank()));
    }
  });
  f.expect_none();
}
TEST(DbtreeTest, RandomFloatsGiveIdenticalBitsOnEveryMemberAndEveryRun) {
  // Random floats (the order of addition matters), 16 ranks on 2 nodes.
  const HardwareProfile p = nodes_of("a100-nvlink", 2);
  const size_t count = 40'000;  // 2500 per channel, 1 chunk; uneven over none but exercised below
  auto run = [&](uint64_t seed) {
    RandomSleeps sleeps(seed);
    std::vector<std::vector<float>> out(16);
    std::vector<Time> ends(16);
    run_on(16, [&](Device& dev) {
      ProcessGroup g = ProcessGroup::world(dev);
      std::mt19937 rng(static_cast<uint32_t>(dev.rank() * 7919 + 1));
      std::normal_distribution<float> normal;
      std::vector<float> x(count + 7);
      for (float& v : x) v = normal(rng);
      all_reduce(dev, g, x, ReduceOp::kSum, dbtree_opts());
      out[size_t(dev.rank())] = x;
      ends[size_t(dev.rank())] = dev.now();
    }, p, &sleeps);
    return std::make_pair(out, ends);
  };
  const auto first = run(1);
  for (int r = 1; r < 16; ++r)
    EXPECT_EQ(std::memcmp(first.first[size_t(r)].data(), first.first[0].data(), (count + 7) * sizeof(float)), 0)
        << "member " << r;
  for (uint64_t seed : {2, 3}) EXPECT_EQ(run(seed), first) << "seed " << seed;
}

TEST(DbtreeTest, OnlyAllReduceAcrossNodesRunsIt) {
  const HardwareProfile p = nodes_of("a100-nvlink", 2);
  EXPECT_THROW(predict_time(p, first_ranks(8), {OpKind::kAllReduce, 1000, 4, 0}, Algo::kDbtree), ConfigError);
  EXPECT_THROW(predict_time(p, first_ranks(16), {OpKind::kAllGather, 1600, 4, 0}, Algo::kDbtree), ConfigError);
  // auto, even asked, skips it there.
  EXPECT_NE(select(p, first_ranks(8), {OpKind::kAllReduce, 1000, 4, 0, Proto::kAuto, true}).algo, Algo::kDbtree);
}

TEST(DbtreeTest, FoldingRefusesItAndAutoLeavesItOutUnlessAsked) {
  // Node 1's GPUs folded onto node 0's (representative r % 8): a tree's
  // members end at different times, so run_folded refuses an explicit
  // dbtree with one clear error; auto, not asked to weigh dbtree, takes the
  // same algorithm folded and unfolded, so their times stay equal.
  const HardwareProfile p = nodes_of("a100-nvlink", 8);
  auto run = [&](bool fold, const CollOptions& opt) {
    ClusterOptions opts;
    opts.world_size = 64;
    if (fold)
      for (int r = 0; r < 64; ++r) opts.representative.push_back(r % 8);
    Cluster cluster(p, opts);
    RunResult r = cluster.run([&](Device& dev) {
      ProcessGroup g = ProcessGroup::world(dev);
      all_reduce(dev, g, Buffer::phantom(4096), ReduceOp::kSum, opt);
    });
    std::vector<Time> ends;
    for (int rank = 0; rank < 8; ++rank) ends.push_back(r.devices[size_t(rank)].end());
    return ends;
  };
  try {
    run(true, dbtree_opts());
    ADD_FAILURE() << "a folded dbtree ran";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("(dbtree)"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("not foldable"), std::string::npos) << e.what();
  }
  EXPECT_EQ(run(true, {}), run(false, {}));
  // Asked (CollShape::dbtree), auto takes dbtree here: 16 KiB on 8 nodes.
  const CollShape asked{OpKind::kAllReduce, 4096, 4, 0, Proto::kAuto, true};
  EXPECT_EQ(select(p, first_ranks(64), asked).algo, Algo::kDbtree);
  EXPECT_NE(select(p, first_ranks(64), {OpKind::kAllReduce, 4096, 4, 0}).algo, Algo::kDbtree);
}

}  // namespace
}  // namespace shardlab::collectives::testing
