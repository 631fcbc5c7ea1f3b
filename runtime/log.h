// Logging: spdlog, quiet by default (warnings and errors), rank-prefixed on
// device threads.
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
