// Building blocks of the schedule builders (schedule.cc, schedule_zb.cc): a
// compute action with its receive before and its send after, placed by the
// stage order. Not part of the public schedule API.
#pragma once

#include <vector>

#include "model/parallel/pipeline/schedule.h"

namespace shardlab::parallel {

// The forward of (mb, chunk) on `rank`: receive its input, run, send its output.
void add_forward(std::vector<Action>& out, StageOrder order, int pp, int vpp, int rank, int mb, int chunk);
// The backward (fused kBackward, or the B of a split one) of (mb, chunk):
// receive the output gradient, run, send the input gradient.
void add_backward(std::vector<Action>& out, StageOrder order, int pp, int vpp, int rank, int mb, int chunk,
                  ActionKind kind = ActionKind::kBackward);

}  // namespace shardlab::parallel
