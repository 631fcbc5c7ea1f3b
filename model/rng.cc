#include "model/rng.h"

#include <cmath>
#include <numbers>

#include "model/portable_math.h"

namespace shardlab::model {

uint64_t fnv1a64(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char ch : s) {
    h ^= ch;
    h *= 0x100000001b3ULL;
  }
  return h;
}

uint64_t splitmix64_mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

uint64_t stream_key(uint64_t seed, std::string_view name) {
  return splitmix64_mix(splitmix64_mix(seed + 0x9e3779b97f4a7c15ULL) ^ fnv1a64(name));
}

uint64_t random_bits(uint64_t key, uint64_t counter) {
  const uint64_t z =
      splitmix64_mix(key ^ (counter * 0x9e3779b97f4a7c15ULL + 0x632be59bd9b4e019ULL));
  return splitmix64_mix(z + key);
}

double uniform_at(uint64_t key, uint64_t counter) {
  return static_cast<double>((random_bits(key, counter) >> 11) + 1) * 0x1.0p-53;
}

double normal_at(uint64_t key, uint64_t index) {
  const double u1 = uniform_at(key, 2 * index);
  const double u2 = uniform_at(key, 2 * index + 1);
  // The project's log and cos: the C library's differ in their last bits by CPU.
  return std::sqrt(-2.0 * pm::log(u1)) * pm::cos_2pi(u2);
}

}  // namespace shardlab::model
