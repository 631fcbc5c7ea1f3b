#include "model/train/device_program.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>

#include <fmt/format.h>

#include "collectives/collectives.h"
#include "model/optimizer.h"
#include "model/parallel/data_parallel.h"
#include "model/parallel/tensor_parallel.h"
#include "model/parallel/tp_layout.h"
#include "model/parallel/unsharded_model.h"
#include "model/train/device_sink.h"
#include "runtime/errors.h"

namespace shardlab::train {

namespace coll = collectives;
using parallel::DataParallel;
using parallel::LocalModel;
using parallel::ShardSpec;

void scatter_to_global(const LocalModel& model, std::span<const float> local, int tp_rank,
                       const model::ParamTable& table, std::span<float> global,
                       const std::vector<LocalRange>* only) {
  for (const ShardSpec& s : model.shards()) {
    if (s.tp_replicated && tp_rank != 0) continue;
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
  const coll::ProcessGroup norm_group = mesh.group(dev.rank(), par.zero >= 2 ? "tp-dp" : "tp");
  std::unique_ptr<LocalModel> model;
  if (par.tp == 1) {
    model = std::make_unique<parallel::UnshardedModel>(o.model, o.seed);
  } else {
    model = std::make_unique<parallel::TensorParallelGPT>(o.model, o.seed, dev, tp_group, par.sp);
  }
  SHARDLAB_CHECK(model != nullptr, fmt::format("no model for tp {} ({})", par.tp, tp_group.to_string()));
  if (init) load_shards(*model, *init);

  dev.log().info("{}: {} local parameters", mesh.describe(dev.rank()), model->params().size());
  DeviceSink sink(dev);
  model->set_sink(&sink);
  auto params = model->params();
  auto grads = model->grads();
  const int64_t n = static_cast<int64_t>(params.size());
  parallel::DataParallelOptions dpo{uint64_t(par.bucket_mb * 1e6), par.overlap, par.zero};
  DataParallel dp(dev, dp_group, grads, parallel::backward_ready_order(model->shards()), dpo);
  sink.on_grads_ready([&dp](int64_t off, int64_t cnt) { dp.grads_ready(off, cnt); });
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

  const int64_t rows = o.model.batch_size / par.dp, r0 = coords.dp * rows;
  const int T = o.model.block_size;
  const bool leader = dev.rank() == 0;
  const auto wall0 = std::chrono::steady_clock::now();
  for (int step = 0; step < o.steps; ++step) {
    const model::Batch batch = sampler.batch_rows(step, r0, r0 + rows);
    dp.begin_step();
    model->zero_grad();
    const float loss = model->forward(batch.x.data(), batch.y.data(), int(rows), T);
    model->backward();
    dp.finish_grads();
    if (step == 0 && o.keep_step0_grads) {
      // With ZeRO-2 each dp rank holds the reduced gradient of its own chunks only.
      std::vector<LocalRange> mine;
      for (const auto& r : dp.owned()) mine.push_back({r.begin, r.size});
      if (dp.sharded_grads()) scatter_to_global(*model, grads, coords.tp, table, result.step0_grads, &mine);
      else if (coords.dp == 0) scatter_to_global(*model, grads, coords.tp, table, result.step0_grads);
    }

    // The step's loss for the record: the dp average (as Megatron logs it).
    float losses[3] = {loss, model->ce_loss(), model->aux_loss()};
    if (dp_group.size() > 1) coll::all_reduce(dev, dp_group, coll::Buffer(losses, 3), coll::ReduceOp::kAvg);

    // Global gradient norm, each parameter counted once.
    double sq = 0;
    const auto& norm_ranges = dp.sharded_grads() ? dp.owned() : std::vector<DataParallel::Range>{{0, n}};
    for_owned(norm_ranges, model->shards(), [&](int64_t lo, int64_t cnt, const ShardSpec& s) {
      if (!s.tp_replicated || coords.tp == 0) sq += model::sum_squares(grads.data() + lo, cnt);
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
  scatter_to_global(*model, params, coords.tp, table, result.replicas[size_t(coords.dp)]);
  dev.arena().release(optim_bytes, MemKind::kOptimizer);
}

}  // namespace shardlab::train
