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
  // Expert tensor parallelism (Megatron's expert_tensor_parallel_size): 0
  // or tp, each expert split over the TP group like the dense MLP; 1 with
  // tp > 1, experts whole and the EP group drawn from tp x dp (ep a multiple of tp).
  int expert_tp = 0;
  bool experts_whole() const { return expert_tp == 1 && tp > 1; }
};

// tp >= 1 dividing --heads, --vocab and the MLP width (--ffn, 4·--embd by default); --sp needs tp
// >= 2 and tp dividing --seq; the pipeline stages (check_stage_layers); ep >= 1, ep > 1 only for
// MoE, dividing --experts and dp (with whole experts: a multiple of tp dividing tp x dp, and sp).
void check_parallel_shape(const model::GPTConfig& config, const ParallelShape& shape);

// The pieces, for code that needs only one.
void check_tensor_parallel(const model::GPTConfig& config, int tp, bool sequence_parallel,
                           bool experts_whole = false);
void check_expert_parallel(const model::GPTConfig& config, int ep, int dp);
void check_expert_tensor_parallel(const model::GPTConfig& config, const ParallelShape& shape);

}  // namespace shardlab::parallel
