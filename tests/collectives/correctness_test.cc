// Every op x algorithm x group size 1-8 x element counts (0, 1, n-1, odd,
// large), in place and out of place, against a serial reference. Inputs are
// small integers, so every reduction order gives the exact same sum and the
// tolerance is 0.
#include <numeric>

#include "tests/collectives/test_util.h"

namespace shardlab::collectives::testing {
namespace {

constexpr ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax};

struct Case {
  Device& dev;
  const ProcessGroup& g;
  CollOptions opt;
  Failures& f;
  std::string where(const char* op, size_t count, const char* extra = "") const {
    return fmt::format("{} n={} algo={} count={} member={} {}", op, g.size(), algo_name(opt.algo), count, g.rank(),
                       extra);
  }
};

void check_reductions(Case& c, size_t count, ReduceOp op) {
  const int n = c.g.size(), me = c.g.rank();
  const char* name = reduce_op_name(op);
  auto want = [&](size_t i) { return reference(op, n, i); };
  // all_reduce, out of place and in place.
  std::vector<float> in = int_inputs(me, count), out(count, -99.f);
  all_reduce(c.dev, c.g, in, out, op, c.opt);
  check_range(c.f, c.where("all_reduce", count, name), out.data(), count, want);
  all_reduce(c.dev, c.g, in, op, c.opt);
  check_range(c.f, c.where("all_reduce(in place)", count, name), in.data(), count, want);
  // reduce_scatter, out of place and in place.
  const Range mine = chunk_range(count, n, me);
  in = int_inputs(me, count);
  std::vector<float> part(mine.size, -99.f);
  reduce_scatter(c.dev, c.g, in, part, op, c.opt);
  auto want_part = [&](size_t i) { return reference(op, n, mine.begin + i); };
  check_range(c.f, c.where("reduce_scatter", count, name), part.data(), mine.size, want_part);
  reduce_scatter(c.dev, c.g, in, Buffer(in.data() + mine.begin, mine.size), op, c.opt);
  check_range(c.f, c.where("reduce_scatter(in place)", count, name), in.data() + mine.begin, mine.size, want_part);
  // reduce to a root, out of place and in place.
  const int root = static_cast<int>(count % static_cast<size_t>(n));
  in = int_inputs(me, count);
  out.assign(me == root ? count : 0, -99.f);
  reduce(c.dev, c.g, in, out, root, op, c.opt);
  if (me == root) check_range(c.f, c.where("reduce", count, name), out.data(), count, want);
  reduce(c.dev, c.g, in, in, root, op, c.opt);
  if (me == root) check_range(c.f, c.where("reduce(in place)", count, name), in.data(), count, want);
}

void check_movements(Case& c, size_t count) {
  const int n = c.g.size(), me = c.g.rank();
  // all_gather: element j comes from the member whose chunk holds j.
  std::vector<int> owner(count);
  for (int r = 0; r < n; ++r) {
    const Range rr = chunk_range(count, n, r);
    for (int64_t j = 0; j < rr.size; ++j) owner[size_t(rr.begin + j)] = r;
  }
  auto want_gather = [&](size_t j) { return int_input(owner[j], j); };
  const Range mine = chunk_range(count, n, me);
  std::vector<float> full = int_inputs(me, count), out(count, -99.f);
  all_gather(c.dev, c.g, ConstBuffer(full.data() + mine.begin, mine.size), out, c.opt);
  check_range(c.f, c.where("all_gather", count), out.data(), count, want_gather);
  std::vector<float> inplace(count, -99.f);
  std::copy_n(full.begin() + static_cast<long>(mine.begin), mine.size, inplace.begin() + static_cast<long>(mine.begin));
  all_gather(c.dev, c.g, ConstBuffer(inplace.data() + mine.begin, mine.size), inplace, c.opt);
  check_range(c.f, c.where("all_gather(in place)", count), inplace.data(), count, want_gather);
  // broadcast from a root that moves with the count.
  const int root = static_cast<int>((count + 1) % static_cast<size_t>(n));
  std::vector<float> data = me == root ? int_inputs(root, count) : std::vector<float>(count, -99.f);
  broadcast(c.dev, c.g, data, root, c.opt);
  check_range(c.f, c.where("broadcast", count), data.data(), count, [&](size_t i) { return int_input(root, i); });
}

// all_to_all with `block` elements per pair, and all_to_all_v with uneven counts.
void check_all_to_all(Case& c, size_t block) {
  const int n = c.g.size(), me = c.g.rank();
  const auto un = static_cast<size_t>(n);
  std::vector<float> in = int_inputs(me, block * un), out(block * un, -99.f);
  all_to_all(c.dev, c.g, in, out, c.opt);
  check_range(c.f, c.where("all_to_all", block * un), out.data(), block * un,
              [&](size_t k) { return int_input(static_cast<int>(k / std::max<size_t>(block, 1)), me * block + k % std::max<size_t>(block, 1)); });
  if (c.opt.algo == Algo::kTree) return;  // all_to_all_v has no Bruck variant
  auto pair_count = [&](int s, int d) { return (static_cast<size_t>(s) * 3 + static_cast<size_t>(d) * 5 + block) % 7 * (block + 1) / 2; };
  std::vector<size_t> sc(un), rc(un);
  for (int j = 0; j < n; ++j) sc[static_cast<size_t>(j)] = pair_count(me, j), rc[static_cast<size_t>(j)] = pair_count(j, me);
  std::vector<float> vin, vout(std::accumulate(rc.begin(), rc.end(), size_t{0}), -99.f), want;
  for (int j = 0; j < n; ++j)
    for (size_t k = 0; k < sc[static_cast<size_t>(j)]; ++k) vin.push_back(int_input(me * 31 + j, k));
  for (int s = 0; s < n; ++s)
    for (size_t k = 0; k < rc[static_cast<size_t>(s)]; ++k) want.push_back(int_input(s * 31 + me, k));
  all_to_all_v(c.dev, c.g, vin, sc, vout, rc, c.opt);
  check_range(c.f, c.where("all_to_all_v", vout.size()), vout.data(), vout.size(), [&](size_t k) { return want[k]; });
}

class CorrectnessTest : public ::testing::TestWithParam<std::tuple<int, Algo>> {};

TEST_P(CorrectnessTest, MatchesSerialReference) {
  const auto [n, algo] = GetParam();
  Failures f;
  run_on(n, [&, n = n, algo = algo](Device& dev) {
    ProcessGroup g = ProcessGroup::world(dev);
    Case c{dev, g, CollOptions{algo, std::nullopt}, f};
    const size_t nn = static_cast<size_t>(n);
    for (size_t count : {size_t{0}, size_t{1}, nn - 1, size_t{37}, size_t{65539}}) {
      for (ReduceOp op : kOps) check_reductions(c, count, op);
      check_movements(c, count);
    }
    for (size_t block : {size_t{0}, size_t{1}, nn - 1, size_t{37}, size_t{4099}}) check_all_to_all(c, block);
    barrier(dev, g, c.opt);
  });
  f.expect_none();
}

INSTANTIATE_TEST_SUITE_P(
    AllSizes, CorrectnessTest,
    ::testing::Combine(::testing::Range(1, 9),
                       ::testing::Values(Algo::kRing, Algo::kTree, Algo::kDirect, Algo::kAuto)),
    [](const auto& info) {
      return fmt::format("n{}_{}", std::get<0>(info.param), algo_name(std::get<1>(info.param)));
    });

TEST(CorrectnessTest, SubgroupsOfAMeshComposeToTheGlobalSum) {
  // tp=2 x dp=4 on 8 devices: all_reduce over tp then over dp = over everything.
  Failures f;
  run_on(8, [&](Device& dev) {
    DeviceMesh mesh(MeshShape{.tp = 2, .dp = 4});
    ProcessGroup tp = mesh.group(dev.rank(), "tp"), dp = mesh.group(dev.rank(), "dp");
    std::vector<float> x = int_inputs(dev.rank(), 1001);
    Work w1 = iall_reduce(dev, tp, x, x, ReduceOp::kSum, {Algo::kRing, std::nullopt});
    all_reduce(dev, dp, x, ReduceOp::kSum, {Algo::kTree, w1.event()});
    check_range(f, "tp then dp", x.data(), x.size(), [](size_t i) { return reference(ReduceOp::kSum, 8, i); });
  });
  f.expect_none();
}

TEST(CorrectnessTest, BadArgumentsFailTheRun) {
  auto bad = [](auto body) {
    return [body](Device& dev) { body(dev, ProcessGroup::world(dev)); };
  };
  EXPECT_THROW(run_on(2, bad([](Device& dev, const ProcessGroup& g) {
                 std::vector<float> a(4), b(3);
                 all_reduce(dev, g, a, b);
               })),
               RunError);
  EXPECT_THROW(run_on(2, bad([](Device& dev, const ProcessGroup& g) {
                 std::vector<float> a(5), b(5);
                 all_to_all(dev, g, a, b);  // 5 not divisible by 2
               })),
               RunError);
  EXPECT_THROW(run_on(2, bad([](Device& dev, const ProcessGroup& g) {
                 std::vector<float> a(4);
                 broadcast(dev, g, a, 2);
               })),
               RunError);
}

}  // namespace
}  // namespace shardlab::collectives::testing

namespace shardlab::collectives::testing {
namespace {

TEST(CorrectnessTest, MismatchedCountsAcrossMembersFailLoudly) {
  try {
    run_on(3, [](Device& dev) {
      ProcessGroup g = ProcessGroup::world(dev);
      std::vector<float> x(dev.rank() == 1 ? 10 : 12, 1.f);
      all_reduce(dev, g, x, ReduceOp::kSum, {Algo::kRing, std::nullopt});
    });
    FAIL() << "expected a RunError";
  } catch (const RunError& e) {
    // The messages' count check or the meeting's (rendezvous.h): both say so.
    EXPECT_NE(std::string(e.what()).find("matching counts"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace shardlab::collectives::testing

