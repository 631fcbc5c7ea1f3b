// Held out of every fit: Megatron-LM's weak-scaling table (its README since
// 2024-07-15, core_r0.8.0: GPT models of 1.7B to 462B on H100 in BF16,
// vocabulary 131,072, seq 4,096, DP 48), each row run in phantom on
// h100-nvlink as core_r0.8.0's pretrain_gpt.py runs it with the README's
// flags (model/train/calibration.cc megatron_core_weak_scaling_h100 says
// where each setting comes from; the micro-batch and the virtual stages,
// not published, by one rule for every row).
//
// The four rows without a pipeline (1.7B to 32B, 48 to 384 GPUs) and the
// five pipelined ones (70B to 462B, 768 to 6,144 GPUs) are pinned in README
// ("Calibration against a real cluster"), each with its line, and bounded
// here. Every row folds to a thread per local place and stage (8 to 128;
// the global norm's all-reduce or all-gather over tp-dp ends apart for tp
// peers, not for dp twins on other nodes: model/engine/fold.h), under 10 s
// each.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "calibration_tables.h"
#include "model/params.h"
#include "model/train/calibration.h"

namespace shardlab::train {
namespace {

using readme::Predicted;
using readme::kMcoreHeader;

// Every row as core_r0.8.0 ran it: the shape, the sizes the table names
// (untied embeddings), DP 48, the distributed optimizer with fp32
// gradients in buckets of max(40M, 1M x 48) parameters, SP and TP overlap
// with TP, fused attention, the unfused cross-entropy; the micro-batch rule.
TEST(McoreCalibration, RowsRunAsCoreR08RunsThem) {
  const auto& rows = megatron_core_weak_scaling_h100();
  ASSERT_EQ(rows.size(), 9u);
  // The table's sizes, in billions, as it rounds them.
  const double sizes[] = {1.7, 7.1, 16, 32, 70, 119, 177, 314, 462};
  for (size_t i = 0; i < rows.size(); ++i) {
    const PublishedRun& r = rows[i];
    const TrainOptions o = published_run_options(r);
    const ParallelOptions& p = o.parallel;
    SCOPED_TRACE(r.name);
    EXPECT_EQ(o.model.vocab_size, 131072);  // 128 x TP divides it: no padding
    EXPECT_EQ(o.model.block_size, 4096);
    EXPECT_FALSE(o.model.tied());
    // Untied: 1.754B ... 461.5B, each within 3.5% of the table's name
    // (1.754B for "1.7B" the farthest); tied, the first four would be
    // 12.6%, 7.1%, 4.2% and 4.5% under theirs.
    const double billions = model::count_params(o.model) / 1e9;
    std::printf("%-5s %8.3fB parameters (the table: %gB)\n", r.name, billions, sizes[i]);
    EXPECT_LE(std::abs(billions / sizes[i] - 1), 0.035);
    EXPECT_EQ(p.dp, 48);
    EXPECT_EQ(p.world(), r.gpus);
    EXPECT_TRUE(p.zero == 1 && p.distributed_optimizer);  // Megatron's distributed optimizer
    EXPECT_TRUE(p.overlap && p.overlap_param_gather && p.grad_accum_fusion);
    EXPECT_FALSE(p.grad_reduce_bf16);
    EXPECT_EQ(p.bucket_mb, 192);  // 48M fp32 gradients
    EXPECT_FALSE(p.fusions.cross_entropy);
    EXPECT_EQ(p.attention, parallel::AttentionKernel::kFused);
    EXPECT_EQ(p.recompute, parallel::Recompute::kNone);
    EXPECT_EQ(p.sp, r.tp > 1);
    EXPECT_EQ(p.tp_comm_overlap, r.tp > 1);
    EXPECT_DOUBLE_EQ(o.model.dropout, 0.1);
    EXPECT_EQ(r.precision, Precision::kBf16);
    if (r.pp == 1) {
      EXPECT_EQ(o.micro_batches, 1);  // the replica's 4 sequences at once
    } else {
      EXPECT_EQ(o.micro_batches, o.model.batch_size / 48);  // micro-batches of 1
      EXPECT_EQ(p.schedule, parallel::ScheduleKind::kInterleaved);
      EXPECT_EQ(p.vpp, o.model.n_layer / r.pp);  // one layer per virtual stage
      EXPECT_TRUE(p.overlap_p2p_comm);
    }
  }
}

// The rows with (`pipelined`) or without a pipeline, `count` of them,
// predicted on h100-nvlink: each folds to 8 threads a stage (a thread per
// local place: tp rank and dp place; model/engine/fold.h), README's
// `table`-th table under kMcoreHeader holds them as predicted, README has the
// line `what` + the summary, every |error| is within `row_bound` and the
// mean within `mean_bound`.
void expect_readme_rows(const std::vector<PublishedRun>& rows, size_t table, const std::string& what,
                        double row_bound, double mean_bound) {
  Predicted t;
  readme::expect_readme_table(kMcoreHeader, rows, what, row_bound, mean_bound, "h100-nvlink", table, &t);
  for (const PredictedRun& r : t.runs) {
    std::printf("%-5s %d threads of %d\n", r.row.name, r.running_devices, r.row.gpus);
    EXPECT_EQ(r.running_devices, 8 * r.row.pp) << r.row.name << ": a thread per local place and stage";
  }
}

void expect_readmes(bool pipelined, size_t count, size_t table, const std::string& what, double row_bound,
                    double mean_bound) {
  std::vector<PublishedRun> rows;
  for (const PublishedRun& r : megatron_core_weak_scaling_h100())
    if ((r.pp > 1) == pipelined) rows.push_back(r);
  ASSERT_EQ(rows.size(), count);
  expect_readme_rows(rows, table, "Megatron-LM weak scaling (core r0.8), H100, BF16, " + what, row_bound,
                     mean_bound);
}

// The four rows without a pipeline, pinned in README with their summary
// line. Session 21 measured them with the CLI at +21..25%, +6..10%,
// -4..+1% and -3.6% (MBS 4); here, each as calibration.cc runs it, the mean
// |error| is bounded at 7% (5.8% since session 29's output store after
// each GEMM's main loop; 6.5% before) and every row at 16% (the 1.7B row,
// +14.6%; +16.6% before: README says what is known of that gap), against a
// further slide.
TEST(McoreCalibration, HeldOutRowsWithoutAPipelineAreReadmes) {
  expect_readmes(false, 4, 0, "4 runs without a pipeline (held out): ", 0.16, 0.07);
}

// The five pipelined rows, pinned in README's second table under the same
// header with their line. Session 23 ran them unfolded (768 to 6,144
// threads, 3 to 19 minutes) at these errors; folded, every tp rank of a
// stage runs (8 threads a stage). Bounded at what they reach: every row
// within 12% (119B is +10.6% since session 29's output store after each
// GEMM's main loop; +14.1% when first bounded), the mean |error| at 7%
// (5.9%; 8.9% then); the held-out goal (every row within 10%, mean 5%) is
// not met.
TEST(McoreCalibration, HeldOutPipelinedRowsAreReadmes) {
  expect_readmes(true, 5, 1, "5 pipelined runs (held out): ", 0.12, 0.07);
}

// The same README's strong scaling, its two endpoints (GPT-3 177B, batch
// 1,152, on 96 and 4,608 GPUs, MFU 47% and 42%), run as the 177B row of
// the weak-scaling table (TP 8 x PP 6, every rule above): pinned in
// README's third table under kMcoreHeader with their line. Each row within the
// held-out goal's 10%, asserted (+5.0% and +7.2% when added in session 31:
// the model's drop from 96 to 4,608 GPUs is 8.9%, the published 10.6%). The
// 96-GPU row runs 576 micro-batches a replica on 48 threads, ~25 s.
TEST(McoreCalibration, HeldOutStrongScalingEndpointsAreReadmes) {
  const std::vector<PublishedRun>& rows = megatron_core_strong_scaling_h100();
  ASSERT_EQ(rows.size(), 2u);
  const PublishedRun& weak = megatron_core_weak_scaling_h100()[6];  // the 177B row
  for (const PublishedRun& r : rows) {
    EXPECT_EQ(r.layers, weak.layers);
    EXPECT_EQ(r.embd, weak.embd);
    EXPECT_EQ(r.heads, weak.heads);
    EXPECT_EQ(r.batch, weak.batch);
    EXPECT_EQ(r.tp, weak.tp);
    EXPECT_EQ(r.pp, weak.pp);
  }
  EXPECT_EQ(rows[0].gpus, 96);
  EXPECT_EQ(rows[1].gpus, 4608);
  expect_readme_rows(rows, 2, "Megatron-LM strong scaling (core r0.8), H100, BF16, GPT-3 on 96 and 4,608 GPUs (held out): ",
                     0.10, 0.07);
}

}  // namespace
}  // namespace shardlab::train
