// Folding: which ranks of a phantom run one thread can play for the others.
//
// In a phantom run (TrainOptions::phantom) ranks that are provably symmetric
// run the same program from the same state, so one thread, the
// representative, plays them all: its collectives over folded members are
// replayed on the link model as if they were there (collectives/folded.h),
// and the report gives every folded rank its representative's figures.
//
//   data parallelism is folded (every dp rank played by dp rank 0) when
//     ZeRO is off (ZeRO's owned chunks differ in size from rank to rank)
//     and there is no expert parallelism;
//   tensor parallelism is folded (every tp rank by tp rank 0) for dense
//     models (the MoE router and experts are left unfolded);
//   a dimension is folded only when its groups' links are uniform: all
//     members in one node, or each member on a node of its own.
//
// The replay checks symmetry at every folded collective (every folded
// member must end exactly where its representative ends) and fails
// otherwise, so folding never changes a reported figure.
#pragma once

#include <string>
#include <vector>

#include "model/train/trainer.h"
#include "runtime/profile.h"

namespace shardlab::train {

struct FoldPlan {
  bool dp = false, tp = false;
  std::vector<int> representative;  // (world) empty: nothing folded
  int running() const;              // ranks with a thread
  std::string describe() const;     // "dp 24 and tp 8 folded: 8 of 1536 devices run"
};

// The plan for `options` on `profile` (nodes from the profile); empty
// unless options.phantom && options.fold.
FoldPlan fold_plan(const TrainOptions& options, const HardwareProfile& profile);

// The next plan to try when `plan` met an asymmetric collective
// (FoldingError): without dp folding, then without any.
FoldPlan weaker(const FoldPlan& plan, const TrainOptions& options);

// Copies every folded rank's per-device results from its representative.
void unfold_results(const FoldPlan& plan, TrainResult& result);

}  // namespace shardlab::train
