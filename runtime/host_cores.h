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

namespace shardlab {

// Device threads of this process alive right now (all clusters together).
int running_device_threads();

// Cores oneTBB may use beyond the calling device thread's own: > 0 when
// that device's kernels may split.
int idle_host_cores();

// The value of SHARDLAB_HOST_THREADS=N: the host threads a process's devices
// use together (1: a lone device never splits); 0 (no cap) when unset or not
// a positive integer, which is ignored since the split changes wall time only,
// never bits.
int parse_host_threads(const char* value);

// Counts the calling thread as a running device thread while it lives.
class DeviceThreadCount {
 public:
  DeviceThreadCount();
  ~DeviceThreadCount();
  DeviceThreadCount(const DeviceThreadCount&) = delete;
  DeviceThreadCount& operator=(const DeviceThreadCount&) = delete;
};

}  // namespace shardlab
