// Shared ports (runtime/port.h): one stream queues FIFO; streams share the
// bandwidth where they overlap; a late transfer's share is repaid by the
// streams it took it from. Every expected time below is worked out by hand
// from the rates in the comments, not read from the code.
#include "runtime/port.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <vector>

#include "runtime/cluster.h"
#include "tests/runtime/test_util.h"

namespace shardlab {
namespace {

using testing::kUs;
using testing::simple_profile;

constexpr int kCompute = 0, kComm = 1, kPipe = 2, kTpComm = 3, kCpComm = 4;

TEST(Port, OneStreamQueuesFifo) {
  Port p;
  EXPECT_EQ(p.book(kComm, 0, 100).end, 100);
  const Port::Booking b = p.book(kComm, 10, 50);  // waits for the first
  EXPECT_EQ(b.start, 100);
  EXPECT_EQ(b.end, 150);
  EXPECT_EQ(p.book(kComm, 400, 10).start, 400);  // an idle port: no wait
  EXPECT_EQ(p.free(kComm), 410);
}

TEST(Port, ALateTransferSharesHalfAndIsRepaidByTheOther) {
  Port p;
  p.book(kComm, 0, 1000);                         // [0, 1000) alone
  const Port::Booking b = p.book(kPipe, 10, 20);  // 20 of work at half the rate
  EXPECT_EQ(b.start, 10);
  EXPECT_EQ(b.end, 50);
  // The comm stream lost 40 * 1/2 = 20 of its share: its next transfer starts at 1020.
  EXPECT_EQ(p.free(kComm), 1020);
  EXPECT_EQ(p.book(kComm, 0, 5).start, 1020);
}

TEST(Port, ALateTransferRunsAtFullRateInGapsAndAfterTheEnd) {
  Port p;
  p.book(kComm, 0, 10);   // [0, 10)
  p.book(kComm, 50, 10);  // [50, 60)
  // 30 of work from 0: 5 in [0, 10) at half, 25 in the gap [10, 35).
  EXPECT_EQ(p.book(kPipe, 0, 30).end, 35);
  EXPECT_EQ(p.free(kComm), 65);  // lost 5 in [0, 10)
  Port q;
  q.book(kComm, 0, 100);
  // From 90: 5 in [90, 100) at half, the other 15 alone: ends at 115; comm's
  // 5 of backlog go after it.
  EXPECT_EQ(q.book(kPipe, 90, 20).end, 115);
  EXPECT_EQ(q.free(kComm), 120);
}

TEST(Port, ThreeStreamsShareAThirdEach) {
  Port p;
  p.book(kComm, 0, 600);
  // Shares [0, 600) with comm at half (300 of work), then alone: ends at
  // 900; comm lost 300, its backlog after everything: [900, 1200).
  EXPECT_EQ(p.book(kCompute, 0, 600).end, 900);
  EXPECT_EQ(p.free(kComm), 1200);
  // Where both others move data a third stream gets a third.
  EXPECT_EQ(p.book(kPipe, 0, 30).end, 90);
  // Each of the two lost 90 * (1/2 - 1/3) = 15, queued after the port's
  // last booking in stream order: compute [1200, 1215), comm [1215, 1230).
  EXPECT_EQ(p.free(kCompute), 1215);
  EXPECT_EQ(p.free(kComm), 1230);
}

// The fourth stream (--tp-comm-overlap's side stream) gets a quarter where
// the three others move data: the rate a port counts in twelfths of a
// picosecond for (in sixths a quarter would round to 1/6).
TEST(Port, FourStreamsShareAQuarterEach) {
  Port p;
  p.book(kComm, 0, 1200);
  // [0, 1200) at half (600 of work), the other 600 alone: ends at 1800; comm
  // lost 600, queued after it: [1800, 2400).
  EXPECT_EQ(p.book(kCompute, 0, 1200).end, 1800);
  EXPECT_EQ(p.free(kComm), 2400);
  // At a third beside both: 40 of work in [0, 120). Each lost 120 * (1/2 -
  // 1/3) = 20: compute [2400, 2420), comm [2420, 2440).
  EXPECT_EQ(p.book(kPipe, 0, 40).end, 120);
  EXPECT_EQ(p.free(kCompute), 2420);
  EXPECT_EQ(p.free(kComm), 2440);
  // At a quarter beside all three: 30 of work in [0, 120). Each of the three
  // lost 120 * (1/3 - 1/4) = 10, in stream order after 2440.
  EXPECT_EQ(p.book(kTpComm, 0, 30).end, 120);
  EXPECT_EQ(p.free(kCompute), 2450);
  EXPECT_EQ(p.free(kComm), 2460);
  EXPECT_EQ(p.free(kPipe), 2470);
  // No work lost or made: 1200 + 1200 + 40 + 30.
  EXPECT_EQ(p.latest(), 2470);
}

TEST(Port, NoWorkIsLostOrMadeWhenEverythingIsReadyAtZero) {
  // All transfers ready at 0, in any stream order: the port is busy without a
  // gap, so the last stream frees when the total work has crossed (plus at
  // most one picosecond of rounding per booking).
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    Port p;
    Time total = 0;
    const int n = 1 + int(rng() % 12);
    for (int i = 0; i < n; ++i) {
      const Time w = 1 + Time(rng() % 1000);
      total += w;
      p.book(int(rng() % Port::kStreams), 0, w);
    }
    EXPECT_GE(p.latest(), total) << "trial " << trial;
    EXPECT_LE(p.latest(), total + 3 * n) << "trial " << trial;
  }
}

TEST(Port, ManySegmentsArePrunedDeterministically) {
  Port a, b;
  for (int i = 0; i < 3 * int(Port::kMaxSegments); ++i) {
    a.book(kComm, Time(i) * 10, 5);  // a gap after each: one segment each
    b.book(kComm, Time(i) * 10, 5);
  }
  EXPECT_LE(a.segments().size(), Port::kMaxSegments);
  EXPECT_EQ(a.book(kPipe, 0, 100).end, b.book(kPipe, 0, 100).end);
}

// What a folded collective's replay books on (collectives/folded.cc): a
// port rebuilt from another's segments after `from` and its free times
// books every transfer ready at or after `from` exactly as the original,
// backlogs included; others_end says where another stream's spans end.
TEST(Port, ATailCopyBooksAsTheOriginalFromItsStart) {
  Port a;
  a.book(kPipe, 0, 40);    // [0, 40): before the copy's start
  a.book(kComm, 50, 100);  // [50, 150)
  a.book(kPipe, 200, 30);  // [200, 230)
  EXPECT_EQ(a.others_end(kCompute), 230);
  EXPECT_EQ(a.others_end(kPipe), 150);
  EXPECT_EQ(a.others_end(kComm), 230);
  const Time from = 60;
  ASSERT_EQ(a.segments_after(from).size(), 2u);  // [50, 150) and [200, 230)
  const Time free[Port::kStreams] = {a.free(0), a.free(1), a.free(2), a.free(3), a.free(4)};
  Port b;
  b.restore(a.segments_after(from), free);
  EXPECT_EQ(b.others_end(kCompute), 230);
  // A compute transfer from 60: 90 of comm's span left at half the rate
  // (45 of work), then 50 alone in [150, 200), 5 at half in [200, 210):
  // 100 of work ends at 210; comm lost 90/2 = 45, pipe 10/2 = 5.
  for (Port* p : {&a, &b}) {
    const Port::Booking k = p->book(kCompute, from, 100);
    EXPECT_EQ(k.start, 60);
    EXPECT_EQ(k.end, 210);
  }
  // The backlogs go after everything, comm first (230 + 45), then pipe (+ 5).
  for (int s = 0; s < Port::kStreams; ++s) EXPECT_EQ(a.free(s), b.free(s)) << "stream " << s;
  EXPECT_EQ(a.free(kComm), 275);
  EXPECT_EQ(a.free(kPipe), 280);
  // From `from` on the two ports hold the same spans (a's [50, 60) of comm
  // ends at `from`, as b's).
  ASSERT_EQ(a.segments_after(from).size(), b.segments_after(from).size());
  for (size_t i = 0; i < b.segments_after(from).size(); ++i)
    EXPECT_EQ(a.segments_after(from)[i], b.segments_after(from)[i]) << i;
}

// A tail copy counts the segments the original holds before its start
// (restore's held_before), so both drop their oldest half past
// kMaxSegments at the same booking: the original holds 4,000 comm spans
// [10i, 10i + 5), the copy the 2,000 from 20,000 on; 97 more spans take
// the original to 4,097, which drops 2,048: the 2,000 before the copy's
// start and the copy's first 48 ([20000, 20475]). A pipeline transfer
// ready at 20,000 then finds [20000, 20480) idle on both (1,000 of work:
// 480 alone, then 40 spans of 5 at half rate and 5 gaps, ... ends at the
// same time on both); a copy that does not count the older segments keeps
// the 48 spans and ends later.
TEST(Port, ATailCopyDropsItsOldestAsTheOriginal) {
  Port a;
  for (int i = 0; i < 4000; ++i) a.book(kComm, Time(i) * 10, 5);
  ASSERT_EQ(a.segments().size(), 4000u);
  const Time from = 20000;
  const std::span<const Port::Segment> tail = a.segments_after(from);
  ASSERT_EQ(tail.size(), 2000u);
  const Time free[Port::kStreams] = {a.free(0), a.free(1), a.free(2), a.free(3), a.free(4)};
  Port b, plain;
  b.restore(tail, free, a.segments().size() - tail.size());
  plain.restore(tail, free);
  for (int i = 4000; i < 4097; ++i)
    for (Port* p : {&a, &b, &plain}) p->book(kComm, Time(i) * 10, 5);
  EXPECT_EQ(a.segments().size(), 4097u - 2048u);
  ASSERT_EQ(b.segments().size(), a.segments().size());
  for (size_t i = 0; i < a.segments().size(); ++i) EXPECT_EQ(a.segments()[i], b.segments()[i]) << i;
  EXPECT_EQ(a.segments().front().start, 20480);
  const Port::Booking ka = a.book(kPipe, from, 1000), kb = b.book(kPipe, from, 1000),
                      kp = plain.book(kPipe, from, 1000);
  EXPECT_EQ(ka.start, kb.start);
  EXPECT_EQ(ka.end, kb.end);
  EXPECT_GT(kp.end, ka.end);  // the copy that kept the dropped spans shares them
  std::printf(
      "  pipe transfer ends at %lld ps on the original and the counting copy, %lld ps on the plain "
      "copy\n",
      static_cast<long long>(ka.end), static_cast<long long>(kp.end));
}

// The device level: an all-reduce-sized transfer on the comm stream, then a
// pipeline send issued after it in program order but at an earlier time. The
// pipeline send shares the NIC instead of waiting behind the big one.
TEST(Port, PipelineSendSharesTheNicWithABigCommTransfer) {
  // Inter-node: 5 us latency, 10 GB/s. 10 MB alone takes 1000 us, 1 MB 100 us.
  Time pipe_arrival = 0, comm_arrival = 0, next_depart = 0, pipe_sent = 0;
  Cluster c(simple_profile(), {.world_size = 8});
  c.run([&](Device& d) {
    Stream pipe(&d, StreamKind::kPipeline);
    if (d.rank() == 0) {
      d.isend(d.comm(), 4, 1, {}, 10'000'000);
      pipe_sent = d.isend(pipe, 4, 2, {}, 1'000'000).done;
      // The comm stream lost 100 us of its share to the pipeline send.
      d.isend(d.comm(), 4, 3, {}, 1'000'000);
      next_depart = d.egress(static_cast<int>(LinkClass::kInter)).free(kComm) - 100 * kUs;
    } else if (d.rank() == 4) {
      d.recv(d.comm(), 0, 1);
      comm_arrival = d.comm().now();
      d.recv(pipe, 0, 2);
      pipe_arrival = pipe.now();
      d.recv(d.comm(), 0, 3);
    }
  });
  // Egress: 100 us of work at half the rate from 0: sent at 200 us. Ingress:
  // from 5 us, at half beside the big receive: 205 us (FIFO would give 1105).
  EXPECT_EQ(pipe_sent, 200 * kUs);
  EXPECT_EQ(pipe_arrival, 205 * kUs);
  EXPECT_EQ(comm_arrival, 1005 * kUs);  // booked first: its time stands
  EXPECT_EQ(next_depart, 1100 * kUs);   // the comm stream's next send waits for its debt
}

// --tp-comm-overlap's collectives run on a side stream of their own kind
// (StreamKind::kTpComm), and so does the cp ring (StreamKind::kCpComm), so
// on a port they share the bandwidth with the comm
// stream's data-parallel reduce-scatter instead of queueing behind it, as
// two NCCL communicators' kernels do on one NVLink. Intra-node here: 1 us
// latency, 100 GB/s; the reduce-scatter's 10 MB take 100 us alone, the
// tensor-parallel 1 MB 10 us. The same side stream of the comm stream's
// kind (as before kTpComm) queues FIFO.
TEST(Port, TpOverlapTransferSharesTheNvlinkWithADpReduceScatter) {
  for (const StreamKind side_kind : {StreamKind::kTpComm, StreamKind::kCpComm, StreamKind::kComm}) {
    Time tp_sent = 0, tp_arrival = 0, dp_arrival = 0, next_dp = 0;
    Cluster c(simple_profile(), {.world_size = 8});
    c.run([&](Device& d) {
      Stream side(&d, side_kind);
      if (d.rank() == 0) {
        d.isend(d.comm(), 1, 1, {}, 10'000'000);          // the dp reduce-scatter's chunk
        tp_sent = d.isend(side, 1, 2, {}, 1'000'000).done;  // the tp all-gather's, issued after
        next_dp = d.egress(static_cast<int>(LinkClass::kIntra)).free(kComm);
      } else if (d.rank() == 1) {
        d.recv(d.comm(), 0, 1);
        dp_arrival = d.comm().now();
        d.recv(side, 0, 2);
        tp_arrival = side.now();
      }
    });
    SCOPED_TRACE(stream_name(side_kind));
    EXPECT_EQ(dp_arrival, 101 * kUs);  // booked first: [0, 100) us, +1 us latency
    if (side_kind != StreamKind::kComm) {
      // Egress: 10 us of work at half the rate from 0: sent at 20 us; the dp
      // stream's next send waits for the 10 us it lost (110 us). Ingress: from
      // 1 us at half beside the big receive: 21 us.
      EXPECT_EQ(tp_sent, 20 * kUs);
      EXPECT_EQ(tp_arrival, 21 * kUs);
      EXPECT_EQ(next_dp, 110 * kUs);
    } else {
      // One FIFO: behind the reduce-scatter's 100 us, sent at 110, in at 111.
      EXPECT_EQ(tp_sent, 110 * kUs);
      EXPECT_EQ(tp_arrival, 111 * kUs);
      EXPECT_EQ(next_dp, 110 * kUs);
    }
  }
}

// Five streams: a late transfer beside four others moves at 1/5 of the
// rate, and each of the four gives up span x (1/4 - 1/5) = span / 20. A
// port whose [0, 1000) carries compute, comm, pipeline and tp-comm, each
// free at 1000; a cp-comm transfer of 100 from 0 takes 500 there (ends at
// 500); each of the four lost 500 / 20 = 25, queued after everything in
// stream order: 1025, 1050, 1075, 1100. (At twelfths of a picosecond the
// rate 12 / 5 rounds to 2: 600.)
TEST(Port, FiveStreamsShareAtAFifthEach) {
  Port p;
  const Port::Segment all4{0, 1000, 0b1111};
  const Time free[Port::kStreams] = {1000, 1000, 1000, 1000, 0};
  p.restore({&all4, 1}, free);
  const Port::Booking b = p.book(kCpComm, 0, 100);
  EXPECT_EQ(b.start, 0);
  EXPECT_EQ(b.end, 500);
  EXPECT_EQ(p.free(kCompute), 1025);
  EXPECT_EQ(p.free(kComm), 1050);
  EXPECT_EQ(p.free(kPipe), 1075);
  EXPECT_EQ(p.free(kTpComm), 1100);
  EXPECT_EQ(p.free(kCpComm), 500);
}

}  // namespace
}  // namespace shardlab
