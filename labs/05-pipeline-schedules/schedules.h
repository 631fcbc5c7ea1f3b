// Lab 5: the two schedules you write (schedules.cc in this folder), as data:
// for every pipeline rank the ordered list of actions its executor runs
// (model/parallel/pipeline/schedule.h: Action, Schedule).
#pragma once

#include <vector>

#include "model/parallel/pipeline/schedule.h"

namespace shardlab::labs {

// All forwards of micro-batches 0..M-1, then all backwards 0..M-1, on every rank.
parallel::Schedule lab_gpipe(int pp, int micro_batches);
// Megatron's 1F1B: on rank r a warm-up of min(pp - r - 1, M) forwards, then
// one forward and one backward at a time, then the remaining backwards.
parallel::Schedule lab_one_f_one_b(int pp, int micro_batches);

// Helpers (schedules_util.cc): the forward (backward) of micro-batch mb on
// `rank` with its receive right before it and its send right after it.
void add_forward(std::vector<parallel::Action>& out, int pp, int rank, int mb);
void add_backward(std::vector<parallel::Action>& out, int pp, int rank, int mb);

}  // namespace shardlab::labs
