// Phantom runs at published scale: Narayanan et al. 2021 Table 1 and the
// held-out rows (its Table 2; Korthikanti et al. 2022 Table 5), predicted
// against published teraFLOP/s per GPU or iteration times on one profile,
// with the host wall time and peak RSS of every phantom step (the speed
// goal: the 145.6B row on 1,536 GPUs and the 1T row on 3,072 GPUs within 60
// s and 4 GiB each). README's tables of these figures are pinned by
// tests/model/train/calibration_test.cc and heldout_test.cc.
//
//
// --scale NAME: one phantom step at today's scale on h100-nvlink (bf16, ZeRO-1,
// micro-batch 1, 16 micro-batches), with its wall time, peak RSS and fold
// (issue 30's goals: the first two within 30 s and 4 GiB, the third within
// 120 s and 8 GiB; one run per process, so the RSS is that run's):
//   llama3-405b-16k  llama3-405b, TP 8, PP 16, DP 128, seq 8192, SP, full recompute
//   deepseek-v3-2k   deepseek-v3, PP 16, EP 64, DP 128, seq 4096, full recompute
//   llama3-70b-100k  llama3-70b, TP 8, PP 4, DP 3125, seq 8192, SP, full recompute
//
//   build/bin/bench_phantom [--profile NAME|FILE.json] [--rows N]   (N rows of each table)
//   build/bin/bench_phantom --scale NAME [--layers N] [--micro-batches M] [--no-fold]
//     (prints a digest of every device's virtual figures, to compare two builds)
//     (--layers and --micro-batches shrink a scale run into a sibling that
//     runs in seconds, for profiling; --no-fold runs every rank on a thread)
//   build/bin/bench_phantom --table table1|table2|table5 [...]   (one of the three above, on a100-nvlink)
//   build/bin/bench_phantom --table nemo|nemo-heldout|bridge|bridge-2604|bridge-b200|llama3|mcore|mcore-strong [--profile NAME|FILE.json] [--rows N] [--from I] [--trace FILE.json] [--no-fold]
//     (--from I: the table's rows from the I-th on, 0 first; --trace FILE.json:
//     the Chrome trace of the first row run, e.g. --from 2 --rows 1 --trace t.json)
//     NVIDIA's NeMo 24.07 DGX-H100 FP8 rows (nemo-heldout: its Llama rows
//     held out of the fit), Megatron-Bridge 25.11's
//     DGX-H100 FP8 rows (held out; bridge-2604: 26.04.01's rows of the same
//     recipes with larger batches, held out), Dubey et al. 2024 Table 4 (Llama 3
//     405B, BF16) or Megatron-LM's weak-scaling table (mcore: 1.7B to 462B
//     on H100 in BF16, held out; mcore-strong: its strong scaling's two
//     endpoints, GPT-3 on 96 and 4,608 GPUs) on h100-nvlink, Megatron-Bridge 25.11's DGX-B200 FP8 rows
//     (bridge-b200) on b200-nvlink, unless --profile says otherwise (a
//     FILE.json with another GEMM maximum: the fits of the FP8 GEMM maxima,
//     README "Calibration against a real cluster").
#include <fmt/format.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "model/train/calibration.h"
#include "model/train/trainer.h"
#include "runtime/cluster.h"
#include "runtime/errors.h"
#include "runtime/parse_number.h"
#include "runtime/profile.h"

