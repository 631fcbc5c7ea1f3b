// Trace events and the Chrome trace event format (opens in Perfetto and
// chrome://tracing): one process per device, one thread per stream.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/time.h"

namespace shardlab {

// kPipeline: the point-to-point stream of pipeline parallelism. kTpComm:
// the side stream of --tp-comm-overlap (model/parallel/tensor/mappings.h),
// whose tensor-parallel collectives must share a port's bandwidth with the
// comm stream's data-parallel ones rather than queue behind them (a kind is
// one FIFO queue per port: runtime/port.h). kCpComm: context parallelism's
// K/V ring (model/parallel/context/cp_attention.h), the cp group's own
// stream, likewise. Each has its own track in the trace; devices without
// such traffic do not show it.
enum class StreamKind : uint8_t { kCompute = 0, kComm = 1, kPipeline = 2, kTpComm = 3, kCpComm = 4, kEpComm = 5 };
inline constexpr int kNumStreams = 6;
const char* stream_name(StreamKind k);  // "compute" | "comm" | "pipeline" | "tp-comm" | "cp-comm" | "ep-comm"

// One slice on one stream. `name` must outlive the run (a string literal).
struct TraceEvent {
  const char* name;
  StreamKind stream;
  Time start;
  Time end;
  uint64_t bytes = 0;  // modeled bytes moved (comm) or touched (compute)
  double flops = 0;
  int peer = -1;  // the other device of a send/recv
};

struct DeviceTrace {
  int rank = 0;
  int node = 0;
  std::vector<TraceEvent> events;
};

// {"traceEvents": [...], "displayTimeUnit": "ns"}; timestamps in us.
std::string chrome_trace_json(const std::vector<DeviceTrace>& devices, const std::string& title);
// Writes chrome_trace_json() atomically (runtime/output_file.h).
// Throws ConfigError if the file cannot be written.
void write_chrome_trace(const std::string& path, const std::vector<DeviceTrace>& devices,
                        const std::string& title);

}  // namespace shardlab
