// Element-wise comparison of two arrays for the numerical tests.
//
//   EXPECT_TRUE(all_close(got, want, 1e-6));             // max |got - want| <= 1e-6
//   EXPECT_TRUE(all_close_rel(got, want, 1e-5, 1e-3));   // max relative error <= 1e-5
//
// Both FAIL when any element of either side is NaN or ±Inf (a NaN compares
// false with everything, so `std::max(worst, nan)` silently keeps `worst`: a
// comparison written that way lets a NaN pass). Their message states the
// tolerance, the max difference, where it is and the two values there, e.g.
//   max abs diff 3.1e-05 at [17] (got 1.00003, want 1) > tol 1e-06; 4 of 64 elements over tol
// On success the same text (without "> tol") is in result.message(), for
// tests that print how far off they are.
//
// Relative error of element i: |g - w| / max(|g|, |w|, rel_floor). The floor
// keeps elements near zero from dividing noise by noise; pass the scale of
// the data (e.g. 1e-3 · max |want|) or 0 for a pure relative error.
#pragma once

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <ranges>
#include <span>
#include <string>
#include <type_traits>

#include <gtest/gtest.h>

namespace shardlab::testing {

struct Diff {
  int64_t size = 0;             // elements compared (min of both sizes)
  bool size_mismatch = false;   // got and want have different lengths
  double max_abs = 0;           // max |got - want| over finite pairs
  double max_rel = 0;           // max relative error over finite pairs
  int64_t worst_abs = -1;       // index of max_abs (-1: none)
  int64_t worst_rel = -1;       // index of max_rel (-1: none)
  int64_t non_finite = 0;       // elements where got or want is NaN or ±Inf
  int64_t first_non_finite = -1;
  bool finite() const { return non_finite == 0 && !size_mismatch; }
};

namespace detail {

template <class R>
concept NumberRange = std::ranges::contiguous_range<R> && std::ranges::sized_range<R> &&
                      std::is_arithmetic_v<std::ranges::range_value_t<R>>;

inline double rel_error(double g, double w, double rel_floor) {
  const double d = std::abs(g - w);
  if (d == 0) return 0;
  const double denom = std::max({std::abs(g), std::abs(w), rel_floor});
  return denom > 0 ? d / denom : std::numeric_limits<double>::infinity();
}

inline std::string num(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", x);
  return buf;
}

inline std::string sci(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", x);
  return buf;
}

}  // namespace detail

// Compares got[i] with want[i] for every i.
template <class G, class W>
Diff diff(std::span<const G> got, std::span<const W> want, double rel_floor = 0) {
  Diff d;
  d.size_mismatch = got.size() != want.size();
  d.size = static_cast<int64_t>(std::min(got.size(), want.size()));
  for (int64_t i = 0; i < d.size; ++i) {
    const double g = static_cast<double>(got[static_cast<size_t>(i)]);
    const double w = static_cast<double>(want[static_cast<size_t>(i)]);
    if (!std::isfinite(g) || !std::isfinite(w)) {
      if (d.non_finite++ == 0) d.first_non_finite = i;
      continue;
    }
    const double a = std::abs(g - w), r = detail::rel_error(g, w, rel_floor);
    if (d.worst_abs < 0 || a > d.max_abs) d.max_abs = a, d.worst_abs = i;
    if (d.worst_rel < 0 || r > d.max_rel) d.max_rel = r, d.worst_rel = i;
  }
  return d;
}

// Any two contiguous ranges of numbers (std::vector, std::array, std::span...).
template <detail::NumberRange GotRange, detail::NumberRange WantRange>
Diff diff(const GotRange& got, const WantRange& want, double rel_floor = 0) {
  using G = std::ranges::range_value_t<GotRange>;
  using W = std::ranges::range_value_t<WantRange>;
  return diff(std::span<const G>(std::ranges::data(got), std::ranges::size(got)),
              std::span<const W>(std::ranges::data(want), std::ranges::size(want)), rel_floor);
}

namespace detail {

// One line: what differs, by how much, where, against which tolerance.
template <NumberRange GotRange, NumberRange WantRange>
::testing::AssertionResult verdict(const Diff& d, bool relative, double tol, double rel_floor,
                                   const GotRange& got, const WantRange& want) {
  auto at = [&](int64_t i) {
    if (i < 0) return std::string(" (no finite element)");
    const size_t k = static_cast<size_t>(i);
    return " at [" + std::to_string(i) + "] (got " + num(static_cast<double>(std::ranges::data(got)[k])) +
           ", want " + num(static_cast<double>(std::ranges::data(want)[k])) + ")";
  };
  const double worst = relative ? d.max_rel : d.max_abs;
  const int64_t where = relative ? d.worst_rel : d.worst_abs;
  std::string text = std::string(relative ? "max rel diff " : "max abs diff ") + sci(worst) + at(where);
  const std::string tol_text =
      "tol " + sci(tol) + (relative ? " (rel floor " + sci(rel_floor) + ")" : "");
  if (d.size_mismatch) {
    return ::testing::AssertionFailure() << "sizes differ: got " << std::ranges::size(got)
                                         << " elements, want " << std::ranges::size(want) << "; "
                                         << text << ", " << tol_text;
  }
  if (d.non_finite > 0) {
    return ::testing::AssertionFailure() << d.non_finite << " of " << d.size
                                         << " elements are NaN or Inf, first" << at(d.first_non_finite)
                                         << "; finite elements: " << text << ", " << tol_text;
  }
  if (!(worst <= tol)) {
    int64_t over = 0;
    for (int64_t i = 0; i < d.size; ++i) {
      const size_t k = static_cast<size_t>(i);
      const double g = static_cast<double>(std::ranges::data(got)[k]);
      const double w = static_cast<double>(std::ranges::data(want)[k]);
      over += (relative ? rel_error(g, w, rel_floor) : std::abs(g - w)) > tol;
    }
    return ::testing::AssertionFailure() << text << " > " << tol_text << "; " << over << " of "
                                         << d.size << " elements over tol";
  }
  return ::testing::AssertionSuccess() << text << " <= " << tol_text;
}

}  // namespace detail

// max |got - want| <= tol, every element finite, same sizes.
template <detail::NumberRange GotRange, detail::NumberRange WantRange>
::testing::AssertionResult all_close(const GotRange& got, const WantRange& want, double tol) {
  return detail::verdict(diff(got, want), false, tol, 0, got, want);
}

// max |g - w| / max(|g|, |w|, rel_floor) <= tol, every element finite, same sizes.
template <detail::NumberRange GotRange, detail::NumberRange WantRange>
::testing::AssertionResult all_close_rel(const GotRange& got, const WantRange& want, double tol,
                                         double rel_floor) {
  return detail::verdict(diff(got, want, rel_floor), true, tol, rel_floor, got, want);
}

// Max |x| over the finite elements (a scale for tolerances and floors).
template <detail::NumberRange Range>
double max_abs_finite(const Range& r) {
  double m = 0;
  for (const auto& x : r) {
    const double v = std::abs(static_cast<double>(x));
    if (std::isfinite(v) && v > m) m = v;
  }
  return m;
}

}  // namespace shardlab::testing
