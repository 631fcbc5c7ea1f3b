// Lab 5 reference solution: GPipe and 1F1B as schedules-as-data.
#include "labs/05-pipeline-schedules/schedules.h"

#include <algorithm>

namespace shardlab::labs {

parallel::Schedule lab_gpipe(int pp, int micro_batches) {
  parallel::Schedule schedule(static_cast<size_t>(pp));
  for (int rank = 0; rank < pp; ++rank) {
    std::vector<parallel::Action>& out = schedule[static_cast<size_t>(rank)];
    for (int mb = 0; mb < micro_batches; ++mb) add_forward(out, pp, rank, mb);
    for (int mb = 0; mb < micro_batches; ++mb) add_backward(out, pp, rank, mb);
  }
  return schedule;
}

parallel::Schedule lab_one_f_one_b(int pp, int micro_batches) {
  parallel::Schedule schedule(static_cast<size_t>(pp));
  for (int rank = 0; rank < pp; ++rank) {
    std::vector<parallel::Action>& out = schedule[static_cast<size_t>(rank)];
    const int warmup = std::min(pp - rank - 1, micro_batches);
    int forwards = 0, backwards = 0;
    while (forwards < warmup) add_forward(out, pp, rank, forwards++);
    while (forwards < micro_batches) {  // steady: one forward, one backward
      add_forward(out, pp, rank, forwards++);
      add_backward(out, pp, rank, backwards++);
    }
    while (backwards < micro_batches) add_backward(out, pp, rank, backwards++);  // cool-down
  }
  return schedule;
}

}  // namespace shardlab::labs
