// Helpers shared by the runtime tests.
#pragma once

#include "runtime/profile.h"

namespace shardlab::testing {

// Round numbers so expected times are easy to write down:
// intra-node a = 1 us, B = 100 GB/s; inter-node a = 5 us, B = 10 GB/s.
inline HardwareProfile simple_profile(int nodes = 2, int per_node = 4) {
  HardwareProfile p;
  p.name = "simple";
  p.nodes = nodes;
  p.devices_per_node = per_node;
  p.device = {10.0, 20.0, 1000.0, 1.0, 0.0, 1.0};
  p.intra = {1.0, 100.0};
  p.inter = {5.0, 10.0};
  return p;
}

inline constexpr Time kUs = 1'000'000;  // picoseconds per microsecond

}  // namespace shardlab::testing
