// Sweep plots: the lines of a metric against the first axis, their scales,
// the crossovers between them, and the gnuplot data and script.
#include <algorithm>
#include <cmath>
#include <map>

#include <fmt/format.h>

#include "model/sweep/sweep.h"
#include "runtime/parse_number.h"

namespace shardlab::sweep {
namespace {

bool power_of_two(double v) {
  if (!(v >= 1) || v > 9.0e15 || v != std::floor(v)) return false;
  const auto n = static_cast<uint64_t>(v);
  return (n & (n - 1)) == 0;
}

bool spans_two_decades(const std::vector<double>& values) {
  if (values.empty() || !std::all_of(values.begin(), values.end(), [](double v) { return v > 0; })) return false;
  const auto [lo, hi] = std::minmax_element(values.begin(), values.end());
  return *hi / *lo >= 100;
}

// A coordinate as drawn: log_b(v) on a log axis.
double drawn(double v, Scale s) { return s.log_base ? std::log(v) / std::log(double(s.log_base)) : v; }
double undrawn(double v, Scale s) { return s.log_base ? std::pow(double(s.log_base), v) : v; }

std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (char c : s) out += (c == '"' || c == '\\') ? std::string("\\") + c : std::string(1, c);
  return out + "\"";
}

}  // namespace

Scale choose_x_scale(const std::vector<double>& values) {
  std::vector<double> distinct = values;
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  if (distinct.size() >= 3 && std::all_of(distinct.begin(), distinct.end(), power_of_two)) return {2};
  return {spans_two_decades(distinct) ? 10 : 0};
}

Scale choose_y_scale(const std::vector<double>& values) { return {spans_two_decades(values) ? 10 : 0}; }

std::vector<Crossover> find_crossovers(const Series& a, const Series& b, Scale x_scale, Scale y_scale) {
  // The x both lines have, in increasing order, with the drawn gap between them.
  std::map<double, double> b_at;
  for (size_t i = 0; i < b.x.size(); ++i) b_at[b.x[i]] = b.y[i];
  struct Both { double x, ya, yb; };
  std::vector<Both> both;
  for (size_t i = 0; i < a.x.size(); ++i)
    if (const auto it = b_at.find(a.x[i]); it != b_at.end()) both.push_back({a.x[i], a.y[i], it->second});
  std::sort(both.begin(), both.end(), [](const Both& l, const Both& r) { return l.x < r.x; });
  std::vector<double> gap;
  for (const Both& p : both) gap.push_back(drawn(p.ya, y_scale) - drawn(p.yb, y_scale));
  std::vector<Crossover> out;
  for (size_t k = 0; k + 1 < both.size(); ++k) {
    if (gap[k] == 0) continue;
    // The next sample on a side: past a run of equal samples (the lines touch there).
    size_t next = k + 1;
    while (next + 1 < both.size() && gap[next] == 0) ++next;
    if (gap[next] == 0 || (gap[k] < 0) == (gap[next] < 0)) continue;  // no change of side
    if (next > k + 1) {  // they cross through the equal samples: at the first one
      out.push_back({both[k + 1].x, both[k + 1].ya});
      continue;
    }
    const double t = gap[k] / (gap[k] - gap[next]);
    const double x0 = drawn(both[k].x, x_scale), x1 = drawn(both[next].x, x_scale);
    const double y0 = drawn(both[k].ya, y_scale), y1 = drawn(both[next].ya, y_scale);
    out.push_back({undrawn(x0 + t * (x1 - x0), x_scale), undrawn(y0 + t * (y1 - y0), y_scale)});
  }
  return out;
}

