// verify: does a sharded run match the unsharded one, number by number?
//
// Compares the loss of every step, and after the last step every parameter
// gathered from its shards (optionally the step-0 gradients too), against the
// unsharded reference trained from the same seed and batches.
//
// The tolerance of a long run comes from a measured noise floor: fp32 sums
// taken in another order round differently, and training amplifies that
// drift step by step (AdamW divides each gradient by its own RMS), so a
// correct sharded run drifts from the reference more the longer it trains.
// The floor is the drift between two unsharded runs that differ only in the
// order of their reductions (the global batch split into another number of
// micro-batches, or, for MoE's per-micro-batch balancing loss, every
// micro-batch's sequences reversed), over the same steps (NoiseFloor).
// MoE routing can flip on rounding (RoutingDivergence): runs are then
// compared up to the flip.
#pragma once

#include <algorithm>
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "model/params.h"
#include "model/train/trainer.h"

namespace shardlab::train {

inline constexpr double kDefaultTolerance = 1e-5;
// A sharded run reorders more sums than a micro-batch split does (tp splits
// the matmuls' inner sums, cp the softmax, dp and ZeRO the gradient sums), so
// its drift is a few times the floor's (measured: dp alone 1.0x, tp 2 or
// cp 2 alone 2.4x, tp 2 x cp 2 x dp 2 with ZeRO-3 and sp 7.1x over 150 steps
// of tiny), while a real error of 1e-4 in one shard drifts ~100x the floor:
// the tolerance is an order of magnitude above the floor.
inline constexpr double kFloorFactor = 10;
// A floor run whose GEMMs also split their sums over K (NoiseFloor::split_sums,
// for tp and cp) perturbs the per-token sums as the sharded run does, so
// the sharded drift is about the floor's: measured over 7 configs x 6 seeds
// of tiny, tiny-moe and llama-family tiny at tp 2 or 4, sp, cp 2 and
// tp 2 x cp 2 x dp 2 with ZeRO-3 (100 steps or up to a routing flip), the
// sharded run's parameter drift was 0.18 to 1.57 x the floor (tiny-moe once
// 2.39, its floor measured over fewer steps than compared). The factor
// leaves 1.7x above that; a relative error of 1e-4 in one shard of ln_f or
// c_fc still fails by 10x or more (tests/cli/cli_verify_floor_test.cc).
inline constexpr double kSplitFloorFactor = 4;
inline constexpr double floor_factor_for(bool split_sums) { return split_sums ? kSplitFloorFactor : kFloorFactor; }

// The drift between the unsharded reference (micro_batches M) and the same
// run with the global batch split into `resplit` micro-batches: only the
// order of the gradient sums differs. MoE with a load-balancing loss (per
// micro-batch, so a split changes it) reverses the sequences of every
// micro-batch instead (`reversed`, TrainOptions::reverse_rows: M and the
// micro-batches' tokens stay). Not measured (measured false, `note` says
// why) when neither changes only the order: a batch of one sequence (with
// a balancing loss, micro-batches of one sequence), or an expert capacity
// (which tokens overflow depends on their order).
struct NoiseFloor {
  bool measured = false;
  bool reversed = false;
  bool split_sums = false;  // the floor run's GEMMs sum K in two halves (FloorRun)
  int micro_batches = 1, resplit = 0;
  double loss = 0;   // max per-step relative loss difference
  double param = 0;  // relative L2 difference of the final parameter vector
  int steps = 0;     // over how many steps (fewer than compared when the floor run's routing diverged first)
  std::string note;  // why it was not measured
};

// Tolerances. Parameters (and gradients) are compared as one vector over the
// whole model: ||sharded - reference|| / ||reference|| <= tol_param. Single
// tensors are not held to it one by one: AdamW divides each gradient by its
// own RMS, so tensors whose true gradient is ~0 (the key bias of attention,
// rare tokens' embeddings) turn fp32 reduction noise into relative noise of
// 1e-4 on values near zero, in PyTorch as here. A tensor is named as the
// mismatch when its own difference alone exceeds tol * ||reference||.
// How far apart AdamW's flips (below) leave an element: at least `min`, at
// most `max`.
struct FlipBounds {
  double min = 0, max = 0;
};

struct VerifyOptions {
  double tol_loss = kDefaultTolerance;   // per-step relative loss difference
  double tol_param = kDefaultTolerance;  // relative L2 difference of the whole parameter vector
  bool grads = false;                    // also compare the step-0 gradients
  // The step-0 gradients have not drifted: they keep the base tolerance.
  double tol_grad = kDefaultTolerance;   // relative L2 difference of the whole step-0 gradient vector
  // Where the tolerances came from (for the report): the floor, its factor,
  // and whether the user gave tol_loss / tol_param (those win).
  NoiseFloor floor;
  double floor_factor = kFloorFactor;
  bool user_tol_loss = false, user_tol_param = false;
  FlipBounds flips;  // adam_flip_bounds; max 0 sets nothing aside
};

// AdamW steps an element by at most lr x max(1, (1 - beta1) / sqrt(1 - beta2))
// (Kingma & Ba 2015, sec. 2.1), whatever its gradient's size, so where a
// gradient is at rounding level its sign is the rounding's and two correct
// runs can step that element apart by twice that, step after step: tiny-moe
// at tp 2, 8 steps, had one embedding element 1.7e-3 apart (lr 1e-3) and
// the other 1.1M within rel L2 2.3e-6, while reordered sums alone move an
// element by far less than a step (tiny at tp 2 x dp 2, 5 steps: 2.9e-5 at
// most). Up to flip_limit(n) of the n parameters, each apart by at least a
// tenth of the largest lr and at most twice the bound summed over the
// steps compared (adam_flip_bounds of the reference run), are set aside as
// such flips (VerifyResult::flips): listed, kept in param_rel_l2, and left
// out of param_rel_l2_held, which tol_param holds. A bug that moves more
// elements than that, or any one further, still fails; one that shows only
// in so few elements does not.
inline constexpr double kFlipShare = 1e-5;
inline size_t flip_limit(size_t params) { return std::max<size_t>(1, size_t(double(params) * kFlipShare)); }
FlipBounds adam_flip_bounds(const TrainResult& run, const model::AdamWHyper& adam);

struct ParamFlip {
  std::string name;   // the tensor
  int64_t index = 0;  // flat index inside it
  double abs_diff = 0;
};

struct TensorDiff {
  std::string name;
  int layer = -1;
  double max_abs = 0;   // max |sharded - reference|
  int64_t argmax = 0;   // flat index of that element inside the tensor
  double rel_l2 = 0;    // ||sharded - reference|| / ||reference|| of this tensor
  double diff_l2 = 0;   // ||sharded - reference||
  double ref_l2 = 0;    // ||reference||
};

struct Mismatch {
  std::string kind;  // "loss", "grad", "param", "replica" (dp copies differ) or "routing" (at step 0)
  std::string name;  // tensor name (grad/param)
  int layer = -1;
  int step = -1;     // loss
  double value = 0;  // the relative difference that broke the tolerance
  double max_abs = 0;
};

// MoE routing is discontinuous: a router's top-k choice between two experts
// whose scores nearly tie flips on a difference of one fp32 rounding, and
// the runs then send that token through other experts. Their losses and
// parameters part by far more than the drift of sums taken in another order,
// though neither run is wrong. The first step whose tokens per expert differ
// in any MoE block (TrainResult::moe_layers; a swap of two tokens between
// the same two experts leaves the counts equal and shows in the loss).
struct RoutingDivergence {
  int step = -1;
  int layer = -1;
  std::vector<int64_t> sharded, reference;  // that block's tokens per expert at that step
};
std::optional<RoutingDivergence> routing_divergence(const TrainResult& sharded, const TrainResult& reference);

struct VerifyResult {
  bool passed = true;
  VerifyOptions options;  // the tolerances applied
  std::vector<double> sharded_loss, reference_loss, loss_rel_diff;  // (steps)
  double max_loss_rel_diff = 0;
  std::vector<TensorDiff> params, grads;
  double max_param_abs_diff = 0;
  double param_rel_l2 = 0;  // whole parameter vector
  // The same without `flips`, the elements set aside as AdamW flips
  // (VerifyOptions::flips): what tol_param holds.
  double param_rel_l2_held = 0;
  std::vector<ParamFlip> flips;  // largest difference first
  size_t flip_limit = 0;         // how many could be set aside (flip_limit; 0 without bounds)
  double grad_rel_l2 = 0;   // whole step-0 gradient vector, with grads
  std::optional<Mismatch> first_mismatch;
  // Tensor parallelism: whether every tp rank's copy of the tp-replicated
  // tensors is tp rank 0's (TrainResult::tp_drift; a report, not a check).
  bool tp_replicas = false;    // the run had tp > 1 and tp-replicated tensors (compared)
  std::string tp_drift;        // the first tensor that differs, or empty
  double tp_drift_max = 0;
  // Set when the routing diverged (verify then compares both runs re-run to
  // that step; `routing.step` 0 leaves nothing to compare and fails).
  std::optional<RoutingDivergence> routing;
  // Set when the noise floor's run diverged from the reference's routing
  // within the steps compared (its drift, the floor, includes that route).
  std::optional<RoutingDivergence> floor_routing;
};

// The floor run for `reference` (the unsharded run): its micro-batch count,
// 1 when the reference has several, else the smallest divisor of the batch
// above 1; or, with a balancing loss, the reference's count with `reversed`
// rows. `split_sums` (the sharded run splits per-token sums: tp or cp > 1):
// every GEMM of the floor run also sums its K in two halves
// (TrainOptions::split_sums), and where no split or reordering of the batch
// changes only the order, that alone is the floor run. micro_batches 0 when
// there is none (`note` says why).
struct FloorRun {
  int micro_batches = 0;
  bool reversed = false;
  bool split_sums = false;
};
FloorRun floor_run(const TrainOptions& reference, bool split_sums, std::string& note);

// The floor from the reference and the floor run (`run`).
// Its parameter drift is param_rel_l2_held under `flip_bound`.
NoiseFloor measure_floor(const TrainResult& reference, const TrainResult& resplit,
                         const model::ParamTable& table, int micro_batches, const FloorRun& run,
                         FlipBounds flips = {});

// The tolerances: tol_loss / tol_param when given (they win), else the larger
// of kDefaultTolerance and factor x the floor (the default alone when the
// floor was not measured). The step-0 gradients keep tol_param or the default.
VerifyOptions floor_options(const NoiseFloor& floor, double factor, std::optional<double> tol_loss,
                            std::optional<double> tol_param, bool grads);

// Compares two runs of the same model (table) under `options`.
VerifyResult compare_runs(const TrainResult& sharded, const TrainResult& reference,
                          const model::ParamTable& table, const VerifyOptions& options);

// passed, max_loss_rel_diff, max_param_abs_diff, param_rel_l2, first_mismatch,
// the tolerances and their noise floor, steps, params (and grads).
nlohmann::json verify_json(const VerifyResult& r);

}  // namespace shardlab::train
