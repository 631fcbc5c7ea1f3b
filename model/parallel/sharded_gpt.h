// PipelineModel: the model chunks one pipeline rank holds (Megatron's
// pipeline stages, with tensor parallelism inside each stage).
//
// The n_layer blocks are split over S = pp·v virtual stages (stage_layers[s]
// blocks each, in order); rank r holds the chunks c = 0..v-1 of virtual
// stages s = c·pp + r (v = 1: stage r only). The first virtual stage also
// holds the embeddings (wte, wpe), the last one ln_f and the tied head (wte
// again): the two copies of wte start equal and are kept equal by summing
// their gradients between the first and last ranks (the trainer does it, as
// Megatron's embedding group does).
//
// Micro-batches. forward(c, mb, ...) keeps the activations of (c, mb) in a
// slot until backward(c, mb) consumes them; slots are reused, so the host
// allocates only while the number of micro-batches in flight grows, and the
// arena sees exactly the schedule's stash (saved at forward, freed at
// backward). Between stages activations are (Nr, C): this TP rank's rows
// (N/tp with SP, all N without).
//
// Gradients accumulate over the micro-batches of a step. grads_ready (for
// data-parallel buckets) is reported by backward(..., last_micro_batch=true)
// for each block, ln_f and wpe, and for wte when this rank holds both the
// first and the last stage; otherwise the trainer announces wte after the
// embedding-group sum. With SP the LayerNorm and wpe gradients are
// row sums staged per rank and summed over TP once, at the last micro-batch.
//
// Thread safety: one instance per device thread.
#pragma once

#include <optional>
#include <vector>

#include "collectives/group.h"
#include "model/config.h"
#include "model/parallel/local_model.h"
#include "model/parallel/tensor/layers.h"
#include "model/parallel/layout.h"

namespace shardlab::parallel {

// Blocks per virtual stage when the user gives none: as even as possible,
// the extra blocks on the earliest stages (the last stage also has the head).
std::vector<int> balanced_stage_layers(int n_layer, int stages);
// "3,3,2" -> {3, 3, 2}; ConfigError naming --pp-layers otherwise.
std::vector<int> parse_stage_layers(const std::string& text);
// Throws ConfigError naming the flag: pp·vpp stages must not exceed the
// layers, and an explicit list must have pp·vpp entries, each >= 1, summing to
// the layers. Empty `stage_layers` = balanced.
void check_stage_layers(const model::GPTConfig& config, int pp, int vpp,
                        const std::vector<int>& stage_layers);

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

// SP: adds the TP sum of the staged row-sum gradients `stage` over `ranges`
// into `grads` and clears the stage (one all-reduce of the packed ranges).
void sp_reduce_staged(const TpContext& c, const std::vector<FlatRange>& ranges, float* stage,
                      float* grads, Buf<float>& pack);

struct StagePlacement {
  int pp = 1, vpp = 1, rank = 0;
  std::vector<int> stage_layers;  // (pp·vpp) blocks per virtual stage
  int stages() const { return pp * vpp; }
  int stage(int chunk) const { return chunk * pp + rank; }
  int first_layer(int chunk) const;
  int end_layer(int chunk) const;
  bool first(int chunk) const { return stage(chunk) == 0; }
  bool last(int chunk) const { return stage(chunk) == stages() - 1; }
};

class PipelineModel : public LocalModel {
 public:
  // Throws ConfigError for a bad configuration before any work.
  PipelineModel(const model::GPTConfig& config, uint64_t seed, Device& dev,
                const collectives::ProcessGroup& tp_group, bool sequence_parallel,
                StagePlacement placement, const MoeGroups& moe = {});
  PipelineModel(const PipelineModel&) = delete;
  PipelineModel& operator=(const PipelineModel&) = delete;

  const StagePlacement& placement() const { return place_; }
  int chunks() const { return place_.vpp; }
  // Sets the micro-batch shape (rows B, time T) before the first forward.
  void set_micro_batch(int B, int T);
  // Elements of one activation (or its gradient) between stages: Nr·C.
  int64_t boundary_elements() const { return dims_.rows() * dims_.C; }

