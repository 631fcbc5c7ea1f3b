#include "model/train/device_program.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <optional>

#include <fmt/format.h>

#include "collectives/collectives.h"
#include "model/optimizer.h"
#include "model/parallel/data/data_parallel.h"
#include "model/parallel/pipeline/executor.h"
#include "model/parallel/layout.h"
#include "model/parallel/unsharded_model.h"
#include "model/train/device_sink.h"
#include "model/train/shard_io.h"
#include "runtime/errors.h"

namespace shardlab::train {

namespace coll = collectives;
using parallel::DataParallel;
using parallel::LocalModel;
using parallel::ShardSpec;

namespace {

// Adds this step's MoE block statistics to the device's record.
void record_moe(const LocalModel& model, int step, std::vector<MoeLayerTotals>& out) {
  for (const parallel::MoeStepStats& m : model.moe_step_stats()) {
    if (m.layer < 0) continue;
    auto it = std::find_if(out.begin(), out.end(), [&](const MoeLayerTotals& t) { return t.layer == m.layer; });
    if (it == out.end()) {
      out.push_back({m.layer, m.expert_begin});
      it = out.end() - 1;
    }
    it->per_step.resize(size_t(step) + 1);
    it->per_step[size_t(step)] = m.received;
    it->dropped += m.dropped;
    it->a2a_sent_bytes += 2 * m.a2a_sent_bytes;  // backward moves the same rows again
    it->a2a_recv_bytes += 2 * m.a2a_recv_bytes;
  }
}

// Calls f(begin, count, decay) for the part of every shard inside `owned`.
template <typename F>
void for_owned(const std::vector<Range>& owned, const std::vector<ShardSpec>& shards, F&& f) {
  for (const auto& r : owned) {
    for (const ShardSpec& s : shards) {
      const int64_t lo = std::max(r.begin, s.offset), hi = std::min(r.begin + r.size, s.offset + s.numel);
      if (hi > lo) f(lo, hi - lo, s);
    }
  }
}

}  // namespace

namespace {



// The process groups one device takes part in (mesh order tp-cp-ep-dp-pp).
struct Groups {
  Groups(const collectives::DeviceMesh& mesh, const ParallelOptions& par, int rank)
      : dp(mesh.group(rank, "dp")),
        tp(mesh.group(rank, "tp")),
        pp(mesh.group(rank, "pp")),
        ep(mesh.group(rank, "ep")),
        edp(mesh.group(rank, "edp")),
        norm(mesh.group(rank, norm_dims(par))) {
    // The tied wte lives on the first and the last pipeline rank: its
    // gradient is summed between the two (Megatron's embedding group).
    const auto c = mesh.coords(rank);
    if (par.pp > 1 && (c.pp == 0 || c.pp == par.pp - 1))
      embedding.emplace(std::vector<int>{pp.global_rank(0), pp.global_rank(par.pp - 1)}, rank, "embedding");
  }
  // The global norm sums every parameter once: over tp (and dp with ZeRO-2,
  // where each rank holds only its chunks), ep (each rank its own experts) and pp.
  static std::string norm_dims(const ParallelOptions& par) {
    std::string dims = par.zero >= 2 ? "tp-dp" : (par.ep > 1 ? "tp-ep" : "tp");
    return par.pp > 1 ? dims + "-pp" : dims;
  }
  coll::ProcessGroup dp, tp, pp, ep, edp, norm;
  std::optional<coll::ProcessGroup> embedding;
};

struct StepLosses {
  float loss = 0, ce = 0, aux = 0;
};

// One device's training run: the model part it holds, data parallelism over
// its dp group, AdamW over the parameters it owns.
class DeviceRun {
 public:
  DeviceRun(const DeviceProgram& program, Device& dev);
  ~DeviceRun() { dev_.arena().release(optim_bytes_, MemKind::kOptimizer); }

  void run();

 private:
  std::unique_ptr<LocalModel> make_model();
  StepLosses forward_backward(int step);
  StepLosses pipeline_forward_backward(int step, PhaseRecord& phase);
  StepLosses accumulate_forward_backward(int step, PhaseRecord& phase);
  // Clips by the global norm and takes the AdamW step; returns the norm.
  double optimizer_step(int step);
  void keep_step0_grads();
  void publish_params();
  // Each parameter counted once in norms: the tied copy of the last stage is
  // not, nor (without ZeRO-2) the non-expert copies of ep ranks > 0.
  bool counted(const ShardSpec& s) const {
    return (!s.tp_replicated || coords_.tp == 0) && (coords_.pp == 0 || s.name != kTiedName) &&
           (par_.zero >= 2 || s.expert || groups_.ep.rank() == 0);
  }
  int64_t first_row(int mb) const { return mb * (o_.model.batch_size / M_) + coords_.dp * rows_; }

