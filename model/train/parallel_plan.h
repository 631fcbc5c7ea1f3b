// ParallelPlan: the facts a training run derives from its parallel layout
// (TrainOptions::parallel, with the model and the micro-batches), computed
// once after every check and passed on. train() builds it; the preflight
// (preflight.h), every device's setup (DeviceProgram::plan, device_setup.h)
// and the folding read these facts here instead of deriving them again.
//
// Thread safety: immutable once built; device threads share one.
#pragma once

#include <string>
#include <vector>

#include "collectives/mesh.h"
#include "model/engine/fold.h"
#include "model/parallel/local_model.h"
#include "model/parallel/pipeline/schedule.h"
#include "model/parallel/pipeline/stage.h"
#include "model/train/trainer.h"
#include "runtime/range.h"

namespace shardlab::train {

struct ParallelPlan {
  // Checks the layout (validate_parallel: ConfigError naming the flag) and
  // derives the plan for a run at `precision` (the cluster's: FP8 runs the
  // sharded model, runs_sharded).
  explicit ParallelPlan(const TrainOptions& options, Precision precision = Precision::kFp32);

  collectives::DeviceMesh mesh;  // "tp-cp-ep-dp-pp" over ParallelOptions::mesh_shape()
  int world = 0;                 // devices: mesh.size(), dp × tp × cp × pp
  // MoE routing over the data ranks (a capacity factor counting every
  // replica's tokens, or expert parallelism with a load-balancing loss):
  // the model's capacity group is the data group (parallel_plan.cc
  // routes_globally).
  bool global_routing = false;
  bool sharded = false;         // runs_sharded: ShardedGPT, not the unsharded reference
  parallel::Schedule schedule;  // every pipeline rank's actions (step_schedule)
  engine::FoldInput fold;       // what fold planning reads of the run
  bool folds = false;           // a phantom run with folding on (TrainOptions::fold)
  // The first and the last pipeline stage each hold a copy of the tied
  // embedding (wte, also the LM head) on different ranks: their gradients
  // are reduced over data parallelism in a bucket of the copy's own
  // (tied_bucket), so that both stages own the same chunk of it, and then
  // summed over the embedding group (Megatron's order), which leaves both
  // copies bit-identical.
  bool tied_copies = false;
  // The flat range of the tied copy among `shards` when tied_copies and the
  // rank holds it (the first or the last stage), else empty.
  Range tied_bucket(const std::vector<parallel::ShardSpec>& shards) const;

  // The blocks pipeline rank `pp_rank` holds (stage_layers resolved).
  parallel::StagePlacement placement(int pp_rank) const {
    return {pp_, vpp_, pp_rank, stage_layers_, order_};
  }

 private:
  int pp_ = 1, vpp_ = 1;
  std::string embedding_;  // model::embedding_name: the tied tensor (gpt's wte, llama's embed_tokens)
  std::vector<int> stage_layers_;  // (pp·vpp) blocks per virtual stage, balanced when not given
  parallel::StageOrder order_ = parallel::StageOrder::kLoop;
};

// The model chunk of `place` (resolved) holding tensor `s`
// (parallel::chunk_bucket_plan): a block's by its layer; the embeddings
// the first stage's chunk; ln_f, the head and a last stage's tied wte copy
// the last stage's.
int model_chunk_of(const parallel::StagePlacement& place, const parallel::ShardSpec& s);

// The place of the device at `c` in its expert-parallel group, whose experts
// [r·E/ep, (r+1)·E/ep) it holds: the mesh's ep coordinate, or with whole
// experts (expert TP 1) tp + tp·ep (the mesh's "tp-ep" group, tp fastest).
inline int expert_rank(const ParallelOptions& p, const collectives::Coords& c) {
  return p.experts_whole() ? c.tp + p.tp * c.ep : c.ep;
}

}  // namespace shardlab::train
