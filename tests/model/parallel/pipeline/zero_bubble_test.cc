// The zero-bubble schedules end to end: sharded runs against the unsharded
// model (dense and MoE, with tp and dp), the measured bubble on uniform
// stages against the closed forms of schedule_zb_test.cc fed with the
// measured F, B and W times, and ZB-H1's memory against 1F1B's.
#include <algorithm>
#include <cstdio>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "model/parallel/pipeline/schedule.h"
#include "tests/model/parallel/pipeline/pipeline_test_util.h"

namespace shardlab::train {
namespace {

constexpr ScheduleKind kZeroBubble[] = {ScheduleKind::kZbH1, ScheduleKind::kZbH2, ScheduleKind::kZbV,
                                        ScheduleKind::kDualPipeV};

using ZbCase = std::tuple<ScheduleKind, int, int, int>;  // schedule, pp, M, experts

class ZeroBubbleVerify : public ::testing::TestWithParam<ZbCase> {};

TEST_P(ZeroBubbleVerify, MatchesTheUnshardedModel) {
  const auto [kind, pp, M, experts] = GetParam();
  expect_matches_unsharded(pipeline(pp, M, kind, experts));
}

// Each schedule at pp 2 and 4, two micro-batch counts (the V ones need M >= 2pp), dense and MoE.
std::vector<ZbCase> zb_cases() {
  std::vector<ZbCase> cases;
  for (ScheduleKind kind : kZeroBubble)
    for (int pp : {2, 4})
      for (int M : {pp, 2 * pp})
        for (int experts : {0, 4})
          if (parallel::schedule_chunks(kind) == 1 || M >= 2 * pp) cases.emplace_back(kind, pp, M, experts);
  return cases;
}

std::string zb_name(const ::testing::TestParamInfo<ZbCase>& info) {
  std::string name(parallel::schedule_name(std::get<0>(info.param)));
  std::replace(name.begin(), name.end(), '-', '_');
  return name + "_pp" + std::to_string(std::get<1>(info.param)) + "_M" + std::to_string(std::get<2>(info.param)) +
         (std::get<3>(info.param) ? "_moe" : "_dense");
}

INSTANTIATE_TEST_SUITE_P(Grid, ZeroBubbleVerify, ::testing::ValuesIn(zb_cases()), zb_name);

TEST(ZeroBubble, WithTensorSequenceAndDataParallelismMatches) {
  for (ScheduleKind kind : kZeroBubble) {
    for (int experts : {0, 4}) {
      TrainOptions o = pipeline(2, 4, kind, experts);
      o.parallel.tp = 2;
      o.parallel.dp = 2;
      o.parallel.sp = experts == 0;
      o.parallel.zero = 1;
      expect_matches_unsharded(o);
    }
  }
}

// Mean duration of each kind of compute span on the pipeline's ranks.
parallel::StepCosts measured_costs(const TrainResult& r) {
  double sum[3] = {0, 0, 0};
  int n[3] = {0, 0, 0};
  for (const auto& spans : r.first_step_spans) {
    for (const parallel::ComputeSpan& s : spans) {
      const int k = s.kind == parallel::ActionKind::kForward         ? 0
                    : s.kind == parallel::ActionKind::kBackwardInput ? 1
                    : s.kind == parallel::ActionKind::kBackwardWeight ? 2
                                                                      : -1;
      if (k < 0) continue;
      sum[k] += double(s.end - s.start);
      ++n[k];
    }
  }
  const double f = sum[0] / n[0], b = sum[1] / n[1], w = sum[2] / n[2];
  return {f, b + w, w};
}

// Idle time per rank of one step, the closed form of schedule_zb_test.cc.
double closed_form(ScheduleKind kind, int p, const parallel::StepCosts& c) {
  const double f = c.forward, w = c.weight, b = c.backward - c.weight;
  switch (kind) {
    case ScheduleKind::kZbH1:
      return (p - 1) * std::max({f + b - w, f, b});
    case ScheduleKind::kZbH2:
      return (p - 1) * std::max(f + b - 2 * w, f);
    case ScheduleKind::kDualPipeV:
      return (p - 1) * std::max(f + b - w, f);  // for T_B <= T_F
    default:  // ZB-V, for T_B >= T_F
      return (p - 1) * std::max(2 * b - w, b);
  }
}

TEST(ZeroBubble, MeasuredBubbleMatchesTheClosedFormOnUniformStages) {
  const int pp = 4;
  for (ScheduleKind kind : kZeroBubble) {
    for (int M : {8, 16}) {
      TrainOptions o = uniform_stages(pipeline(pp, M, kind, 0));
      o.phantom = true;  // the same kernels and times, no arithmetic
      const TrainResult r = run(o, ideal_profile());
      const parallel::StepCosts c = measured_costs(r);
      const int v = o.parallel.vpp;
      const double busy = v * M * (c.forward + c.backward);
      const double idle = closed_form(kind, pp, c), formula = idle / (idle + busy);
      const parallel::ScheduleTiming sim =
          parallel::simulate_schedule(step_schedule(o), c, parallel::stage_order(kind));
      const double rel = (r.bubble_fraction - formula) / formula;
      std::printf("%-10s pp %d M %2d: T_F %.3f T_B %.3f T_W %.3f us; bubble %.4f, closed form %.4f (rel %+.4f, "
                  "tol 0.02), abstract simulation %.4f\n",
                  std::string(parallel::schedule_name(kind)).c_str(), pp, M, c.forward * 1e-6,
                  (c.backward - c.weight) * 1e-6, c.weight * 1e-6, r.bubble_fraction, formula, rel,
                  sim.bubble_fraction);
      EXPECT_LE(std::abs(rel), 0.02) << parallel::schedule_name(kind) << " M " << M;
      EXPECT_NEAR(r.bubble_fraction, sim.bubble_fraction, 0.02 * sim.bubble_fraction);
    }
  }
}

// Peak activation bytes of each pipeline rank (one step, 2-row micro-batches).
std::vector<uint64_t> peak_activations(ScheduleKind kind, int pp, int M) {
  TrainOptions o = pipeline(pp, M, kind, 0);
  o.model.batch_size = 2 * M;
  o.steps = 1;
  o.keep_step0_grads = false;
  const TrainResult r = run(o, builtin_profiles().front());
  std::vector<uint64_t> out;
  for (const auto& d : r.run.devices) out.push_back(d.peak_by_kind[int(MemKind::kActivation)]);
  return out;
}

uint64_t max_of(const std::vector<uint64_t>& v) { return *std::max_element(v.begin(), v.end()); }

// ZB-H1 keeps 1F1B's activation memory (Qi et al. 2024, section 3.1): rank 0
// runs 1F1B's very list; a later rank r holds p - r activations and r W
// stashes (the layer inputs and output gradients of a micro-batch, smaller
// than its activations, since every block frees the rest of its saved
// tensors once its B is done). So the largest rank's peak, rank 0's, is
// 1F1B's to the byte. ZB-H2 holds up to 2p - 1 micro-batches.
TEST(ZeroBubble, ZbH1PeakActivationMemoryIsOneFOneBs) {
  for (int M : {4, 8}) {
    const std::vector<uint64_t> ofob = peak_activations(ScheduleKind::k1F1B, 4, M);
    const std::vector<uint64_t> h1 = peak_activations(ScheduleKind::kZbH1, 4, M);
    const std::vector<uint64_t> h2 = peak_activations(ScheduleKind::kZbH2, 4, M);
    std::printf("pp 4 M %d peak activations: 1f1b %llu B, zb-h1 %llu B (%+.1f%%), zb-h2 %llu B (%+.1f%%)\n", M,
                (unsigned long long)max_of(ofob), (unsigned long long)max_of(h1),
                100.0 * (double(max_of(h1)) / double(max_of(ofob)) - 1), (unsigned long long)max_of(h2),
                100.0 * (double(max_of(h2)) / double(max_of(ofob)) - 1));
    EXPECT_EQ(h1[0], ofob[0]);
    EXPECT_EQ(max_of(h1), max_of(ofob));
    for (size_t r = 1; r < h1.size(); ++r) {
      EXPECT_LE(h1[r], h1[0]) << "rank " << r;
    }
    if (M >= 7) {  // 2p - 1 in flight
      EXPECT_GT(double(max_of(h2)), 1.5 * double(max_of(ofob)));
    }
  }
}

TEST(ZeroBubble, TimelineShowsTheWeightGradients) {
  TrainOptions o = uniform_stages(pipeline(4, 8, ScheduleKind::kZbH1, 0));
  o.phantom = true;
  const std::string text = format_pipeline_timeline(run(o, ideal_profile()), {0, 1, 2, 3}, 96);
  std::printf("%s", text.c_str());
  std::vector<std::string> rows;
  for (size_t at = 0; (at = text.find('|', at)) != std::string::npos;) {
    const size_t end = text.find('|', at + 1);
    rows.push_back(text.substr(at + 1, end - at - 1));
    at = end + 1;
  }
  ASSERT_EQ(rows.size(), 4u);
  EXPECT_EQ(rows[0].find('W'), std::string::npos) << "rank 0 keeps 1F1B's fused backwards";
  for (int r = 1; r < 4; ++r) {
    EXPECT_NE(rows[size_t(r)].find('W'), std::string::npos) << rows[size_t(r)];
    const std::string& row = rows[size_t(r)];
    EXPECT_EQ(row[row.find_last_not_of('.')], 'W') << "the pending weight gradients end rank " << r;
  }
}

}  // namespace
}  // namespace shardlab::train
