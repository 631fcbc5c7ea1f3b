// The local parameter layout of one tensor-parallel rank (Megatron split).
//
// Tensors follow the ParamTable's order with local shapes (tp ranks, rank r,
// C n_embd, NH heads, HS = C/NH, V vocab, E experts, F = 4C):
//
//   wte                 (V/tp, C)   rows [r·V/tp, (r+1)·V/tp)      vocab-parallel
//   wpe                 (T, C)      replicated
//   ln_1, ln_2, ln_f    (C)         replicated
//   attn.c_attn.weight  (3C/tp, C)  rows of heads [r·NH/tp, (r+1)·NH/tp): three
//   attn.c_attn.bias    (3C/tp)       ranges, one in each of q, k, v (column-parallel)
//   attn.c_proj.weight  (C, C/tp)   columns of those heads               (row-parallel)
//   attn.c_proj.bias    (C)         replicated, added once after the reduction
//   mlp.c_fc.weight     (F/tp, C)   rows [r·F/tp, (r+1)·F/tp)            (column-parallel)
//   mlp.c_fc.bias       (F/tp)
//   mlp.c_proj.weight   (C, F/tp)   the same columns                     (row-parallel)
//   mlp.c_proj.bias     (C)         replicated
//   mlp.router.weight   (E, C)      replicated (MoE blocks)
//   mlp.experts.e.*     each expert split like the dense MLP
//
// Each block's tensors stay contiguous (grads_ready ranges).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "model/config.h"
#include "model/layers.h"
#include "model/parallel/local_model.h"
#include "model/params.h"

namespace shardlab::parallel {

// Throws ConfigError with one line naming the flag and the constraint:
// tp >= 1, heads % tp, vocab % tp, 4·embd % tp, and with SP seq % tp.
void check_tensor_parallel_config(const model::GPTConfig& config, int tp, bool sequence_parallel);

struct FlatRange {
  int64_t offset = 0;
  int64_t count = 0;
};

class TpLayout {
 public:
  TpLayout(const model::GPTConfig& config, int tp, int rank);

  const std::vector<ShardSpec>& shards() const { return shards_; }
  int64_t numel() const { return numel_; }
  const ShardSpec& at(std::string_view name) const;
  // Flat ranges of every local tensor of block l, of wte, wpe and ln_f.
  FlatRange block(int l) const { return blocks_[static_cast<size_t>(l)]; }
  FlatRange prefix(std::string_view prefix) const;

  // Fills params (numel()) with exactly this rank's slice of the unsharded init.
  void init(const model::ParamTable& table, uint64_t seed, float* params) const;
  // Views of every local tensor inside `base` (params or grads) with local sizes.
  model::GPTView<float> view(float* base) const;

 private:
  void add(const model::ParamSpec& p, Shape local, int split_dim,
           std::vector<ShardSpec::Range> ranges, bool replicated);

  model::GPTConfig config_;
  int tp_ = 1, rank_ = 0;
  std::vector<ShardSpec> shards_;
  std::unordered_map<std::string, size_t> index_;
  std::vector<FlatRange> blocks_;
  int64_t numel_ = 0;
};

}  // namespace shardlab::parallel
