#include "model/train/preflight.h"

#include <algorithm>

#include <fmt/format.h>
#include <unistd.h>

#include "collectives/mesh.h"
#include "model/parallel/layout.h"
#include "model/parallel/sharded_gpt.h"
#include "runtime/errors.h"
#include "runtime/units.h"

namespace shardlab::train {

namespace {

// Beyond this many blocks the per-rank layouts are not built (a lower bound is used).
constexpr int kMaxLaidOutLayers = 4096;

// Local parameters of the device at `c`.
int64_t local_params(const TrainOptions& o, const model::ParamTable& table, const collectives::Coords& c) {
  if (!runs_sharded(o)) return table.numel();
  const ParallelOptions& p = o.parallel;
  const parallel::StagePlacement place =
      parallel::StagePlacement{p.pp, p.vpp, c.pp, p.stage_layers}.resolved(o.model);
  const parallel::ShardLayout layout(o.model, p.tp, c.tp, parallel::rank_filter(o.model, place, p.ep, c.ep));
  return layout.numel();
}

}  // namespace

MemoryEstimate estimate_memory(const TrainOptions& o, int elem) {
  const ParallelOptions& p = o.parallel;
  const model::ParamTable table(o.model);
  const collectives::DeviceMesh mesh(p.mesh_shape());
  MemoryEstimate e;
  for (int rank = 0; rank < mesh.size(); ++rank) {
    const collectives::Coords c = mesh.coords(rank);
    const int64_t n = local_params(o, table, c);
    // ZeRO: at least 1/dp of each bucket is this rank's (the lower bound).
    const int64_t owned = p.zero >= 1 ? n / p.dp : n;
    e.host_bytes += uint64_t(n) * 8 + uint64_t(owned) * 8;  // fp32 params and grads, Adam m and v
    if (n <= e.local_params) continue;
    e.local_params = n;
    e.worst_rank = rank;
    e.params_bytes = uint64_t(n) * elem;
    e.grads_bytes = uint64_t(p.zero >= 2 ? n / p.dp : n) * elem;
    e.optimizer_bytes = uint64_t(owned) * (elem == 2 ? 12 : 8);  // moments (+ fp32 master weights for bf16)
  }
  e.device_bytes = e.params_bytes + e.grads_bytes + e.optimizer_bytes;
  e.host_bytes += uint64_t(p.dp + 1) * uint64_t(table.numel()) * 4;  // the gathered replicas and the result
  return e;
}

void check_memory(const TrainOptions& o, uint64_t capacity, int elem, uint64_t host_memory) {
  const uint64_t budget = host_memory / 10 * 8;
  const double total = model::count_params(o.model);
  MemoryEstimate e;
  if (o.model.n_layer <= kMaxLaidOutLayers) {
    e = estimate_memory(o, elem);
  } else {  // too many blocks to lay out every rank: a lower bound per device
    const ParallelOptions& p = o.parallel;
    const double n = total / (double(p.tp) * p.pp * (o.model.is_moe() ? p.ep : 1));
    e.local_params = int64_t(std::min(n, 9e18 / 16));
    e.params_bytes = e.grads_bytes = uint64_t(e.local_params) * elem;
    e.optimizer_bytes = uint64_t(e.local_params / (p.zero >= 1 ? p.dp : 1)) * (elem == 2 ? 12 : 8);
    e.device_bytes = e.params_bytes + e.grads_bytes + e.optimizer_bytes;
    e.host_bytes = uint64_t(std::min(16 * total, 1.8e19));  // every parameter once: weights, grads, Adam
  }
  if (e.device_bytes > capacity) {
    const collectives::DeviceMesh mesh(o.parallel.mesh_shape());
    throw ConfigError(fmt::format(
        "device {} ({}): out of memory before any activation: parameters {}, gradients {} and optimizer "
        "state {} need {}, more than its capacity {}",
        e.worst_rank, mesh.describe(e.worst_rank), format_bytes(e.params_bytes), format_bytes(e.grads_bytes),
        format_bytes(e.optimizer_bytes), format_bytes(e.device_bytes), format_bytes(capacity)));
  }
  if (!o.phantom && e.host_bytes > budget) {  // a phantom run holds no parameter on the host
    throw ConfigError(fmt::format(
        "a real run of this model needs at least {} of host memory for the parameters, gradients and optimizer "
        "state of its {} devices (activations come on top), and this machine has {}: use a smaller model, "
        "or --phantom to time it without the math",
        format_bytes(e.host_bytes), o.parallel.world(), format_bytes(host_memory)));
  }
}

uint64_t host_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && size > 0 ? uint64_t(pages) * uint64_t(size) : UINT64_MAX;
}

}  // namespace shardlab::train
