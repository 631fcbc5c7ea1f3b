// Helpers shared by the runtime tests.
#pragma once

#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "runtime/errors.h"
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

// A file of `text` in the test's scratch directory; its path.
inline std::string write_temp(const std::string& name, const std::string& text) {
  std::string path = ::testing::TempDir() + name;
  std::ofstream(path) << text;
  return path;
}

// The one-line error of loading the profile at `path` ("" if it loads).
inline std::string load_error(const std::string& path) {
  try {
    load_profile(path);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

}  // namespace shardlab::testing
