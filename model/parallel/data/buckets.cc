#include "model/parallel/data/buckets.h"

#include <algorithm>

#include "collectives/collectives.h"
#include "runtime/errors.h"

namespace shardlab::parallel {

namespace {

bool in_experts(const std::vector<Range>& experts, const Range& r) {
  for (const Range& e : experts) {
    const int64_t lo = std::max(r.begin, e.begin), hi = std::min(r.end(), e.end());
    if (hi <= lo) continue;
    SHARDLAB_CHECK(lo == r.begin && hi == r.end(),
                   "a ready range straddles expert and other tensors");
    return true;
  }
  return false;
}

}  // namespace

BucketPlan plan_buckets(const std::vector<Range>& ready_order,
                        const std::vector<Range>& expert_ranges, uint64_t bucket_bytes, int elem,
                        Range alone) {
  BucketPlan plan;
  Range open{0, 0};
  bool open_expert = false;
  auto close = [&] {
    plan.buckets.push_back(open);
    plan.expert.push_back(open_expert);
    open = {0, 0};
  };
  for (const Range& r : ready_order) {
    if (r.size <= 0) continue;
    const bool expert = in_experts(expert_ranges, r);
    if (alone.size > 0 && r.begin == alone.begin) {
      if (open.size > 0) close();
      open = r, open_expert = expert;
      close();
      continue;
    }
    const bool adjacent = open.size > 0 && (r.end() == open.begin || open.end() == r.begin);
    if (open.size > 0 && (!adjacent || expert != open_expert)) close();
    open = open.size == 0 ? r : Range{std::min(open.begin, r.begin), open.size + r.size};
    open_expert = expert;
    if (uint64_t(open.size) * uint64_t(elem) >= bucket_bytes) close();
  }
  if (open.size > 0) close();
  return plan;
}

std::vector<Range> owned_ranges(const BucketPlan& plan, int zero, int dp_size, int dp_rank,
                                int edp_size, int edp_rank) {
  std::vector<Range> owned;
  for (size_t i = 0; i < plan.buckets.size(); ++i) {
    const Range& b = plan.buckets[i];
    if (zero == 0) {
      owned.push_back(b);
      continue;
    }
    const bool expert = plan.expert[i];
    const Range c = collectives::chunk_range(
        static_cast<size_t>(b.size), expert ? edp_size : dp_size, expert ? edp_rank : dp_rank);
    if (c.size > 0) owned.push_back({b.begin + c.begin, c.size});
  }
  std::sort(owned.begin(), owned.end(),
            [](const Range& a, const Range& b) { return a.begin < b.begin; });
  return owned;
}

int64_t held_grad_elements(int64_t n, int64_t owned, int64_t largest, int zero) {
  return zero >= 2 ? std::min(n, owned + largest) : n;
}

}  // namespace shardlab::parallel
