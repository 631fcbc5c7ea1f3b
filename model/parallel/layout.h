// ShardLayout: the local parameter layout of one rank of the sharded model:
// its tensor-parallel slice (Megatron split) of the tensors its pipeline
// stage and its expert-parallel rank hold.
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
//   mlp.experts.e.*     each expert split like the dense MLP (whole with
//                       LayoutFilter::experts_whole: expert TP 1)
//
// The llama family (Hugging Face names, no biases, no wpe; KVl = KV/tp):
//
//   embed_tokens, lm_head        (V/tp, C)     vocab-parallel (lm_head: the last stage)
//   self_attn.q_proj             (C/tp, C)     rows of heads [r·NH/tp, (r+1)·NH/tp)  (column-parallel)
//   self_attn.k_proj, v_proj     (KVl·HS, C)   rows of K/V heads [r·KVl, (r+1)·KVl) when tp divides
//                                (KV·HS, C)      KV, else whole on every rank, gradients summed over TP
//   self_attn.o_proj             (C, C/tp)     columns of the query heads                (row-parallel)
//   mlp.gate_proj, up_proj       (F/tp, C)     rows [r·F/tp, (r+1)·F/tp)                 (column-parallel)
//   mlp.down_proj                (C, F/tp)     the same columns                          (row-parallel)
//   the RMSNorm weights          (C)           replicated
//
// Which rule applies is the tensor's model::ParamRole (no name matching).
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

// Which tensors a rank holds, beyond its tensor-parallel slice: a pipeline
// stage holds some blocks (and wte / wpe / ln_f only on the first / last
// stage), an expert-parallel rank holds experts [expert_begin, expert_end) of
// every MoE block. The default holds everything.
struct LayoutFilter {
  std::vector<bool> layers;  // (n_layer) or empty = every block
  bool wte = true, wpe = true, ln_f = true;
  int expert_begin = 0, expert_end = -1;  // -1: to the last expert
  // Expert tensor parallelism 1: the experts held are whole on this rank
  // (not split over tp, not replicated over it: the TP ranks hold different ones).
  bool experts_whole = false;
  bool holds_layer(int l) const { return layers.empty() || layers[static_cast<size_t>(l)]; }
  bool holds_expert(int e) const { return e >= expert_begin && (expert_end < 0 || e < expert_end); }
};

// Llama K/V projections split over tp by K/V heads (tp divides kv_heads);
// otherwise every TP rank holds them whole (Megatron-LM's rule for
// num_query_groups < tp).
inline bool kv_split(const model::GPTConfig& c, int tp) { return c.kv_heads() % tp == 0; }

class ShardLayout {
 public:
  ShardLayout(const model::GPTConfig& config, int tp, int rank, LayoutFilter filter = {});
  // The same over `table`, the config's parameter table, built once by a
  // caller that lays out many ranks (the preflight: a DeepSeek-V3 table holds
  // some 46,000 tensors).
  ShardLayout(const model::ParamTable& table, const model::GPTConfig& config, int tp, int rank,
              LayoutFilter filter = {});

  const std::vector<ShardSpec>& shards() const { return shards_; }
  int64_t numel() const { return numel_; }
  const ShardSpec& at(std::string_view name) const;
  bool holds(std::string_view name) const { return index_.count(std::string(name)) > 0; }
  const LayoutFilter& filter() const { return filter_; }
  // Flat ranges of every local tensor of block l, of wte, wpe and ln_f.
  Range block(int l) const { return blocks_[static_cast<size_t>(l)]; }
  Range prefix(std::string_view prefix) const { return model::prefix_range(shards_, prefix); }

  // Fills params (numel()) with exactly this rank's slice of the unsharded init.
  void init(const model::ParamTable& table, uint64_t seed, float* params) const;
  // Views of every local tensor inside `base` (params or grads) with local
  // sizes. Tensors not held stay null; blocks not held are empty views; an
  // MoE block's `experts` lists the held experts only, in order.
  model::GPTView<float> view(float* base) const;

 private:
  bool holds_spec(const model::ParamSpec& p) const;
  void note_block(const ShardSpec& s);  // extends blocks_ over a block's new tensor
  model::GPTView<float> gpt_view(float* base) const;
  model::GPTView<float> llama_view(float* base) const;
  void add(const model::ParamSpec& p, Shape local, int split_dim,
           std::vector<Range> ranges, bool replicated);

  model::GPTConfig config_;
  int tp_ = 1, rank_ = 0;
  LayoutFilter filter_;
  std::vector<ShardSpec> shards_;
  std::unordered_map<std::string, size_t> index_;
  std::vector<Range> blocks_;
  int64_t numel_ = 0;
};

}  // namespace shardlab::parallel
