// ShardedGPT: the one sharded GPT (Megatron's GPTModel with its pre-process
// and post-process flags). Every sharded run — TP, SP, PP, EP and their
// products — is this model; each rank holds
//
//   its tensor-parallel slice (tensor/: Megatron column/row parallel layers,
//     vocabulary-parallel embedding and loss, sequence parallelism),
//   the blocks of its pipeline chunks (pipeline/stage.h: a description, the
//     first stage with the embeddings, the last with ln_f and the tied head),
//   its experts of every MoE block (expert/: routing, all-to-all dispatch),
//
// in one flat parameter buffer laid out by ShardLayout (layout.h), whose
// ShardSpecs say which slice of which unsharded tensor each local tensor is.
//
// Micro-batches. forward(c, mb, ...) keeps the activations of (c, mb) in a
// slot until backward_input(c, mb) frees them, block by block as each
// block's B is done (as autograd frees a node's saved tensors); a slot also holds the input
// gradient until it is sent and the deferred weight gradients (the W stash,
// weight_grad.h) until backward_weight(c, mb). Slots and receive buffers are
// reused, so the host allocates only while the micro-batches in flight grow,
// and the arena sees exactly the schedule's stash. Between stages an
// activation is (Nr, C): this TP rank's rows (N/tp with SP, all N without).
//
// Gradients accumulate over the micro-batches of a step. They are announced
// final (OpSink::grads_ready, for data-parallel buckets) by the chunk's final
// backward action, block by block: ln_f, the blocks from last to first, then
// wpe, and wte when this rank holds both its uses (the first and the last
// stage); otherwise the trainer sums the two wte copies over the embedding
// group and announces it. With SP the LayerNorm and wpe gradients are row
// sums, staged per rank and summed over TP when they become final. The
// chunk's earlier backwards announce the same ranges partial
// (OpSink::grads_partial: ZeRO-2 reduces each micro-batch's part).
//
// Hooks for what comes next: BlockHooks are called around every block's
// forward and backward (an FSDP unit gathers its parameters before and frees
// them after); the attention core is a BlockContext member (ring attention).
//
// Thread safety: one instance per device thread.
#pragma once

#include <memory>

#include <optional>
#include <span>
#include <vector>

#include "collectives/group.h"
#include "model/config.h"
#include "model/parallel/block.h"
#include "model/parallel/block_hooks.h"
#include "model/parallel/layout.h"
#include "model/parallel/local_model.h"
#include "model/parallel/pipeline/stage_model.h"
#include "model/parallel/recompute.h"
#include "model/parallel/weight_grad.h"

