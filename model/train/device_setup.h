// DeviceSetup: everything one device builds before its first step — its
// process groups, the model part it holds, data parallelism over its dp
// group, the executor of its schedule actions — and the memory they take,
// charged to its arena from the buffers themselves.
//
// Thread safety: one instance per device thread.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "model/parallel/data/data_parallel.h"
#include "model/parallel/context/cp_attention.h"
#include "model/parallel/tensor/fused_attention.h"
#include "model/parallel/data/fsdp.h"
#include "model/parallel/data/param_gather.h"
#include "model/parallel/parallel_context.h"
#include "model/parallel/pipeline/executor.h"
#include "model/train/device_program.h"
#include "model/engine/device_sink.h"
#include "model/train/optimizer_step.h"

namespace shardlab::train {

class DeviceSetup {
 public:
  DeviceSetup(const DeviceProgram& program, Device& dev);
  DeviceSetup(const DeviceSetup&) = delete;
  DeviceSetup& operator=(const DeviceSetup&) = delete;

  parallel::ParallelContext ctx;
  const collectives::Coords coords;
  const int micro_batches;
  const int64_t rows;  // per micro-batch on this dp rank
  std::unique_ptr<parallel::LocalModel> model;
  parallel::StageModel* stage = nullptr;  // the same model, as the executor drives it
  engine::DeviceSink sink;
  std::optional<parallel::DataParallel> dp;
  std::optional<parallel::Fsdp> fsdp;  // ZeRO-3: the model's block hooks
  std::optional<parallel::ParamGather> param_gather;  // --overlap-param-gather: the model's block hooks
  std::unique_ptr<parallel::CpAttention> cp_attention;  // --cp: the model's attention core
  std::unique_ptr<parallel::FusedAttention> fused_attention;  // --attention fused, without --cp
  std::optional<parallel::PipelineExecutor> executor;
  std::optional<ShardedAdamW> optimizer;
  std::vector<model::Batch> micro;  // reused: no allocation per step

  // The global batch row of micro-batch mb's first row on this rank.
  int64_t first_row(int mb) const;
  // The group that reduces the replicated weights' gradients (and averages
  // the losses): dp, or dp × cp under context parallelism.
  const collectives::ProcessGroup& data_group() { return ctx.group(cp > 1 ? "cp-dp" : "dp"); }
  const int cp;

 private:
  void make_model(const DeviceProgram& p, Device& dev);
  void make_data_parallel(const DeviceProgram& p, Device& dev);
  void make_fsdp(const DeviceProgram& p, Device& dev);
  void make_param_gather(const DeviceProgram& p, Device& dev);

  Tensor weights_, grads_;  // modeled memory of the parameters and gradients
};

}  // namespace shardlab::train
