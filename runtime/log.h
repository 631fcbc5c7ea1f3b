// Logging: spdlog, quiet by default (warnings and errors), rank-prefixed on
// device threads.
//
// Thread safety: device_logger may be called from any thread (spdlog's
// registry and the shared stderr sink lock themselves); set_verbosity only
// before a run starts.
#pragma once

#include <memory>
#include <string>

#include <spdlog/spdlog.h>

namespace shardlab {

// 0: warnings only, 1: info (-v), 2+: debug (-vv).
void set_verbosity(int level);
// A logger named "rank N" writing to the shared stderr sink.
std::shared_ptr<spdlog::logger> device_logger(int rank);

}  // namespace shardlab
