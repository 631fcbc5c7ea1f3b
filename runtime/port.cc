#include "runtime/port.h"

#include <algorithm>
#include <bit>
#include <iterator>
#include <limits>

#include "runtime/trace.h"

namespace shardlab {

static_assert(Port::kStreams == kNumStreams, "a port shares its bandwidth among every stream kind");

namespace {

// Work is counted in sixtieths of a picosecond of the port alone, so that
// the rates of 1 to 6 sharing streams (60, 30, 20, 15, 12, 10 sixtieths per
// picosecond) and the bandwidth each sharer loses (30, 10, 5, 3, 2 sixtieths
// a picosecond when 1, 2, 3, 4, 5 share with a late transfer) stay exact
// integers (60 = lcm(1..6), one sharer a StreamKind). With up to 4 sharers every time is the one twelfths gave (both
// sides of each division times 5), with up to 3 the one sixths gave.
__extension__ using Wide = __int128;
constexpr Wide kScale = 60;

Time ceil_div(Wide a, Wide b) { return static_cast<Time>((a + b - 1) / b); }

}  // namespace

Time Port::latest() const { return *std::max_element(std::begin(free_), std::end(free_)); }

void Port::set_all_free(Time t) {
  for (Time& f : free_) f = t;
}

Time Port::others_end(int stream) const {
  Time t = 0;
  for (int s = 0; s < kStreams; ++s)
    if (s != stream) t = std::max(t, last_end_[s]);
  return t;
}

std::span<const Port::Segment> Port::segments_after(Time from) const {
  const auto it = std::partition_point(segs_.begin(), segs_.end(), [&](const Segment& s) { return s.end <= from; });
  return {it, segs_.end()};
}

void Port::restore(std::span<const Segment> segs, const Time free[kStreams], size_t held_before) {
  segs_.assign(segs.begin(), segs.end());
  held_before_ = held_before;
  for (int s = 0; s < kStreams; ++s) {
    free_[s] = free[s];
    last_end_[s] = 0;
  }
  for (const Segment& g : segs_)
    for (int s = 0; s < kStreams; ++s)
      if (g.streams & (1u << s)) last_end_[s] = std::max(last_end_[s], g.end);
}

Port::Booking Port::book(int stream, Time ready, Time work) {
  const auto me = static_cast<uint8_t>(1u << stream);
  const Time start = std::max(ready, free_[stream]);
  if (work <= 0) return {start, start};
  // The common case: nothing on the port after `start`.
  if (segs_.empty() || segs_.back().end <= start) {
    mark(start, start + work, me);
    free_[stream] = start + work;
    return {start, start + work};
  }
  // A late transfer: walk the spans from `start`, moving at 1/(k+1) of the
  // rate where k other streams move data, at the full rate in idle gaps.
  Wide left = Wide(work) * kScale;
  Wide lost[kStreams] = {};  // what each other stream gives up, in sixtieths
  auto charge = [&](uint8_t others, int k, Time span) {
    if (k == 0) return;
    // Each of the k loses span * (1/k - 1/(k+1)) of the port: 60/(k(k+1)) sixtieths a picosecond.
    const Wide per = Wide(span) * kScale / (k * (k + 1));
    for (int s = 0; s < kStreams; ++s)
      if (others & (1u << s)) lost[s] += per;
  };
  Time t = start;
  size_t i = static_cast<size_t>(
      std::partition_point(segs_.begin(), segs_.end(), [&](const Segment& s) { return s.end <= t; }) -
      segs_.begin());
  Time end = 0;
  while (true) {
    if (i == segs_.size()) {  // idle to the end of time
      end = t + ceil_div(left, kScale);
      break;
    }
    if (segs_[i].start > t) {  // an idle gap before the next span
      const Wide room = Wide(segs_[i].start - t) * kScale;
      if (left <= room) {
        end = t + ceil_div(left, kScale);
        break;
      }
      left -= room;
      t = segs_[i].start;
      continue;
    }
    const auto others = static_cast<uint8_t>(segs_[i].streams & ~me);
    const int k = std::popcount(others);
    const Wide rate = kScale / (k + 1);
    const Wide room = Wide(segs_[i].end - t) * rate;
    if (left <= room) {
      const Time dt = ceil_div(left, rate);
      charge(others, k, dt);
      end = t + dt;
      break;
    }
    charge(others, k, segs_[i].end - t);
    left -= room;
    t = segs_[i].end;
    ++i;
  }
  mark(start, end, me);
  free_[stream] = end;
  // The streams this transfer shared with are behind by what they lost: their
  // backlog goes after everything on the port (so no span carries more than
  // the port's rate), in stream order, and their next transfers wait for it.
  for (int s = 0; s < kStreams; ++s) {
    if (lost[s] == 0) continue;
    const Time from = latest();
    free_[s] = from + ceil_div(lost[s], kScale);
    mark(from, free_[s], static_cast<uint8_t>(1u << s));
  }
  return {start, end};
}

void Port::mark(Time start, Time end, uint8_t bit) {
  if (start >= end) return;
  for (int s = 0; s < kStreams; ++s)
    if (bit & (1u << s)) last_end_[s] = std::max(last_end_[s], end);
  if (segs_.empty() || segs_.back().end <= start) {
    if (!segs_.empty() && segs_.back().end == start && segs_.back().streams == bit)
      segs_.back().end = end;
    else
      segs_.push_back({start, end, bit});
    prune();
    return;
  }
  const auto first = std::partition_point(segs_.begin(), segs_.end(), [&](const Segment& s) { return s.end <= start; });
  const auto last = std::partition_point(first, segs_.end(), [&](const Segment& s) { return s.start < end; });
  std::vector<Segment> out;
  out.reserve(size_t(2 * (last - first) + 3));
  auto put = [&](Time a, Time b, uint8_t streams) {
    if (a >= b) return;
    if (!out.empty() && out.back().end == a && out.back().streams == streams)
      out.back().end = b;
    else
      out.push_back({a, b, streams});
  };
  // Keep the left neighbour so equal spans merge across the edit.
  auto lo = first;
  if (lo != segs_.begin()) --lo;
  for (auto it = lo; it != first; ++it) put(it->start, it->end, it->streams);
  Time t = start;
  if (first != last && first->start < start) put(first->start, start, first->streams);
  for (auto it = first; it != last; ++it) {
    const Time a = std::max(it->start, start), b = std::min(it->end, end);
    put(t, a, bit);
    put(a, b, static_cast<uint8_t>(it->streams | bit));
    t = b;
  }
  put(t, end, bit);
  if (first != last && std::prev(last)->end > end) put(end, std::prev(last)->end, std::prev(last)->streams);
  auto hi = last;
  if (hi != segs_.end()) {
    put(hi->start, hi->end, hi->streams);
    ++hi;
  }
  const size_t at = size_t(lo - segs_.begin());
  segs_.erase(lo, hi);
  segs_.insert(segs_.begin() + static_cast<std::ptrdiff_t>(at), out.begin(), out.end());
  prune();
}

void Port::prune() {
  if (held_before_ + segs_.size() <= kMaxSegments) return;
  // The oldest half goes; a copy's first are the original's it does not hold.
  size_t drop = kMaxSegments / 2;
  const size_t unheld = std::min(drop, held_before_);
  held_before_ -= unheld;
  drop -= unheld;
  segs_.erase(segs_.begin(), segs_.begin() + static_cast<std::ptrdiff_t>(drop));
}

}  // namespace shardlab
