// `shardlab collectives`: an nccl-tests style table of one collective over N
// virtual GPUs, one row per size (powers of two from --min-bytes to
// --max-bytes), in virtual time and in host wall time.
//
//  bytes:  the full buffer, as nccl-tests counts it (all_reduce: the vector;
//          all_gather: the gathered output; reduce_scatter: the input;
//          all_to_all: one member's whole send buffer). For reduce_scatter,
//          all_gather and all_to_all the count is rounded down to a multiple
//          of the ranks, as nccl-tests does.
//  time:   virtual time of one collective, all ranks starting at 0 (each size
//          runs on a fresh cluster): the latest rank's comm-stream end.
//  algbw = bytes / time; busbw = algbw x 2(n-1)/n (all_reduce), (n-1)/n
//          (reduce_scatter, all_gather, all_to_all), 1 (broadcast, reduce).
//  host:   wall time per collective over a few more iterations after a
//          warm-up, all ranks released together; host_busbw likewise.
//          When ranks x buffer would exceed 4 GiB of host memory the row
//          runs on phantom buffers: same virtual time, no host figures.
//  max_error: with --check, the largest |result - serial reference| over
//          every rank (inputs are multiples of 1/8, so any order is exact);
//          infinite ("inf" in JSON) when a result is NaN or infinite.
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/cli.h"
#include "cli/flag_table.h"
#include "collectives/collectives.h"
#include "collectives/tuner.h"
#include "runtime/cluster.h"
#include "runtime/errors.h"
#include "runtime/transport.h"
#include "runtime/units.h"