namespace shardlab::parallel {

// The groups the model communicates over (from ParallelContext).
struct ModelGroups {
  const collectives::ProcessGroup* tp = nullptr;  // required
  // Expert parallelism: this rank holds experts [r·E/ep, (r+1)·E/ep) of every
  // MoE block (r = its rank in the group). Null or size 1: every expert.
  const collectives::ProcessGroup* ep = nullptr;
  // The data-parallel group, for MoE routing that follows the global batch
  // (f_i and capacity drops). Null: f_i averaged, capacity local.
  const collectives::ProcessGroup* capacity = nullptr;
  // DeepEP's dispatcher (expert/ep_node_dispatch.h): ep's members on this
  // node and at this place on every node. Null: the all-to-all dispatcher.
  const collectives::ProcessGroup* ep_node = nullptr;
  const collectives::ProcessGroup* ep_rail = nullptr;
};

struct ShardedOptions {
  bool sequence_parallel = false;
  // With SP: the blocks' TP collectives overlapped with their GEMMs
  // (tensor/mappings.h, "Communication overlap"), on a stream of their own.
  bool tp_comm_overlap = false;
  // Megatron-LM's scatter/gather between pipeline stages (Narayanan et al.
  // 2021, sec. 4.1), without SP: each TP rank sends and receives 1/tp of the
  // (replicated) boundary tensor, then the TP group all-gathers it.
  bool scatter_gather = false;
  Recompute recompute = Recompute::kNone;
  unsigned recompute_modules = kRecomputeCoreAttn;  // kSelective's RecomputeModule mask
  // kFull's blocks (recompute.h): method and N (1: every block, alone).
  RecomputeMethod recompute_method = RecomputeMethod::kUniform;
  int recompute_num_layers = 1;
  StagePlacement placement;  // default: every block on one stage
  const AttentionCore* attention = nullptr;  // null: LocalAttention
  // Context parallelism: this rank's place among cp ranks (the micro-batch's
  // T is then its share T/cp of each sequence, ShardDims::position); with cp > 1
  // `attention` is the CpAttention over the cp group.
  int cp = 1, cp_rank = 0;
  bool flash = false;  // `attention` is FusedAttention (ShardDims::flash)
  BlockHooks* hooks = nullptr;
  double phantom_zipf = 0;  // phantom runs: MoE routing skew (ExpertContext::phantom_zipf)
  // Expert tensor parallelism 1 (needs sequence_parallel with tp > 1): the
  // experts whole, groups.ep drawn from tp x dp, each rank routing its own
  // rows (ShardDims::experts_whole); the router's gradient then sums over tp.
  bool experts_whole = false;
  // Megatron's --overlap-moe-expert-parallel-comm: the token exchanges on an
  // EP communication stream, each followed by a yield to the other program
  // of an Interleave (ExpertContext::a2a_stream); the backward passes then
  // use scratch of their own, since a forward may be suspended mid-block.
  bool ep_comm_overlap = false;
  // With ep_comm_overlap, Megatron's --delay-wgrad-compute: each MoE
  // backward's expert weight gradients run once its dispatch exchange is
  // posted (ExpertContext::delayed_wgrad).
  bool delay_wgrad = false;
  // The config's parameter table, built once by a caller that builds many
  // ranks (train(): a DeepSeek-V3 table holds some 46,000 tensors, ~10 MB a
  // thread would build and drop); null: the layout builds its own.
  const model::ParamTable* table = nullptr;
  // Inference: no gradient buffer (grads() empty; the host would zero a
  // copy of the weights' size that nothing reads).
  bool no_grads = false;
};

// Which tensors a rank holds: its chunks' blocks, the embeddings on the first
// stage, ln_f and the head on the last, experts [r·E/ep, (r+1)·E/ep) of its
// expert-parallel rank r. `placement` must be resolved.
LayoutFilter rank_filter(const model::GPTConfig& config, const StagePlacement& placement, int ep,
                         int ep_rank, bool experts_whole = false);

// The hook points of a rank's chunks under `placement` (resolved), in the
// order ShardedGPT calls BlockHooks (block_hooks.h).
std::vector<HookChunk> hook_chunks(const StagePlacement& placement);

class ShardedGPT final : public LocalModel, public StageModel {
 public:
  // Throws ConfigError for a bad configuration before any work.
  ShardedGPT(const model::GPTConfig& config, uint64_t seed, Device& dev, const ModelGroups& groups,
             const ShardedOptions& options = {});
  ShardedGPT(const ShardedGPT&) = delete;
  ShardedGPT& operator=(const ShardedGPT&) = delete;

  // Sets the micro-batch shape (rows B, time T: this rank's tokens of a
  // sequence under context parallelism) before the first forward.
  void set_micro_batch(int B, int T);

  // StageModel (the pipeline executor's calls).
  const StagePlacement& placement() const override { return place_; }
  int64_t boundary_elements() const override { return dims_.rows() * dims_.C; }
  int boundary_parts() const override;
  int boundary_part() const override { return tp_group_.rank(); }
  void gather_boundary(float* buffer) override;
  float* activation_buffer(int chunk, int buffer) override;
  float* gradient_buffer(int chunk, int buffer) override;
  void forward(int chunk, int mb, int buffer, const MicroBatchTokens& tokens) override;
  const float* output(int chunk, int mb) override;
  void backward_input(int chunk, int mb, int buffer, float dloss, bool defer_weight,
                      bool final) override;
  void backward_weight(int chunk, int mb, bool final) override;
  const float* input_grad(int chunk, int mb) override;
  void release_input_grad(int chunk, int mb) override;
  void reset_losses() override { ce_sum_ = aux_sum_ = 0; }
  double ce_sum() const override { return ce_sum_; }
  double aux_sum() const override { return aux_sum_; }

