// Pipeline parallelism end to end: sharded runs against the unsharded model,
// the measured bubble against the textbook formulas, activation stashes
// against the schedules, and the point-to-point volumes.
#include <cstdio>
#include <regex>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "model/config.h"
#include "model/train/trainer.h"
#include "model/train/verify.h"
#include "runtime/profile.h"
#include "runtime/trace.h"
#include "tests/runtime/trace_checks.h"
#include "tests/model/parallel/pipeline/pipeline_test_util.h"

namespace shardlab::train {
namespace {

using parallel::ScheduleKind;

using PipelineCase = std::tuple<int, int, ScheduleKind, int>;  // pp, M, schedule, experts

class PipelineVerify : public ::testing::TestWithParam<PipelineCase> {};

TEST_P(PipelineVerify, MatchesTheUnshardedModel) {
  const auto [pp, M, kind, experts] = GetParam();
  expect_matches_unsharded(pipeline(pp, M, kind, experts));
}

// pp {2, 4} x M {1, 4, 8} x {gpipe, 1f1b, interleaved} x {dense, MoE}, only
// the valid ones: interleaved needs M % pp == 0 (so M 1 has no interleaved
// case). 2 x 3 x 3 x 2 = 36 combinations, 4 invalid: 32 cases.
std::vector<PipelineCase> valid_pipeline_cases() {
  std::vector<PipelineCase> cases;
  for (int pp : {2, 4})
    for (int M : {1, 4, 8})
      for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::k1F1B, ScheduleKind::kInterleaved})
        for (int experts : {0, 4})
          if (kind != ScheduleKind::kInterleaved || M % pp == 0) cases.emplace_back(pp, M, kind, experts);
  return cases;
}

TEST(PipelineVerifyGrid, ListsOnlyValidCases) {
  const std::vector<PipelineCase> cases = valid_pipeline_cases();
  EXPECT_EQ(cases.size(), 32u);
  for (const auto& [pp, M, kind, experts] : cases)
    EXPECT_NO_THROW(parallel::check_pipeline_config(kind, pp, M, kind == ScheduleKind::kInterleaved ? 2 : 1));
}

std::string grid_name(const ::testing::TestParamInfo<PipelineVerify::ParamType>& info) {
  return "pp" + std::to_string(std::get<0>(info.param)) + "_M" + std::to_string(std::get<1>(info.param)) + "_" +
         std::string(parallel::schedule_name(std::get<2>(info.param))) +
         (std::get<3>(info.param) ? "_moe" : "_dense");
}

INSTANTIATE_TEST_SUITE_P(Grid, PipelineVerify, ::testing::ValuesIn(valid_pipeline_cases()), grid_name);

TEST(Pipeline3D, TpTimesPpTimesDpMatchesTheUnshardedModel) {
  for (int experts : {0, 4}) {
    for (bool sp : {false, true}) {
      TrainOptions o = pipeline(2, 4, ScheduleKind::k1F1B, experts);
      o.parallel.tp = 2;
      o.parallel.dp = 2;
      o.parallel.sp = sp;
      o.parallel.zero = sp ? 2 : 1;
      expect_matches_unsharded(o);
    }
  }
  TrainOptions o = pipeline(2, 2, ScheduleKind::kInterleaved, 0);
  o.parallel.tp = 2;
  o.parallel.dp = 2;
  expect_matches_unsharded(o);
}

TEST(PipelineStages, UnevenStagesFromPpLayersMatch) {
  TrainOptions o = pipeline(3, 4, ScheduleKind::k1F1B, 0);
  o.parallel.stage_layers = {4, 3, 1};
  expect_matches_unsharded(o);
}

