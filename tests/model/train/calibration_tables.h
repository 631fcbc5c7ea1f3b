// What calibration_test.cc and heldout_test.cc share: README.md's tables,
// read to pin them (the rows of every table under an exact header line, in
// order, the line of dashes below the header skipped), and published runs
// predicted in README's format.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "model/train/calibration.h"
#include "runtime/profile.h"

namespace shardlab::train::readme {

// The headers of README's held-out H100 tables: h100_calibration_test.cc
// (the 24.07 Llama rows, Megatron-Bridge 25.11 and 26.04.01) and
// mcore_calibration_test.cc (Megatron-LM's weak scaling, two tables, and
// its strong scaling, a third) pin their rows; the summary of all of them
// is checked against them (h100_calibration_test.cc).
inline constexpr const char* kNemoHeldOutHeader =
    "| model (24.07, held out) | GPUs | TP | PP | VP | GBS | predicted tokens/s/GPU | published | predicted "
    "TFLOP/s/GPU | published | error |";
inline constexpr const char* kNemoLongSeqHeader =
    "| model (24.03.01, long sequences, held out) | GPUs | TP | PP | VP | GBS | predicted tokens/s/GPU | published | "
    "predicted TFLOP/s/GPU | published | error |";
inline constexpr const char* kBridgeHeader =
    "| model | GPUs | TP | PP | VP | GBS | predicted tokens/s/GPU | published | predicted TFLOP/s/GPU (causal halved) | "
    "published | error |";
inline constexpr const char* kBridge2604Header =
    "| model (26.04.01) | GPUs | TP | PP | VP | GBS | predicted tokens/s/GPU | published | predicted TFLOP/s/GPU "
    "(causal halved) | published | error |";
inline constexpr const char* kMcoreHeader =
    "| model | GPUs | TP | PP | VP | GBS | predicted tokens/s/GPU | published | predicted TFLOP/s/GPU (BF16, "
    "Megatron's count) | published | error |";

struct ReadmeTables {
  std::string text;                              // the whole README
  std::vector<std::vector<std::string>> tables;  // the rows of each table under the header
};

inline ReadmeTables read_readme_tables(const std::string& header) {
  std::ifstream in(SHARDLAB_README);
  EXPECT_TRUE(in) << "cannot read " << SHARDLAB_README;
  ReadmeTables r;
  std::string line;
  bool inside = false;
  while (std::getline(in, line)) {
    r.text += line + "\n";
    if (line == header) {
      r.tables.emplace_back(), inside = true;
    } else if (inside && line.starts_with("|")) {
      if (!line.starts_with("|---")) r.tables.back().push_back(line);
    } else {
      inside = false;
    }
  }
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

// Predicts every row of `table` on `profile`, printing each in README's format.
inline Predicted predict_all(const std::vector<PublishedRun>& table,
                             const std::string& profile = "a100-nvlink") {
  const HardwareProfile p = load_profile(profile);
  Predicted out;
  for (const PublishedRun& row : table) {
    out.runs.push_back(predict(row, p));
    out.rows.push_back(readme_row(out.runs.back()));
    std::printf("%-16s %s  %.1f s wall\n", row.preset.c_str(), out.rows.back().c_str(),
                out.runs.back().wall_s);
  }
  return out;
}

// README's `index`-th table under `header` holds `rows` as predicted now
// on `profile`, with its summary line `title` + mean and max; every row
// within `row_bound`, the mean within `mean_bound`. `out`: the predictions.
inline void expect_readme_table(const char* header, const std::vector<PublishedRun>& rows, const std::string& title,
                                double row_bound, double mean_bound, const char* profile = "h100-nvlink",
                                size_t index = 0, Predicted* out = nullptr) {
  const Predicted t = predict_all(rows, profile);
  if (out) *out = t;
  const std::string summary = title + readme_summary(t.runs);
  std::printf("%s\n", summary.c_str());
  const auto readme = read_readme_tables(header);
  ASSERT_GT(readme.tables.size(), index) << "README: table " << index << " under " << header << "\n" << t.text();
  EXPECT_EQ(readme.tables[index], t.rows) << "README's rows, as predicted now:\n" << t.text();
  EXPECT_NE(readme.text.find(summary), std::string::npos) << "README lacks the line \"" << summary << "\"";
  double sum = 0;
  for (const PredictedRun& r : t.runs) {  // a NaN error fails too
    EXPECT_LE(std::abs(r.error), row_bound) << r.row.name << " on " << r.row.gpus << " GPUs";
    sum += std::abs(r.error);
  }
  EXPECT_LE(sum / double(t.runs.size()), mean_bound) << "mean |error|";
}

}  // namespace shardlab::train::readme
