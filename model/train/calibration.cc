#include "model/train/calibration.h"

#include <chrono>
#include <cmath>

#include <fmt/format.h>

#include "model/config.h"
#include "model/params.h"
#include "runtime/cluster.h"

namespace shardlab::train {

// Rows: {preset, tp, pp, gpus, published TFLOP/s, batch, micro-batch size,
// chunks per rank, overlap}.
const std::vector<PublishedRun>& narayanan2021_table1() {
  // run_table_1.sh: MBS, --num-layers-per-virtual-pipeline-stage, --DDP-impl.
  static const std::vector<PublishedRun> kRows = {
      {"megatron-1.7b", 1, 1, 32, 137, 0, 16, 0, true},
      {"megatron-3.6b", 2, 1, 64, 138, 0, 16, 0, true},
      {"megatron-7.5b", 4, 1, 128, 142, 0, 16, 0, true},
      {"megatron-18.4b", 8, 1, 256, 135, 0, 8, 0, true},
      {"megatron-39.1b", 8, 2, 512, 138, 0, 4, 1},     // 1F1B
      {"megatron-76.1b", 8, 4, 1024, 140, 0, 2, 3},    // 5 of a stage's 15 layers per chunk
      {"megatron-145.6b", 8, 8, 1536, 148, 0, 2, 2},   // 5 of 10
      {"megatron-310.1b", 8, 16, 1920, 155, 0, 1, 2},  // 3 of 6
      {"megatron-529.6b", 8, 35, 2520, 163, 0, 1, 3},  // 1 of 3
      {"megatron-1t", 8, 64, 3072, 163, 0, 1, 1},      // 1F1B
  };
  return kRows;
}

const std::vector<PublishedRun>& narayanan2021_table2() {
  // Model-parallel size 96 (TP 8 x PP 12, 8 of the 96 layers per stage, 2 per
  // chunk) and 280 (TP 8 x PP 35, 3 of 105, 1 per chunk); micro-batch 1.
  static const std::vector<PublishedRun> kRows = {
      {"gpt3-175b", 8, 12, 384, 153, 1536, 1, 4},
      {"gpt3-175b", 8, 12, 768, 149, 1536, 1, 4},
      {"gpt3-175b", 8, 12, 1536, 141, 1536, 1, 4},
      {"megatron-529.6b", 8, 35, 560, 171, 2240, 1, 3},
      {"megatron-529.6b", 8, 35, 1120, 167, 2240, 1, 3},
      {"megatron-529.6b", 8, 35, 2240, 159, 2240, 1, 3},
  };
  return kRows;
}

const std::vector<PublishedRun>& korthikanti2022_table5() {
  // Table 3's models (22B: 48 layers of h 6144, 64 heads), Table 5's
  // iteration times: full recomputation, then "present work" (SP + selective).
  // {preset, tp, pp, gpus, -, batch, micro-batch size, chunks per rank,
  //  overlap, sp_selective, layers, heads, iteration s, gradient accumulation fusion}
  static const std::vector<PublishedRun> kRows = {
      {"megatron-18.4b", 8, 1, 8, 0, 4, 4, 0, false, false, 48, 64, 1.42, true},
      {"megatron-18.4b", 8, 1, 8, 0, 4, 4, 0, false, true, 48, 64, 1.10, true},
      {"gpt3-175b", 8, 8, 64, 0, 64, 1, 3, false, false, 0, 0, 18.13, true},
      {"gpt3-175b", 8, 8, 64, 0, 64, 1, 3, false, true, 0, 0, 13.75, true},
      {"megatron-529.6b", 8, 35, 280, 0, 280, 1, 3, false, false, 0, 0, 49.05, true},
      {"megatron-529.6b", 8, 35, 280, 0, 280, 1, 3, false, true, 0, 0, 37.83, true},
      {"megatron-1t", 8, 64, 512, 0, 512, 1, 1, false, false, 0, 0, 94.42, true},
      {"megatron-1t", 8, 64, 512, 0, 512, 1, 1, false, true, 0, 0, 71.49, true},
  };
  return kRows;
}

TrainOptions published_run_options(const PublishedRun& row) {
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
  p.unfused_cross_entropy = true;
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

PredictedRun predict(const PublishedRun& row, const HardwareProfile& profile) {
  PredictedRun r{row, published_run_options(row)};
  HardwareProfile p = profile;
  p.nodes = (row.gpus + p.devices_per_node - 1) / p.devices_per_node;
  ClusterOptions c;
  c.precision = Precision::kBf16;
  c.world_size = row.gpus;
  Cluster cluster(p, c);
  const auto t0 = std::chrono::steady_clock::now();
  const TrainResult result = train(cluster, r.options);
  r.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.step_s = to_seconds(result.steps.back().virtual_end);
  r.tflops_per_gpu = paper_flops_per_step(r.options) / r.step_s / row.gpus / 1e12;
  r.error = row.iteration_s > 0 ? row.iteration_s / r.step_s - 1
                                : r.tflops_per_gpu / row.tflops_per_gpu - 1;
  r.running_devices = result.running_devices;
  return r;
}

std::string readme_row(const PredictedRun& r) {
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
