// Helpers for the collectives tests: run one SPMD program, deterministic
// inputs whose sums are exact in any order (small integers), serial references.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <numeric>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include <fmt/format.h>

#include "collectives/collectives.h"
#include "collectives/mesh.h"
#include "runtime/errors.h"
#include "runtime/cluster.h"
#include "support/compare.h"

namespace shardlab::collectives::testing {

// Element i of member r's input: a small integer, so sums are exact.
inline float int_input(int r, size_t i, int salt = 0) {
  return static_cast<float>(static_cast<int>((r * 7 + i * 13 + static_cast<size_t>(salt) * 5) % 17) - 8);
}

inline std::vector<float> int_inputs(int r, size_t count, int salt = 0) {
  std::vector<float> v(count);
  for (size_t i = 0; i < count; ++i) v[i] = int_input(r, i, salt);
  return v;
}

// Serial reference of op over members 0..n-1 of element i.
inline float reference(ReduceOp op, int n, size_t i, int salt = 0) {
  float acc = int_input(0, i, salt);
  for (int r = 1; r < n; ++r)
    acc = op == ReduceOp::kMax ? std::max(acc, int_input(r, i, salt)) : acc + int_input(r, i, salt);
  return op == ReduceOp::kAvg ? acc / static_cast<float>(n) : acc;
}

// Failures found on device threads, reported after the run.
class Failures {
 public:
  void add(std::string s) {
    std::lock_guard lock(mu_);
    if (list_.size() < 20) list_.push_back(std::move(s));
    ++count_;
  }
  void expect_none() const {
    std::lock_guard lock(mu_);
    EXPECT_EQ(count_, 0u) << (list_.empty() ? "" : list_.front()) << (list_.size() > 1 ? "\n" + list_[1] : "");
  }

 private:
  mutable std::mutex mu_;
  std::vector<std::string> list_;
  size_t count_ = 0;
};

// Compares got[0..count) with want(i); records a failure (with the max
// difference, where, and the tolerance) when any element is NaN or Inf or the
// max |got - want| is above `tol`. Exact (tol 0) by default: inputs are small
// integers, so every reduction order gives the same floats.
template <class Want>
shardlab::testing::Diff check_range(Failures& f, const std::string& what, const float* got, size_t count,
                                    Want want, double tol = 0) {
  std::vector<float> expected(count);
  for (size_t i = 0; i < count; ++i) expected[i] = static_cast<float>(want(i));
  const std::span<const float> g(got, count);
  const auto result = shardlab::testing::all_close(g, expected, tol);
  if (!result) f.add(what + ": " + result.message());
  return shardlab::testing::diff(g, std::span<const float>(expected));
}

// One node of `devices` on plain links (latency, bandwidth; no packet headers),
// no protocols (plain sends) and no collective start: the link model's closed
// forms alone.
inline HardwareProfile uniform_profile(int devices, double latency_us = 2.0, double gbps = 300.0) {
  HardwareProfile p = load_profile("a100-nvlink");
  p.name = "uniform";
  p.nodes = 1;
  p.devices_per_node = devices;
  p.intra = {latency_us, gbps};
  p.device.collective_launch_us = 0;
  p.protocols.clear();
  return p;
}

// Group indices 0..n-1: the first n devices.
inline std::vector<int> first_ranks(int n) {
  std::vector<int> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 0);
  return v;
}

// A built-in profile on `nodes` nodes.
inline HardwareProfile nodes_of(const char* name, int nodes) {
  HardwareProfile p = load_profile(name);
  p.nodes = nodes;
  return p;
}

// Sleeps 0-40 us at about one channel operation in four, from a seeded hash:
// shakes the host's thread schedule (determinism tests).
class RandomSleeps : public FabricHooks {
 public:
  explicit RandomSleeps(uint64_t seed) : seed_(seed) {}
  void on_send(int src, int dst, Tag tag) override { maybe_sleep(src, dst, tag); }
  void on_recv(int dst, int src, Tag tag) override { maybe_sleep(dst + 1000, src, tag); }

 private:
  void maybe_sleep(int a, int b, Tag tag) {
    uint64_t h = seed_ ^ (tag * 0x9E3779B97F4A7C15ull) ^ (static_cast<uint64_t>(a) << 32) ^ static_cast<uint64_t>(b);
    h ^= counter_.fetch_add(1, std::memory_order_relaxed) * 0xBF58476D1CE4E5B9ull;
    h ^= h >> 31;
    h *= 0x94D049BB133111EBull;
    h ^= h >> 29;
    if (h % 4 == 0) std::this_thread::sleep_for(std::chrono::microseconds(h % 41));
  }
  uint64_t seed_;
  std::atomic<uint64_t> counter_{0};
};

inline RunResult run_on(int n, const Cluster::Program& program, const HardwareProfile& profile,
                        FabricHooks* hooks = nullptr) {
  ClusterOptions opts;
  opts.world_size = n;
  opts.hooks = hooks;
  Cluster cluster(profile, opts);
  return cluster.run(program);
}

inline RunResult run_on(int n, const Cluster::Program& program) {
  return run_on(n, program, load_profile("a100-nvlink"));
}

}  // namespace shardlab::collectives::testing
