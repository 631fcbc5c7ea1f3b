// Phantom runs at published scale: Narayanan et al. 2021 Table 1 and the
// held-out rows (its Table 2; Korthikanti et al. 2022 Table 5), predicted
// against published teraFLOP/s per GPU or iteration times on one profile,
// with the host wall time and peak RSS of every phantom step (the speed
// goal: the 145.6B row on 1,536 GPUs and the 1T row on 3,072 GPUs within 60
// s and 4 GiB each). README's tables of these figures are pinned by
// tests/model/train/calibration_test.cc and heldout_test.cc.
//
//   build/bin/bench_phantom [--profile NAME|FILE.json] [--rows N]   (N rows of each table)
#include <sys/resource.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "model/train/calibration.h"
#include "runtime/errors.h"
#include "runtime/profile.h"

namespace {

using namespace shardlab;

// Predicts `rows` (at most `limit`) and prints one line each.
std::vector<train::PredictedRun> run_table(const std::vector<train::PublishedRun>& rows,
                                           const HardwareProfile& p, size_t limit) {
  fmt::print("{:>16} {:>3} {:>3} {:>5} {:>6} {:>10} {:>10} {:>10} {:>7} {:>8} {:>8} {:>9}\n",
             "model", "tp", "pp", "gpus", "batch", "step s", "TFLOP/s", "published", "error",
             "threads", "wall s", "RSS MiB");
  std::vector<train::PredictedRun> runs;
  for (const auto& row : rows) {
    if (runs.size() == limit) break;
    const train::PredictedRun& r = runs.emplace_back(train::predict(row, p));
    rusage u{};
    getrusage(RUSAGE_SELF, &u);
    fmt::print("{:>16} {:>3} {:>3} {:>5} {:>6} {:>10.3f} {:>10.1f} {:>10.0f} {:>+6.1f}% {:>8} {:>8.2f} {:>9.0f}\n",
               row.preset, row.tp, row.pp, row.gpus, r.options.model.batch_size, r.step_s,
               r.tflops_per_gpu, row.tflops_per_gpu, r.error * 100, r.running_devices, r.wall_s,
               double(u.ru_maxrss) / 1024);
    std::fflush(stdout);
  }
  fmt::print("{} ({} rows; RSS is the process peak so far)\n", train::readme_summary(runs), runs.size());
  return runs;
}

int run(int argc, char** argv) {
  std::string profile = "a100-nvlink";
  size_t rows = 100;
  for (int i = 1; i < argc; i += 2) {
    if (i + 1 >= argc || (std::strcmp(argv[i], "--profile") && std::strcmp(argv[i], "--rows")))
      throw ConfigError(fmt::format("unknown argument \"{}\" (--profile NAME|FILE.json, --rows N)", argv[i]));
    if (!std::strcmp(argv[i], "--profile")) profile = argv[i + 1];
    if (!std::strcmp(argv[i], "--rows")) rows = std::stoul(argv[i + 1]);
  }
  const HardwareProfile p = load_profile(profile);
  fmt::print("# Narayanan et al. 2021, Table 1, on profile {} (phantom, bf16, full recompute)\n", p.name);
  run_table(train::narayanan2021_table1(), p, rows);
  fmt::print(
      "# held out of the fit: Table 2, 175B and 530B with PTD parallelism (vocabulary 51200)\n");
  run_table(train::narayanan2021_table2(), p, rows);
  fmt::print("# held out of the fit: Korthikanti et al. 2022 Table 5 (iteration times)\n");
  run_table(train::korthikanti2022_table5(), p, rows);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_phantom: error: {}\n", e.what());
    return 2;
  }
}
