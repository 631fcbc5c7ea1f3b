// Data parallelism: gradient averaging over the dp group in buckets that
// overlap the rest of backward, and ZeRO stages 1 and 2.
//
// Buckets. The layout is planned once from the order in which backward
// finishes the gradients (ln_f, the last block, ..., the first block, wte,
// wpe: backward_ready_order): consecutive ranges fill a bucket until it holds
// bucket_bytes (modeled, fp32 main gradients: buckets.h). During backward each block reports its gradients as
// final (OpSink::grads_ready); a bucket whose elements are all final is
// launched on the communication stream, starting when the compute stream has
// produced it, so it overlaps the backward of the earlier layers (PyTorch
// DDP's and Megatron's bucketing). With overlap off, and for anything not
// reported, buckets launch after backward. The layout depends only on the
// model, so it is identical on every rank and every step.
//
// ZeRO. Each bucket is split in dp chunks; rank r owns chunk r of every
// bucket (chunk_range). ZeRO-1 and -2 first pad every bucket to a multiple of
// lcm(dp, 128) elements, as Megatron's distributed optimizer does
// (buckets.h, padded_bucket): every chunk then has the same size; the
// collectives move the padded bucket (zeros past its end, in a host scratch
// in real math) and nobody owns the padding. Stage 0: all-reduce (avg) every bucket; every rank
// updates all parameters. Stage 1: the same all-reduce, each rank updates only
// what it owns, then all-gathers the parameters; optimizer state is held for
// the owned part only. Stage 2: reduce-scatter instead of all-reduce, so
// gradients are held (and reduced) only for the owned part too.
//
// Expert parallelism. Expert tensors (ExpertGrads::ranges) differ across the
// ep ranks of a dp group; each already sums the contributions of every token
// its ep group routed to it. Their buckets (never mixed with other tensors)
// are reduced over the "edp" group (the dp/ep ranks holding the same experts)
// with SUM and then scaled by 1/dp, giving the global batch's mean gradient
// (Megatron does the same). With ZeRO, expert buckets are chunked over edp:
// edp rank r owns chunk r of every expert bucket.
//
// ZeRO-3 (fsdp.h) plans one bucket per FSDP unit (fsdp_bucket_plan) and
// reduce-scatters them as ZeRO-2 does; its parameters are gathered unit by
// unit around their use (Fsdp), so gather_params does nothing. It also
// reduces every micro-batch, not only the step's last (reduce_partial), as
// PyTorch FSDP, DeepSpeed ZeRO-3 and Megatron-FSDP do: a unit's gradients
// are reduce-scattered as soon as each backward has produced them and the
// chunk added into this rank's sharded accumulator, so a device never holds
// more than its shards and the unit being reduced (held_grad_elements). Hybrid
// sharding (HSDP, set_replicas): `dp` is then the shard group and each
// reduce-scattered chunk is averaged again over the replicas, the ranks at
// the same place in the other shard groups (PyTorch's HYBRID_SHARD).
//
// ZeRO-2 reduces every micro-batch too, as DeepSpeed's stage 2 does
// (deepspeed/runtime/zero/stage_1_and_2.py, reduce_ready_partitions_and_remove_grads:
// `if self.partition_gradients or self.is_gradient_accumulation_boundary()`;
// stage 1 and Megatron's distributed optimizer reduce once, at the step's
// last micro-batch): a backward that is not the step's last announces its
// finished ranges (grads_partial), and a bucket whose elements all were is
// reduce-scattered at once (reduce_partial, ZeRO-3's machinery), on the
// communication stream after what compute has produced, so it overlaps the
// rest of that backward and the next micro-batch's forward. Buckets holding
// a range whose gradient is only whole at the step's end (set_final_only)
// are reduced once, as ZeRO-3's are.
//
// Thread safety: one instance per device thread.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <vector>

#include "collectives/collectives.h"
#include "model/parallel/data/buckets.h"
#include "model/parallel/local_model.h"
#include "runtime/device.h"

namespace shardlab::parallel {

struct DataParallelOptions {
  uint64_t bucket_bytes = 25ull << 20;  // modeled bytes per bucket (--bucket-mb; DDP's default 25 MB)
  bool overlap = true;                  // launch buckets during backward
  int zero = 0;                         // ZeRO stage: 0, 1, 2 or 3
  Range alone{};                        // a range in a bucket of its own (plan_buckets)
  // Half-precision gradients (train::ParallelOptions::half_grads): 2 B per
  // gradient on the wire, and DDP's copies around the all-reduce charged.
  bool half_grads = false;
  // Megatron's --overlap-param-gather: the optimizer step leaves the
  // parameters' all-gathers to ParamGather (param_gather.h).
  bool defer_param_gather = false;
  // train::ParallelOptions::grad_reduce_bf16: the main gradients in bf16
  // (2 B on the wire and in the buffers, in mixed precision).
  bool grad_bf16 = false;
  // With zero 1: Megatron's distributed optimizer (train::ParallelOptions::
  // distributed_optimizer). The buffers stay ZeRO-1's (every gradient held),
  // the gradients are reduce-scattered as ZeRO-2's, once per step.
  bool reduce_scatter = false;
};

class DataParallel {
 public:
  struct ExpertGrads {
    const collectives::ProcessGroup* edp = nullptr;  // the mesh's "edp" group
    std::vector<Range> ranges;  // local flat ranges of expert tensors (expert_ranges)
  };

