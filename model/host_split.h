// Splitting one device's kernel over the host cores the device threads leave
// idle (runtime/host_cores.h), without changing a bit.
//
// for_chunks(n, chunk, work, f) calls f(i0, i1) over [0, n) in chunks of
// `chunk` items, the last one taking the remainder, so the chunk boundaries
// are a function of n and chunk alone. When the work is worth a hand-off and
// a core is idle, oneTBB runs the chunks on its workers; otherwise the calling
// thread runs f(0, n) once. A kernel whose items are independent (output rows,
// (batch, head) pairs, elements) gets the same bits either way, whatever the
// number of cores; gemm.cc says why its GEMMs do too.
//
// Thread safety: f runs concurrently on disjoint ranges; it must not share
// scratch between calls (use per-thread scratch, see ThreadScratch).
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/partitioner.h>

#include "model/arithmetic.h"
#include "runtime/host_cores.h"

namespace shardlab::model {

// Below this many multiply-adds (or element operations) a kernel stays on its
// thread: handing chunks to oneTBB's workers costs microseconds.
inline constexpr double kSplitMinWork = 1 << 20;
// Elements per chunk of fill_split and copy_split (256 KB of floats).
inline constexpr int64_t kFillChunk = 1 << 16;

// Tests: force (true) or forbid (false) splitting on the calling thread,
// whatever the idle cores; std::nullopt restores the default.
void set_host_split_for_test(std::optional<bool> split);
std::optional<bool> host_split_for_test();

// Debian's oneTBB is not built with ThreadSanitizer, which would take its
// joins for races: TSan builds never split (the bits are the same anyway).
#if defined(__SANITIZE_THREAD__)
inline constexpr bool kSplitBuild = false;
#else
inline constexpr bool kSplitBuild = true;
#endif

// True while the thread runs a chunk of for_chunks. A kernel called inside a
// chunk (the GEMMs in attention's (batch, head) loop, 256 rows in small)
// does not split again: a thread waiting for a nested split may run another
// of the outer chunks meanwhile (oneTBB steals), which would reuse the
// per-thread scratch (thread_scratch, gemm.cc's packed blocks) the waiting
// kernel still holds. The outer split already has every core.
inline thread_local bool t_in_chunk = false;

inline bool split_wanted(int64_t n, int64_t chunk, double work) {
  if (!kSplitBuild || n < 2 * chunk || t_in_chunk) return false;
  if (const auto forced = host_split_for_test()) return *forced;
  return work >= kSplitMinWork && idle_host_cores() > 0;
}

template <typename F>
void for_chunks(int64_t n, int64_t chunk, double work, const F& f) {
  if (!split_wanted(n, chunk, work)) {
    f(int64_t{0}, n);
    return;
  }
  namespace tbb = oneapi::tbb;
  const int64_t chunks = n / chunk;
  const Arithmetic caller = arithmetic();  // per thread: the workers take the caller's
  const bool caller_split = split_sums();   // so do they the caller's split sums
  tbb::parallel_for(
      tbb::blocked_range<int64_t>(0, chunks, 1),
      [&](const tbb::blocked_range<int64_t>& r) {
        const ArithmeticScope same(caller);
        const SplitSumsScope same_split(caller_split);
        struct InChunk {  // restored on the way out, a throw included
          bool outer = std::exchange(t_in_chunk, true);
          ~InChunk() { t_in_chunk = outer; }
        } in_chunk;
        for (int64_t c = r.begin(); c < r.end(); ++c)
          f(c * chunk, c + 1 == chunks ? n : (c + 1) * chunk);
      },
      tbb::simple_partitioner());
}

// dst[0..n) = v and dst[0..n) = src[0..n), split on idle cores: the
// backward's zeroed accumulators (up to N·4C) and copies are memory-bound
// work the second core would otherwise wait through.
template <typename Real>
void fill_split(Real* dst, int64_t n, Real v) {
  for_chunks(n, kFillChunk, double(n), [=](int64_t i0, int64_t i1) { std::fill(dst + i0, dst + i1, v); });
}
template <typename Real>
void copy_split(Real* dst, const Real* src, int64_t n) {
  for_chunks(n, kFillChunk, double(n), [=](int64_t i0, int64_t i1) { std::copy(src + i0, src + i1, dst + i0); });
}

// A scratch vector per thread, grown on first use and then reused: keeps
// split kernels allocation-free in steady state. A kernel that needs two at
// once takes them from two slots.
template <typename Real, int Slot = 0>
std::vector<Real>& thread_scratch(size_t n) {
  thread_local std::vector<Real> scratch;
  if (scratch.size() < n) scratch.resize(n);
  return scratch;
}

}  // namespace shardlab::model
