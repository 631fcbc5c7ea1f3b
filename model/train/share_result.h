// A training run spread over several processes (runtime/transport.h): each
// process's device threads filled their own ranks' parts of the TrainResult
// (device_program.h: disjoint writes into zeroed storage, and per-device
// rows). share_train_result gives every process all of them, bit for bit,
// so what follows the run (unfolding, summaries, the report, --save) is the
// single-process run's. A no-op in a single process.
#pragma once

#include <vector>

#include "model/train/trainer.h"

namespace shardlab::train {

// `owners[r]`: the process that ran device r (runtime::device_owners).
void share_train_result(TrainResult& r, const std::vector<int>& owners);

}  // namespace shardlab::train