namespace {

using namespace shardlab;

// The published tables --table runs: name, title, default profile, rows.
struct PublishedTable {
  const char* name;
  const char* title;
  const char* profile;
  const std::vector<train::PublishedRun>& (*rows)();
};
constexpr PublishedTable kTables[] = {
    {"table1", "Narayanan et al. 2021, Table 1", "a100-nvlink", train::narayanan2021_table1},
    {"table2", "Narayanan et al. 2021, Table 2 (held out)", "a100-nvlink", train::narayanan2021_table2},
    {"table5", "Korthikanti et al. 2022, Table 5 (held out)", "a100-nvlink", train::korthikanti2022_table5},
    {"nemo", "NeMo 24.07, DGX-H100, FP8", "h100-nvlink", train::nemo2407_h100_fp8},
    {"nemo-heldout", "NeMo 24.07, DGX-H100, FP8, the Llama rows held out", "h100-nvlink",
     train::nemo2407_h100_fp8_heldout},
    {"nemo-longseq", "NeMo 24.03.01, DGX-H100, FP8, Llama 2 7B at 4K to 1M tokens (held out)", "h100-nvlink",
     train::nemo2403_h100_fp8_long_sequence},
    {"bridge", "Megatron-Bridge 25.11, DGX-H100, FP8 (held out)", "h100-nvlink", train::megatron_bridge2511_h100_fp8},
    {"bridge-2604", "Megatron-Bridge 26.04.01, DGX-H100, FP8 (held out)", "h100-nvlink",
     train::megatron_bridge2604_h100_fp8},
    {"bridge-b200", "Megatron-Bridge 25.11, DGX-B200, FP8", "b200-nvlink", train::megatron_bridge2511_b200},
    {"llama3", "Dubey et al. 2024 Table 4, Llama 3 405B, BF16", "h100-nvlink", train::dubey2024_table4},
    {"mcore", "Megatron-LM weak scaling (core r0.8), H100, BF16 (held out)", "h100-nvlink",
     train::megatron_core_weak_scaling_h100},
    {"mcore-strong", "Megatron-LM strong scaling (core r0.8), GPT-3, H100, BF16 (held out)", "h100-nvlink",
     train::megatron_core_strong_scaling_h100},
};

const PublishedTable* find_table(std::string_view name) {
  for (const PublishedTable& t : kTables)
    if (name == t.name) return &t;
  return nullptr;
}

// The names: "a|b|...|z" for the usage, "a, b, ... or z" for an error.
std::string table_names(bool prose) {
  std::string out;
  for (size_t i = 0; i < std::size(kTables); ++i) {
    if (i > 0) out += !prose ? "|" : i + 1 < std::size(kTables) ? ", " : " or ";
    out += kTables[i].name;
  }
  return out;
}

// Predicts `rows` (at most `limit`, from the `from`-th on) and prints one line each.
// `fold` false (--no-fold): every rank on a thread; the step (to the
// picosecond, "step ps") must not move.
std::vector<train::PredictedRun> run_table(const std::vector<train::PublishedRun>& rows,
                                           const HardwareProfile& p, size_t limit, bool fold = true,
                                           size_t from = 0, const std::string& trace = {}) {
  if (from >= rows.size())
    throw ConfigError(fmt::format("--from {}: the table has {} rows (0 to {})", from, rows.size(), rows.size() - 1));
  fmt::print("{:>16} {:>3} {:>3} {:>5} {:>6} {:>10} {:>10} {:>10} {:>7} {:>8} {:>8} {:>9} {:>16}\n",
             "model", "tp", "pp", "gpus", "batch", "step s", "TFLOP/s", "published", "error",
             "threads", "wall s", "RSS MiB", "step ps");
  std::vector<train::PredictedRun> runs;
  for (size_t i = from; i < rows.size(); ++i) {
    const train::PublishedRun& row = rows[i];
    if (runs.size() == limit) break;
    const train::PredictedRun& r = runs.emplace_back(train::predict(row, p, fold, runs.empty() ? trace : std::string{}));
    rusage u{};
    getrusage(RUSAGE_SELF, &u);
    fmt::print("{:>16} {:>3} {:>3} {:>5} {:>6} {:>10.3f} {:>10.1f} {:>10.0f} {:>+6.1f}% {:>8} {:>8.2f} {:>9.0f} {:>16}\n",
               *row.name ? row.name : row.preset.c_str(), row.tp, row.pp, row.gpus, r.options.model.batch_size, r.step_s,
               r.tflops_per_gpu, row.tflops_per_gpu, r.error * 100, r.running_devices, r.wall_s,
               double(u.ru_maxrss) / 1024, std::llround(r.step_s * 1e12));
    std::fflush(stdout);
  }
  fmt::print("{} ({} rows; RSS is the process peak so far)\n", train::readme_summary(runs), runs.size());
  return runs;
}

// One phantom step of `name` (see the top of this file): wall time, peak RSS, fold.
struct ScaleOverrides {
  int layers = 0, micro_batches = 0;  // 0: the scale's own
  bool fold = true;
};

int run_scale(const std::string& name, const ScaleOverrides& over) {
  struct Scale {
    const char* name;
    const char* preset;
    int tp, pp, dp, ep, seq;
    bool sp;
  };
  static constexpr Scale kScales[] = {{"llama3-405b-16k", "llama3-405b", 8, 16, 128, 1, 8192, true},
                                      {"deepseek-v3-2k", "deepseek-v3", 1, 16, 128, 64, 4096, false},
                                      {"llama3-70b-100k", "llama3-70b", 8, 4, 3125, 1, 8192, true}};
  const Scale* s = nullptr;
  for (const Scale& k : kScales)
    if (name == k.name) s = &k;
  if (!s) throw ConfigError(fmt::format("--scale \"{}\": expected llama3-405b-16k, deepseek-v3-2k or llama3-70b-100k", name));
  train::TrainOptions o;
  o.model = model::preset(s->preset);
  o.model.block_size = s->seq;
  if (over.layers > 0) o.model.n_layer = over.layers;
  o.micro_batches = over.micro_batches > 0 ? over.micro_batches : 16;
  o.fold = over.fold;
  o.model.batch_size = s->dp * o.micro_batches;  // micro-batch 1
  o.steps = 1;
  o.phantom = true;
  o.parallel.tp = s->tp, o.parallel.pp = s->pp, o.parallel.dp = s->dp, o.parallel.ep = s->ep;
  o.parallel.zero = 1;
  o.parallel.sp = s->sp;
  o.parallel.recompute = parallel::Recompute::kFull;
  HardwareProfile p = load_profile("h100-nvlink");
  const int world = o.parallel.world();
  p.nodes = (world + 7) / 8;
  ClusterOptions co;
  co.precision = Precision::kBf16;
  co.world_size = world;
  const auto t0 = std::chrono::steady_clock::now();
  Cluster cluster(p, co);
  const train::TrainResult r = train::train(cluster, o);
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  fmt::print("{}: {} GPUs (tp {} pp {} dp {} ep {}, seq {}), phantom step {:.6f} s virtual\n",
             s->name, world, s->tp, s->pp, s->dp, s->ep, s->seq, double(r.run.makespan()) * 1e-12);
  fmt::print("  {}\n  wall {:.1f} s, peak RSS {:.2f} GiB, {} device threads\n", r.folded, wall,
             double(u.ru_maxrss) / (1024.0 * 1024.0), r.running_devices);
  // Every device's virtual figures in one digest (FNV-1a over stream ends,
  // busy and exposed times, FLOPs, memory peaks by kind), to compare builds.
  uint64_t digest = 1469598103934665603ULL, peak = 0;
  auto mix = [&digest](uint64_t v) {
    for (int b = 0; b < 8; ++b) digest = (digest ^ ((v >> (8 * b)) & 0xFF)) * 1099511628211ULL;
  };
  for (const DeviceStats& d : r.run.devices) {
    for (Time t : {d.compute_end, d.comm_end, d.compute_busy, d.comm_busy, d.comm_exposed, d.compute_transfer})
      mix(uint64_t(t));
    uint64_t flops = 0;
    std::memcpy(&flops, &d.compute_flops, sizeof flops);
    mix(flops);
    mix(d.peak_bytes);
    for (uint64_t k : d.peak_by_kind) mix(k);
    peak = std::max(peak, d.peak_bytes);
  }
  fmt::print("  {} devices' figures: digest {:016x}, largest memory peak {} bytes\n", r.run.devices.size(), digest,
             peak);
  return 0;
}

int run(int argc, char** argv) {
  if (argc >= 3 && !std::strcmp(argv[1], "--scale")) {
    ScaleOverrides over;
    const auto count = [](const char* flag, const char* text) {
      const std::optional<int> n = parse_number<int>(text);
      if (!n || *n < 1)
        throw ConfigError(fmt::format("{} \"{}\": expected a positive count", flag, text));
      return *n;
    };
    for (int i = 3; i < argc; ++i) {
      const bool has_value = i + 1 < argc;
      if (!std::strcmp(argv[i], "--no-fold")) {
        over.fold = false;
      } else if (has_value && !std::strcmp(argv[i], "--layers")) {
        over.layers = count(argv[i], argv[i + 1]), ++i;
      } else if (has_value && !std::strcmp(argv[i], "--micro-batches")) {
        over.micro_batches = count(argv[i], argv[i + 1]), ++i;
      } else {
        throw ConfigError(fmt::format(
            "unknown argument \"{}\" after --scale NAME (--layers N, --micro-batches M, --no-fold)",
            argv[i]));
      }
    }
    return run_scale(argv[2], over);
  }
  std::string profile, table, trace;
  size_t rows = 100, from = 0;
  bool fold = true;
  for (int i = 1; i < argc; i += 2) {
    if (!std::strcmp(argv[i], "--no-fold")) {
      fold = false, --i;
      continue;
    }
    if (i + 1 >= argc ||
        (std::strcmp(argv[i], "--profile") && std::strcmp(argv[i], "--rows") && std::strcmp(argv[i], "--table") &&
         std::strcmp(argv[i], "--from") && std::strcmp(argv[i], "--trace")))
      throw ConfigError(
          fmt::format("unknown argument \"{}\" (--profile NAME|FILE.json, --rows N, --from I, --table {}, --trace "
                      "FILE.json, --no-fold)",
                      argv[i], table_names(false)));
    if (!std::strcmp(argv[i], "--profile")) profile = argv[i + 1];
    if (!std::strcmp(argv[i], "--rows")) {
      const std::optional<int> n = parse_number<int>(argv[i + 1]);
      if (!n || *n < 1) throw ConfigError(fmt::format("--rows \"{}\": expected a row count, 1 or more", argv[i + 1]));
      rows = size_t(*n);
    }
    if (!std::strcmp(argv[i], "--from")) {
      const std::optional<int> n = parse_number<int>(argv[i + 1]);
      if (!n || *n < 0) throw ConfigError(fmt::format("--from \"{}\": expected a row index, 0 or more", argv[i + 1]));
      from = size_t(*n);
    }
    if (!std::strcmp(argv[i], "--table")) table = argv[i + 1];
    if (!std::strcmp(argv[i], "--trace")) trace = argv[i + 1];
  }
  if (!trace.empty() && table.empty()) throw ConfigError("--trace is for a --table (it traces the table's first row run)");
  if (from > 0 && table.empty()) throw ConfigError("--from is for a --table (the default prints three tables)");
  if (!table.empty()) {
    const PublishedTable* t = find_table(table);
    if (!t) throw ConfigError(fmt::format("--table \"{}\": expected {}", table, table_names(true)));
    const HardwareProfile p = load_profile(profile.empty() ? t->profile : profile);
    fmt::print("# {} on profile {} (phantom)\n", t->title, p.name);
    run_table(t->rows(), p, rows, fold, from, trace);
    return 0;
  }
  const HardwareProfile p = load_profile(profile.empty() ? "a100-nvlink" : profile);
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
