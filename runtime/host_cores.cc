// Running device threads and idle cores: see host_cores.h.
#include "runtime/host_cores.h"
#include "runtime/parse_number.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>

#include <fmt/format.h>

#include <oneapi/tbb/global_control.h>
#include <oneapi/tbb/task_arena.h>

namespace shardlab {
namespace {
std::atomic<int> g_running{0};

// SHARDLAB_HOST_THREADS, read once (see parse_host_threads).
int host_thread_cap() {
  static const int cap = parse_host_threads(std::getenv("SHARDLAB_HOST_THREADS")).value_or(0);
  return cap;
}
}  // namespace

std::optional<int> parse_host_threads(const char* v) {
  if (v == nullptr) return 0;
  const std::optional<int> n = parse_number<int>(v);
  if (!n || *n < 1 || *n > kMaxHostThreads) return std::nullopt;
  return n;
}

std::string host_threads_env_error() {
  const char* v = std::getenv("SHARDLAB_HOST_THREADS");
  if (parse_host_threads(v)) return "";
  return fmt::format("SHARDLAB_HOST_THREADS=\"{}\": expected a whole number of host threads from 1 to {} "
                     "(unset it to use every core)", v, kMaxHostThreads);
}

int running_device_threads() { return g_running.load(std::memory_order_relaxed); }

int usable_host_cores() {
  namespace tbb = oneapi::tbb;
  const int cores = static_cast<int>(std::min<size_t>(
      static_cast<size_t>(tbb::this_task_arena::max_concurrency()),
      tbb::global_control::active_value(tbb::global_control::max_allowed_parallelism)));
  const int cap = host_thread_cap();
  return std::max(1, cap > 0 ? std::min(cores, cap) : cores);
}

int idle_host_cores() { return std::max(0, usable_host_cores() - std::max(1, running_device_threads())); }

DeviceThreadCount::DeviceThreadCount() { g_running.fetch_add(1, std::memory_order_relaxed); }
DeviceThreadCount::~DeviceThreadCount() { g_running.fetch_sub(1, std::memory_order_relaxed); }

}  // namespace shardlab
