// LocalModel: the part of the GPT one device holds, as the trainer sees it.
//
// The unsharded GPT (UnshardedModel) and every sharded variant (ShardedGPT:
// tensor, pipeline, expert and context parallel) implement this interface,
// so one training loop drives them all. Parameters and gradients live in one flat
// local buffer each; `shards()` says, for every local tensor, which slice of
// the unsharded tensor it holds, so any rank can be initialised exactly (the
// counter-based init is keyed by global element index) and any run can be
// gathered back into unsharded tensors (`shardlab verify`).
//
// Size letters: B local batch rows, T sequence length.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "model/kernels.h"
#include "model/params.h"
#include "model/sink.h"
#include "runtime/errors.h"
#include "runtime/tensor.h"

namespace shardlab::parallel {

// One local tensor: a slice of an unsharded tensor along one dimension.
struct ShardSpec {
  std::string name;         // nanoGPT name of the unsharded tensor
  Shape global_shape;       // the unsharded shape
  Shape local_shape;        // what this rank holds
  int split_dim = -1;       // -1: the whole tensor (replicated); 0: rows; 1: columns
  // Along split_dim: global index ranges [begin, begin + size), concatenated
  // in local order (e.g. the q, k and v rows of this rank's heads).
  std::vector<Range> ranges;
  int64_t offset = 0;       // first element in the local flat buffer
  int64_t numel = 0;        // local elements
  bool decay = false;       // AdamW weight decay (nanoGPT: 2+-dim tensors)
  // Held whole by every rank of the tensor-parallel group (LayerNorms,
  // row-parallel biases, wpe): counted once in global norms and gathers.
  bool tp_replicated = true;
  int layer = -1;           // block index, -1 outside the blocks
  // An MoE expert's tensor (from the name table, model::ParamSpec::expert):
  // under expert parallelism it differs across the ranks of an ep group and
  // its gradient is reduced over the expert-data-parallel group.
  bool expert = false;
  model::ParamRole role = model::ParamRole::kLayerNorm;
  bool is_final_norm() const { return role == model::ParamRole::kLayerNorm && layer < 0; }
};

// The weights of the linears that run as FP8 GEMMs under --precision fp8
// (Transformer Engine's in training, vLLM's FP8 checkpoints in inference):
// the blocks' projections and MLPs, experts and MLA's down- and
// up-projections included; the embedding, the LM head, the router and the
// norms stay BF16.
inline bool is_fp8_linear_weight(model::ParamRole r) {
  using model::ParamRole;
  return r == ParamRole::kQkvWeight || r == ParamRole::kKvWeight || r == ParamRole::kAttnProjWeight ||
         r == ParamRole::kFcWeight || r == ParamRole::kMlpProjWeight || r == ParamRole::kMlaDown ||
         r == ParamRole::kMlaUp;
}
inline int64_t fp8_weight_elements(const std::vector<ShardSpec>& shards) {
  int64_t n = 0;
  for (const ShardSpec& s : shards)
    if (is_fp8_linear_weight(s.role)) n += s.numel;
  return n;
}

// Maps local element i of `s` (row-major in local_shape) to its global flat
// index (row-major in global_shape).
int64_t global_index(const ShardSpec& s, int64_t i);

// What one MoE block did on this rank over the forwards since the last
// reset_moe_stats() (one training step: every micro-batch).
struct MoeStepStats {
  int layer = -1;                 // block index; -1: not an MoE block held here
  int expert_begin = 0;           // first expert held
  std::vector<int64_t> received;  // (experts held) rows each expert processed
  int64_t dropped = 0;            // this rank's assignments over capacity
  uint64_t a2a_sent_bytes = 0;    // forward all-to-alls, off-rank (backward: the same again)
  uint64_t a2a_recv_bytes = 0;
  uint64_t a2a_internode_sent_bytes = 0;  // of a2a_sent_bytes, to other nodes
};

class LocalModel {
 public:
  virtual ~LocalModel() = default;

  // inputs, targets: (B,T). Returns this rank's loss: CE over its rows +
  // aux_coef * aux, the same on every rank of a tensor-parallel group.
  virtual float forward(const model::Token* inputs, const model::Token* targets, int B, int T) = 0;
  // Gradients of the last forward's loss, accumulated into grads().
  virtual void backward() = 0;
  // The same for the loss scaled by dloss (gradient accumulation over M
  // micro-batches uses 1/M). Models that only support dloss = 1 keep this.
  virtual void backward_scaled(float dloss) {
    SHARDLAB_CHECK(dloss == 1.0f, "this model has no scaled backward");
    backward();
  }
  virtual void zero_grad() = 0;
  // Frees host buffers no step needs after the last one (activations,
  // scratch), before the run copies out its parameters; a later forward
  // sizes them again.
  virtual void free_host_buffers() {}

  virtual std::span<float> params() = 0;
  virtual std::span<float> grads() = 0;
  virtual const std::vector<ShardSpec>& shards() const = 0;

  virtual float ce_loss() const = 0;
  virtual float aux_loss() const = 0;
  // Kernels charge `sink` and report saved activations and final gradients.
  virtual void set_sink(model::OpSink* sink) = 0;

  // MoE statistics since the last reset, one entry per block (layer -1 for
  // dense blocks and blocks held elsewhere); empty for a dense model.
  const std::vector<MoeStepStats>& moe_step_stats() const { return moe_step_; }
  void reset_moe_stats() {
    for (MoeStepStats& m : moe_step_) {
      std::fill(m.received.begin(), m.received.end(), 0);
      m.dropped = 0;
      m.a2a_sent_bytes = m.a2a_recv_bytes = m.a2a_internode_sent_bytes = 0;
    }
    a2a_time_ = 0;
  }
  // Time the expert-parallel all-to-alls held the compute stream since the reset.
  Time a2a_time() const { return a2a_time_; }

 protected:
  std::vector<MoeStepStats> moe_step_;
  Time a2a_time_ = 0;
};

}  // namespace shardlab::parallel
