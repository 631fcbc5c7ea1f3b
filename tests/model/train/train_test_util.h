// Helpers shared by the training-loop tests (tests/model/train).
#pragma once

#include <cmath>
#include <vector>

#include "model/config.h"
#include "model/train/trainer.h"
#include "runtime/cluster.h"
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
inline TrainResult run(const TrainOptions& o, FabricHooks* hooks = nullptr, bool trace = false) {
  ClusterOptions c;
  c.world_size = o.parallel.world();
  c.hooks = hooks;
  c.trace = trace;
  Cluster cluster(builtin_profiles().front(), c);
  return train(cluster, o);
}

// The unsharded reference of `o`: the same model, data, steps and micro-batches.
inline TrainOptions unsharded(TrainOptions o) {
  o.parallel = {};
  return o;
}

// sqrt(sum x^2) in double, in flat order.
inline double l2_norm(const std::vector<float>& x) {
  double s = 0;
  for (float v : x) s += double(v) * double(v);
  return std::sqrt(s);
}

}  // namespace shardlab::train::testing
