#include "model/train/device_program.h"

#include <algorithm>
#include <chrono>

#include "collectives/collectives.h"
#include "model/train/checkpoint.h"
#include "model/train/device_setup.h"
#include "model/train/parallel_plan.h"
#include "model/train/publish.h"
#include "runtime/progress.h"

namespace shardlab::train {

namespace coll = collectives;

namespace {

// Context parallelism: keeps, of every row of b, the chunks cp_rank and
// 2·cp−1−cp_rank of 2·cp (ShardDims::position). In place: every token moves to
// an index at most its own, read in increasing order.
void take_cp_chunks(model::Batch& b, int cp, int cp_rank) {
  const int64_t T = b.seq, c = T / (2 * cp), Tl = 2 * c;
  for (std::vector<int32_t>* v : {&b.x, &b.y}) {
    for (int64_t r = 0; r < b.rows; ++r)
      for (int64_t t = 0; t < Tl; ++t) {
        const int64_t chunk = t < c ? cp_rank : 2 * cp - 1 - cp_rank;
        (*v)[size_t(r * Tl + t)] = (*v)[size_t(r * T + chunk * c + t % c)];
      }
    v->resize(size_t(b.rows * Tl));
  }
  b.seq = Tl;
}

// TrainOptions::reverse_rows: the micro-batch's sequences in reverse order.
void reverse_rows(model::Batch& b) {
  const auto T = size_t(b.seq);
  for (int64_t lo = 0, hi = b.rows - 1; lo < hi; ++lo, --hi)
    for (std::vector<int32_t>* v : {&b.x, &b.y})
      std::swap_ranges(v->begin() + long(size_t(lo) * T), v->begin() + long(size_t(lo + 1) * T),
                       v->begin() + long(size_t(hi) * T));
}

// The tied embedding's two pipeline copies (the first stage's embedding,
// the last stage's head; ParallelPlan::tied_copies) summed over the
// embedding group. Megatron sums them after the data-parallel reduction
// (finalize_model_grads: finish_grad_sync, then _allreduce_embedding_grads;
// Megatron-LM 2021's train_step in the same order): a sum of two is the same
// bits on both ranks, so the copies stay bit-identical whatever algorithm
// each stage's data-parallel group ran. ZeRO-2 sums the owned chunk of the
// tied bucket, which both stages own alike (the bucket is its own), at its
// padded size: every dp rank sums a chunk of one size (the last owner's
// padding as zeros), as a padded gradient partition is summed, so the dp
// ranks run the same program (folding relies on it); ZeRO 0 and 1 the
// whole tensor, as Megatron all-reduces the whole main_grad.
// ZeRO-3 sums them before its reduction instead: its units hold wte beside
// other tensors (wpe's unit, the head's), so the stages own different chunks.
void sum_tied_copies(const DeviceProgram& p, DeviceSetup& s, Device& dev, bool after_dp) {
  const Range wte = p.plan.tied_bucket(s.model->shards());
  const int zero = p.options.parallel.zero;
  if (wte.empty() || after_dp != (zero != 3)) return;
  const coll::ProcessGroup& embedding = *s.ctx.embedding(p.options.parallel.last_stage_rank());
  float* grads = s.model->grads().data();
  if (zero == 2) return s.dp->sum_owned_chunk(wte, embedding);
  coll::all_reduce(dev, embedding, coll::Buffer(model::shifted(grads, wte.begin), size_t(wte.size)));
}

struct StepLosses {
  float loss = 0, ce = 0, aux = 0;
};

// Forward and backward of one step: this rank's schedule actions over its
// micro-batches, then the tied embedding's two copies summed (pipelines).
StepLosses forward_backward(const DeviceProgram& p, DeviceSetup& s, Device& dev, int step) {
  const bool tokens = s.stage->placement().holds_first() || s.stage->placement().holds_last();
  for (int mb = 0; tokens && mb < s.micro_batches; ++mb) {
    model::Batch& b = s.micro[size_t(mb)];
    if (p.sampler) {
      p.sampler->batch_rows(step, s.first_row(mb), s.first_row(mb) + s.rows, b);
      if (p.options.reverse_rows) reverse_rows(b);
      if (s.cp > 1) take_cp_chunks(b, s.cp, s.coords.cp);
    } else if (b.x.empty()) {  // phantom: token 0 everywhere, no data is read
      const int T = p.options.model.block_size / s.cp;
      const auto n = size_t(s.rows * T);
      b = {s.rows, T, std::vector<int32_t>(n, 0), std::vector<int32_t>(n, 0)};
    }
  }
  s.stage->reset_losses();
  const parallel::PipelinePhase ph = s.executor->run([&s](int mb) {
    return parallel::MicroBatchTokens{s.micro[size_t(mb)].x.data(), s.micro[size_t(mb)].y.data()};
  });
  p.result.phases[size_t(dev.rank())][size_t(step)] = {ph.start, ph.end, ph.busy, ph.sent_bytes};
  if (step == (p.resume ? p.resume->step : 0)) p.result.first_step_spans[size_t(dev.rank())] = s.executor->spans();
  // The tied wte is final once the pipeline has run (the model announces it
  // where one rank holds both uses).
  sum_tied_copies(p, s, dev, /*after_dp=*/false);
  if (const Range wte = p.plan.tied_bucket(s.model->shards()); !wte.empty()) s.dp->grads_ready(wte.begin, wte.size);
  // The micro-batch mean; CE lives on the last stage, aux on every stage with MoE blocks.
  const int M = s.micro_batches;
  float parts[2] = {float(s.stage->ce_sum() / M), float(s.stage->aux_sum() / M)};
  const coll::ProcessGroup& pipeline = s.ctx.group("pp");
  if (pipeline.size() > 1) coll::all_reduce(dev, pipeline, coll::Buffer(parts, 2));
  return {parts[0] + float(p.options.model.aux_coef) * parts[1], parts[0], parts[1]};
}

}  // namespace

void DeviceProgram::run(Device& dev) const {
  // A phantom run sizes every floating-point buffer of this device without
  // storage (model/buffer.h) and its layers skip the math (model::Exec).
  const model::PhantomScope phantom(options.phantom);
  const model::ArithmeticScope arithmetic(options.arithmetic);
  const model::SplitSumsScope split_sums(options.split_sums);
  const bool leader = dev.rank() == 0;
  const int threads = result.running_devices;
  auto progress = [&](const char* phase, int step, int64_t done, int64_t total) {
    if (leader && on_progress) on_progress({phase, step, options.steps, done, total, threads});
  };
  progress("setup", 0, 0, 0);
  DeviceSetup s(*this, dev);
  int current = 0;
  if (leader && on_progress)
    s.executor->on_action([&](size_t done, size_t total) {
      progress("forward-backward", current, int64_t(done), int64_t(total));
    });
  const auto wall0 = std::chrono::steady_clock::now();
  const coll::ProcessGroup& dp_group = s.data_group();
  s.model->reset_moe_stats();
  const int first = resume ? resume->step : 0;  // --steps is the total, as Megatron's train-iters
  if (resume) restore_device(*this, s, dev);
  if (before_first_step && !options.phantom) before_first_step(dev.rank(), *s.model);
  for (int step = first; step < options.steps; ++step) {
    current = step;
    dev.set_step(step);  // faults that start at a step (runtime/fault.h)
    s.dp->begin_step();
    if (s.param_gather) s.param_gather->begin_step();
    s.sink.begin_step();
    s.model->zero_grad();
    const StepLosses l = forward_backward(*this, s, dev, step);
    s.dp->finish_grads();
    sum_tied_copies(*this, s, dev, /*after_dp=*/true);
    record_moe(*s.model, step, result.moe[size_t(dev.rank())]);
    result.a2a_time[size_t(dev.rank())] += s.model->a2a_time();
    s.model->reset_moe_stats();
    if (step == 0 && options.keep_step0_grads && !options.phantom) publish_step0_grads(*s.model, *s.dp, s.coords, table, result);

    // The step's loss for the record: the dp (× cp) average (as Megatron logs
    // it); cp ranks hold equal token counts, so it is the whole batch's mean.
    float losses[3] = {l.loss, l.ce, l.aux};
    if (dp_group.size() > 1) coll::all_reduce(dev, dp_group, coll::Buffer(losses, 3), coll::ReduceOp::kAvg);
    progress("optimizer", step, 0, 0);
    model::AdamWHyper h = options.adam;
    h.lr = learning_rate(options, step);
    h.router_bias_rate = options.model.router_bias_rate;
    const double norm = s.optimizer->step(h, step, options.grad_clip);
    if (s.param_gather) s.param_gather->updated();  // gathered in the next forward

    dev.log().debug("step {} local loss {:.6f} grad norm {:.6f} at virtual {:.3f} us", step, l.loss, norm,
                    to_us(dev.now()));
    if (leader) {
      const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
      const StepRecord rec{step, losses[0], losses[1], losses[2], h.lr, norm, dev.now(), wall};
      result.steps.push_back(rec);
      if (on_step) on_step(rec);
      report_step({step, options.steps, rec.virtual_end, rec.loss});  // runtime/progress.h
    }
    if (checkpoint_due(options, step + 1)) {
      if (s.param_gather) s.param_gather->finish();  // the parameters whole, as Megatron syncs them to save
      save_device_checkpoint(*this, s, dev, step + 1);
    }
  }
  // The run ends with its parameters whole, untimed: a step's gathers
  // belong to the next step's forward.
  if (s.param_gather) s.param_gather->finish_on_host();
  result.grad_reduce_scatters[size_t(dev.rank())] = s.dp->reduce_scatters();
  if (leader) result.loop_wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  if (s.fsdp) {
    result.fsdp[size_t(dev.rank())] = {s.fsdp->exposed(), s.fsdp->gathers(), s.fsdp->gathered_bytes(),
                                       s.dp->reduce_scatters()};
    if (!options.phantom) s.fsdp->gather_all_to_host();  // the full parameters, to publish
  }
  if (s.param_gather)
    result.param_gather[size_t(dev.rank())] = {s.param_gather->exposed(), s.param_gather->gathers(),
                                               s.param_gather->gathered_bytes()};
  if (s.cp_attention) result.cp[size_t(dev.rank())] = {s.cp_attention->exposed(), s.cp_attention->sent_bytes()};
  if (options.phantom) return;  // no values to publish
  if (before_publish) before_publish(dev.rank(), *s.model);
  s.model->free_host_buffers();  // before the parameters' copy: the run's peak stays the steps'
  const coll::ProcessGroup& ep = s.ctx.group(options.parallel.ep_dims());
  publish_params(*s.model, plan.mesh, dev.rank(), std::vector<int>(ep.members().begin(), ep.members().end()),
                 result, table);
}

}  // namespace shardlab::train
