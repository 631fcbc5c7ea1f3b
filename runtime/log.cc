#include "runtime/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

namespace shardlab {
namespace {
std::shared_ptr<spdlog::sinks::sink> shared_sink() {
  static auto sink = [] {
    auto s = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
    s->set_pattern("[%H:%M:%S.%e] [%n] [%l] %v");
    return s;
  }();
  return sink;
}
}  // namespace

// Quiet by default, for library users (tests, benches) too.
spdlog::level::level_enum g_level = spdlog::level::warn;

void set_verbosity(int level) {
  auto lvl = level <= 0 ? spdlog::level::warn : level == 1 ? spdlog::level::info : spdlog::level::debug;
  g_level = lvl;
  auto logger = std::make_shared<spdlog::logger>("shardlab", shared_sink());
  logger->set_level(lvl);
  spdlog::set_default_logger(logger);
  spdlog::set_level(lvl);
}

std::shared_ptr<spdlog::logger> device_logger(int rank) {
  auto logger = std::make_shared<spdlog::logger>("rank " + std::to_string(rank), shared_sink());
  logger->set_level(g_level);
  return logger;
}

}  // namespace shardlab
