// ZeRO-3 / FSDP: parameters sharded over the data-parallel group in units,
// each unit all-gathered just before its forward and again before its
// backward, and freed after (PyTorch FSDP, DeepSpeed ZeRO-3).
//
// Units. One per transformer block, one for the embeddings (wte, wpe) and
// one for the head (ln_f). The tied wte belongs to one unit: the
// embeddings' on a rank that holds wpe (the first stage), else the head's
// (a last stage's copy). The head's compute needs wte, so the head's hook
// point gathers the embeddings unit too when it holds wte.
//
// Buckets are the units themselves (fsdp_bucket_plan): each unit's tensors
// split only where they stop being contiguous or switch between expert and
// other tensors, so DataParallel (data_parallel.h) reduce-scatters a unit's
// gradients as soon as backward announces them final (ZeRO-2's machinery),
// and rank r owns chunk r of every bucket (chunk_range): the optimizer
// updates only that chunk (ZeRO-1's). Expert buckets shard over edp.
//
// A unit's flow, on the hooks ShardedGPT calls around every hook point
// (embeddings, each block, the head; BlockHooks in block_hooks.h):
//   before  gather: the unit's all-gather on the communication stream (its
//           gathered buffer charged to the arena as parameters), the compute
//           stream waits for it (the wait beyond compute is the exposed
//           gather time); with prefetch, the next point's units are
//           gathered now too, overlapping this point's compute
//   after   free: the gathered buffer released once no later point of the
//           same pass needs the unit; after forward only with
//           reshard_after_forward (otherwise kept until its backward: FSDP's
//           ZeRO-2-like mode); the non-owned elements are poisoned (NaN) so
//           a use without a gather cannot pass verify.
//   grads   reduce-scattered by DataParallel when announced final; after a
//           backward that is not the step's last, the point's finished units
//           are reduce-scattered at once (DataParallel::reduce_partial), as
//           FSDP reduces every backward, except buckets holding a range that
//           is only whole at the step's end (DataParallel::set_final_only:
//           the tied wte's two pipeline copies, Llama K/V summed over TP
//           when final).
// Prefetch stays inside one pass of one model chunk.
//
// Thread safety: one instance per device thread.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <vector>

#include "model/parallel/block_hooks.h"
#include "model/parallel/data/data_parallel.h"
#include "model/parallel/local_model.h"
#include "runtime/device.h"

namespace shardlab::parallel {

inline constexpr int kEmbeddingsUnit = BlockHooks::kEmbeddings;  // unit and hook id of the embeddings; the head's is n_layer

struct FsdpOptions {
  bool reshard_after_forward = true;  // --no-reshard-after-forward: keep units from forward to backward
  bool prefetch = true;               // --no-prefetch: gather each unit only when it is needed
};

struct FsdpUnit {
  int id = 0;                 // kEmbeddingsUnit, a block, or the head (n_layer)
  std::vector<Range> ranges;  // flat ranges, in backward_ready_order
  int64_t elements() const;
};

// This rank's units in the order backward finishes them (head, blocks from
// last to first, embeddings); units without tensors here are left out.
std::vector<FsdpUnit> fsdp_units(const std::vector<ShardSpec>& shards, int n_layer);

// DataParallel's buckets under ZeRO-3: every unit's ranges, split at gaps
// and at expert boundaries, never merged across units.
BucketPlan fsdp_bucket_plan(const std::vector<FsdpUnit>& units, const std::vector<Range>& experts);

// The hook points of each model chunk in forward order (kEmbeddingsUnit on
// the first stage, its blocks, n_layer on the last) and the units a point
// needs (the head's: the head unit and wte's unit). `chunks` are the rank's
// model chunks (hook_chunks of its StagePlacement, sharded_gpt.h, which also
// has this function's overload for a placement).
struct FsdpPasses {
  std::vector<std::vector<int>> chunks;     // (chunks) hook points in forward order
  std::map<int, std::vector<int>> needs;    // hook point -> unit ids
};
FsdpPasses fsdp_passes(const std::vector<HookChunk>& chunks, const std::vector<FsdpUnit>& units,
                       const std::vector<ShardSpec>& shards, int n_layer);

// The most gathered elements a rank holds at once (the memory preflight):
// every unit without reshard_after_forward, else the peak of walking each
// chunk's forward and backward with this class's gather and free rules.
int64_t fsdp_peak_gathered(const FsdpPasses& passes, const std::vector<FsdpUnit>& units,
                           const FsdpOptions& options);

class Fsdp final : public BlockHooks {
 public:
  // `params` is the model's full flat buffer (the host keeps it whole; only
  // the owned chunks are valid between uses); `dp` plans the buckets
  // (fsdp_bucket_plan) and owns the groups.
  Fsdp(Device& dev, DataParallel& dp, std::span<float> params, std::vector<FsdpUnit> units,
       FsdpPasses passes, const FsdpOptions& options);

  void before_forward(int point) override;
  void after_forward(int point) override;
  void before_backward(int point) override;
  void after_backward(int point) override;

  // Poisons every non-owned element (after init or a checkpoint load).
  void shard();
  // Publishing: every owned chunk copied into its peers' host buffers (a
  // full state dict offloaded to the host), untimed and not charged to the
  // arena: the run is over.
  void gather_all_to_host();

  Time exposed() const { return exposed_; }        // compute waiting for gathers
  int64_t gathers() const { return gathers_; }      // unit all-gathers issued
  uint64_t gathered_bytes() const { return gathered_bytes_; }  // modeled, sent+kept

 private:
  struct Live {
    bool present = false;
    Tensor memory;  // the gathered unit, modeled (phantom)
    std::vector<collectives::Work> works;
  };
  void acquire_point(int point, bool forward);
  void release_point(int point, bool forward, bool reshard);
  void issue(int unit);
  void wait(int unit);
  void free(int unit);
  void gather_buckets(int unit, std::vector<collectives::Work>& works);
  // After a backward at `point`: its units whose gradients are done in this
  // pass reduce-scattered (reduce_partial; nothing in the step's last).
  void reduce_finished(int point);
  // Units of `point` that the rest of its pass (by `forward`) needs again.
  bool needed_later(int point, int unit, bool forward) const;
  int next_point(int point, bool forward) const;

  Device& dev_;
  DataParallel& dp_;
  std::span<float> params_;
  FsdpOptions options_;
  FsdpPasses passes_;
  std::map<int, size_t> index_;                 // unit id -> units_
  std::vector<FsdpUnit> units_;
  std::vector<std::vector<size_t>> buckets_;    // (units) dp bucket indices
  std::vector<Live> live_;
  std::map<int, std::pair<size_t, size_t>> at_;  // hook point -> (chunk, position)
  Time exposed_ = 0;
  int64_t gathers_ = 0;
  uint64_t gathered_bytes_ = 0;
};

}  // namespace shardlab::parallel
