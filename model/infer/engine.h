// InferEngine: one device's part of inference on the sharded model — its
// weights (a ShardedGPT: its tensor-parallel slice, its pipeline stage's
// blocks, its experts), its KV cache, and one forward step over a batch of
// sequences. `generate` (generate.h) and a serving scheduler drive it; every
// device of the run calls step() with the same batch (SPMD).
//
// A step, on the device at pipeline stage p (forward only; the kernels and
// collectives are training's, so they charge the virtual clock the same way):
//
//   first stage  vocabulary-parallel embedding of the new tokens at their
//                positions (an all-reduce over tp), + wpe
//   other stage  receive the (N, C) activation from stage p-1 (point to point)
//   each block   ln_1 -> c_attn (column-parallel: this rank's heads) ->
//                append the new K, V to the cache -> attention over the cache
//                (cached_attention.h; MLA: the down-projections and latent
//                norms whole on every rank, q's up-projection by heads, the
//                latent rows cached, absorbed attention) ->
//                c_proj (row-parallel, all-reduce) ->
//                residual -> ln_2 -> MLP (column/row-parallel), or MoE
//                (tensor/ or expert/: route, all-to-all dispatch under EP) ->
//                residual
//   not last     send the activation to stage p+1
//   last stage   ln_f and the tied head on the last position of every
//                sequence only; the tp ranks' vocabulary slices all-gathered
//                into the full (S, V) logits
//
// N = Σ n_i new tokens of the S sequences, one (N, C) activation: the linear
// layers run on all of them at once, attention per sequence. Under EP every
// rank of the ep group carries the whole batch (replicas of the sequences;
// the experts are split, the tokens travel to them and back). Sequence
// parallelism and interleaved stages are not used for inference.
//
// A phantom run (a PhantomScope around the engine) times the same step on
// shapes only: no weights, cache or logits have storage.
//
// On values, the dense layers' weights and the head are packed once for
// Eigen at the first step (model/gemm.h PackedWeights: a host copy, not
// modeled; the weights never change while serving) and every step's GEMMs
// read the packs, with the bits of packing W at each call.
//
// Thread safety: one engine per device thread.
#pragma once

#include <memory>
#include <vector>

#include "collectives/group.h"
#include "model/config.h"
#include "model/gemm.h"
#include "model/infer/kv_cache.h"
#include "model/io/safetensors.h"
#include "model/parallel/expert/moe.h"
#include "model/parallel/sharded_gpt.h"
#include "model/engine/device_sink.h"
#include "runtime/tensor.h"

namespace shardlab::infer {

struct EngineGroups {
  const collectives::ProcessGroup* tp = nullptr;  // required
  const collectives::ProcessGroup* ep = nullptr;  // null or size 1: every expert here
  std::vector<int> pp_ranks;                      // global rank of every stage; empty: pp 1
  parallel::StagePlacement placement;             // this device's stage (InferPlan::placement)
  bool kv_fp8 = false;                            // the KV cache in FP8 (InferPlan::kv_fp8)
};

// New tokens of one sequence; they go at positions [length, length + n) of
// its cache.
// `every_logit`: the logits of every new token, not only the last (a
// speculative verification scores each proposed token).
struct SeqInput {
  int seq = 0;
  std::vector<model::Token> tokens;
  bool every_logit = false;
};

struct StepOutput {
  // (R, V) logits of each sequence's last new token (of each new token, for
  // an every_logit sequence), in batch order, on the last stage's ranks
  // (every tp rank: gathered); empty elsewhere and in a phantom run.
  std::vector<float> logits;
  Time begin = 0, end = 0;  // this device's compute stream around the step
};

class InferEngine {
 public:
  // Weights from `init` (an unsharded checkpoint, already checked against
  // `config`) or, without one, the training init from `seed`.
  InferEngine(const model::GPTConfig& config, uint64_t seed, Device& dev, const EngineGroups& groups,
              const model::SafetensorsFile* init);
  ~InferEngine();
  InferEngine(const InferEngine&) = delete;
  InferEngine& operator=(const InferEngine&) = delete;

  KvCache& cache() { return *cache_; }
  bool first_stage() const { return place_.first(0); }
  bool last_stage() const { return place_.last(0); }
  const model::GPTConfig& config() const { return config_; }

  // Runs the batch through this device's part of the model. Every sequence
  // must exist in the cache with room for its tokens; positions must stay
  // below the model's block size.
  StepOutput step(const std::vector<SeqInput>& batch);

 private:
  struct Acts;  // the step's activations (engine_block.cc)
  void size_step(int64_t N);
  void pack_weights();  // once, on values
  void embed(const std::vector<SeqInput>& batch);
  void block_forward(int layer, const std::vector<SeqInput>& batch, const std::vector<int>& pos0);
  void attend(int local_layer, const std::vector<SeqInput>& batch, const std::vector<int>& pos0);
  void rotate();  // llama: RoPE at Acts::positions
  // MLA (GPTConfig::is_mla): the latents, their cache rows and the absorbed attention.
  void mla_attend(int layer, const std::vector<SeqInput>& batch, const std::vector<int>& pos0);
  void ffn_forward(int layer);
  std::vector<float> head(const std::vector<SeqInput>& batch);
  void pipe_send();
  void pipe_recv();

  model::GPTConfig config_;
  Device& dev_;
  EngineGroups groups_;
  parallel::StagePlacement place_;
  std::unique_ptr<parallel::ShardedGPT> model_;  // this rank's weights
  model::GPTView<float> w_;
  engine::DeviceSink sink_;
  parallel::TpContext ctx_;
  parallel::ExpertContext moe_ctx_;  // MoE blocks: the same device, TP group and sink
  Tensor weights_;      // the weights' modeled bytes (kParam)
  Tensor fp8_weights_;  // --precision fp8: the FP8 linears' weights, 1 B each (kParam)
  std::unique_ptr<KvCache> cache_;
  parallel::ShardDims dims_;
  std::unique_ptr<Acts> acts_;
  model::PackedWeights packs_;  // the dense layers' and the head's, for the GEMMs
  bool packed_ = false;
  int64_t v0_ = 0;
  int Vl_ = 0;
};

}  // namespace shardlab::infer
