// Bit-identical results and virtual times across 20 runs while random host
// sleeps are injected at every send and receive (shaking the thread
// schedule), on random (non-integer) data where reduction order matters.
#include <atomic>
#include <chrono>
#include <random>
#include <thread>

#include "tests/collectives/test_util.h"

namespace shardlab::collectives::testing {
namespace {

struct Outcome {
  std::vector<uint64_t> digests;  // per device: FNV-1a of all output bits
  std::vector<Time> ends;
  bool operator==(const Outcome&) const = default;
};

uint64_t fnv(uint64_t h, const std::vector<float>& v) {
  for (float x : v) {
    uint32_t bits;
    std::memcpy(&bits, &x, 4);
    h = (h ^ bits) * 1099511628211ull;
  }
  return h;
}

// Every op and algorithm on random floats; returns each device's digest.
Outcome run_everything(int n, uint64_t seed, FabricHooks* hooks, const char* profile = "a100-nvlink") {
  std::vector<uint64_t> digests(static_cast<size_t>(n));
  RunResult r = run_on(n, [&](Device& dev) {
    ProcessGroup g = ProcessGroup::world(dev);
    std::mt19937 rng(static_cast<uint32_t>(seed * 131 + static_cast<uint64_t>(dev.rank())));
    std::normal_distribution<float> normal;
    const size_t count = 3001;
    const auto un = static_cast<size_t>(n);
    uint64_t h = 1469598103934665603ull;
    for (Algo algo : {Algo::kRing, Algo::kTree, Algo::kDirect}) {
      const CollOptions opt{algo, std::nullopt};
      std::vector<float> x(count), part(chunk_range(count, n, g.rank()).size), a2a(un * 101), y(un * 101);
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
        for (float& v : x) v = normal(rng);
        all_reduce(dev, g, x, op, opt);
        h = fnv(h, x);
        for (float& v : x) v = normal(rng);
        reduce_scatter(dev, g, x, part, op, opt);
        h = fnv(h, part);
        reduce(dev, g, x, x, 0, op, opt);
        h = fnv(h, x);
      }
      all_gather(dev, g, part, x, opt);
      broadcast(dev, g, x, n - 1, opt);
      for (float& v : a2a) v = normal(rng);
      all_to_all(dev, g, a2a, y, opt);
      h = fnv(fnv(h, x), y);
    }
    digests[static_cast<size_t>(dev.rank())] = h;
  }, load_profile(profile), hooks);
  Outcome o{digests, {}};
  for (const auto& d : r.devices) o.ends.push_back(d.end());
  return o;
}

TEST(DeterminismTest, TwentyRunsWithRandomHostSleepsAreBitIdentical) {
  for (int n : {6, 8}) {
    const Outcome first = run_everything(n, 7, nullptr);
    for (int run = 0; run < 20; ++run) {
      RandomSleeps sleeps(static_cast<uint64_t>(run) + 1);
      EXPECT_EQ(run_everything(n, 7, &sleeps), first) << "n=" << n << " run " << run;
    }
  }
}

TEST(DeterminismTest, ChannelsAcrossTwoNodesAreBitIdenticalUnderRandomHostSleeps) {
  // 16 ranks on two nodes: the ring algorithms run 16 channels (tuner.h RingPlan).
  const Outcome first = run_everything(16, 7, nullptr);
  for (int run = 0; run < 3; ++run) {
    RandomSleeps sleeps(static_cast<uint64_t>(run) + 1);
    EXPECT_EQ(run_everything(16, 7, &sleeps), first) << "run " << run;
  }
}

TEST(DeterminismTest, PcieTreeSharesAreBitIdenticalUnderRandomHostSleeps) {
  // a100-pcie-8: every message inside a node capped by its step's share of
  // the PCIe tree (link_model.h shared_rate); 8 ranks, and 16 on two nodes.
  for (int n : {8, 16}) {
    const Outcome first = run_everything(n, 7, nullptr, "a100-pcie-8");
    for (int run = 0; run < 3; ++run) {
      RandomSleeps sleeps(static_cast<uint64_t>(run) + 1);
      EXPECT_EQ(run_everything(n, 7, &sleeps, "a100-pcie-8"), first) << "n=" << n << " run " << run;
    }
  }
}

TEST(DeterminismTest, AllMembersHoldTheSameBits) {
  // all_reduce gives every member identical bits, whatever the algorithm.
  for (Algo algo : {Algo::kRing, Algo::kTree, Algo::kDirect}) {
    std::vector<std::vector<float>> results(5);
    run_on(5, [&](Device& dev) {
      ProcessGroup g = ProcessGroup::world(dev);
      std::mt19937 rng(static_cast<uint32_t>(dev.rank()));
      std::uniform_real_distribution<float> u(-1, 1);
      std::vector<float> x(1237);
      for (float& v : x) v = u(rng);
      all_reduce(dev, g, x, ReduceOp::kSum, {algo, std::nullopt});
      results[static_cast<size_t>(dev.rank())] = x;
    });
    for (size_t r = 1; r < results.size(); ++r) EXPECT_EQ(results[r], results[0]) << algo_name(algo);
  }
}

}  // namespace
}  // namespace shardlab::collectives::testing