  // LocalModel. A whole-batch forward/backward needs every stage on this rank
  // (pp = 1, vpp = 1). targets may be null (logits only, returns 0). Throws
  // ConfigError for a bad B, T or token.
  float forward(const model::Token* inputs, const model::Token* targets, int B, int T) override;
  void backward() override;
  void zero_grad() override;
  std::span<float> params() override { return params_; }
  std::span<float> grads() override { return grads_; }
  const std::vector<ShardSpec>& shards() const override { return layout_.shards(); }
  // The ranges every TP rank holds whole but computes a gradient of its own
  // heads for (Llama K/V held whole, the QK-norm weights), summed over TP
  // only when final: per layer, K/V's then the norms' (empty ranges elsewhere).
  const std::vector<Range>& tp_summed() const { return tp_summed_; }
  float ce_loss() const override { return last_ce_; }
  float aux_loss() const override { return last_aux_; }
  void set_sink(model::OpSink* sink) override { ctx_.set_exec(model::Exec::with(sink)); }
  // Replaces ShardedOptions::hooks (FSDP's are built after the model).
  void set_hooks(BlockHooks* hooks) { hooks_ = hooks; }

  // One stage: this rank's vocabulary logits (B,T,V/tp) of the last
  // whole-batch forward, and what MoE block `layer` did in it (null if dense).
  std::span<const float> local_logits() const;
  const MoeStats* moe_stats(int layer) const;
  int cp_size() const { return cp_; }
  int tp_size() const { return ctx_.tp.tp(); }
  int tp_rank() const { return ctx_.tp.rank(); }
  int ep_size() const { return ctx_.moe.ep ? ctx_.moe.ep->size() : 1; }
  bool sequence_parallel() const { return ctx_.tp.sp; }
  const ShardLayout& layout() const { return layout_; }
  Range wte_range() const { return layout_.prefix(model::embedding_name(config_)); }
  // The untied head (lm_head.weight) on the last stage; empty otherwise.
  Range head_range() const { return layout_.prefix(model::kLmHeadName); }
  // What this rank holds (wte: the first or the last stage, which need tokens).
  const LayoutFilter& layout_filter() const { return layout_.filter(); }

 private:
  // One (chunk, micro-batch) in flight.
  struct Slot {
    int mb = -1;                        // -1: free
    bool activations = false;           // forward done, backward_input not yet
    bool unsent = false;                // input gradient not yet released
    Buf<model::Token> inputs, targets;  // (N) first / last stage
    Buf<float> x;                       // (Nr,C) the chunk's input (received or embedded)
    std::vector<BlockActs> blocks;       // the chunk's blocks
    Buf<float> lnf, lnf_mean, lnf_rstd; // last stage
    Buf<float> logits, probs, losses;
    Buf<float> dx;                      // (Nr,C) input gradient to send (not first stage)
    WeightGrads wgrad;                  // deferred weight gradients (the W stash)
    int64_t elems = 0;                  // saved for backward and still charged (arena)
    bool busy() const { return activations || unsent || !wgrad.empty(); }
  };
  struct Pool {
    std::vector<Slot> slots;
    std::vector<Buf<float>> act_in, grad_in;  // receive buffers by id
  };
  Slot& slot(int chunk, int mb, bool create);
  Slot* find(int chunk, int mb);
  void size_slot(int chunk, Slot& s) const;
  void free_if_done(Slot& s);
  float* receive_buffer(std::vector<Buf<float>>& pool, int buffer);
  void embed(Slot& s, const model::Token* inputs);
  float head_forward(Slot& s, const float* x, const model::Token* targets);
  static int64_t head_elements(const Slot& s);  // the head's saved activations
  void release_activations(Slot& s, int64_t elements);
  // Backward of the head into dx_; announces ln_f when final and not deferred.
  // `final`: the chunk's last backward of the step (sharded_gpt.h's top).
  void head_backward(Slot& s, float dloss, bool final);
  void blocks_backward(int chunk, Slot& s, float dloss, bool final);
  // Elements block `a` (block `layer`, the i-th of its chunk's n) keeps from its
  // forward to its backward under the recompute policy (the rest is rebuilt
  // by recompute_block).
  int64_t kept_elements(const BlockActs& a, int layer, int i, int n) const;
  // kFull: whether the chunk's i-th block is re-run, and the last block of
  // its group (uniform: the group re-runs at that block's backward).
  bool full_recompute(int i) const;
  int group_last(int i, int n) const;
  // Before block i's backward (of slot s, its chunk's blocks from `l0`):
  // rebuilds what the policy dropped (with kUniform groups, the whole
  // group at its last block); returns the elements block i holds in the
  // arena until its backward is done.
  int64_t recompute_block(Slot& s, int i, int l0);
  void embedding_backward(Slot& s);
  // This backward's gradients of block `layer` (kHead: ln_f and the head)
  // or of the embeddings are done: with `final` (the step's last) SP row
  // sums and replicated K/V reduced over TP, then grads_ready; else
  // grads_partial (a micro-batch's part, for ZeRO-2).
  void finish_block(int layer, bool final);
  // This backward's gradients of block `layer` (head_id(): ln_f and the
  // head; BlockHooks::kEmbeddings: wte and wpe) are complete: OpSink::grads_accumulated.
  void accumulated(int layer) const;
  void finish_embeddings(bool tied_here, bool final);
  void reduce_staged(const std::vector<Range>& ranges);
  void announce(Range r, bool final) const {
    model::OpSink* sink = ctx_.ex().sink;
    if (!sink || r.size <= 0) return;
    if (final)
      sink->grads_ready(r.begin, r.size);
    else
      sink->grads_partial(r.begin, r.size);
  }
  int head_id() const { return config_.n_layer; }

