// --tp-comm-overlap (tensor/mappings.h, "Communication overlap") on one
// layer's two TP GEMMs, by hand: the column-parallel GEMM behind its
// ring-exchange all-gather (tp chunks of rows) and the row-parallel GEMM
// before its pipelined reduce-scatter (kTpOverlapSplits chunks). Each
// collective's duration D is the blocking form's, measured in the same run
// without overlap; the GEMM chunks' times are the cost model's of the
// chunk's shape. The expected clock is counted here from those figures, not
// read off the overlapped run. The SM share is switched off (sm_count 0) so
// that the pipeline alone is counted; the SM margin has its own check.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "model/engine/device_sink.h"
#include "model/kernels.h"
#include "model/parallel/tensor/mappings.h"
#include "runtime/cluster.h"
#include "tests/model/parallel/tensor/tp_test_util.h"

namespace shardlab::parallel {
namespace {

constexpr int kTp = 2;
constexpr int64_t kRowsLocal = 1024;  // N/tp rows per rank
constexpr int kC = 2048, kF = 4096;   // the layer's width and its column-parallel output per rank

struct LayerTimes {
  Time ag = 0;        // the all-gather's end on the compute stream (blocking) or 0
  Time col_end = 0;   // the column-parallel GEMM's end
  Time row_start = 0, row_end = 0;  // the row-parallel GEMM
  Time end = 0;       // after the reduce-scatter
};

// Rank 0's clock through AG -> column GEMM (N x C -> F) -> row GEMM (N x F -> C) -> RS, phantom.
LayerTimes run_layer(bool overlap, int64_t sms) {
  HardwareProfile prof = testing::test_profile(kTp);
  prof.device.gemm.sm_count = sms;
  ClusterOptions opts;
  opts.world_size = kTp;
  opts.precision = Precision::kBf16;
  Cluster cluster(prof, opts);
  std::vector<LayerTimes> times(kTp);
  cluster.run([&](Device& dev) {
    engine::DeviceSink sink(dev);
    Stream side(&dev, StreamKind::kTpComm);  // ShardedGPT's side stream (sharded_gpt.cc)
    const collectives::ProcessGroup g = collectives::ProcessGroup::world(dev);
    TpContext c;
    c.dev = &dev;
    c.ex = model::Exec::with(&sink);
    c.ex.phantom = true;
    c.group = &g;
    c.sp = true;
    c.overlap = overlap ? &side : nullptr;
    LayerTimes& t = times[size_t(dev.rank())];
    const int64_t N = kRowsLocal * kTp;
    gather_into_gemm(c, static_cast<const float*>(nullptr), nullptr, kRowsLocal, kC);
    t.ag = overlap ? 0 : dev.compute().now();
    model::linear_forward(c.ex, "col", static_cast<float*>(nullptr), static_cast<const float*>(nullptr),
                          static_cast<const float*>(nullptr), N, kC, kF);
    t.col_end = dev.compute().now();
    t.row_start = dev.compute().now();
    model::linear_forward(c.ex, "row", static_cast<float*>(nullptr), static_cast<const float*>(nullptr),
                          static_cast<const float*>(nullptr), N, kF, kC);
    t.row_end = dev.compute().now();
    reduce_scatter_after_gemm(c, nullptr, nullptr, kRowsLocal, kC);
    t.end = dev.compute().now();
  });
  return times[0];
}

Time gemm_time(int64_t N, int C, int OC, int64_t sms) {
  HardwareProfile prof = testing::test_profile(kTp);
  prof.device.gemm.sm_count = sms;
  const CostModel cost(prof.device, Precision::kBf16);
  return cost.duration(model::linear_forward_cost(N, C, OC, false, 2));
}

TEST(TpCommOverlap, OneLayerByHand) {
  const LayerTimes off = run_layer(false, 0);
  const LayerTimes on = run_layer(true, 0);
  const int64_t N = kRowsLocal * kTp;
  // Without overlap: AG, GEMM, GEMM, RS back to back.
  const Time d_ag = off.ag;
  const Time d_rs = off.end - off.row_end;
  const Time G1 = gemm_time(N, kC, kF, 0), G2 = gemm_time(N, kF, kC, 0);
  EXPECT_EQ(off.col_end, d_ag + G1);
  EXPECT_EQ(off.row_end, d_ag + G1 + G2);
  // With overlap, tp = 2: the own rows' chunk at 0, the peer's at D_ag.
  const Time g1 = gemm_time(N / kTp, kC, kF, 0);
  const Time col_end = std::max(g1, d_ag) + g1;
  EXPECT_EQ(on.col_end, col_end);
  // The row GEMM whole, then its reduce-scatter in 4 chunks of D_rs/4 behind 4 GEMM chunks of G2/4.
  EXPECT_EQ(on.row_end, col_end + G2);
  const Time s = kTpOverlapSplits;
  const Time end = std::max(col_end + G2 / s + d_rs, col_end + G2 + d_rs / s);
  EXPECT_EQ(on.end, end);
  std::printf("AG %.2f us, RS %.2f us, column GEMM %.2f us (chunk %.2f), row GEMM %.2f us\n", d_ag / 1e6,
              d_rs / 1e6, G1 / 1e6, g1 / 1e6, G2 / 1e6);
  std::printf("layer: %.2f us blocking, %.2f us overlapped (hand count %.2f us)\n", off.end / 1e6, on.end / 1e6,
              end / 1e6);
  EXPECT_LT(on.end, off.end);  // the mechanism saves time here (a check that the test can fail)
}

// With SMs: the pipelined reduce-scatter's GEMM runs on sm_count - 24 SMs
// (set_sm_margin), so the GEMM-bound end stretches by G2·24/(sm_count - 24).
TEST(TpCommOverlap, PipelineSmMargin) {
  const int64_t sms = 108;
  const LayerTimes on = run_layer(true, sms);
  const Time G2 = on.row_end - on.row_start;
  const Time stretched = G2 + (G2 * kTpOverlapPipelineSms + (sms - kTpOverlapPipelineSms) - 1) /
                                  (sms - kTpOverlapPipelineSms);
  const LayerTimes off = run_layer(false, sms);
  const Time d_rs = off.end - off.row_end;
  const Time s = kTpOverlapSplits;
  const Time end = std::max(on.row_start + stretched / s + d_rs, on.row_start + stretched + d_rs / s);
  std::printf("row GEMM %.2f us, on %lld SMs %.2f us; end %.2f us (hand %.2f us)\n", G2 / 1e6,
              static_cast<long long>(sms - kTpOverlapPipelineSms), stretched / 1e6, on.end / 1e6, end / 1e6);
  EXPECT_LE(std::abs(double(on.end - end)), 2.0);  // ps: the integer divisions' rounding
}

}  // namespace
}  // namespace shardlab::parallel
