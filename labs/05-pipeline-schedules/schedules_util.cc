// Lab 5 helpers (given): one micro-batch's forward or backward on one rank,
// with the transfers around it. Stage r receives its input from r-1 and
// sends its output to r+1; gradients flow the other way.
#include "labs/05-pipeline-schedules/schedules.h"

namespace shardlab::labs {

using K = parallel::ActionKind;

void add_forward(std::vector<parallel::Action>& out, int pp, int rank, int mb) {
  if (rank > 0) out.push_back({K::kRecvActivation, mb, 0, rank - 1});
  out.push_back({K::kForward, mb, 0, -1});
  if (rank < pp - 1) out.push_back({K::kSendActivation, mb, 0, rank + 1});
}

void add_backward(std::vector<parallel::Action>& out, int pp, int rank, int mb) {
  if (rank < pp - 1) out.push_back({K::kRecvGrad, mb, 0, rank + 1});
  out.push_back({K::kBackward, mb, 0, -1});
  if (rank > 0) out.push_back({K::kSendGrad, mb, 0, rank - 1});
}

}  // namespace shardlab::labs
