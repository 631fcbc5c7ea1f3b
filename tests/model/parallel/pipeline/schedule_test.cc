// Pipeline schedules as data, in the manner of Megatron's
// tests/unit_tests/pipeline_parallel/test_schedules.py: no model math, only
// the order of actions per rank (written out by hand for small cases), their
// validity under blocking receives, the bubble of a unit-time simulation
// against the textbook formulas, the stash bound and the flag errors.
#include "model/parallel/pipeline/schedule.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "runtime/errors.h"
#include "tests/support/config_error.h"

namespace shardlab::parallel {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

// Every action of one rank, communication included: "F0 sA0>1 rG0<1 B0".
std::string full_row(const Schedule& schedule, int rank, bool chunked = false) {
  std::string row;
  for (const Action& a : schedule[static_cast<size_t>(rank)]) {
    if (!row.empty()) row += ' ';
    row += action_label(a, chunked);
  }
  return row;
}

using shardlab::testing::config_error_of;

// Megatron's warm-up length for the interleaved schedule, in chunk-forwards.
int interleaved_warmup(int pp, int m, int vpp, int rank) {
  if (m == pp) return m * vpp;
  return std::min(2 * (pp - rank - 1) + (vpp - 1) * pp, m * vpp);
}

TEST(PpSchedule, GPipePp2M3) {
  const Schedule s = gpipe(2, 3);
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(full_row(s, 0), "F0 sA0>1 F1 sA1>1 F2 sA2>1 rG0<1 B0 rG1<1 B1 rG2<1 B2");
  EXPECT_EQ(full_row(s, 1), "rA0<0 F0 rA1<0 F1 rA2<0 F2 B0 sG0>0 B1 sG1>0 B2 sG2>0");
  EXPECT_EQ(s[1][0], (Action{ActionKind::kRecvActivation, 0, 0, 0}));
  EXPECT_EQ(s[1][7], (Action{ActionKind::kSendGrad, 0, 0, 0}));
}

TEST(PpSchedule, OneFOneBPp4M8) {
  // Warm-up of 3, 2, 1, 0 forwards; steady F/B pairs; cool-down backwards.
  EXPECT_EQ(format_schedule(one_f_one_b(4, 8)),
            "rank 0: F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7\n"
            "rank 1: F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 B6 B7\n"
            "rank 2: F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 B7\n"
            "rank 3: F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7\n");
  const Schedule s = one_f_one_b(4, 8);
  EXPECT_THAT(full_row(s, 0), StartsWith("F0 sA0>1 F1 sA1>1 F2 sA2>1 F3 sA3>1 rG0<1 B0 F4"));
  EXPECT_THAT(full_row(s, 3), StartsWith("rA0<2 F0 B0 sG0>2 rA1<2 F1 B1"));
  EXPECT_THAT(full_row(s, 1), StartsWith("rA0<0 F0 sA0>2 rA1<0 F1 sA1>2 rA2<0"));
}

TEST(PpSchedule, OneFOneBWithFewerMicroBatchesThanStages) {
  // Warm-up is capped at M: only the last rank still alternates.
  EXPECT_EQ(format_schedule(one_f_one_b(4, 2)),
            "rank 0: F0 F1 B0 B1\n"
            "rank 1: F0 F1 B0 B1\n"
            "rank 2: F0 F1 B0 B1\n"
            "rank 3: F0 B0 F1 B1\n");
  EXPECT_EQ(format_schedule(one_f_one_b(3, 1)), "rank 0: F0 B0\nrank 1: F0 B0\nrank 2: F0 B0\n");
}

TEST(PpSchedule, InterleavedPp2M4Vpp2) {
  // Chunk a = model chunk 0 (stages 0, 1), b = chunk 1 (stages 2, 3). Warm-up
  // of 4 (rank 0) and 2 (rank 1) chunk-forwards, micro-batches in groups of pp.
  const Schedule s = interleaved_1f1b(2, 4, 2);
  EXPECT_EQ(format_schedule(s),
            "rank 0: F0a F1a F0b F1b F2a B0b F3a B1b F2b B0a F3b B1a B2b B3b B2a B3a\n"
            "rank 1: F0a F1a F0b B0b F1b B1b F2a B0a F3a B1a F2b B2b F3b B3b B2a B3a\n");
  EXPECT_THAT(full_row(s, 0, true), StartsWith("F0a sA0a>1 F1a sA1a>1 rA0b<1 F0b sA0b>1 "));
  // Rank 1 chunk b is the last stage: no send after its forward, no gradient
  // to wait for before its backward.
  EXPECT_THAT(full_row(s, 1, true),
              StartsWith("rA0a<0 F0a sA0a>0 rA1a<0 F1a sA1a>0 rA0b<0 F0b B0b s"));
}

TEST(PpSchedule, InterleavedAllWarmupWhenMicroBatchesEqualStages) {
  EXPECT_EQ(format_schedule(interleaved_1f1b(2, 2, 2)),
            "rank 0: F0a F1a F0b F1b B0b B1b B0a B1a\n"
            "rank 1: F0a F1a F0b F1b B0b B1b B0a B1a\n");
}

TEST(PpSchedule, InterleavedOnOneRankHandsChunksToItself) {
  const Schedule s = interleaved_1f1b(1, 2, 2);
  EXPECT_EQ(full_row(s, 0, true),
            "F0a sA0a>0 rA0b<0 F0b B0b sG0b>0 F1a sA1a>0 rG0a<0 B0a rA1b<0 F1b B1b sG1b>0 "
            "rG1a<0 B1a");
  EXPECT_EQ(validate_schedule(s, 2, 2), "");
}

// Megatron's combined 1F1B (overlap_moe_expert_parallel_comm): one more
// warm-up chunk-forward than interleaved (get_pp_rank_microbatches), so each
// steady forward and backward are of different micro-batches, written out
// here from Megatron's chunk order (forward k: micro-batch (k / 4)·2 + k % 2
// through chunk (k % 4) / 2; backward from the last chunk): rank 0 warms up
// with 2 + 2 + 1 = 5, rank 1 with 0 + 2 + 1 = 3.
TEST(PpSchedule, CombinedPp2M4Vpp2) {
  const Schedule s = combined_1f1b(2, 4, 2);
  EXPECT_EQ(format_schedule(s),
            "rank 0: F0a F1a F0b F1b F2a F3a B0b F2b B1b F3b B0a B1a B2b B3b B2a B3a\n"
            "rank 1: F0a F1a F0b F1b B0b F2a B1b F3a B0a F2b B1a F3b B2b B3b B2a B3a\n");
  // A pair: both receives, F, B, both sends (Megatron's pre_forward,
  // pre_backward, the combined chunks, post_forward, post_backward).
  EXPECT_THAT(full_row(s, 0, true), HasSubstr("rG0b<1 F3a B0b sA3a>1 sG0b>1 "));
  EXPECT_THAT(full_row(s, 1, true), HasSubstr("rA2a<0 F2a B1b sA2a>0 sG1b>0 "));
  EXPECT_EQ(validate_schedule(s, 4, 2), "");
  // Without a pipeline: F0, then F(i) with B(i-1), then B(M-1).
  EXPECT_EQ(format_schedule(combined_1f1b(1, 4, 1)), "rank 0: F0 F1 B0 F2 B1 F3 B2 B3\n");
  EXPECT_EQ(format_schedule(combined_1f1b(1, 1, 1)), "rank 0: F0 B0\n");
  EXPECT_THAT(config_error_of([] { combined_1f1b(2, 4, 1); }), HasSubstr("`vpp`"));
}

// Valid everywhere; each steady pair (Action::paired) is a forward with
// another micro-batch's backward right after it, one pair a steady step; one more chunk in flight than interleaved (the pair
// holds the forward's and the backward's), unless everything is warm-up.
TEST(PpSchedule, CombinedPairsAreIndependentAndHoldOneMore) {
  for (int pp = 1; pp <= 4; ++pp) {
    for (int m = pp; m <= 12; m += pp) {
      for (int vpp = pp == 1 ? 1 : 2; vpp <= 3; ++vpp) {
        SCOPED_TRACE("pp " + std::to_string(pp) + " M " + std::to_string(m) + " vpp " + std::to_string(vpp));
        const Schedule c = combined_1f1b(pp, m, vpp);
        EXPECT_EQ(validate_schedule(c, m, vpp), "");
        const std::vector<int> peak = peak_in_flight(c);
        const std::vector<int> base = peak_in_flight(vpp == 1 ? one_f_one_b(pp, m) : interleaved_1f1b(pp, m, vpp));
        for (int r = 0; r < pp; ++r) {
          EXPECT_EQ(peak[size_t(r)], std::min(base[size_t(r)] + 1, m * vpp)) << "rank " << r;
          const auto& list = c[size_t(r)];
          int pairs = 0;
          for (size_t i = 0; i < list.size(); ++i) {
            if (!list[i].paired) continue;
            ASSERT_LT(i + 1, list.size());
            EXPECT_EQ(list[i].kind, ActionKind::kForward);
            EXPECT_EQ(list[i + 1].kind, ActionKind::kBackward);
            EXPECT_NE(list[i].micro_batch, list[i + 1].micro_batch) << "rank " << r << " action " << i;
            ++pairs;
          }
          const int warmup = std::min(interleaved_warmup(pp, m, vpp, r) + (m == pp ? 0 : 1), m * vpp);
          EXPECT_EQ(pairs, m * vpp - warmup) << "rank " << r;
        }
      }
    }
  }
}

TEST(PpSchedule, EverySchedulePassesValidation) {
  for (int pp = 1; pp <= 4; ++pp) {
    for (int m = 1; m <= 9; ++m) {
      SCOPED_TRACE("pp " + std::to_string(pp) + " M " + std::to_string(m));
      EXPECT_EQ(validate_schedule(gpipe(pp, m), m), "");
      EXPECT_EQ(validate_schedule(one_f_one_b(pp, m), m), "");
      if (m % pp != 0) continue;
      for (int vpp = 2; vpp <= 3; ++vpp) {
        EXPECT_EQ(validate_schedule(interleaved_1f1b(pp, m, vpp), m, vpp), "") << "vpp " << vpp;
      }
    }
  }
}

TEST(PpSchedule, ValidatorNamesTheFault) {
  Schedule s = gpipe(2, 1);  // rank 0: F0 sA0>1 rG0<1 B0; rank 1: rA0<0 F0 B0 sG0>0
  std::rotate(s[0].begin(), s[0].begin() + 2, s[0].begin() + 3);  // rG0<1 first
  EXPECT_EQ(validate_schedule(s, 1),
            "deadlock: rank 0 action 0 (rG0<1) rank 1 action 0 (rA0<0) blocked");

  s = gpipe(2, 1);
  s[0][1].peer = 0;
  EXPECT_EQ(validate_schedule(s, 1), "rank 0 action 1 (sA0>0): peer should be rank 1");

  s = gpipe(2, 2);  // rank 1 receives micro-batch 1 first: FIFO order broken
  std::swap(s[1][0], s[1][2]);
  EXPECT_THAT(validate_schedule(s, 2), HasSubstr("next message on the channel is micro-batch 0"));

  s = gpipe(2, 1);
  s[1].erase(s[1].begin());  // rank 1 never receives its input
  EXPECT_EQ(validate_schedule(s, 1), "rank 1 action 0 (F0): forward before its input arrived");

  s = gpipe(2, 1);
  s[0].erase(s[0].begin() + 2);  // rank 0 does not wait for the gradient
  EXPECT_THAT(validate_schedule(s, 1), HasSubstr("backward before the next stage's gradient"));

  EXPECT_EQ(validate_schedule({{{ActionKind::kBackward, 0, 0, -1}}}, 1),
            "rank 0 action 0 (B0): backward before its forward");
  EXPECT_EQ(validate_schedule({{{ActionKind::kForward, 0, 0, -1}}}, 1),
            "rank 0 never runs the backward of micro-batch 0 chunk 0");
  EXPECT_THAT(validate_schedule(gpipe(1, 2), 3), HasSubstr("forward of micro-batch 2"));
  EXPECT_EQ(
      validate_schedule({{{ActionKind::kForward, 0, 0, -1}, {ActionKind::kForward, 0, 0, -1}}}, 1),
      "rank 0 action 1 (F0): repeated forward");
  EXPECT_EQ(validate_schedule(gpipe(1, 2), 1),
            "rank 0 action 1 (F1): micro-batch, chunk or buffer out of range");

  s = gpipe(2, 1);
  s[0].insert(s[0].begin() + 2, s[0][1]);  // a second send of the same activation
  EXPECT_EQ(validate_schedule(s, 1),
            "rank 0 sends an activation of micro-batch 0 that rank 1 never receives");
}

TEST(PpSchedule, BubbleMatchesFormulaForGPipeAnd1F1B) {
  for (const StepCosts costs : {StepCosts{1, 2}, StepCosts{1, 1}, StepCosts{2, 3}}) {
    for (int p = 1; p <= 4; ++p) {
      for (int m = 1; m <= 9; ++m) {
        SCOPED_TRACE("p " + std::to_string(p) + " m " + std::to_string(m) + " b " +
                     std::to_string(costs.backward));
        const double expected = double(p - 1) / (m + p - 1);
        for (const Schedule& s : {gpipe(p, m), one_f_one_b(p, m)}) {
          const ScheduleTiming t = simulate_schedule(s, costs);
          EXPECT_EQ(t.makespan, (m + p - 1) * (costs.forward + costs.backward));
          EXPECT_DOUBLE_EQ(t.bubble_fraction, expected);
          for (int r = 0; r < p; ++r) {
            const RankTiming& rt = t.ranks[static_cast<size_t>(r)];
            EXPECT_EQ(rt.busy, m * (costs.forward + costs.backward));
            EXPECT_EQ(rt.start, r * costs.forward);              // the first forward reaches rank r
            EXPECT_EQ(rt.end, t.makespan - r * costs.backward);  // the last backward leaves it
          }
        }
      }
    }
  }
}

TEST(PpSchedule, InterleavingShrinksTheBubbleVFold) {
  for (int p = 1; p <= 4; ++p) {
    for (int v = 2; v <= 4; ++v) {
      for (int m = p; m <= 12; m += p) {
        SCOPED_TRACE("p " + std::to_string(p) + " v " + std::to_string(v) + " m " +
                     std::to_string(m));
        const ScheduleTiming t = simulate_schedule(interleaved_1f1b(p, m, v), {1, 2});
        EXPECT_EQ(t.makespan, (v * m + p - 1) * 3.0);
        EXPECT_DOUBLE_EQ(t.bubble_fraction, double(p - 1) / (v * m + p - 1));
      }
    }
  }
}

TEST(PpSchedule, StashPeaks) {
  EXPECT_EQ(peak_in_flight(gpipe(4, 8)), (std::vector<int>{8, 8, 8, 8}));
  EXPECT_EQ(peak_in_flight(one_f_one_b(4, 8)), (std::vector<int>{4, 3, 2, 1}));
  EXPECT_EQ(peak_in_flight(one_f_one_b(4, 2)), (std::vector<int>{2, 2, 2, 1}));
  EXPECT_EQ(peak_in_flight(interleaved_1f1b(2, 4, 2)), (std::vector<int>{5, 3}));
  for (int pp = 1; pp <= 4; ++pp) {
    for (int m = 1; m <= 9; ++m) {
      const std::vector<int> g = peak_in_flight(gpipe(pp, m));
      const std::vector<int> f = peak_in_flight(one_f_one_b(pp, m));
      for (int r = 0; r < pp; ++r) {
        EXPECT_EQ(g[static_cast<size_t>(r)], m);
        EXPECT_EQ(f[static_cast<size_t>(r)], std::min(pp - r, m)) << "pp " << pp << " M " << m;
      }
      if (m % pp != 0) continue;
      const std::vector<int> i = peak_in_flight(interleaved_1f1b(pp, m, 2));
      for (int r = 0; r < pp; ++r) {
        EXPECT_EQ(i[static_cast<size_t>(r)], std::min(interleaved_warmup(pp, m, 2, r) + 1, 2 * m));
      }
    }
  }
}

TEST(PpSchedule, TimelineShowsTheBubble) {
  EXPECT_EQ(format_timeline(gpipe(2, 2), {1, 2}),
            "rank 0: F0 F1 .  .  .  B0 B0 B1 B1\n"
            "rank 1: .  F0 F1 B0 B0 B1 B1 .  .\n");
  EXPECT_EQ(format_timeline(one_f_one_b(2, 3), {1, 1}),
            "rank 0: F0 F1 .  B0 F2 B1 .  B2\n"
            "rank 1: .  F0 B0 F1 B1 F2 B2 .\n");
}

TEST(PpSchedule, ParseAndConstraintErrors) {
  EXPECT_EQ(parse_schedule("gpipe"), ScheduleKind::kGPipe);
  EXPECT_EQ(parse_schedule("1f1b"), ScheduleKind::k1F1B);
  EXPECT_EQ(parse_schedule("interleaved"), ScheduleKind::kInterleaved);
  for (auto kind : {ScheduleKind::kGPipe, ScheduleKind::k1F1B, ScheduleKind::kInterleaved}) {
    EXPECT_EQ(parse_schedule(schedule_name(kind)), kind);
  }
  EXPECT_EQ(config_error_of([] { parse_schedule("pipedream"); }),
            "unknown `schedule` 'pipedream' (expected gpipe, 1f1b, interleaved, zb-h1, zb-h2, zb-v or dualpipev)");
  EXPECT_EQ(config_error_of([] { gpipe(0, 4); }), "`pp` 0: must be at least 1");
  EXPECT_EQ(config_error_of([] { one_f_one_b(2, 0); }), "`micro_batches` 0: must be at least 1");
  EXPECT_EQ(config_error_of([] { interleaved_1f1b(4, 6, 2); }),
            "`micro_batches` 6: must be a multiple of `pp` 4 for `schedule` interleaved");
  EXPECT_EQ(config_error_of([] { interleaved_1f1b(2, 4, 1); }),
            "`vpp` 1: `schedule` interleaved needs at least 2 model chunks per rank");
  EXPECT_EQ(config_error_of([] { build_schedule(ScheduleKind::k1F1B, 2, 4, 2); }),
            "`vpp` 2: model chunks need `schedule` interleaved, zb-v or dualpipev");
  EXPECT_EQ(format_schedule(build_schedule(ScheduleKind::kInterleaved, 2, 4, 2)),
            format_schedule(interleaved_1f1b(2, 4, 2)));
}

}  // namespace
}  // namespace shardlab::parallel
