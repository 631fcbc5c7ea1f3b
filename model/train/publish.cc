#include "model/train/publish.h"

#include <algorithm>
#include <mutex>

#include "model/engine/shard_io.h"
#include "runtime/errors.h"

namespace shardlab::train {

using parallel::ShardSpec;

void record_moe(const parallel::LocalModel& model, int step, std::vector<MoeLayerTotals>& out) {
  for (const parallel::MoeStepStats& m : model.moe_step_stats()) {
    if (m.layer < 0) continue;
    auto it = std::find_if(out.begin(), out.end(), [&](const MoeLayerTotals& t) { return t.layer == m.layer; });
    if (it == out.end()) {
      out.push_back(MoeLayerTotals{.layer = m.layer, .expert_begin = m.expert_begin, .per_step = {}});
      it = out.end() - 1;
    }
    // A resumed run starts past step 0: the steps it did not run route nothing here.
    it->per_step.resize(size_t(step) + 1, std::vector<int64_t>(m.received.size(), 0));
    it->per_step[size_t(step)] = m.received;
    it->dropped += m.dropped;
    it->a2a_sent_bytes += 2 * m.a2a_sent_bytes;  // backward moves the same rows again
    it->a2a_recv_bytes += 2 * m.a2a_recv_bytes;
    it->a2a_internode_sent_bytes += 2 * m.a2a_internode_sent_bytes;
  }
}

void publish_step0_grads(parallel::LocalModel& model, const parallel::DataParallel& dp,
                         const collectives::Coords& coords, const model::ParamTable& table,
                         TrainResult& result) {
  auto grads = model.grads();
  if (dp.sharded_grads()) {  // (cp ranks own chunks of their own: they write them)  // with ZeRO-2 each dp rank holds the reduced gradient of its own chunks only
    if (dp.replica_rank() != 0) return;  // HSDP: the first replica writes them
    engine::scatter_to_global(model, grads, coords, table, result.step0_grads, &dp.owned());
  } else if (coords.edp == 0 && coords.cp == 0) {  // cp ranks hold the same reduced gradients
    engine::scatter_to_global(model, grads, coords, table, result.step0_grads, nullptr,
                      coords.dp == 0 ? engine::kAll : engine::kExpertsOnly);
  }
}

void publish_params(parallel::LocalModel& model, const collectives::DeviceMesh& mesh, int rank,
                    const std::vector<int>& ep_members, TrainResult& result,
                    const model::ParamTable& table) {
  auto params = model.params();
  const collectives::Coords coords = mesh.coords(rank);
  // The first writer of a replica sizes it (zeros), under a lock: every rank
  // of a replica writes its own part of it.
  const auto sized = [&](size_t i) -> std::vector<float>& {
    static std::mutex mutex;
    const std::lock_guard lock(mutex);
    if (result.replicas[i].empty()) result.replicas[i].assign(size_t(table.numel()), 0.0f);
    return result.replicas[i];
  };
  // Replica d·cp + c: the cp ranks of a replica must hold the same parameters too.
  const int cp = mesh.shape().cp;
  auto replica = [&](const collectives::Coords& c) { return size_t(c.dp * cp + c.cp); };
  // Replica d is the model as dp rank d's ep group holds it: every member
  // writes its experts into each of the group's replicas.
  engine::scatter_to_global(model, params, coords, table, sized(replica(coords)), nullptr, engine::kAll);
  for (int peer : ep_members)
    if (peer != rank)
      engine::scatter_to_global(model, params, coords, table, sized(replica(mesh.coords(peer))), nullptr,
                                engine::kExpertsOnly);
  // Tensor parallelism: tp ranks 1.. of dp replica 0 pack their copies of
  // the tp-replicated tensors (TrainResult::tp_replicated's order), which
  // train() compares with tp rank 0's (a report, TrainResult::tp_drift).
  if (!result.tp_copies.empty() && coords.tp > 0 && coords.dp == 0 && coords.cp == 0) {
    std::vector<float>& packed = result.tp_copies[size_t(coords.tp)];
    const std::vector<Range>& ranges = result.tp_replicated;
    std::vector<int64_t> packed_at(1, 0);  // where each range's elements start in `packed`
    for (const Range& r : ranges) packed_at.push_back(packed_at.back() + r.size);
    for (const ShardSpec& s : model.shards()) {
      if (!s.tp_replicated || s.expert) continue;
      const int64_t begin = table.at(s.name).offset;  // whole: local is global
      const auto it = std::lower_bound(ranges.begin(), ranges.end(), begin,
                                       [](const Range& r, int64_t b) { return r.begin < b; });
      SHARDLAB_CHECK(it != ranges.end() && it->begin == begin && it->size == s.numel,
                     "a tp-replicated tensor not in the packed layout: " + s.name);
      std::copy_n(params.data() + s.offset, s.numel, packed.begin() + packed_at[size_t(it - ranges.begin())]);
    }
  }
  // The last stage's tied copy, compared with the first stage's by train().
  const int pp = mesh.shape().pp;
  if (!result.tied_copy.empty() && coords.pp == pp - 1 && coords.dp == 0 && coords.cp == 0) {
    for (const ShardSpec& s : model.shards())
      if (s.role == model::ParamRole::kTokenEmbedding)
        for (int64_t i = 0; i < s.numel; ++i)
          result.tied_copy[size_t(parallel::global_index(s, i))] = params[size_t(s.offset + i)];
  }
}

}  // namespace shardlab::train
