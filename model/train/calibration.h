// The published runs the cost model is checked against: Narayanan et al.
// 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using
// Megatron-LM" (SC'21), Table 1: GPT models of 1.7B to 1T parameters on
// Selene (DGX A100 80 GB, 8 GPUs per node on NVSwitch, 8 x 200 Gb/s HDR
// InfiniBand per node), vocabulary 51200, sequence 2048, bf16, full
// activation recomputation; achieved teraFLOP/s per GPU counted as
// 96·B·s·l·h²·(1 + s/6h + V/16lh) per step (the paper's Eq. 3).
//
// Held out of the fit: Table 2's GPT-3 175B runs with PTD parallelism
// (batch 1536, model-parallel size 96 = TP 8 x PP 12, on 384 and 1,536
// GPUs), run the same way with
// the paper's vocabulary of 51200 (174.6B parameters, as Table 2 counts).
//
// The tables give model, TP, PP, GPUs and batch; not the micro-batch size
// or the schedule. What shardlab runs (published_run_options):
//   micro-batch size 1 when there is a pipeline (the paper's §3.4: larger
//     micro-batches enlarge the bubble; its 175B scripts use 1), else one
//     micro-batch of B/dp per step (no bubble to pay for);
//   the interleaved 1F1B schedule with 2 model chunks per rank (3 when the
//     stage's layers are odd), the paper's schedule;
//   no sequence parallelism (2021's code had none: LayerNorm and dropout
//     replicated on the TP ranks, TP all-reduces) and the paper's
//     scatter/gather of activations between stages (each TP rank sends 1/t
//     of them, an all-gather over NVLink reassembles them, §4.1);
//   attention and hidden dropout 0.1, their kernels charged (phantom);
//   no ZeRO (the paper's optimizer is replicated over dp), and the gradient
//     all-reduce after the whole forward-backward (Megatron-LM 2021's
//     DistributedDataParallel did not overlap it with backward).
#pragma once

#include <string>
#include <vector>

#include "model/train/trainer.h"
#include "runtime/profile.h"

namespace shardlab::train {

struct PublishedRun {
  std::string preset;  // model::preset name (megatron-1.7b ...)
  int tp = 1, pp = 1, gpus = 1;
  double tflops_per_gpu = 0;  // published, per GPU, recompute counted
};

// The ten rows of Table 1, as published.
const std::vector<PublishedRun>& narayanan2021_table1();
// The held-out GPT-3 175B rows of Table 2 (PTD parallelism), as published.
const std::vector<PublishedRun>& narayanan2021_table2();

// The training options shardlab runs for a row (phantom, one step, bf16 is
// the cluster's precision, vocabulary 51200), as the header describes.
TrainOptions published_run_options(const PublishedRun& row);

// The paper's FLOPs per step (Eq. 3) for `options`' model and batch.
double paper_flops_per_step(const TrainOptions& options);

struct PredictedRun {
  PublishedRun row;
  TrainOptions options;
  double step_s = 0;          // virtual step time
  double tflops_per_gpu = 0;  // paper_flops_per_step / step_s / gpus
  double error = 0;           // predicted / published - 1
  int running_devices = 0;    // threads (folding)
  double wall_s = 0;          // host seconds of the phantom step
};

// Runs `row` in phantom on `profile` (its nodes set to fit the row).
PredictedRun predict(const PublishedRun& row, const HardwareProfile& profile);

// README's row for a prediction (tests/model/train/calibration_test.cc pins
// README's tables with it): model (parameters in billions), TP, PP, GPUs,
// batch, predicted and published TFLOP/s per GPU, error, e.g.
//   | 1.7B | 1 | 1 | 32 | 512 | 138.0 | 137 | +0.7% |
std::string readme_row(const PredictedRun& r);
// README's line under a table: "Mean |error| 2.7%, max 6.2%." (nan if an
// error is NaN: std::max would drop it).
std::string readme_summary(const std::vector<PredictedRun>& rows);

}  // namespace shardlab::train
