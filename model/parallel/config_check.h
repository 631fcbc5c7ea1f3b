// The one check of how a model is spread over the devices: every constraint
// of tensor, sequence, pipeline and expert parallelism, in one place, each
// violation one line naming the flag and the rule (ConfigError). The trainer
// calls it before any thread starts; the sharded model calls it again on its
// own share, so a library user who builds one directly gets the same message.
#pragma once

#include <vector>

#include "model/config.h"

namespace shardlab::parallel {

struct ParallelShape {
  int tp = 1;
  bool sp = false;
  int pp = 1;
  int vpp = 1;
  std::vector<int> stage_layers;  // empty = balanced
  int ep = 1;
  int dp = 1;  // the data-parallel ranks ep must divide
};

// tp >= 1 dividing --heads, --vocab and the MLP width (--ffn, 4·--embd by default); --sp needs tp >= 2 and tp
// dividing --seq; the pipeline stages (check_stage_layers); ep >= 1, ep > 1
// only for MoE, dividing --experts and dp.
void check_parallel_shape(const model::GPTConfig& config, const ParallelShape& shape);

// The pieces, for code that needs only one.
void check_tensor_parallel(const model::GPTConfig& config, int tp, bool sequence_parallel);
void check_expert_parallel(const model::GPTConfig& config, int ep, int dp);

}  // namespace shardlab::parallel
