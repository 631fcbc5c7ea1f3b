// The token exchange both expert-parallel dispatchers share (ep_dispatch.cc,
// ep_node_dispatch.cc): counts, rows and the expert-major order of the rows
// a rank's experts receive from the peers of one group.
// Thread safety: called from the device's own thread, like the collectives.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "collectives/group.h"
#include "model/parallel/expert/moe.h"

namespace shardlab::parallel {

// x.send_rows[j·El + le] holds the rows this rank sends to group rank j's
// local expert le; one all-to-all of those counts over g (traced as `name`)
// gives x.recv_rows, the element counts of the row exchanges (C floats a row)
// and, in real math, x.perm: expert-major row -> received row (expert le's
// rows from peer 0, then peer 1, ... each peer's in its order); x.offsets,
// x.R and stats.received for the El local experts.
void plan_rows(TpMoeActs::Ep& x, MoeStats& stats, const collectives::ProcessGroup& g, int El, int C,
               std::vector<size_t>& send_elems, std::vector<size_t>& recv_elems, const char* name,
               const ExpertContext& c);
// out (sum rc) = all_to_all_v of in over g on the compute stream (or
// c.a2a_stream), traced as `name`; counts the off-rank bytes into stats (if
// any). `meanwhile` (if set) charges its compute right after the exchange is
// posted, before the compute stream waits for it.
void exchange_rows(const ExpertContext& c, const collectives::ProcessGroup& g, const char* name, const float* in,
                   const std::vector<size_t>& sc, float* out, const std::vector<size_t>& rc, MoeStats* stats,
                   const std::function<void()>& meanwhile = {});
// The experts' weight gradients that c.delayed_wgrad holds, run now (an
// exchange's `meanwhile`); nothing without it.
void run_delayed_wgrad(const ExpertContext& c);
// Where a backward records the experts' weight gradients: c.delayed_wgrad,
// or `wg` (at once, or the schedule's own W).
inline WeightGrads& experts_wgrad(const ExpertContext& c, WeightGrads& wg) {
  return c.delayed_wgrad ? *c.delayed_wgrad : wg;
}
// to_expert_major: dst[m] = src[perm[m]]; otherwise dst[perm[m]] = src[m].
void permute_rows(float* dst, const float* src, const int64_t* perm, int64_t R, int C, bool to_expert_major,
                  const char* name, const model::Exec& ex);

}  // namespace shardlab::parallel
