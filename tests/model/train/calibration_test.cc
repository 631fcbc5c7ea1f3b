// The virtual clock against a real cluster: Narayanan et al. 2021 Table 1
// (Megatron-LM on Selene, 32 to 3,072 A100s) and the held-out GPT-3 175B
// rows of its Table 2, predicted by phantom runs on the a100-nvlink profile.
//
// README's two tables ("Calibration against a real cluster") are pinned row
// by row, each figure at the precision it is printed (0.1 TFLOP/s, 0.1
// percentage point of error), and so is Table 1's "Mean |error| ..., max
// ..." line: README cannot drift from the code. Virtual times are
// deterministic, so the pin is exact. A change of the cost model moves them:
// the failure prints every row in README's format, to paste there. The
// issue's goal (every Table 1 row within 10%, mean within 5%) still holds.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "model/train/calibration.h"

namespace shardlab::train {
namespace {

constexpr const char* kHeader =
    "| model | TP | PP | GPUs | batch | predicted TFLOP/s per GPU | published | error |";

// README.md: its text, and the rows of every table under kHeader in order
// (the line of dashes below the header skipped).
struct Readme {
  std::string text;
  std::vector<std::vector<std::string>> tables;
};

Readme read_readme() {
  std::ifstream in(SHARDLAB_README);
  EXPECT_TRUE(in) << "cannot read " << SHARDLAB_README;
  Readme r;
  std::string line;
  bool inside = false;
  while (std::getline(in, line)) {
    r.text += line + "\n";
    if (line == kHeader) {
      r.tables.emplace_back(), inside = true;
    } else if (inside && line.starts_with("|")) {
      if (!line.starts_with("|---")) r.tables.back().push_back(line);
    } else {
      inside = false;
    }
  }
  EXPECT_EQ(r.tables.size(), 2u) << SHARDLAB_README << ": two tables under \"" << kHeader << "\"";
  r.tables.resize(2);  // Table 1, then the held-out Table 2
  return r;
}

struct Predicted {
  std::vector<PredictedRun> runs;
  std::vector<std::string> rows;  // README's format
  std::string text() const {      // the rows, one a line, to paste into README
    std::string t;
    for (const std::string& r : rows) t += r + "\n";
    return t;
  }
};

Predicted predict_all(const std::vector<PublishedRun>& table) {
  const HardwareProfile p = load_profile("a100-nvlink");
  Predicted out;
  for (const PublishedRun& row : table) {
    out.runs.push_back(predict(row, p));
    out.rows.push_back(readme_row(out.runs.back()));
    std::printf("%-16s %s\n", row.preset.c_str(), out.rows.back().c_str());
  }
  return out;
}

TEST(Calibration, Table1IsReadmesAndWithinTheGoal) {
  const Readme readme = read_readme();
  const Predicted t1 = predict_all(narayanan2021_table1());
  EXPECT_EQ(readme.tables[0], t1.rows) << "README's Table 1 rows, as predicted now:\n" << t1.text();
  const std::string summary = readme_summary(t1.runs);
  std::printf("%s\n", summary.c_str());
  EXPECT_NE(readme.text.find(summary), std::string::npos)
      << "README lacks Table 1's line \"" << summary << "\"";
  double sum = 0;
  for (const PredictedRun& r : t1.runs) {  // the goal; a NaN error fails too
    EXPECT_LE(std::abs(r.error), 0.10) << r.row.preset;
    sum += std::abs(r.error);
  }
  EXPECT_LE(sum / double(t1.runs.size()), 0.05) << "mean |error| over the goal of 5%";
}

TEST(Calibration, HeldOutTable2IsReadmes) {
  const Predicted t2 = predict_all(narayanan2021_table2());
  EXPECT_EQ(read_readme().tables[1], t2.rows) << "README's held-out Table 2 rows, as predicted now:\n" << t2.text();
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
  EXPECT_EQ(o.parallel.vpp, 2);  // 8 layers per stage
}

}  // namespace
}  // namespace shardlab::train
