// The sweep's grid, metrics, outputs, crossovers and gnuplot scripts
// (model/sweep/sweep.h), without running anything.
#include "model/sweep/sweep.h"

#include <cmath>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "runtime/errors.h"

namespace shardlab::sweep {
namespace {

std::vector<Axis> axes_of(const std::vector<std::string>& texts) {
  std::vector<Axis> axes;
  for (const auto& t : texts) axes.push_back(parse_axis(t));
  return axes;
}

// A result per grid point, metric 0 = f(x value of the first axis, point).
template <class F>
std::vector<PointResult> results_of(const std::vector<Axis>& axes, F f) {
  std::vector<PointResult> out;
  for (const GridPoint& p : expand_grid(axes)) {
    PointResult r;
    r.point = p;
    r.metrics = {f(p)};
    out.push_back(r);
  }
  return out;
}

TEST(SweepGrid, PlainAndTiedAxes) {
  const Axis batch = parse_axis("batch=1,2,4");
  EXPECT_EQ(batch.name, "batch");
  EXPECT_FALSE(batch.tied());
  ASSERT_EQ(batch.values.size(), 3u);
  EXPECT_EQ(batch.values[2].label, "4");
  EXPECT_EQ(batch.values[2].settings[0].flag, "batch");
  EXPECT_EQ(batch.values[2].settings[0].value, "4");

  // The second value names its flags in another order: kept in the first's.
  const Axis split = parse_axis("tp=8,pp=1|pp=8,tp=1");
  EXPECT_EQ(split.name, "tp,pp");
  EXPECT_TRUE(split.tied());
  ASSERT_EQ(split.values.size(), 2u);
  EXPECT_EQ(split.values[1].label, "tp=1,pp=8");
  EXPECT_EQ(split.values[1].settings[0].flag, "tp");
  EXPECT_EQ(split.values[1].settings[0].value, "1");
  EXPECT_EQ(split.values[1].settings[1].value, "8");

  // Two '=' without '|': one tied value.
  const Axis one = parse_axis("tp=2,sp=true");
  EXPECT_TRUE(one.tied());
  EXPECT_EQ(one.values.size(), 1u);
}

TEST(SweepGrid, BadAxesAreOneLine) {
  for (const char* bad : {"batch", "batch=", "batch=1,,2", "=1,2", "batch=1,1", "Batch=1", "--tp=1,2",
                          "tp=8,pp=1|tp=1", "tp=8,pp=1|tp=1,dp=8", "tp=8,tp=1|tp=2,tp=3", "tp=8,pp=1|",
                          "tp=8,pp=1|tp=8,pp=1", "profile=a b"}) {
    try {
      parse_axis(bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const ConfigError& e) {
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("`vary` "), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(check_distinct_flags(axes_of({"tp=1,2", "tp=8,pp=1|tp=1,pp=8"})), ConfigError);
  EXPECT_NO_THROW(check_distinct_flags(axes_of({"batch=1,2", "tp=8,pp=1|tp=1,pp=8"})));
}

TEST(SweepGrid, ProductWithTheFirstAxisFastest) {
  const auto axes = axes_of({"batch=1,2,4", "profile=a100-nvlink,a100-pcie", "tp=8,pp=1|tp=1,pp=8"});
  const auto grid = expand_grid(axes);
  ASSERT_EQ(grid.size(), 12u);
  for (size_t k = 0; k < 2; ++k) {
    for (size_t j = 0; j < 2; ++j) {
      for (size_t i = 0; i < 3; ++i) {
        const GridPoint& p = grid[i + 3 * j + 6 * k];
        EXPECT_EQ(p.index, (std::vector<size_t>{i, j, k}));
        ASSERT_EQ(p.settings.size(), 4u);
        EXPECT_EQ(p.settings[0].value, std::to_string(1 << i));
        EXPECT_EQ(p.settings[1].value, j == 0 ? "a100-nvlink" : "a100-pcie");
        EXPECT_EQ(p.settings[2].flag, "tp");
        EXPECT_EQ(p.settings[2].value, k == 0 ? "8" : "1");
        EXPECT_EQ(p.settings[3].value, k == 0 ? "1" : "8");
      }
    }
  }
  EXPECT_EQ(point_label(axes, grid[7]), "batch=2 profile=a100-nvlink tp=1,pp=8");
  EXPECT_TRUE(expand_grid({}).empty());
}

Series line(std::vector<double> x, double (*f)(double)) {
  Series s;
  s.x = x;
  for (double v : x) s.y.push_back(f(v));
  return s;
}

TEST(SweepCrossover, LinearLinesMeetWhereTheClosedFormSays) {
  const double tol = 1e-12;
  // y = 2x against y = 5: x = 2.5, between the samples 2 and 3.
  auto c = find_crossovers(line({0, 1, 2, 3, 4}, [](double x) { return 2 * x; }),
                           line({0, 1, 2, 3, 4}, [](double) { return 5.0; }), {}, {});
  ASSERT_EQ(c.size(), 1u);
  EXPECT_NEAR(c[0].x, 2.5, tol) << "diff " << c[0].x - 2.5;
  EXPECT_NEAR(c[0].y, 5.0, tol) << "diff " << c[0].y - 5.0;
  // y = 1 + 2x against y = 10 - x meet on a sample, x = 3: counted once.
  c = find_crossovers(line({0, 1, 2, 3, 4, 5}, [](double x) { return 1 + 2 * x; }),
                      line({0, 1, 2, 3, 4, 5}, [](double x) { return 10 - x; }), {}, {});
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].x, 3.0);
  EXPECT_EQ(c[0].y, 7.0);
  // Lines that touch without changing sides, or coincide, do not cross.
  EXPECT_TRUE(find_crossovers(line({0, 1, 2}, [](double x) { return x == 1 ? 0.0 : 1.0; }),
                              line({0, 1, 2}, [](double) { return 0.0; }), {}, {}).empty());
  EXPECT_TRUE(find_crossovers(line({1, 2, 4}, [](double x) { return x; }),
                              line({1, 2, 4}, [](double x) { return x; }), {2}, {}).empty());
  // Equal on two samples, then on the other side: one crossover, at the first.
  c = find_crossovers(line({0, 1, 2, 3}, [](double x) { return x; }),
                      line({0, 1, 2, 3}, [](double x) { return x == 0 ? 1.0 : x == 3 ? 2.0 : x; }), {}, {});
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].x, 1.0);
  // Parallel lines never meet.
  EXPECT_TRUE(find_crossovers(line({1, 2, 3}, [](double x) { return x; }),
                              line({1, 2, 3}, [](double x) { return x + 1; }), {}, {}).empty());
  // Only the x both lines have are adjacent: b lacks x = 2, so 1..3 is one segment.
  Series a = line({1, 2, 3}, [](double x) { return x; });
  Series b = line({1, 3}, [](double x) { return 4 - x; });
  c = find_crossovers(a, b, {}, {});
  ASSERT_EQ(c.size(), 1u);
  EXPECT_NEAR(c[0].x, 2.0, tol);
}

TEST(SweepCrossover, LogAxesInterpolateInLogCoordinates) {
  const double tol = 1e-9;
  // y = log2(x) against y = 1.5 on a log2 x axis: straight lines there, x = 2^1.5.
  auto c = find_crossovers(line({1, 2, 4, 8}, [](double x) { return std::log2(x); }),
                           line({1, 2, 4, 8}, [](double) { return 1.5; }), {2}, {});
  ASSERT_EQ(c.size(), 1u);
  EXPECT_NEAR(c[0].x, std::pow(2.0, 1.5), tol) << "diff " << c[0].x - std::pow(2.0, 1.5);
  // y = x^2 against y = 10x on log-log axes: x = 10, y = 100, between samples 8 and 16.
  c = find_crossovers(line({1, 2, 4, 8, 16}, [](double x) { return x * x; }),
                      line({1, 2, 4, 8, 16}, [](double x) { return 10 * x; }), {2}, {10});
  ASSERT_EQ(c.size(), 1u);
  EXPECT_NEAR(c[0].x, 10.0, tol) << "diff " << c[0].x - 10.0;
  EXPECT_NEAR(c[0].y, 100.0, tol * 10) << "diff " << c[0].y - 100.0;
}

TEST(SweepScale, LogWherePowersOfTwoOrTwoDecades) {
  EXPECT_EQ(choose_x_scale({1, 2, 4, 8, 16, 32}).log_base, 2);
  EXPECT_EQ(choose_x_scale({1, 2}).log_base, 0);  // too few to call it a doubling series
  EXPECT_EQ(choose_x_scale({1, 2, 3}).log_base, 0);
  EXPECT_EQ(choose_x_scale({1, 10, 100}).log_base, 10);
  EXPECT_EQ(choose_x_scale({-1, 100, 1000}).log_base, 0);
  EXPECT_EQ(choose_y_scale({0.5, 3, 49.9}).log_base, 0);
  EXPECT_EQ(choose_y_scale({0.5, 3, 50}).log_base, 10);
}

nlohmann::json small_report() {
  return {{"config", {{"batch", 4}, {"model", {{"seq", 8}}}}},
          {"steps", nlohmann::json::array({nlohmann::json::object(), nlohmann::json::object()})},
          {"summary", {{"virtual_step_s", 0.5}, {"mfu", 0.25}}},
          {"devices",
           {{{"peak_bytes", 10}, {"comm_s", 0.2}, {"peak_bytes_by_kind", {{"activation", 7}}}},
            {{"peak_bytes", 30}, {"comm_s", 0.6}, {"peak_bytes_by_kind", {{"activation", 3}}}}}}};
}

TEST(SweepMetrics, ReadOffTheReport) {
  const nlohmann::json r = small_report();
  EXPECT_EQ(metric_value("virtual_step_s", r), 0.5);
  EXPECT_EQ(metric_value("mfu", r), 0.25);
  EXPECT_EQ(metric_value("tokens_per_s", r), 4 * 8 / 0.5);
  EXPECT_EQ(metric_value("peak_memory_bytes", r), 30);
  EXPECT_EQ(metric_value("peak_activation_bytes", r), 7);
  EXPECT_EQ(metric_value("comm_s", r), 0.6 / 2);  // the worst device, per step
  EXPECT_THROW(metric_value("step_time", r), ConfigError);
  EXPECT_THROW(metric_value("bubble_fraction", r), ConfigError);  // not in this report
  for (const MetricInfo& m : metrics()) EXPECT_EQ(&metric_info(m.name), &m);
  nlohmann::json phantom = r;
  phantom["summary"]["final_loss"] = 0;
  EXPECT_EQ(metric_value("final_loss", phantom), 0);
  phantom["phantom"] = {{"folded", "nothing folded"}};
  EXPECT_THROW(metric_value("final_loss", phantom), ConfigError);  // no loss was computed
}

TEST(SweepOutput, CsvAndJsonHoldEveryPoint) {
  const auto axes = axes_of({"batch=1,2", "tp=8,pp=1|tp=1,pp=8"});
  auto results = results_of(axes, [](const GridPoint& p) { return 0.25 * double(p.index[0] + 2 * p.index[1]); });
  results[3].metrics.clear();
  results[3].error = "device 0: out of memory, \"activations\"";
  const std::string csv = points_csv(axes, {"virtual_step_s"}, results);
  EXPECT_EQ(csv,
            "point,batch,tp,pp,virtual_step_s,error,wall_s\n"
            "0,1,8,1,0,,0.000\n"
            "1,2,8,1,0.25,,0.000\n"
            "2,1,1,8,0.5,,0.000\n"
            "3,2,1,8,,\"device 0: out of memory, \"\"activations\"\"\",0.000\n");
  const nlohmann::json j = points_json(axes, {"virtual_step_s"}, results);
  EXPECT_EQ(j["axes"][1]["name"], "tp,pp");
  EXPECT_EQ(j["axes"][1]["values"][1], "tp=1,pp=8");
  ASSERT_EQ(j["points"].size(), 4u);
  EXPECT_EQ(j["points"][2]["config"], nlohmann::json({{"batch", "1"}, {"tp", "1"}, {"pp", "8"}}));
  EXPECT_EQ(j["points"][2]["metrics"]["virtual_step_s"], 0.5);
  EXPECT_EQ(j["points"][3]["error"], results[3].error);
  EXPECT_FALSE(j["points"][3].contains("metrics"));
}

TEST(SweepPlot, LinesCrossoversAndTheGnuplotScript) {
  // TP: 1 + x; PP: 4 + x/4 (seconds): they cross at x = 4, y = 5, where
  // log2 interpolation between 2 and 8 is not exact, so 4 is a sample.
  const auto axes = axes_of({"batch=1,2,4,8", "tp=8,pp=1|tp=1,pp=8"});
  const auto results = results_of(axes, [](const GridPoint& p) {
    const double x = double(1 << p.index[0]);
    return p.index[1] == 0 ? 1 + x : 4 + x / 4;
  });
  const Plot plot = build_plot(axes, {"virtual_step_s"}, 0, results);
  EXPECT_TRUE(plot.numeric_x);
  EXPECT_EQ(plot.x_scale.log_base, 2);
  EXPECT_EQ(plot.y_scale.log_base, 0);
  ASSERT_EQ(plot.series.size(), 2u);
  EXPECT_EQ(plot.series[1].label, "tp=1,pp=8");
  EXPECT_EQ(plot.series[0].y, (std::vector<double>{2e3, 3e3, 5e3, 9e3}));  // plotted in ms
  ASSERT_EQ(plot.crossovers.size(), 1u);
  EXPECT_EQ(plot.crossovers[0].x, 4.0);
  EXPECT_EQ(plot.crossovers[0].y, 5e3);
  EXPECT_EQ(plot.crossover_text[0], "tp=8,pp=1 = tp=1,pp=8 at batch 4 (5000)");

  const std::string data = plot_data(plot);
  EXPECT_NE(data.find("# tp=8,pp=1\n1\t2000\t1\n2\t3000\t2\n4\t5000\t4\n8\t9000\t8\n\n\n# tp=1,pp=8\n"),
            std::string::npos) << data;
  const std::string gp = gnuplot_script(plot, "virtual_step_s");
  for (const char* want :
       {"set datafile separator \"\\t\"\n", "set xlabel \"global batch (sequences)\"\n",
        "set ylabel \"step time (ms, virtual)\"\n", "set logscale x 2\n",
        "set xtics (\"1\" 1, \"2\" 2, \"4\" 4, \"8\" 8)\n",
        "# crossover: tp=8,pp=1 = tp=1,pp=8 at batch 4 (5000)\nset label 1 \"batch 4 (5000)\" at 4,5000 point",
        "set yrange [0:*]\n",
        "set terminal pngcairo", "set output \"virtual_step_s.png\"\n",
        "plot \"virtual_step_s.dat\" index 0 using 1:2 with linespoints linewidth 2 pointtype 7 pointsize 1.4 title \"tp=8,pp=1\"",
        "\"\" index 1 using 1:2 with linespoints linewidth 2 pointtype 6 pointsize 1.4 title \"tp=1,pp=8\"",
        "set terminal svg", "set output \"virtual_step_s.svg\"\nreplot\n", "set key"}) {
    EXPECT_NE(gp.find(want), std::string::npos) << want << "\nin:\n" << gp;
  }
  EXPECT_EQ(gp.find("set logscale y"), std::string::npos) << gp;
}

TEST(SweepPlot, OnlyLinesThatDifferInOneAxisAreCompared) {
  // x against two other axes: lines (p0,s0) (p1,s0) (p0,s1) (p1,s1). Every
  // pair crosses; the diagonal pairs differ in both axes and are not marked.
  const auto axes = axes_of({"batch=1,2,3", "profile=p0,p1", "seq=8,16"});
  const auto results = results_of(axes, [](const GridPoint& p) {
    const double x = double(p.index[0] + 1), k = double(p.index[1] + 2 * p.index[2]);
    return (k - 1.5) * (x - 3) + k;  // line k: slope k - 1.5; all four meet at (2, 1.5)
  });
  const Plot plot = build_plot(axes, {"virtual_step_s"}, 0, results);
  ASSERT_EQ(plot.series.size(), 4u);
  EXPECT_EQ(plot.series[3].label, "profile=p1 seq=16");
  EXPECT_EQ(plot.crossovers.size(), 4u);  // 6 pairs less the 2 diagonals
  for (const Crossover& c : plot.crossovers) EXPECT_NE(c.a + c.b, 3u) << c.a << " " << c.b;
}

TEST(SweepPlot, TiedFirstAxisIsDrawnAgainstItsFirstFlag) {
  // TP: 2x; PP: 6 + x/2: they cross at x = 4 (a sample), y = 8.
  const auto axes = axes_of({"batch=1,micro-batches=1|batch=4,micro-batches=4|batch=16,micro-batches=16",
                             "tp=8,pp=1|tp=1,pp=8"});
  const auto results = results_of(axes, [](const GridPoint& p) {
    const double x = double(1 << (2 * p.index[0]));
    return p.index[1] == 0 ? 2 * x : 6 + x / 2;
  });
  const Plot plot = build_plot(axes, {"mfu"}, 0, results);
  EXPECT_TRUE(plot.numeric_x);
  EXPECT_EQ(plot.x_title, "global batch (sequences), with micro-batches");
  EXPECT_EQ(plot.x_labels, (std::vector<std::string>{"1", "4", "16"}));
  EXPECT_EQ(plot.x_scale.log_base, 2);
  EXPECT_EQ(plot.series[0].x, (std::vector<double>{1, 4, 16}));
  ASSERT_EQ(plot.crossover_text.size(), 1u);
  EXPECT_EQ(plot.crossover_text[0], "tp=8,pp=1 = tp=1,pp=8 at batch 4 (800)");  // mfu plotted in %
}

TEST(SweepPlot, CategoricalFirstAxis) {
  const auto axes = axes_of({"profile=a100-nvlink,a100-pcie", "batch=1,2"});
  auto results = results_of(axes, [](const GridPoint& p) { return double(p.index[0] + p.index[1]); });
  results[1].metrics.clear();
  results[1].error = "failed";
  const Plot plot = build_plot(axes, {"virtual_step_s"}, 0, results);
  EXPECT_FALSE(plot.numeric_x);
  EXPECT_TRUE(plot.crossovers.empty());
  ASSERT_EQ(plot.series.size(), 2u);
  EXPECT_EQ(plot.series[0].x, (std::vector<double>{0}));  // the failed point is left out
  const std::string gp = gnuplot_script(plot, "m");
  EXPECT_NE(gp.find("using 1:2:xtic(3)"), std::string::npos) << gp;
  EXPECT_NE(gp.find("set xrange [-0.5:1.5]"), std::string::npos) << gp;
  EXPECT_NE(plot_data(plot).find("0\t0\ta100-nvlink\n"), std::string::npos) << plot_data(plot);
}

}  // namespace
}  // namespace shardlab::sweep
