#include "cli/sweep_gnuplot.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "runtime/errors.h"

namespace shardlab::cli {
namespace {

// The gnuplot executable on PATH, or "" when there is none.
std::string find_gnuplot() {
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "";
  size_t start = 0;
  while (start <= dirs.size()) {
    size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    const std::string dir = dirs.substr(start, end - start);
    const std::string candidate = (dir.empty() ? "." : dir) + "/gnuplot";
    if (!dir.empty() && access(candidate.c_str(), X_OK) == 0) return candidate;
    start = end + 1;
  }
  return "";
}

// Runs `gnuplot script` inside `dir`, its output appended to dir/gnuplot.log;
// true when it exits 0.
bool run_gnuplot(const std::string& gnuplot, const std::string& dir, const std::string& script) {
  const pid_t pid = fork();
  if (pid < 0) return false;
  if (pid == 0) {
    const int log = open((dir + "/gnuplot.log").c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (log < 0 || chdir(dir.c_str()) != 0) _exit(126);
    dup2(log, STDOUT_FILENO);
    dup2(log, STDERR_FILENO);
    execl(gnuplot.c_str(), "gnuplot", script.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return false;
  }
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

}  // namespace

void write_sweep_file(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  if (!out) throw ConfigError(fmt::format("--out: cannot write \"{}\"", path));
}

void write_plots(const std::vector<sweep::Axis>& axes, const std::vector<std::string>& metric_names,
                 const std::vector<sweep::PointResult>& results, const std::string& dir, bool print) {
  const std::string gnuplot = find_gnuplot();
  for (size_t m = 0; m < metric_names.size(); ++m) {
    const sweep::Plot plot = sweep::build_plot(axes, metric_names, m, results);
    const std::string& stem = plot.metric;
    write_sweep_file(dir + "/" + stem + ".dat", sweep::plot_data(plot));
    write_sweep_file(dir + "/" + stem + ".gp", sweep::gnuplot_script(plot, stem));
    if (print) {
      for (const std::string& text : plot.crossover_text) fmt::print("crossover ({}): {}\n", stem, text);
      if (plot.numeric_x && plot.crossovers.empty()) fmt::print("crossover ({}): none between the lines\n", stem);
    }
    const bool drawable = std::any_of(plot.series.begin(), plot.series.end(), [](const auto& s) { return !s.x.empty(); });
    if (!drawable) {
      fmt::print(stderr, "sweep: no point ran, so {} has no plot\n", stem);
    } else if (!gnuplot.empty() && !run_gnuplot(gnuplot, dir, stem + ".gp")) {
      fmt::print(stderr, "sweep: gnuplot failed on {}/{}.gp (its messages are in {}/gnuplot.log)\n", dir, stem, dir);
    }
  }
  std::error_code ec;  // an empty log says nothing: leave no file
  if (std::filesystem::exists(dir + "/gnuplot.log", ec) && std::filesystem::file_size(dir + "/gnuplot.log", ec) == 0)
    std::filesystem::remove(dir + "/gnuplot.log", ec);
  if (gnuplot.empty())
    fmt::print(stderr, "sweep: gnuplot not found: wrote the .gp scripts and .dat files in {} but no PNG/SVG; "
               "install it (apt-get install gnuplot-nox, or make deps), then run gnuplot NAME.gp there\n", dir);
}

}  // namespace shardlab::cli
