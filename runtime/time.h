// Virtual time: a signed 64-bit count of picoseconds (about 106 days of range).
//
// Every duration the emulator charges is rounded UP to a whole picosecond, so
// a cost is never zero unless its inputs are, and the same inputs always give
// the same integer on every host.
#pragma once

#include <cstdint>

namespace shardlab {

using Time = int64_t;  // picoseconds

inline constexpr Time kPicosPerMicro = 1'000'000;
inline constexpr Time kPicosPerSecond = 1'000'000'000'000;

constexpr double to_us(Time t) { return static_cast<double>(t) / 1e6; }
constexpr double to_seconds(Time t) { return static_cast<double>(t) / 1e12; }

// Microseconds (as written in a profile) to picoseconds, rounded to nearest.
Time us_to_time(double us);

// Time to move `bytes` at `bytes_per_second`: ceil(bytes * 1e12 / bytes_per_second),
// computed exactly in 128-bit integers. bytes_per_second must be > 0.
Time transfer_time(uint64_t bytes, uint64_t bytes_per_second);

}  // namespace shardlab
