// Serving steps run on the virtual cluster: a StepExecutor backed by one
// replica's devices (tp x pp x ep), each running an InferEngine
// (model/infer/engine.h) — on the model's values (small models: each
// entry's token ids go in, the greedy token of every sampling entry comes
// back to the scheduler), or on shapes only (phantom: the weights, the cache
// and the logits have sizes and no storage). The devices stay up for the whole
// simulation: each holds the running sequences in its KV cache (charged to
// its arena as they grow, freed when the scheduler finishes or preempts
// them), and every step runs the batch through engine.step — embedding, the
// blocks' kernels, tensor-parallel all-reduces, pipeline sends, expert
// all-to-alls, the head — after which the sampler rank picks each
// sequence's token and broadcasts them, as generate does. The step's time is
// from the first device's start to the last device's end.
//
// Folding (ReplicaShape::fold, phantom runs of dense models only): the tp
// peers of a replica run the same program from the same state, so tp rank 0
// plays them all, as train --phantom folds (model/engine/fold.h): one device
// thread per pipeline stage instead of tp. The folded collectives replay the
// whole group on the link model and check that every peer ends where its
// representative does, so the times are the unfolded run's; a run that
// meets an asymmetry fails with RunError::folding() and can be run again
// unfolded.
//
// With one virtual engine one batch runs at a time: with pp > 1 a step
// crosses every stage before the next starts, and the last stage sends the
// tokens to the first (point to point), so PP adds latency to every token.
// With V virtual engines (ReplicaShape::virtual_engines, scheduler.h) a
// step starts at its engine's time, each device takes it when free, and
// the tokens reach the first stage in the engine's next batch (the
// scheduler's, as vLLM's driver sends them): up to V batches in flight.
//
// Prefix caching on values: each device keeps a copy of every named block's
// K and V rows (cache_block), and a sequence admitted on a cached prefix
// starts with those rows in its cache (KvCache::adopt), so its prefill
// computes only the rest. The copies are the model's shared blocks: the
// arena is charged for a block by the sequence that computed it, never for
// the sequences sharing it (the scheduler's block count is the memory model).
//
// plan() measures, in a run of its own, what a replica holds besides the KV
// cache — each device's weights and the activations of a step of
// `max_batch_tokens` — and each device's KV bytes per token, for
// kv_blocks_on_device (serving.h).
//
// Across processes (mpirun, runtime/transport.h) every process runs the
// same scheduler and its own devices of the replica; after each step the
// processes agree on the step's end (the latest over all of them) and on the
// sampler rank's tokens (Transport::exchange_in_run), so every scheduler
// makes the same decisions, the single-process run's.
//
// Thread safety: one caller (the scheduler); the device threads meet it in a
// mailbox under a mutex.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "collectives/mesh.h"
#include "model/config.h"
#include "model/infer/infer_plan.h"
#include "model/infer/sampler.h"
#include "model/io/safetensors.h"
#include "model/serve/scheduler.h"
#include "model/serve/speculative.h"
#include "runtime/cluster.h"
#include "runtime/trace.h"

