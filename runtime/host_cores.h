// Which host cores the device threads leave idle, so that a device's kernels
// may borrow them (model/gemm.cc splits its GEMMs over output rows).
//
// Every cluster run counts its device threads here while they live; a device
// that finds fewer running device threads than the cores oneTBB may use (its
// affinity mask, or a tbb::global_control limit) hands its big GEMMs to
// oneTBB. Blocked threads count as running: the count is a cheap, slightly
// pessimistic "runnable".
//
// Thread safety: all functions may be called from any thread.
#pragma once

#include <optional>
#include <string>

namespace shardlab {

// Device threads of this process alive right now (all clusters together).
int running_device_threads();

// Cores oneTBB may use (its affinity mask or global limit), capped by
// SHARDLAB_HOST_THREADS: at least 1.
int usable_host_cores();

// Cores oneTBB may use beyond the calling device thread's own: > 0 when
// that device's kernels may split.
int idle_host_cores();

// The value of SHARDLAB_HOST_THREADS=N: the host threads a process's devices
// use together (1: a lone device never splits), a whole number from 1 to
// kMaxHostThreads; 0 (no cap: every core oneTBB may use) when unset. nullopt
// for anything else: empty, 0, negative, not a whole number, too large. "0"
// is refused rather than read as "all cores": unset already says that.
inline constexpr int kMaxHostThreads = 4096;
std::optional<int> parse_host_threads(const char* value);

// The error line for a bad SHARDLAB_HOST_THREADS in this process's
// environment, or "" when it is unset or valid. The CLI refuses a bad value
// (exit 2) before any device starts; a library caller that skips the check
// gets no cap.
std::string host_threads_env_error();

// Counts the calling thread as a running device thread while it lives.
class DeviceThreadCount {
 public:
  DeviceThreadCount();
  ~DeviceThreadCount();
  DeviceThreadCount(const DeviceThreadCount&) = delete;
  DeviceThreadCount& operator=(const DeviceThreadCount&) = delete;
};

}  // namespace shardlab
