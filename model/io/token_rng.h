// Random numbers for token data, bit-identical on every platform: only integer
// arithmetic, no std:: distributions (their output differs between standard
// libraries).
//
// SplitMix64 is a sequential generator for building synthetic streams.
// counter_hash(seed, a, b) is counter-based: a pure function of its key, so
// any rank can draw "row 5 of step 12" without the state of rows 0..4.
#pragma once

#include <cstdint>

namespace shardlab::model {

__extension__ using uint128_t = unsigned __int128;

// The SplitMix64 finalizer (Stafford's mix13): a bijection on 64 bits.
inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// A hash of the key (seed, a, b); each field goes through the mixer in turn.
inline uint64_t counter_hash(uint64_t seed, uint64_t a, uint64_t b) {
  uint64_t h = mix64(seed + 0x9e3779b97f4a7c15ULL);
  h = mix64(h ^ (a + 0x632be59bd9b4e019ULL));
  return mix64(h ^ (b + 0x85157af5ULL * 0x9e3779b97f4a7c15ULL));
}

// Maps a uniform 64-bit value to [0, n) by multiply-high (Lemire). The bias
// is below n / 2^64, far under anything a test could see.
inline uint64_t scale_to(uint64_t r, uint64_t n) {
  return static_cast<uint64_t>((static_cast<uint128_t>(r) * n) >> 64);
}

class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t next() { return mix64(state_ += 0x9e3779b97f4a7c15ULL); }
  // Exactly uniform in [0, n), n > 0 (Lemire's method with rejection).
  uint64_t uniform(uint64_t n) {
    uint128_t m = static_cast<uint128_t>(next()) * n;
    if (static_cast<uint64_t>(m) < n) {
      const uint64_t threshold = (0 - n) % n;
      while (static_cast<uint64_t>(m) < threshold) m = static_cast<uint128_t>(next()) * n;
    }
    return static_cast<uint64_t>(m >> 64);
  }

 private:
  uint64_t state_;
};

}  // namespace shardlab::model