  model::GPTConfig config_;
  StagePlacement place_;
  // Copies share the caller's collective counters (collectives/group.h).
  collectives::ProcessGroup tp_group_;
  std::unique_ptr<Stream> tp_overlap_;  // ShardedOptions::tp_comm_overlap's side stream
  std::optional<collectives::ProcessGroup> ep_group_, capacity_group_, ep_node_, ep_rail_;
  BlockContext ctx_;
  bool scatter_gather_ = false;  // ShardedOptions::scatter_gather, without SP
  bool flash_ = false;           // ShardedOptions::flash
  bool experts_whole_ = false;   // ShardedOptions::experts_whole with tp > 1
  BlockHooks* hooks_ = nullptr;
  Recompute recompute_ = Recompute::kNone;
  unsigned recompute_modules_ = kRecomputeCoreAttn;
  RecomputeMethod recompute_method_ = RecomputeMethod::kUniform;
  int recompute_layers_ = 1;
  std::vector<int64_t> rebuilt_;  // kUniform: each block of the group being re-run, its rebuilt elements
  int cp_ = 1, cp_rank_ = 0;
  ShardLayout layout_;
  int64_t v0_ = 0;
  int Vl_ = 0;
  Buf<float> params_, grads_, stage_;  // stage_: SP row-sum grads of LayerNorms and wpe
  model::GPTView<float> w_, g_;
  std::vector<std::vector<Range>> block_staged_;
  std::vector<Range> lnf_staged_, wpe_staged_;
  std::vector<Range> block_kv_;  // (n_layer) llama K/V held whole by every TP rank: summed over TP
  std::vector<Range> block_qk_norm_;  // (n_layer) llama QK-norm weights (whole on every TP rank): summed over TP
  std::vector<Range> tp_summed_;      // both, for DataParallel::set_final_only
  Buf<float> pack_;

  ShardDims dims_;
  std::vector<Pool> pools_;  // (chunks)
  BlockScratch scratch_;  // the forward passes'; the backward's too without ep_comm_overlap
  std::unique_ptr<BlockScratch> bwd_scratch_;  // ep_comm_overlap: the backward passes'
  std::unique_ptr<Stream> ep_overlap_;         // ep_comm_overlap: the EP communication stream
  std::unique_ptr<WeightGrads> delayed_wgrad_;  // delay_wgrad: the experts' weight gradients of one backward
  BlockScratch& bwd_scratch() { return bwd_scratch_ ? *bwd_scratch_ : scratch_; }
  Buf<float> ce_stats_, dlogits_, dlnf_, dx_, dx_next_;
  double ce_sum_ = 0, aux_sum_ = 0;
  float last_ce_ = 0, last_aux_ = 0;
};

// SP: adds the TP sum of the staged row-sum gradients `stage` over `ranges`
// into `grads` and clears the stage (one all-reduce of the packed ranges).
void sp_reduce_staged(const TpContext& c, const std::vector<Range>& ranges, float* stage,
                      float* grads, Buf<float>& pack);

}  // namespace shardlab::parallel