namespace {

// The other axes' values of a series ("profile=a100-pcie tp=8,pp=1").
std::string series_label(const std::vector<Axis>& axes, const std::vector<size_t>& index, size_t skip = 0) {
  std::string out;
  for (size_t a = 1; a < axes.size(); ++a) {
    if (a == skip) continue;
    const Axis& axis = axes[a];
    const std::string& v = axis.values[index[a]].label;
    out += (out.empty() ? "" : " ") + (axis.tied() ? v : axis.name + "=" + v);
  }
  return out;
}

// Marks the crossovers of every pair of series that differ in one axis only
// (the same conditions but one): lines that differ in two are not compared.
void add_crossovers(const std::vector<Axis>& axes, Plot& plot) {
  for (size_t i = 0; i < plot.series.size(); ++i) {
    for (size_t j = i + 1; j < plot.series.size(); ++j) {
      const Series &a = plot.series[i], &b = plot.series[j];
      size_t differing = 0, axis = 0;
      for (size_t k = 1; k < axes.size(); ++k)
        if (a.others[k] != b.others[k]) ++differing, axis = k;
      if (differing != 1) continue;
      for (Crossover c : find_crossovers(a, b, plot.x_scale, plot.y_scale)) {
        c.a = i;
        c.b = j;
        const std::string context = series_label(axes, a.others, axis);
        plot.crossover_text.push_back(fmt::format(
            "{} = {}{} at {} {:.3g} ({:.4g})", axes[axis].values[a.others[axis]].label,
            axes[axis].values[b.others[axis]].label, context.empty() ? "" : " (" + context + ")",
            plot.x_name, c.x, c.y));
        plot.crossovers.push_back(c);
      }
    }
  }
}

}  // namespace

Plot build_plot(const std::vector<Axis>& axes, const std::vector<std::string>& metric_names, size_t metric,
                const std::vector<PointResult>& results) {
  const MetricInfo& info = metric_info(metric_names[metric]);
  Plot plot;
  plot.metric = info.name;
  plot.y_title = info.title;
  // A tied first axis is drawn against its first flag's values when they are
  // numbers ('batch=1,micro-batches=1|batch=2,micro-batches=2|...').
  const Axis& x_axis = axes.front();
  plot.x_name = x_axis.flags.front();
  plot.x_title = axis_title(plot.x_name);
  for (size_t f = 1; f < x_axis.flags.size(); ++f) plot.x_title += (f == 1 ? ", with " : " and ") + x_axis.flags[f];
  std::vector<double> xs;
  for (const AxisValue& v : x_axis.values) {
    const auto n = parse_number<double>(v.settings.front().value);  // "4", "0.5", "1e3"
    plot.numeric_x = plot.numeric_x && n.has_value() &&
                     std::find(xs.begin(), xs.end(), *n) == xs.end();
    xs.push_back(n.value_or(0));
    plot.x_labels.push_back(v.settings.front().value);
  }
  if (!plot.numeric_x) {
    plot.x_name = x_axis.name;
    plot.x_title = x_axis.tied() ? x_axis.name : axis_title(x_axis.name);
    for (size_t i = 0; i < xs.size(); ++i) {
      xs[i] = double(i);
      plot.x_labels[i] = x_axis.values[i].label;
    }
  }
  plot.x_scale = plot.numeric_x ? choose_x_scale(xs) : Scale{};
  std::map<std::vector<size_t>, size_t> by_others;  // the series of each combination, in grid order
  std::vector<double> ys;
  for (const PointResult& r : results) {
    std::vector<size_t> others = r.point.index;
    others[0] = 0;
    auto [it, fresh] = by_others.emplace(others, plot.series.size());
    if (fresh) plot.series.push_back({series_label(axes, others), others, {}, {}, {}});
    if (!r.ok()) continue;
    Series& s = plot.series[it->second];
    s.xi.push_back(r.point.index[0]);
    s.x.push_back(xs[r.point.index[0]]);
    s.y.push_back(r.metrics[metric] * info.plot_scale);
    ys.push_back(s.y.back());
  }
  if (axes.size() == 1 && !plot.series.empty()) plot.series.front().label = info.name;
  plot.y_scale = choose_y_scale(ys);
  if (plot.numeric_x) add_crossovers(axes, plot);
  return plot;
}

std::string plot_data(const Plot& plot) {
  std::string out = fmt::format("# shardlab sweep: {} against {}; one block per line: x, y, x label\n",
                                plot.metric, plot.x_title);
  bool first = true;
  for (const Series& s : plot.series) {
    if (s.x.empty()) continue;  // every point of the line failed: nothing to draw
    out += fmt::format("{}# {}\n", first ? "" : "\n\n", s.label);
    first = false;
    for (size_t i = 0; i < s.x.size(); ++i)
      out += fmt::format("{:.9g}\t{:.9g}\t{}\n", s.x[i], s.y[i], plot.x_labels[s.xi[i]]);
  }
  return out;
}

