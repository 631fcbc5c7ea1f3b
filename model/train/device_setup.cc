#include "model/train/device_setup.h"

#include <string>
#include <vector>

#include "collectives/collectives.h"
#include "model/engine/shard_io.h"
#include "model/parallel/data/fsdp.h"
#include "model/parallel/sharded_gpt.h"
#include "model/parallel/unsharded_model.h"
#include "model/train/parallel_plan.h"
#include "runtime/errors.h"

namespace shardlab::train {

namespace coll = collectives;

namespace {

// The global norm sums every parameter once: over tp (and dp when the
// gradients are reduce-scattered, where each rank has only its chunks reduced) and ep (each rank its own experts)
// inside a stage, then over pp (ShardedAdamW's stage group): two groups with
// uniform links rather than one spanning nodes unevenly, so that a phantom
// run can fold tp (model/engine/fold.h).
std::string norm_dims(const ParallelOptions& par) {
  if (par.reduce_scatters_grads()) return par.cp > 1 ? "tp-cp-dp" : "tp-dp";  // the chunks are over dp × cp
  return par.ep > 1 ? "tp-ep" : "tp";
}

// HSDP: the shard group (n consecutive members of the dp group, this rank
// among them) or the replica group (the members at this rank's place in
// every shard group).
std::vector<int> hsdp_members(const coll::ProcessGroup& dp, int n, bool shard) {
  std::vector<int> out;
  const int at = dp.rank();
  for (int i = 0; i < dp.size(); ++i)
    if (shard ? i / n == at / n : i % n == at % n) out.push_back(dp.members()[size_t(i)]);
  return out;
}

}  // namespace

DeviceSetup::DeviceSetup(const DeviceProgram& p, Device& dev)
    : ctx(p.plan.mesh, dev.rank()),
      coords(ctx.coords()),
      micro_batches(p.options.micro_batches),
      rows(p.options.model.batch_size / (int64_t{p.options.micro_batches} * p.options.parallel.dp)),
      sink(dev),
      micro(static_cast<size_t>(p.options.micro_batches)),
      cp(p.options.parallel.cp) {
  make_model(p, dev);
  if (p.init) engine::load_shards(*model, *p.init);
  dev.log().info("{}: {} local parameters", p.plan.mesh.describe(dev.rank()), model->params().size());
  sink.set_grad_accum_fusion(p.options.parallel.grad_accum_fusion);
  sink.set_half_grads(p.options.parallel.half_grads);
  sink.set_fusions(p.options.parallel.fusions);  // before set_sink: the model's Exec copies them
  model->set_sink(&sink);
  make_data_parallel(p, dev);
  const ParallelOptions& par = p.options.parallel;
  if (par.zero == 3) make_fsdp(p, dev);
  if (par.overlap_param_gather) make_param_gather(p, dev);
  optimizer.emplace(dev, *model, *dp, ctx.group(norm_dims(par)),
                    NormCounting{coords.tp == 0, coords.pp == 0, ctx.group("ep").rank() == 0, par.reduce_scatters_grads(),
                                 dp->replica_rank() == 0},
                    &ctx.group("pp"));
  // Modeled memory of the buffers the model and data parallelism hold: the
  // weights at the device precision, the gradients as main gradients (fp32,
  // or bf16 with --grad-reduce-in-bf16).
  // ZeRO-3 holds only its shards; the gathered units are Fsdp's. ZeRO-1/2's
  // buffers hold the padded buckets (buckets.h, padded_bucket).
  const int64_t weights = par.zero == 3 ? dp->owned_elements() : dp->buffer_elements();
  weights_ = dev.alloc("parameters", {weights}, MemKind::kParam, /*phantom=*/true);
  grads_ = Tensor(dev.arena(), "gradients", {dp->held_grad_elements()}, MemKind::kGrad,
                  dp->grad_bytes() == 2 ? Precision::kBf16 : Precision::kFp32, /*phantom=*/true);
  const coll::ProcessGroup& pipeline = ctx.group("pp");
  executor.emplace(dev, *stage, p.plan.schedule[size_t(coords.pp)],
                   std::vector<int>(pipeline.members().begin(), pipeline.members().end()), micro_batches);
  executor->wait_for_sends(!par.overlap_p2p_comm);
}

// The unsharded model (verify's reference; pure data parallelism) or the
// sharded GPT; the executor drives either through the StageModel calls.
void DeviceSetup::make_model(const DeviceProgram& p, Device& dev) {
  const TrainOptions& o = p.options;
  const ParallelOptions& par = o.parallel;
  const int T = o.model.block_size / par.cp;  // this rank's tokens of every sequence
  if (!p.plan.sharded) {
    auto m = std::make_unique<parallel::UnshardedModel>(o.model, o.seed);
    m->set_micro_batch(int(rows), T);
    stage = m.get();
    model = std::move(m);
    return;
  }
  // With whole experts (expert TP 1) the EP group is tp x ep/tp consecutive
  // ranks ("tp-ep") and the routing's token order runs over tp x dp (each TP
  // rank routes its own rows, in rank order: a replica's rows, tp ranks inside).
  parallel::ModelGroups groups{&ctx.group("tp"), par.ep > 1 ? &ctx.group(par.ep_dims()) : nullptr,
                               !p.plan.global_routing ? nullptr
                               : par.experts_whole()  ? &ctx.group("tp-dp")
                                                      : &data_group()};
  if (groups.ep && par.moe_dispatcher == parallel::MoeDispatcher::kDeepEp) {
    // train() checked the layout (check_moe_dispatcher)
    const std::vector<int>& ep = groups.ep->members();
    const int L = parallel::ep_nodes(ep, dev.profile().devices_per_node).per_node;
    groups.ep_node = &ctx.group(parallel::ep_node_members(ep, L, dev.rank()), "ep-node");
    groups.ep_rail = &ctx.group(parallel::ep_rail_members(ep, L, dev.rank()), "ep-rail");
  }
  parallel::ShardedOptions so;
  so.sequence_parallel = par.sp;
  so.tp_comm_overlap = par.tp_comm_overlap;
  so.ep_comm_overlap = par.overlap_moe_comm;
  so.delay_wgrad = par.delay_wgrad;
  so.scatter_gather = par.scatter_gather;
  so.recompute = par.recompute;
  so.recompute_modules = par.recompute_modules;
  so.recompute_method = par.recompute_method;
  so.recompute_num_layers = par.recompute_num_layers;
  so.phantom_zipf = o.phantom_zipf;
  so.experts_whole = par.experts_whole();
  so.table = &p.table;
  so.placement = p.plan.placement(coords.pp);
  if (par.cp > 1) {
    cp_attention = std::make_unique<parallel::CpAttention>(
        ctx.group("cp"), par.cp_comm, coords.tp, parallel::fused_attention(par.attention, o.model.is_llama()));
    cp_attention->fold(dev, ctx.mesh());  // a folded run: the ring's sends for the members this device plays
    so.attention = cp_attention.get();
    so.cp = par.cp;
    so.cp_rank = coords.cp;
  } else if (parallel::fused_attention(par.attention, o.model.is_llama())) {
    fused_attention = std::make_unique<parallel::FusedAttention>();
    so.attention = fused_attention.get();
    so.flash = true;
  }
  auto m = std::make_unique<parallel::ShardedGPT>(o.model, o.seed, dev, groups, so);
  m->set_micro_batch(int(rows), T);
  stage = m.get();
  model = std::move(m);
}

void DeviceSetup::make_data_parallel(const DeviceProgram& p, Device& dev) {
  const ParallelOptions& par = p.options.parallel;
  const parallel::DataParallelOptions dpo{uint64_t(par.bucket_mb * 1e6), par.overlap, par.zero,
                                          p.plan.tied_bucket(model->shards()), par.half_grads,
                                          par.overlap_param_gather, par.grad_reduce_bf16,
                                          par.distributed_optimizer};
  parallel::DataParallel::ExpertGrads expert_grads;
  if (par.ep > 1) expert_grads = {&ctx.group(par.cp > 1 ? "cp-edp" : "edp"), parallel::expert_ranges(model->shards())};
  const coll::ProcessGroup& dp_group = data_group();
  const bool hybrid = par.hsdp > 0 && par.hsdp < par.dp;
  const coll::ProcessGroup& shards = hybrid ? ctx.group(hsdp_members(dp_group, par.hsdp, true), "hsdp-shard") : dp_group;
  if (par.zero == 3) {
    dp.emplace(dev, shards, model->grads(),
               parallel::fsdp_bucket_plan(parallel::fsdp_units(model->shards(), p.options.model.n_layer),
                                          expert_grads.ranges),
               dpo, expert_grads);
    if (hybrid) dp->set_replicas(ctx.group(hsdp_members(dp_group, par.hsdp, false), "hsdp-replicas"));
  } else if (par.chunk_buckets) {
    dp.emplace(dev, dp_group, model->grads(),
               parallel::chunk_bucket_plan(
                   model->shards(),
                   [place = p.plan.placement(coords.pp)](const parallel::ShardSpec& s) { return model_chunk_of(place, s); },
                   expert_grads.ranges, dpo.alone),
               dpo, expert_grads);
  } else {
    dp.emplace(dev, dp_group, model->grads(), parallel::backward_ready_order(model->shards()), dpo,
               expert_grads);
  }
  sink.on_grads_ready([this](int64_t off, int64_t cnt) { dp->grads_ready(off, cnt); });
  sink.on_grads_partial([this](int64_t off, int64_t cnt) { dp->grads_partial(off, cnt); });
  sink.set_copy_grads(dp->reduces_each_micro_batch() && shards.size() > 1);  // reduced every micro-batch
  // Reduced once, at the step's end (ZeRO-2/3): the tied wte when a
  // pipeline holds two copies (announced after the last backward, its
  // copies summed after this reduction: device_program.cc), and Llama K/V
  // ranges summed over TP when final.
  if (dp->reduces_each_micro_batch()) {
    std::vector<Range> final_only;
    if (auto* sharded = dynamic_cast<parallel::ShardedGPT*>(model.get())) final_only = sharded->tp_summed();
    if (const Range wte = p.plan.tied_bucket(model->shards()); !wte.empty()) final_only.push_back(wte);
    dp->set_final_only(final_only);
  }
  sink.set_grad_bytes(dp->grad_bytes());
  sink.on_average([this, &dev, &dp_group](float* data, int64_t cnt) {
    if (dp_group.size() == 1) return false;
    coll::all_reduce(dev, dp_group, coll::Buffer(data, size_t(cnt)), coll::ReduceOp::kAvg);
    return true;
  });
}

// ZeRO-3: the units gathered around every hook point of the sharded model
// (runs_sharded), the non-owned parameters dropped (poisoned) from here on.
void DeviceSetup::make_fsdp(const DeviceProgram& p, Device& dev) {
  const int L = p.options.model.n_layer;
  std::vector<parallel::FsdpUnit> units = parallel::fsdp_units(model->shards(), L);
  parallel::FsdpPasses passes =
      parallel::fsdp_passes(parallel::hook_chunks(stage->placement()), units, model->shards(), L);
  const parallel::FsdpOptions fo{p.options.parallel.reshard_after_forward, p.options.parallel.prefetch};
  fsdp.emplace(dev, *dp, model->params(), std::move(units), std::move(passes), fo);
  auto* sharded = dynamic_cast<parallel::ShardedGPT*>(model.get());
  SHARDLAB_CHECK(sharded, "ZeRO-3 runs the sharded model");
  sharded->set_hooks(&*fsdp);
  fsdp->shard();
}

// ZeRO 1/2 with --overlap-param-gather: the optimizer step leaves the
// parameters' all-gathers to the next forward's hook points.
void DeviceSetup::make_param_gather(const DeviceProgram& p, Device& dev) {
  const int L = p.options.model.n_layer;
  const std::vector<parallel::FsdpUnit> units = parallel::fsdp_units(model->shards(), L);
  const parallel::FsdpPasses passes =
      parallel::fsdp_passes(parallel::hook_chunks(stage->placement()), units, model->shards(), L);
  param_gather.emplace(dev, *dp, model->params(), units, passes, coords.pp, p.options.parallel.pp);
  auto* sharded = dynamic_cast<parallel::ShardedGPT*>(model.get());
  SHARDLAB_CHECK(sharded, "overlapped parameter gathers run the sharded model");
  sharded->set_hooks(&*param_gather);
}

int64_t DeviceSetup::first_row(int mb) const {
  return mb * (rows * ctx.mesh().shape().dp) + coords.dp * rows;
}

}  // namespace shardlab::train
