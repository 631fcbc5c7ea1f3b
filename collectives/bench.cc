#include "collectives/bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>

#include <nlohmann/json.hpp>

#include "collectives/tuner.h"
#include "runtime/cluster.h"
#include "runtime/transport.h"

namespace shardlab::collectives {
namespace {

constexpr uint64_t kHostBudget = 4ull << 30;

double bus_factor(OpKind op, int n) {
  if (op == OpKind::kAllReduce) return 2.0 * (n - 1) / n;
  if (op == OpKind::kBroadcast || op == OpKind::kReduce) return 1.0;
  return (n - 1.0) / n;
}

float input(int rank, size_t i) {
  return static_cast<float>(static_cast<int>((static_cast<size_t>(rank) * 7 + i * 13) % 17) - 8) * 0.125f;
}

float reference(ReduceOp op, int n, size_t i) {
  float acc = input(0, i);
  for (int r = 1; r < n; ++r) acc = op == ReduceOp::kMax ? std::max(acc, input(r, i)) : acc + input(r, i);
  return op == ReduceOp::kAvg ? acc / static_cast<float>(n) : acc;
}

// One rank's buffers for one size; in place wherever the op allows.
struct RankBuffers {
  size_t count = 0;
  bool phantom = false;
  std::vector<float> a, b;  // b: all_to_all output only
};

void fill(RankBuffers& rb, const BenchOptions& s, int me) {
  if (rb.phantom) return;
  const Range mine = chunk_range(rb.count, s.ranks, me);
  rb.a.assign(rb.count, 0.f);
  for (size_t i = 0; i < rb.count; ++i) {
    const bool keep = s.op == OpKind::kBroadcast ? me == 0
                      : s.op == OpKind::kAllGather ? mine.contains(int64_t(i))
                                                   : true;
    if (keep) rb.a[i] = input(me, i);
  }
  if (s.op == OpKind::kAllToAll) rb.b.assign(rb.count, 0.f);
}

void run_op(Device& dev, const ProcessGroup& g, RankBuffers& rb, const BenchOptions& s) {
  CollOptions opt{s.algo, std::nullopt};
  opt.proto = s.proto;
  const Buffer a = rb.phantom ? Buffer::phantom(rb.count) : Buffer(rb.a);
  const Range mine = chunk_range(rb.count, g.size(), g.rank());
  const Buffer part = rb.phantom ? Buffer::phantom(mine.size) : Buffer(rb.a.data() + mine.begin, mine.size);
  switch (s.op) {
    case OpKind::kAllReduce: return all_reduce(dev, g, a, s.redop, opt);
    case OpKind::kReduceScatter: return reduce_scatter(dev, g, a, part, s.redop, opt);
    case OpKind::kAllGather: return all_gather(dev, g, part, a, opt);
    case OpKind::kBroadcast: return broadcast(dev, g, a, 0, opt);
    case OpKind::kReduce: return reduce(dev, g, a, a, 0, s.redop, opt);
    case OpKind::kAllToAll: {
      const Buffer b = rb.phantom ? Buffer::phantom(rb.count) : Buffer(rb.b);
      return all_to_all(dev, g, a, b, opt);
    }
    case OpKind::kBarrier: return barrier(dev, g, opt);
  }
}

// Largest |result - reference| on this rank.
double max_error(const RankBuffers& rb, const BenchOptions& s, int me) {
  if (rb.phantom) return 0;
  const int n = s.ranks;
  const Range mine = chunk_range(rb.count, n, me);
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
        const Range c = chunk_range(rb.count, n, r);
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

}  // namespace

bool reduces(OpKind op) {
  return op == OpKind::kAllReduce || op == OpKind::kReduceScatter || op == OpKind::kReduce;
}

// Runs one size on a fresh cluster: the first collective is timed in virtual
// time (and checked), the next `iters` in host wall time.
BenchRow bench_collective(const HardwareProfile& profile, const BenchOptions& s, uint64_t bytes, std::vector<DeviceTrace>& traces,
                          Time& trace_offset) {
  const int n = s.ranks;
  BenchRow row;
  row.count = bytes / sizeof(float);
  if (s.op == OpKind::kReduceScatter || s.op == OpKind::kAllGather || s.op == OpKind::kAllToAll)
    row.count -= row.count % static_cast<size_t>(n);
  row.bytes = row.count * sizeof(float);
  std::vector<int> world(static_cast<size_t>(n));
  std::iota(world.begin(), world.end(), 0);
  {
    CollShape shape{s.op, row.count, element_size(Precision::kFp32), 0, s.proto};  // auto without dbtree, as the run (tuner.h CollShape::dbtree)
    const Choice c = select(profile, world, shape, s.op == OpKind::kBarrier ? Algo::kTree : s.algo);
    row.algo = c.algo;
    row.proto = c.proto;
  }
  const bool rings = row.algo == Algo::kRing &&
                     (s.op == OpKind::kAllReduce || s.op == OpKind::kReduceScatter || s.op == OpKind::kAllGather ||
                      s.op == OpKind::kBroadcast || s.op == OpKind::kReduce);
  row.channels = rings ? ring_plan(profile, world).channels
                 : row.algo == Algo::kDbtree ? tree_plan(profile, world).channels : 1;
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
    ProcessGroup g = ProcessGroup::world(dev);
    RankBuffers rb{row.count, phantom, {}, {}};
    fill(rb, s, dev.rank());
    run_op(dev, g, rb, s);
    ends[me] = dev.now();
    std::vector<float>& result = s.op == OpKind::kAllToAll ? rb.b : rb.a;
    if (s.corrupt && me == 0 && !result.empty()) result[0] = *s.corrupt;
    if (s.check) errors[me] = max_error(rb, s, dev.rank());
    if (iters == 0) return;
    // Align the ranks through the fabric (an abort-aware barrier, unlike a host one).
    barrier(dev, g);
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

Bandwidth bandwidth(const BenchRow& r, const BenchOptions& s) {
  const double secs = to_seconds(r.time);
  const double algbw = secs > 0 ? static_cast<double>(r.bytes) / secs / 1e9 : 0;
  Bandwidth d{algbw, algbw * bus_factor(s.op, s.ranks), std::nullopt};
  if (r.host_s && *r.host_s > 0)
    d.host_busbw = static_cast<double>(r.bytes) / *r.host_s / 1e9 * bus_factor(s.op, s.ranks);
  return d;
}

nlohmann::json bench_json(const std::vector<BenchRow>& rows, const BenchOptions& s, const std::string& profile) {
  nlohmann::json j{{"op", op_kind_name(s.op)}, {"ranks", s.ranks}, {"algo", algo_name(s.algo)},
                   {"profile", profile}, {"redop", reduce_op_name(s.redop)}, {"rows", nlohmann::json::array()}};
  for (const BenchRow& r : rows) {
    const Bandwidth d = bandwidth(r, s);
    nlohmann::json row{{"bytes", r.bytes}, {"count", r.count}, {"algo", algo_name(r.algo)},
                       {"channels", r.channels}, {"protocol", proto_name(r.proto)},
                       {"time_us", to_us(r.time)}, {"algbw_GBps", d.algbw}, {"busbw_GBps", d.busbw},
                       {"host_time_us", nullptr}, {"host_busbw_GBps", nullptr}, {"max_error", nullptr}};
    if (r.host_s) row["host_time_us"] = *r.host_s * 1e6;
    if (d.host_busbw) row["host_busbw_GBps"] = *d.host_busbw;
    if (r.max_error) row["max_error"] = std::isfinite(*r.max_error) ? nlohmann::json(*r.max_error) : "inf";
    j["rows"].push_back(row);
  }
  return j;
}


}  // namespace shardlab::collectives
