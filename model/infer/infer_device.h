// InferDevice: one device's part of an inference run on a tp x pp x ep mesh
// (the ep ranks carry replicas of the batch, the experts are split among
// them): its parallel groups, its InferEngine (engine.h), and the choice of
// every sequence's next token. generate (generate.h) and the serving
// executor (model/serve/cluster_step.h) both run on it.
//
// The tokens are chosen where the full logits are: every tensor-parallel
// rank of the last pipeline stage holds the same gathered logits and draws
// the same tokens from them (as FasterTransformer's decoding runs on every
// tp rank), so the tp peers stay symmetric (a phantom run can fold them).
// The other ep replicas of the batch get ep rank 0's tokens (a broadcast
// over the ep group: their experts' sums may round differently), and with
// pp > 1 the last stage sends them to the first, which embeds them next
// (point to point, tp rank to tp rank). So the tokens do not depend on the
// split. The sampler rank — the last stage's tp rank 0 of ep rank 0 —
// reports them.
//
// Thread safety: one InferDevice per device thread.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "collectives/mesh.h"
#include "model/infer/engine.h"
#include "model/infer/infer_plan.h"
#include "model/infer/sampler.h"
#include "model/parallel/parallel_context.h"

namespace shardlab::infer {

class InferDevice {
 public:
  // Weights from `init` (checked with check_generate_init) or, without one,
  // the training init from `seed`. `plan` must outlive the device.
  InferDevice(Device& dev, const InferPlan& plan, const model::GPTConfig& config, uint64_t seed,
              const model::SafetensorsFile* init);

  InferEngine& engine() { return engine_; }
  bool is_sampler() const { return dev_.rank() == sampler_; }
  int sampler() const { return sampler_; }

  // On the last stage's ranks of ep rank 0: charges the sampling of the
  // sequences of `out` whose flag in `samples` is set (one per sequence of
  // the step) and, when the step computed logits, draws their tokens with
  // `sampler`, in batch order: its next draws or, given `keys` (one per
  // sampling sequence), those draws. Elsewhere, or in a phantom run, the
  // tokens are 0. Tokens travel as floats (exact below 2^24).
  std::vector<float> choose(const StepOutput& out, const std::vector<bool>& samples, Sampler& sampler,
                            std::span<const DrawKey> keys = {});
  // Charges choosing among `rows` rows of logits (on the ranks that choose).
  void charge_choice(int64_t rows);
  // The chosen tokens to the other ep replicas and to the first stage (see
  // above); every device calls it with the same count. Without
  // `to_first_stage` the first stage gets them another way (a serving
  // replica's scheduler feeds them with the next step's batch).
  void share(std::vector<float>& tokens, bool to_first_stage = true);

 private:
  static EngineGroups groups(parallel::ParallelContext& ctx, const InferPlan& plan);

  Device& dev_;
  parallel::ParallelContext ctx_;  // before engine_: the engine keeps its groups
  InferEngine engine_;
  int sampler_;
  bool chooses_ = false;                          // last stage, ep rank 0
  const collectives::ProcessGroup* ep_ = nullptr;  // last stage under ep > 1
  int ep_root_ = 0;                               // ep rank 0's index in ep_
  int stage_peer_ = -1;                           // pp > 1: the first (last) stage's rank of this tp and ep
};

}  // namespace shardlab::infer
