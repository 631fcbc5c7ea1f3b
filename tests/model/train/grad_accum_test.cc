// Gradient accumulation without fusion (ParallelOptions::grad_accum_fusion
// off, Megatron-LM 2021): in mixed precision every micro-batch's backward
// adds its gradients into the fp32 main gradients with a separate kernel,
// "grad_accum", of 2 + 4 + 4 = 10 bytes per parameter (ZeRO-3, which
// reduces every micro-batch: a copy, 2 + 4). Fused (the default) or in fp32
// there is no such kernel.
#include <cstring>

#include <gtest/gtest.h>

#include "model/params.h"
#include "train_test_util.h"

namespace shardlab::train {
namespace {

struct Accum {
  int kernels = 0;
  double bytes = 0;
};

Accum grad_accum_kernels(const TrainOptions& o, Precision precision) {
  const TrainResult r = testing::run(o, nullptr, /*trace=*/true, precision);
  Accum a;
  for (const DeviceTrace& t : r.run.traces)
    for (const TraceEvent& e : t.events)
      if (std::strcmp(e.name, "grad_accum") == 0) ++a.kernels, a.bytes += double(e.bytes);
  return a;
}

TrainOptions unfused(int pp) {
  TrainOptions o = testing::small_options();
  o.steps = 1;
  o.micro_batches = 4;
  o.parallel.pp = pp;
  o.parallel.grad_accum_fusion = false;
  return o;
}

TEST(GradAccumFusion, UnfusedAddsTenBytesPerParameterPerMicroBatch) {
  // Unsharded: each backward announces ln_f, the 4 blocks, wte and wpe
  // (7 kernels), every parameter once (the tied wte once).
  const TrainOptions o = unfused(1);
  const double params = double(model::count_params(o.model));
  const Accum a = grad_accum_kernels(o, Precision::kBf16);
  EXPECT_EQ(a.kernels, 4 * 7);
  EXPECT_EQ(a.bytes, 4 * 10 * params);
}

TEST(GradAccumFusion, EachPipelineStageAddsItsOwnParameters) {
  // Stage 0: wte + wpe, blocks 0-1 (3 kernels); stage 1: blocks 2-3, then
  // ln_f with its copy of the tied wte (64 x 64) in one (3 kernels).
  const TrainOptions o = unfused(2);
  const double params = double(model::count_params(o.model)) + 64 * 64;
  const Accum a = grad_accum_kernels(o, Precision::kBf16);
  EXPECT_EQ(a.kernels, 4 * 6);
  EXPECT_EQ(a.bytes, 4 * 10 * params);
}

// ZeRO-3 reduces every micro-batch's gradients at once, so nothing is added
// locally: each backward copies its gradients into the fp32 buffer that is
// reduce-scattered (Megatron-FSDP's `param.main_grad.copy_(param.grad)`),
// 2 + 4 = 6 bytes per parameter. The sharded model's hook points: ln_f, the
// 4 blocks and the embeddings (6 kernels per backward), on each of 2 ranks.
TEST(GradAccumFusion, ZeroThreeCopiesSixBytesPerParameterPerMicroBatch) {
  TrainOptions o = unfused(1);
  o.parallel.dp = 2;
  o.parallel.zero = 3;
  const double params = double(model::count_params(o.model));
  const Accum a = grad_accum_kernels(o, Precision::kBf16);
  EXPECT_EQ(a.kernels, 2 * 4 * 6);
  EXPECT_EQ(a.bytes, 2 * 4 * 6 * params);
}

// With bf16 main gradients (--grad-reduce-in-bf16) the separate kernel adds
// into bf16: 2 + 2 + 2 = 6 bytes per parameter per micro-batch.
TEST(GradAccumFusion, Bf16MainGradientsAddSixBytesPerParameterPerMicroBatch) {
  TrainOptions o = unfused(1);
  o.parallel.grad_reduce_bf16 = true;
  const double params = double(model::count_params(o.model));
  const Accum a = grad_accum_kernels(o, Precision::kBf16);
  EXPECT_EQ(a.kernels, 4 * 7);
  EXPECT_EQ(a.bytes, 4 * 6 * params);
}

TEST(GradAccumFusion, FusedOrFp32RunsNoSeparateKernel) {
  TrainOptions fused = unfused(2);
  fused.parallel.grad_accum_fusion = true;
  EXPECT_EQ(grad_accum_kernels(fused, Precision::kBf16).kernels, 0);
  EXPECT_EQ(grad_accum_kernels(unfused(2), Precision::kFp32).kernels, 0);
}

}  // namespace
}  // namespace shardlab::train
