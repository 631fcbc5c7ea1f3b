// The zero-bubble schedules as data (schedule.h): small cases written out by
// hand from the papers' rules, validity on every size, and the bubble and
// stash of the abstract simulation against closed forms.
//
// Closed forms (bubble = makespan - M·v·(T_F + T_B + T_W) per rank, for one
// step that ends in a synchronous optimizer step, as shardlab's does):
//   1F1B   (p-1)(T_F + T_B + T_W)                      textbook
//   ZB-H1  (p-1)·max(T_F + T_B - T_W, T_F, T_B)        M >= p
//   ZB-H2  (p-1)·max(T_F + T_B - 2·T_W, T_F)           M >= 2p - 1
//   ZB-V   (p-1)·max(2·T_B - T_W, T_B) (per chunk) when T_B >= T_F, M >= 2p:
//          the fill (p-1)·T_F at T_F = T_B = T_W, the paper's zero bubble
//   DualPipeV (p-1)·max(T_F + T_B - T_W, T_F) (per chunk) when T_B <= T_F, M >= 2p
// ZB-H1 and ZB-H2 are Qi et al.'s (p-1)(T_F + T_B - T_W) and
// (p-1)(T_F + T_B - 2T_W) (ICLR 2024, sections 3.1-3.2) where those hold (W
// small enough to fill the gap), and never below what a synchronous step must
// idle: the last rank's first input arrives after (p-1)·T_F, and under ZB-H1's
// fixed W placement the last gradient needs (p-1)·T_B to climb back. The
// paper's "zero" bubble of ZB-H2 and ZB-V is the parallelogram a run without
// the optimizer synchronization repeats; here each rank's busy span has no gap.
#include "model/parallel/pipeline/schedule.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "runtime/errors.h"
#include "support/compare.h"
#include "tests/support/config_error.h"

