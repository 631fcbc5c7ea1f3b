// The virtual clock against a real cluster: Narayanan et al. 2021 Table 1
// (Megatron-LM on Selene, 32 to 3,072 A100s), predicted by phantom runs on
// the a100-nvlink profile. The goal: mean |error| <= 5%, max <= 10%.
#include <cmath>
#include <cstdio>

#include <gtest/gtest.h>

#include "model/train/calibration.h"

namespace shardlab::train {
namespace {

TEST(Table1, PredictedTflopsPerGpuMatchPublishedWithinTheGoal) {
  const HardwareProfile p = load_profile("a100-nvlink");
  double sum = 0, worst = 0;
  for (const PublishedRun& row : narayanan2021_table1()) {
    const PredictedRun r = predict(row, p);
    std::printf("%-16s tp %d pp %2d gpus %4d: predicted %6.1f TFLOP/s, published %5.0f, error %+5.1f%%\n",
                row.preset.c_str(), row.tp, row.pp, row.gpus, r.tflops_per_gpu, row.tflops_per_gpu,
                100 * r.error);
    EXPECT_LE(std::abs(r.error), 0.10) << row.preset;
    sum += std::abs(r.error);
    worst = std::max(worst, std::abs(r.error));
  }
  const double mean = sum / double(narayanan2021_table1().size());
  std::printf("mean |error| %.2f%% (goal 5%%), max %.2f%% (goal 10%%)\n", 100 * mean, 100 * worst);
  EXPECT_LE(mean, 0.05);
}

// The paper's Eq. 3 by hand for the 1T row: 96·B·s·l·h²·(1 + s/6h + V/16lh).
TEST(Table1, PaperFlopsFollowEquationThree) {
  const TrainOptions o = table1_options(narayanan2021_table1().back());
  const double B = 3072, s = 2048, l = 128, h = 25600, V = 51200;
  const double want = 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h));
  EXPECT_DOUBLE_EQ(paper_flops_per_step(o), want);
  EXPECT_EQ(o.parallel.dp, 6);
  EXPECT_EQ(o.micro_batches, 512);  // micro-batch size 1
  EXPECT_TRUE(o.phantom);
}

}  // namespace
}  // namespace shardlab::train
