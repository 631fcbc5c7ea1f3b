// The training loop on the virtual cluster.
//
// train() runs one SPMD program: every device builds its part of the model in
// its arena, draws its rows of each step's global batch, runs forward and
// backward (every kernel charging the cost model on the compute stream), clips
// the global gradient norm and takes an AdamW step. Every run goes through
// the pipeline executor: the unsharded model (verify's reference, pure data
// parallelism) as one stage with forward, backward per micro-batch (gradient
// accumulation); every sharded model (TP, PP, EP and their products) as a
// parallel::ShardedGPT driven by its rank's schedule actions; data
// parallelism (buckets, ZeRO) over the dp group and expert gradients over edp
// (device_program.h says which file does what).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "collectives/mesh.h"
#include "model/arithmetic.h"
#include "model/config.h"
#include "model/fusions.h"
#include "model/io/data.h"
#include "model/optimizer.h"
#include "model/parallel/context/cp_comm.h"
#include "model/parallel/pipeline/executor.h"
#include "model/parallel/attention_kernel.h"
#include "model/parallel/expert/ep_node_dispatch.h"
#include "model/parallel/recompute.h"
#include "model/parallel/pipeline/schedule.h"
#include "runtime/cluster.h"
#include "runtime/range.h"

namespace shardlab::train {

enum class LrSchedule { kConstant, kCosine };
LrSchedule parse_lr_schedule(const std::string& text);  // ConfigError on anything else
const char* lr_schedule_name(LrSchedule s);

// How the model is spread over the devices.
struct ParallelOptions {
  int dp = 1;                 // data parallel
  int tp = 1;                 // tensor parallel (Megatron)
  bool sp = false;            // sequence parallelism (with tp)
  // With sp: Transformer Engine's userbuffers overlap (NeMo's
  // ub_tp_comm_overlap): the blocks' all-gathers and reduce-scatters
  // pipelined with their GEMMs (parallel/tensor/mappings.h). Time only.
  bool tp_comm_overlap = false;
  // Megatron's --overlap-moe-expert-parallel-comm: its combined 1F1B
  // schedule (pp 1, or pp > 1 interleaved; schedule.h combined_1f1b), each
  // steady forward and another micro-batch's backward run as one step,
  // interleaved at every MoE token exchange, the exchanges on an EP
  // communication stream (Action::paired in the executor,
  // ShardedOptions::ep_comm_overlap). The math is the same.
  bool overlap_moe_comm = false;
  // Megatron's --delay-wgrad-compute (needs overlap_moe_comm): a combined
  // step's expert weight gradients run after the backward's dispatch
  // exchange is posted, beside it (ShardedOptions::delay_wgrad).
  bool delay_wgrad = false;
  // Megatron's overlap_p2p_comm. True (the default): the pipeline's sends
  // leave when their tensor exists and the compute stream never waits for
  // them, only for a receive's arrival (PipelineExecutor). False: the compute
  // stream also waits for each send to leave, as Megatron's batched
  // isend/irecv with every request waited (`batch_p2p_comm`, what the
  // interleaved schedule runs without overlap_p2p_comm and what the
  // non-interleaved 1F1B always runs).
  bool overlap_p2p_comm = true;
  // Without SP, with tp and pp: Megatron-LM's scatter/gather of activations
  // between stages (each TP rank sends 1/tp, an all-gather over the TP group
  // reassembles them; ShardedOptions::scatter_gather).
  bool scatter_gather = false;
  int zero = 0;               // ZeRO stage 0, 1, 2 or 3 (FSDP) over dp
  // With zero 1: Megatron's distributed optimizer (--use-distributed-
  // optimizer): ZeRO-1's memory (every gradient held, in one buffer) with the
  // gradients reduce-scattered once per step, as --zero 2 does (ZeRO-1 alone
  // all-reduces them, as DeepSpeed's stage 1 does).
  bool distributed_optimizer = false;
  // The gradients are reduce-scattered (each dp rank reduces its own chunks).
  bool reduce_scatters_grads() const { return zero >= 2 || (zero == 1 && distributed_optimizer); }
  bool reshard_after_forward = true;  // ZeRO-3: free each unit after its forward
  bool prefetch = true;       // ZeRO-3: gather the next unit during this one
  // ZeRO 1/2: Megatron's --overlap-param-gather. The optimizer step leaves
  // the updated parameters' all-gathers to the next forward, each bucket
  // gathered before its first use (parallel/data/param_gather.h).
  bool overlap_param_gather = false;
  // Megatron's --grad-reduce-in-bf16 (grad_reduce_in_fp32 = False; Apex's
  // grad_sync_dtype=bf16): the main gradients are kept, accumulated and
  // reduced in bf16, 2 bytes each instead of fp32's 4, and the optimizer
  // casts its chunk to fp32 first. Mixed precision only; modeled, the
  // host's math stays fp32.
  bool grad_reduce_bf16 = false;
  // ZeRO-3 hybrid sharding (HSDP): shard over groups of this many
  // consecutive dp ranks, replicate across them; 0: shard over all of dp.
  int hsdp = 0;
  // The ranks one ZeRO chunk is split over: hsdp, else dp (× cp).
  int shard_size() const { return hsdp > 0 ? hsdp : dp * cp; }
  double bucket_mb = 25;      // DP gradient bucket, MB (1e6 modeled bytes)
  // ZeRO 0-2: one bucket per model chunk, bucket_mb ignored (Megatron-core's
  // disable_bucketing, parallel::chunk_bucket_plan): each chunk's gradients
  // reduced, and its parameters gathered, in one collective.
  bool chunk_buckets = false;
  bool overlap = true;        // reduce buckets during backward
  // Mixed precision: the wgrad GEMMs accumulate into the fp32 main gradients
  // (Megatron-LM's --gradient-accumulation-fusion, 2022). Off: every
  // micro-batch's gradients are added into them by a separate kernel, 10
  // bytes per parameter in bf16 (Megatron-LM 2021; engine::DeviceSink).
  bool grad_accum_fusion = true;
  // Megatron-LM 2021 in fp16 (the sc21 scripts: --fp16, no
  // --accumulate-allreduce-grads-in-fp32, no contiguous DDP buffers): the
  // gradients stay in the model's half precision until the optimizer step.
  // Charged in mixed precision only, with dp > 1 for DDP's part:
  //  - autograd keeps a parameter's first gradient of the step and adds each
  //    later micro-batch's into it, 2 + 2 + 2 = 6 B/param (instead of
  //    grad_accum_fusion's fp32 accumulation; engine::DeviceSink);
  //  - the data-parallel all-reduce moves 2 B per gradient; local DDP (no
  //    overlap) flattens, divides and unflattens them (12 B/param), torch DDP
  //    copies them into its buckets with the division and back (8 B/param);
  //  - the optimizer copies them into fp32 main gradients (6 B/param),
  //    unscales them and checks for inf/nan (8 B/param, then a 1-element
  //    all-reduce over the model-parallel ranks), AdamW reads and writes fp32
  //    master weights and moments (28 B/param) and the updated master weights
  //    are copied into the model (6 B/param).
  bool half_grads = false;
  // Which element-wise chains are charged fused (model/fusions.h; the math
  // is the same). fusions.cross_entropy off: Megatron-LM's
  // vocab_parallel_cross_entropy as it ran until its
  // --cross-entropy-loss-fusion (2024): the logits cast to fp32, then max,
  // subtract, exp, sum, divide and, in the backward, the scale and the cast
  // back as separate kernels, 52 B per logit in bf16 (38 + 14) where the
  // fused kernel moves 10 (parallel/tensor/embedding.h).
  model::KernelFusions fusions;
  int ep = 1;                 // expert parallel (divides dp): E/ep experts per rank
  // Expert tensor parallelism (Megatron's --expert-tensor-parallel-size): 0
  // (or tp), every expert split over the TP group like the dense MLP and
  // the EP group drawn from dp; 1, every expert whole on its rank, the EP
  // group drawn from tp x dp (tp fastest: ep a multiple of tp dividing
  // tp x dp), each TP rank routing its own sequence-parallel rows (needs sp).
  int expert_tp = 0;
  bool experts_whole() const { return expert_tp == 1 && tp > 1; }
  // The mesh's ep factor (of dp): with whole experts the EP group is the
  // mesh's "tp-ep" group, tp x ep/tp ranks; ep_dims() names it.
  int mesh_ep() const { return experts_whole() ? ep / tp : ep; }
  const char* ep_dims() const { return experts_whole() ? "tp-ep" : "ep"; }
  // How the tokens reach their experts across nodes: Megatron's all-to-all
  // (one row per token and expert) or DeepEP's (a token crosses to each
  // node once; parallel/expert/ep_node_dispatch.h). Needs ep > 1.
  parallel::MoeDispatcher moe_dispatcher = parallel::MoeDispatcher::kAllToAll;
  int pp = 1;                 // pipeline stages (ranks)
  // Context parallelism: every sequence split over cp ranks (chunks i and
  // 2cp−1−i of 2cp on cp rank i), attention by ring or all-gather of K/V
  // (parallel/context/cp_attention.h); gradients reduced over dp × cp.
  int cp = 1;
  parallel::CpComm cp_comm = parallel::CpComm::kRing;
  // The ranks that reduce the replicated weights' gradients: dp × cp.
  int data_ranks() const { return dp * cp; }
  parallel::ScheduleKind schedule = parallel::ScheduleKind::k1F1B;
  // Model chunks per pipeline rank; 0: the schedule's own (chunks()).
  int vpp = 0;
  std::vector<int> stage_layers;  // blocks per virtual stage; empty = balanced
  parallel::Recompute recompute = parallel::Recompute::kNone;  // activation recomputation
  // What kSelective re-runs (parallel::RecomputeModule, Megatron's
  // --recompute-modules); the attention core by default.
  unsigned recompute_modules = parallel::kRecomputeCoreAttn;
  // Which blocks kFull re-runs (Megatron's --recompute-method, --recompute-num-layers):
  // 0 layers, uniform: every block alone (as uniform 1).
  parallel::RecomputeMethod recompute_method = parallel::RecomputeMethod::kUniform;
  int recompute_num_layers = 0;
  parallel::AttentionKernel attention = parallel::AttentionKernel::kAuto;  // --attention
  // Library users: run these action lists (one per pipeline rank, schedules
  // as data) instead of `schedule`. validate_parallel checks them
  // (validate_schedule) before any thread starts.
  std::optional<parallel::Schedule> custom_schedule;
  // Where a custom schedule's chunks sit (the built-in ones know their own).
  parallel::StageOrder custom_order = parallel::StageOrder::kLoop;
  parallel::StageOrder stage_order() const {
    return custom_schedule ? custom_order : parallel::stage_order(schedule);
  }
  // The model chunks per pipeline rank: vpp, or when it is 0 the schedule's
  // own: 2 in a V (zb-v, dualpipev), else 1 (interleaved needs vpp 2 or more).
  int chunks() const { return vpp > 0 ? vpp : stage_order() == parallel::StageOrder::kV ? 2 : 1; }
  // The pipeline rank holding the last stage (the head and the second use of
  // the tied wte): pp - 1 in a loop, 0 in a V.
  int last_stage_rank() const { return parallel::rank_of_stage(stage_order(), pp, pp * chunks() - 1); }
  int world() const { return dp * tp * cp * pp; }
  // The mesh of the collectives issue: tp fastest, then cp, ep, dp, pp (Megatron's tp-cp-ep-dp-pp).
  collectives::MeshShape mesh_shape() const {
    return {.tp = tp, .cp = cp, .ep = mesh_ep(), .dp = dp, .pp = pp};
  }
};

struct TrainOptions {
  model::GPTConfig model;       // batch_size is the global batch (sequences)
  ParallelOptions parallel;
  // Gradient accumulation: the global batch runs as M micro-batches of
  // batch/M rows (rows [m·B/M, (m+1)·B/M), each split over dp), the loss is
  // the mean of their losses. The unsharded reference of verify keeps M.
  int micro_batches = 1;
  int steps = 100;
  uint64_t seed = 1337;
  model::AdamWHyper adam;
  double grad_clip = 1.0;       // global norm; 0 = off
  int warmup_steps = 0;
  LrSchedule lr_schedule = LrSchedule::kConstant;
  // The cosine schedule's length (0: `steps`): a run stopped early on a
  // longer run's schedule takes that run's first steps exactly (verify's
  // re-run to a routing divergence).
  int schedule_steps = 0;
  std::string data = "synthetic:markov";
  model::Sampling sampling = model::Sampling::kRandom;
  std::string init_path;        // --init FILE.safetensors
  std::string save_path;        // --save FILE.safetensors
  // Sharded checkpoints (model/train/checkpoint.h): into checkpoint_dir every
  // checkpoint_every steps (0: only after the last step) and after the last
  // step; resume_dir: continue from its latest checkpoint (`steps` stays the
  // total step count).
  std::string checkpoint_dir;
  int checkpoint_every = 0;
  std::string resume_dir;
  // Testing aid (verify must be able to fail): "NAME:RANK" perturbs that
  // rank's shard of parameter NAME after the last step; "NAME:RANK:REL"
  // scales it by 1+REL before the first step.
  std::string corrupt_shard;
  // verify's noise floor for MoE with a load-balancing loss: every
  // micro-batch's sequences in reverse order. The loss, the balancing loss
  // and the routing are the same functions of the same tokens; only the
  // order of the sums over tokens changes (not with an expert capacity:
  // which tokens overflow depends on their order).
  bool reverse_rows = false;
  // verify's noise floor for a run that splits per-token sums (tp, cp):
  // every GEMM sums its K in two halves (model/arithmetic.h SplitSumsScope),
  // the rounding a row-parallel layer's two partial products give.
  bool split_sums = false;
  // Keep the step-0 gradients (after the DP reduction, before clipping),
  // gathered into unsharded tensors (verify --grads).
  bool keep_step0_grads = false;
  // Shape-only execution (--phantom): every device runs the same program on
  // tensors with shapes and modeled bytes but no data. Every kernel,
  // collective, transfer and arena charge happens; no arithmetic, no data
  // loading, no checkpoint. Losses are reported as 0. MoE routing follows
  // `phantom_zipf` instead of a router's choices.
  bool phantom = false;
  // Phantom runs: let one thread play provably symmetric ranks (fold.h).
  bool fold = true;
  // Phantom runs: MoE routing assumed uniform (0) or Zipf-skewed with this
  // exponent (--phantom-routing zipf:S): expert e's share of first choices
  // proportional to 1/(e+1)^S.
  double phantom_zipf = 0;
  // The kernels' arithmetic (model/arithmetic.h): the host's fastest GEMM, or
  // one whose bits are the same on every machine and build (--arithmetic).
  model::Arithmetic arithmetic = model::Arithmetic::kNative;