namespace shardlab::cli {
namespace {

namespace coll = shardlab::collectives;
using coll::OpKind;

struct CollFlags {
  CommonFlags common;
  std::string op = "all_reduce";
  int ranks = 8;
  std::string algo = "auto";
  std::string redop;  // empty: sum (given with an op that reduces nothing, an error)
  std::string min_bytes = "8";
  std::string max_bytes = "256MiB";
  bool check = false;
  std::string corrupt;  // hidden: --check's can-it-fail test (a value for rank 0's first result)
};

struct Setup {
  OpKind op;
  coll::Algo algo;
  coll::ReduceOp redop;
  int ranks;
  bool check;
  std::optional<float> corrupt;
  bool trace;
  double pace;
};

struct Row {
  uint64_t bytes = 0;
  size_t count = 0;
  coll::Algo algo = coll::Algo::kAuto;
  int channels = 1;  // rings the ring algorithm runs (collectives/tuner.h RingPlan)
  Time time = 0;
  std::optional<double> host_s;  // per collective; empty on phantom rows
  std::optional<double> max_error;
};

constexpr uint64_t kHostBudget = 4ull << 30;

bool reduces(OpKind op) {
  return op == OpKind::kAllReduce || op == OpKind::kReduceScatter || op == OpKind::kReduce;
}

double bus_factor(OpKind op, int n) {
  if (op == OpKind::kAllReduce) return 2.0 * (n - 1) / n;
  if (op == OpKind::kBroadcast || op == OpKind::kReduce) return 1.0;
  return (n - 1.0) / n;
}

float input(int rank, size_t i) {
  return static_cast<float>(static_cast<int>((static_cast<size_t>(rank) * 7 + i * 13) % 17) - 8) * 0.125f;
}

float reference(coll::ReduceOp op, int n, size_t i) {
  float acc = input(0, i);
  for (int r = 1; r < n; ++r) acc = op == coll::ReduceOp::kMax ? std::max(acc, input(r, i)) : acc + input(r, i);
  return op == coll::ReduceOp::kAvg ? acc / static_cast<float>(n) : acc;
}

// One rank's buffers for one size; in place wherever the op allows.
struct RankBuffers {
  size_t count = 0;
  bool phantom = false;
  std::vector<float> a, b;  // b: all_to_all output only
};

void fill(RankBuffers& rb, const Setup& s, int me) {
  if (rb.phantom) return;
  const Range mine = coll::chunk_range(rb.count, s.ranks, me);
  rb.a.assign(rb.count, 0.f);
  for (size_t i = 0; i < rb.count; ++i) {
    const bool keep = s.op == OpKind::kBroadcast ? me == 0
                      : s.op == OpKind::kAllGather ? mine.contains(int64_t(i))
                                                   : true;
    if (keep) rb.a[i] = input(me, i);
  }
  if (s.op == OpKind::kAllToAll) rb.b.assign(rb.count, 0.f);
}

void run_op(Device& dev, const coll::ProcessGroup& g, RankBuffers& rb, const Setup& s) {
  const coll::CollOptions opt{s.algo, std::nullopt};
  const coll::Buffer a = rb.phantom ? coll::Buffer::phantom(rb.count) : coll::Buffer(rb.a);
  const Range mine = coll::chunk_range(rb.count, g.size(), g.rank());
  const coll::Buffer part = rb.phantom ? coll::Buffer::phantom(mine.size) : coll::Buffer(rb.a.data() + mine.begin, mine.size);
  switch (s.op) {
    case OpKind::kAllReduce: return coll::all_reduce(dev, g, a, s.redop, opt);
    case OpKind::kReduceScatter: return coll::reduce_scatter(dev, g, a, part, s.redop, opt);
    case OpKind::kAllGather: return coll::all_gather(dev, g, part, a, opt);
    case OpKind::kBroadcast: return coll::broadcast(dev, g, a, 0, opt);
    case OpKind::kReduce: return coll::reduce(dev, g, a, a, 0, s.redop, opt);
    case OpKind::kAllToAll: {
      const coll::Buffer b = rb.phantom ? coll::Buffer::phantom(rb.count) : coll::Buffer(rb.b);
      return coll::all_to_all(dev, g, a, b, opt);
    }
    case OpKind::kBarrier: return coll::barrier(dev, g, opt);
  }
}

// Largest |result - reference| on this rank.
double max_error(const RankBuffers& rb, const Setup& s, int me) {
  if (rb.phantom) return 0;
  const int n = s.ranks;
  const Range mine = coll::chunk_range(rb.count, n, me);
  double worst = 0;
  auto at = [&](float got, float want) {  // a NaN result is an infinite error (std::max would drop it)
    const double d = std::abs(static_cast<double>(got) - want);
    worst = std::isnan(d) ? INFINITY : std::max(worst, d);
  };
  switch (s.op) {
    case OpKind::kAllReduce:
      for (size_t i = 0; i < rb.count; ++i) at(rb.a[i], reference(s.redop, n, i));
      break;
    case OpKind::kReduceScatter:
      for (auto i = size_t(mine.begin); i < size_t(mine.end()); ++i) at(rb.a[i], reference(s.redop, n, i));
      break;
    case OpKind::kReduce:
      if (me == 0)
        for (size_t i = 0; i < rb.count; ++i) at(rb.a[i], reference(s.redop, n, i));
      break;
    case OpKind::kBroadcast:
      for (size_t i = 0; i < rb.count; ++i) at(rb.a[i], input(0, i));
      break;
    case OpKind::kAllGather:
      for (int r = 0; r < n; ++r) {
        const Range c = coll::chunk_range(rb.count, n, r);
        for (auto i = size_t(c.begin); i < size_t(c.end()); ++i) at(rb.a[i], input(r, i));
      }
      break;
    case OpKind::kAllToAll: {
      const size_t block = rb.count / static_cast<size_t>(n);
      for (size_t k = 0; k < rb.count; ++k)
        at(rb.b[k], input(static_cast<int>(k / block), static_cast<size_t>(me) * block + k % block));
      break;
    }
    case OpKind::kBarrier:
      break;
  }
  return worst;
}

// Appends one size's traces after the previous sizes' (`offset` moves on).
void append_traces(const RunResult& result, std::vector<DeviceTrace>& traces, Time& offset) {
  if (traces.empty()) traces.resize(result.traces.size());
  for (size_t d = 0; d < result.traces.size(); ++d) {
    traces[d].rank = result.traces[d].rank;
    traces[d].node = result.traces[d].node;
    for (TraceEvent e : result.traces[d].events) {
      e.start += offset;
      e.end += offset;
      traces[d].events.push_back(e);
    }
  }
  offset += result.makespan();
}

// Runs one size on a fresh cluster: the first collective is timed in virtual
// time (and checked), the next `iters` in host wall time.
Row measure(const HardwareProfile& profile, const Setup& s, uint64_t bytes, std::vector<DeviceTrace>& traces,
            Time& trace_offset) {
  const int n = s.ranks;
  Row row;
  row.count = bytes / sizeof(float);
  if (s.op == OpKind::kReduceScatter || s.op == OpKind::kAllGather || s.op == OpKind::kAllToAll)
    row.count -= row.count % static_cast<size_t>(n);
  row.bytes = row.count * sizeof(float);
  std::vector<int> world(static_cast<size_t>(n));
  std::iota(world.begin(), world.end(), 0);
  row.algo = s.algo == coll::Algo::kAuto
                 ? coll::select_algo(profile, world, coll::CollShape{s.op, row.count, element_size(Precision::kFp32), 0})
                 : s.algo;
  const bool rings = row.algo == coll::Algo::kRing &&
                     (s.op == OpKind::kAllReduce || s.op == OpKind::kReduceScatter || s.op == OpKind::kAllGather);
  row.channels = rings ? coll::ring_plan(profile, world).channels : 1;
  const uint64_t host_bytes = row.bytes * static_cast<uint64_t>(n) * (s.op == OpKind::kAllToAll ? 2 : 1);
  const bool phantom = host_bytes > kHostBudget;
  const int iters = phantom || s.trace ? 0 : static_cast<int>(std::clamp<uint64_t>((512ull << 20) / std::max<uint64_t>(host_bytes, 1), 2, 20));

  std::vector<Time> ends(static_cast<size_t>(n));
  std::vector<double> errors(static_cast<size_t>(n));
  // Host clock (ns) around the timed iterations, per rank.
  std::vector<int64_t> t0(static_cast<size_t>(n)), t1(static_cast<size_t>(n));
  auto host_ns = [] { return std::chrono::steady_clock::now().time_since_epoch() / std::chrono::nanoseconds(1); };
  ClusterOptions opts;
  opts.world_size = n;
  opts.trace = s.trace;
  opts.pace = s.pace;
  Cluster cluster(profile, opts);
  RunResult result = cluster.run([&](Device& dev) {
    const auto me = static_cast<size_t>(dev.rank());
    coll::ProcessGroup g = coll::ProcessGroup::world(dev);
    RankBuffers rb{row.count, phantom, {}, {}};
    fill(rb, s, dev.rank());
    run_op(dev, g, rb, s);
    ends[me] = dev.now();
    std::vector<float>& result = s.op == OpKind::kAllToAll ? rb.b : rb.a;
    if (s.corrupt && me == 0 && !result.empty()) result[0] = *s.corrupt;
    if (s.check) errors[me] = max_error(rb, s, dev.rank());
    if (iters == 0) return;
    // Align the ranks through the fabric (an abort-aware barrier, unlike a host one).
    coll::barrier(dev, g);
    t0[me] = host_ns();
    for (int i = 0; i < iters; ++i) run_op(dev, g, rb, s);
    t1[me] = host_ns();
  });
  // Across processes each wrote its own ranks' entries (runtime/transport.h).
  for (auto* v : {&ends, &t0, &t1}) merge_disjoint(*v);
  merge_disjoint(errors);
  row.time = *std::max_element(ends.begin(), ends.end());
  if (iters > 0) {
    const auto start = *std::min_element(t0.begin(), t0.end());
    const auto end = *std::max_element(t1.begin(), t1.end());
    row.host_s = static_cast<double>(end - start) * 1e-9 / iters;
  }
  if (s.check) row.max_error = *std::max_element(errors.begin(), errors.end());
  if (s.trace) append_traces(result, traces, trace_offset);
  return row;
}

Setup parse_setup(const CollFlags& f, const HardwareProfile& profile) {
  Setup s{};
  // The library's parse errors name the value; prefix the flag.
  auto flag = [](const char* name, auto parse) {
    try {
      return parse();
    } catch (const ConfigError& e) {
      throw ConfigError(fmt::format("{}: {}", name, e.what()));
    }
  };
  if (f.op == "barrier")
    throw ConfigError("--op barrier: not measured here (it moves no bytes); use all_reduce, reduce_scatter, "
                      "all_gather, broadcast, reduce or all_to_all");
  s.op = flag("--op", [&] { return coll::parse_op_kind(f.op); });
  s.algo = flag("--algo", [&] { return coll::parse_algo(f.algo); });
  s.redop = flag("--redop", [&] { return coll::parse_reduce_op(f.redop.empty() ? "sum" : f.redop); });
  if (!f.redop.empty() && !reduces(s.op))
    throw ConfigError(fmt::format("--redop {}: --op {} reduces nothing (--redop is for all_reduce, reduce_scatter "
                                  "and reduce)", f.redop, f.op));
  if (f.ranks < 1 || f.ranks > profile.total_devices())
    throw ConfigError(fmt::format("--ranks {}: must be between 1 and {} (profile {}: {} nodes x {})", f.ranks,
                                  profile.total_devices(), profile.name, profile.nodes, profile.devices_per_node));
  s.ranks = f.ranks;
  s.check = f.check;
  if (!f.corrupt.empty()) {
    char* end = nullptr;
    s.corrupt = std::strtof(f.corrupt.c_str(), &end);
    if (*end) throw ConfigError(fmt::format("--corrupt-result {}: not a number", f.corrupt));
  }
  s.trace = !f.common.trace.empty();
  s.pace = f.common.pace;
  return s;
}

std::vector<uint64_t> parse_sizes(const CollFlags& f) {
  const auto [lo, hi] = parse_size_range(f.min_bytes, f.max_bytes);
  std::vector<uint64_t> sizes;
  for (uint64_t b = lo; b <= hi; b *= 2) sizes.push_back(b);
  return sizes;
}

struct Derived {
  double algbw, busbw;
  std::optional<double> host_busbw;
};

Derived derive(const Row& r, const Setup& s) {
  const double secs = to_seconds(r.time);
  const double algbw = secs > 0 ? static_cast<double>(r.bytes) / secs / 1e9 : 0;
  Derived d{algbw, algbw * bus_factor(s.op, s.ranks), std::nullopt};
  if (r.host_s && *r.host_s > 0)
    d.host_busbw = static_cast<double>(r.bytes) / *r.host_s / 1e9 * bus_factor(s.op, s.ranks);
  return d;
}

void print_json(const std::vector<Row>& rows, const Setup& s, const CollFlags& f, const HardwareProfile& p) {
  nlohmann::json j{{"op", coll::op_kind_name(s.op)}, {"ranks", s.ranks}, {"algo", coll::algo_name(s.algo)},
                   {"profile", p.name}, {"redop", coll::reduce_op_name(s.redop)}, {"rows", nlohmann::json::array()}};
  for (const Row& r : rows) {
    const Derived d = derive(r, s);
    nlohmann::json row{{"bytes", r.bytes}, {"count", r.count}, {"algo", coll::algo_name(r.algo)},
                       {"channels", r.channels},
                       {"time_us", to_us(r.time)}, {"algbw_GBps", d.algbw}, {"busbw_GBps", d.busbw},
                       {"host_time_us", nullptr}, {"host_busbw_GBps", nullptr}, {"max_error", nullptr}};
    if (r.host_s) row["host_time_us"] = *r.host_s * 1e6;
    if (d.host_busbw) row["host_busbw_GBps"] = *d.host_busbw;
    if (r.max_error) row["max_error"] = std::isfinite(*r.max_error) ? nlohmann::json(*r.max_error) : "inf";
    j["rows"].push_back(row);
  }
  fmt::print("{}\n", j.dump(2));
}

void print_table(const std::vector<Row>& rows, const Setup& s, const HardwareProfile& p, double wall) {
  fmt::print("# shardlab collectives: {} over {} ranks ({} node{}), algo {}, profile {}\n", coll::op_kind_name(s.op),
             s.ranks, p.node_of(s.ranks - 1) + 1, p.node_of(s.ranks - 1) > 0 ? "s" : "", coll::algo_name(s.algo), p.name);
  fmt::print("# links: intra {:.2f} us {:.1f} GB/s, inter {:.2f} us {:.1f} GB/s per direction per NIC, {} NIC{} "
             "per node\n",
             p.intra.latency_us, p.intra.bandwidth_GBps, p.inter.latency_us, p.inter.bandwidth_GBps, p.nic_count(),
             p.nic_count() > 1 ? "s" : "");
  fmt::print("# {:>10} {:>10} {:>6} {:>5} {:>6} {:>4} {:>11} {:>8} {:>8} {:>11} {:>9} {:>9}\n", "size(B)", "count",
             "type", "redop", "algo", "ch", "time(us)", "algbw", "busbw", "host(us)", "host_bus", "max_err");
  const char* redop = reduces(s.op) ? coll::reduce_op_name(s.redop) : "none";
  for (const Row& r : rows) {
    const Derived d = derive(r, s);
    fmt::print("  {:>10} {:>10} {:>6} {:>5} {:>6} {:>4} {:>11.2f} {:>8.2f} {:>8.2f} {:>11} {:>9} {:>9}\n", r.bytes,
               r.count, "float", redop, coll::algo_name(r.algo), r.channels, to_us(r.time), d.algbw, d.busbw,
               r.host_s ? fmt::format("{:.1f}", *r.host_s * 1e6) : "-",
               d.host_busbw ? fmt::format("{:.2f}", *d.host_busbw) : "-",
               r.max_error ? fmt::format("{:.0e}", *r.max_error) : "-");
  }
  fmt::print("# ch: channels (rings, each leaving a node through another NIC; 1 for other algorithms); protocol: "
             "one (NCCL's Simple-like: the packet model of the links)\n");
  fmt::print("# time, algbw, busbw (GB/s): virtual; host: this machine's wall clock per collective ({:.2f} s total)\n",
             wall);
}

int run_collectives(const CollFlags& f) {
  const HardwareProfile profile = apply_common(f.common);
  const Setup s = parse_setup(f, profile);
  const std::vector<uint64_t> sizes = parse_sizes(f);
  check_outputs({{"--trace", f.common.trace}});
  const auto wall0 = std::chrono::steady_clock::now();
  std::vector<Row> rows;
  std::vector<DeviceTrace> traces;
  Time offset = 0;
  for (uint64_t b : sizes) rows.push_back(measure(profile, s, b, traces, offset));
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  if (s.trace && leader_process())
    write_chrome_trace(f.common.trace, traces, fmt::format("shardlab collectives {} x{}", f.op, s.ranks));
  if (f.common.json) {
    print_json(rows, s, f, profile);
  } else {
    print_table(rows, s, profile, wall);
  }
  bool ok = true;
  for (const Row& r : rows) ok = ok && (!r.max_error || *r.max_error == 0);
  return ok ? 0 : 1;
}

#define FIELD(path) FLAG_FIELD(CollFlags, path)

FlagTable<CollFlags> collectives_flags() {
  return {
      {"--op", FIELD(op), "all_reduce|reduce_scatter|all_gather|broadcast|reduce|all_to_all", {}, kShowDefault},
      {"--ranks", FIELD(ranks), "Number of virtual GPUs (placed on the profile's nodes in order)", {}, kShowDefault},
      {"--algo", FIELD(algo), "ring|tree|direct|auto", {}, kShowDefault},
      {"--redop", FIELD(redop), "sum|avg|max (all_reduce, reduce_scatter, reduce; default sum)"},
      {"--min-bytes", FIELD(min_bytes), "Smallest buffer", {}, kShowDefault},
      {"--max-bytes", FIELD(max_bytes), "Largest buffer (powers of two in between)", {}, kShowDefault},
      {"--check", FIELD(check), "Compare every result with a serial reference (max_error column; exit 1 if nonzero)"},
      {"--corrupt-result", FIELD(corrupt), "VALUE (testing --check)", {}, false, /*hidden=*/true},
  };
}

#undef FIELD

}  // namespace

void add_collectives_command(CLI::App& app) {
  auto* sub = app.add_subcommand("collectives", "Collective time and bandwidth over N virtual GPUs (nccl-tests style)");
  auto f = std::make_shared<CollFlags>();
  add_common_flags(sub, f->common);
  add_flags(sub, *f, collectives_flags());
  set_action(sub, [f] { return run_collectives(*f); });
}

}  // namespace shardlab::cli
