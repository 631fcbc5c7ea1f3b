// Shared by phantom_test.cc and fold_test.cc: a training configuration run
// real, phantom, folded or not, and the comparison of every figure the
// report prints per device.
#pragma once

#include <ostream>
#include <string>
#include <utility>

#include <gtest/gtest.h>

#include "tests/model/train/train_test_util.h"

namespace shardlab::train::phantom_testing {

using testing::small_options;

struct Config {
  std::string name;
  TrainOptions options;
  Precision precision = Precision::kFp32;
  int nodes = 1;
  std::string profile = "a100-nvlink";
  // Whether some folding survives; false where the run must fall back to
  // no folding.
  bool folds = true;
  // The threads the folded run must end with (0: not checked): where
  // collectives share ports with other streams, the replay's shared ports
  // (collectives/folded.cc) must keep the folding, not only stay exact.
  int running = 0;
};

inline void PrintTo(const Config& c, std::ostream* os) { *os << c.name; }

inline TrainResult run_on(const Config& c, bool phantom, bool fold = true, FabricHooks* hooks = nullptr) {
  TrainOptions o = c.options;
  o.phantom = phantom;
  o.fold = fold;
  HardwareProfile p = load_profile(c.profile);
  p.nodes = c.nodes;
  ClusterOptions co;
  co.precision = c.precision;
  co.world_size = o.parallel.world();
  co.hooks = hooks;
  Cluster cluster(p, co);
  return train(cluster, o);
}

// Every per-device figure the report prints, exactly.
inline void expect_same_devices(const TrainResult& a, const TrainResult& b) {
  ASSERT_EQ(a.run.devices.size(), b.run.devices.size());
  for (size_t r = 0; r < a.run.devices.size(); ++r) {
    const DeviceStats &x = a.run.devices[r], &y = b.run.devices[r];
    SCOPED_TRACE("device " + std::to_string(r));
    EXPECT_EQ(x.compute_end, y.compute_end);
    EXPECT_EQ(x.comm_end, y.comm_end);
    EXPECT_EQ(x.compute_busy, y.compute_busy);
    EXPECT_EQ(x.comm_busy, y.comm_busy);
    EXPECT_EQ(x.comm_exposed, y.comm_exposed);
    EXPECT_EQ(x.compute_transfer, y.compute_transfer);
    EXPECT_EQ(x.compute_flops, y.compute_flops);
    EXPECT_EQ(x.peak_bytes, y.peak_bytes);
    for (int k = 0; k < kNumMemKinds; ++k) EXPECT_EQ(x.peak_by_kind[k], y.peak_by_kind[k]) << mem_kind_name(MemKind(k));
  }
  ASSERT_EQ(a.steps.size(), b.steps.size());
  for (size_t s = 0; s < a.steps.size(); ++s) EXPECT_EQ(a.steps[s].virtual_end, b.steps[s].virtual_end);
  EXPECT_EQ(a.bubble_fraction, b.bubble_fraction);
  ASSERT_EQ(a.phases.size(), b.phases.size());
  for (size_t r = 0; r < a.phases.size(); ++r)
    for (size_t s = 0; s < a.phases[r].size(); ++s) {
      EXPECT_EQ(a.phases[r][s].start, b.phases[r][s].start);
      EXPECT_EQ(a.phases[r][s].end, b.phases[r][s].end);
      EXPECT_EQ(a.phases[r][s].busy, b.phases[r][s].busy);
      EXPECT_EQ(a.phases[r][s].p2p_bytes, b.phases[r][s].p2p_bytes);
    }
  // Context parallelism's K/V exchange per rank (the report's "cp" block):
  // a folded rank reports its representative's.
  ASSERT_EQ(a.cp.size(), b.cp.size());
  for (size_t r = 0; r < a.cp.size(); ++r) {
    EXPECT_EQ(a.cp[r].sent_bytes, b.cp[r].sent_bytes) << "cp record of device " << r;
    EXPECT_EQ(a.cp[r].exposed, b.cp[r].exposed) << "cp record of device " << r;
  }
  // MoE per device (the report's "moe" block: which experts it holds, the
  // rows each got, drops, all-to-all bytes) and per layer over the run.
  ASSERT_EQ(a.moe.size(), b.moe.size());
  for (size_t r = 0; r < a.moe.size(); ++r) {
    ASSERT_EQ(a.moe[r].size(), b.moe[r].size()) << "moe layers of device " << r;
    for (size_t l = 0; l < a.moe[r].size(); ++l) {
      const MoeLayerTotals &x = a.moe[r][l], &y = b.moe[r][l];
      EXPECT_EQ(x.layer, y.layer) << "device " << r;
      EXPECT_EQ(x.expert_begin, y.expert_begin) << "device " << r << " layer " << x.layer;
      EXPECT_EQ(x.per_step, y.per_step) << "device " << r << " layer " << x.layer;
      EXPECT_EQ(x.dropped, y.dropped) << "device " << r << " layer " << x.layer;
      EXPECT_EQ(x.a2a_sent_bytes, y.a2a_sent_bytes) << "device " << r << " layer " << x.layer;
      EXPECT_EQ(x.a2a_recv_bytes, y.a2a_recv_bytes) << "device " << r << " layer " << x.layer;
    }
  }
  ASSERT_EQ(a.moe_layers.size(), b.moe_layers.size());
  for (size_t l = 0; l < a.moe_layers.size(); ++l) {
    EXPECT_EQ(a.moe_layers[l].tokens, b.moe_layers[l].tokens) << "layer " << a.moe_layers[l].layer;
    EXPECT_EQ(a.moe_layers[l].imbalance, b.moe_layers[l].imbalance) << "layer " << a.moe_layers[l].layer;
  }
}

// An aux-loss-free, dropless MoE (DeepSeek-V3's routing) on h100-nvlink
// nodes in bf16, one step: `experts` over ep `ep`, `running` threads folded.
inline void aux_free_moe(Config& c, int experts, int ep, int batch, int nodes, int running) {
  c.options.model.n_expert = experts;
  c.options.model.aux_coef = 0;
  c.options.model.router_bias_rate = 0.01;
  c.options.model.batch_size = batch;
  c.options.parallel.ep = ep;
  c.options.steps = 1;
  c.precision = Precision::kBf16;
  c.profile = "h100-nvlink";
  c.nodes = nodes;
  c.running = running;
}

Config make(std::string name, int tp, int pp, int dp, int M, auto&& tweak) {
  Config c{std::move(name), small_options()};
  c.options.steps = 2;
  c.options.parallel.tp = tp;
  c.options.parallel.pp = pp;
  c.options.parallel.dp = dp;
  c.options.micro_batches = M;
  tweak(c);
  return c;
}

}  // namespace shardlab::train::phantom_testing
