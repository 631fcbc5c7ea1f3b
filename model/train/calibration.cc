// How a published run (calibration_tables.cc) is run here: its TrainOptions
// by recipe, its prediction, and the README rows.
#include "model/train/calibration.h"

#include <chrono>
#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "model/config.h"
#include "model/params.h"
#include "model/parallel/pipeline/stage.h"
#include "runtime/cluster.h"

namespace shardlab::train {

namespace {

// The attention's projections per token and block, in multiply-adds:
// q, k, v and o; under MLA Megatron's count (training.py's q_term and kv
// terms: the down- and up-projections, the latents' norms as one per
// element, the rotated key and o_proj).
double attention_linears(const model::GPTConfig& c) {
  const double h = c.n_embd, a = c.attn_width();
  if (!c.is_mla()) return 2 * h * a + 2 * h * double(c.kv_heads()) * c.head_size();
  const double NH = c.n_head, Dq = c.qk_head_size(), Dn = c.head_size(), Dv = c.v_head_size();
  const double q = c.q_lora_rank > 0 ? c.q_lora_rank * (h + NH * Dq + 1) : h * NH * Dq;
  return q + c.kv_lora_rank * (h + NH * (Dn + Dv) + 1) + h * c.qk_rope_head_dim + NH * Dv * h;
}

}  // namespace

double model_flops_per_token(const model::GPTConfig& c, bool causal_halved) {
  const double l = c.n_layer, h = c.n_embd, s = c.block_size, V = c.vocab_size;
  const double f = c.ffn_hidden();
  const double linears = attention_linears(c) + (c.is_llama() ? 3 : 2) * h * f;  // per block
  // The core: Q·Kᵀ over qk_head_size() features a head, P·V over v_head_size().
  const double core = double(c.n_head) * (c.qk_head_size() + c.v_head_size()) * s;
  return 6 * l * linears + 6 * V * h + (causal_halved ? 3 : 6) * l * core;
}

// A 2024 row as NeMo 24.07 runs it (nemo2407_h100_fp8's notes): fused
// attention, no recomputation, sequence parallelism with TP, the distributed
// optimizer's reduce-scatter and all-gather (shardlab's ZeRO-2 traffic),
// gradients reduced during backward (in bf16 where the row's recipe says so,
// grad_reduce_bf16), their accumulation fused into the wgrad GEMMs, Megatron-core's vocab-parallel cross-entropy, Megatron's vocabulary
// padding (128 x TP), dropout 0.1 for GPT-3 (the launcher's confs), none for
// Llama; the given VP as the interleaved schedule; ub_tp_comm_overlap and
// overlap_p2p_comm as the row's config sets them.
static TrainOptions nemo_run_options(const PublishedRun& row) {
  TrainOptions o;
  o.model = model::preset(row.preset);
  if (row.layers > 0) o.model.n_layer = row.layers;
  if (row.embd > 0) o.model.n_embd = row.embd;
  if (row.heads > 0) o.model.n_head = row.heads;
  if (row.vocab > 0) o.model.vocab_size = row.vocab;
  if (row.untied_embeddings) o.model.tie_embeddings = false;
  o.model = model::with_padded_vocab(o.model, 128, row.tp);
  o.model.block_size = row.seq > 0 ? row.seq : 2048;
  o.model.batch_size = row.batch;
  o.model.dropout = o.model.is_llama() ? 0 : 0.1;
  o.phantom = true;
  o.steps = 1;
  ParallelOptions& p = o.parallel;
  p.tp = row.tp;
  p.pp = row.pp;
  p.cp = row.cp;
  p.dp = row.gpus / (row.tp * row.pp * row.cp);
  p.sp = row.tp > 1;
  p.tp_comm_overlap = row.tp_comm_overlap;
  p.zero = row.zero > 0 ? row.zero : 1;
  p.distributed_optimizer = row.zero == 0;  // Megatron's, as the recipes run it
  p.overlap = true;
  // Apex's distributed_fused_adam (overlap_param_sync, NeMo 24.07),
  // Megatron-core's overlap_param_gather (Megatron-Bridge's recipes), FSDP's
  // forward gathers (Dubey et al.): the parameters gathered in the forward.
  p.overlap_param_gather = p.zero == 1 || p.zero == 2;
  p.grad_accum_fusion = row.grad_accum_fusion;
  p.grad_reduce_bf16 = row.grad_reduce_bf16;
  p.fusions.cross_entropy = row.fused_cross_entropy;
  p.attention = parallel::AttentionKernel::kFused;
  p.recompute = parallel::Recompute::kNone;
  if (row.bucket_mb > 0) p.bucket_mb = row.bucket_mb;
  p.chunk_buckets = row.chunk_buckets;
  const int per_replica = row.batch / p.dp;
  o.micro_batches = per_replica / row.micro_batch_size;
  if (row.pp > 1) {
    p.vpp = row.vpp;
    if (p.vpp > 1) p.schedule = parallel::ScheduleKind::kInterleaved;
    p.overlap_p2p_comm = row.overlap_p2p_comm;
    if (row.embedding_loss_in_split) {
      const int stages = row.pp * std::max(row.vpp, 1);
      p.stage_layers = parallel::balanced_stage_layers(o.model.n_layer + 2, stages);
      --p.stage_layers.front();
      --p.stage_layers.back();
    }
  }
  return o;
}

TrainOptions published_run_options(const PublishedRun& row) {
  if (megatron_core_recipe(row.recipe)) return nemo_run_options(row);
  TrainOptions o;
  o.model = model::preset(row.preset);
  o.model.vocab_size = 51200;  // every model of both papers (GPT-3's preset has GPT-2's 50257)
  if (row.layers > 0) o.model.n_layer = row.layers;
  if (row.heads > 0) o.model.n_head = row.heads;
  if (row.batch > 0) o.model.batch_size = row.batch;
  o.phantom = true;
  o.steps = 1;
  ParallelOptions& p = o.parallel;
  p.tp = row.tp;
  p.pp = row.pp;
  p.dp = row.gpus / (row.tp * row.pp);
  // Without sequence parallelism LayerNorm and dropout are replicated on each
  // TP rank, the TP collectives are all-reduces and the activations go
  // between stages by scatter/gather; with it (2022), selective recompute.
  p.sp = row.sp_selective;
  p.scatter_gather = !row.sp_selective;
  p.recompute = row.sp_selective ? parallel::Recompute::kSelective : parallel::Recompute::kFull;
  o.model.dropout = 0.1;
  p.overlap = row.overlap;  // local DDP all-reduced the gradients after the pipeline flush
  p.grad_accum_fusion = row.grad_accum_fusion;
  // The 2021 rows ran fp16 without fp32 gradient accumulation (sc21 scripts).
  p.half_grads = !row.grad_accum_fusion;
  // Both papers' code computed the loss in fp32 with unfused kernels.
  p.fusions.cross_entropy = false;
  const int per_replica = o.model.batch_size / p.dp;
  const int mbs = row.micro_batch_size > 0 ? row.micro_batch_size : row.pp > 1 ? 1 : per_replica;
  o.micro_batches = per_replica / mbs;
  if (row.pp > 1) {
    const int stage_layers = o.model.n_layer / row.pp;
    p.vpp = row.vpp > 0 ? row.vpp : stage_layers % 2 == 0 ? 2 : 3;
    if (p.vpp > 1) p.schedule = parallel::ScheduleKind::kInterleaved;
  }
  return o;
}

double paper_flops_per_step(const TrainOptions& o) {
  const double B = o.model.batch_size, s = o.model.block_size, l = o.model.n_layer,
               h = o.model.n_embd, V = o.model.vocab_size;
  return 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h));
}

