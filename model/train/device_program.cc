#include "model/train/device_program.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <optional>

#include <fmt/format.h>

#include "collectives/collectives.h"
#include "model/optimizer.h"
#include "model/parallel/data_parallel.h"
#include "model/parallel/pipeline.h"
#include "model/parallel/tp_layout.h"
#include "model/parallel/unsharded_model.h"
#include "model/train/device_sink.h"
#include "runtime/errors.h"

namespace shardlab::train {

namespace coll = collectives;
using parallel::DataParallel;
using parallel::LocalModel;
using parallel::ShardSpec;

namespace {
constexpr const char* kTiedName = "transformer.wte.weight";  // embedding and head (pipeline: two copies)
}  // namespace

void scatter_to_global(const LocalModel& model, std::span<const float> local,
                       const collectives::Coords& coords, const model::ParamTable& table,
                       std::span<float> global, const std::vector<LocalRange>* only, ScatterWhat what) {
  for (const ShardSpec& s : model.shards()) {
    if (what == kExpertsOnly && s.name.find(".mlp.experts.") == std::string::npos) continue;
    if (s.tp_replicated && coords.tp != 0) continue;
    if (coords.pp != 0 && s.name == kTiedName) continue;  // the first stage writes the tied wte
    const int64_t base = table.at(s.name).offset;
    for (int64_t i = 0; i < s.numel; ++i) {
      const int64_t at = s.offset + i;
      if (only && std::none_of(only->begin(), only->end(),
                               [at](const LocalRange& r) { return at >= r.begin && at < r.begin + r.size; }))
        continue;
      global[size_t(base + parallel::global_index(s, i))] = local[size_t(at)];
    }
  }
}

namespace {

// Fills the local shards from an unsharded checkpoint.
void load_shards(LocalModel& model, const model::SafetensorsFile& f) {
  auto params = model.params();
  for (const ShardSpec& s : model.shards()) {
    auto src = f.get(s.name, s.global_shape);
    for (int64_t i = 0; i < s.numel; ++i) params[size_t(s.offset + i)] = src[size_t(parallel::global_index(s, i))];
  }
}

// Perturbs the named shard (verify's can-it-fail test).
void corrupt(LocalModel& model, const std::string& name) {
  auto params = model.params();
  for (const ShardSpec& s : model.shards()) {
    if (s.name != name) continue;
    for (int64_t i = 0; i < s.numel; ++i) params[size_t(s.offset + i)] += 1e-2f * (1 + std::abs(params[size_t(s.offset + i)]));
    return;
  }
  throw ConfigError(fmt::format("corrupt-shard: no parameter \"{}\"", name));
}

// Adds this step's MoE block statistics to the device's record.
void record_moe(const LocalModel& model, int step, std::vector<MoeLayerTotals>& out) {
  for (const parallel::MoeStepStats& m : model.moe_step_stats()) {
    if (m.layer < 0) continue;
    auto it = std::find_if(out.begin(), out.end(), [&](const MoeLayerTotals& t) { return t.layer == m.layer; });
    if (it == out.end()) {
      out.push_back({m.layer, m.expert_begin, std::vector<int64_t>(m.received.size(), 0)});
      it = out.end() - 1;
    }
    for (size_t e = 0; e < m.received.size(); ++e) it->received[e] += m.received[e];
    it->per_step.resize(size_t(step) + 1);
    it->per_step[size_t(step)] = m.received;
    it->dropped += m.dropped;
    it->a2a_sent_bytes += 2 * m.a2a_sent_bytes;  // backward moves the same rows again
    it->a2a_recv_bytes += 2 * m.a2a_recv_bytes;
  }
}

// Calls f(begin, count, decay) for the part of every shard inside `owned`.
template <typename F>
void for_owned(const std::vector<DataParallel::Range>& owned, const std::vector<ShardSpec>& shards, F&& f) {
  for (const auto& r : owned) {
    for (const ShardSpec& s : shards) {
      const int64_t lo = std::max(r.begin, s.offset), hi = std::min(r.begin + r.size, s.offset + s.numel);
      if (hi > lo) f(lo, hi - lo, s);
    }
  }
}

}  // namespace

void DeviceProgram::run(Device& dev) {
  const TrainOptions& o = options;
  const ParallelOptions& par = o.parallel;
  const auto coords = mesh.coords(dev.rank());
  const coll::ProcessGroup dp_group = mesh.group(dev.rank(), "dp");
  const coll::ProcessGroup tp_group = mesh.group(dev.rank(), "tp");
  const coll::ProcessGroup pp_group = mesh.group(dev.rank(), "pp");
  const coll::ProcessGroup ep_group = mesh.group(dev.rank(), "ep");
  const coll::ProcessGroup edp_group = mesh.group(dev.rank(), "edp");
  // The global norm sums every parameter once: over tp (and dp with ZeRO-2,
  // where each rank holds only its chunks), ep (each rank its own experts) and pp.
  std::string norm_dims = par.zero >= 2 ? "tp-dp" : (par.ep > 1 ? "tp-ep" : "tp");
  if (par.pp > 1) norm_dims += "-pp";
  const coll::ProcessGroup norm_group = mesh.group(dev.rank(), norm_dims);
  // MoE routing that follows the global batch across dp ranks (capacity drops
  // in global token order) and expert parallelism need the TP/PP model code.
  const bool global_routing = o.model.is_moe() && par.dp > 1 && (par.ep > 1 || o.model.capacity_factor > 0);
  const parallel::MoeGroups moe{par.ep > 1 ? &ep_group : nullptr, global_routing ? &dp_group : nullptr};
  // The unsharded model (verify's reference; pure data parallelism) runs one
  // forward and backward per micro-batch (gradient accumulation). Every
  // sharded model is a PipelineModel driven by the schedule's action list:
  // with pp = 1 that is forward, backward per micro-batch too.
  const int M = o.micro_batches;
  const bool pipelined = par.pp > 1 || par.tp > 1 || moe.ep || moe.capacity;
  std::unique_ptr<LocalModel> model;
  parallel::PipelineModel* pipe = nullptr;
  if (pipelined) {
    auto p = std::make_unique<parallel::PipelineModel>(
        o.model, o.seed, dev, tp_group, par.sp,
        parallel::StagePlacement{par.pp, par.vpp, coords.pp, par.stage_layers}, moe);
    pipe = p.get();
    model = std::move(p);
  } else {
    model = std::make_unique<parallel::UnshardedModel>(o.model, o.seed);
  }
  SHARDLAB_CHECK(model != nullptr, fmt::format("no model for tp {} ({})", par.tp, tp_group.to_string()));
  if (init) load_shards(*model, *init);
  // The tied wte lives on the first and the last pipeline rank: its gradient
  // is summed between the two (Megatron's embedding group).
  std::optional<coll::ProcessGroup> embedding_group;
  if (par.pp > 1 && (coords.pp == 0 || coords.pp == par.pp - 1))
    embedding_group.emplace(std::vector<int>{pp_group.global_rank(0), pp_group.global_rank(par.pp - 1)},
                            dev.rank(), "embedding");
  // Each parameter counted once in norms and gathers: the tied copy of the
  // last stage is not, nor (without ZeRO-2) the non-expert copies of ep ranks > 0.
  auto counted = [&](const ShardSpec& s) {
    const bool expert = s.name.find(".mlp.experts.") != std::string::npos;
    return (!s.tp_replicated || coords.tp == 0) && (coords.pp == 0 || s.name != kTiedName) &&
           (par.zero >= 2 || expert || ep_group.rank() == 0);
  };

  dev.log().info("{}: {} local parameters", mesh.describe(dev.rank()), model->params().size());
  DeviceSink sink(dev);
  model->set_sink(&sink);
  auto params = model->params();
  auto grads = model->grads();
  const int64_t n = static_cast<int64_t>(params.size());
  parallel::DataParallelOptions dpo{uint64_t(par.bucket_mb * 1e6), par.overlap, par.zero};
  DataParallel::ExpertGrads expert_grads;
  if (par.ep > 1) expert_grads = {&edp_group, parallel::expert_ranges(model->shards())};
  DataParallel dp(dev, dp_group, grads, parallel::backward_ready_order(model->shards()), dpo, expert_grads);
  bool final_micro_batch = true;  // gradients are final only in the last micro-batch's backward
  sink.on_grads_ready([&](int64_t off, int64_t cnt) {
    if (final_micro_batch) dp.grads_ready(off, cnt);
  });
  sink.on_average([&](float* data, int64_t cnt) {
    if (dp_group.size() == 1) return false;
    coll::all_reduce(dev, dp_group, coll::Buffer(data, size_t(cnt)), coll::ReduceOp::kAvg);
    return true;
  });

  // Modeled memory: weights at the modeled precision; gradients too (only the
  // owned part plus one bucket in flight with ZeRO-2); AdamW moments in fp32,
  // plus fp32 master weights when the model is bf16, for the owned part.
  const int elem = element_size(dev.precision());
  const bool bf16 = dev.precision() == Precision::kBf16;
  const int64_t owned = dp.owned_elements();
  Tensor weights = dev.alloc("parameters", {n}, MemKind::kParam, /*phantom=*/true);
  const int64_t grad_elems = dp.sharded_grads() ? owned + int64_t(dp.largest_bucket_bytes() / elem) : n;
  Tensor grad_acct = dev.alloc("gradients", {std::min(n, grad_elems)}, MemKind::kGrad, /*phantom=*/true);
  const uint64_t optim_bytes = uint64_t(owned) * (bf16 ? 12 : 8);
  dev.arena().allocate(optim_bytes, MemKind::kOptimizer, "adamw state");
  model::Buffer<float> m(size_t(n), 0.0f), v(size_t(n), 0.0f);

  // Rows: micro-batch mb is rows [mb·B/M, (mb+1)·B/M) of the global batch,
  // split over dp. Without micro-batching that is rows [d·B/dp, (d+1)·B/dp).
  const int64_t rows = o.model.batch_size / (int64_t{M} * par.dp);
  auto first_row = [&](int mb) { return mb * (o.model.batch_size / M) + coords.dp * rows; };
  const int T = o.model.block_size;
  const bool leader = dev.rank() == 0;
  std::optional<parallel::PipelineExecutor> executor;
  std::vector<model::Batch> micro(static_cast<size_t>(M));  // reused: no allocation per step
  if (pipe) {
    pipe->set_micro_batch(int(rows), T);
    std::vector<int> stages(pp_group.members().begin(), pp_group.members().end());
    executor.emplace(dev, *pipe,
                     parallel::build_schedule(par.schedule, par.pp, M, par.vpp)[size_t(coords.pp)],
                     std::move(stages), M);
  }
  const auto wall0 = std::chrono::steady_clock::now();
  model->reset_moe_stats();
  for (int step = 0; step < o.steps; ++step) {
    dp.begin_step();
    model->zero_grad();
    float loss = 0, ce = 0, aux = 0;
    PhaseRecord& phase = result.phases[size_t(dev.rank())][size_t(step)];
    if (pipe) {
      for (int mb = 0; mb < M; ++mb) {
        const bool needs = pipe->layout_filter().wte;  // first or last stage: tokens
        if (needs) sampler.batch_rows(step, first_row(mb), first_row(mb) + rows, micro[size_t(mb)]);
      }
      pipe->reset_losses();
      const parallel::PipelinePhase ph = executor->run([&](int mb) {
        return parallel::MicroBatchTokens{micro[size_t(mb)].x.data(), micro[size_t(mb)].y.data()};
      });
      phase = {ph.start, ph.end, ph.busy, ph.sent_bytes};
      if (step == 0) result.first_step_spans[size_t(dev.rank())] = executor->spans();
      const parallel::FlatRange wte = pipe->wte_range();
      if (embedding_group)
        coll::all_reduce(dev, *embedding_group, coll::Buffer(grads.data() + wte.offset, size_t(wte.count)));
      if (embedding_group) dp.grads_ready(wte.offset, wte.count);  // one rank: the model announced it
      // The micro-batch mean; CE lives on the last stage, aux on every stage with MoE blocks.
      float parts[2] = {float(pipe->ce_sum() / M), float(pipe->aux_sum() / M)};
      if (pp_group.size() > 1) coll::all_reduce(dev, pp_group, coll::Buffer(parts, 2));
      ce = parts[0];
      aux = parts[1];
      loss = ce + float(o.model.aux_coef) * aux;
    } else {
      phase.start = dev.compute().now();
      const Time busy0 = dev.compute().busy();
      for (int mb = 0; mb < M; ++mb) {
        model::Batch& batch = micro[size_t(mb)];
        sampler.batch_rows(step, first_row(mb), first_row(mb) + rows, batch);
        loss += model->forward(batch.x.data(), batch.y.data(), int(rows), T) / float(M);
        final_micro_batch = mb == M - 1;
        model->backward_scaled(1.0f / float(M));
        ce += model->ce_loss() / float(M);
        aux += model->aux_loss() / float(M);
      }
      phase.end = dev.compute().now();
      phase.busy = dev.compute().busy() - busy0;
    }
    dp.finish_grads();
    record_moe(*model, step, result.moe[size_t(dev.rank())]);
    result.a2a_time[size_t(dev.rank())] += model->a2a_time();
    model->reset_moe_stats();
    if (step == 0 && o.keep_step0_grads) {
      // With ZeRO-2 each dp rank holds the reduced gradient of its own chunks only.
      std::vector<LocalRange> mine;
      for (const auto& r : dp.owned()) mine.push_back({r.begin, r.size});
      if (dp.sharded_grads()) scatter_to_global(*model, grads, coords, table, result.step0_grads, &mine);
      else if (coords.edp == 0) scatter_to_global(*model, grads, coords, table, result.step0_grads, nullptr,
                                                   coords.dp == 0 ? kAll : kExpertsOnly);
    }

    // The step's loss for the record: the dp average (as Megatron logs it).
    float losses[3] = {loss, ce, aux};
    if (dp_group.size() > 1) coll::all_reduce(dev, dp_group, coll::Buffer(losses, 3), coll::ReduceOp::kAvg);

    // Global gradient norm, each parameter counted once.
    double sq = 0;
    const auto& norm_ranges = dp.sharded_grads() ? dp.owned() : std::vector<DataParallel::Range>{{0, n}};
    for_owned(norm_ranges, model->shards(), [&](int64_t lo, int64_t cnt, const ShardSpec& s) {
      if (counted(s)) sq += model::sum_squares(grads.data() + lo, cnt);
    });
    sink.op("grad_norm", model::sum_squares_cost(dp.sharded_grads() ? owned : n, elem));
    if (norm_group.size() > 1) {
      float part = static_cast<float>(sq);
      coll::all_reduce(dev, norm_group, coll::Buffer(&part, 1));
      sq = part;
    }
    const double norm = std::sqrt(sq);
    double clip = 1.0;
    if (o.grad_clip > 0 && o.grad_clip / (norm + 1e-6) < 1) clip = o.grad_clip / (norm + 1e-6);  // torch clip_grad_norm_

    model::AdamWHyper h = o.adam;
    h.lr = learning_rate(o, step);
    for_owned(dp.owned(), model->shards(), [&](int64_t lo, int64_t cnt, const ShardSpec& s) {
      if (clip < 1) model::scale_inplace(grads.data() + lo, static_cast<float>(clip), cnt);
      model::adamw_update(params.data() + lo, m.data() + lo, v.data() + lo, grads.data() + lo, cnt, h,
                          s.decay ? h.weight_decay : 0.0, step + 1);
    });
    if (clip < 1) sink.op("grad_clip", model::scale_inplace_cost(owned, elem));
    sink.op("adamw", model::adamw_update_cost(owned, elem));
    dp.gather_params(params);

    dev.log().debug("step {} local loss {:.6f} grad norm {:.6f} at virtual {:.3f} us", step, loss, norm,
                    to_us(dev.now()));
    if (leader) {
      StepRecord rec{step, losses[0], losses[1], losses[2], h.lr, norm, dev.now(),
                     std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count()};
      result.steps.push_back(rec);
      if (on_step) on_step(rec);
    }
  }
  if (leader) result.loop_wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  if (!o.corrupt_shard.empty()) {
    const auto colon = o.corrupt_shard.rfind(':');
    if (colon != std::string::npos && std::stoi(o.corrupt_shard.substr(colon + 1)) == dev.rank())
      corrupt(*model, o.corrupt_shard.substr(0, colon));
  }
  // Replica d is the model as dp rank d's ep group holds it: every member
  // writes its experts into each of the group's replicas.
  scatter_to_global(*model, params, coords, table, result.replicas[size_t(coords.dp)], nullptr, kAll);
  for (int peer : ep_group.members())
    if (peer != dev.rank())
      scatter_to_global(*model, params, coords, table, result.replicas[size_t(mesh.coords(peer).dp)], nullptr,
                        kExpertsOnly);
  if (par.pp > 1 && coords.pp == par.pp - 1 && coords.dp == 0) {
    for (const ShardSpec& s : model->shards())
      if (s.name == kTiedName)
        for (int64_t i = 0; i < s.numel; ++i)
          result.tied_copy[size_t(parallel::global_index(s, i))] = params[size_t(s.offset + i)];
  }
  dev.arena().release(optim_bytes, MemKind::kOptimizer);
}

}  // namespace shardlab::train
