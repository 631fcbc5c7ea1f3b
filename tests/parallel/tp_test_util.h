// Helpers for the tensor-parallel tests: run TensorParallelGPT on a cluster
// of tp devices, gather its shards back into unsharded flat buffers, and
// compare with GPT<float> from the same seed and batch.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "model/config.h"
#include "model/kernels.h"
#include "model/parallel/local_model.h"
#include "model/params.h"
#include "runtime/time.h"

namespace shardlab::parallel::testing {

// 2 layers, 4 heads, embd 32, seq 16, vocab 64; MoE: 4 experts, top-2 in
// layer 0 (moe_every 2), so one dense and one MoE block.
model::GPTConfig small_config(bool moe);

struct Batch {
  std::vector<model::Token> inputs, targets;  // (B,T)
  int B = 0, T = 0;
};
Batch make_batch(const model::GPTConfig& config, int B, int T, uint64_t seed);

// What one TP rank reports after forward + backward.
struct RankResult {
  std::vector<float> params, grads;
  std::vector<ShardSpec> shards;
  std::vector<float> losses;  // forward's return, per step
  float ce = 0, aux = 0;
  int64_t live_activations = 0;  // saved - freed at the end (0 expected)
  int64_t peak_activations = 0;
  std::vector<std::pair<int64_t, int64_t>> grads_ready;  // (offset, count) in order
  Time end_time = 0;
};

struct RunSpec {
  int tp = 1;
  bool sp = false;
  uint64_t seed = 1234;
  int dp = 1;         // data-parallel replicas: each takes B/dp rows; grads, loss and
                      // MoE fractions averaged over dp (as the trainer does)
  int backwards = 1;  // forward+backward passes without zero_grad in between
  // If non-empty: every rank loads its slices of these unsharded parameters
  // (ParamTable layout) after construction.
  std::vector<float> global_params;
};

inline RunSpec run_spec(int tp, bool sp, int backwards = 1) {
  RunSpec s;
  s.tp = tp;
  s.sp = sp;
  s.backwards = backwards;
  return s;
}

// Runs TensorParallelGPT on tp·dp devices (one NVLink node). Returns the
// results of the dp-coordinate-0 ranks, in TP order.
std::vector<RankResult> run_tp(const model::GPTConfig& config, const Batch& batch,
                               const RunSpec& spec);

// Gathers a per-rank flat buffer (params or grads) into the unsharded layout.
// Checks every element is covered and that copies of replicated tensors agree
// bit for bit; the first disagreement is returned in `mismatch` (empty if none).
std::vector<float> gather(const model::ParamTable& table, const std::vector<RankResult>& ranks,
                          bool grads, std::string* mismatch);

// Per tensor max |a - b| / max(|b|) over the tensor; returns the worst tensor's
// value and name (and its max abs difference).
struct Diff {
  double rel = 0, abs = 0;
  std::string tensor;
};
Diff max_tensor_diff(const model::ParamTable& table, const std::vector<float>& a,
                     const std::vector<float>& b);

}  // namespace shardlab::parallel::testing