// Megatron-LM 2021's LayerNorm (megatron/fused_kernels/layer_norm_cuda_kernel.cu
// at de7dc40f88, the sc21 scripts' commit: "This code is copied fron NVIDIA
// apex") is apex's affine kernel, which NVIDIA/apex#1037 timed against its
// one-pass replacement (apex.contrib FastLayerNorm) on one GA100, B=32
// S=512: forward 895.7822 against 1258.0318 GB/s, backward 572.1678 against
// 1163.4357 GB/s. The replacement streams like any memory-bound kernel here
// (mem_efficiency); the 2021 kernel at these shares of it. Megatron-LM took
// the replacement as its "persistent fused layer norm" in November 2021
// (a2fdcdf061, every hidden size of these models), so the 2022 rows run at 1.
constexpr double kApexAffineLayerNormFwd = 895.7822 / 1258.0318;
constexpr double kApexAffineLayerNormBwd = 572.1678 / 1163.4357;

PredictedRun predict(const PublishedRun& row, const HardwareProfile& profile, bool fold,
                     const std::string& trace_path) {
  PredictedRun r{row, published_run_options(row)};
  r.options.fold = fold;
  HardwareProfile p = profile;
  select_attention_kernel(p, row.attention_kernel);
  if (!megatron_core_recipe(row.recipe) && !row.grad_accum_fusion) {  // the 2021 code
    p.device.layernorm_fwd_rate = kApexAffineLayerNormFwd;
    p.device.layernorm_bwd_rate = kApexAffineLayerNormBwd;
  }
  p.nodes = (row.gpus + p.devices_per_node - 1) / p.devices_per_node;
  ClusterOptions c;
  c.precision = row.precision;
  c.world_size = row.gpus;
  c.trace = !trace_path.empty();
  if (row.memory_gib > 0) c.memory_bytes = static_cast<uint64_t>(row.memory_gib * (uint64_t{1} << 30));
  Cluster cluster(p, c);
  const auto t0 = std::chrono::steady_clock::now();
  const TrainResult result = train(cluster, r.options);
  r.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.step_s = to_seconds(result.steps.back().virtual_end);
  if (c.trace) write_chrome_trace(trace_path, result.run.traces, fmt::format("shardlab: {} on {}", row.preset, p.name));
  const model::GPTConfig& m = r.options.model;
  r.tokens_per_gpu_s = double(m.batch_size) * m.block_size / r.step_s / row.gpus;
  r.tflops_per_gpu = megatron_core_recipe(row.recipe)
                         ? r.tokens_per_gpu_s * model_flops_per_token(m, row.causal_flops_halved) / 1e12
                         : paper_flops_per_step(r.options) / r.step_s / row.gpus / 1e12;
  // NeMo's rows: against the measured tokens/s (the TFLOP/s are derived from it).
  r.error = row.iteration_s > 0        ? row.iteration_s / r.step_s - 1
            : row.tokens_per_gpu_s > 0 ? r.tokens_per_gpu_s / row.tokens_per_gpu_s - 1
                                       : r.tflops_per_gpu / row.tflops_per_gpu - 1;
  r.running_devices = result.running_devices;
  return r;
}

