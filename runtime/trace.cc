#include "runtime/trace.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "runtime/output_file.h"

namespace shardlab {

const char* stream_name(StreamKind k) {
  switch (k) {
    case StreamKind::kCompute: return "compute";
    case StreamKind::kComm: return "comm";
    case StreamKind::kPipeline: return "pipeline";
    case StreamKind::kTpComm: return "tp-comm";
    case StreamKind::kCpComm: return "cp-comm";
    case StreamKind::kEpComm: return "ep-comm";
  }
  return "?";
}

std::string chrome_trace_json(const std::vector<DeviceTrace>& devices, const std::string& title) {
  nlohmann::json events = nlohmann::json::array();
  for (const auto& d : devices) {
    events.push_back({{"ph", "M"}, {"pid", d.rank}, {"name", "process_name"},
                      {"args", {{"name", fmt::format("GPU {} (node {})", d.rank, d.node)}}}});
    events.push_back({{"ph", "M"}, {"pid", d.rank}, {"name", "process_sort_index"},
                      {"args", {{"sort_index", d.rank}}}});
    // compute and comm always; the other tracks where they carry events.
    bool used[kNumStreams] = {true, true};
    for (const auto& e : d.events) used[static_cast<int>(e.stream)] = true;
    for (int s = 0; s < kNumStreams; ++s) {
      if (!used[s]) continue;
      events.push_back({{"ph", "M"}, {"pid", d.rank}, {"tid", s}, {"name", "thread_name"},
                        {"args", {{"name", stream_name(static_cast<StreamKind>(s))}}}});
    }
    for (const auto& e : d.events) {
      nlohmann::json args = nlohmann::json::object();
      if (e.bytes) args["bytes"] = e.bytes;
      if (e.flops > 0) args["flops"] = e.flops;
      if (e.peer >= 0) args["peer"] = e.peer;
      events.push_back({{"ph", "X"}, {"pid", d.rank}, {"tid", static_cast<int>(e.stream)},
                        {"name", e.name}, {"ts", to_us(e.start)}, {"dur", to_us(e.end - e.start)},
                        {"args", std::move(args)}});
    }
  }
  nlohmann::json doc{{"traceEvents", std::move(events)},
                     {"displayTimeUnit", "ns"},
                     {"otherData", {{"title", title}, {"clock", "virtual"}}}};
  return doc.dump() + '\n';
}

void write_chrome_trace(const std::string& path, const std::vector<DeviceTrace>& devices,
                        const std::string& title) {
  write_file_atomic(path, chrome_trace_json(devices, title), "`trace`");
}

}  // namespace shardlab
