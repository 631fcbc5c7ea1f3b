// The tuner (collectives/tuner.h): its predicted time of every algorithm
// equals the virtual time of running it, and auto's measured time is the
// least of the explicit algorithms', for groups inside a node, across two
// nodes and strided over four, sizes from 4 B to 256 MiB, on the built-in
// profiles. Tolerance 0: the prediction replays the fabric's own integer
// port clocks, so any difference is a modelling bug.
#include "collectives/tuner.h"

#include <map>
#include <numeric>

#include "tests/collectives/test_util.h"

namespace shardlab::collectives::testing {
namespace {

// A replay comparison's name for its failure messages.
std::string replay_case(int n, OpKind op, Algo algo, size_t count, Proto proto, int me) {
  return std::to_string(n) + " members, op " + std::to_string(int(op)) + " algo " + std::to_string(int(algo)) +
         " count " + std::to_string(count) + " proto " + std::to_string(int(proto)) + " me " + std::to_string(me);
}

constexpr OpKind kOpsTuned[] = {OpKind::kAllReduce, OpKind::kReduceScatter, OpKind::kAllGather,
                                OpKind::kBroadcast, OpKind::kReduce,        OpKind::kAllToAll};
// nvls only where it applies (an all_reduce inside one node of an NVLS
// profile): elsewhere its predicted and measured times are -1, not compared.
constexpr Algo kExplicit[] = {Algo::kRing, Algo::kTree, Algo::kDirect, Algo::kNvls};
constexpr int kNumExplicit = 4;
// 4 B to 256 MiB in steps of 8x, plus a count no group size divides.
constexpr uint64_t kSizes[] = {4,       32,      256,      2 << 10,   16 << 10, 128 << 10,
                               1 << 20, 8 << 20, 64 << 20, 256 << 20, 1000004};

struct GroupCase {
  std::string name;
  int world;
  std::vector<int> members;
};

std::vector<int> iota_members(int n) {
  std::vector<int> m(static_cast<size_t>(n));
  std::iota(m.begin(), m.end(), 0);
  return m;
}

// The built-in profiles have 8 devices per node.
std::vector<GroupCase> group_cases() {
  return {{"2", 2, iota_members(2)},
          {"4", 4, iota_members(4)},
          {"6", 6, iota_members(6)},
          {"8", 8, iota_members(8)},
          {"16 (2 nodes)", 16, iota_members(16)},
          {"4 (4 nodes)", 32, {0, 8, 16, 24}}};
}

CollShape shape_for(OpKind op, uint64_t bytes, int n, Precision precision) {
  const int esize = element_size(precision);
  size_t count = std::max<size_t>(1, bytes / static_cast<uint64_t>(esize));
  const auto un = static_cast<size_t>(n);
  if (op == OpKind::kAllToAll) count = std::max(un, count - count % un);  // equal blocks
  return {op, count, esize, n - 1};                                       // root: the last member
}

// One collective on phantom buffers.
void run_one(Device& dev, const ProcessGroup& g, const CollShape& s, Algo algo) {
  const CollOptions opt{algo, std::nullopt};
  const auto part = static_cast<size_t>(chunk_range(s.count, g.size(), g.rank()).size);
  const Buffer full = Buffer::phantom(s.count);
  switch (s.op) {
    case OpKind::kAllReduce:
      return all_reduce(dev, g, full, ReduceOp::kSum, opt);
    case OpKind::kReduceScatter:
      return reduce_scatter(dev, g, full, Buffer::phantom(part), ReduceOp::kSum, opt);
    case OpKind::kAllGather:
      return all_gather(dev, g, Buffer::phantom(part), full, opt);
    case OpKind::kBroadcast:
      return broadcast(dev, g, full, s.root, opt);
    case OpKind::kReduce:
      return reduce(dev, g, full, g.rank() == s.root ? full : Buffer{}, s.root, ReduceOp::kSum,
                    opt);
    case OpKind::kAllToAll:
      return all_to_all(dev, g, full, Buffer::phantom(s.count), opt);
    case OpKind::kBarrier:
      return barrier(dev, g, opt);
  }
}

// Virtual time of one collective on a fresh cluster: the latest member's
// comm-stream end (every member starts at 0 on idle ports).
Time measure(const HardwareProfile& p, const GroupCase& gc, Precision precision, const CollShape& s,
             Algo algo) {
  ClusterOptions opts;
  opts.world_size = gc.world;
  opts.precision = precision;
  Cluster cluster(p, opts);
  std::vector<Time> ends(static_cast<size_t>(gc.world), 0);
  cluster.run([&](Device& dev) {
    if (std::find(gc.members.begin(), gc.members.end(), dev.rank()) == gc.members.end()) return;
    ProcessGroup g(gc.members, dev.rank(), "g");
    run_one(dev, g, s, algo);
    ends[static_cast<size_t>(dev.rank())] = dev.comm().now();
  });
  return *std::max_element(ends.begin(), ends.end());
}

// One (group, op, size): predicted and measured time of each explicit
// algorithm, and auto's pick and measured time.
struct Row {
  std::string group;
  OpKind op;
  uint64_t bytes;
  Time predicted[kNumExplicit], measured[kNumExplicit];
  Algo pick;
  Time auto_measured;
  // An all_reduce on a group spanning nodes: auto does not weigh direct
  // (NCCL has no direct all_reduce; tuner.cc select).
  bool no_direct = false;
};

struct Param {
  const char* profile;
  Precision precision;
};

// Computed once per parameter, shared by the tests below.
const std::vector<Row>& grid(const Param& prm) {
  static std::map<std::string, std::vector<Row>> cache;
  const std::string key = fmt::format("{}/{}", prm.profile, static_cast<int>(prm.precision));
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  const HardwareProfile p = load_profile(prm.profile);
  std::vector<Row> rows;
  for (const GroupCase& gc : group_cases()) {
    for (OpKind op : kOpsTuned) {
      for (uint64_t bytes : kSizes) {
        const CollShape s =
            shape_for(op, bytes, static_cast<int>(gc.members.size()), prm.precision);
        Row r{gc.name, op, bytes, {}, {}, select_algo(p, gc.members, s), 0};
        for (int a = 0; a < kNumExplicit; ++a) {
          const bool runs = kExplicit[a] != Algo::kNvls || nvls_applies(p, gc.members, s);
          r.predicted[a] = runs ? predict_time(p, gc.members, s, kExplicit[a]) : -1;
          r.measured[a] = runs ? measure(p, gc, prm.precision, s, kExplicit[a]) : -1;
        }
        r.auto_measured = measure(p, gc, prm.precision, s, Algo::kAuto);
        r.no_direct = op == OpKind::kAllReduce &&
                      std::any_of(gc.members.begin(), gc.members.end(),
                                  [&](int m) { return p.node_of(m) != p.node_of(gc.members.front()); });
        rows.push_back(r);
      }
    }
  }
  return cache[key] = std::move(rows);
}

char letter(Algo a) { return a == Algo::kRing ? 'R' : a == Algo::kTree ? 'T' : a == Algo::kNvls ? 'N' : 'D'; }

class TunerTest : public ::testing::TestWithParam<Param> {};

TEST_P(TunerTest, PredictionEqualsMeasuredTime) {
  const std::vector<Row>& rows = grid(GetParam());
  fmt::print(
      "{} ({}): max |predicted - measured| in ps over {} sizes x ring/tree/direct (and nvls where it applies), "
      "tolerance 0\n",
      GetParam().profile, GetParam().precision == Precision::kBf16 ? "bf16" : "fp32",
      std::size(kSizes));
  fmt::print("  {:<14} {:>15} {:>15} {:>15}\n", "group", "op", "max diff (ps)", "cases");
  Time worst = 0;
  size_t cases = 0;
  for (size_t i = 0; i < rows.size(); i += std::size(kSizes)) {
    Time diff = 0;
    const size_t before = cases;
    for (size_t j = i; j < i + std::size(kSizes); ++j) {
      for (int a = 0; a < kNumExplicit; ++a) {
        const Row& r = rows[j];
        if (r.measured[a] < 0) continue;  // nvls where it does not apply
        diff = std::max(diff, std::abs(r.predicted[a] - r.measured[a]));
        EXPECT_EQ(r.predicted[a], r.measured[a]) << r.group << " " << op_kind_name(r.op) << " "
                                                 << r.bytes << " B " << algo_name(kExplicit[a]);
        ++cases;
      }
    }
    fmt::print("  {:<14} {:>15} {:>15} {:>15}\n", rows[i].group, op_kind_name(rows[i].op), diff, cases - before);
    worst = std::max(worst, diff);
  }
  fmt::print("  all: {} cases, max diff {} ps\n", cases, worst);
}

TEST_P(TunerTest, AutoIsTheFastestExplicitAlgorithm) {
  const std::vector<Row>& rows = grid(GetParam());
  fmt::print(
      "{} ({}): auto's pick per size ({} B; R ring, T tree, D direct, N nvls) and max (auto - best "
      "explicit)\n",
      GetParam().profile, GetParam().precision == Precision::kBf16 ? "bf16" : "fp32",
      fmt::join(kSizes, ", "));
  Time worst = 0;
  for (size_t i = 0; i < rows.size(); i += std::size(kSizes)) {
    std::string picks;
    Time excess = 0;
    for (size_t j = i; j < i + std::size(kSizes); ++j) {
      const Row& r = rows[j];
      Time best = -1;
      for (int a = 0; a < kNumExplicit; ++a)
        if (r.measured[a] >= 0 && !(r.no_direct && kExplicit[a] == Algo::kDirect) &&
            (best < 0 || r.measured[a] < best))
          best = r.measured[a];
      EXPECT_EQ(r.auto_measured, best) << r.group << " " << op_kind_name(r.op) << " " << r.bytes
                                       << " B: auto picked " << algo_name(r.pick);
      if (r.no_direct) {
        EXPECT_NE(r.pick, Algo::kDirect) << r.group << " " << r.bytes << " B";
      }
      excess = std::max(excess, r.auto_measured - best);
      picks += letter(r.pick);
    }
    fmt::print("  {:<14} {:>15} {}  {} ps\n", rows[i].group, op_kind_name(rows[i].op), picks,
               excess);
    worst = std::max(worst, excess);
  }
  fmt::print("  all: max (auto - best explicit) {} ps\n", worst);
}

INSTANTIATE_TEST_SUITE_P(
    Profiles, TunerTest,
    ::testing::Values(Param{"a100-nvlink", Precision::kFp32}, Param{"a100-pcie", Precision::kFp32},
                      Param{"a100-pcie-8", Precision::kFp32},
                      Param{"h100-nvlink", Precision::kFp32}, Param{"a100-pcie", Precision::kBf16}),
    [](const auto& info) {
      std::string name = info.param.profile;
      std::replace(name.begin(), name.end(), '-', '_');
      return name + (info.param.precision == Precision::kBf16 ? "_bf16" : "_fp32");
    });

// On uniform links the replay reduces to the closed forms of tuner.h.
TEST(TunerClosedFormTest, UniformLinksGiveTheClosedForms) {
  // a100-nvlink inside a node under NCCL's Simple protocol: a hop of 3.4 us,
  // 300 GB/s, a 32 B header per 128 B packet from the SMs, and every
  // collective starts L = 4 us (launch) + 8.4 us (Simple's base) after its call.
  const HardwareProfile p = load_profile("a100-nvlink");
  const Time a = us_to_time(3.4);
  auto w = [](uint64_t bytes) {
    return transfer_time(bytes + (bytes + 127) / 128 * 32, 300'000'000'000ull);
  };
  const std::vector<int> g = iota_members(8);
  const size_t count = 8 * 768;  // S = 24576 B, S/8 = 3072 B
  const uint64_t S = count * 4;
  auto t = [&](OpKind op, Algo algo) {
    return predict_time(p, g, CollShape{op, count, 4, 0, Proto::kSimple}, algo) - us_to_time(12.4);
  };
  EXPECT_EQ(t(OpKind::kAllReduce, Algo::kRing), 14 * (a + w(S / 8)));
  EXPECT_EQ(t(OpKind::kAllReduce, Algo::kTree), 2 * (3 * a + w(S / 2) + w(S / 4) + w(S / 8)));
  EXPECT_EQ(t(OpKind::kAllReduce, Algo::kDirect), a + 7 * w(S));
  EXPECT_EQ(t(OpKind::kReduceScatter, Algo::kRing), 7 * (a + w(S / 8)));
  EXPECT_EQ(t(OpKind::kAllGather, Algo::kDirect), a + 7 * w(S / 8));
  EXPECT_EQ(t(OpKind::kBroadcast, Algo::kRing), 7 * a + 7 * w(S));  // one chunk: c = 1
  EXPECT_EQ(t(OpKind::kBroadcast, Algo::kTree), 3 * (a + w(S)));
  EXPECT_EQ(t(OpKind::kReduce, Algo::kDirect), a + 7 * w(S));
  EXPECT_EQ(t(OpKind::kAllToAll, Algo::kRing), 7 * (a + w(S / 8)));
  EXPECT_EQ(t(OpKind::kAllToAll, Algo::kTree), 3 * a + 3 * w(4 * S / 8));
  EXPECT_EQ(t(OpKind::kAllToAll, Algo::kDirect), a + 7 * w(S / 8));
  // A pipelined chain of c = 8 chunks of 512 KiB: (n-1)a + (n+c-2)w(S/c).
  const size_t big = 8 * (512 << 10) / 4;
  EXPECT_EQ(predict_time(p, g, CollShape{OpKind::kBroadcast, big, 4, 3, Proto::kSimple}, Algo::kRing),
            us_to_time(12.4) + 7 * a + 14 * w(512 << 10));
}

// Calls fn(shape, op, algo) for every op the lock-step replays cover, every
// explicit algorithm, a small and a large count and every protocol of `g`.
template <class Fn>
void for_each_replayed_shape(const HardwareProfile& p, const std::vector<int>& g, Fn fn) {
  constexpr OpKind kOps[] = {OpKind::kAllReduce, OpKind::kReduceScatter, OpKind::kAllGather,
                             OpKind::kAllToAll};
  for (OpKind op : kOps)
    for (Algo algo : kExplicit)
      for (size_t count : {size_t(24 * 5), size_t(24 * 1000003)})
        for (Proto proto : candidate_protos(p, g)) {
          const CollShape s{op, count, 4, 0, proto};
          if (algo == Algo::kNvls && (!nvls_applies(p, g, s) || proto != Proto::kSimple)) continue;
          fn(s, op, algo);
        }
}

// The tuner and the folded replay play one member of a lock-step algorithm
// when every pair of members has the same link and all start alike
// (tuner.cc, uniform_pairs): the prediction, and member `me`'s clocks and
// marks (peers included), must equal a replay of every member's. The full
// replay is forced by start clocks whose last_send differ (the replay
// resets last_send on entry, so they start alike in fact, but the shortcut's
// check sees them unlike). Groups: one node of 8, one GPU on each of 24
// nodes (local GPU 5), and 24 consecutive GPUs over 3 nodes (not uniform:
// both replay in full).
TEST(TunerSymmetricTest, OneMemberStandsForAllOnUniformPairs) {
  HardwareProfile p = load_profile("h100-nvlink");
  p.nodes = 24;
  std::vector<int> strided;
  for (int node = 0; node < 24; ++node) strided.push_back(node * 8 + 5);
  const std::vector<std::vector<int>> groups{iota_members(8), strided, iota_members(24)};
  auto marks_equal = [](const std::vector<ReplayMark>& a, const std::vector<ReplayMark>& b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i)
      if (a[i].send != b[i].send || a[i].peer != b[i].peer || a[i].start != b[i].start || a[i].end != b[i].end ||
          a[i].bytes != b[i].bytes || a[i].booked_start != b[i].booked_start || a[i].booked_end != b[i].booked_end)
        return false;
    return true;
  };
  int compared = 0;
  for (const std::vector<int>& g : groups)
    for_each_replayed_shape(p, g, [&](const CollShape& s, OpKind op, Algo algo) {
      const Proto proto = s.proto;
      const size_t count = s.count;
      const int n = int(g.size());
      const std::vector<MemberClock> alike(g.size(),
                                           MemberClock{.now = collective_start(p, n, proto)});
      std::vector<MemberClock> unlike = alike;
      for (int i = 0; i < n; ++i) unlike[size_t(i)].last_send = i;
      for (int me : {0, 5}) {
        std::vector<ReplayMark> fast_marks, full_marks;
        const std::vector<MemberClock> fast =
            replay_collective(p, g, s, algo, alike, me, &fast_marks);
        const std::vector<MemberClock> full =
            replay_collective(p, g, s, algo, unlike, me, &full_marks);
        const std::string what = replay_case(n, op, algo, count, proto, me);
        EXPECT_EQ(fast, full) << what;
        EXPECT_TRUE(marks_equal(fast_marks, full_marks)) << what;
        Time makespan = 0;
        for (const MemberClock& c : full) makespan = std::max({makespan, c.now, c.last_send});
        EXPECT_EQ(predict_time(p, g, s, algo), makespan) << what;
        ++compared;
      }
    });
  std::printf("  %d replays equal to the full replay (tolerance 0)\n", compared);
  EXPECT_GT(compared, 0);
}

// A group over several nodes with the same local GPUs on each (a dp or ep
// group folded by place) has period m, its members per node: started alike
// by period (member i as member i mod m), the replay plays members
// 0..m-1 alone (tuner.cc, replay_period). Member `me`'s clocks and marks,
// every member's end and every watched member's marks must equal a replay
// of every member's, forced as above by last_send differing member by
// member; members that equal `me` by period are not logged to `watched`
// (folded.cc compares those logs, equal by construction); trees are
// replayed in full. Groups: 24
// consecutive GPUs over 3 nodes (period 8) and local GPUs 2-5 of 4 nodes
// (period 4); the tuner's prediction from the collective's start too.
TEST(TunerSymmetricTest, MembersOfOneNodeStandForTheirTwinsOnOtherNodes) {
  HardwareProfile p = load_profile("h100-nvlink");
  p.nodes = 4;
  std::vector<int> places;
  for (int node = 0; node < 4; ++node)
    for (int local = 2; local < 6; ++local) places.push_back(node * 8 + local);
  const std::vector<std::pair<std::vector<int>, int>> groups{{iota_members(24), 8}, {places, 4}};
  auto same = [](const ReplayMark& a, const ReplayMark& b) {
    return a.send == b.send && a.peer == b.peer && a.start == b.start && a.end == b.end &&
           a.bytes == b.bytes && a.port == b.port && a.booked_start == b.booked_start &&
           a.booked_end == b.booked_end;
  };
  auto marks_equal = [&](const std::vector<ReplayMark>& a, const std::vector<ReplayMark>& b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i)
      if (!same(a[i], b[i]) || a[i].member != b[i].member || a[i].index != b[i].index) return false;
    return true;
  };
  int compared = 0;
  size_t logged = 0;
  for (const auto& [g, m] : groups)
    for_each_replayed_shape(p, g, [&, &g = g, m = m](const CollShape& s, OpKind op, Algo algo) {
      const Proto proto = s.proto;
      const size_t count = s.count;
      const int n = int(g.size());
      // By place: member i starts as member i mod m, places apart by
      // 1.5 us on the stream and 0.7 us on the NIC's egress port.
      std::vector<MemberClock> by_place(g.size());
      for (int i = 0; i < n; ++i) {
        MemberClock& c = by_place[size_t(i)];
        c.now = collective_start(p, n, proto) + (i % m) * 1'500'000;
        c.egress[1] = c.now + (i % m) * 700'000;
      }
      std::vector<MemberClock> unlike = by_place;
      for (int i = 0; i < n; ++i) unlike[size_t(i)].last_send = i;
      const std::vector<char> watch(g.size(), 1);
      for (int me : {0, m + 1}) {
        std::vector<ReplayMark> fast_marks, full_marks, fast_watched, full_watched;
        const std::vector<MemberClock> fast =
            replay_collective(p, g, s, algo, by_place, me, &fast_marks, watch, &fast_watched);
        const std::vector<MemberClock> full =
            replay_collective(p, g, s, algo, unlike, me, &full_marks, watch, &full_watched);
        const std::string what = replay_case(n, op, algo, count, proto, me);
        EXPECT_EQ(fast, full) << what;
        EXPECT_TRUE(marks_equal(fast_marks, full_marks)) << what;
        // The full replay's watched marks of the members that are not
        // me's twins, in its order (stable by member: each member's in
        // program order).
        // Trees are not lock-step (all_to_all's is Bruck's shift
        // rounds): replayed in full, every member logged.
        const bool periodic = algo != Algo::kTree || op == OpKind::kAllToAll;
        std::vector<ReplayMark> expected;
        for (const ReplayMark& k : full_watched)
          if (!periodic || k.index % m != me % m) expected.push_back(k);
        auto by_member = [](std::vector<ReplayMark> v) {
          std::stable_sort(v.begin(), v.end(), [](const ReplayMark& a, const ReplayMark& b) {
            return a.index < b.index;
          });
          return v;
        };
        EXPECT_TRUE(marks_equal(by_member(fast_watched), by_member(expected))) << what;
        logged += expected.size();
        ++compared;
      }
      // The tuner: every member from the collective's start.
      const std::vector<MemberClock> start(g.size(),
                                           MemberClock{.now = collective_start(p, n, proto)});
      std::vector<MemberClock> start_unlike = start;
      for (int i = 0; i < n; ++i) start_unlike[size_t(i)].last_send = i;
      const std::vector<MemberClock> full =
          replay_collective(p, g, s, algo, start_unlike, -1, nullptr);
      Time makespan = 0;
      for (const MemberClock& c : full) makespan = std::max({makespan, c.now, c.last_send});
      EXPECT_EQ(predict_time(p, g, s, algo), makespan);
    });
  std::printf(
      "  %d periodic replays equal to the full replay (tolerance 0), %zu watched marks compared\n",
      compared, logged);
  EXPECT_GT(compared, 0);
}

// The tuner's cache shares one choice between groups that differ by whole
// nodes (api.cc: the stages of a pipeline) only where every pair keeps its
// link: on h100-nvlink (one leaf) always; on h100-roce (two nodes per rack
// switch) a group over nodes 1-2 spans two racks and nodes 0-1 one, so it
// stays where it is, while nodes 2-3 move onto 0-1. The predictions of the
// moved groups equal the originals' (tolerance 0).
TEST(TunerSymmetricTest, NodeShiftedKeepsEveryLink) {
  HardwareProfile nvl = load_profile("h100-nvlink");
  nvl.nodes = 4;
  const HardwareProfile roce = load_profile("h100-roce");
  auto range = [](int from, int n) {
    std::vector<int> v(static_cast<size_t>(n));
    std::iota(v.begin(), v.end(), from);
    return v;
  };
  EXPECT_EQ(node_shifted(nvl, range(8, 24)), range(0, 24));
  EXPECT_EQ(node_shifted(roce, range(8, 16)), range(8, 16));
  EXPECT_EQ(node_shifted(roce, range(16, 16)), range(0, 16));
  std::vector<int> places;  // local GPU 3 of nodes 1-3
  for (int node = 1; node < 4; ++node) places.push_back(node * 8 + 3);
  EXPECT_EQ(node_shifted(nvl, places), (std::vector<int>{3, 11, 19}));
  int compared = 0;
  for (const auto& [p, g] :
       {std::pair{nvl, range(8, 24)}, std::pair{roce, range(16, 16)}, std::pair{nvl, places}})
    for_each_replayed_shape(p, g, [&, &p = p, &g = g](const CollShape& s, OpKind, Algo algo) {
      EXPECT_EQ(predict_time(p, node_shifted(p, g), s, algo), predict_time(p, g, s, algo));
      ++compared;
    });
  std::printf("  %d predictions of node-shifted groups equal the originals' (tolerance 0)\n",
              compared);
}

// The symptom the tuner fixes: on PCIe (32 GB/s) direct's 7 serialized
// copies lose to the tree well below the old 4 MiB threshold, while tiny
// messages still go direct (one latency).
TEST(TunerClosedFormTest, PciePicksTheTreeForMidSizedTensorParallelReductions) {
  const HardwareProfile p = load_profile("a100-pcie");
  const std::vector<int> tp = iota_members(8);
  EXPECT_EQ(select_algo(p, tp, CollShape{OpKind::kAllReduce, 16, 4, 0}), Algo::kDirect);
  EXPECT_EQ(select_algo(p, tp, CollShape{OpKind::kAllReduce, (512 << 10) / 4, 4, 0}), Algo::kTree);
}

}  // namespace
}  // namespace shardlab::collectives::testing
