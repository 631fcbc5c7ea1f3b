#include "model/train/result_rows.h"

#include <algorithm>

#include "model/engine/share_result.h"
#include "model/train/parallel_plan.h"
#include "runtime/transport.h"
#include "runtime/wire.h"

namespace shardlab::train {
namespace {

void put_moe(wire::Writer& w, const std::vector<MoeLayerTotals>& layers) {
  w.put<uint64_t>(layers.size());
  for (const MoeLayerTotals& m : layers) {
    w.put<int32_t>(m.layer).put<int32_t>(m.expert_begin).put(m.dropped).put(m.a2a_sent_bytes).put(m.a2a_recv_bytes);
    w.put(m.a2a_internode_sent_bytes);
    w.put<uint64_t>(m.per_step.size());
    for (const auto& step : m.per_step) w.put_vector(step);
  }
}

std::vector<MoeLayerTotals> get_moe(wire::Reader& r) {
  std::vector<MoeLayerTotals> layers(r.get<uint64_t>());
  for (MoeLayerTotals& m : layers) {
    m.layer = r.get<int32_t>();
    m.expert_begin = r.get<int32_t>();
    m.dropped = r.get<int64_t>();
    m.a2a_sent_bytes = r.get<uint64_t>();
    m.a2a_recv_bytes = r.get<uint64_t>();
    m.a2a_internode_sent_bytes = r.get<uint64_t>();
    m.per_step.resize(r.get<uint64_t>());
    for (auto& step : m.per_step) step = r.get_vector<int64_t>();
  }
  return layers;
}

}  // namespace

void share_train_result(TrainResult& r, const std::vector<int>& owners, int64_t numel) {
  if (!process_transport()) return;
  engine::share_device_rows(
      owners,
      [&](wire::Writer& w, size_t d) {
        w.put_vector(r.phases[d]).put_vector(r.first_step_spans[d]);
        put_moe(w, r.moe[d]);
      },
      [&](wire::Reader& in, size_t d) {
        r.phases[d] = in.get_vector<PhaseRecord>();
        r.first_step_spans[d] = in.get_vector<parallel::ComputeSpan>();
        r.moe[d] = get_moe(in);
      });
  // Element-wise disjoint writes (or equal values) into zeroed buffers. A
  // replica is sized by its first local writer (publish.cc), so one that no
  // device of this process wrote (or every replica, in a process that ran no
  // device) is still empty here: every process sizes it before the merge.
  for (auto& replica : r.replicas) {
    if (replica.empty()) replica.assign(size_t(numel), 0.0f);
    merge_disjoint(replica);
  }
  merge_disjoint(r.step0_grads);
  merge_disjoint(r.tied_copy);
  for (auto& packed : r.tp_copies) merge_disjoint(packed);
  merge_disjoint(r.a2a_time);
  merge_disjoint(r.fsdp);
  merge_disjoint(r.param_gather);
  merge_disjoint(r.cp);
  // Device 0 (the leader's) wrote the step records and the loop's wall time.
  engine::share_from_process(
      0, [&](wire::Writer& w) { w.put_vector(r.steps).put(r.loop_wall_s); },
      [&](wire::Reader& in) {
        r.steps = in.get_vector<StepRecord>();
        r.loop_wall_s = in.get<double>();
      });
}

void unfold_results(const engine::FoldPlan& plan, const collectives::DeviceMesh& mesh,
                    const TrainOptions& o, TrainResult& r) {
  const int per_rank = o.model.n_expert / std::max(1, o.parallel.ep);
  for (size_t rank = 0; rank < plan.representative.size(); ++rank) {
    const auto rep = size_t(plan.representative[rank]);
    if (rep == rank) continue;
    r.phases[rank] = r.phases[rep];
    r.moe[rank] = r.moe[rep];
    for (MoeLayerTotals& t : r.moe[rank])
      t.expert_begin = expert_rank(o.parallel, mesh.coords(int(rank))) * per_rank;
    r.a2a_time[rank] = r.a2a_time[rep];
    r.first_step_spans[rank] = r.first_step_spans[rep];
    if (!r.fsdp.empty()) r.fsdp[rank] = r.fsdp[rep];
    if (!r.param_gather.empty()) r.param_gather[rank] = r.param_gather[rep];
    if (!r.cp.empty()) r.cp[rank] = r.cp[rep];
  }
}

}  // namespace shardlab::train