TEST(PipelineBubble, MatchesTheTextbookFormulaOnUniformStages) {
  const int pp = 4;
  for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::k1F1B, ScheduleKind::kInterleaved}) {
    for (int M : {1, 4, 8, 16}) {
      if (kind == ScheduleKind::kInterleaved && M % pp != 0) continue;
      TrainOptions o = uniform_stages(pipeline(pp, M, kind, 0));
      // Shapes only: the same kernels charge the same virtual times (invariant
      // 4), without the GEMMs that made this test minutes long (and time out under TSan).
      o.phantom = true;
      const TrainResult r = run(o, ideal_profile());
      const int v = o.parallel.vpp;
      const double formula = double(pp - 1) / (v * M + pp - 1);
      const double rel = (r.bubble_fraction - formula) / formula;
      std::printf("%-12s pp %d M %2d: bubble %.4f, formula (p-1)/(%sm+p-1) = %.4f, rel diff %+.4f (tol 0.01)\n",
                  std::string(parallel::schedule_name(kind)).c_str(), pp, M, r.bubble_fraction,
                  v > 1 ? "v·" : "", formula, rel);
      EXPECT_LE(std::abs(rel), 0.01) << parallel::schedule_name(kind) << " M " << M;
    }
  }
}

TEST(PipelineTimeline, TheFirstStepDrawsTheTextbookPicture) {
  const int pp = 4, M = 8;
  auto rows = [&](ScheduleKind kind) {
    const TrainOptions o = uniform_stages(pipeline(pp, M, kind, 0));
    const std::string text = format_pipeline_timeline(run(o, ideal_profile()), {0, 1, 2, 3}, 96);
    std::printf("%s", text.c_str());
    std::vector<std::string> out;
    for (size_t at = 0; (at = text.find('|', at)) != std::string::npos;) {
      const size_t end = text.find('|', at + 1);
      out.push_back(text.substr(at + 1, end - at - 1));
      at = end + 1;
    }
    return out;
  };
  // GPipe: every stage runs all forwards, idles, then all backwards; stage s
  // starts s forward-slots late and the last stage turns around at once.
  const auto gpipe = rows(ScheduleKind::kGPipe);
  ASSERT_EQ(gpipe.size(), size_t(pp));
  const std::regex all_f_then_all_b(R"(\.*F+\.*B+\.*)");
  for (int s = 0; s < pp; ++s) {
    EXPECT_TRUE(std::regex_match(gpipe[size_t(s)], all_f_then_all_b)) << gpipe[size_t(s)];
    EXPECT_EQ(gpipe[size_t(s)].find('F'), gpipe[size_t(s)].find_first_not_of('.'));
  }
  EXPECT_EQ(gpipe[0].front(), 'F');
  EXPECT_EQ(gpipe[pp - 1].back(), '.');
  EXPECT_EQ(gpipe[pp - 1].find("FB"), gpipe[pp - 1].rfind('F'));  // no idle between its last F and first B
  // 1F1B: the last stage alternates F and B from its first backward on, and
  // stage 0 runs pp forwards before its first backward.
  const auto ofob = rows(ScheduleKind::k1F1B);
  const std::string& last = ofob[pp - 1];
  const std::string busy = last.substr(last.find('F'), last.rfind('B') - last.find('F') + 1);
  EXPECT_EQ(busy.find('.'), std::string::npos) << last;
  int switches = 0;
  for (size_t i = 1; i < busy.size(); ++i) switches += busy[i] != busy[i - 1];
  EXPECT_EQ(switches, 2 * M - 1) << busy;  // F B F B ... B: M forwards, M backwards interleaved
}

// Peak activation bytes of each pipeline rank.
std::vector<uint64_t> activation_peaks(const TrainOptions& o) {
  const TrainResult r = run(o, builtin_profiles().front());
  std::vector<uint64_t> out;
  for (const auto& d : r.run.devices) out.push_back(d.peak_by_kind[int(MemKind::kActivation)]);
  return out;
}