  // Where the input activation of (chunk, mb) is received (not on the first stage).
  float* input(int chunk, int mb);
  // Forward of (chunk, mb). inputs on the first stage, targets on the last
  // (B·T tokens each, else null). Returns this micro-batch's CE loss on the
  // last stage, 0 elsewhere; aux() accumulates the chunk's MoE aux losses.
  float forward(int chunk, int mb, const model::Token* inputs, const model::Token* targets);
  // The output activation of (chunk, mb) to send on (not on the last stage).
  const float* output(int chunk, int mb) const;
  // Where the gradient of the output is received before backward (not last stage).
  float* output_grad() { return dx_.data(); }
  // Backward of (chunk, mb); dloss is the loss scale of the micro-batch (1/M).
  // Afterwards input_grad() holds the gradient of the input (not first stage).
  void backward(int chunk, int mb, float dloss, bool last_micro_batch);
  const float* input_grad() const { return dx_.data(); }

  // Losses of the micro-batches run since reset_losses(): CE summed over
  // this rank's last-stage forwards, aux over its MoE blocks.
  void reset_losses() { ce_sum_ = aux_sum_ = 0; }
  double ce_sum() const { return ce_sum_; }
  double aux_sum() const { return aux_sum_; }

  // LocalModel. A whole-batch forward/backward only makes sense for a rank
  // holding every stage (pp = 1, v = 1: TensorParallelGPT); the pipeline
  // executor uses the micro-batch calls above. targets may be null here
  // (logits only, returns 0). Throws ConfigError for a bad B, T or token.
  float forward(const model::Token* inputs, const model::Token* targets, int B, int T) override;
  void backward() override;
  void zero_grad() override;
  std::span<float> params() override { return params_; }
  std::span<float> grads() override { return grads_; }
  const std::vector<ShardSpec>& shards() const override { return layout_.shards(); }
  float ce_loss() const override { return last_ce_; }
  float aux_loss() const override { return last_aux_; }
  void set_sink(model::OpSink* sink) override { ctx_.ex = model::Exec::with(sink); }
  // One stage: this rank's vocabulary logits (B,T,V/tp) of the last
  // whole-batch forward, and what MoE block `layer` did in it (null if dense).
  std::span<const float> local_logits() const;
  const MoeStats* moe_stats(int layer) const;
  int tp_size() const { return group_.size(); }
  int tp_rank() const { return group_.rank(); }
  int ep_size() const { return ep_group_ ? ep_group_->size() : 1; }
  bool sequence_parallel() const { return ctx_.sp; }
  const TpLayout& layout() const { return layout_; }
  FlatRange wte_range() const { return layout_.prefix("transformer.wte."); }
  // What this rank holds (wte: the first or the last stage, which need tokens).
  const LayoutFilter& layout_filter() const { return layout_.filter(); }

 private:
  struct Slot {
    int mb = -1;  // -1: free
    Buf<model::Token> inputs, targets;  // (N) first / last stage
    Buf<float> x;                       // (Nr,C) received input, or the embedding
    std::vector<TpBlockActs> blocks;    // the chunk's blocks
    Buf<float> lnf, lnf_mean, lnf_rstd;  // last stage
    Buf<float> logits, probs, losses;
    int64_t elems = 0;  // saved for backward (arena), set by forward
  };
  Slot& slot(int chunk, int mb, bool create);
  void size_slot(int chunk, Slot& s) const;
  void reduce_staged(const std::vector<FlatRange>& ranges);
  void grads_ready(FlatRange r) const {
    if (ctx_.ex.sink && r.count > 0) ctx_.ex.sink->grads_ready(r.offset, r.count);
  }

  model::GPTConfig config_;
  StagePlacement place_;
  collectives::ProcessGroup group_;
  std::optional<collectives::ProcessGroup> ep_group_, capacity_group_;
  TpContext ctx_;
  TpLayout layout_;
  int64_t v0_ = 0;
  int Vl_ = 0;
  Buf<float> params_, grads_, stage_;  // stage_: SP row-sum grads of LayerNorms and wpe
  model::GPTView<float> w_, g_;
  std::vector<std::vector<FlatRange>> block_staged_;
  std::vector<FlatRange> lnf_staged_, wpe_staged_;
  Buf<float> pack_;

  TpDims dims_;
  std::vector<std::vector<Slot>> slots_;  // (chunks) pools
  TpScratch scratch_;
  Buf<float> ce_stats_, dlogits_, dlnf_, dx_, dx_next_;
  double ce_sum_ = 0, aux_sum_ = 0;
  float last_ce_ = 0, last_aux_ = 0;
};

}  // namespace shardlab::parallel
