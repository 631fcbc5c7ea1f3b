// Determinism: virtual times and data must not depend on host scheduling.
#include <chrono>
#include <random>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/cluster.h"
#include "tests/runtime/test_util.h"

namespace shardlab {
namespace {

// Sleeps a random 0-300 us on every send and receive, from a per-thread RNG.
class RandomSleeps : public FabricHooks {
 public:
  explicit RandomSleeps(uint64_t seed) : seed_(seed) {}
  void on_send(int src, int, Tag) override { nap(src); }
  void on_recv(int dst, int, Tag) override { nap(dst); }

 private:
  void nap(int rank) {
    thread_local std::mt19937_64 rng;
    thread_local uint64_t seeded_for = ~0ull;
    if (seeded_for != seed_ * 131 + rank) {
      rng.seed(seed_ * 131 + rank);
      seeded_for = seed_ * 131 + rank;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 300));
  }
  uint64_t seed_;
};

struct Step {
  int src, dst;
  uint32_t elems;
  double flops;
};

struct Outcome {
  std::vector<Time> compute_end, comm_end;
  std::vector<double> checksum;
  bool operator==(const Outcome&) const = default;
};

// 8 devices over 2 nodes exchange a random (but fixed) pattern of messages,
// with compute in between and sends issued from both streams.
Outcome run_traffic(FabricHooks* hooks) {
  std::mt19937 rng(2024);
  std::vector<Step> steps;
  for (int i = 0; i < 160; ++i) {
    int src = static_cast<int>(rng() % 8), dst = static_cast<int>(rng() % 7);
    if (dst >= src) ++dst;
    steps.push_back({src, dst, static_cast<uint32_t>(rng() % 5000), double(rng() % 1000) * 1e6});
  }
  Outcome out;
  out.compute_end.resize(8);
  out.comm_end.resize(8);
  out.checksum.resize(8);
  Cluster c(testing::simple_profile(2, 4), {.world_size = 8, .hooks = hooks});
  RunResult r = c.run([&](Device& d) {
    std::vector<float> buf(5000);
    double sum = 0;
    for (size_t i = 0; i < steps.size(); ++i) {
      const Step& s = steps[i];
      if (s.src == d.rank()) {
        d.run(d.compute(), "work", {s.flops, 0});
        for (uint32_t k = 0; k < s.elems; ++k) buf[k] = float(i * 7 + k);
        Stream& st = i % 3 ? d.comm() : d.compute();
        d.comm().wait(d.compute().record());
        d.isend(st, s.dst, i % 4, std::as_bytes(std::span<const float>(buf.data(), s.elems)), 4ull * s.elems);
      } else if (s.dst == d.rank()) {
        Message m = d.recv(d.comm(), s.src, i % 4);
        const float* p = reinterpret_cast<const float*>(m.bytes().data());
        for (uint32_t k = 0; k < s.elems; ++k) sum += p[k] * double(k + 1);
        d.compute().wait(d.comm().record());
      }
    }
    out.checksum[d.rank()] = sum;
  });
  for (const auto& s : r.devices) {
    out.compute_end[s.rank] = s.compute_end;
    out.comm_end[s.rank] = s.comm_end;
  }
  return out;
}

TEST(Determinism, RandomTrafficWithRandomHostSleepsGivesIdenticalRuns) {
  const Outcome reference = run_traffic(nullptr);
  EXPECT_GT(reference.comm_end[0], 0);
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    RandomSleeps sleeps(seed);
    Outcome o = run_traffic(&sleeps);
    ASSERT_EQ(o.compute_end, reference.compute_end) << "sleep seed " << seed;
    ASSERT_EQ(o.comm_end, reference.comm_end) << "sleep seed " << seed;
    ASSERT_EQ(o.checksum, reference.checksum) << "sleep seed " << seed;
  }
}

TEST(Determinism, IndependentEmulationsSideBySideMatchSequentialOnes) {
  const Outcome reference = run_traffic(nullptr);
  Outcome a, b;
  // Two host threads, joined: a synchronisation ThreadSanitizer sees (a
  // oneTBB task's join is not, as Debian's oneTBB is not instrumented).
  std::thread other([&] { b = run_traffic(nullptr); });
  a = run_traffic(nullptr);
  other.join();
  EXPECT_EQ(a, reference);
  EXPECT_EQ(b, reference);
}

}  // namespace
}  // namespace shardlab