namespace shardlab::parallel {
namespace {

using shardlab::testing::config_error_of;

int chunks(ScheduleKind kind) { return schedule_chunks(kind) == 2 ? 2 : 1; }

// Per-rank idle time of one simulated step.
double bubble(const Schedule& s, const StepCosts& c, int m, int v, StageOrder order) {
  const ScheduleTiming t = simulate_schedule(s, c, order);
  return t.makespan - m * v * (c.forward + c.backward);
}

TEST(ZeroBubbleSchedule, ZbH1Pp3M4ByHand) {
  // Rank r: 1F1B's warm-up of 2 - r forwards, r backwards whose W waits, then
  // F B W (the oldest pending W), the cool-down B W, the pending W last.
  EXPECT_EQ(format_schedule(zb_h1(3, 4)),
            "rank 0: F0 F1 F2 B0 F3 B1 B2 B3\n"
            "rank 1: F0 F1 B0 F2 B1 W0 F3 B2 W1 B3 W2 W3\n"
            "rank 2: F0 B0 F1 B1 F2 B2 W0 F3 B3 W1 W2 W3\n");
  // Rank 0 has nothing pending: its backwards stay fused (1F1B's own list).
  EXPECT_EQ(zb_h1(3, 4)[0], one_f_one_b(3, 4)[0]);
}

TEST(ZeroBubbleSchedule, DualPipeVPp2M4ByHand) {
  // DeepSeek's phases on rank r of p (chunk a goes down the ranks, b back up):
  // 2(p-r-1) F0; r+1 x F0 F1; p-r-1 x B1 W1 F1; M-2p+r+1 x F0 B1 F1 B0;
  // p-r-1 x B1 F1 B0; r+1 x B1 B0 (W deferred from the middle); p-r-1 x W B0; W.
  EXPECT_EQ(format_schedule(dualpipe_v(2, 4)),
            "rank 0: F0a F1a F2a F0b B0b W0b F1b F3a B1b F2b B0a B2b F3b B1a B3b B2a W2a B3a W3a\n"
            "rank 1: F0a F0b F1a F1b F2a B0b F2b B0a F3a B1b F3b B1a B2b B2a B3b B3a W3b W3a\n");
  // The V: rank 0 holds the first and the last stage, rank p-1 the tip.
  const Schedule s = dualpipe_v(2, 4);
  EXPECT_EQ(s[1][0], (Action{ActionKind::kRecvActivation, 0, 0, 0}));  // stage 1 from rank 0
  EXPECT_EQ(s[1][2], (Action{ActionKind::kSendActivation, 0, 0, 1}));  // the tip: to itself
}

TEST(ZeroBubbleSchedule, StageOrderOfTheV) {
  EXPECT_EQ(stage_of(StageOrder::kV, 4, 0, 0), 0);
  EXPECT_EQ(stage_of(StageOrder::kV, 4, 0, 1), 7);
  EXPECT_EQ(stage_of(StageOrder::kV, 4, 3, 1), 4);
  EXPECT_EQ(stage_of(StageOrder::kLoop, 4, 3, 1), 7);
  for (int pp = 1; pp <= 5; ++pp)
    for (int s = 0; s < 2 * pp; ++s)
      for (StageOrder o : {StageOrder::kLoop, StageOrder::kV})
        EXPECT_EQ(stage_of(o, pp, rank_of_stage(o, pp, s), s / pp), s) << "pp " << pp << " s " << s;
}

TEST(ZeroBubbleSchedule, EveryScheduleIsValidOnEverySize) {
  for (ScheduleKind kind : {ScheduleKind::kZbH1, ScheduleKind::kZbH2, ScheduleKind::kZbV, ScheduleKind::kDualPipeV}) {
    for (int pp = 1; pp <= 5; ++pp) {
      for (int m = 1; m <= 12; ++m) {
        if (chunks(kind) == 2 && m < 2 * pp) continue;
        const Schedule s = build_schedule(kind, pp, m, chunks(kind));
        EXPECT_EQ(validate_schedule(s, m, chunks(kind), stage_order(kind)), "")
            << schedule_name(kind) << " pp " << pp << " m " << m;
      }
    }
  }
  // The V is not a loop: read with the wrong placement, its peers are wrong.
  EXPECT_THAT(validate_schedule(zb_v(2, 4), 4, 2, StageOrder::kLoop), ::testing::HasSubstr("peer should be"));
  // ZB-V's steady pairs put the backward first: one activation fewer than DualPipeV's.
  EXPECT_EQ(format_schedule(zb_v(2, 4)),
            "rank 0: F0a F1a F2a F0b B0b W0b F1b B1b F3a B0a F2b B2b B1a F3b B3b B2a W2a B3a W3a\n"
            "rank 1: F0a F0b F1a F1b B0b F2a B0a F2b B1b F3a B1a F3b B2b B2a B3b B3a W3b W3a\n");
}

// Simulated bubbles and their closed forms, in order, for one verdict.
struct Bubbles {
  std::vector<double> got, want;
  void add(double g, double w) { got.push_back(g), want.push_back(w); }
};

TEST(ZeroBubbleSchedule, BubblesMatchTheClosedForms) {
  Bubbles all;
  for (int p = 2; p <= 5; ++p) {
    for (double tb : {0.5, 0.8, 1.0, 1.3, 2.0}) {
      for (double tw : {0.5, 0.8, 1.0, 1.2, 2.0}) {
        const StepCosts c{1.0, tb + tw, tw};
        for (int m : {2 * p - 1, 2 * p, 3 * p + 1}) {
          const double h1 = (p - 1) * std::max({1.0 + tb - tw, 1.0, tb});
          const double h2 = (p - 1) * std::max(1.0 + tb - 2 * tw, 1.0);
          const double one = (p - 1) * (1.0 + tb + tw);
          const double got_h1 = bubble(zb_h1(p, m), c, m, 1, StageOrder::kLoop);
          const double got_h2 = bubble(zb_h2(p, m), c, m, 1, StageOrder::kLoop);
          EXPECT_NEAR(got_h1, h1, 1e-9) << "zb-h1 p " << p << " m " << m << " B " << tb << " W " << tw;
          EXPECT_NEAR(got_h2, h2, 1e-9) << "zb-h2 p " << p << " m " << m << " B " << tb << " W " << tw;
          EXPECT_NEAR(bubble(one_f_one_b(p, m), c, m, 1, StageOrder::kLoop), one, 1e-9);
          all.add(got_h1, h1), all.add(got_h2, h2);
          if (m < 2 * p) continue;
          if (tb >= 1.0) {
            const double v = (p - 1) * std::max(2 * tb - tw, tb);
            const double got_v = bubble(zb_v(p, m), c, m, 2, StageOrder::kV);
            EXPECT_NEAR(got_v, v, 1e-9) << "zb-v p " << p << " m " << m << " B " << tb << " W " << tw;
            all.add(got_v, v);
          }
          if (tb > 1.0) continue;
          const double dv = (p - 1) * std::max(1.0 + tb - tw, 1.0);
          const double got_dv = bubble(dualpipe_v(p, m), c, m, 2, StageOrder::kV);
          EXPECT_NEAR(got_dv, dv, 1e-9) << "dualpipev p " << p << " m " << m << " B " << tb << " W " << tw;
          all.add(got_dv, dv);
        }
      }
    }
    for (int m = 2 * p; m <= 4 * p; ++m) {  // T_F = T_B = T_W: only the pipeline's fill
      for (const Schedule& s : {zb_v(p, m), dualpipe_v(p, m)}) {
        const double got = bubble(s, {1, 2, 1}, m, 2, StageOrder::kV);
        EXPECT_NEAR(got, p - 1.0, 1e-9) << "p " << p << " m " << m;
        all.add(got, p - 1.0);
      }
    }
  }
  const auto close = shardlab::testing::all_close(all.got, all.want, 1e-9);
  std::printf("zero-bubble closed forms, simulated vs formula (time units): %s\n", close.message());
  EXPECT_TRUE(close);
}

TEST(ZeroBubbleSchedule, TheParallelogramHasNoGapInsideEachRank) {
  // T_F = T_B = T_W: ZB-H2 keeps every rank busy from its first action to
  // its last (Qi et al.'s zero bubble), ZB-H1 does not.
  for (int p = 2; p <= 5; ++p) {
    for (int m = 2 * p - 1; m <= 3 * p; ++m) {
      const ScheduleTiming t = simulate_schedule(zb_h2(p, m), {1, 2, 1});
      for (const RankTiming& r : t.ranks) EXPECT_EQ(r.end - r.start, r.busy) << "zb-h2 p " << p << " m " << m;
      const ScheduleTiming h1 = simulate_schedule(zb_h1(p, m), {1, 2, 1});
      EXPECT_GT(h1.ranks[0].end - h1.ranks[0].start, h1.ranks[0].busy);
    }
  }
}

TEST(ZeroBubbleSchedule, StashPeaks) {
  for (int p = 1; p <= 5; ++p) {
    for (int m = 2 * p; m <= 2 * p + 3; ++m) {
      SCOPED_TRACE("p " + std::to_string(p) + " m " + std::to_string(m));
      const std::vector<int> ofob = peak_in_flight(one_f_one_b(p, m), true);
      const std::vector<int> h1 = peak_in_flight(zb_h1(p, m), true);
      const std::vector<int> h2 = peak_in_flight(zb_h2(p, m), true);
      const std::vector<int> v = peak_in_flight(zb_v(p, m), true);  // m >= 2p here
      const std::vector<int> dv = peak_in_flight(dualpipe_v(p, m), true);
      for (int r = 0; r < p; ++r) {
        // ZB-H1: p - r activations before their B and r W stashes: 1F1B's first rank everywhere.
        EXPECT_EQ(h1[size_t(r)], p);
        EXPECT_EQ(h2[size_t(r)], std::min(2 * p - 1, m));  // the paper's (2p - 1) M_B
        EXPECT_EQ(v[size_t(r)], 2 * p);                     // 2p half-stage chunks = 1F1B's p stages
        EXPECT_EQ(dv[size_t(r)], 2 * p + 1);                // DualPipe's PP + 1
      }
      EXPECT_EQ(*std::max_element(h1.begin(), h1.end()), *std::max_element(ofob.begin(), ofob.end()));
    }
  }
}

TEST(ZeroBubbleSchedule, ParseAndConstraintErrors) {
  for (ScheduleKind kind : {ScheduleKind::kZbH1, ScheduleKind::kZbH2, ScheduleKind::kZbV, ScheduleKind::kDualPipeV})
    EXPECT_EQ(parse_schedule(schedule_name(kind)), kind);
  EXPECT_EQ(schedule_name(ScheduleKind::kDualPipeV), "dualpipev");
  EXPECT_EQ(config_error_of([] { parse_schedule("zb-h3"); }),
            "unknown `schedule` 'zb-h3' (expected gpipe, 1f1b, interleaved, zb-h1, zb-h2, zb-v or dualpipev)");
  EXPECT_EQ(config_error_of([] { build_schedule(ScheduleKind::kZbV, 2, 4, 1); }),
            "`vpp` 1: `schedule` zb-v places exactly 2 model chunks per rank (a V); use `vpp` 2");
  EXPECT_EQ(config_error_of([] { build_schedule(ScheduleKind::kZbH1, 2, 4, 2); }),
            "`vpp` 2: model chunks need `schedule` interleaved, zb-v or dualpipev");
  EXPECT_EQ(config_error_of([] { dualpipe_v(4, 7); }), "`micro_batches` 7: `schedule` dualpipev needs at least 2 x `pp` 4");
  EXPECT_EQ(config_error_of([] { zb_v(2, 3); }), "`micro_batches` 3: `schedule` zb-v needs at least 2 x `pp` 2");
  EXPECT_TRUE(splits_backward(ScheduleKind::kZbV));
  EXPECT_FALSE(splits_backward(ScheduleKind::kInterleaved));
}

}  // namespace
}  // namespace shardlab::parallel
