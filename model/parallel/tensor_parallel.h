// TensorParallelGPT: one tensor-parallel rank of the GPT (Megatron style),
// the whole model on one pipeline stage (PipelineModel with pp = 1).
//
// Each rank of the TP group holds the slices listed in tp_layout.h: attention
// heads [r·NH/tp, (r+1)·NH/tp) (c_attn column-parallel, c_proj row-parallel),
// MLP columns [r·4C/tp, ...) (the same for each MoE expert), vocabulary rows
// [r·V/tp, ...) of the tied wte, and whole copies of the replicated tensors
// (LayerNorms, wpe, row-parallel biases, the MoE router). Communication is in
// tp_mappings.h (conjugate pairs), blocks in tp_layers.h, embedding and the
// vocab-parallel loss in tp_embedding.h, the model's buffers and passes in
// pipeline_stage.h.
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
//
// MoE blocks: with MoeGroups::ep the experts are spread over the EP group and
// tokens are exchanged by all-to-all (ep_moe.h); with MoeGroups::capacity the
// routing statistics and capacity drops follow the whole data-parallel batch.
//
// Thread safety: one instance per device thread; the group must be this
// device's TP group and is used for nothing else while forward/backward run.
#pragma once

#include "model/parallel/pipeline_stage.h"

namespace shardlab::parallel {

class TensorParallelGPT final : public PipelineModel {
 public:
  // Throws ConfigError (check_tensor_parallel_config,
  // check_expert_parallel_config) before any work.
  TensorParallelGPT(const model::GPTConfig& config, uint64_t seed, Device& dev,
                    const collectives::ProcessGroup& tp_group, bool sequence_parallel,
                    const MoeGroups& moe = {})
      : PipelineModel(config, seed, dev, tp_group, sequence_parallel, StagePlacement{}, moe) {}
};

}  // namespace shardlab::parallel
