#include "model/rng.h"

#include <cmath>
#include <cstring>
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

namespace {

inline double from_bits(uint64_t b) {
  double d;
  std::memcpy(&d, &b, sizeof d);
  return d;
}

// normal_at's arithmetic on the uniforms j1·2^-53 and j2·2^-53 (rng.h).
[[gnu::always_inline]] inline double normal_lane(uint64_t r1, uint64_t r2) {
  const uint64_t j1 = (r1 >> 11) + 1, j2 = (r2 >> 11) + 1;
  const double u1 = static_cast<double>(j1) * 0x1.0p-53, u2 = static_cast<double>(j2) * 0x1.0p-53;
  // pm::log(u1): u1 = m·2^e, m in [0.5, 1), read off the bits.
  uint64_t b;
  std::memcpy(&b, &u1, sizeof b);
  int64_t e = int64_t(b >> 52) - 1022;
  double m = from_bits((b & ((uint64_t{1} << 52) - 1)) | (uint64_t{1022} << 52));
  const bool low = m < 0.70710678118654752;
  m = low ? m * 2 : m;
  e = low ? e - 1 : e;
  const double f = (m - 1.0) / (m + 1.0);
  const double s = f * f;
  double p = 1.0 / 23;
#pragma GCC unroll 16  // whole, so that the loop over elements vectorises
  for (int k = 21; k >= 3; k -= 2) p = p * s + 1.0 / k;
  const double two_f = 2.0 * f;
  const double ln2_hi = 0x1.62e42fee00000p-1, ln2_lo = 0x1.a39ef35793c76p-33;
  const double ed = static_cast<double>(e);
  const double log_u1 = ed * ln2_hi + (two_f * s * p + ed * ln2_lo + two_f);
  // pm::cos_2pi(u2): 4·u2 = j2·2^-51, so round(4·u2) = (j2 + 2^50) >> 51.
  const uint64_t qi = (j2 + (uint64_t{1} << 50)) >> 51;
  const double q = static_cast<double>(qi);
  const double r = u2 - 0.25 * q;
  const double x = r * 0x1.921fb54442d18p+2 + r * 0x1.1a62633145c07p-52;
  const double sq = x * x;
  double c = pm::inv_factorial(18), sn = pm::inv_factorial(19);
#pragma GCC unroll 16
  for (int k = 16; k >= 0; k -= 2) c = pm::inv_factorial(k) - sq * c;
#pragma GCC unroll 16
  for (int k = 17; k >= 1; k -= 2) sn = pm::inv_factorial(k) - sq * sn;
  const double sin_x = x * sn;
  const uint64_t quadrant = qi & 3;
  const double cos_2pi = quadrant == 0 ? c : (quadrant == 1 ? -sin_x : (quadrant == 2 ? -c : sin_x));
  return std::sqrt(-2.0 * log_u1) * cos_2pi;
}

}  // namespace

double detail::normal_of(uint64_t r1, uint64_t r2) { return normal_lane(r1, r2); }

void normals_at(uint64_t key, uint64_t first, int64_t n, double* out) {
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t index = first + uint64_t(i);
    out[i] = normal_lane(random_bits(key, 2 * index), random_bits(key, 2 * index + 1));
  }
}

}  // namespace shardlab::model