namespace {

std::string axes_commands(const Plot& plot) {
  std::string out;
  if (plot.x_scale.log_base) out += fmt::format("set logscale x {}\n", plot.x_scale.log_base);
  if (plot.y_scale.log_base) out += fmt::format("set logscale y {}\n", plot.y_scale.log_base);
  if (plot.numeric_x && plot.x_scale.log_base == 2) {
    std::string tics;  // the swept values themselves, not gnuplot's choice of powers
    for (const std::string& l : plot.x_labels) tics += fmt::format("{}{} {}", tics.empty() ? "" : ", ", quoted(l), l);
    out += fmt::format("set xtics ({})\n", tics);
  }
  if (!plot.numeric_x) out += fmt::format("set xrange [-0.5:{}.5]\n", plot.x_labels.size() - 1);
  bool non_negative = true;  // then a linear y axis starts at 0
  for (const Series& s : plot.series)
    non_negative = non_negative && std::all_of(s.y.begin(), s.y.end(), [](double y) { return y >= 0; });
  if (!plot.y_scale.log_base && non_negative) out += "set yrange [0:*]\n";
  return out;
}

}  // namespace

std::string gnuplot_script(const Plot& plot, const std::string& stem) {
  std::string out = fmt::format(
      "# shardlab sweep: {} against {}, one line per combination of the other axes.\n"
      "# Re-render: gnuplot {}.gp (in this directory; writes {}.png and {}.svg)\n"
      "set datafile separator \"\\t\"\n"
      "set title {}\nset xlabel {}\nset ylabel {}\n"
      "set grid\nset key outside right top\n"
      "set offsets graph 0.04, graph 0.04, graph 0.06, 0\n",
      plot.metric, plot.x_title, stem, stem, stem, quoted(plot.y_title + " against " + plot.x_title),
      quoted(plot.x_title), quoted(plot.y_title));
  out += axes_commands(plot);
  // Each crossover: a ring on the plot with its x and y; the full sentence
  // (which lines) is in the comment above it and on the sweep's stdout.
  for (size_t i = 0; i < plot.crossovers.size(); ++i) {
    const Crossover& c = plot.crossovers[i];
    out += fmt::format("# crossover: {}\nset label {} {} at {:.9g},{:.9g} point pointtype 6 pointsize 2.5 "
                       "lc rgb \"black\" offset character -4,character {} font \",9\" front\n",
                       plot.crossover_text[i], i + 1, quoted(fmt::format("{} {:.3g} ({:.4g})", plot.x_name, c.x, c.y)),
                       c.x, c.y, i % 2 ? -1.8 : 1.8);
  }
  std::string plot_cmd;
  const std::string data = quoted(stem + ".dat");
  const std::string columns = plot.numeric_x ? "1:2" : "1:2:xtic(3)";
  size_t block = 0;
  for (const Series& s : plot.series) {
    if (s.x.empty()) continue;
    // Filled and open markers in turn, so lines that coincide stay visible.
    static constexpr int kPointTypes[] = {7, 6, 5, 4, 9, 8, 11, 10, 13, 12};
    plot_cmd += fmt::format("{}{} index {} using {} with linespoints linewidth 2 pointtype {} pointsize 1.4 title {}",
                            block == 0 ? "plot " : ", \\\n     ", block == 0 ? data : "\"\"", block, columns,
                            kPointTypes[block % std::size(kPointTypes)], quoted(s.label));
    ++block;
  }
  out += fmt::format("set terminal pngcairo size 1100,650 font \"sans,10\" noenhanced\n"
                     "set output {}\n{}\n"
                     "set terminal svg size 1100,650 font \"sans,10\" noenhanced\n"
                     "set output {}\nreplot\nunset output\n",
                     quoted(stem + ".png"), plot_cmd, quoted(stem + ".svg"));
  return out;
}

}  // namespace shardlab::sweep
