// The virtual clock against a real cluster: Narayanan et al. 2021 Table 1
// (Megatron-LM on Selene, 32 to 3,072 A100s), the table the GEMM maximum is
// fitted to, predicted by phantom runs on the a100-nvlink profile (the runs
// held out of the fit: heldout_test.cc).
//
// README's Table 1 ("Calibration against a real cluster") is pinned row by
// row, each figure at the precision it is printed (0.1 TFLOP/s, 0.1
// percentage point of error), and so is Table 1's "Mean |error| ..., max
// ..." line: README cannot drift from the code. Virtual times are
// deterministic, so the pin is exact. A change of the cost model moves them:
// the failure prints every row in README's format, to paste there. The
// issue's goal for Table 1 is a mean within 3% and every row within 6%,
// asserted: since session 29 (each GEMM's output store after its main
// loop, the maximum refitted to 0.72) the mean is 2.6% and the worst row,
// 1.7B, +5.9% (3.4% and +8.7% before; README "Calibration against a real
// cluster").
#include "model/train/calibration.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "calibration_tables.h"

namespace shardlab::train {
namespace {

using readme::predict_all;
using readme::Predicted;
using readme::read_readme_tables;
using readme::ReadmeTables;

constexpr const char* kHeader =
    "| model | TP | PP | GPUs | batch | predicted TFLOP/s per GPU | published | error |";

// README.md: its text, and the rows of its two tables under kHeader: Table 1,
// then the held-out Table 2 (heldout_test.cc pins that one).
ReadmeTables read_readme() {
  ReadmeTables r = read_readme_tables(kHeader);
  EXPECT_EQ(r.tables.size(), 2u) << SHARDLAB_README << ": two tables under \"" << kHeader << "\"";
  r.tables.resize(2);
  return r;
}

TEST(Calibration, Table1IsReadmesAndWithinTheGoal) {
  const ReadmeTables readme = read_readme();
  const Predicted t1 = predict_all(narayanan2021_table1());
  EXPECT_EQ(readme.tables[0], t1.rows) << "README's Table 1 rows, as predicted now:\n" << t1.text();
  const std::string summary = readme_summary(t1.runs);
  std::printf("%s\n", summary.c_str());
  EXPECT_NE(readme.text.find(summary), std::string::npos)
      << "README lacks Table 1's line \"" << summary << "\"";
  double sum = 0;
  for (const PredictedRun& r : t1.runs) {  // a NaN error fails too
    EXPECT_LE(std::abs(r.error), 0.06) << r.row.preset;
    sum += std::abs(r.error);
  }
  EXPECT_LE(sum / double(t1.runs.size()), 0.03) << "mean |error| over 3%";
}

// The paper's Eq. 3 by hand for the 1T row: 96·B·s·l·h²·(1 + s/6h + V/16lh).
TEST(Table1, PaperFlopsFollowEquationThree) {
  const TrainOptions o = published_run_options(narayanan2021_table1().back());
  const double B = 3072, s = 2048, l = 128, h = 25600, V = 51200;
  const double want = 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h));
  EXPECT_DOUBLE_EQ(paper_flops_per_step(o), want);
  EXPECT_EQ(o.parallel.dp, 6);
  EXPECT_EQ(o.micro_batches, 512);  // micro-batch size 1
  EXPECT_TRUE(o.phantom);
}

// Table 2's GPT-3 is the paper's 174.6B: GPT-3's shape with vocabulary 51200.
TEST(Table2, Gpt3RunsWithThePapersVocabulary) {
  const TrainOptions o = published_run_options(narayanan2021_table2().front());
  EXPECT_EQ(o.model.vocab_size, 51200);
  EXPECT_EQ(o.model.n_layer, 96);
  EXPECT_EQ(o.model.n_embd, 12288);
  EXPECT_EQ(o.parallel.tp * o.parallel.pp, 96);  // the paper's model-parallel size
  EXPECT_EQ(o.parallel.dp, 384 / 96);
  EXPECT_EQ(o.micro_batches, 1536 / 4);
  EXPECT_EQ(o.parallel.vpp, 4);  // 8 layers per stage, 2 per chunk (run_figure_12.sh)
}

}  // namespace
}  // namespace shardlab::train
