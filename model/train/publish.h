// What a device hands back to train() after its run: its statistics per step
// (MoE routing) and its parameters (and step-0 gradients) as slices of the
// unsharded tensors, for verify, checkpoints and the report.
#pragma once

#include <vector>

#include "collectives/mesh.h"
#include "model/parallel/data/data_parallel.h"
#include "model/parallel/local_model.h"
#include "model/train/trainer.h"

namespace shardlab::train {

// Adds this step's MoE block statistics to the device's record.
void record_moe(const parallel::LocalModel& model, int step, std::vector<MoeLayerTotals>& out);

// The step-0 gradients after the DP reduction, into result.step0_grads.
void publish_step0_grads(parallel::LocalModel& model, const parallel::DataParallel& dp,
                         const collectives::Coords& coords, const model::ParamTable& table,
                         TrainResult& result);

// The final parameters into result.replicas[dp rank] (every ep peer's
// replica gets this rank's experts) and, on the last pipeline stage, its
// tied wte copy into result.tied_copy.
void publish_params(parallel::LocalModel& model, const collectives::DeviceMesh& mesh, int rank,
                    const std::vector<int>& ep_members, TrainResult& result,
                    const model::ParamTable& table);

}  // namespace shardlab::train
