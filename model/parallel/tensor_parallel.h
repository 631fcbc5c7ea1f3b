// TensorParallelGPT: one tensor-parallel rank of the GPT (Megatron style).
//
// Each rank of the TP group holds the slices listed in tp_layout.h: attention
// heads [r·NH/tp, (r+1)·NH/tp) (c_attn column-parallel, c_proj row-parallel),
// MLP columns [r·4C/tp, ...) (the same for each MoE expert), vocabulary rows
// [r·V/tp, ...) of the tied wte, and whole copies of the replicated tensors
// (LayerNorms, wpe, row-parallel biases, the MoE router). Communication is in
// tp_mappings.h (conjugate pairs), blocks in tp_layers.h, embedding and the
// vocab-parallel loss in tp_embedding.h.
//
// Every rank of the group runs forward/backward on the SAME batch (the DP
// shard of this TP group) and gets the same loss. Gradients of replicated
// tensors come out bit-identical on every TP rank: without SP they are
// computed from replicated activations; with SP the LayerNorm and wpe
// gradients (sums over this rank's rows) are all-reduced over TP, per block,
// before grads_ready. Row-parallel biases and the router get their complete
// gradient on every rank from the gathered output gradient (no reduction).
//
// Sequence parallelism (sequence_parallel = true): the LayerNorm / residual
// regions hold this rank's contiguous block of N/tp rows of the N = B·T rows
// (rows [r·N/tp, (r+1)·N/tp) of the (B,T) batch flattened); T % tp == 0.
//
// The OpSink receives every kernel (names as in model/layers.cc, plus
// "*.bias.fwd" for the row-parallel bias added after the reduction),
// saved/freed activations, and grads_ready(offset, count) per block (local
// flat ranges, in backward order: ln_f, blocks L-1..0, wte, wpe).
// Communication goes through the blocking collectives on the TP group (the
// device's comm stream; the compute stream waits for each result).
//
// MoE blocks: with MoeGroups::ep the experts are spread over the EP group and
// tokens are exchanged by all-to-all (ep_moe.h); with MoeGroups::capacity the
// routing statistics and capacity drops follow the whole data-parallel batch.
//
// Thread safety: one instance per device thread; the group must be this
// device's TP group and is used for nothing else while forward/backward run.
#pragma once

#include <optional>
#include <vector>

#include "collectives/group.h"
#include "model/config.h"
#include "model/parallel/local_model.h"
#include "model/parallel/tp_layers.h"
#include "model/parallel/tp_layout.h"

namespace shardlab::parallel {

// Groups of the MoE layers beyond TP (see TpContext). Both optional.
struct MoeGroups {
  // Expert parallelism: the mesh's "ep" group. This rank then holds experts
  // [r·E/ep, (r+1)·E/ep) of every MoE block (r = its rank in the group).
  const collectives::ProcessGroup* ep = nullptr;
  // The data-parallel group ("dp", data order), for routing that follows the
  // global batch exactly (f_i and capacity drops). Pass the very group object
  // used for DataParallel: copies share its collective sequence counter.
  const collectives::ProcessGroup* capacity = nullptr;
};

class TensorParallelGPT final : public LocalModel {
 public:
  // Throws ConfigError (check_tensor_parallel_config,
  // check_expert_parallel_config) before any work.
  TensorParallelGPT(const model::GPTConfig& config, uint64_t seed, Device& dev,
                    const collectives::ProcessGroup& tp_group, bool sequence_parallel,
                    const MoeGroups& moe = {});
  TensorParallelGPT(const TensorParallelGPT&) = delete;
  TensorParallelGPT& operator=(const TensorParallelGPT&) = delete;

  // inputs, targets: (B,T), the same on every TP rank. targets may be null
  // (logits only, returns 0). Throws ConfigError for a bad B, T or token.
  float forward(const model::Token* inputs, const model::Token* targets, int B, int T) override;
  void backward() override;
  void zero_grad() override;

  std::span<float> params() override { return params_; }
  std::span<float> grads() override { return grads_; }
  const std::vector<ShardSpec>& shards() const override { return layout_.shards(); }
  float ce_loss() const override { return ce_loss_; }
  float aux_loss() const override { return aux_loss_; }
  void set_sink(model::OpSink* sink) override { ctx_.ex = model::Exec::with(sink); }

  int ep_size() const { return ep_group_ ? ep_group_->size() : 1; }
  // What MoE block `layer` did in the last forward (null for dense blocks or
  // before the first forward): rows per held expert, drops, all-to-all bytes.
  const MoeStats* moe_stats(int layer) const;
  int tp_size() const { return group_.size(); }
  int tp_rank() const { return group_.rank(); }
  bool sequence_parallel() const { return ctx_.sp; }
  const TpLayout& layout() const { return layout_; }
  // This rank's vocabulary logits (B,T,V/tp) of the last forward.
  std::span<const float> local_logits() const { return {logits_.data(), logits_.size()}; }

 private:
  void check_inputs(const model::Token* inputs, const model::Token* targets, int B, int T) const;
  void resize_activations(int B, int T);
  void release_activations();
  // SP: all-reduce the staged row-sum gradients of replicated tensors over TP
  // and add them to grads (then clear the stage).
  void reduce_staged(const std::vector<FlatRange>& ranges);
  void grads_ready(FlatRange r) const {
    if (ctx_.ex.sink && r.count > 0) ctx_.ex.sink->grads_ready(r.offset, r.count);
  }
  void saved(int64_t n) const {
    if (ctx_.ex.sink) ctx_.ex.sink->saved(n);
  }
  void freed(int64_t n) const {
    if (ctx_.ex.sink) ctx_.ex.sink->freed(n);
  }

  model::GPTConfig config_;
  collectives::ProcessGroup group_;
  std::optional<collectives::ProcessGroup> ep_group_, capacity_group_;
  TpContext ctx_;
  TpLayout layout_;
  int64_t v0_ = 0;             // first vocabulary row owned
  int Vl_ = 0;                 // V/tp
  Buf<float> params_, grads_;  // (P local)
  Buf<float> stage_;           // (P local) SP: row-sum grads of replicated tensors
  model::GPTView<float> w_, g_;
  // SP-staged tensors (LayerNorms, wpe): per block, ln_f, wpe.
  std::vector<std::vector<FlatRange>> block_staged_;
  std::vector<FlatRange> lnf_staged_, wpe_staged_;
  Buf<float> pack_;
  FlatRange wte_range_, wpe_range_, lnf_range_;

  // Activations of the last forward.
  TpDims dims_;
  Buf<model::Token> inputs_, targets_;    // (N)
  Buf<float> encoded_;                    // (Nr,C)
  std::vector<TpBlockActs> blocks_;       // (n_layer)
  Buf<float> lnf_, lnf_mean_, lnf_rstd_;  // (Nr,C), (Nr), (Nr)
  Buf<float> logits_, probs_;             // (N,Vl)
  Buf<float> losses_, ce_stats_;          // (N), (3N)
  std::vector<int64_t> block_elems_;
  int64_t head_elems_ = 0;
  bool acts_live_ = false;
  bool have_targets_ = false;
  float ce_loss_ = 0, aux_loss_ = 0;

  // Backward scratch.
  TpScratch scratch_;
  Buf<float> dlogits_;              // (N,Vl)
  Buf<float> dlnf_, dx_, dx_next_;  // (Nr,C)
};

}  // namespace shardlab::parallel
