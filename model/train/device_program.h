// The training program each virtual device runs (one instance shared by all
// device threads; every per-device object lives on the thread's stack).
//
// Shared state: `result` is written by rank 0 (steps, wall time) and, for
// final_params / step0_grads, by the ranks that own each element — disjoint
// writes, read only after the cluster has joined.
#pragma once

#include <span>
#include <vector>

#include "collectives/mesh.h"
#include "model/io/data.h"
#include "model/io/safetensors.h"
#include "model/params.h"
#include "model/parallel/local_model.h"
#include "model/train/trainer.h"
#include "runtime/device.h"

namespace shardlab::train {

struct DeviceProgram {
  const TrainOptions& options;
  const collectives::DeviceMesh& mesh;
  const model::ParamTable& table;
  const model::BatchSampler& sampler;
  const model::SafetensorsFile* init;  // or null
  TrainResult& result;
  const StepCallback& on_step;

  void run(Device& dev);
};

}  // namespace shardlab::train
