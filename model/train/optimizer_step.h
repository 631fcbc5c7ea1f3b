// The optimizer step of one device: the global gradient norm (each parameter
// counted once over the whole cluster), torch's clip_grad_norm_, and AdamW on
// the parameters this device owns — all of them, or with ZeRO its chunks of
// every data-parallel bucket — followed by ZeRO's parameter all-gather.
//
// The AdamW moments are held only for the owned elements (their buffers are
// the optimizer memory charged to the arena, MemKind::kOptimizer); with a
// bf16 model the fp32 master weights of the owned part are charged too, as
// MemKind::kMaster (a phantom tensor: host math is fp32 already).
//
// Thread safety: one instance per device thread.
#pragma once

#include <span>
#include <vector>

#include "collectives/group.h"
#include "model/optimizer.h"
#include "model/parallel/data/data_parallel.h"
#include "model/parallel/local_model.h"
#include "runtime/device.h"

namespace shardlab::train {

// Which local tensors a device counts in the global norm, so that the sum
// over the norm group counts every parameter of the model exactly once.
struct NormCounting {
  bool tp_rank0 = true;      // tensors replicated over TP count on TP rank 0 only
  bool first_stage = true;   // the last stage's tied wte copy does not count
  bool ep_rank0 = true;      // non-expert tensors count on EP rank 0 only...
  bool zero_sharded = false; // ...unless ZeRO-2 already splits every gradient over dp
  bool replica0 = true;      // HSDP: only the first replica of each shard counts
  bool counts(const parallel::ShardSpec& s) const;
};

class ShardedAdamW {
 public:
  ShardedAdamW(Device& dev, parallel::LocalModel& model, parallel::DataParallel& dp,
               const collectives::ProcessGroup& norm_group, NormCounting counting,
               const collectives::ProcessGroup* stage_group = nullptr);

  // Clips by the global norm and takes the AdamW step (hyper-parameters `h`,
  // step number `step` from 0, clip at `clip` when > 0); returns the norm
  // before clipping.
  double step(const model::AdamWHyper& h, int step, double clip);
  // The AdamW moments of the owned elements, in the order of the owned
  // ranges (DataParallel::owned): what a checkpoint saves and restores.
  std::span<float> exp_avg() { return {m_.data(), static_cast<size_t>(m_.numel())}; }
  std::span<float> exp_avg_sq() { return {v_.data(), static_cast<size_t>(v_.numel())}; }

 private:
  double global_norm();
  // `part` summed over the model-parallel ranks (the norm group, then pp).
  float model_parallel_sum(float part);
  float pipeline_sum(float part);
  void half_grads_to_main();
  // Calls f(flat offset, count, state offset, spec) for the part of every
  // local tensor inside `ranges`; state offsets number the owned elements.
  template <typename F>
  void for_ranges(const std::vector<Range>& ranges, F&& f) const;

  Device& dev_;
  parallel::LocalModel& model_;
  parallel::DataParallel& dp_;
  const collectives::ProcessGroup& norm_group_;
  NormCounting counting_;
  // Pipelines: the stages' sums are added over the pp group after the
  // norm group's (within-stage) sum, as two collectives.
  const collectives::ProcessGroup* stage_group_;
  std::vector<float> gathered_;  // pipeline_sum's partials (real even in phantom runs)
  Tensor m_, v_, master_;  // (owned) AdamW moments; fp32 master weights (bf16 and fp8, phantom)
  // Precision::kFp8: the FP8 copies of the FP8 linears' weights (W and Wᵀ,
  // 1 B each, phantom) and how many weight tensors and elements they hold.
  Tensor fp8_weights_;
  int64_t fp8_tensors_ = 0, fp8_elements_ = 0;
  void fp8_weight_cast();
};

}  // namespace shardlab::train
