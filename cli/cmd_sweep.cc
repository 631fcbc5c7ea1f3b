// `shardlab sweep`: train every point of a grid of configurations (in
// process, independent points in parallel), then write points.csv,
// points.json and, with --plot, a PNG and an SVG per metric.
//
// The grid logic, the outputs and the gnuplot scripts are in
// model/sweep/sweep.h; this file parses the flags, runs the points and
// drives gnuplot (sweep_gnuplot.cc).
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/cli.h"
#include "cli/field_flags.h"
#include "cli/flag_table.h"
#include "cli/sweep_gnuplot.h"
#include "cli/train_flags.h"
#include "model/train/trainer.h"
#include "runtime/errors.h"
#include "runtime/transport.h"

namespace shardlab::cli {
namespace {

struct SweepFlags {
  TrainFlags train;
  std::vector<std::string> vary, metric;
  std::string out;
  bool plot = false;
  std::optional<int> jobs;  // unset: the host's cores
};

// Flags a point may not vary: they name the sweep's own outputs or its console.
bool refused_axis(const std::string& flag) {
  for (const char* f : {"json", "trace", "pace", "report", "save", "verbose", "corrupt-shard", "help"})
    if (flag == f) return true;
  return false;
}

std::vector<sweep::Axis> parse_axes(const SweepFlags& f, CLI::App* sub) {
  if (f.vary.empty()) throw ConfigError("sweep: give at least one --vary NAME=V1,V2,...");
  std::vector<sweep::Axis> axes;
  for (const std::string& v : f.vary) axes.push_back(sweep::parse_axis(v));
  sweep::check_distinct_flags(axes);
  CLI::App probe;  // the train flags, to tell an axis name from a typo
  TrainFlags probe_flags;
  probe_flags.add(&probe);
  for (const sweep::Axis& a : axes) {
    for (const std::string& flag : a.flags) {
      if (refused_axis(flag) || !probe.get_option_no_throw("--" + flag)) {
        const std::string near = refused_axis(flag) ? "" : nearest_flag(probe, "--" + flag);
        if (!near.empty())
          throw ConfigError(fmt::format("--vary: unknown axis \"{}\" (did you mean {}?)", flag, near.substr(2)));
        throw ConfigError(fmt::format("--vary: unknown axis \"{}\" (a train flag without its dashes: batch, "
                                      "tp, pp, dp, micro-batches, layers, profile, ...)", flag));
      }
      if (sub->get_option_no_throw("--" + flag)->count() > 0)
        throw ConfigError(fmt::format("--{} is given as a flag and varied by --vary \"{}\": give it once", flag, a.name));
    }
  }
  return axes;
}

void check_sweep_flags(const SweepFlags& f) {
  if (!f.train.report.empty() || !f.train.opts.save_path.empty() || !f.train.common.trace.empty())
    throw ConfigError("sweep: --report, --save and --trace are per run; the sweep writes its points to --out");
  if (f.jobs && *f.jobs < 1) throw ConfigError(fmt::format("--jobs must be at least 1 (got {})", *f.jobs));
  for (const std::string& m : f.metric) sweep::metric_info(m);
  std::error_code ec;
  std::filesystem::create_directories(f.out, ec);
  // One probe per process: under mpirun every process checks the same directory at once.
  const std::string probe = f.out + "/.shardlab_sweep_probe." + std::to_string(::getpid());
  std::ofstream(probe) << "";
  if (ec || !std::filesystem::exists(probe))
    throw ConfigError(fmt::format("--out: cannot write to \"{}\"{}", f.out, ec ? " (" + ec.message() + ")" : ""));
  std::filesystem::remove(probe, ec);
}

std::optional<bool> on_off(const std::string& value) {
  for (const char* yes : {"true", "on", "yes", "1"})
    if (value == yes) return true;
  for (const char* no : {"false", "off", "no", "0"})
    if (value == no) return false;
  return std::nullopt;
}

// A point ready to run: its options, or why it cannot run.
struct Prepared {
  train::TrainOptions options;
  std::optional<HardwareProfile> profile;
  ClusterOptions cluster;
  std::string error;
};

// The base flags with the point's settings parsed over them, by train's own
// parser and checks (so a bad value is the error train would give).
Prepared prepare(const TrainFlags& base, const sweep::GridPoint& point) {
  Prepared p;
  try {
    TrainFlags flags = base;
    CLI::App app{"sweep point"};
    flags.add(&app);
    std::vector<std::string> args;  // CLI11 takes them last first
    for (auto s = point.settings.rbegin(); s != point.settings.rend(); ++s) {
      const CLI::Option* opt = app.get_option_no_throw("--" + s->flag);
      if (opt == nullptr || opt->get_expected_max() != 0) {
        args.push_back("--" + s->flag + "=" + s->value);
        continue;
      }
      // An on/off flag (`--vary no-overlap=false,true`): on is the flag
      // alone, off leaves it out (the base flags cannot give it: it is varied).
      if (const std::optional<bool> on = on_off(s->value); on.has_value()) {
        if (*on) args.push_back("--" + s->flag);
      } else {
        throw ConfigError(fmt::format("--{} is an on/off flag: vary it over true and false, not \"{}\"", s->flag,
                                      s->value));
      }
    }
    app.parse(args);
    p.profile = flags.profile();
    p.options = flags.options();
    p.cluster = flags.cluster_options();
  } catch (const std::exception& e) {  // CLI::ParseError (a value the flag refuses), ConfigError
    p.error = with_flag_names(with_flag_hint(e.what()));
  }
  return p;
}

sweep::PointResult run_point(const Prepared& p, const std::vector<std::string>& metric_names) {
  sweep::PointResult r;
  const auto start = std::chrono::steady_clock::now();
  r.error = p.error;
  if (r.ok()) {
    try {
      Cluster cluster(*p.profile, p.cluster);
      const train::TrainResult result = train::train(cluster, p.options);
      const nlohmann::json report = train::report_json(p.options, cluster, result);
      for (const std::string& m : metric_names) r.metrics.push_back(sweep::metric_value(m, report));
    } catch (const std::exception& e) {  // ConfigError, RunError (out of memory ...), bad_alloc
      r.metrics.clear();
      r.error = *e.what() ? with_flag_names(e.what()) : "failed";
    }
  }
  r.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

// One line per finished point on stderr (rewritten in place on a terminal).
class SweepProgress {
 public:
  explicit SweepProgress(size_t total) : total_(total), tty_(isatty(STDERR_FILENO)), start_(clock::now()) {}
  void done(const std::string& label, const sweep::PointResult& r) {
    const std::lock_guard<std::mutex> lock(mu_);
    ++done_;
    failed_ += r.ok() ? 0 : 1;
    const int width = 24, filled = int(width * done_ / total_);
    const double wall = std::chrono::duration<double>(clock::now() - start_).count();
    fmt::print(stderr, "{}sweep [{:#<{}}{:.<{}}] {}/{} points{}, {:.1f} s: {} {}{}", tty_ ? "\r" : "", "", filled,
               "", width - filled, done_, total_, failed_ ? fmt::format(" ({} failed)", failed_) : "", wall, label,
               r.ok() ? fmt::format("({:.1f} s)", r.wall_s) : "failed", tty_ && done_ < total_ ? "\033[K" : "\n");
    std::fflush(stderr);
  }

 private:
  using clock = std::chrono::steady_clock;
  std::mutex mu_;  // guards the counters and stderr's line
  size_t total_, done_ = 0, failed_ = 0;
  bool tty_;
  clock::time_point start_;
};

// Prepares every point on this thread (profiles, flag parsing and logging
// are not thread-safe), then trains them on `jobs` worker threads.
std::vector<sweep::PointResult> run_grid(const SweepFlags& f, const std::vector<sweep::Axis>& axes,
                                         const std::vector<sweep::GridPoint>& grid) {
  std::vector<Prepared> prepared;
  for (const sweep::GridPoint& p : grid) prepared.push_back(prepare(f.train, p));
  std::vector<sweep::PointResult> results(grid.size());
  SweepProgress progress(grid.size());
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t i = next++; i < grid.size(); i = next++) {
      results[i] = run_point(prepared[i], f.metric);
      results[i].point = grid[i];
      progress.done(sweep::point_label(axes, grid[i]), results[i]);
    }
  };
  size_t jobs = std::min<size_t>(grid.size(), f.jobs ? size_t(*f.jobs) : std::max(1u, std::thread::hardware_concurrency()));
  if (process_transport()) jobs = 1;  // under mpirun every process runs the points in the same order
  std::vector<std::thread> threads;
  for (size_t t = 1; t < jobs; ++t) threads.emplace_back(worker);
  worker();
  for (std::thread& t : threads) t.join();
  return results;
}

void print_table(const std::vector<sweep::Axis>& axes, const std::vector<std::string>& metric_names,
                 const std::vector<sweep::PointResult>& results) {
  std::vector<std::string> labels;
  size_t width = 5;
  for (const auto& r : results) width = std::max(width, (labels.emplace_back(sweep::point_label(axes, r.point))).size());
  fmt::print("{:<{}}", "point", width);
  for (const std::string& m : metric_names) fmt::print("  {:>16}", m);
  fmt::print("\n");
  for (size_t i = 0; i < results.size(); ++i) {
    fmt::print("{:<{}}", labels[i], width);
    if (!results[i].ok()) fmt::print("  error: {}", results[i].error);
    for (double v : results[i].metrics) fmt::print("  {:>16.6g}", v);
    fmt::print("\n");
  }
}

int run_sweep(SweepFlags& f, CLI::App* sub) {
  if (f.metric.empty()) f.metric = {"virtual_step_s"};
  const std::vector<sweep::Axis> axes = parse_axes(f, sub);
  check_sweep_flags(f);
  const std::vector<sweep::GridPoint> grid = sweep::expand_grid(axes);
  const std::vector<sweep::PointResult> results = run_grid(f, axes, grid);
  const nlohmann::json j = sweep::points_json(axes, f.metric, results);
  if (leader_process()) {  // under mpirun, one set of files (runtime/transport.h)
    write_sweep_file(f.out + "/points.csv", sweep::points_csv(axes, f.metric, results));
    write_sweep_file(f.out + "/points.json", j.dump(2) + "\n");
  }
  if (f.train.common.json) {
    print_json(j);
  } else {
    print_table(axes, f.metric, results);
  }
  if (f.plot && leader_process()) write_plots(axes, f.metric, results, f.out, !f.train.common.json);
  const size_t failed = size_t(std::count_if(results.begin(), results.end(), [](const auto& r) { return !r.ok(); }));
  fmt::print(stderr, "sweep: {} points, {} failed; wrote {}/points.csv and points.json\n", results.size(), failed, f.out);
  return failed == results.size() ? 1 : 0;
}

#define FIELD(path) FLAG_FIELD(SweepFlags, path)

FlagTable<SweepFlags> sweep_flags() {
  std::string known;
  for (const sweep::MetricInfo& m : sweep::metrics()) known += (known.empty() ? "" : ", ") + std::string(m.name);
  return {
      {"--vary", FIELD(vary),
       "AXIS=V1,V2,... (a train flag without dashes), or 'tp=8,pp=1|tp=1,pp=8' to set flags together; repeatable, "
       "the first is the plots' x axis"},
      {"--metric", FIELD(metric), "What to record (repeatable; default virtual_step_s): " + known},
      {"--out", FIELD(out), "Directory for points.csv, points.json and the plots", {}, false, false, false,
       /*required=*/true},
      {"--plot", FIELD(plot), "Plot every metric against the first axis (gnuplot: PNG, SVG and the .gp script)"},
      {"--jobs", FIELD(jobs), "Points run at once (default: the host's cores)"},
  };
}

#undef FIELD

}  // namespace

void add_sweep_command(CLI::App& app) {
  auto* sub = app.add_subcommand("sweep", "Train every point of a grid of configs; CSV, JSON and plots");
  auto f = std::make_shared<SweepFlags>();
  f->train.add(sub);
  add_flags(sub, *f, sweep_flags());
  std::string footer = "Metrics (per step; memory: the device with the highest peak):\n";
  for (const sweep::MetricInfo& m : sweep::metrics()) footer += fmt::format("  {:<24} {}\n", m.name, m.help);
  sub->footer(footer + "Exit status: 0 when the sweep ran (failed points are rows with their error), 1 when "
                       "every point failed, 2 on bad sweep input.");
  set_action(sub, [f, sub] { return run_sweep(*f, sub); });
}

}  // namespace shardlab::cli
