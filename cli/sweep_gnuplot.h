// A sweep's files: its plots, drawn with gnuplot (a separate program, found
// on PATH), and the writing of each output file.
#pragma once

#include <string>
#include <vector>

#include "model/sweep/sweep.h"

namespace shardlab::cli {

// For every metric: DIR/<metric>.dat and DIR/<metric>.gp, then, when gnuplot
// is on PATH, DIR/<metric>.png and .svg; the crossovers go to stdout when
// `print`. Without gnuplot: one line on stderr saying how to get the plots.
void write_plots(const std::vector<sweep::Axis>& axes, const std::vector<std::string>& metric_names,
                 const std::vector<sweep::PointResult>& results, const std::string& dir, bool print);

// Writes `text` to `path`; ConfigError naming --out when it cannot.
void write_sweep_file(const std::string& path, const std::string& text);

}  // namespace shardlab::cli