  // Every check of the options (ConfigError naming the field); ParallelPlan calls it.
  void validate() const;
  nlohmann::json to_json() const;
};

// nanoGPT's get_lr: linear warm-up over warmup_steps, then constant or a
// cosine decay to lr/10 at the last step.
double learning_rate(const TrainOptions& o, int step);

struct StepRecord {
  int step = 0;
  double loss = 0;        // CE + aux_coef * aux, before this step's update
  double ce = 0;
  double aux = 0;
  double lr = 0;
  double grad_norm = 0;   // before clipping
  Time virtual_end = 0;   // device 0's clock at the end of the step
  double wall_s = 0;      // host seconds since the loop started
};

struct PhaseRecord {
  Time start = 0, end = 0, busy = 0;
  uint64_t p2p_bytes = 0;  // pipeline activations and gradients sent
};

struct DevicePhaseTotals {
  Time busy = 0;  // compute-stream busy inside the pipeline's windows
  Time idle = 0;  // window minus busy: this stage's share of the bubble
  uint64_t p2p_bytes = 0;
};

struct MoeLayerTotals {
  int layer = -1;
  int expert_begin = 0;
  std::vector<std::vector<int64_t>> per_step;  // (steps, experts held) rows routed to each
  int64_t dropped = 0;            // assignments over capacity (this rank's tokens)
  uint64_t a2a_sent_bytes = 0, a2a_recv_bytes = 0;  // forward and backward
  uint64_t a2a_internode_sent_bytes = 0;           // of a2a_sent_bytes, to ranks on other nodes
  // Rows routed to each held expert, summed over steps.
  std::vector<int64_t> received() const {
    std::vector<int64_t> sum(per_step.empty() ? 0 : per_step.front().size(), 0);
    for (const auto& step : per_step)
      for (size_t e = 0; e < step.size(); ++e) sum[e] += step[e];
    return sum;
  }
};

struct TrainResult {
  std::vector<StepRecord> steps;
  std::vector<float> final_params;  // unsharded, laid out by model::ParamTable
  std::vector<float> step0_grads;   // unsharded, when keep_step0_grads
  // Data-parallel replicas must end bit-identical: the first tensor where one
  // differs from dp rank 0's copy, and by how much (empty when they agree).
  std::string replica_mismatch;
  double replica_max_diff = 0;
  std::vector<std::vector<float>> replicas;  // (dp·cp) unsharded final params of each dp (and cp) rank
  // Pipeline: the last stage's copy of the tied wte (it must equal the first stage's).
  std::vector<float> tied_copy;
  // Tensor parallelism: the tp-replicated tensors (LayerNorms, row-parallel
  // biases, wpe, K/V heads tp does not divide, the router; experts aside) at
  // their global flat ranges, and tp rank t's copies of them in dp replica 0,
  // packed in that order (tp_copies[t], t >= 1). Where tp rank t's copy is not
  // tp rank 0's bit for bit, tp_drift names the first tensor and tp_drift_max
  // is the largest difference: a report, not an error (where the tp ranks'
  // dp groups sit differently on the nodes their reductions run other
  // algorithms and round differently, as NCCL's per-communicator choices
  // would; README "Checkpoints and resume").
  std::vector<Range> tp_replicated;
  std::vector<std::vector<float>> tp_copies;
  std::string tp_drift;
  double tp_drift_max = 0;
  RunResult run;
  std::optional<double> best_loss;  // of the data, when known
  int64_t n_params = 0;
  int64_t tokens_per_step = 0;
  double model_flops_per_step = 0;  // nanoGPT's estimate: 6N + 12 L H Q T per token
  double loop_wall_s = 0;           // host seconds in the step loop
  // Forward-backward phase of every device and step (optimizer excluded).
  std::vector<std::vector<PhaseRecord>> phases;  // (devices, steps)
  // Mean over steps and pipeline ranks of the compute stream's idle share of
  // its pipeline's forward-backward window (first start to last end).
  double bubble_fraction = 0;
  std::vector<DevicePhaseTotals> phase_totals;  // (devices) summed over steps
  // MoE: per device, per MoE layer, rows each held expert processed, summed
  // over steps and micro-batches' last forwards; all-to-all bytes per device.
  std::vector<std::vector<MoeLayerTotals>> moe;  // (devices)
  std::vector<Time> a2a_time;                     // (devices) EP all-to-alls on the compute stream
  // (devices) gradient buckets reduce-scattered over the run (ZeRO-2/3 and
  // the distributed optimizer; ZeRO-2/3 every micro-batch's: DataParallel::reduce_partial).
  std::vector<int64_t> grad_reduce_scatters;
  // Every MoE block over the whole cluster: tokens per expert each step (all
  // data-parallel replicas' assignments) and max/mean load imbalance.
  struct MoeLayerSteps {
    int layer = -1;
    std::vector<std::vector<int64_t>> tokens;  // (steps, experts)
    std::vector<double> imbalance;             // (steps) max / mean over experts
  };
  std::vector<MoeLayerSteps> moe_layers;
  // Pipeline runs: every device's forwards and backwards of the first step.
  std::vector<std::vector<parallel::ComputeSpan>> first_step_spans;  // (devices)
  // Phantom runs: what was folded (model/engine/fold.h), e.g. "dp and tp folded: ...".
  std::string folded = "nothing folded";
  // Resumed runs: which checkpoint, and whether it was resharded (checkpoint.h);
  // the first step this run took (first_step_spans are of it).
  std::string resumed_from;
  int first_step = 0;
  int running_devices = 0;  // threads that ran
  // ZeRO-3, per device over the whole run: the compute stream's wait for unit
  // all-gathers (the exposed part), the gathers issued and the gradient
  // buckets reduce-scattered (every micro-batch's: DataParallel::reduce_partial).
  struct FsdpTotals {
    Time exposed = 0;
    int64_t gathers = 0;
    uint64_t gathered_bytes = 0;  // modeled bytes of the gathered units
    int64_t reduce_scatters = 0;  // ZeRO-3 only
  };
  std::vector<FsdpTotals> fsdp;  // (devices), empty without ZeRO-3
  // --overlap-param-gather: ZeRO 1/2's bucket all-gathers in the forward,
  // the same totals (gathered_bytes: the padded buckets gathered).
  std::vector<FsdpTotals> param_gather;  // (devices), empty without it
  // Context parallelism, per device over the whole run: the compute stream's
  // wait for K/V blocks (the ring's exposed part, or the all-gathers) and the
  // ring's modeled bytes sent.
  struct CpTotals {
    Time exposed = 0;
    uint64_t sent_bytes = 0;
  };
  std::vector<CpTotals> cp;  // (devices), empty without --cp
};

// The first step of pipeline `ranks` (global ranks, pipeline order) as text,
// one row per stage, `width` columns over the step's forward-backward window:
// F forward, B backward (input gradient, with W when fused), W weight gradient, . idle.
std::string format_pipeline_timeline(const TrainResult& result, const std::vector<int>& ranks, int width = 96);

// Called on device 0's thread after every step (progress bars).
using StepCallback = std::function<void(const StepRecord&)>;

// Where a run is, from device 0's thread: its phase ("setup",
// "forward-backward", "optimizer"), the step and, in forward-backward, the
// schedule actions done; `devices` is the number of threads that run.
struct ProgressEvent {
  const char* phase = "";
  int step = 0, steps = 0;
  int64_t done = 0, total = 0;
  int devices = 0;
};
using ProgressCallback = std::function<void(const ProgressEvent&)>;

// Throws ConfigError for bad options or data; RunError from the devices.
// The cluster must have options.parallel.world() devices.
TrainResult train(Cluster& cluster, const TrainOptions& options, const StepCallback& on_step = {},
                  const ProgressCallback& on_progress = {});

// The parallel layout's checks (`dp`, `tp`, ...): part of TrainOptions::validate.
void validate_parallel(const TrainOptions& options);
// Whether the run uses the sharded model (parallel::ShardedGPT) rather than
// the unsharded reference: any of tp, pp, ep > 1, MoE routing over dp,
// activation recomputation, ZeRO-3 (its hooks are ShardedGPT's), or kernels
// the reference does not charge (FP8 linears at `precision`, fused attention).
bool runs_sharded(const TrainOptions& options, Precision precision = Precision::kFp32);
// The action lists every pipeline rank runs (custom or built).
parallel::Schedule step_schedule(const TrainOptions& options);

// The --save file: a safetensors file of result.final_params with nanoGPT
// names and the run's config in its metadata (train() writes it to
// options.save_path, checked writable before the run).
std::string checkpoint_bytes(const TrainOptions& options, const TrainResult& result);

// The --report JSON (README, `shardlab train`: `--report FILE.json`).
nlohmann::json report_json(const TrainOptions& options, const Cluster& cluster,
                           const TrainResult& result);

// The end-of-run copies check (real-math runs): the data-parallel (and cp)
// copies of the parameters and a pipeline's tied embedding copy must end
// bit-identical (TrainResult::replica_mismatch); tp ranks' copies of the
// replicated tensors are reported (TrainResult::tp_drift), not checked.
// replicas_json is the report's "replicas" object; replica_lines the
// summary's lines (none for a phantom run or nothing replicated);
// replica_failure the "FAIL: ..." line of a mismatch, else "" (`shardlab
// train` prints it last and exits 1).
nlohmann::json replicas_json(const TrainOptions& options, const TrainResult& result);
std::vector<std::string> replica_lines(const TrainOptions& options, const TrainResult& result);
std::string replica_failure(const TrainResult& result);

}  // namespace shardlab::train
