// InferDevice: one device's part of an inference run on a tp x pp x ep mesh
// (the ep ranks carry replicas of the batch, the experts are split among
// them): its parallel groups, its InferEngine (engine.h), and the choice of
// every sequence's next token. generate (generate.h) and the serving
// executor (model/serve/cluster_step.h) both run on it.
//
// The token is chosen on one rank — the last pipeline stage's tp rank 0 of
// ep rank 0 (the sampler rank) — from the full gathered logits, and
// broadcast to every device (a collective on the clock), so the tokens do
// not depend on the parallel split.
//
// Thread safety: one InferDevice per device thread.
#pragma once

#include <cstdint>
#include <vector>

#include "collectives/mesh.h"
#include "model/infer/engine.h"
#include "model/infer/sampler.h"
#include "model/parallel/parallel_context.h"

namespace shardlab::infer {

// The mesh of an inference run: tp x pp, ep replicas of the batch.
collectives::DeviceMesh inference_mesh(int tp, int pp, int ep);
// The rank that chooses the tokens (see above).
int sampler_rank(const collectives::DeviceMesh& mesh);

class InferDevice {
 public:
  // Weights from `init` (checked with check_generate_init) or, without one,
  // the training init from `seed`. `mesh` must outlive the device.
  InferDevice(Device& dev, const collectives::DeviceMesh& mesh, const model::GPTConfig& config, uint64_t seed,
              const model::SafetensorsFile* init);

  InferEngine& engine() { return engine_; }
  bool is_sampler() const { return dev_.rank() == sampler_; }
  int sampler() const { return sampler_; }

  // On the sampler rank: charges the sampling of the sequences of `out`
  // whose flag in `samples` is set (one per sequence of the step) and, when
  // the step computed logits, draws their tokens with `sampler`, in batch
  // order. Elsewhere, or in a phantom run, the tokens are 0. Tokens travel
  // as floats (exact below 2^24).
  std::vector<float> choose(const StepOutput& out, const std::vector<bool>& samples, Sampler& sampler);
  // Every device gets the sampler rank's tokens (nothing to do on one device
  // or for no token).
  void broadcast(std::vector<float>& tokens);

 private:
  static EngineGroups groups(parallel::ParallelContext& ctx, bool ep);

  Device& dev_;
  parallel::ParallelContext ctx_;  // before engine_: the engine keeps its groups
  InferEngine engine_;
  int sampler_;
  const collectives::ProcessGroup* world_ = nullptr;
};

}  // namespace shardlab::infer
