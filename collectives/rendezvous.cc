#include "collectives/rendezvous.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "collectives/detail.h"
#include "collectives/folded.h"
#include "runtime/errors.h"

namespace shardlab::collectives::detail {

namespace {

std::atomic<uint64_t> meetings{0};

// What the last arrival hands every member: the clocks (and, where other
// streams share a port after the call's start, the ports) each member's
// replay starts from. Shared read-only once published.
struct Outcome {
  std::vector<MemberClock> clocks;
  std::vector<Port> ports;  // kReplayPorts per member, group order; empty: plain port clocks
};

// One member's deposit at the meeting.
struct Arrival {
  CollShape shape;
  Algo algo = Algo::kAuto;
  Tag tag = 0;
  int rank = -1;
  MeetData data;
  MemberClock clock;
  Time others_end = 0;
  const Device* dev = nullptr;  // its ports, read by the last arrival while it sleeps
  // Filled by the last arrival.
  std::shared_ptr<const Outcome> outcome;
  std::string error;
};

bool same_call(const Arrival& a, const Arrival& b) {
  return a.shape.op == b.shape.op && a.shape.count == b.shape.count && a.shape.elem_size == b.shape.elem_size &&
         a.shape.proto == b.shape.proto && a.algo == b.algo && a.tag == b.tag &&
         (a.shape.op != OpKind::kAllReduce || a.data.op == b.data.op);
}

std::string describe(const Arrival& a) {
  return fmt::format("device {}: {} of {} elements ({}, {})", a.rank, op_kind_name(a.shape.op), a.shape.count,
                     algo_name(a.algo), a.shape.op == OpKind::kAllReduce ? reduce_op_name(a.data.op) : "copy");
}

// acc[i] = own[i] op acc[i]: the ring's receiver adds the partial it gets to
// its own value (ring.cc: reduce_into(own, received)), own on the left.
void reduce_own_left(float* acc, const float* own, size_t count, ReduceOp op) {
  if (op == ReduceOp::kMax) {
    for (size_t i = 0; i < count; ++i) acc[i] = std::max(own[i], acc[i]);
  } else {
    for (size_t i = 0; i < count; ++i) acc[i] = own[i] + acc[i];
  }
}

// Every member's result, computed by the last arrival while the others
// sleep (their buffers are theirs again once they wake).
void compute_all_reduce(std::span<Arrival* const> a, size_t count, Algo algo) {
  const int n = static_cast<int>(a.size());
  const ReduceOp op = a[0]->data.op;
  thread_local std::vector<float> tmp;
  if (algo == Algo::kDirect) {
    // direct.cc: every member combines the inputs in member order.
    tmp.assign(a[0]->data.in, a[0]->data.in + count);
    for (int j = 1; j < n; ++j) reduce_into(tmp.data(), a[size_t(j)]->data.in, count, op);
    finalize(tmp.data(), count, op, n);
    for (const Arrival* m : a) copy(m->data.out, tmp.data(), count);
    return;
  }
  if (algo == Algo::kTree) {
    // tree.cc's recursive halving, step by step over copies of every
    // member's buffer: at step k member r adds what r - 2^k sends (its
    // chunks [r, r+m), which the sender does not touch in that step) to its
    // own, own on the left; chunk r ends on member r, the doubling
    // all_gather then copies it everywhere.
    const size_t un = size_t(n);
    tmp.resize(un * count);
    for (size_t j = 0; j < un; ++j) std::copy(a[j]->data.in, a[j]->data.in + count, tmp.begin() + long(j * count));
    for (int k = ceil_log2(n) - 1; k >= 0; --k) {
      const int dist = 1 << k, m = std::min(dist, n - dist);
      for (int r = 0; r < n; ++r) {
        const int from = ((r - dist) % n + n) % n;
        for (int t = r; t < r + m; ++t) {
          const Range c = chunk_range(count, n, t % n);
          reduce_into(tmp.data() + size_t(r) * count + size_t(c.begin), tmp.data() + size_t(from) * count + size_t(c.begin),
                      size_t(c.size), op);
        }
      }
    }
    for (int c = 0; c < n; ++c) {
      const Range r = chunk_range(count, n, c);
      float* final_chunk = tmp.data() + size_t(c) * count + size_t(r.begin);
      finalize(final_chunk, size_t(r.size), op, n);
      for (const Arrival* m : a) copy(m->data.out + r.begin, final_chunk, size_t(r.size));
    }
    return;
  }
  // Ring: chunk c starts at member c+1 and ends at its owner c.
  for (int c = 0; c < n; ++c) {
    const Range r = chunk_range(count, n, c);
    if (r.size == 0) continue;
    const size_t at = size_t(r.begin), len = size_t(r.size);
    const float* first = a[size_t((c + 1) % n)]->data.in + at;
    tmp.assign(first, first + len);
    for (int k = 2; k <= n; ++k) reduce_own_left(tmp.data(), a[size_t((c + k) % n)]->data.in + at, len, op);
    finalize(tmp.data(), len, op, n);
    for (const Arrival* m : a) copy(m->data.out + at, tmp.data(), len);
  }
}

void compute_all_gather(std::span<Arrival* const> a, size_t count) {
  const int n = static_cast<int>(a.size());
  for (int i = 0; i < n; ++i) {
    const Range r = chunk_range(count, n, i);
    for (const Arrival* m : a) copy(m->data.out + r.begin, a[size_t(i)]->data.in, size_t(r.size));
  }
}

// The last arrival's work: check that the members agree, compute their
// results, publish the clocks their replays start from.
void complete(std::span<void* const> deposits) {
  std::vector<Arrival*> a(deposits.size());
  for (size_t i = 0; i < deposits.size(); ++i) a[i] = static_cast<Arrival*>(deposits[i]);
  auto fail = [&](const std::string& what) {
    for (Arrival* m : a) m->error = what;
  };
  for (const Arrival* m : a)
    if (!same_call(*m, *a[0]))
      return fail(fmt::format("collective: members disagree ({}; {}): members must call the same collectives "
                              "with matching counts, ops and algorithms",
                              describe(*a[0]), describe(*m)));
  // Real or phantom by the full-size output; an empty input (an all_gather's
  // chunk of none) may be null either way.
  const size_t count = a[0]->shape.count;
  const bool real = a[0]->data.out != nullptr;
  for (size_t i = 0; i < a.size(); ++i) {
    const Arrival* m = a[i];
    const size_t in_count =
        m->shape.op == OpKind::kAllGather ? size_t(chunk_range(count, int(a.size()), int(i)).size) : count;
    if (count > 0 && ((m->data.out != nullptr) != real || (in_count > 0 && (m->data.in != nullptr) != real)))
      return fail(fmt::format("collective: device {} passes {} data, device {} {}: all members real or all phantom",
                              a[0]->rank, real ? "real" : "phantom", m->rank, real ? "phantom" : "real"));
  }
  if (real && count > 0) {
    if (a[0]->shape.op == OpKind::kAllReduce) {
      compute_all_reduce(a, count, a[0]->algo);
    } else {
      compute_all_gather(a, count);
    }
  }
  auto out = std::make_shared<Outcome>();
  out->clocks.reserve(a.size());
  Time earliest = a[0]->clock.now;
  for (const Arrival* m : a) {
    out->clocks.push_back(m->clock);
    earliest = std::min(earliest, m->clock.now);
  }
  // As folded.cc: where another stream moves data on a member's port after
  // the call's start, the replay books on copies of every member's ports.
  const bool shared = std::any_of(a.begin(), a.end(), [&](const Arrival* m) { return m->others_end > earliest; });
  if (shared) {
    out->ports.reserve(a.size() * size_t(kReplayPorts));
    for (const Arrival* m : a)
      for (int q = 0; q < kReplayPorts; ++q) out->ports.push_back(device_port(*m->dev, q));
  }
  for (Arrival* m : a) m->outcome = out;
  meetings.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace

uint64_t meetings_completed() { return meetings.load(std::memory_order_relaxed); }

bool can_meet(const Device& dev, const ProcessGroup& g, const CollShape& shape, Algo algo) {
  // An empty call's messages are empty, and the replay's plain port clocks
  // advance on an empty transfer where a Port does not (Port::book books
  // nothing): its receive marks could end later than the messages'. Such
  // calls cost nothing to pass as messages.
  // A folded run's ports may be in doubt (Device::widen_doubt), which only
  // the messages check: its collectives keep them.
  if (!dev.rendezvous() || dev.folding() || g.size() < 2 || shape.count == 0 || !dev.profile().pcie.empty())
    return false;
  if (shape.op != OpKind::kAllReduce && shape.op != OpKind::kAllGather) return false;
  if (algo == Algo::kDirect || algo == Algo::kTree) return true;
  return algo == Algo::kRing && ring_plan(dev.profile(), g.members()).single();
}

void run_met(Device& dev, const ProcessGroup& g, Stream& s, Tag tag, const CollShape& shape, Algo algo,
             const MeetData& data) {
  Arrival me;
  me.shape = shape;
  me.algo = algo;
  me.tag = tag;
  me.rank = dev.rank();
  me.data = data;
  me.clock = entry_clock(dev, s, &me.others_end);
  me.dev = &dev;
  // The meeting's own tag (phase 0xFE: no algorithm has that many phases)
  // is what the watchdog shows a sleeper waiting on.
  dev.meet(g.members(), g.rank(), tag + 0xFE, &me, complete);
  if (!me.error.empty()) throw std::runtime_error(fmt::format("{} on {}", me.error, g.to_string()));
  const Outcome& o = *me.outcome;
  std::vector<Port> ports = o.ports;  // the replay books on its own copies
  const ReplayPorts replay_ports{ports, static_cast<int>(s.kind())};
  std::vector<ReplayMark> marks;
  const std::vector<MemberClock> end =
      replay_collective(dev.profile(), g.members(), shape, algo, o.clocks, g.rank(), &marks, {}, nullptr,
                        ports.empty() ? nullptr : &replay_ports);
  apply_replay(dev, s, marks, end[size_t(g.rank())], [&](const ReplayMark& m, const Port::Booking& b) {
    SHARDLAB_CHECK(false, fmt::format("rendezvous {} on {}: device {}'s port books [{}, {}) ps where the replay "
                                      "booked [{}, {}) ps",
                                      op_kind_name(shape.op), g.to_string(), dev.rank(), b.start, b.end,
                                      m.booked_start, m.booked_end));
  });
}

}  // namespace shardlab::collectives::detail
