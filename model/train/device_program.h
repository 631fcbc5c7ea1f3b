// The training program each virtual device runs (one instance shared by all
// device threads; every per-device object lives on the thread's stack).
//
// A device's run, by responsibility:
//   setup      DeviceSetup (device_setup.h): its groups (ParallelContext),
//              its model, data parallelism, the schedule executor, memory
//   the step   every config the same way: the executor runs this rank's
//              schedule actions (forward, backward per micro-batch when there
//              is no pipeline), then the data-parallel reduction
//   optimizer  ShardedAdamW (optimizer_step.h): global norm, clip, AdamW on
//              the owned parameters, ZeRO's gather
//   publishing publish.h: the step record, MoE statistics, parameters and
//              gradients as slices of the unsharded tensors
//
// Shared state: `result` is written by rank 0 (steps, wall time) and, for
// replicas / step0_grads / tied_copy, by the ranks that own each element —
// disjoint writes, read only after the cluster has joined.
#pragma once

#include <functional>

#include "collectives/mesh.h"
#include "model/io/data.h"
#include "model/io/safetensors.h"
#include "model/params.h"
#include "model/parallel/local_model.h"
#include "model/train/trainer.h"
#include "runtime/device.h"

namespace shardlab::train {

struct ParallelPlan;
struct ResumeState;

struct DeviceProgram {
  const TrainOptions& options;
  const ParallelPlan& plan;  // the layout's derived facts, the mesh among them (parallel_plan.h)
  const model::ParamTable& table;
  const model::BatchSampler* sampler;  // null in a phantom run (no data)
  const model::SafetensorsFile* init;  // or null
  TrainResult& result;
  const StepCallback& on_step;
  const ProgressCallback& on_progress;  // called from device 0 only; may be empty
  // Called on every device after the last step, before its parameters are
  // published (verify's corruption aid); may be empty.
  std::function<void(int rank, parallel::LocalModel&)> before_publish;
  // A resumed run's starting state (checkpoint.h), or null.
  const ResumeState* resume = nullptr;
  // Called on every device before the first step (verify's corruption aid
  // with a relative size); may be empty.
  std::function<void(int rank, parallel::LocalModel&)> before_first_step;

  void run(Device& dev) const;
};

}  // namespace shardlab::train
