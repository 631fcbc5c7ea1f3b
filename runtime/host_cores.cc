// Running device threads and idle cores: see host_cores.h.
#include "runtime/host_cores.h"

#include <algorithm>
#include <atomic>

#include <oneapi/tbb/global_control.h>
#include <oneapi/tbb/task_arena.h>

namespace shardlab {
namespace {
std::atomic<int> g_running{0};
}  // namespace

int running_device_threads() { return g_running.load(std::memory_order_relaxed); }

int idle_host_cores() {
  namespace tbb = oneapi::tbb;
  const int cores = static_cast<int>(std::min<size_t>(
      static_cast<size_t>(tbb::this_task_arena::max_concurrency()),
      tbb::global_control::active_value(tbb::global_control::max_allowed_parallelism)));
  return std::max(0, cores - std::max(1, running_device_threads()));
}

DeviceThreadCount::DeviceThreadCount() { g_running.fetch_add(1, std::memory_order_relaxed); }
DeviceThreadCount::~DeviceThreadCount() { g_running.fetch_sub(1, std::memory_order_relaxed); }

}  // namespace shardlab
