// Helpers shared by the training-loop tests (tests/model/train).
#pragma once

#include <numeric>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "model/config.h"
#include "model/params.h"
#include "model/train/trainer.h"
#include "runtime/cluster.h"
#include "runtime/fabric.h"
#include "runtime/profile.h"

namespace shardlab::train::testing {

// 4 blocks of width 64 (4 heads), seq 32, vocab 64, a global batch of 8
// sequences, 3 steps; MoE with `experts` > 0 (top-2, aux 0.01).
inline TrainOptions small_options(int experts = 0) {
  TrainOptions o;
  o.model = model::preset("tiny");
  o.model.n_layer = 4;
  o.model.n_embd = 64;
  o.model.n_head = 4;
  o.model.block_size = 32;
  o.model.vocab_size = 64;
  o.model.batch_size = 8;
  o.model.n_expert = experts;
  o.model.top_k = 2;
  o.model.aux_coef = experts > 0 ? 0.01 : 0.0;
  o.steps = 3;
  return o;
}

// Trains `o` on a cluster of exactly its devices (the first builtin profile).
inline TrainResult run(const TrainOptions& o, FabricHooks* hooks = nullptr, bool trace = false,
                       Precision precision = Precision::kFp32) {
  ClusterOptions c;
  c.precision = precision;
  c.world_size = o.parallel.world();
  c.hooks = hooks;
  c.trace = trace;
  Cluster cluster(builtin_profiles().front(), c);
  return train(cluster, o);
}

// `o` on one GPU of `profile` in bf16, traced: the one-layer hand counts
// runs (fused_attention_test, fusions_test).
// `attention_kernel`: one of the profile's fused attention kernels by name
// (select_attention_kernel; "": its default).
inline TrainResult run_one_gpu_bf16(const TrainOptions& o, const char* profile, const char* attention_kernel = "") {
  HardwareProfile p = load_profile(profile);
  select_attention_kernel(p, attention_kernel);
  p.nodes = 1;
  ClusterOptions c;
  c.precision = Precision::kBf16;
  c.world_size = 1;
  c.trace = true;
  Cluster cluster(p, c);
  return train(cluster, o);
}

// The unsharded reference of `o`: the same model, data, steps and micro-batches.
inline TrainOptions unsharded(TrainOptions o) {
  o.parallel = {};
  return o;
}

// The buckets of the unsharded model (element counts, in launch order).
// Backward finishes the tensors from the last in the table to the first
// (ln_f, the blocks from the last, wpe, wte), and in the unsharded flat
// buffer they are adjacent, so a bucket is a run of tensors from the end of
// the buffer, closed once it holds >= bucket_bytes.
inline std::vector<int64_t> bucket_sizes(const model::ParamTable& table, double bucket_bytes) {
  std::vector<int64_t> out;
  int64_t open = 0;
  for (auto s = table.specs().rbegin(); s != table.specs().rend(); ++s) {
    open += s->numel;
    if (double(open) * 4 >= bucket_bytes) out.push_back(open), open = 0;
  }
  if (open > 0) out.push_back(open);
  return out;
}

// ZeRO-1/2's buckets as Megatron pads them: each rounded up to a multiple of
// lcm(dp, 128) elements (model/parallel/data/buckets.h, padded_bucket).
inline std::vector<int64_t> padded(std::vector<int64_t> buckets, int dp) {
  const int64_t align = std::lcm(int64_t(dp), int64_t(128));
  for (int64_t& b : buckets) b = (b + align - 1) / align * align;
  return buckets;
}

// Elements rank r of dp owns: chunk r of each bucket, [n·r/dp, n·(r+1)/dp).
inline int64_t owned(const std::vector<int64_t>& buckets, int dp, int r) {
  int64_t sum = 0;
  for (int64_t n : buckets) sum += n * (r + 1) / dp - n * r / dp;
  return sum;
}

// Two runs' devices ended at the same virtual times with the same busy
// totals and memory peaks (determinism, resume).
inline void expect_same_device_times(const RunResult& x, const RunResult& y, const std::string& what) {
  ASSERT_EQ(x.devices.size(), y.devices.size()) << what;
  for (size_t d = 0; d < x.devices.size(); ++d) {
    const DeviceStats &a = x.devices[d], &b = y.devices[d];
    EXPECT_EQ(a.compute_end, b.compute_end) << what << " device " << d;
    EXPECT_EQ(a.comm_end, b.comm_end) << what << " device " << d;
    EXPECT_EQ(a.compute_busy, b.compute_busy) << what << " device " << d;
    EXPECT_EQ(a.comm_busy, b.comm_busy) << what << " device " << d;
    EXPECT_EQ(a.comm_exposed, b.comm_exposed) << what << " device " << d;
    EXPECT_EQ(a.peak_bytes, b.peak_bytes) << what << " device " << d;
  }
}

// Host jitter: sleeps 0-150 us on one send or receive in four, from a
// per-rank RNG (the run's figures must not move).
class RandomSleeps final : public FabricHooks {
 public:
  explicit RandomSleeps(uint64_t seed) : seed_(seed) {}
  void on_send(int src, int, Tag) override { nap(src); }
  void on_recv(int dst, int, Tag) override { nap(dst); }
  int64_t naps() const { return naps_.load(); }

 private:
  void nap(int rank) {
    thread_local std::mt19937_64 rng;
    thread_local uint64_t seeded_for = ~0ull;
    const uint64_t key = seed_ * 131 + uint64_t(rank);
    if (seeded_for != key) rng.seed(key), seeded_for = key;
    const uint64_t x = rng();
    if (x % 4 != 0) return;
    ++naps_;
    std::this_thread::sleep_for(std::chrono::microseconds((x >> 8) % 150));
  }
  uint64_t seed_;
  std::atomic<int64_t> naps_{0};
};

// sqrt(sum x^2) in double, in flat order.
inline double l2_norm(const std::vector<float>& x) {
  double s = 0;
  for (float v : x) s += double(v) * double(v);
  return std::sqrt(s);
}

}  // namespace shardlab::train::testing
