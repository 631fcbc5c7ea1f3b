#include "model/train/calibration.h"

#include <chrono>
#include <cmath>

#include <fmt/format.h>

#include "model/config.h"
#include "model/params.h"
#include "runtime/cluster.h"

namespace shardlab::train {

const std::vector<PublishedRun>& narayanan2021_table1() {
  static const std::vector<PublishedRun> kRows = {
      {"megatron-1.7b", 1, 1, 32, 137},     {"megatron-3.6b", 2, 1, 64, 138},
      {"megatron-7.5b", 4, 1, 128, 142},    {"megatron-18.4b", 8, 1, 256, 135},
      {"megatron-39.1b", 8, 2, 512, 138},   {"megatron-76.1b", 8, 4, 1024, 140},
      {"megatron-145.6b", 8, 8, 1536, 148}, {"megatron-310.1b", 8, 16, 1920, 155},
      {"megatron-529.6b", 8, 35, 2520, 163}, {"megatron-1t", 8, 64, 3072, 163},
  };
  return kRows;
}

const std::vector<PublishedRun>& narayanan2021_table2() {
  // Model-parallel size 96 (the paper's Table 2): TP 8 x PP 12, 8 of the 96 layers per stage.
  static const std::vector<PublishedRun> kRows = {{"gpt3-175b", 8, 12, 384, 153}, {"gpt3-175b", 8, 12, 1536, 141}};
  return kRows;
}

TrainOptions published_run_options(const PublishedRun& row) {
  TrainOptions o;
  o.model = model::preset(row.preset);
  o.model.vocab_size = 51200;  // every model of the paper (GPT-3's preset has GPT-2's 50257)
  o.phantom = true;
  o.steps = 1;
  ParallelOptions& p = o.parallel;
  p.tp = row.tp;
  p.pp = row.pp;
  p.dp = row.gpus / (row.tp * row.pp);
  // As the 2021 code ran: no sequence parallelism (LayerNorm and dropout
  // replicated on each TP rank, TP all-reduces), the scatter/gather of
  // activations between stages, attention and hidden dropout 0.1.
  p.sp = false;
  p.scatter_gather = true;
  o.model.dropout = 0.1;
  p.recompute = parallel::Recompute::kFull;
  p.overlap = false;  // Megatron-LM 2021 all-reduced the gradients after the pipeline flush
  const int per_replica = o.model.batch_size / p.dp;
  o.micro_batches = row.pp > 1 ? per_replica : 1;
  if (row.pp > 1) {
    const int stage_layers = o.model.n_layer / row.pp;
    p.schedule = parallel::ScheduleKind::kInterleaved;
    p.vpp = stage_layers % 2 == 0 ? 2 : 3;
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
  r.error = r.tflops_per_gpu / row.tflops_per_gpu - 1;
  r.running_devices = result.running_devices;
  return r;
}

std::string readme_row(const PredictedRun& r) {
  return fmt::format("| {:.1f}B | {} | {} | {} | {} | {:.1f} | {:.0f} | {:+.1f}% |",
                     model::count_params(r.options.model) / 1e9, r.row.tp, r.row.pp, r.row.gpus,
                     r.options.model.batch_size, r.tflops_per_gpu, r.row.tflops_per_gpu, 100 * r.error);
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
