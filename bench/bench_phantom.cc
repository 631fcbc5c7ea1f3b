// Phantom runs at published scale: Narayanan et al. 2021 Table 1, predicted
// against published teraFLOP/s per GPU on one profile, with the host wall
// time and peak RSS of every phantom step (the speed goal: the 145.6B row
// on 1,536 GPUs and the 1T row on 3,072 GPUs within 60 s and 4 GiB each).
//
//   build/bin/bench_phantom [--profile NAME|FILE.json] [--rows N]
#include <sys/resource.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>

#include <fmt/format.h>

#include "model/train/calibration.h"
#include "runtime/errors.h"
#include "runtime/profile.h"

namespace {

int run(int argc, char** argv) {
  using namespace shardlab;
  std::string profile = "a100-nvlink";
  size_t rows = 100;
  for (int i = 1; i < argc; i += 2) {
    if (i + 1 >= argc || (std::strcmp(argv[i], "--profile") && std::strcmp(argv[i], "--rows")))
      throw ConfigError(fmt::format("unknown argument \"{}\" (--profile NAME|FILE.json, --rows N)", argv[i]));
    if (!std::strcmp(argv[i], "--profile")) profile = argv[i + 1];
    if (!std::strcmp(argv[i], "--rows")) rows = std::stoul(argv[i + 1]);
  }
  const HardwareProfile p = load_profile(profile);
  fmt::print("# Narayanan et al. 2021, Table 1, on profile {} (phantom, bf16, full recompute)\n",
             p.name);
  fmt::print("{:>16} {:>3} {:>3} {:>5} {:>6} {:>10} {:>10} {:>10} {:>7} {:>8} {:>8} {:>9}\n",
             "model", "tp", "pp", "gpus", "batch", "step s", "TFLOP/s", "published", "error",
             "threads", "wall s", "RSS MiB");
  double sum = 0, worst = 0;
  size_t n = 0;
  for (const auto& row : train::narayanan2021_table1()) {
    if (n == rows) break;
    const train::PredictedRun r = train::predict(row, p);
    rusage u{};
    getrusage(RUSAGE_SELF, &u);
    fmt::print("{:>16} {:>3} {:>3} {:>5} {:>6} {:>10.3f} {:>10.1f} {:>10.0f} {:>+6.1f}% {:>8} {:>8.2f} {:>9.0f}\n",
               row.preset, row.tp, row.pp, row.gpus, r.options.model.batch_size, r.step_s,
               r.tflops_per_gpu, row.tflops_per_gpu, r.error * 100, r.running_devices, r.wall_s,
               double(u.ru_maxrss) / 1024);
    std::fflush(stdout);
    sum += std::abs(r.error);
    worst = std::max(worst, std::abs(r.error));
    ++n;
  }
  fmt::print("mean |error| {:.1f}%, max |error| {:.1f}% over {} rows (RSS is the process peak so far)\n",
             100 * sum / double(std::max<size_t>(n, 1)), 100 * worst, n);
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
