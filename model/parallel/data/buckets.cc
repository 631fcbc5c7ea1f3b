#include "model/parallel/data/buckets.h"

#include <algorithm>
#include <numeric>

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

int64_t padded_bucket(int64_t size, int group, int zero) {
  if (zero != 1 && zero != 2) return size;
  const int64_t align = std::lcm(int64_t(group), kBucketAlign);
  return (size + align - 1) / align * align;
}

namespace {

// Calls f(bucket index, padded chunk of the rank) for every bucket under ZeRO.
template <typename F>
void for_chunks(const BucketPlan& plan, int zero, int dp_size, int dp_rank, int edp_size, int edp_rank, F&& f) {
  for (size_t i = 0; i < plan.buckets.size(); ++i) {
    const bool expert = plan.expert[i];
    const int g = expert ? edp_size : dp_size;
    const int64_t padded = padded_bucket(plan.buckets[i].size, g, zero);
    f(i, collectives::chunk_range(static_cast<size_t>(padded), g, expert ? edp_rank : dp_rank));
  }
}

}  // namespace

std::vector<Range> owned_ranges(const BucketPlan& plan, int zero, int dp_size, int dp_rank,
                                int edp_size, int edp_rank) {
  if (zero == 0) {
    std::vector<Range> all(plan.buckets);
    std::sort(all.begin(), all.end(), [](const Range& a, const Range& b) { return a.begin < b.begin; });
    return all;
  }
  std::vector<Range> owned;
  for_chunks(plan, zero, dp_size, dp_rank, edp_size, edp_rank, [&](size_t i, const Range& c) {
    const Range& b = plan.buckets[i];
    const int64_t end = std::min(c.end(), b.size);  // the padding is nobody's
    if (end > c.begin) owned.push_back({b.begin + c.begin, end - c.begin});
  });
  std::sort(owned.begin(), owned.end(),
            [](const Range& a, const Range& b) { return a.begin < b.begin; });
  return owned;
}

int64_t owned_elements(const BucketPlan& plan, int zero, int dp_size, int dp_rank, int edp_size,
                       int edp_rank) {
  int64_t n = 0;
  if (zero == 0) {
    for (const Range& b : plan.buckets) n += b.size;
    return n;
  }
  for_chunks(plan, zero, dp_size, dp_rank, edp_size, edp_rank, [&](size_t, const Range& c) { n += c.size; });
  return n;
}

PaddedSizes padded_sizes(const BucketPlan& plan, int zero, int dp_size, int edp_size) {
  PaddedSizes s;
  for (size_t i = 0; i < plan.buckets.size(); ++i) {
    const int64_t p = padded_bucket(plan.buckets[i].size, plan.expert[i] ? edp_size : dp_size, zero);
    s.total += p;
    s.largest = std::max(s.largest, p);
  }
  return s;
}

int64_t held_grad_elements(int64_t n, int64_t owned, int64_t largest, int zero) {
  return zero >= 2 ? std::min(n, owned + largest) : n;
}

}  // namespace shardlab::parallel
