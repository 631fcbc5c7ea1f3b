// The parts of a TrainResult that the threads which ran did not write.
//
// A training run spread over several processes (runtime/transport.h): each
// process's device threads filled their own ranks' parts of the TrainResult
// (device_program.h: disjoint writes into zeroed storage, and per-device
// rows). share_train_result gives every process all of them, bit for bit,
// so what follows the run (unfolding, summaries, the report, --save) is the
// single-process run's. A no-op in a single process.
//
// A folded phantom run (model/engine/fold.h): unfold_results gives every
// folded rank its representative's per-device rows.
#pragma once

#include <cstdint>
#include <vector>

#include "model/engine/fold.h"
#include "model/train/trainer.h"

namespace shardlab::train {

// `owners[r]`: the process that ran device r (runtime::device_owners);
// `numel`: the model's parameters, the size of each final replica.
void share_train_result(TrainResult& r, const std::vector<int>& owners, int64_t numel);

// Copies every folded rank's per-device results from its representative,
// its MoE layers' first held expert its own (its expert_rank of
// `o.parallel`): a folded ep rank holds other experts.
void unfold_results(const engine::FoldPlan& plan, const collectives::DeviceMesh& mesh,
                    const TrainOptions& o, TrainResult& result);

}  // namespace shardlab::train
