// The one rule for a number a user writes, wherever it is read (flags,
// fault specs, --pp-layers lists, workload CSV files, environment
// variables): the whole text in std::from_chars's grammar. That is an
// optional '-', decimal digits, and for a real a fraction and an exponent
// ("5", "-3", "0.25", ".5", "1e-4"). Refused: a leading '+' or space,
// trailing text or space, hex ("0x10"), an empty text, an integer out of its
// type's range, and for parse_number a real that is not finite ("inf",
// "nan"). std::stod and std::stoi accepted "+5", " 5" and "5abc" (with a
// prefix length the callers had to check); one grammar everywhere means a
// value the flag takes is also one the CSV file and the fault spec take.
//
// Thread safety: pure functions.
#pragma once

#include <charconv>
#include <cmath>
#include <optional>
#include <string_view>
#include <system_error>
#include <type_traits>

namespace shardlab {

// The whole text as a T, non-finite reals ("inf", "nan") included: for
// callers that report them with their own words. nullopt otherwise.
template <class T>
std::optional<T> parse_whole(std::string_view text) {
  static_assert(std::is_arithmetic_v<T> && !std::is_same_v<T, bool>);
  T value{};
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc() || ptr != end) return std::nullopt;
  return value;
}

// The whole text as a T, a real one finite; nullopt otherwise.
template <class T>
std::optional<T> parse_number(std::string_view text) {
  const std::optional<T> value = parse_whole<T>(text);
  if constexpr (std::is_floating_point_v<T>)
    if (value && !std::isfinite(*value)) return std::nullopt;
  return value;
}

}  // namespace shardlab
