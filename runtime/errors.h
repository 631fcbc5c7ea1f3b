// Error types. A user-caused problem (bad flag, bad file, out of memory) is an
// exception with a one-line message; broken internal invariants abort through
// SHARDLAB_CHECK.
#pragma once

#include <cstdint>
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
// Why a run failed, as the tool maps it to its exit code (cli/main.cc).
// What a std::bad_alloc says: the sizes asked for need more host memory
// than this machine has (exit 2, as an out-of-memory device).
inline constexpr const char* kHostOutOfMemory =
    "out of host memory (std::bad_alloc): the sizes asked for do not fit in this machine's memory";

enum class RunCause : uint8_t {
  kProgram = 0,    // an error in a device's program or the emulator (exit 1)
  kInput,          // the user's input: a ConfigError or an OutOfMemory (exit 2)
  kFolding,        // a FoldingError: the run is valid, its folding was not exact (retried unfolded)
  kDeviceFailure,  // an injected dead device or downed link, a DeviceFailure (exit 3)
  kDeadlock,       // the watchdog found every live device waiting on a message none will send (exit 1)
};
inline const char* run_cause_name(RunCause c) {
  constexpr const char* kNames[] = {"program", "input", "folding", "device failure", "deadlock"};
  return kNames[static_cast<int>(c)];
}

class RunError : public std::runtime_error {
 public:
  RunError(int rank, const std::string& what, RunCause cause = RunCause::kProgram)
      : std::runtime_error(what), rank_(rank), cause_(cause) {}
  int rank() const { return rank_; }  // -1: no one device (a deadlock)
  RunCause cause() const { return cause_; }
  bool input_error() const { return cause_ == RunCause::kInput; }
  bool folding() const { return cause_ == RunCause::kFolding; }
  bool device_failure() const { return cause_ == RunCause::kDeviceFailure; }

 private:
  int rank_;
  RunCause cause_;
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
