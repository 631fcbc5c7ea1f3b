// Counter-based random numbers: every value is a pure function of
// (key, counter), so any slice of a tensor can be generated on its own and
// sharding never changes the weights (docs/architecture.md, "Sharding never
// changes the math").
//
// key    = mix(seed, fnv1a64(parameter name))
// bits   = two rounds of the splitmix64 finalizer over (key, counter)
// normal = Box-Muller of the uniforms at counters 2i and 2i+1 (cosine branch)
#pragma once

#include <cstdint>
#include <string_view>

namespace shardlab::model {

uint64_t fnv1a64(std::string_view s);
uint64_t splitmix64_mix(uint64_t z);  // the splitmix64 output function (a bijection)

// Key of one named stream under a seed.
uint64_t stream_key(uint64_t seed, std::string_view name);
// 64 random bits at position `counter` of stream `key`.
uint64_t random_bits(uint64_t key, uint64_t counter);
// Uniform in (0, 1] (never 0, safe for log) at `counter`.
double uniform_at(uint64_t key, uint64_t counter);
// Standard normal for element `index` (uses counters 2·index and 2·index + 1).
double normal_at(uint64_t key, uint64_t index);
// out[i] = normal_at(key, first + i) for i < n, bit for bit, in a loop the
// compiler vectorises (detail::normal_of): the weights' initialisation,
// which at a tp 8 serving replica's start was a fifth of its host time.
void normals_at(uint64_t key, uint64_t first, int64_t n, double* out);

namespace detail {
// normal_at's value from its two random words (random_bits at 2·index and
// 2·index + 1), with no branch and no library call. Its uniforms are
// j·2^-53 with j in [1, 2^53], positive normal numbers on a known grid, so
// pm::log's frexp is the exponent field and pm::cos_2pi's round(4u) is
// the integer (j + 2^50) >> 51 (halves up, as round does for positives);
// the rest is pm::log's and pm::cos_2pi's arithmetic, operation for
// operation (tests/model/params_test.cc checks the edges of both).
double normal_of(uint64_t r1, uint64_t r2);
}  // namespace detail

}  // namespace shardlab::model
