// BlockHooks: calls around every hook point of a rank's model chunks, and
// the hook points themselves as a description (HookChunk), so that a user
// of the hooks (ZeRO-3's Fsdp, data/fsdp.h) depends on neither the model
// nor the pipeline's placement.
//
// A chunk's hook points, in forward order: the embeddings (layer
// kEmbeddings) on the first stage, its blocks, the head (ln_f and the tied
// lm_head: layer n_layer) on the last stage. Backward visits them in reverse.
// ShardedGPT (sharded_gpt.h) calls the hooks; hook_chunks there derives the
// chunks from a StagePlacement.
//
// Thread safety: the hooks are called on the device's own thread.
#pragma once

namespace shardlab::parallel {

// Called around each block's forward and backward on this rank, in order,
// and around the embeddings' (layer kEmbeddings) and the head's (layer
// n_layer) on the first and last stage.
class BlockHooks {
 public:
  static constexpr int kEmbeddings = -1;
  virtual ~BlockHooks() = default;
  virtual void before_forward(int layer) {}
  virtual void after_forward(int layer) {}
  virtual void before_backward(int layer) {}
  virtual void after_backward(int layer) {}
};

// One model chunk's hook points: kEmbeddings if `embeddings`, the blocks
// [first_layer, end_layer), then n_layer if `head`.
struct HookChunk {
  bool embeddings = false;  // the first stage: wte, wpe
  int first_layer = 0, end_layer = 0;
  bool head = false;        // the last stage: ln_f, the head
};

}  // namespace shardlab::parallel
