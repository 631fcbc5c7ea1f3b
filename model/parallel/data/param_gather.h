// Megatron's --overlap-param-gather for ZeRO 1 and 2 (its distributed
// optimizer): the optimizer step updates each rank's owned chunks and leaves
// the rest of the parameters stale; the next step's forward all-gathers them
// bucket by bucket, each just before the first hook point that uses it, so
// the gathers overlap the forward's compute instead of ending the step.
//
// Order, as Megatron-core dispatches them (param_and_grad_buffer.py,
// finish_param_sync; schedules.py, param_sync_func):
//  - one model chunk (1F1B, or no pipeline): a point that needs a bucket
//    launches its gather if nobody has, waits for it, and launches the next
//    bucket in forward order ("dispatches next bucket's param sync"); each
//    gather then overlaps the compute of the points before its first use,
//    and the step's first bucket is exposed whole;
//  - several chunks (the interleaved schedule, where Megatron aligns the
//    gathers across the pipeline: align_param_gather, which
//    Megatron-Bridge's comm_overlap.py sets with PP > 1 and VP > 1): the
//    step's start (begin_step, before the schedule's first receive) launches
//    every bucket of chunks 0 and 1; the rank's forward k
//    (counted over its chunks' micro-batch forwards) launches every bucket
//    of chunk j + 1 when k + pp_rank = j x pp, j < V (the slot where chunk j
//    begins on pipeline rank 0, so every stage launches it at once: the
//    virtual micro-batch id of schedules.py's param_sync_func); points wait
//    for theirs without launching more.
// The buckets are DataParallel's (data_parallel.h), in the order backward
// finishes them; a bucket belongs to the first point, in forward order, whose
// units (fsdp_units: the embeddings, each block, the head) overlap it. The
// optimizer step leaves every bucket stale (updated()); so does the start
// of the run (Megatron's forward hooks gather at the first step too). finish() gathers what is stale
// at once: after the last step (the run ends with its parameters whole) and
// before a checkpoint (Megatron disables the hooks with a sync there).
//
// Thread safety: one instance per device thread.
#pragma once

#include <map>
#include <span>
#include <vector>

#include "model/parallel/block_hooks.h"
#include "model/parallel/data/data_parallel.h"
#include "model/parallel/data/fsdp.h"
#include "runtime/device.h"

namespace shardlab::parallel {

class ParamGather final : public BlockHooks {
 public:
  // `params` the model's flat parameters; `passes` its hook points by chunk
  // and the units each needs (fsdp_passes); `units` those units.
  // `pp_rank` and `pp` place the rank in its pipeline (the aligned launches).
  ParamGather(Device& dev, DataParallel& dp, std::span<float> params, const std::vector<FsdpUnit>& units,
              const FsdpPasses& passes, int pp_rank, int pp);

  void begin_step();  // counts the step's forwards from 0; interleaved: launches chunks 0 and 1
  void updated();     // every bucket stale: the optimizer step updated the owned chunks
  void before_forward(int point) override;
  void finish();      // every stale bucket gathered and waited for (timed)
  // After the last step: the parameters made whole on the host, untimed (a
  // step's gathers belong to the next step's forward, which never comes).
  void finish_on_host();

  Time exposed() const { return exposed_; }  // compute waiting for gathers
  int64_t gathers() const { return gathers_; }
  uint64_t gathered_bytes() const { return gathered_bytes_; }  // modeled, the padded buckets

 private:
  enum class State { kStale, kInFlight, kDone };
  void launch(size_t bucket);
  void launch_chunk(size_t chunk);
  void wait(size_t bucket);

  Device& dev_;
  DataParallel& dp_;
  std::span<float> params_;
  bool aligned_ = false;                       // several chunks: launched a chunk at a time
  std::map<int, std::vector<size_t>> at_point_;  // hook point -> its buckets, each at its first point only
  std::map<int, size_t> chunk_start_;          // a chunk's first point -> the chunk
  std::vector<std::vector<size_t>> chunk_buckets_;
  std::vector<size_t> order_;                  // buckets in forward order
  std::vector<size_t> next_;                   // (buckets) the next in forward order, or none
  std::vector<State> state_;
  std::vector<std::optional<collectives::Work>> works_;
  int pp_rank_ = 0, pp_ = 1;
  int forwards_ = 0;                           // this step's chunk forwards so far
  Time exposed_ = 0;
  int64_t gathers_ = 0;
  uint64_t gathered_bytes_ = 0;
};

}  // namespace shardlab::parallel