  // `grads` is the local flat gradient buffer; `dp` the data-parallel group;
  // `ready_order` the flat ranges in the order backward finishes them, each
  // either inside `experts.ranges` or outside them.
  DataParallel(Device& dev, const collectives::ProcessGroup& dp, std::span<float> grads,
               const std::vector<Range>& ready_order, const DataParallelOptions& options,
               const ExpertGrads& experts);
  DataParallel(Device& dev, const collectives::ProcessGroup& dp, std::span<float> grads,
               const std::vector<Range>& ready_order, const DataParallelOptions& options)
      : DataParallel(dev, dp, grads, ready_order, options, ExpertGrads{}) {}
  // With the buckets planned by the caller (ZeRO-3: fsdp_bucket_plan).
  DataParallel(Device& dev, const collectives::ProcessGroup& dp, std::span<float> grads,
               BucketPlan plan, const DataParallelOptions& options, const ExpertGrads& experts);

  // HSDP: each owned chunk is all-reduced (avg) over `replicas` after its
  // reduce-scatter. Before the first step; dense buckets only.
  void set_replicas(const collectives::ProcessGroup& replicas);
  // This rank's index among its replicas (0 without HSDP).
  int replica_rank() const { return replicas_ ? replicas_->rank() : 0; }

  // Called at the start of every step.
  void begin_step();
  // Gradients of [offset, offset + count) are final (from backward).
  void grads_ready(int64_t offset, int64_t count);
  // Launches what is pending, waits for every reduction (the compute stream
  // joins them). Afterwards the owned gradients hold the dp average.
  void finish_grads();
  // ZeRO-2 and -3 with overlap: bucket i holds a micro-batch's gradients that are
  // not the step's last (its final reduction is not launched yet). They are
  // reduce-scattered now (after what compute has issued), the chunk added
  // into the owned accumulator by a kernel on the communication stream
  // (Megatron-FSDP's gradient accumulation after its reduce-scatter), and
  // the local bucket starts from zero again (real math). The final launch
  // adds the accumulator into its result. Returns whether it reduced
  // (false: final already launched, one-rank group, a final-only bucket, or
  // not ZeRO-2/3).
  bool reduce_partial(size_t bucket);
  // ZeRO-2 and -3 with overlap (without it every bucket waits for backward's end).
  bool reduces_each_micro_batch() const { return options_.zero >= 2 && options_.overlap; }
  // ZeRO-2: a backward that is not the step's last finished its part of
  // [offset, offset + count); a bucket whose elements all were (once per
  // micro-batch) is reduced now (reduce_partial). ZeRO-3's Fsdp reduces its
  // units itself, at its hook points.
  void grads_partial(int64_t offset, int64_t count);
  // Buckets overlapping one of `ranges` are reduced once, at the step's end:
  // their gradients are completed only after the last backward (the tied
  // wte's two pipeline copies summed, Llama's replicated K/V summed over TP).
  void set_final_only(const std::vector<Range>& ranges);
  // Reduce-scatters of gradient buckets launched over the run (ZeRO 2/3).
  int64_t reduce_scatters() const { return reduce_scatters_; }
  // The planned buckets, in launch order; whether bucket i holds expert tensors.
  const std::vector<Range>& buckets() const { return layout_; }
  bool expert_bucket(size_t i) const { return expert_bucket_[i]; }
  // The flat ranges this rank updates (its chunk of every bucket with ZeRO,
  // everything otherwise), in flat order.
  const std::vector<Range>& owned() const { return owned_; }
  int64_t owned_elements() const { return owned_elements_; }
  // Sums (all-reduce, SUM over `over`) this rank's chunk of the bucket that
  // is exactly `bucket` (flat range), at its padded size: every rank of the
  // group moves a chunk of one size, the last owner's tail of padding as
  // zeros (real math copies the real part in and out of a scratch), as a
  // padded gradient partition is summed. ZeRO 1/2 only.
  void sum_owned_chunk(const Range& bucket, const collectives::ProcessGroup& over);
  // The group bucket i is reduced over: edp for expert buckets, else dp.
  const collectives::ProcessGroup& group_of(size_t bucket) const {
    return expert_bucket_[bucket] ? *edp_ : dp_;
  }
  // Bucket i's elements on the wire and in the buffers, padding included.
  int64_t padded(size_t i) const { return padded_[i]; }
  // The padded buckets' elements: the modeled gradient and parameter buffers.
  int64_t buffer_elements() const { return buffer_elements_; }
  // ZeRO 1/2: all-gathers every bucket of `params` from its owners (with
  // defer_param_gather, nothing: ParamGather gathers them in the next forward).
  void gather_params(std::span<float> params);
  // Bucket i of `params` all-gathered from its owners on the communication
  // stream, after what the compute stream has issued so far; the returned
  // work is what a use waits for. Nothing when its group is one rank.
  std::optional<collectives::Work> gather_bucket(size_t i, std::span<float> params);
  // Every owned chunk of `params` copied into its peers' host buffers at the
  // end of a run (publishing: untimed, not on any port).
  void gather_to_host(std::span<float> params);

