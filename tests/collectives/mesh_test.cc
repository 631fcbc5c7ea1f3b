// DeviceMesh: rank <-> coordinates, groups along one or several dimensions,
// expert parallelism inside data parallelism, and group tags.
#include <numeric>
#include <set>

#include "tests/collectives/test_util.h"

namespace shardlab::collectives::testing {
namespace {

using Groups = std::vector<std::vector<int>>;

TEST(MeshTest, DefaultOrderPutsTpFastestAndPpSlowest) {
  DeviceMesh mesh(MeshShape{.tp = 2, .dp = 2, .pp = 2});
  EXPECT_EQ(mesh.size(), 8);
  EXPECT_EQ(mesh.all_group_ranks("tp"), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(mesh.all_group_ranks("dp"), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(mesh.all_group_ranks("pp"), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(mesh.all_group_ranks("tp-dp"), (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  const Coords c = mesh.coords(5);
  EXPECT_EQ(c.tp, 1);
  EXPECT_EQ(c.dp, 0);
  EXPECT_EQ(c.pp, 1);
  EXPECT_EQ(mesh.describe(5), "TP(2)-PP(2)-DP(2)-Rank(5)");
}

TEST(MeshTest, CoordinatesRoundTripForEveryOrder) {
  for (const char* order : {"tp-cp-ep-dp-pp", "tp-pp-dp", "pp-dp-tp", "dp-tp-pp-cp-ep"}) {
    DeviceMesh mesh(MeshShape{.tp = 2, .dp = 3, .pp = 2}, order);
    std::set<std::vector<int>> seen;
    for (int r = 0; r < mesh.size(); ++r) {
      const Coords c = mesh.coords(r);
      EXPECT_EQ(mesh.rank(c), r) << order;
      seen.insert({c.tp, c.dp, c.pp});
    }
    EXPECT_EQ(seen.size(), 12u) << order;
  }
  DeviceMesh pp_first(MeshShape{.tp = 2, .pp = 4}, "pp-tp");
  EXPECT_EQ(pp_first.group_ranks(0, "pp"), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(pp_first.group_ranks(0, "tp"), (std::vector<int>{0, 4}));
}

TEST(MeshTest, ExpertParallelismSplitsDataParallelism) {
  // tp=2, dp=4 with ep=2: inside each dp group of 4, the ep pairs hold
  // different experts; edp pairs hold the same experts.
  DeviceMesh mesh(MeshShape{.tp = 2, .ep = 2, .dp = 4});
  EXPECT_EQ(mesh.size(), 8);
  EXPECT_EQ(mesh.all_group_ranks("dp"), (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}}));
  EXPECT_EQ(mesh.all_group_ranks("ep"), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(mesh.all_group_ranks("edp"), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  for (int r = 0; r < 8; ++r) {
    const Coords c = mesh.coords(r);
    EXPECT_EQ(c.dp, c.ep + 2 * c.edp);
    // ep x edp tiles the dp group exactly.
    const std::vector<int> ep_group = mesh.group_ranks(r, "ep");
    const std::set<int> ep(ep_group.begin(), ep_group.end());
    for (int e : mesh.group_ranks(r, "edp")) EXPECT_FALSE(e != r && ep.count(e)) << r;
  }
  EXPECT_EQ(mesh.describe(3), "TP(2)-EP(2)-PP(1)-DP(4)-Rank(3)");
}

// group_index is the rank's place in its sorted group, for every rank, group
// spec and order (counted here by searching group_ranks).
TEST(MeshTest, GroupIndexIsThePlaceInTheSortedGroup) {
  int checked = 0;
  for (const char* order : {"tp-cp-ep-dp-pp", "pp-dp-ep-cp-tp", "tp-pp-dp-cp-ep"}) {
    const DeviceMesh mesh(MeshShape{.tp = 2, .cp = 3, .ep = 2, .dp = 4, .pp = 2}, order);
    for (const char* dims : {"tp", "cp", "dp", "edp", "ep", "pp", "cp-dp", "cp-edp", "tp-dp", "tp-cp-ep-dp-pp"})
      for (int r = 0; r < mesh.size(); ++r) {
        const std::vector<int> g = mesh.group_ranks(r, dims);
        const int want = int(std::find(g.begin(), g.end(), r) - g.begin());
        EXPECT_EQ(mesh.group_index(r, dims), want) << order << " " << dims << " rank " << r;
        ++checked;
      }
  }
  EXPECT_EQ(checked, 3 * 10 * 48);  // 3 orders, 10 specs, tp 2 x cp 3 x dp 4 x pp 2 ranks
}

TEST(MeshTest, BadShapesAndNamesAreConfigErrors) {
  EXPECT_THROW(DeviceMesh(MeshShape{.ep = 3, .dp = 4}), ConfigError);
  EXPECT_THROW(DeviceMesh(MeshShape{.tp = 0}), ConfigError);
  EXPECT_THROW(DeviceMesh(MeshShape{.tp = 2}, "tp-xx"), ConfigError);
  EXPECT_THROW(DeviceMesh(MeshShape{.tp = 2}, "tp-tp"), ConfigError);
  EXPECT_THROW(DeviceMesh(MeshShape{.tp = 2, .pp = 2}, "tp-dp"), ConfigError);  // pp missing
  DeviceMesh mesh(MeshShape{.tp = 2});
  EXPECT_THROW(mesh.group_ranks(0, "tensor"), ConfigError);
}

// A rank or coordinate outside the mesh is the caller's error, one message,
// not an abort of the process (a device program of the C++ API).
TEST(MeshTest, RanksAndCoordinatesOutsideTheMeshAreConfigErrors) {
  const DeviceMesh mesh(MeshShape{.tp = 2, .pp = 3});
  auto message = [](auto call) {
    try {
      call();
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message([&] { (void)mesh.coords(6); }), "mesh: rank 6 outside the mesh of 6");
  EXPECT_EQ(message([&] { (void)mesh.coords(-1); }), "mesh: rank -1 outside the mesh of 6");
  EXPECT_EQ(message([&] { (void)mesh.group_ranks(9, "tp"); }), "mesh: rank 9 outside the mesh of 6");
  EXPECT_EQ(message([&] { (void)mesh.group_index(6, "pp"); }), "mesh: rank 6 outside the mesh of 6");
  EXPECT_EQ(message([&] { (void)mesh.rank(Coords{.tp = 2}); }), "mesh: tp coordinate 2 outside [0, 2)");
  EXPECT_EQ(message([&] { (void)mesh.rank(Coords{.pp = -1}); }), "mesh: pp coordinate -1 outside [0, 3)");
  EXPECT_EQ(mesh.rank(Coords{.tp = 1, .pp = 2}), 5);  // inside: as before
}

TEST(MeshTest, GroupTagsAgreeOnMembersAndDifferAcrossGroups) {
  DeviceMesh mesh(MeshShape{.tp = 2, .dp = 2, .pp = 2});
  std::set<uint64_t> bases;
  for (const char* dims : {"tp", "dp", "pp", "tp-dp"}) {
    for (const auto& members : mesh.all_group_ranks(dims)) {
      const uint64_t base = mesh.group(members[0], dims).tag_base();
      for (int m : members) EXPECT_EQ(mesh.group(m, dims).tag_base(), base);
      bases.insert(base);
    }
  }
  EXPECT_EQ(bases.size(), 4u + 4u + 4u + 2u);
  ProcessGroup g = mesh.group(0, "tp");
  ProcessGroup copy = g;
  const Tag t0 = g.next_tag(), t1 = copy.next_tag();
  EXPECT_NE(t0, t1) << "copies share the sequence counter";
  EXPECT_EQ(g.sequence(), 2u);
  EXPECT_TRUE(t0 >> 63) << "collective tags stay clear of user p2p tags";
  EXPECT_THROW(ProcessGroup({0, 1}, 2), ConfigError);
  EXPECT_THROW(ProcessGroup({0, 0}, 0), ConfigError);
}

// A group's name in messages: whole up to 11 members; beyond, the first 8,
// the last 2 and the count (a folding log line on 16K GPUs was 80 KB).
TEST(MeshTest, AGroupOfThousandsIsNamedByItsEndsAndSize) {
  EXPECT_EQ(ProcessGroup({0, 1}, 0, "tp").to_string(), "tp[0,1]");
  std::vector<int> eleven(11), twelve(12), many(4992);
  std::iota(eleven.begin(), eleven.end(), 0);
  std::iota(twelve.begin(), twelve.end(), 0);
  for (size_t i = 0; i < many.size(); ++i) many[i] = 2 * int(i);
  EXPECT_EQ(ProcessGroup(eleven, 0).to_string(), "group[0,1,2,3,4,5,6,7,8,9,10]");
  EXPECT_EQ(ProcessGroup(twelve, 0, "dp").to_string(), "dp[0,1,2,3,4,5,6,7,...,10,11] (12 members)");
  EXPECT_EQ(ProcessGroup(many, 6, "tp-dp").to_string(), "tp-dp[0,2,4,6,8,10,12,14,...,9980,9982] (4992 members)");
}

TEST(MeshTest, InterleavedGroupsNeverMixMessages) {
  // Each device alternates collectives on its tp and dp groups, with
  // non-blocking ones in flight; results must stay exact.
  Failures f;
  run_on(8, [&](Device& dev) {
    DeviceMesh mesh(MeshShape{.tp = 2, .dp = 2, .pp = 2});
    ProcessGroup tp = mesh.group(dev.rank(), "tp"), dp = mesh.group(dev.rank(), "dp");
    for (int it = 0; it < 5; ++it) {
      std::vector<float> a = int_inputs(dev.rank(), 333, it), b = int_inputs(dev.rank(), 222, it + 9);
      Work wa = iall_reduce(dev, tp, a, a);
      Work wb = iall_reduce(dev, dp, b, b, ReduceOp::kMax);
      wa.wait(dev.compute());
      wb.wait(dev.compute());
      auto want = [&](const std::vector<int>& members, size_t i, int salt, ReduceOp op) {
        float acc = int_input(members[0], i, salt);
        for (size_t k = 1; k < members.size(); ++k)
          acc = op == ReduceOp::kMax ? std::max(acc, int_input(members[k], i, salt)) : acc + int_input(members[k], i, salt);
        return acc;
      };
      check_range(f, "tp", a.data(), a.size(), [&](size_t i) { return want(tp.members(), i, it, ReduceOp::kSum); });
      check_range(f, "dp", b.data(), b.size(), [&](size_t i) { return want(dp.members(), i, it + 9, ReduceOp::kMax); });
    }
  });
  f.expect_none();
}

}  // namespace
}  // namespace shardlab::collectives::testing