std::string readme_row(const PredictedRun& r) {
  if (megatron_core_recipe(r.row.recipe)) {
    const std::string tokens = r.row.tokens_per_gpu_s > 0 ? fmt::format("{:.0f}", r.row.tokens_per_gpu_s) : "—";
    return fmt::format("| {} | {} | {} | {} | {} | {} | {:.0f} | {} | {:.0f} | {:.0f} | {:+.1f}% |", r.row.name,
                       r.row.gpus, r.row.tp, r.row.pp, r.options.parallel.chunks(), r.options.model.batch_size,
                       r.tokens_per_gpu_s, tokens, r.tflops_per_gpu, r.row.tflops_per_gpu, 100 * r.error);
  }
  const double params_b = model::count_params(r.options.model) / 1e9;
  if (r.row.iteration_s > 0)
    return fmt::format("| {:.1f}B | {} | {} | {} | {} | {} | {:.2f} | {:.2f} | {:+.1f}% |",
                       params_b, r.row.tp, r.row.pp, r.row.gpus, r.options.model.batch_size,
                       r.row.sp_selective ? "selective + SP" : "full", r.step_s, r.row.iteration_s,
                       100 * r.error);
  return fmt::format("| {:.1f}B | {} | {} | {} | {} | {:.1f} | {:.0f} | {:+.1f}% |", params_b,
                     r.row.tp, r.row.pp, r.row.gpus, r.options.model.batch_size, r.tflops_per_gpu,
                     r.row.tflops_per_gpu, 100 * r.error);
}

std::string readme_summary(const std::vector<PredictedRun>& rows) {
  double sum = 0, worst = 0;
  for (const PredictedRun& r : rows) {
    const double e = std::abs(r.error);
    sum += e;
    worst = std::isnan(e) || std::isnan(worst) ? NAN : std::max(worst, e);
  }
  const double mean = rows.empty() ? NAN : sum / double(rows.size());
  return fmt::format("Mean |error| {:.1f}%, max {:.1f}%.", 100 * mean, 100 * worst);
}

}  // namespace shardlab::train