  int zero() const { return options_.zero; }
  // Gradients reduce-scattered: each rank holds the reduced gradient of its
  // owned chunks only (ZeRO-2, ZeRO-3, Megatron's distributed optimizer).
  bool sharded_grads() const { return options_.zero >= 2 || (options_.zero == 1 && options_.reduce_scatter); }
  // Half-precision gradients charged: options' half_grads in mixed precision.
  bool half() const;
  // Bytes of one main gradient: 2 with grad_bf16 in mixed precision, else 4
  // (fp32; half_grads' are charged apart, half()).
  int grad_bytes() const;
  uint64_t largest_bucket_bytes() const;  // modeled bytes of fp32 gradients, padding included
  // Gradient elements a rank of this scheme holds: all of them, or with
  // ZeRO-2 its owned chunks plus the largest bucket while it is reduced (the
  // host keeps the whole buffer; this is what a device would hold).
  int64_t held_grad_elements() const;

 private:
  void launch(size_t bucket);
  // Real math on a padded bucket: its elements followed by zeros, in pad_.
  float* padded_copy(const float* bucket, size_t i);
  OpCost half_copy_cost(int64_t n) const;
  // Expert buckets: sum over edp -> mean over dp.
  void scale_expert_buckets();
  // Bucket i's reduction on its group (reduce-scatter with ZeRO 2/3, else
  // all-reduce); `final`: the step's last, else a partial one (ZeRO-3).
  void reduce(size_t i, bool final);
  // ZeRO-3's accumulation kernel after bucket i's reduce-scatter, on the
  // communication stream; in real math the chunk's real elements `mine`
  // (`real` of them) added into acc_ (partial) or acc_ added into them (final).
  void accumulate(size_t i, float* mine, int64_t chunk, int64_t real, bool final);

  Device& dev_;
  collectives::ProcessGroup dp_;
  std::span<float> grads_;
  DataParallelOptions options_;
  std::optional<collectives::ProcessGroup> edp_, replicas_;
  std::vector<Range> expert_ranges_;      // sorted
  std::vector<bool> expert_bucket_;       // (buckets)
  std::vector<Range> layout_;             // buckets in launch order
  std::vector<int64_t> padded_;           // (buckets) padded_bucket of each
  int64_t buffer_elements_ = 0, largest_padded_ = 0;
  std::vector<float> pad_;                // padded_copy's scratch
  std::vector<int64_t> ready_;            // (buckets) final elements this step
  std::vector<bool> launched_;            // (buckets)
  std::vector<collectives::Work> works_;  // launched this step
  std::vector<int> partials_;             // (buckets) reduce_partial calls this step
  std::vector<int64_t> partial_ready_;    // (buckets) ZeRO-2: elements announced partial, not yet reduced
  std::vector<bool> final_only_;          // (buckets) never reduced partially
  std::vector<int64_t> acc_offset_;       // (buckets) the bucket's owned real elements in acc_
  std::vector<float> acc_;                // real math: the partial reductions' sum, owned elements
  Event acc_done_{};                      // the last accumulation kernel (compute joins it)
  int64_t reduce_scatters_ = 0;
  std::vector<Range> owned_;
  int64_t owned_elements_ = 0;
};

// The order in which backward finishes gradients, from the shards' names and
// layers: ln_f, blocks from last to first, then wte and wpe; each entry the
// flat range of one group of tensors (they are contiguous in the layout).
std::vector<Range> backward_ready_order(const std::vector<ShardSpec>& shards);

// Megatron-core's disable_bucketing (DistributedDataParallel; Megatron-LM's
// get_model and Megatron-Bridge's _ddp_wrap set it for every model chunk
// after the first, and for all of them with
// overlap_param_gather_with_optimizer_step): each model chunk (`chunk_of`
// a tensor: train::model_chunk_of) one bucket, split only at gaps, at
// expert boundaries and around `alone` (plan_buckets), never merged across
// chunks; chunks in the order backward finishes their first tensor.
BucketPlan chunk_bucket_plan(const std::vector<ShardSpec>& shards,
                             const std::function<int(const ShardSpec&)>& chunk_of,
                             const std::vector<Range>& experts, Range alone = {});

// The flat ranges of the expert tensors (ShardSpec::expert) among `shards`.
std::vector<Range> expert_ranges(const std::vector<ShardSpec>& shards);

}  // namespace shardlab::parallel
