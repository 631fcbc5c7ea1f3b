#include "model/train/preflight.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>

#include "collectives/mesh.h"
#include "model/parallel/data/buckets.h"
#include "model/parallel/data/data_parallel.h"
#include "model/parallel/data/fsdp.h"
#include "model/parallel/layout.h"
#include "model/parallel/sharded_gpt.h"
#include "model/parallel/unsharded_model.h"
#include "runtime/errors.h"
#include "runtime/units.h"

namespace shardlab::train {

namespace {

// Beyond this many blocks the per-rank layouts are not built (a lower bound is used).
constexpr int kMaxLaidOutLayers = 4096;
constexpr uint64_t kMasterBytes = 4, kMomentBytes = 8;  // fp32 master weights; Adam m and v

// The local tensors of the device at `c`, as DeviceSetup's model holds them.
std::vector<parallel::ShardSpec> local_shards(const TrainOptions& o, const ParallelPlan& plan,
                                              const model::ParamTable& table, const collectives::Coords& c) {
  if (!plan.sharded) return parallel::whole_tensor_shards(table);
  const ParallelOptions& p = o.parallel;
  const parallel::StagePlacement place = plan.placement(c.pp);
  const parallel::ShardLayout layout(
      table, o.model, p.tp, c.tp,
      parallel::rank_filter(o.model, place, p.ep, expert_rank(p, c), p.experts_whole()));
  return layout.shards();
}

// The buckets DataParallel plans for `shards` of pipeline rank `pp_rank`
// (ZeRO-3: Fsdp's, one per unit of `units`; chunk_buckets: one per model chunk).
parallel::BucketPlan bucket_plan(const TrainOptions& o, const ParallelPlan& layout,
                                 const std::vector<parallel::ShardSpec>& shards,
                                 const std::vector<parallel::FsdpUnit>& units, int pp_rank) {
  const ParallelOptions& p = o.parallel;
  const std::vector<Range> experts = p.ep > 1 ? parallel::expert_ranges(shards) : std::vector<Range>{};
  if (p.zero == 3) return parallel::fsdp_bucket_plan(units, experts);
  if (p.chunk_buckets)
    return parallel::chunk_bucket_plan(
        shards, [place = layout.placement(pp_rank)](const parallel::ShardSpec& s) { return model_chunk_of(place, s); },
        experts, layout.tied_bucket(shards));
  return parallel::plan_buckets(parallel::backward_ready_order(shards), experts, uint64_t(p.bucket_mb * 1e6),
                                parallel::kGradElemBytes, layout.tied_bucket(shards));
}

// The weights Transformer Engine keeps FP8 copies of (W and Wᵀ, 1 B each):
// the blocks' projections and MLPs, experts included (ShardedAdamW's
// fp8_weights_, train/optimizer_step.cc).
// What device_memory reads of one (tp, pp, ep) layout, the same on every dp rank of it.
struct LayoutBuckets {
  std::vector<parallel::ShardSpec> shards;
  std::vector<parallel::FsdpUnit> units;
  parallel::BucketPlan plan;
  int edp_size = 1;  // the expert buckets' sharding group
};

// A main gradient's bytes (DataParallel::grad_bytes): bf16 with
// grad_reduce_bf16 in mixed precision, else fp32.
uint64_t grad_bytes(const ParallelOptions& p, int elem) {
  return p.grad_reduce_bf16 && elem < 4 ? 2 : parallel::kGradElemBytes;
}

// The bytes of each kind device `rank` holds: DataParallel's bucket plan and
// ownership, DeviceSetup's and ShardedAdamW's buffers.
DeviceMemory device_memory(const TrainOptions& o, const ParallelPlan& layout, int rank, const LayoutBuckets& lb,
                           int elem, bool fp8) {
  const ParallelOptions& p = o.parallel;
  const collectives::DeviceMesh& mesh = layout.mesh;
  const std::vector<parallel::ShardSpec>& shards = lb.shards;
  const std::vector<parallel::FsdpUnit>& units = lb.units;
  const parallel::BucketPlan& plan = lb.plan;
  int64_t n = 0;
  for (const parallel::ShardSpec& s : shards) n += s.numel;
  const std::string_view dp = p.cp > 1 ? "cp-dp" : "dp", edp = p.cp > 1 ? "cp-edp" : "edp";
  const int edp_size = lb.edp_size;
  // HSDP shards over groups of shard_size() consecutive dp ranks.
  const int64_t owned = parallel::owned_elements(plan, p.zero, p.shard_size(), mesh.group_index(rank, dp) % p.shard_size(),
                                                 edp_size, mesh.group_index(rank, edp));
  // ZeRO-1/2 pad every bucket (buckets.h, padded_bucket): the buffers hold the padding.
  const parallel::PaddedSizes padded = parallel::padded_sizes(plan, p.zero, p.shard_size(), edp_size);
  DeviceMemory m;
  m.params = n;
  m.params_bytes = uint64_t(padded.total) * uint64_t(elem);
  if (p.zero == 3) {  // the shards, plus the units gathered at once (fsdp.h)
    const auto chunks = parallel::hook_chunks(layout.placement(mesh.coords(rank).pp));
    const parallel::FsdpPasses passes =
        parallel::fsdp_passes(chunks, units, shards, o.model.n_layer);
    const parallel::FsdpOptions fo{p.reshard_after_forward, p.prefetch};
    m.params_bytes = uint64_t(owned + parallel::fsdp_peak_gathered(passes, units, fo)) * uint64_t(elem);
  }
  if (fp8) m.params_bytes += uint64_t(parallel::fp8_weight_elements(shards)) * uint64_t(element_size(Precision::kFp8));
  m.grads_bytes =
      uint64_t(parallel::held_grad_elements(padded.total, owned, padded.largest, p.zero)) * grad_bytes(p, elem);
  m.master_bytes = elem == 2 ? uint64_t(owned) * kMasterBytes : 0;
  m.optimizer_bytes = uint64_t(owned) * kMomentBytes;
  return m;
}

// Too many blocks to lay out every rank: a lower bound for one device.
MemoryEstimate lower_bound(const TrainOptions& o, int elem) {
  const ParallelOptions& p = o.parallel;
  const double total = model::count_params(o.model);
  const double n = total / (double(p.tp) * p.pp * (o.model.is_moe() ? p.ep : 1));
  MemoryEstimate e;
  DeviceMemory& m = e.worst;
  m.params = int64_t(std::min(n, 9e18 / 18));
  const auto owned = uint64_t(m.params / (p.zero >= 1 ? p.shard_size() : 1));
  m.params_bytes = (p.zero == 3 ? owned : uint64_t(m.params)) * uint64_t(elem);
  m.grads_bytes = (p.zero >= 2 ? owned : uint64_t(m.params)) * grad_bytes(p, elem);
  m.master_bytes = elem == 2 ? owned * kMasterBytes : 0;
  m.optimizer_bytes = owned * kMomentBytes;
  e.host_bytes =
      uint64_t(std::min(16 * total, 1.8e19));  // every parameter once: weights, grads, Adam
  return e;
}

}  // namespace

ActivationFloor activation_floor(const TrainOptions& o, const ParallelPlan& plan) {
  const ParallelOptions& p = o.parallel;
  const model::GPTConfig& m = o.model;
  const double rows = double(m.batch_size) / (double(o.micro_batches) * p.dp);  // one micro-batch, one replica
  const double T = double(m.block_size) / p.cp, N = rows * T;  // this cp rank's tokens
  // (b, H/tp, T, T) of one block, or its log-sum-exp rows (b, H/tp, T/cp) under
  // CP and with the fused kernel (the sharded model's; the host still computes
  // the probabilities, one block at a time)
  const bool lse = p.cp > 1 || (plan.sharded && parallel::fused_attention(p.attention, m.is_llama()));
  const double att = rows * (double(m.n_head) / p.tp) * T * (lse ? 1 : T);
  const double logits = N * double(m.vocab_size) / p.tp;         // (b, T, V/tp) on the last stage
  ActivationFloor f;
  if (!plan.sharded) {
    // The unsharded model (tp = pp = 1) sizes every block's buffers at once
    // (GPT::resize_activations) and saves them all: qkv, attention, logits and probabilities.
    const double blocks = double(m.n_layer) * (att + 3 * N * m.n_embd);
    f.device_elements = blocks + 2 * logits;
    f.host_elements = p.dp * (blocks + 3 * logits);
  } else {
    // The sharded model holds at least one block's attention probabilities
    // on every device and the logits on the last stage's.
    f.device_elements = std::max(att, logits);
    const double host_att = rows * (double(m.n_head) / p.tp) * T * (p.cp > 1 ? 1 : T);
    f.host_elements = double(plan.world) * host_att + double(plan.world / p.pp) * logits;
  }
  return f;
}

bool uneven_chunks(const TrainOptions& o, const ParallelPlan& plan) {
  const ParallelOptions& p = o.parallel;
  // ZeRO-1/2 pad every bucket to a multiple of its group (padded_bucket):
  // only ZeRO-3's units can leave chunks of unequal sizes.
  if (p.zero != 3 || p.shard_size() == 1) return false;
  const model::ParamTable table(o.model);
  // The sharding groups: dp (or its HSDP shards) for dense buckets, edp for expert ones.
  const auto dense = uint64_t(p.shard_size());
  const auto expert = uint64_t(plan.mesh.group_ranks(0, p.cp > 1 ? "cp-edp" : "edp").size());
  collectives::Coords c;
  for (c.pp = 0; c.pp < p.pp; ++c.pp)
    for (c.tp = 0; c.tp < p.tp; ++c.tp)
      for (c.ep = 0; c.ep < p.mesh_ep(); ++c.ep) {
        const std::vector<parallel::ShardSpec> shards = local_shards(o, plan, table, c);
        const parallel::BucketPlan b = bucket_plan(o, plan, shards, parallel::fsdp_units(shards, o.model.n_layer), c.pp);
        for (size_t i = 0; i < b.buckets.size(); ++i)
          if (uint64_t(b.buckets[i].size) % (b.expert[i] ? expert : dense) != 0) return true;
      }
  return false;
}

MemoryEstimate estimate_memory(const TrainOptions& o, const ParallelPlan& plan, int elem, bool fp8) {
  const ParallelOptions& p = o.parallel;
  const model::ParamTable table(o.model);
  const collectives::DeviceMesh& mesh = plan.mesh;
  std::map<std::tuple<int, int, int>, LayoutBuckets> layouts;  // by (tp, pp, ep)
  MemoryEstimate e;
  for (int rank = 0; rank < mesh.size(); ++rank) {
    const collectives::Coords c = mesh.coords(rank);
    auto [it, fresh] = layouts.try_emplace({c.tp, c.pp, c.ep});
    if (fresh) {
      LayoutBuckets& lb = it->second;
      lb.shards = local_shards(o, plan, table, c);
      lb.units = parallel::fsdp_units(lb.shards, o.model.n_layer);
      lb.plan = bucket_plan(o, plan, lb.shards, lb.units, c.pp);
      lb.edp_size = int(mesh.group_ranks(rank, p.cp > 1 ? "cp-edp" : "edp").size());
    }
    const DeviceMemory m = device_memory(o, plan, rank, it->second, elem, fp8);
    // Host: fp32 parameters and gradients, Adam m and v of the owned part.
    e.host_bytes += uint64_t(m.params) * 8 + m.optimizer_bytes;
    if (e.devices.empty() || m.total() > e.worst.total()) e.worst_rank = rank, e.worst = m;
    e.devices.push_back(m);
  }
  e.host_bytes +=
      uint64_t(p.data_ranks() + 1) * uint64_t(table.numel()) * 4;  // the gathered replicas and the result
  return e;
}

namespace {

// A real run sizes host buffers for its activations: refuse them here, not
// in the host allocator (std::bad_alloc) or in minutes of swapping.
void check_activations(const TrainOptions& o, const ParallelPlan& plan, const MemoryEstimate& e, uint64_t capacity,
                       int elem, uint64_t budget, uint64_t host_memory) {
  const DeviceMemory& w = e.worst;
  const ActivationFloor a = activation_floor(o, plan);
  const double device_need = double(w.total()) + a.device_elements * elem;
  if (device_need > double(capacity)) {
    throw ConfigError(fmt::format(
        "device {} ({}): out of memory: parameters, gradients and optimizer state need {} and the "
        "activations of one micro-batch at least {} (attention probabilities and logits), more than its capacity {}",
        e.worst_rank, plan.mesh.describe(e.worst_rank), format_bytes(w.total()),
        format_bytes(uint64_t(std::min(a.device_elements * elem, 1.8e19))), format_bytes(capacity)));
  }
  const double host_activations = a.host_elements * 4;  // the host computes in fp32
  if (double(e.host_bytes) + host_activations > double(budget)) {
    throw ConfigError(fmt::format(
        "a real run of this config needs at least {} of host memory for the activations of one micro-batch on "
        "its {} devices, on top of {} for the parameters, gradients and optimizer state, and this machine has {}: "
        "use a smaller batch, sequence or model, or `phantom` to time it without the math",
        format_bytes(uint64_t(std::min(host_activations, 1.8e19))), plan.world, format_bytes(e.host_bytes),
        format_bytes(host_memory)));
  }
}

}  // namespace

void check_memory(const TrainOptions& o, const ParallelPlan& plan, uint64_t capacity, int elem,
                  uint64_t host_memory, bool fp8) {
  const uint64_t budget = host_memory / 10 * 8;
  const MemoryEstimate e =
      o.model.n_layer <= kMaxLaidOutLayers ? estimate_memory(o, plan, elem, fp8) : lower_bound(o, elem);
  const DeviceMemory& w = e.worst;
  if (w.total() > capacity) {
    const std::string master =
        w.master_bytes > 0 ? fmt::format(", fp32 master weights {}", format_bytes(w.master_bytes))
                           : "";
    throw ConfigError(
        fmt::format("device {} ({}): out of memory before any activation: parameters {}, gradients "
                    "{}{} and optimizer "
                    "state {} need {}, more than its capacity {}",
                    e.worst_rank, plan.mesh.describe(e.worst_rank), format_bytes(w.params_bytes),
                    format_bytes(w.grads_bytes), master, format_bytes(w.optimizer_bytes),
                    format_bytes(w.total()), format_bytes(capacity)));
  }
  if (o.phantom) return;  // no host buffers; the arena models every activation as it is charged
  if (e.host_bytes > budget) {
    throw ConfigError(
        fmt::format("a real run of this model needs at least {} of host memory for the parameters, "
                    "gradients and optimizer state of its {} devices (activations come on top), and "
                    "this machine has {}: use a smaller model, or `phantom` to time it without the math",
                    format_bytes(e.host_bytes), plan.world, format_bytes(host_memory)));
  }
  check_activations(o, plan, e, capacity, elem, budget, host_memory);
}

}  // namespace shardlab::train
