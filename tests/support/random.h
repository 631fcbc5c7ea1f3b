// Standard-normal test inputs from a fixed seed, into any container of floats
// that can be sized at construction (std::vector<float>, model::Buffer<float>):
//
//   const auto x = normal_values<std::vector<float>>(1024, /*seed=*/7);
//
// Same seed, same values on every host (mt19937_64 is specified bit for bit;
// std::normal_distribution is the library's, so values may differ between
// standard libraries, never between runs).
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>

namespace shardlab::testing {

template <typename Container>
Container normal_values(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  Container values(n);
  for (float& x : values) x = dist(rng);
  return values;
}

}  // namespace shardlab::testing
