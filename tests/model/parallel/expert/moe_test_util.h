// What the expert-parallel tests share: a tiny MoE's training options (4 MoE
// blocks of 8 experts, C 64, T 32, 3 steps keeping step 0's gradients) and a
// run on the first built-in profile, optionally with nodes of `per_node`
// devices (so that a small EP group spans nodes).
#pragma once

#include "model/config.h"
#include "model/train/trainer.h"
#include "runtime/profile.h"

namespace shardlab::train::testing {

inline TrainOptions tiny_moe_options(int dp, int ep, int top_k = 2, double capacity = 0) {
  TrainOptions o;
  o.model = model::preset("tiny");
  o.model.n_embd = 64;
  o.model.block_size = 32;
  o.model.vocab_size = 64;
  o.model.n_expert = 8;
  o.model.top_k = top_k;
  o.model.aux_coef = 0.01;
  o.model.capacity_factor = capacity;
  o.steps = 3;
  o.keep_step0_grads = true;
  o.parallel.dp = dp;
  o.parallel.ep = ep;
  return o;
}

// per_node 0: the profile's own nodes.
inline TrainResult run_moe(const TrainOptions& o, int per_node = 0) {
  HardwareProfile p = builtin_profiles().front();
  if (per_node > 0) {
    p.devices_per_node = per_node;
    p.nodes = (o.parallel.world() + per_node - 1) / per_node;
  }
  ClusterOptions c;
  c.world_size = o.parallel.world();
  Cluster cluster(p, c);
  return train(cluster, o);
}

}  // namespace shardlab::train::testing
