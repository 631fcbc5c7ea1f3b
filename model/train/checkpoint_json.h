// The JSON of a sharded checkpoint's index (checkpoint.h describes the
// format): what the writer puts in and what the reader takes out.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "model/parallel/local_model.h"
#include "model/train/checkpoint.h"
#include "runtime/device.h"
#include "runtime/errors.h"

namespace shardlab::train {

inline constexpr const char* kCheckpointFormat = "shardlab-checkpoint";
inline constexpr int kCheckpointVersion = 1;
inline constexpr const char* kStateParam = "param";
inline constexpr const char* kStateExpAvg = "exp_avg";
inline constexpr const char* kStateExpAvgSq = "exp_avg_sq";
// A checkpoint being written: D/.partial-step-000005 (removed before a run).
inline constexpr const char* kPartialPrefix = ".partial-";
// A checkpoint being replaced by a rerun's of the same step: D/.old-step-000005.
inline constexpr const char* kReplacedPrefix = ".old-";

// An integer field of the index: a JSON integer in [lo, hi], else a
// ConfigError naming `name` (a float, a string or an out-of-range number is
// refused, not truncated or wrapped: step 1.5 read as 1, 1e30 as INT_MIN).
template <class T>
T integer_field(const nlohmann::json& j, const std::string& name, T lo, T hi) {
  // nlohmann keeps a non-negative integer as unsigned, a negative one as signed.
  const auto in_range = [&](auto v) { return std::cmp_greater_equal(v, lo) && std::cmp_less_equal(v, hi); };
  const bool ok = j.is_number_unsigned() ? in_range(j.get<uint64_t>())
                  : j.is_number_integer() && in_range(j.get<int64_t>());
  if (!ok) throw ConfigError(name + " is " + j.dump() + ": expected an integer from " + std::to_string(lo) + " to " +
                             std::to_string(hi));
  return j.is_number_unsigned() ? T(j.get<uint64_t>()) : T(j.get<int64_t>());
}
// A count or a time in picoseconds: an integer from 0.
template <class T>
T count_field(const nlohmann::json& j, const std::string& name) {
  return integer_field<T>(j, name, T(0), std::numeric_limits<T>::max());
}

// One stored piece: local elements [begin, end) of `s` under `key` in `file`.
nlohmann::json shard_entry(const parallel::ShardSpec& s, const char* state, const std::string& file,
                           const std::string& key, int64_t begin, int64_t end);
// The shard a piece belongs to, from its entry, checked against the global
// shape (ConfigError naming what is wrong).
parallel::ShardSpec shard_of_entry(const nlohmann::json& e, const Shape& global_shape);

// The device's mesh name, clocks, busy totals and peaks.
nlohmann::json device_entry(DeviceSetup& s, Device& dev);
DeviceClock clock_of_entry(const nlohmann::json& d);
DeviceStats stats_of_entry(const nlohmann::json& d, int rank);

// Everything but "devices" and "shards": format, step, config, data, rng,
// tensors, steps (the resumed run's history first).
nlohmann::json index_header(const DeviceProgram& p, int steps_done);
StepRecord step_of_entry(const nlohmann::json& e);

}  // namespace shardlab::train
