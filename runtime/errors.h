// Error types. A user-caused problem (bad flag, bad file, out of memory) is an
// exception with a one-line message; broken internal invariants abort through
// SHARDLAB_CHECK.
#pragma once

#include <stdexcept>
#include <string>

namespace shardlab {

// Bad configuration or input: the command-line tool prints what() and exits 2.
class ConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A device's arena cannot hold an allocation. what() names device, tensor, sizes.
class OutOfMemory : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A run failed: the first exception thrown on any device (rank >= 0), or a
// deadlock found by the watchdog (rank == -1). what() starts with "device N: ".
class RunError : public std::runtime_error {
 public:
  RunError(int rank, const std::string& what, bool input_error = false, bool folding = false,
           bool device_failure = false)
      : std::runtime_error(what), rank_(rank), input_error_(input_error), folding_(folding),
        device_failure_(device_failure) {}
  int rank() const { return rank_; }
  // The cause was the user's input (ConfigError, OutOfMemory): exit code 2.
  bool input_error() const { return input_error_; }
  // The cause was a FoldingError: the run is valid, its folding was not exact.
  bool folding() const { return folding_; }
  // The cause was a DeviceFailure: an injected dead device or downed link (exit 3).
  bool device_failure() const { return device_failure_; }

 private:
  int rank_;
  bool input_error_;
  bool folding_;
  bool device_failure_;
};

// An injected fault stopped the run (runtime/fault.h): a device died or a
// link went down. what() names the device or link, the step and what was in
// flight, and starts with "device N" or "link A-B" (not prefixed again).
class DeviceFailure : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A folded phantom run met ranks that are not in their representative's
// state (collectives/folded.h): the same run without that folding is exact.
class FoldingError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

[[noreturn]] void check_failed(const char* expr, const char* file, int line, const std::string& msg);

}  // namespace shardlab

#define SHARDLAB_CHECK(cond, ...)                                                \
  do {                                                                           \
    if (!(cond)) ::shardlab::check_failed(#cond, __FILE__, __LINE__, std::string{__VA_ARGS__}); \
  } while (0)