TEST(PipelineMemory, GPipeStashesEveryMicroBatchAndOneFOneBAtMostPpMinusRank) {
  // The same micro-batch shape (2 rows) throughout: M micro-batches of a batch of 2M.
  const int pp = 4, M = 8;
  auto options = [&](ScheduleKind kind, int micro) {
    TrainOptions o = pipeline(pp, micro, kind, 0);
    o.model.batch_size = 2 * micro;
    o.steps = 1;
    o.keep_step0_grads = false;
    return o;
  };
  const auto one = activation_peaks(options(ScheduleKind::kGPipe, 1));
  const auto gpipe = activation_peaks(options(ScheduleKind::kGPipe, M));
  const auto ofob = activation_peaks(options(ScheduleKind::k1F1B, M));
  // Middle stages hold nothing but the stash: exact multiples of one micro-batch.
  for (int r = 1; r < pp - 1; ++r) {
    std::printf("stage %d: one micro-batch %llu B, gpipe %llu B (x%.2f), 1f1b %llu B (x%.2f)\n", r,
                (unsigned long long)one[r], (unsigned long long)gpipe[r], double(gpipe[r]) / one[r],
                (unsigned long long)ofob[r], double(ofob[r]) / one[r]);
    EXPECT_EQ(gpipe[r], uint64_t(M) * one[r]);
    EXPECT_EQ(ofob[r], uint64_t(pp - r) * one[r]);
  }
  // First and last stages: gpipe grows with M, 1f1b stays below it.
  for (int r : {0, pp - 1}) {
    EXPECT_GT(gpipe[r], uint64_t(M - 1) * one[r]);
    EXPECT_LT(ofob[r], gpipe[r]);
  }
}

TEST(PipelineComm, EachStageSendsOneActivationAndOneGradientPerMicroBatch) {
  const int pp = 4, M = 4;
  TrainOptions o = pipeline(pp, M, ScheduleKind::k1F1B, 0);
  o.steps = 2;
  o.keep_step0_grads = false;
  const TrainResult r = run(o, builtin_profiles().front());
  const uint64_t tensor = uint64_t(o.model.batch_size / M) * o.model.block_size * o.model.n_embd * 4;
  for (int rank = 0; rank < pp; ++rank) {
    const int tensors = (rank < pp - 1) + (rank > 0);  // activations forward, gradients back
    EXPECT_EQ(r.phase_totals[size_t(rank)].p2p_bytes, uint64_t(o.steps) * M * tensors * tensor) << rank;
  }
}

TEST(PipelineTrace, TransfersSitOnThePipelineTrackAndTheComputeTrackShowsTheSchedule) {
  const int pp = 2, M = 4;
  TrainOptions o = pipeline(pp, M, ScheduleKind::k1F1B, 0);
  o.steps = 1;
  o.keep_step0_grads = false;
  const TrainResult r = run(o, builtin_profiles().front(), /*trace=*/true);
  for (int rank = 0; rank < pp; ++rank) {
    int sends = 0, recvs = 0, first_block_fwd = 0;
    for (const TraceEvent& e : r.run.traces[size_t(rank)].events) {
      const std::string name = e.name;
      if (e.stream == StreamKind::kPipeline) {
        sends += name == "send";
        recvs += name == "recv";
      }
      // One forward of the stage's first block per micro-batch.
      if (e.stream == StreamKind::kCompute && name == "ln_1.fwd") ++first_block_fwd;
    }
    EXPECT_EQ(sends, M) << rank;  // activations forward (rank 0) or gradients back (rank 1)
    // A receive is traced while the stage waits for it (not when it was already there).
    EXPECT_GE(recvs, 1) << rank;
    EXPECT_LE(recvs, M) << rank;
    EXPECT_EQ(first_block_fwd, M * o.model.n_layer / pp) << rank;
    // Each track is a sequence of disjoint spans; the last ends at the device's end.
    EXPECT_EQ(shardlab::testing::trace_fault(r.run.traces[size_t(rank)], r.run.devices[size_t(rank)]), "") << rank;
  }
}

}  // namespace
}  // namespace shardlab::train
