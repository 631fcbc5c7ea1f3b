// The rendezvous path (collectives/rendezvous.h) against the messages it
// replaces: the same random programs run once with ClusterOptions::
// rendezvous on and once off, and every output bit, every device's stream
// ends and busy times and every trace event must be equal. The programs
// mix all_reduce (sum, avg, max) and all_gather by ring, tree, direct and
// auto over random sizes (0 to 6000 elements, uneven chunks), groups of
// 2 to 8 inside one node and across two, the compute and the comm stream
// (so other streams share the ports), random compute between calls (so
// members enter at different times) and random host sleeps (so arrivals
// come in any order). Inputs are random floats of mixed signs and
// exponents, with signed zeros, so a different order of operations or of
// max's operands would change bits.
#include <chrono>
#include <cstring>
#include <random>
#include <thread>

#include "collectives/rendezvous.h"
#include "support/bounded_run.h"
#include "tests/collectives/test_util.h"

namespace shardlab::collectives::testing {
namespace {

struct Call {
  int group = 0;  // 0: the world, 1: my half, 2: my pair
  OpKind op = OpKind::kAllReduce;
  ReduceOp rop = ReduceOp::kSum;
  Algo algo = Algo::kAuto;
  size_t count = 0;
  bool in_place = false;
  bool on_compute = false;
  Time compute_before = 0;  // every member's differs (scaled by rank)
  int sleep_us = 0;         // host sleep before the call (rank-dependent)
};

std::vector<Call> random_calls(uint64_t seed, int calls) {
  std::mt19937_64 rng(seed);
  auto pick = [&](int n) { return static_cast<int>(rng() % uint64_t(n)); };
  std::vector<Call> out;
  for (int i = 0; i < calls; ++i) {
    Call c;
    c.group = pick(3);
    c.op = pick(3) == 0 ? OpKind::kAllGather : OpKind::kAllReduce;
    c.rop = static_cast<ReduceOp>(pick(3));
    c.algo = static_cast<Algo>(pick(4));  // auto, ring, tree, direct
    const int size_class = pick(3);
    c.count = size_class == 0 ? size_t(pick(24)) : size_class == 1 ? size_t(pick(600)) : size_t(pick(6000));
    c.in_place = pick(2) == 0;
    c.on_compute = pick(2) == 0;
    c.compute_before = Time(pick(4)) * 700'000;
    c.sleep_us = pick(4) == 0 ? pick(300) : 0;
    out.push_back(c);
  }
  return out;
}

float random_float(std::mt19937_64& rng) {
  const uint64_t r = rng();
  if (r % 11 == 0) return (r & 64) ? -0.0f : 0.0f;
  const float mant = static_cast<float>((r >> 8) % 100000) / 997.0f;
  const int exp = static_cast<int>((r >> 40) % 13) - 6;
  return ((r & 1) ? -1.0f : 1.0f) * std::ldexp(mant, exp);
}

struct Outcome {
  RunResult run;
  std::vector<std::vector<std::vector<float>>> outputs;  // [rank][call]
};

Outcome run_program(const HardwareProfile& profile, int world, const std::vector<Call>& calls, uint64_t seed,
                    bool rendezvous, int host_threads = 0) {
  ClusterOptions opts;
  opts.world_size = world;
  opts.trace = true;
  opts.rendezvous = rendezvous;
  opts.host_threads = host_threads;
  Cluster cluster(profile, opts);
  Outcome o;
  o.outputs.resize(size_t(world));
  o.run = shardlab::testing::bounded_run(cluster, [&](Device& dev) {
    const int r = dev.rank();
    std::vector<int> all(static_cast<size_t>(world));
    for (int i = 0; i < world; ++i) all[size_t(i)] = i;
    const int half = world / 2;
    std::vector<int> mine_half, pair;
    for (int i = 0; i < world; ++i)
      if ((i < half) == (r < half)) mine_half.push_back(i);
    pair = {r & ~1, (r & ~1) + 1};
    if (pair[1] >= world) pair = {r};
    const ProcessGroup groups[3] = {ProcessGroup(all, r, "world"), ProcessGroup(mine_half, r, "half"),
                                    ProcessGroup(pair, r, "pair")};
    std::mt19937_64 rng(seed * 1000 + uint64_t(r));
    for (const Call& c : calls) {
      const ProcessGroup& g = groups[c.group];
      if (c.sleep_us && (r % 3) == int(c.sleep_us % 3))
        std::this_thread::sleep_for(std::chrono::microseconds(c.sleep_us));
      if (c.compute_before) dev.compute().run("work", c.compute_before * Time(1 + r % 3));
      CollOptions opt{c.algo, std::nullopt};
      if (c.on_compute) opt.stream = &dev.compute();
      std::vector<float> out;
      if (c.op == OpKind::kAllReduce) {
        std::vector<float> in(c.count);
        for (float& x : in) x = random_float(rng);
        if (c.in_place) {
          all_reduce(dev, g, in, c.rop, opt);
          out = in;
        } else {
          out.assign(c.count, 1.0f);
          all_reduce(dev, g, ConstBuffer(in), Buffer(out), c.rop, opt);
        }
      } else {
        const Range mine = chunk_range(c.count, g.size(), g.rank());
        out.assign(c.count, 7.0f);
        if (c.in_place) {
          for (int64_t i = 0; i < mine.size; ++i) out[size_t(mine.begin + i)] = random_float(rng);
          all_gather(dev, g, ConstBuffer(out.data() + mine.begin, size_t(mine.size)), Buffer(out), opt);
        } else {
          std::vector<float> in(size_t(mine.size));
          for (float& x : in) x = random_float(rng);
          all_gather(dev, g, ConstBuffer(in), Buffer(out), opt);
        }
      }
      o.outputs[size_t(r)].push_back(std::move(out));
    }
  });
  return o;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

void expect_same(const Outcome& met, const Outcome& msg, const std::string& what) {
  ASSERT_EQ(met.outputs.size(), msg.outputs.size()) << what;
  size_t compared = 0, differing = 0;
  for (size_t r = 0; r < msg.outputs.size(); ++r) {
    ASSERT_EQ(met.outputs[r].size(), msg.outputs[r].size()) << what;
    for (size_t k = 0; k < msg.outputs[r].size(); ++k) {
      ++compared;
      if (!same_bits(met.outputs[r][k], msg.outputs[r][k])) {
        ++differing;
        ADD_FAILURE() << what << ": device " << r << " call " << k << ": result bits differ";
      }
    }
  }
  std::printf("[rendezvous] %s: %zu results compared bit for bit, %zu differ\n", what.c_str(), compared, differing);
  ASSERT_EQ(met.run.devices.size(), msg.run.devices.size());
  Time max_diff = 0;
  for (size_t r = 0; r < msg.run.devices.size(); ++r) {
    const DeviceStats &a = met.run.devices[r], &b = msg.run.devices[r];
    for (auto [x, y] : {std::pair{a.compute_end, b.compute_end}, {a.comm_end, b.comm_end},
                        {a.compute_busy, b.compute_busy}, {a.comm_busy, b.comm_busy},
                        {a.comm_exposed, b.comm_exposed}, {a.compute_transfer, b.compute_transfer}})
      max_diff = std::max(max_diff, x > y ? x - y : y - x);
  }
  std::printf("[rendezvous] %s: max difference of stream ends and busy times %lld ps (tolerance 0)\n",
              what.c_str(), static_cast<long long>(max_diff));
  EXPECT_EQ(max_diff, 0) << what;
  ASSERT_EQ(met.run.traces.size(), msg.run.traces.size());
  size_t events = 0;
  for (size_t t = 0; t < msg.run.traces.size(); ++t) {
    const auto &a = met.run.traces[t].events, &b = msg.run.traces[t].events;
    ASSERT_EQ(a.size(), b.size()) << what << ": device " << t << "'s trace";
    for (size_t i = 0; i < a.size(); ++i) {
      ++events;
      const bool same = std::strcmp(a[i].name, b[i].name) == 0 && a[i].stream == b[i].stream &&
                        a[i].start == b[i].start && a[i].end == b[i].end && a[i].bytes == b[i].bytes &&
                        a[i].peer == b[i].peer;
      if (!same) {
        ADD_FAILURE() << what << ": device " << t << " event " << i << ": " << a[i].name << " [" << a[i].start
                      << ", " << a[i].end << ") peer " << a[i].peer << " vs " << b[i].name << " [" << b[i].start
                      << ", " << b[i].end << ") peer " << b[i].peer;
        return;
      }
    }
  }
  std::printf("[rendezvous] %s: %zu trace events equal\n", what.c_str(), events);
}

TEST(Rendezvous, SameBitsTimesAndTraceAsTheMessages) {
  const uint64_t before = detail::meetings_completed();
  struct Case {
    const char* profile;
    int world;
  };
  // One node of 8 (NVLink, protocols), an odd group inside a node, and two
  // nodes of 4 (groups across nodes: channel rings, which keep messages).
  for (const Case& k : {Case{"a100-nvlink", 8}, Case{"a100-nvlink", 5}, Case{"h100-nvlink", 8}}) {
    HardwareProfile p = load_profile(k.profile);
    for (uint64_t seed = 1; seed <= 3; ++seed) {
      const std::vector<Call> calls = random_calls(seed * 31 + uint64_t(k.world), 40);
      const Outcome met = run_program(p, k.world, calls, seed, true);
      const Outcome msg = run_program(p, k.world, calls, seed, false);
      expect_same(met, msg, fmt::format("{} x{} seed {}", k.profile, k.world, seed));
    }
  }
  HardwareProfile two_nodes = load_profile("a100-nvlink");
  two_nodes.nodes = 2;
  two_nodes.devices_per_node = 4;
  for (uint64_t seed = 1; seed <= 2; ++seed) {
    const std::vector<Call> calls = random_calls(seed * 77, 40);
    expect_same(run_program(two_nodes, 8, calls, seed, true), run_program(two_nodes, 8, calls, seed, false),
                fmt::format("2 nodes x 4 seed {}", seed));
  }
  // The path under test ran (the meetings are counted by their last arrival).
  EXPECT_GT(detail::meetings_completed() - before, 100u);
  std::printf("[rendezvous] %llu meetings\n", static_cast<unsigned long long>(detail::meetings_completed() - before));
}

// The same programs with the devices as fibers (runtime/fiber.h) on 1, 3
// and 8 host threads, meeting and passing messages: every bit, time and
// trace event of the threads' messages.
TEST(Rendezvous, FibersGiveTheThreadsBitsTimesAndTrace) {
  const uint64_t before = detail::meetings_completed();
  HardwareProfile two_nodes = load_profile("a100-nvlink");
  two_nodes.nodes = 2;
  two_nodes.devices_per_node = 4;
  for (const HardwareProfile& p : {load_profile("a100-nvlink"), two_nodes}) {
    for (uint64_t seed = 1; seed <= 2; ++seed) {
      const std::vector<Call> calls = random_calls(seed * 53, 40);
      const Outcome msg = run_program(p, 8, calls, seed, false);
      for (int hosts : {1, 3, 8})
        for (bool meet : {true, false})
          expect_same(run_program(p, 8, calls, seed, meet, hosts), msg,
                      fmt::format("{} nodes, seed {}: {} host threads, {}", p.nodes, seed, hosts,
                                  meet ? "meetings" : "messages"));
    }
  }
  EXPECT_GT(detail::meetings_completed() - before, 100u);
}

TEST(Rendezvous, MembersThatDisagreeFailWithOneError) {
  for (int hosts : {0, 1}) {  // a thread each, and fibers: the sleepers are woken
    ClusterOptions opts;
    opts.world_size = 4;
    opts.host_threads = hosts;
    Cluster cluster(load_profile("a100-nvlink"), opts);
    try {
      shardlab::testing::bounded_run(cluster, [](Device& dev) {
        const ProcessGroup g = ProcessGroup::world(dev);
        std::vector<float> x(dev.rank() == 2 ? 10 : 12, 1.0f);
        all_reduce(dev, g, x, ReduceOp::kSum, {Algo::kDirect, std::nullopt});
      });
      ADD_FAILURE() << "the run completed";
    } catch (const std::exception& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("members disagree"), std::string::npos) << m;
      EXPECT_NE(m.find("10 elements"), std::string::npos) << m;
    }
  }
}

}  // namespace
}  // namespace shardlab::collectives::testing