  const DeviceProgram& p_;
  const TrainOptions& o_;
  const ParallelOptions& par_;
  Device& dev_;
  const collectives::Coords coords_;
  Groups groups_;
  // MoE routing that follows the global batch across dp ranks (capacity drops
  // in global token order) and expert parallelism.
  parallel::MoeGroups moe_;
  const int M_;
  const int64_t rows_;  // per micro-batch on this dp rank
  std::unique_ptr<LocalModel> model_;
  parallel::PipelineModel* pipe_ = nullptr;  // the model, when sharded
  DeviceSink sink_;
  std::optional<DataParallel> dp_;
  std::optional<parallel::PipelineExecutor> executor_;
  bool final_micro_batch_ = true;  // gradients are final only in the last micro-batch's backward
  std::vector<model::Batch> micro_;  // reused: no allocation per step
  model::Buffer<float> m_, v_;       // AdamW moments
  uint64_t optim_bytes_ = 0;
  Tensor weights_, grad_acct_;       // modeled memory of parameters and gradients
};

DeviceRun::DeviceRun(const DeviceProgram& program, Device& dev)
    : p_(program),
      o_(program.options),
      par_(program.options.parallel),
      dev_(dev),
      coords_(program.mesh.coords(dev.rank())),
      groups_(program.mesh, program.options.parallel, dev.rank()),
      M_(program.options.micro_batches),
      rows_(program.options.model.batch_size / (int64_t{program.options.micro_batches} * par_.dp)),
      sink_(dev),
      micro_(static_cast<size_t>(program.options.micro_batches)) {
  const bool global_routing = o_.model.is_moe() && par_.dp > 1 && (par_.ep > 1 || o_.model.capacity_factor > 0);
  moe_ = {par_.ep > 1 ? &groups_.ep : nullptr, global_routing ? &groups_.dp : nullptr};
  model_ = make_model();
  if (p_.init) load_shards(*model_, *p_.init);
  dev.log().info("{}: {} local parameters", p_.mesh.describe(dev.rank()), model_->params().size());
  model_->set_sink(&sink_);

  auto grads = model_->grads();
  const parallel::DataParallelOptions dpo{uint64_t(par_.bucket_mb * 1e6), par_.overlap, par_.zero};
  DataParallel::ExpertGrads expert_grads;
  if (par_.ep > 1) expert_grads = {&groups_.edp, parallel::expert_ranges(model_->shards())};
  dp_.emplace(dev, groups_.dp, grads, parallel::backward_ready_order(model_->shards()), dpo, expert_grads);
  sink_.on_grads_ready([this](int64_t off, int64_t cnt) {
    if (final_micro_batch_) dp_->grads_ready(off, cnt);
  });
  sink_.on_average([this](float* data, int64_t cnt) {
    if (groups_.dp.size() == 1) return false;
    coll::all_reduce(dev_, groups_.dp, coll::Buffer(data, size_t(cnt)), coll::ReduceOp::kAvg);
    return true;
  });

  // Modeled memory: weights at the modeled precision; gradients too (only the
  // owned part plus one bucket in flight with ZeRO-2); AdamW moments in fp32,
  // plus fp32 master weights when the model is bf16, for the owned part.
  const int64_t n = static_cast<int64_t>(model_->params().size());
  const int elem = element_size(dev.precision());
  const bool bf16 = dev.precision() == Precision::kBf16;
  weights_ = dev.alloc("parameters", {n}, MemKind::kParam, /*phantom=*/true);
  const int64_t grad_elems =
      dp_->sharded_grads() ? dp_->owned_elements() + int64_t(dp_->largest_bucket_bytes() / elem) : n;
  grad_acct_ = dev.alloc("gradients", {std::min(n, grad_elems)}, MemKind::kGrad, /*phantom=*/true);
  optim_bytes_ = uint64_t(dp_->owned_elements()) * (bf16 ? 12 : 8);
  dev.arena().allocate(optim_bytes_, MemKind::kOptimizer, "adamw state");
  m_.assign(size_t(n), 0.0f);
  v_.assign(size_t(n), 0.0f);

  if (pipe_) {
    pipe_->set_micro_batch(int(rows_), o_.model.block_size);
    std::vector<int> stages(groups_.pp.members().begin(), groups_.pp.members().end());
    executor_.emplace(dev, *pipe_, parallel::build_schedule(par_.schedule, par_.pp, M_, par_.vpp)[size_t(coords_.pp)],
                      std::move(stages), M_);
  }
}

// The unsharded model (verify's reference; pure data parallelism) runs one
// forward and backward per micro-batch (gradient accumulation). Every sharded
// model is a PipelineModel driven by the schedule's action list: with pp = 1
// that is forward, backward per micro-batch too.
std::unique_ptr<LocalModel> DeviceRun::make_model() {
  const bool sharded = par_.pp > 1 || par_.tp > 1 || moe_.ep || moe_.capacity;
  if (!sharded) return std::make_unique<parallel::UnshardedModel>(o_.model, o_.seed);
  auto model = std::make_unique<parallel::PipelineModel>(
      o_.model, o_.seed, dev_, groups_.tp, par_.sp,
      parallel::StagePlacement{par_.pp, par_.vpp, coords_.pp, par_.stage_layers}, moe_);
  pipe_ = model.get();
  return model;
}

StepLosses DeviceRun::forward_backward(int step) {
  PhaseRecord& phase = p_.result.phases[size_t(dev_.rank())][size_t(step)];
  return pipe_ ? pipeline_forward_backward(step, phase) : accumulate_forward_backward(step, phase);
}

StepLosses DeviceRun::pipeline_forward_backward(int step, PhaseRecord& phase) {
  if (pipe_->layout_filter().wte) {  // the first or the last stage: tokens
    for (int mb = 0; mb < M_; ++mb)
      p_.sampler.batch_rows(step, first_row(mb), first_row(mb) + rows_, micro_[size_t(mb)]);
  }
  pipe_->reset_losses();
  const parallel::PipelinePhase ph = executor_->run([this](int mb) {
    return parallel::MicroBatchTokens{micro_[size_t(mb)].x.data(), micro_[size_t(mb)].y.data()};
  });
  phase = {ph.start, ph.end, ph.busy, ph.sent_bytes};
  if (step == 0) p_.result.first_step_spans[size_t(dev_.rank())] = executor_->spans();
  if (groups_.embedding) {  // otherwise one rank holds both uses and the model announced wte
    const parallel::FlatRange wte = pipe_->wte_range();
    auto grads = model_->grads();
    coll::all_reduce(dev_, *groups_.embedding, coll::Buffer(grads.data() + wte.offset, size_t(wte.count)));
    dp_->grads_ready(wte.offset, wte.count);
  }
  // The micro-batch mean; CE lives on the last stage, aux on every stage with MoE blocks.
  float parts[2] = {float(pipe_->ce_sum() / M_), float(pipe_->aux_sum() / M_)};
  if (groups_.pp.size() > 1) coll::all_reduce(dev_, groups_.pp, coll::Buffer(parts, 2));
  return {parts[0] + float(o_.model.aux_coef) * parts[1], parts[0], parts[1]};
}

StepLosses DeviceRun::accumulate_forward_backward(int step, PhaseRecord& phase) {
  StepLosses l;
  phase.start = dev_.compute().now();
  const Time busy0 = dev_.compute().busy();
  for (int mb = 0; mb < M_; ++mb) {
    model::Batch& batch = micro_[size_t(mb)];
    p_.sampler.batch_rows(step, first_row(mb), first_row(mb) + rows_, batch);
    l.loss += model_->forward(batch.x.data(), batch.y.data(), int(rows_), o_.model.block_size) / float(M_);
    final_micro_batch_ = mb == M_ - 1;
    model_->backward_scaled(1.0f / float(M_));
    l.ce += model_->ce_loss() / float(M_);
    l.aux += model_->aux_loss() / float(M_);
  }
  phase.end = dev_.compute().now();
  phase.busy = dev_.compute().busy() - busy0;
  return l;
}

double DeviceRun::optimizer_step(int step) {
  auto params = model_->params();
  auto grads = model_->grads();
  const int64_t n = static_cast<int64_t>(params.size()), owned = dp_->owned_elements();
  const int elem = element_size(dev_.precision());
  // Global gradient norm, each parameter counted once.
  double sq = 0;
  const auto& norm_ranges = dp_->sharded_grads() ? dp_->owned() : std::vector<Range>{{0, n}};
  for_owned(norm_ranges, model_->shards(), [&](int64_t lo, int64_t cnt, const ShardSpec& s) {
    if (counted(s)) sq += model::sum_squares(grads.data() + lo, cnt);
  });
  sink_.op("grad_norm", model::sum_squares_cost(dp_->sharded_grads() ? owned : n, elem));
  if (groups_.norm.size() > 1) {
    float part = static_cast<float>(sq);
    coll::all_reduce(dev_, groups_.norm, coll::Buffer(&part, 1));
    sq = part;
  }
  const double norm = std::sqrt(sq);
  double clip = 1.0;
  if (o_.grad_clip > 0 && o_.grad_clip / (norm + 1e-6) < 1) clip = o_.grad_clip / (norm + 1e-6);  // torch clip_grad_norm_

  model::AdamWHyper h = o_.adam;
  h.lr = learning_rate(o_, step);
  for_owned(dp_->owned(), model_->shards(), [&](int64_t lo, int64_t cnt, const ShardSpec& s) {
    if (clip < 1) model::scale_inplace(grads.data() + lo, static_cast<float>(clip), cnt);
    model::adamw_update(params.data() + lo, m_.data() + lo, v_.data() + lo, grads.data() + lo, cnt, h,
                        s.decay ? h.weight_decay : 0.0, step + 1);
  });
  if (clip < 1) sink_.op("grad_clip", model::scale_inplace_cost(owned, elem));
  sink_.op("adamw", model::adamw_update_cost(owned, elem));
  dp_->gather_params(params);
  return norm;
}

// The step-0 gradients after the DP reduction, gathered into unsharded tensors.
void DeviceRun::keep_step0_grads() {
  auto grads = model_->grads();
  if (dp_->sharded_grads()) {  // with ZeRO-2 each dp rank holds the reduced gradient of its own chunks only
    std::vector<Range> mine;
    for (const auto& r : dp_->owned()) mine.push_back({r.begin, r.size});
    scatter_to_global(*model_, grads, coords_, p_.table, p_.result.step0_grads, &mine);
  } else if (coords_.edp == 0) {
    scatter_to_global(*model_, grads, coords_, p_.table, p_.result.step0_grads, nullptr,
                      coords_.dp == 0 ? kAll : kExpertsOnly);
  }
}

void DeviceRun::publish_params() {
  auto params = model_->params();
  // Replica d is the model as dp rank d's ep group holds it: every member
  // writes its experts into each of the group's replicas.
  scatter_to_global(*model_, params, coords_, p_.table, p_.result.replicas[size_t(coords_.dp)], nullptr, kAll);
  for (int peer : groups_.ep.members())
    if (peer != dev_.rank())
      scatter_to_global(*model_, params, coords_, p_.table, p_.result.replicas[size_t(p_.mesh.coords(peer).dp)],
                        nullptr, kExpertsOnly);
  // The last stage's tied copy, compared with the first stage's by train().
  if (par_.pp > 1 && coords_.pp == par_.pp - 1 && coords_.dp == 0) {
    for (const ShardSpec& s : model_->shards())
      if (s.name == kTiedName)
        for (int64_t i = 0; i < s.numel; ++i)
          p_.result.tied_copy[size_t(parallel::global_index(s, i))] = params[size_t(s.offset + i)];
  }
}

void DeviceRun::run() {
  TrainResult& result = p_.result;
  const bool leader = dev_.rank() == 0;
  const auto wall0 = std::chrono::steady_clock::now();
  model_->reset_moe_stats();
  for (int step = 0; step < o_.steps; ++step) {
    dp_->begin_step();
    model_->zero_grad();
    const StepLosses l = forward_backward(step);
    dp_->finish_grads();
    record_moe(*model_, step, result.moe[size_t(dev_.rank())]);
    result.a2a_time[size_t(dev_.rank())] += model_->a2a_time();
    model_->reset_moe_stats();
    if (step == 0 && o_.keep_step0_grads) keep_step0_grads();

    // The step's loss for the record: the dp average (as Megatron logs it).
    float losses[3] = {l.loss, l.ce, l.aux};
    if (groups_.dp.size() > 1) coll::all_reduce(dev_, groups_.dp, coll::Buffer(losses, 3), coll::ReduceOp::kAvg);
    const double norm = optimizer_step(step);

    dev_.log().debug("step {} local loss {:.6f} grad norm {:.6f} at virtual {:.3f} us", step, l.loss, norm,
                     to_us(dev_.now()));
    if (leader) {
      StepRecord rec{step, losses[0], losses[1], losses[2], learning_rate(o_, step), norm, dev_.now(),
                     std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count()};
      result.steps.push_back(rec);
      if (p_.on_step) p_.on_step(rec);
    }
  }
  if (leader) result.loop_wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  if (!o_.corrupt_shard.empty()) {
    const auto colon = o_.corrupt_shard.rfind(':');
    if (colon != std::string::npos && std::stoi(o_.corrupt_shard.substr(colon + 1)) == dev_.rank())
      corrupt_shard(*model_, o_.corrupt_shard.substr(0, colon));
  }
  publish_params();
}

}  // namespace

void DeviceProgram::run(Device& dev) { DeviceRun(*this, dev).run(); }

}  // namespace shardlab::train
