// InferPlan: the facts an inference run derives from its split (tp x pp,
// ep replicas of the batch), computed once after every check and passed
// on, as training's ParallelPlan (model/train/parallel_plan.h): the device
// count, the mesh, the rank that chooses the tokens, each stage's placement
// and, for phantom runs, which ranks fold. generate (generate.h) and a
// serving replica (model/serve/cluster_step.h) build one; their devices
// (InferDevice, infer_device.h) read it.
//
// Thread safety: immutable once built; device threads share one.
#pragma once

#include <vector>

#include "collectives/mesh.h"
#include "model/config.h"
#include "model/parallel/pipeline/stage.h"
#include "runtime/cluster.h"

namespace shardlab::infer {

class InferPlan {
 public:
  // Checks the split against the model (ConfigError naming `tp`, `pp` or
  // `ep`) and derives the plan.
  InferPlan(const model::GPTConfig& model, int tp, int pp, int ep, bool kv_fp8 = false);

  // ConfigError unless `cluster` has world devices; `what` names the run
  // ("generate", "a replica") in the message.
  void check_cluster(const Cluster& cluster, const char* what) const;
  // Folding (model/engine/fold.h) under train's rules: the tp peers of a
  // dense model, on uniform links (the ep replicas never fold). Per rank,
  // the rank that runs it.
  std::vector<int> fold_representatives(const HardwareProfile& profile) const;
  // Stage `pp_rank`'s blocks (balanced over the pp stages, resolved by the model).
  parallel::StagePlacement placement(int pp_rank) const {
    parallel::StagePlacement p;
    p.pp = mesh.shape().pp;
    p.rank = pp_rank;
    return p;
  }

  int tp = 1, pp = 1, ep = 1;
  int world = 1;                 // tp × pp × ep
  collectives::DeviceMesh mesh;  // "tp-cp-ep-dp-pp" with dp = ep: the ep ranks carry replicas
  // The rank that chooses the tokens: the last stage's tp rank 0 of ep rank 0.
  int sampler = 0;
  bool moe = false;
  // The KV cache in FP8 (vLLM's --kv-cache-dtype fp8): 1 B an element,
  // quantized as it is appended, read at 1 B by the attention kernels.
  bool kv_fp8 = false;
};

}  // namespace shardlab::infer
