// This machine's physical memory: what a run on values may hold on the host
// (train's preflight, serve's checks refuse a run that would not fit).
//
// Thread safety: a pure query of the OS; callable from any thread.
#pragma once

#include <cstdint>

namespace shardlab {

// This machine's physical memory in bytes (UINT64_MAX when the OS does not say).
uint64_t host_memory_bytes();

}  // namespace shardlab
