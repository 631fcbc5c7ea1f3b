// ParallelOptions::overlap_p2p_comm (PipelineExecutor::wait_for_sends) on
// the smallest interleaved pipeline, counted by hand: pp 2, vpp 2, M 2
// (warm-up = every forward: F F F F then B B B B on each rank), a stage
// model whose forward takes 20 us and backward 40 us on the compute stream,
// and 10 us per transfer (1 MB over simple_profile's intra-node link: 1 us
// latency, 100 GB/s). Stages: rank 0 holds 0 and 2, rank 1 holds 1 and 3.
// The expected ends below are worked out by hand from those figures (in the
// comments), not read off a run.
#include <gtest/gtest.h>

#include <cstdio>
#include <vector>

#include "model/parallel/pipeline/executor.h"
#include "model/parallel/pipeline/schedule.h"
#include "runtime/cluster.h"
#include "tests/runtime/test_util.h"

namespace shardlab::parallel {
namespace {

using testing::kUs;

constexpr Time kForward = 20 * kUs, kBackward = 40 * kUs;
constexpr int64_t kBoundary = 500'000;  // bf16: 1 MB, 10 us at 100 GB/s

// Fixed compute times, phantom tensors (null buffers: no payload).
class TimedStages : public StageModel {
 public:
  TimedStages(Device& dev, int rank) : dev_(dev) { placement_ = {.pp = 2, .vpp = 2, .rank = rank}; }
  const StagePlacement& placement() const override { return placement_; }
  int64_t boundary_elements() const override { return kBoundary; }
  float* activation_buffer(int, int) override { return nullptr; }
  float* gradient_buffer(int, int) override { return nullptr; }
  void forward(int, int, int, const MicroBatchTokens&) override { dev_.compute().run("F", kForward); }
  const float* output(int, int) override { return nullptr; }
  void backward_input(int, int, int, float, bool, bool) override { dev_.compute().run("B", kBackward); }
  void backward_weight(int, int, bool) override {}
  const float* input_grad(int, int) override { return nullptr; }
  void release_input_grad(int, int) override {}
  void reset_losses() override {}
  double ce_sum() const override { return 0; }
  double aux_sum() const override { return 0; }

 private:
  Device& dev_;
  StagePlacement placement_;
};

std::vector<Time> phase_ends(bool wait_sends) {
  std::vector<Time> ends(2);
  Cluster cluster(testing::simple_profile(1, 2), {.world_size = 2, .precision = Precision::kBf16});
  const Schedule schedule = interleaved_1f1b(2, 2, 2);
  cluster.run([&](Device& dev) {
    TimedStages model(dev, dev.rank());
    PipelineExecutor ex(dev, model, schedule[size_t(dev.rank())], {0, 1}, 2);
    ex.wait_for_sends(wait_sends);
    ends[size_t(dev.rank())] = ex.run([](int) { return MicroBatchTokens{}; }).end;
  });
  return ends;
}

TEST(PipelineP2pWait, SendsWaitedOnlyWithoutOverlapP2pComm) {
  // Overlapped (the default): sends leave when their tensor exists, the
  // compute stream waits for receives only. Each message arrives 11 us
  // after it leaves (10 on the wire + 1 of latency).
  //   rank 0: F0a [0,20) s->31, F1a [20,40) s->51; F0c needs rank 1's F0b:
  //   rank 1: F0b [31,51) s->62, F1b [51,71) s->82
  //   rank 0: F0c [62,82) s->93, F1c [82,102) s->113
  //   rank 1: F0d [93,113), F1d [113,133), B0d [133,173) s->184, B1d [173,213) s->224
  //   rank 0: B0c [184,224) s->235, B1c [224,264) s->275
  //   rank 1: B0b [235,275) s->286, B1b [275,315) s->326: ends 315
  //   rank 0: B0a [286,326), B1a [326,366): ends 366
  const std::vector<Time> overlapped = phase_ends(false);
  // Waited (--no-overlap-p2p-comm): after each send the compute stream waits
  // the 10 us it takes to leave.
  //   rank 0: F0a [0,20) +10 ->31, F1a [30,50) +10 ->61
  //   rank 1: F0b [31,51) +10 ->62, F1b [61,81) +10 ->92
  //   rank 0: F0c [62,82) +10 ->93, F1c [92,112) +10 ->123
  //   rank 1: F0d [93,113), F1d [123,143), B0d [143,183) +10 ->194, B1d [193,233) +10 ->244
  //   rank 0: B0c [194,234) +10 ->245, B1c [244,284) +10 ->295
  //   rank 1: B0b [245,285) +10 ->296, B1b [295,335) +10: ends 345
  //   rank 0: B0a [296,336), B1a [346,386): ends 386
  const std::vector<Time> waited = phase_ends(true);
  std::printf("rank 0: %.3f us overlapped, %.3f us waited; rank 1: %.3f, %.3f\n", double(overlapped[0]) / kUs,
              double(waited[0]) / kUs, double(overlapped[1]) / kUs, double(waited[1]) / kUs);
  EXPECT_EQ(overlapped, (std::vector<Time>{366 * kUs, 315 * kUs}));
  EXPECT_EQ(waited, (std::vector<Time>{386 * kUs, 345 * kUs}));
}

}  // namespace
}  // namespace shardlab::parallel
