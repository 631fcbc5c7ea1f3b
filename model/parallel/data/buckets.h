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

// Megatron's distributed optimizer pads every bucket's end to a multiple of
// lcm(group size, 128) elements (megatron/core/distributed/
// param_and_grad_buffer.py, _pad_end_of_bucket_if_needed; 128 for 256-byte
// alignment), so that every rank's shard has the same size. ZeRO-1 and -2
// (shardlab's distributed optimizer) do the same: `size` elements of a
// bucket sharded over `group` ranks become padded_bucket(size, group, zero).
// The padding elements are zeros that no rank updates: they change no
// gradient, loss or parameter bit, but they are on the wire (every
// reduction and all-gather of the bucket moves them), in the gradient and
// parameter buffers, and in the owner's optimizer chunk (every rank is
// charged a whole chunk, as Megatron's first rank holds one: the memory and
// optimizer time of the fullest rank). ZeRO-3 (FSDP's flat parameters) and
// no ZeRO pad nothing.
inline constexpr int64_t kBucketAlign = 128;
int64_t padded_bucket(int64_t size, int group, int zero);

// The flat ranges a rank updates, sorted: every bucket without ZeRO, else
// chunk_range(padded bucket, group size, group rank) of each, the group
// being dp for dense buckets and edp for expert ones, less its padding (a
// rank whose chunk is all padding owns nothing of that bucket).
std::vector<Range> owned_ranges(const BucketPlan& plan, int zero, int dp_size, int dp_rank,
                                int edp_size, int edp_rank);

// The elements a rank's optimizer holds and is charged for: the sizes of its
// chunks of the padded buckets (the same on every rank under ZeRO-1/2), or
// every element without ZeRO.
int64_t owned_elements(const BucketPlan& plan, int zero, int dp_size, int dp_rank, int edp_size,
                       int edp_rank);

// The padded buckets' elements: what the gradient and parameter buffers
// hold (their largest bucket: `largest`).
struct PaddedSizes {
  int64_t total = 0, largest = 0;
};
PaddedSizes padded_sizes(const BucketPlan& plan, int zero, int dp_size, int edp_size);

// Gradient elements a rank holds out of `n` (the padded buckets' total):
// all of them, or with ZeRO-2 its `owned` chunks plus the `largest` bucket
// while it is reduced, at most n.
int64_t held_grad_elements(int64_t n, int64_t owned, int64_t largest, int zero);

}  // namespace shardlab::parallel
