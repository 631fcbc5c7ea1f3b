#include "model/train/optimizer_step.h"

#include <algorithm>
#include <cmath>

#include "collectives/collectives.h"

namespace shardlab::train {

namespace coll = collectives;
using parallel::ShardSpec;

bool NormCounting::counts(const ShardSpec& s) const {
  const bool tied_copy = s.role == model::ParamRole::kTokenEmbedding && !first_stage;
  return (!s.tp_replicated || tp_rank0) && !tied_copy && (zero_sharded || s.expert || ep_rank0);
}

ShardedAdamW::ShardedAdamW(Device& dev, parallel::LocalModel& model, parallel::DataParallel& dp,
                           const coll::ProcessGroup& norm_group, NormCounting counting)
    : dev_(dev), model_(model), dp_(dp), norm_group_(norm_group), counting_(counting) {
  const int64_t owned = dp.owned_elements();
  m_ = Tensor(dev.arena(), "adamw.exp_avg", {owned}, MemKind::kOptimizer, Precision::kFp32);
  v_ = Tensor(dev.arena(), "adamw.exp_avg_sq", {owned}, MemKind::kOptimizer, Precision::kFp32);
  if (dev.precision() == Precision::kBf16)
    master_ = Tensor(dev.arena(), "master weights", {owned}, MemKind::kMaster, Precision::kFp32,
                     /*phantom=*/true);
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
  for_ranges(dp_.sharded_grads() ? dp_.owned() : all, [&](int64_t lo, int64_t cnt, int64_t, const ShardSpec& s) {
    if (counting_.counts(s)) sq += model::sum_squares(grads.data() + lo, cnt);
  });
  dev_.run(dev_.compute(), "grad_norm",  // over the fp32 main gradients
           model::sum_squares_cost(dp_.sharded_grads() ? dp_.owned_elements() : n, parallel::kGradElemBytes));
  if (norm_group_.size() > 1) {
    float part = static_cast<float>(sq);
    coll::all_reduce(dev_, norm_group_, coll::Buffer(&part, 1));
    sq = part;
  }
  return std::sqrt(sq);
}

double ShardedAdamW::step(const model::AdamWHyper& h, int step, double max_norm) {
  const double norm = global_norm();
  double clip = 1.0;  // torch clip_grad_norm_
  if (max_norm > 0 && max_norm / (norm + 1e-6) < 1) clip = max_norm / (norm + 1e-6);
  auto params = model_.params();
  auto grads = model_.grads();
  float* m = m_.data();
  float* v = v_.data();
  for_ranges(dp_.owned(), [&](int64_t lo, int64_t cnt, int64_t at, const ShardSpec& s) {
    if (clip < 1) model::scale_inplace(grads.data() + lo, static_cast<float>(clip), cnt);
    model::adamw_update(params.data() + lo, m + at, v + at, grads.data() + lo, cnt, h,
                        s.decay ? h.weight_decay : 0.0, step + 1);
  });
  const int elem = element_size(dev_.precision());
  const int64_t owned = dp_.owned_elements();
  if (clip < 1) dev_.run(dev_.compute(), "grad_clip", model::scale_inplace_cost(owned, parallel::kGradElemBytes));
  dev_.run(dev_.compute(), "adamw", model::adamw_update_cost(owned, elem));
  dp_.gather_params(params);
  return norm;
}

}  // namespace shardlab::train
