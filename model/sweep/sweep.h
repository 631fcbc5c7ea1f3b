// The parts of `shardlab sweep` that do not run anything: the grid of
// configurations (axes, tied axes, their product), the metrics read off a
// train report, the CSV and JSON of the points, the lines of a plot, the
// crossovers between lines, and the gnuplot script that draws them.
//
// A grid is a list of axes. A plain axis sets one flag to each of its values
// (`batch=1,2,4`); a tied axis sets several flags together at each point
// (`tp=8,pp=1|tp=1,pp=8`). The grid is the product of the axes, the first
// axis varying fastest, so the points of one plotted line (the first axis
// against one combination of the others) are consecutive.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace shardlab::sweep {

// One flag (its name without dashes, e.g. "micro-batches") and its value.
struct Setting {
  std::string flag;
  std::string value;
};

// One value of an axis: its label ("4", or "tp=8,pp=1" on a tied axis) and
// the flags it sets.
struct AxisValue {
  std::string label;
  std::vector<Setting> settings;
};

struct Axis {
  std::string name;          // "batch", or "tp,pp" for a tied axis
  std::vector<std::string> flags;  // the flags every value sets, in order
  std::vector<AxisValue> values;
  bool tied() const { return flags.size() > 1; }
};

// Parses one --vary: "NAME=V1,V2,..." or "A=1,B=2|A=2,B=1" (a tied axis:
// '|' separates its values, each value sets the same flags). A text with
// more than one '=' is tied, even without '|'. Throws ConfigError (one line)
// for an empty name or value, a repeated value, or tied values that set
// different flags.
Axis parse_axis(const std::string& text);

// Throws ConfigError if two axes set the same flag.
void check_distinct_flags(const std::vector<Axis>& axes);

struct GridPoint {
  std::vector<size_t> index;      // (axes) which value of each axis
  std::vector<Setting> settings;  // every flag the point sets, in axis order
};

// The product of the axes, the first varying fastest.
std::vector<GridPoint> expand_grid(const std::vector<Axis>& axes);

// "batch=4 profile=a100-pcie tp=8,pp=1": the point's values, axis by axis.
std::string point_label(const std::vector<Axis>& axes, const GridPoint& point);

// A metric read off a train report (train::report_json).
struct MetricInfo {
  const char* name;   // the --metric key
  const char* title;  // axis title with its unit, as plotted
  double plot_scale;  // plotted value = metric x plot_scale (seconds as ms, ...)
  const char* help;
};
const std::vector<MetricInfo>& metrics();
// The metric named `name`, or ConfigError listing the known ones.
const MetricInfo& metric_info(const std::string& name);
// Its value in a report; ConfigError if the report lacks what it needs.
double metric_value(const std::string& name, const nlohmann::json& report);

// The outcome of one point: its metrics (in --metric order) or its error.
struct PointResult {
  GridPoint point;
  std::vector<double> metrics;  // empty when the point failed
  std::string error;            // one line; empty when it ran
  double wall_s = 0;            // host seconds the point took
  bool ok() const { return error.empty(); }
};

// points.csv: a header (point, every varied flag, the metrics, error, wall_s)
// and a row per point; fields with a comma or quote are quoted (RFC 4180).
std::string points_csv(const std::vector<Axis>& axes, const std::vector<std::string>& metric_names,
                       const std::vector<PointResult>& results);
// points.json: {"axes": [{name, flags, values}], "metrics": [...],
// "points": [{"config": {flag: value}, "metrics": {name: value} | "error": msg, "wall_s"}]}.
nlohmann::json points_json(const std::vector<Axis>& axes, const std::vector<std::string>& metric_names,
                           const std::vector<PointResult>& results);

// ---- Plots ---------------------------------------------------------------

// One plotted line: the first axis against one combination of the others.
struct Series {
  std::string label;            // "profile=a100-nvlink tp=8,pp=1" (the other axes' values)
  std::vector<size_t> others;   // (axes) the value index of each axis; [0] unused
  std::vector<size_t> xi;       // the points that ran: their value of the first axis
  std::vector<double> x, y;     // ... its number (or index, for categories) and the plotted metric
};

// How an axis is drawn: linear, log base 2 (powers of two), or log base 10
// (positive values spanning two decades or more).
struct Scale {
  int log_base = 0;  // 0: linear
};
// x: base 2 when every value is a power of two (at least 3 of them), base
// 10 when positive values span >= 100x, else linear. y: base 10 when
// positive values span >= 100x.
Scale choose_x_scale(const std::vector<double>& values);
Scale choose_y_scale(const std::vector<double>& values);

// Where two lines cross: between adjacent x (of those both have a value at),
// where they change sides, interpolated linearly in the drawn coordinates
// (log x and log y when the scale is log). Lines that cross through a sample
// where they are equal cross there, once; lines that only touch or coincide
// do not cross.
struct Crossover {
  double x = 0, y = 0;
  size_t a = 0, b = 0;  // the series
};
std::vector<Crossover> find_crossovers(const Series& a, const Series& b, Scale x_scale, Scale y_scale);

// Everything one metric's plot needs, built from the results.
struct Plot {
  std::string metric;
  std::string x_name;              // the first axis, or its first flag when it is tied and numeric
  std::string x_title, y_title;
  bool numeric_x = true;           // else categories: x is the value index
  std::vector<std::string> x_labels;  // (values of the first axis)
  Scale x_scale, y_scale;
  std::vector<Series> series;
  std::vector<Crossover> crossovers;  // between series that differ in one axis only
  std::vector<std::string> crossover_text;  // (crossovers) what each label says
};
Plot build_plot(const std::vector<Axis>& axes, const std::vector<std::string>& metric_names, size_t metric,
                const std::vector<PointResult>& results);

// The data file (tab-separated, one block per series) and the gnuplot script
// that renders `stem`.png and `stem`.svg from it in the same directory.
std::string plot_data(const Plot& plot);
std::string gnuplot_script(const Plot& plot, const std::string& stem);

// The axis title of a flag: "global batch (sequences)" for batch, ...
std::string axis_title(const std::string& flag);

}  // namespace shardlab::sweep
