// The parallel configuration's checks before any thread starts
// (validate_parallel), the two questions they and train() ask of it (which
// model runs: runs_sharded; which schedule: step_schedule), and the plan
// that holds the answers once (parallel_plan.h).
#include "model/train/parallel_plan.h"

#include <algorithm>
#include <string>

#include <fmt/format.h>

#include "model/params.h"
#include "model/parallel/attention_kernel.h"
#include "model/parallel/config_check.h"
#include "model/parallel/expert/moe.h"
#include "model/train/preflight.h"
#include "runtime/errors.h"
#include "runtime/profile.h"
#include "runtime/require.h"

namespace shardlab::train {

namespace {

// --cp: two chunks of every sequence on each cp rank, and what it does not compose with.
void validate_context_parallel(const TrainOptions& o) {
  const ParallelOptions& p = o.parallel;
  const int T = o.model.block_size;
  require(p.cp > 1 || p.cp_comm == parallel::CpComm::kRing, "`cp_comm` allgather needs `cp` > 1");
  if (p.cp == 1) return;
  require(T % (2 * p.cp) == 0,
          fmt::format("`block_size` {} is not divisible by 2 x `cp` {} (two chunks per cp rank)", T, p.cp));
  require(!p.sp || (T / p.cp) % p.tp == 0,
          fmt::format("`block_size` {} / `cp` {} is not divisible by `tp` {} with `sp`", T, p.cp, p.tp));
  require(!(o.model.is_moe() && o.model.capacity_factor > 0),
          "`cp` with `capacity_factor` is not supported (capacity drops follow the unsharded token order)");
  require(o.checkpoint_dir.empty() && o.resume_dir.empty(),
          "`cp` with `checkpoint_dir` or `resume_dir` is not supported");
  require(p.hsdp == 0, "`cp` with `hsdp` is not supported");
}

// MoE routing over the data ranks (ParallelPlan::global_routing), where the
// unsharded model's result depends on every replica's counts: a capacity
// (drops follow the global token order), or, under expert parallelism, a
// load-balancing loss (f_i of the global micro-batch; without ep the
// replicas average f_i instead, OpSink::average_over_replicas). Without
// either (DeepSeek-V3: dropless, aux-loss-free) each replica routes its own
// tokens, as Megatron-core does: no collective over dp per micro-batch.
bool routes_globally(const TrainOptions& o) {
  const ParallelOptions& p = o.parallel;
  const model::GPTConfig& m = o.model;
  // With whole experts the TP ranks route different rows too.
  return m.is_moe() && (p.data_ranks() > 1 || p.experts_whole()) &&
         (m.capacity_factor > 0 || (p.ep > 1 && m.aux_coef != 0));
}

// Whether every data rank of a phantom run routes alike (FoldInput::
// routes_alike). A dense model has nothing to route. An MoE model's phantom
// routing is a function of the shapes alone (expert/moe.cc), unless a
// capacity is counted over the data ranks: its drops follow the global token
// order, so each rank drops others (dp 16 with 6 experts, top-1, capacity 1
// folded onto dp rank 0 reported its imbalance, 1.5, for every rank, where
// the unfolded run has 1.22; found by tools/fuzz_configs.py --mode fold).
// Under expert parallelism the ep ranks hold different experts, so each must
// also get the same rows: uniform routing (expert/moe.cc phantom_route) of N
// local tokens must give every expert the same rows (checked on its plan;
// with sequence parallelism, of N/tp tokens too). Then the ep ranks differ
// in which experts they hold, not in rows, bytes or kernels
// (model/engine/fold.h).
bool routes_alike(const TrainOptions& o) {
  const ParallelOptions& p = o.parallel;
  const model::GPTConfig& m = o.model;
  if (!m.is_moe()) return true;
  if (!o.phantom || (routes_globally(o) && m.capacity_factor > 0)) return false;
  if (p.ep == 1) return true;
  if (o.phantom_zipf > 0) return false;
  const int64_t rows = m.batch_size / (int64_t{o.micro_batches} * p.dp), N = rows * (m.block_size / p.cp);
  const auto balanced = [&](int64_t n) {
    const parallel::PhantomPlan plan = parallel::plan_phantom_routing(n, m.n_expert, m.top_k, 0, 0, m.moe_groups,
                                                                      m.moe_group_top_k);
    return std::all_of(plan.filled.begin(), plan.filled.end(), [&](int64_t f) { return f == plan.filled[0]; });
  };
  return balanced(N) && (!p.sp || balanced(N / p.tp));
}

}  // namespace

void validate_parallel(const TrainOptions& o) {
  const ParallelOptions& p = o.parallel;
  const model::GPTConfig& m = o.model;
  require(p.dp >= 1, fmt::format("`dp` must be at least 1 (got {})", p.dp));
  require(p.tp >= 1, fmt::format("`tp` must be at least 1 (got {})", p.tp));
  require(p.pp >= 1, fmt::format("`pp` must be at least 1 (got {})", p.pp));
  require(p.cp >= 1, fmt::format("`cp` must be at least 1 (got {})", p.cp));
  // Each degree may be up to 2^31: their product is taken in floating point.
  const double devices = double(p.dp) * p.tp * p.pp * p.cp;
  require(devices <= double(kMaxDevices), fmt::format("`dp` {} x `tp` {} x `pp` {} x `cp` {} = {} devices: at most {}",
                                                      p.dp, p.tp, p.pp, p.cp, devices, kMaxDevices));
  require(p.zero >= 0 && p.zero <= 3, fmt::format("`zero` must be 0, 1, 2 or 3 (got {})", p.zero));
  require(!p.distributed_optimizer || p.zero == 1,
          fmt::format("`distributed_optimizer` is ZeRO 1's memory with reduce-scattered gradients: it needs `zero` 1 "
                      "(got {}; `zero` 2 reduce-scatters already and holds only its chunks)",
                      p.zero));
  require(p.zero == 3 || p.reshard_after_forward, "`reshard_after_forward = false` needs `zero` 3");
  require(!p.overlap_param_gather || p.zero == 1 || p.zero == 2,
          fmt::format("`overlap_param_gather` defers ZeRO 1 and 2's parameter all-gathers: it needs `zero` 1 or 2 "
                      "(got {})", p.zero));
  require(!p.overlap_param_gather || p.overlap,
          "`overlap_param_gather` cannot run with `overlap = false` (Megatron asserts the gradient reduction "
          "overlapped too)");
  require(!p.grad_reduce_bf16 || !p.half_grads,
          "`grad_reduce_bf16` cannot run with the 2021 code's half-precision gradients (ParallelOptions::half_grads, "
          "library only): both set the gradients' precision");
  // FlashAttention-2/3 (the fused kernel this models) take head dimensions up to 256.
  constexpr int kFusedMaxHeadDim = 256;
  require(!parallel::fused_attention(p.attention, m.is_llama()) || m.qk_head_size() <= kFusedMaxHeadDim,
          fmt::format("`attention` fused{}: the fused kernel takes head dimensions up to {}, this model's is {} "
                      "(use `attention` unfused)",
                      p.attention == parallel::AttentionKernel::kAuto ? " (the llama family's default)" : "",
                      kFusedMaxHeadDim, m.qk_head_size()));
  require(p.zero == 3 || p.prefetch, "`prefetch = false` needs `zero` 3");
  // Megatron's recompute_method and recompute_num_layers go with recompute_granularity full.
  const bool layers_set = p.recompute_num_layers != 0 || p.recompute_method == parallel::RecomputeMethod::kBlock;
  require(!layers_set || p.recompute == parallel::Recompute::kFull,
          fmt::format("`recompute_method` {} with `recompute_num_layers` {} choose the blocks full recomputation "
                      "re-runs: they need `recompute` full (got {})",
                      parallel::recompute_method_name(p.recompute_method), p.recompute_num_layers,
                      parallel::recompute_name(p.recompute)));
  require(p.recompute_method != parallel::RecomputeMethod::kBlock || p.recompute_num_layers > 0,
          "`recompute_method` block re-runs the first `recompute_num_layers` blocks of each stage: give "
          "`recompute_num_layers`");
  if (layers_set) {
    const int per_rank = m.n_layer / std::max(1, p.pp);
    require(p.recompute_num_layers >= 1 && p.recompute_num_layers <= per_rank,
            fmt::format("`recompute_num_layers` {} must be between 1 and the blocks of a pipeline rank, "
                        "`n_layer` {} / `pp` {} = {}",
                        p.recompute_num_layers, m.n_layer, p.pp, per_rank));
    require(p.zero != 3 || p.recompute_method == parallel::RecomputeMethod::kBlock || p.recompute_num_layers == 1,
            fmt::format("`recompute_method` uniform with `recompute_num_layers` {} re-runs a group's blocks at its last "
                        "block's backward, before ZeRO 3 gathers their parameters: not supported with `zero` 3",
                        p.recompute_num_layers));
  }
  // Megatron's recompute_modules go with recompute_granularity selective.
  const unsigned rm = p.recompute_modules;
  const std::string rm_name = parallel::recompute_modules_name(rm);
  require(p.recompute == parallel::Recompute::kSelective || rm == parallel::kRecomputeCoreAttn,
          fmt::format("`recompute_modules` {} chooses what selective recomputation re-runs: it needs `recompute` "
                      "selective (got {})",
                      rm_name.empty() ? "(none)" : rm_name, parallel::recompute_name(p.recompute)));
  if (p.recompute == parallel::Recompute::kSelective) {
    require(rm <= parallel::kRecomputeModulesAll,
            fmt::format("`recompute_modules` {:#x}: not a mask of parallel::RecomputeModule", rm));
    const unsigned moe_only = parallel::kRecomputeLayerNorm | parallel::kRecomputeMoe | parallel::kRecomputeMoeAct |
                              parallel::kRecomputeSharedExperts;
    require(!(rm & moe_only) || m.is_moe(),
            fmt::format("`recompute_modules` {}: {} re-runs part of an MoE layer and this model has none",
                        rm_name, parallel::recompute_modules_name(rm & moe_only)));
    require(!(rm & parallel::kRecomputeSharedExperts) || m.n_shared_expert > 0,
            fmt::format("`recompute_modules` {}: shared_experts, and this model has no shared expert", rm_name));
    require(!(rm & parallel::kRecomputeMlaUpProj) || m.is_mla(),
            fmt::format("`recompute_modules` {}: mla_up_proj re-runs multi-head latent attention's up-projections, "
                        "and this model's attention is not MLA (`kv_lora_rank` 0)",
                        rm_name));
    require(!(rm & parallel::kRecomputeMlp) || m.has_dense_layer(),
            fmt::format("`recompute_modules` {}: mlp re-runs a dense block's MLP, and every block of this model is "
                        "MoE (use moe or moe_act)",
                        rm_name));
  }
  require(p.hsdp == 0 || p.hsdp >= 2, fmt::format("`hsdp` must be at least 2 (got {})", p.hsdp));
  require(p.hsdp == 0 || p.zero == 3, "`hsdp` needs `zero` 3");
  require(p.hsdp == 0 || p.dp % p.hsdp == 0, fmt::format("`hsdp` {} must divide `dp` {}", p.hsdp, p.dp));
  require(p.hsdp == 0 || p.ep == 1, "`hsdp` with `ep` > 1 is not supported (expert units shard over edp)");
  require(p.moe_dispatcher == parallel::MoeDispatcher::kAllToAll || (m.is_moe() && p.ep > 1),
          "`moe_dispatcher` deepep moves tokens between expert-parallel ranks: it needs an MoE model and `ep` > 1");
  require(p.bucket_mb > 0, "`bucket_mb` must be positive");
  require(!p.chunk_buckets || p.zero != 3, "`chunk_buckets` is for `zero` 0, 1 or 2 (ZeRO-3's buckets are its units)");
  require(m.batch_size % p.dp == 0,
          fmt::format("`batch_size` {} is not divisible by `dp` {}", m.batch_size, p.dp));
  require(m.batch_size % (o.micro_batches * p.dp) == 0,
          fmt::format("`batch_size` {} is not divisible by `micro_batches` {} x `dp` {}", m.batch_size,
                      o.micro_batches, p.dp));
  require(m.dropout >= 0 && m.dropout < 1, fmt::format("`dropout` must be in [0, 1) (got {})", m.dropout));
  require(m.dropout == 0 || o.phantom,
          "`dropout` is modeled in time only (its kernels are charged, not computed): it needs `phantom`");
  require(!p.tp_comm_overlap || (p.sp && p.tp > 1),
          fmt::format("`tp_comm_overlap` overlaps the sequence-parallel collectives: it needs `sp` and `tp` > 1 "
                      "(got sp {}, tp {})", p.sp, p.tp));
  require(p.overlap_p2p_comm || p.pp > 1,
          "`overlap_p2p_comm` is about the pipeline's sends: it needs `pp` > 1");
  require(!p.scatter_gather || !p.sp, "`scatter_gather` is for runs without `sp` (SP already sends 1/tp)");
  require(!p.delay_wgrad || p.overlap_moe_comm,
          "`delay_wgrad` defers the experts' weight gradients of a combined step: it needs `overlap_moe_comm` "
          "(as Megatron)");
  if (p.overlap_moe_comm) {  // Megatron's rules (transformer_config.py), and what is modeled
    require(m.is_moe() && p.ep > 1,
            "`overlap_moe_comm` hides the expert-parallel token exchanges: it needs an MoE model and `ep` > 1");
    require(p.pp == 1 ? p.chunks() == 1 : p.schedule == parallel::ScheduleKind::kInterleaved,
            p.pp == 1 ? "`overlap_moe_comm` with `pp` 1 runs one model chunk (Megatron's combined schedule without a "
                        "pipeline); drop `vpp`"
                      : "`overlap_moe_comm` with `pp` > 1 needs `schedule` interleaved (Megatron pairs a forward "
                        "and a backward in its steady state and needs virtual stages)");
    require(!p.custom_schedule, "`overlap_moe_comm` builds Megatron's combined schedule: not with a custom schedule");
    require(p.recompute != parallel::Recompute::kFull && !(p.recompute_modules & parallel::kRecomputeMoe),
            "`overlap_moe_comm` does not run with full recomputation or with moe in `recompute_modules` (Megatron "
            "refuses both)");
    require(p.zero != 3, "`overlap_moe_comm` with `zero` 3 is not supported (FSDP's gathers follow one pass)");
    require(p.cp == 1, "`overlap_moe_comm` with `cp` > 1 is not supported");
  }
  parallel::check_pipeline_config(p.schedule, p.pp, o.micro_batches, p.chunks());
  validate_context_parallel(o);
  parallel::check_parallel_shape(
      m, {p.tp, p.sp, p.pp, p.chunks(), p.stage_layers, p.ep, p.dp, p.expert_tp});
  require(!p.experts_whole() || p.cp == 1,
          "`expert_tp` 1 with `cp` > 1 is not supported yet (the expert-parallel "
          "group would span context-parallel ranks)");
  require(!p.experts_whole() || p.hsdp == 0, "`expert_tp` 1 with `hsdp` is not supported");
  if (p.custom_schedule) {
    require(int(p.custom_schedule->size()) == p.pp,
            fmt::format("the custom schedule has {} ranks but `pp` is {}", p.custom_schedule->size(), p.pp));
    const std::string fault = parallel::validate_schedule(*p.custom_schedule, o.micro_batches, p.chunks(), p.custom_order);
    require(fault.empty(), "invalid custom schedule: " + fault);
    bool split = false;
    for (const auto& actions : *p.custom_schedule)
      for (const parallel::Action& a : actions) split = split || a.kind == parallel::ActionKind::kBackwardWeight;
    require(!split || runs_sharded(o),
            "a schedule with separate weight-gradient (W) actions needs the sharded model (`tp`, `pp` or `ep` > 1)");
  }
}

bool runs_sharded(const TrainOptions& o, Precision precision) {
  const ParallelOptions& p = o.parallel;
  const bool global_routing = routes_globally(o);
  const bool split_backward = !p.custom_schedule && parallel::splits_backward(p.schedule);  // B and W apart
  // The unsharded reference (model/gpt.h) charges BF16 linears and the
  // unfused attention kernels only: a run that charges FP8 GEMMs or the fused
  // kernel runs the sharded model, at tp = 1 its kernels the reference's
  // (FusedAttention's host math is LocalAttention's, the FP8 linears'
  // math stays fp32).
  // So does a run with other fusions than the default (the reference's kernels are its own).
  const bool modern_kernels = precision == Precision::kFp8 ||
                              parallel::fused_attention(p.attention, o.model.is_llama()) ||
                              !(p.fusions == model::KernelFusions{});
  // Model chunks hand activations between them even on one rank (interleaved
  // with pp 1), and the unsharded reference holds one micro-batch's
  // activations at a time (gpipe with pp 1 runs every forward first).
  // (Built only for one plain rank: other layouts are sharded already.)
  const auto holds_several = [&] {
    return p.pp == 1 && p.chunks() == 1 && o.micro_batches > 1 && parallel::peak_in_flight(step_schedule(o))[0] > 1;
  };
  return p.pp > 1 || p.chunks() > 1 || p.tp > 1 || p.cp > 1 || p.ep > 1 || global_routing || p.recompute != parallel::Recompute::kNone || p.zero == 3 ||
         p.overlap_param_gather ||
         split_backward || modern_kernels || o.phantom ||  // the unsharded reference computes on real buffers
         holds_several();
}

parallel::Schedule step_schedule(const TrainOptions& o) {
  const ParallelOptions& p = o.parallel;
  if (p.custom_schedule) return *p.custom_schedule;
  if (p.overlap_moe_comm) return parallel::combined_1f1b(p.pp, o.micro_batches, p.chunks());
  return parallel::build_schedule(p.schedule, p.pp, o.micro_batches, p.chunks());
}

// Every check (TrainOptions::validate) runs before the mesh is built, so a
// bad size is the error naming its field, not a failed mesh.
ParallelPlan::ParallelPlan(const TrainOptions& o, Precision precision)
    : mesh((o.validate(), o.parallel.mesh_shape())) {
  const ParallelOptions& p = o.parallel;
  world = mesh.size();
  global_routing = routes_globally(o);
  sharded = runs_sharded(o, precision);
  schedule = step_schedule(o);
  folds = o.phantom && o.fold;
  pp_ = p.pp;
  vpp_ = p.chunks();
  order_ = p.stage_order();
  stage_layers_ = parallel::StagePlacement{p.pp, p.chunks(), 0, p.stage_layers, order_}.resolved(o.model).stage_layers;
  tied_copies = sharded && o.model.tied() && p.last_stage_rank() != 0;
  embedding_ = model::embedding_name(o.model);
  fold = {p.mesh_shape(), folds && uneven_chunks(o, *this), o.model.is_moe(), routes_alike(o),
          p.cp_comm == parallel::CpComm::kAllGather};
}

Range ParallelPlan::tied_bucket(const std::vector<parallel::ShardSpec>& shards) const {
  return tied_copies ? model::prefix_range(shards, embedding_) : Range{};
}

int model_chunk_of(const parallel::StagePlacement& place, const parallel::ShardSpec& s) {
  const bool tail = s.is_final_norm() || s.role == model::ParamRole::kLmHead || !place.holds_first();
  for (int c = 0; c < place.vpp; ++c) {
    const bool held = s.layer >= 0 ? place.first_layer(c) <= s.layer && s.layer < place.end_layer(c)
                      : tail      ? place.last(c)
                                  : place.first(c);
    if (held) return c;
  }
  SHARDLAB_CHECK(false, "a tensor in no model chunk of its pipeline rank");
  return -1;
}

}  // namespace shardlab::train
