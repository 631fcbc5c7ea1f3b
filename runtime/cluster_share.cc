#include "runtime/cluster_share.h"

#include <algorithm>
#include <mutex>
#include <set>

#include "runtime/errors.h"
#include "runtime/wire.h"

namespace shardlab {

std::optional<RunFailure> failure_of(const std::function<void()>& rethrow) {
  try {
    rethrow();
  } catch (const RunError& e) {
    return RunFailure{e.rank(), e.what(), e.cause()};
  }
  return std::nullopt;
}

void agree_on_failure(Transport& t, const std::optional<RunFailure>& mine) {
  wire::Writer w;
  w.put<uint8_t>(mine.has_value());
  if (mine) {
    w.put<int32_t>(mine->rank).put_string(mine->what);
    w.put<uint8_t>(static_cast<uint8_t>(mine->cause));
  }
  std::optional<RunFailure> first;
  for (const std::string& s : t.exchange(w.str())) {
    wire::Reader r(s);
    if (!r.get<uint8_t>()) continue;
    RunFailure f;
    f.rank = r.get<int32_t>();
    f.what = r.get_string();
    const auto cause = r.get<uint8_t>();
    SHARDLAB_CHECK(cause <= static_cast<uint8_t>(RunCause::kDeadlock), "a run failure with an unknown cause");
    f.cause = static_cast<RunCause>(cause);
    if (!first || f.rank < first->rank) first = std::move(f);
  }
  if (first) throw RunError(first->rank, first->what, first->cause);
}

namespace {

// Trace names from other processes, kept for the process's lifetime (a
// TraceEvent holds a pointer, as to the string literal it names locally).
const char* intern(const std::string& name) {
  static std::mutex mu;
  static std::set<std::string> names;
  std::lock_guard lock(mu);
  return names.insert(name).first->c_str();
}

void put_trace(wire::Writer& w, const DeviceTrace& d) {
  w.put<int32_t>(d.rank).put<int32_t>(d.node).put<uint64_t>(d.events.size());
  for (const TraceEvent& e : d.events) {
    w.put_string(e.name).put(e.stream).put(e.start).put(e.end).put(e.bytes).put(e.flops).put<int32_t>(e.peer);
  }
}

DeviceTrace get_trace(wire::Reader& r) {
  DeviceTrace d;
  d.rank = r.get<int32_t>();
  d.node = r.get<int32_t>();
  d.events.resize(r.get<uint64_t>());
  for (TraceEvent& e : d.events) {
    e.name = intern(r.get_string());
    e.stream = r.get<StreamKind>();
    e.start = r.get<Time>();
    e.end = r.get<Time>();
    e.bytes = r.get<uint64_t>();
    e.flops = r.get<double>();
    e.peer = r.get<int32_t>();
  }
  return d;
}

}  // namespace

void share_records(Transport& t, std::vector<std::optional<DeviceStats>>& stats, std::vector<DeviceTrace>& traces) {
  wire::Writer w;
  for (const auto& s : stats)
    if (s) w.put<uint8_t>(1).put(*s);
  w.put<uint8_t>(0).put<uint64_t>(traces.size());
  for (const DeviceTrace& d : traces) put_trace(w, d);
  const std::vector<std::string> all = t.exchange(w.str());
  traces.clear();
  for (int p = 0; p < int(all.size()); ++p) {
    wire::Reader r(all[size_t(p)]);
    while (r.get<uint8_t>()) {
      const auto s = r.get<DeviceStats>();
      stats[size_t(s.rank)] = s;
    }
    // Ours too: every process's block comes back in process order, which is rank order.
    for (auto n = r.get<uint64_t>(); n > 0; --n) traces.push_back(get_trace(r));
  }
}

}  // namespace shardlab
