#include "model/train/optimizer_step.h"

#include <algorithm>
#include <cmath>

#include "collectives/collectives.h"

namespace shardlab::train {

namespace coll = collectives;
using parallel::ShardSpec;

bool NormCounting::counts(const ShardSpec& s) const {
  const bool tied_copy = s.role == model::ParamRole::kTokenEmbedding && !first_stage;
  if (s.role == model::ParamRole::kRouterBias) return false;  // a load signal, no gradient
  return (!s.tp_replicated || tp_rank0) && !tied_copy && (zero_sharded || s.expert || ep_rank0) &&
         (!zero_sharded || replica0);
}

ShardedAdamW::ShardedAdamW(Device& dev, parallel::LocalModel& model, parallel::DataParallel& dp,
                           const coll::ProcessGroup& norm_group, NormCounting counting,
                           const coll::ProcessGroup* stage_group)
    : dev_(dev),
      model_(model),
      dp_(dp),
      norm_group_(norm_group),
      counting_(counting),
      stage_group_(stage_group && stage_group->size() > 1 ? stage_group : nullptr) {
  const int64_t owned = dp.owned_elements();
  const bool phantom = model::phantom_allocation();
  m_ = Tensor(dev.arena(), "adamw.exp_avg", {owned}, MemKind::kOptimizer, Precision::kFp32, phantom);
  v_ = Tensor(dev.arena(), "adamw.exp_avg_sq", {owned}, MemKind::kOptimizer, Precision::kFp32,
              phantom);
  if (dev.precision() != Precision::kFp32)
    master_ = Tensor(dev.arena(), "master weights", {owned}, MemKind::kMaster, Precision::kFp32,
                     /*phantom=*/true);
  if (dev.precision() != Precision::kFp8) return;
  using model::ParamRole;
  for (const ShardSpec& s : model_.shards()) {
    if (!parallel::is_fp8_linear_weight(s.role)) continue;
    fp8_elements_ += s.numel;
    // one FP8 GEMM each (llama's k_proj and v_proj share q_proj's; each of MLA's its own)
    if (s.role != ParamRole::kKvWeight) ++fp8_tensors_;
  }
  // W and Wᵀ in FP8: two bytes per weight, one 2-byte element at the run's precision.
  fp8_weights_ = Tensor(dev.arena(), "fp8 weight copies", {fp8_elements_}, MemKind::kParam,
                        Precision::kFp8, /*phantom=*/true);
}

// Transformer Engine casts each FP8 linear's BF16 weight to FP8 and FP8ᵀ once
// per step (the first micro-batch's forward; its copies serve the others):
// read 2 B, write 2 x 1 B per weight, charged here after the update. Then
// delayed scaling's fused amax-and-scale update over every FP8 tensor's amax
// history (3 per linear: input, weight, output gradient; NeMo's 1024-long
// history of fp32, read and rolled). The amax all-reduce over the group is
// not modeled (one small all-reduce per step).
void ShardedAdamW::fp8_weight_cast() {
  constexpr double kAmaxHistory = 1024;
  dev_.run(dev_.compute(), "fp8.weight_cast", model::fp8_cast_transpose_cost(fp8_elements_));
  const double history = 3.0 * double(fp8_tensors_) * kAmaxHistory;
  dev_.run(dev_.compute(), "fp8.scale_update", OpCost{history, history * 4 * 2});
}

template <typename F>
void ShardedAdamW::for_ranges(const std::vector<Range>& ranges, F&& f) const {
  int64_t state = 0;
  for (const Range& r : ranges) {
    for (const ShardSpec& s : model_.shards()) {
      const int64_t lo = std::max(r.begin, s.offset), hi = std::min(r.end(), s.offset + s.numel);
      if (hi > lo) f(lo, hi - lo, state + (lo - r.begin), s);
    }
    state += r.size;
  }
}

double ShardedAdamW::global_norm() {
  const auto grads = model_.grads();
  const auto n = static_cast<int64_t>(grads.size());
  const std::vector<Range> all{{0, n}};
  double sq = 0;
  if (grads.data()) {  // phantom: charged, not computed
    for_ranges(dp_.sharded_grads() ? dp_.owned() : all, [&](int64_t lo, int64_t cnt, int64_t, const ShardSpec& s) {
      if (counting_.counts(s)) sq += model::sum_squares(grads.data() + lo, cnt);
    });
  }
  dev_.run(dev_.compute(), "grad_norm",  // over the fp32 main gradients
           model::sum_squares_cost(dp_.sharded_grads() ? dp_.owned_elements() : n, parallel::kGradElemBytes));
  if (stage_group_ || norm_group_.size() > 1) sq = model_parallel_sum(static_cast<float>(sq));
  return std::sqrt(sq);  // alone, the double sum as it is
}

float ShardedAdamW::model_parallel_sum(float part) {
  if (stage_group_) return pipeline_sum(part);
  if (norm_group_.size() > 1) coll::all_reduce(dev_, norm_group_, coll::Buffer(&part, 1));
  return part;
}

// Megatron-LM 2021's fp16 optimizer (Float16OptimizerWithFloat16Params):
// the half-precision gradients copied into fp32 main gradients, then
// unscaled and checked for inf/nan in one pass
// (torch._amp_foreach_non_finite_check_and_unscale_), the verdict
// all-reduced over the model-parallel ranks. Charged only: shardlab's
// gradients are fp32 already and it has no loss scale.
void ShardedAdamW::half_grads_to_main() {
  const auto n = static_cast<double>(dp_.owned_elements());
  const int elem = element_size(dev_.precision());
  dev_.run(dev_.compute(), "main_grad_copy", OpCost{n, n * (elem + 4)});
  dev_.run(dev_.compute(), "unscale_check", OpCost{2 * n, n * (4 + 4)});
  model_parallel_sum(0.0f);  // found_inf: a max in Megatron, one float either way
}

// Every stage's partial sums gathered (within the stage, then over pp) and
// added left to right in the order of the whole model-parallel group (tp
// fastest, pp slowest): the bits of one direct all-reduce over that group,
// with two groups whose links are uniform (a folded phantom run needs them).
float ShardedAdamW::pipeline_sum(float part) {
  const auto n1 = size_t(norm_group_.size()), n2 = size_t(stage_group_->size());
  gathered_.assign(n1 * (n2 + 1), 0.0f);
  float* within = gathered_.data() + n1 * n2;  // this stage's partials
  within[norm_group_.rank()] = part;
  if (n1 > 1)
    coll::all_gather(dev_, norm_group_, coll::ConstBuffer(within + norm_group_.rank(), 1),
                     coll::Buffer(within, n1));
  coll::all_gather(dev_, *stage_group_, coll::ConstBuffer(within, n1),
                   coll::Buffer(gathered_.data(), n1 * n2));
  float sum = gathered_[0];
  for (size_t i = 1; i < n1 * n2; ++i) sum += gathered_[i];
  return sum;
}

double ShardedAdamW::step(const model::AdamWHyper& h, int step, double max_norm) {
  const bool half = dp_.half();
  if (half) half_grads_to_main();
  if (dp_.grad_bytes() == 2) {  // bf16 main gradients: the chunk cast to fp32 first (Megatron's
    // DistributedOptimizer._copy_model_grads_to_main_grads, `shard_model_grad.float()`)
    const auto n = static_cast<double>(dp_.owned_elements());
    dev_.run(dev_.compute(), "main_grad_cast", OpCost{n, n * (2 + 4)});
  }
  const double norm = global_norm();
  double clip = 1.0;  // torch clip_grad_norm_
  if (max_norm > 0 && max_norm / (norm + 1e-6) < 1) clip = max_norm / (norm + 1e-6);
  auto params = model_.params();
  auto grads = model_.grads();
  // A phantom run has no norm: it assumes the gradients are clipped whenever
  // clipping is on (the scaling kernel is charged), the worst case.
  const bool phantom = params.data() == nullptr;
  const bool clips = phantom ? max_norm > 0 : clip < 1;
  float* m = m_.data();
  float* v = v_.data();
  if (!phantom) {
    for_ranges(dp_.owned(), [&](int64_t lo, int64_t cnt, int64_t at, const ShardSpec& s) {
      if (s.role == model::ParamRole::kRouterBias)  // aux-loss-free balancing (kernels_moe.h)
        return model::router_bias_update(params.data() + lo, grads.data() + lo, cnt, h.router_bias_rate);
      if (clips) model::scale_inplace(grads.data() + lo, static_cast<float>(clip), cnt);
      model::adamw_update(params.data() + lo, m + at, v + at, grads.data() + lo, cnt, h,
                          s.decay ? h.weight_decay : 0.0, step + 1);
    });
  }
  const int elem = element_size(dev_.precision());
  const int64_t owned = dp_.owned_elements();
  if (clips) dev_.run(dev_.compute(), "grad_clip", model::scale_inplace_cost(owned, parallel::kGradElemBytes));
  // Mixed precision (bf16, fp8, and fp16 with half gradients; Megatron's
  // Float16Optimizer, apex's FusedAdam): AdamW over the fp32 master weights
  // and moments, reading the fp32 main gradient (read p, m, v, g and write
  // p, m, v at 4 B: 28 B per parameter), then the master weights copied into
  // the model's (read 4, write the run's element). In fp32 the model's
  // weights are the master weights: AdamW alone.
  dev_.run(dev_.compute(), "adamw", model::adamw_update_cost(owned, 4));
  if (dev_.precision() != Precision::kFp32)
    dev_.run(dev_.compute(), "param_copy", OpCost{double(owned), double(owned) * (4 + elem)});
  if (fp8_tensors_ > 0) fp8_weight_cast();
  dp_.gather_params(params);
  return norm;
}

}  // namespace shardlab::train
