// Lab 5 exercise: GPipe and 1F1B as schedules-as-data.
// Fill in the TODOs, then run `make lab-5`. README.md explains both schedules.
#include "labs/05-pipeline-schedules/schedules.h"

namespace shardlab::labs {

parallel::Schedule lab_gpipe(int pp, int micro_batches) {
  parallel::Schedule schedule(static_cast<size_t>(pp));
  for (int rank = 0; rank < pp; ++rank) {
    std::vector<parallel::Action>& out = schedule[static_cast<size_t>(rank)];
    (void)out;
    // TODO: every forward (add_forward(out, pp, rank, mb)), then every backward.
  }
  return schedule;
}

parallel::Schedule lab_one_f_one_b(int pp, int micro_batches) {
  parallel::Schedule schedule(static_cast<size_t>(pp));
  for (int rank = 0; rank < pp; ++rank) {
    std::vector<parallel::Action>& out = schedule[static_cast<size_t>(rank)];
    (void)out;
    // TODO warm-up: the first min(pp - rank - 1, micro_batches) forwards.
    // TODO steady state: for each remaining micro-batch, its forward, then
    //      the backward of the oldest micro-batch not yet done.
    // TODO cool-down: the backwards still left, oldest first.
  }
  return schedule;
}

}  // namespace shardlab::labs
