// Consistency checks of a device's trace against its virtual clocks, for
// the trace tests of the runtime and of training runs.
#pragma once

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/cluster.h"
#include "runtime/trace.h"

namespace shardlab::testing {

// "" if the trace of one device is consistent with its virtual times, else
// the first fault found:
//   * an event that ends before it starts;
//   * two spans of one track (stream) that overlap, among the spans that
//     hold their stream: kernels and receives;
//   * an annotation that crosses another span of its track. Annotations are
//     marked without advancing their stream: a "send" (Device::isend: the
//     stream goes on while the payload is on the wire, the egress port is
//     what it occupies) may sit inside a receive posted before it finished,
//     and the expert-parallel exchanges ("moe.*.a2a*", ep_dispatch.cc) span
//     the sends and receives of their all-to-all. Both nest (as Chrome
//     traces draw them) but never straddle a boundary;
//   * two sends of one stream that overlap: one egress port (every peer on
//     the device's node, which the callers' runs are), on which one stream's
//     transfers queue (runtime/port.h; different streams share the port, so
//     their sends may overlap);
//   * a compute or comm busy time (DeviceStats) other than the union of
//     the spans of its track;
//   * a last event that does not end at the device's virtual end time.
inline std::string trace_fault(const DeviceTrace& t, const DeviceStats& d) {
  auto is_send = [](const TraceEvent* e) { return std::strcmp(e->name, "send") == 0; };
  auto is_annotation = [&](const TraceEvent* e) { return is_send(e) || std::strstr(e->name, ".a2a") != nullptr; };
  auto at = [](const TraceEvent* e) {
    return std::string(stream_name(e->stream)) + " track: " + e->name + " [" + std::to_string(e->start) + ", " +
           std::to_string(e->end) + ") ps";
  };
  auto by_start = [](const TraceEvent* a, const TraceEvent* b) {
    return a->start != b->start ? a->start < b->start : a->end > b->end;  // outer span first
  };
  std::vector<const TraceEvent*> track[kNumStreams], sends;
  Time last = 0;
  for (const TraceEvent& e : t.events) {
    if (e.end < e.start) return at(&e) + " ends before it starts";
    track[int(e.stream)].push_back(&e);
    if (is_send(&e)) sends.push_back(&e);
    last = std::max(last, e.end);
  }
  for (auto& events : track) {
    std::sort(events.begin(), events.end(), by_start);
    for (size_t i = 0; i < events.size(); ++i) {
      for (size_t j = i + 1; j < events.size() && events[j]->start < events[i]->end; ++j) {
        const TraceEvent *a = events[i], *b = events[j];
        if (!is_annotation(a) && !is_annotation(b)) return at(b) + " overlaps " + at(a);
        if (b->end > a->end) return at(b) + " crosses the end of " + at(a);
      }
    }
  }
  std::stable_sort(sends.begin(), sends.end(), [&](const TraceEvent* a, const TraceEvent* b) {
    return a->stream != b->stream ? a->stream < b->stream : by_start(a, b);
  });
  for (size_t i = 1; i < sends.size(); ++i)
    if (sends[i]->stream == sends[i - 1]->stream && sends[i]->start < sends[i - 1]->end)
      return at(sends[i]) + " overlaps the egress of " + at(sends[i - 1]);
  // The stream's busy time is the union of its track's spans.
  for (StreamKind k : {StreamKind::kCompute, StreamKind::kComm}) {
    Time covered = 0, reach = 0;  // track[] is sorted by start
    for (const TraceEvent* e : track[int(k)]) {
      if (e->end > std::max(e->start, reach)) covered += e->end - std::max(e->start, reach);
      reach = std::max(reach, e->end);
    }
    const Time busy = k == StreamKind::kCompute ? d.compute_busy : d.comm_busy;
    if (covered != busy)
      return std::string(stream_name(k)) + " track: spans cover " + std::to_string(covered) + " ps, the stream was busy " +
             std::to_string(busy) + " ps";
  }
  if (last != d.end())
    return "last event ends at " + std::to_string(last) + " ps, the device at " + std::to_string(d.end()) + " ps";
  return "";
}

}  // namespace shardlab::testing