namespace shardlab::serve {

// Disaggregated serving on values: the K and V a prefill replica's devices
// hand on, by (rank, request), laid out (layer, K/V, token, Cl), until the
// decode replica's device of that rank takes them.
struct HandoffStore {
  std::mutex m;
  std::map<std::pair<int, int>, std::vector<float>> rows;
};

// A replica: the model, its split, and where its values come from.
struct ReplicaShape {
  model::GPTConfig model;
  int tp = 1, pp = 1, ep = 1;
  bool phantom = true;                           // shapes only: no values, no tokens
  uint64_t seed = 1337;                          // the training init, without `init`
  const model::SafetensorsFile* init = nullptr;  // checked with infer::check_generate_init
  bool fold = false;                             // phantom, dense: tp rank 0 plays its tp peers
  int virtual_engines = 1;                       // batches in flight (SchedulerOptions::virtual_engines)
  // On values: the replica's devices share this many host threads as
  // fibers (ClusterOptions::host_threads; 0: a thread each; -1: one per
  // usable core, runtime/host_cores.h). A host thread steps its block of
  // devices from meeting to meeting with no hand-off through the kernel:
  // one thread was the fastest for tiny at tp 8 on 2 cores (bench_serve,
  // bench/README.md). Phantom runs keep a thread per running device.
  int host_threads = 1;
  // A draft model beside the target (speculative.h; tp only).
  std::optional<SpeculativeShape> speculative;
  // How tokens are chosen: request i's n-th token is draw n of seed + i
  // (greedy at temperature 0), as generate's with --seed seed + i.
  infer::SamplingOptions sampling;
  // Disaggregated: shared by every replica's executor (made by the first).
  std::shared_ptr<HandoffStore> handoffs = std::make_shared<HandoffStore>();
  bool kv_fp8 = false;  // the target's KV cache in FP8 (InferPlan::kv_fp8)
  int world() const { return tp * pp * ep; }
};

struct ReplicaPlan {
  std::vector<uint64_t> capacity_bytes, weight_bytes, activation_bytes;  // per device
  std::vector<double> kv_bytes_per_token;                                // per device
  // The replica's KV blocks: the smallest over its devices.
  int64_t kv_blocks(double kv_fraction, int block) const;
};

class ClusterStepExecutor final : public StepExecutor {
 public:
  // Checks the split against the model and that `cluster` has exactly
  // shape.world() devices (ConfigError otherwise).
  ClusterStepExecutor(Cluster& cluster, ReplicaShape shape);
  ~ClusterStepExecutor() override;
  // One probe step, a prefill of `max_batch_tokens` tokens (in sequences of
  // the model's context), in a run of its own. Call before the first step.
  ReplicaPlan plan(int64_t max_batch_tokens);

  void begin_step(int replica, double now_s) override;
  // The step's time; with values, the token of every sampling entry.
  StepOutcome run_step(std::span<const BatchEntry> batch) override;
  void release(int seq) override;
  void cache_block(int seq, int64_t first, int tokens, int32_t block) override;
  void evict_block(int32_t block) override;
  void hand_off(int seq, int request) override;
  void drain() override { finish(); }
  // Ends the devices' run (its stats and, with ClusterOptions::trace, the
  // timeline of every step at the scheduler's times); rethrows what a device
  // threw.
  RunResult finish();
  // Device threads a replica runs (fewer than its devices when folded).
  int running_devices() const {
    int n = 0;
    for (int rank = 0; rank < shape_.world(); ++rank) n += runs(rank) ? 1 : 0;
    return n;
  }
  // Every replica's finished run, in replica order.
  const std::vector<RunResult>& runs() const { return runs_; }

 private:
  struct Mailbox;
  void start();
  // The cluster's folding and host threads for this executor's runs.
  void prepare_run();
  bool runs(int rank) const { return representative_.empty() || representative_[size_t(rank)] == rank; }
  // Device `rank` runs in this process (always, but under mpirun).
  bool here(int rank) const;
  // Under mpirun: the step's end and tokens, agreed by every process.
  void agree_on_step(Time& end, std::vector<model::Token>& tokens);
  std::unique_lock<std::mutex> post(std::span<const BatchEntry> batch);

  Cluster& cluster_;
  ReplicaShape shape_;
  infer::InferPlan plan_;  // the split, checked; mesh, sampler, folding
  std::optional<infer::InferPlan> draft_plan_;  // the draft model's, when speculating
  std::vector<int> representative_;  // per rank, when folded; empty: every rank runs
  std::vector<int> owners_;          // per rank, its process under mpirun; empty: this one
  std::unique_ptr<Mailbox> box_;
  int replica_ = 0;
  Time clock_ = 0;  // the end of the replica's last step
  Time start_ = 0;  // of the step to run
  std::vector<RunResult> runs_;
};

}  // namespace shardlab::serve
