// Shared pieces of the pipeline end-to-end tests: a small 8-block model,
// runs on a profile, the check against the unsharded model, and the
// compute-bound profile on which stages are uniform.
#pragma once

#include <cstdio>
#include <string>

#include <gtest/gtest.h>

#include "model/config.h"
#include "model/train/trainer.h"
#include "model/train/verify.h"
#include "runtime/profile.h"

namespace shardlab::train {

using parallel::ScheduleKind;

// A small model with 8 blocks so pp 4 × vpp 2 has a block per virtual stage.
inline model::GPTConfig small_model(int experts) {
  model::GPTConfig c = model::preset("tiny");
  c.n_layer = 8;
  c.n_embd = 64;
  c.n_head = 4;
  c.block_size = 32;
  c.vocab_size = 64;
  c.batch_size = 8;
  c.n_expert = experts;
  c.top_k = 2;
  c.aux_coef = experts > 0 ? 0.01 : 0.0;
  return c;
}

inline TrainResult run(const TrainOptions& o, const HardwareProfile& profile, bool trace = false) {
  ClusterOptions c;
  c.world_size = o.parallel.world();
  c.trace = trace;
  Cluster cluster(profile, c);
  return train(cluster, o);
}

// Trains `o` and the unsharded model with the same micro-batches; both must agree.
inline void expect_matches_unsharded(const TrainOptions& o) {
  TrainOptions ref = o;
  ref.parallel = {};
  const HardwareProfile& profile = builtin_profiles().front();
  const TrainResult a = run(o, profile), b = run(ref, profile);
  const VerifyResult r = compare_runs(a, b, model::ParamTable(o.model), {.grads = true});
  std::printf("pp %d tp %d dp %d M %d %s vpp %d experts %d: loss rel diff %.2e, param rel L2 %.2e, "
              "grad rel L2 %.2e (tol 1e-5)\n",
              o.parallel.pp, o.parallel.tp, o.parallel.dp, o.micro_batches,
              std::string(parallel::schedule_name(o.parallel.schedule)).c_str(), o.parallel.vpp,
              o.model.n_expert, r.max_loss_rel_diff, r.param_rel_l2, r.grad_rel_l2);
  EXPECT_TRUE(r.passed) << (r.first_mismatch ? r.first_mismatch->kind + " " + r.first_mismatch->name : "");
  EXPECT_LE(r.max_loss_rel_diff, 1e-5);
  EXPECT_LE(r.param_rel_l2, 1e-5);
  EXPECT_LE(r.grad_rel_l2, 1e-5);
}

inline TrainOptions pipeline(int pp, int M, ScheduleKind kind, int experts) {
  TrainOptions o;
  o.model = small_model(experts);
  o.steps = 3;
  o.keep_step0_grads = true;
  o.micro_batches = M;
  o.parallel.pp = pp;
  o.parallel.schedule = kind;
  o.parallel.vpp = parallel::schedule_chunks(kind) == 1 ? 1 : 2;
  return o;
}

// Compute-bound hardware with free links: zero latency, unbounded bandwidth,
// no launch overhead, memory traffic free, every flop at peak (no GEMM
// quantization, no collective start). With wide blocks and a tiny
// vocabulary the embedding and head are negligible, so stages are uniform.
inline HardwareProfile ideal_profile() {
  HardwareProfile p = builtin_profiles().front();
  p.name = "ideal";
  p.device.launch_overhead_us = 0;
  p.device.compute_efficiency = 1.0;
  p.device.gemm = {};
  p.device.collective_launch_us = 0;
  p.device.mem_bandwidth_GBps = 1e9;
  p.intra = p.inter = LinkSpec{0.0, 1e9};
  return p;
}

// Wide blocks, short sequences and an 8-token vocabulary: on ideal_profile()
// the embedding and the head are negligible next to a block, so stages are uniform.
inline TrainOptions uniform_stages(TrainOptions o) {
  o.model.n_embd = 512;
  o.model.block_size = 16;
  o.model.vocab_size = 8;
  o.model.batch_size = 16;
  o.steps = 1;
  o.keep_step0_grads = false;
  return o;
}

}  // namespace shardlab::train
