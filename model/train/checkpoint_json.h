// The JSON of a sharded checkpoint's index (checkpoint.h describes the
// format): what the writer puts in and what the reader takes out.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "model/parallel/local_model.h"
#include "model/train/checkpoint.h"
#include "runtime/device.h"

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
