// Helpers for the tensor-parallel tests: run ShardedGPT (one stage) on a cluster
// of tp devices, gather its shards back into unsharded flat buffers, and
// compare with GPT<float> from the same seed and batch.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "model/config.h"
#include "model/kernels.h"
#include "collectives/group.h"
#include "model/parallel/local_model.h"
#include "model/parallel/block.h"
#include "model/params.h"
#include "model/sink.h"
#include "runtime/device.h"
#include "runtime/profile.h"
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
  Time compute_busy = 0;  // compute stream busy time, transfers excluded
  int ep_rank = 0;
  std::vector<MoeStats> moe;  // (n_layer) what each MoE block did (empty for dense)
};

// Charges the device's compute stream, tracks activations and grads_ready,
// and averages MoE fractions over `dp` (as the trainer's sink does).
class RecordingSink final : public model::OpSink {
 public:
  RecordingSink(Device& dev, RankResult& r, const collectives::ProcessGroup& dp)
      : dev_(dev), r_(r), dp_(dp) {}
  void op(const char* name, const OpCost& cost) override;
  void saved(int64_t n) override;
  void freed(int64_t n) override { r_.live_activations -= n; }
  void grads_ready(int64_t offset, int64_t count) override {
    r_.grads_ready.emplace_back(offset, count);
  }
  bool average_over_replicas(float* data, int64_t n) override;

 private:
  Device& dev_;
  RankResult& r_;
  const collectives::ProcessGroup& dp_;
};

struct RunSpec {
  int tp = 1;
  bool sp = false;
  uint64_t seed = 1234;
  int dp = 1;         // data-parallel replicas: each takes B/dp rows; grads, loss and
                      // MoE fractions averaged over dp (as the trainer does)
  int ep = 1;         // expert parallel (divides dp): experts spread over ep ranks and
                      // gradients reduced by DataParallel (experts over edp, SUM / dp)
  bool global_routing = false;  // MoE f_i and capacity over the dp group (ModelGroups::capacity)
  int zero = 0;  // with ep > 1: DataParallel's ZeRO stage (gradients gathered back for the check)
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

// One NVLink node of `devices` A100s.
HardwareProfile test_profile(int devices);

// Runs ShardedGPT on tp·dp devices (one NVLink node). Returns the
// results of every rank, in rank order.
std::vector<RankResult> run_all(const model::GPTConfig& config, const Batch& batch,
                                const RunSpec& spec);
// The ranks that together hold every tensor once: dp coordinate 0 in TP
// order, and with EP the dp coordinates 0..ep-1 (ranks 0..tp·ep-1), those of
// ep coordinate > 0 listing only their expert shards.
std::vector<RankResult> run_tp(const model::GPTConfig& config, const Batch& batch,
                               const RunSpec& spec);
// run_tp's selection from run_all's results.
std::vector<RankResult> holding_ranks(std::vector<RankResult> all, const RunSpec& spec);

// Gathers a per-rank flat buffer (params or grads) into the unsharded layout.
// Checks every element is covered and that copies of replicated tensors agree
// bit for bit; the first disagreement is returned in `mismatch` (empty if none).
std::vector<float> gather(const model::ParamTable& table, const std::vector<RankResult>& ranks,
                          bool grads, std::string* mismatch);

// Per tensor max |a - b| / max(|b|) over the tensor; returns the worst tensor's
// value and name (and its max abs difference). A NaN or Inf in either side,
// or different sizes, gives rel = abs = +Inf and names the tensor.
struct Diff {
  double rel = 0, abs = 0;
  std::string tensor;
};
Diff max_tensor_diff(const model::ParamTable& table, const std::vector<float>& a,
                     const std::vector<float>& b);

// How many times grads_ready announced each local gradient element of `r`
// (empty if an announced range leaves the buffer).
std::vector<int> announce_counts(const RankResult& r);

// Runs `spec` (global_params replaced) and GPT<float> from spec.seed with
// parameters perturbed by randomize_params(99, 0.05) (nonzero biases: a bias
// added twice shows) on the same batch, and compares them. Also checks with
// EXPECTs that every rank's saved/freed activations balance and that
// grads_ready announces every local gradient element exactly once.
struct Match {
  std::vector<RankResult> all;      // every rank, in rank order
  std::vector<RankResult> holders;  // holding_ranks(all)
  float ref_loss = 0, ref_aux = 0;
  double loss_rel = 0;   // worst rank's |loss - ref| / |ref| (+Inf for a NaN / Inf loss)
  Diff grad;             // gathered gradients against the reference's
  std::string mismatch;  // gather's replicated-copy check
};
Match match_reference(const model::GPTConfig& config, const Batch& batch, RunSpec spec);

}  // namespace shardlab::parallel::testing
