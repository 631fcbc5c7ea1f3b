// The bucket layout of data parallelism and what each rank owns under ZeRO,
// as pure functions of the shards, so that the memory preflight
// (model/train/preflight.h) counts exactly what DataParallel will hold.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/range.h"

namespace shardlab::parallel {

// Gradients are fp32 main gradients in every precision (Megatron keeps them
// in fp32 under bf16 too): 4 modeled bytes per element, in the arena, in the
// buckets and on the wire.
inline constexpr int kGradElemBytes = 4;

struct BucketPlan {
  std::vector<Range> buckets;  // in launch order
  std::vector<bool> expert;    // (buckets) whether bucket i holds expert tensors
};

// Consecutive ranges of `ready_order` (backward_ready_order) fill a bucket
// until it holds `bucket_bytes` at `elem` bytes per element; a range not
// adjacent to the open bucket, or of the other kind (inside `expert_ranges`,
// sorted, or not), closes it. Every range must lie wholly inside or outside
// the expert ranges. The ready range that begins at `alone.begin` (when
// alone is not empty) is a bucket of its own: two ranks that hold the same
// tensor among different neighbours then reduce it with the same chunking.
BucketPlan plan_buckets(const std::vector<Range>& ready_order,
                        const std::vector<Range>& expert_ranges, uint64_t bucket_bytes, int elem,
                        Range alone = {});

// The flat ranges a rank updates, sorted: every bucket without ZeRO, else
// chunk_range(bucket, group size, group rank) of each, the group being dp
// for dense buckets and edp for expert ones.
std::vector<Range> owned_ranges(const BucketPlan& plan, int zero, int dp_size, int dp_rank,
                                int edp_size, int edp_rank);

// Gradient elements a rank holds out of `n`: all of them, or with ZeRO-2 its
// `owned` chunks plus the `largest` bucket while it is reduced, at most n.
int64_t held_grad_elements(int64_t n, int64_t owned, int64_t largest, int zero);

}  // namespace shardlab::parallel
