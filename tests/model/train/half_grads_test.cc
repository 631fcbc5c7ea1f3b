// Half-precision gradients (ParallelOptions::half_grads, Megatron-LM 2021 in
// fp16 as its sc21 scripts ran it): the kernels and bytes of each pass,
// counted by hand per parameter P (bf16: 2-byte gradients and weights, fp32
// master weights, moments and main gradients) and compared with the trace:
//   accumulation  micro-batches 2.. of a step: read 2 + 2, write 2 = 6 B/P
//   local DDP     flatten, divide, unflatten: 3 x (2 + 2) = 12 B/P
//   torch DDP     copy into the bucket (divided), copy back: 2 x 4 = 8 B/P
//   optimizer     copy to fp32 main gradients 2 + 4, unscale + inf/nan
//                 check 4 + 4, AdamW 7 x 4, master -> model weights 4 + 2
// and the data-parallel all-reduce moving half the bytes of fp32 gradients.
#include <cstring>
#include <map>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "model/params.h"
#include "train_test_util.h"

namespace shardlab::train {
namespace {

struct Kernel {
  int count = 0;
  double bytes = 0;
};

// Rank `rank`'s compute kernels by name, and the bytes its comm stream moved.
struct Tally {
  std::map<std::string, Kernel> kernels;
  double comm_bytes = 0;
};

Tally tally(const TrainOptions& o, int rank = 0, Precision precision = Precision::kBf16) {
  const TrainResult r = testing::run(o, nullptr, /*trace=*/true, precision);
  Tally t;
  for (const DeviceTrace& d : r.run.traces) {
    if (d.rank != rank) continue;
    for (const TraceEvent& e : d.events) {
      if (e.stream == StreamKind::kCompute) {
        Kernel& k = t.kernels[e.name];
        ++k.count;
        k.bytes += double(e.bytes);
      } else if (e.stream == StreamKind::kComm) {
        t.comm_bytes += double(e.bytes);
      }
    }
  }
  return t;
}

TrainOptions half(int dp, bool overlap) {
  TrainOptions o = testing::small_options();
  o.steps = 1;
  o.micro_batches = 4;
  o.parallel.dp = dp;
  o.parallel.overlap = overlap;
  o.parallel.grad_accum_fusion = false;
  o.parallel.half_grads = true;
  return o;
}

TEST(HalfGrads, AutogradAddsEveryMicroBatchButTheFirst) {
  // Unsharded: ln_f, 4 blocks, wte and wpe announced once per backward
  // (7 kernels), every parameter once; the first micro-batch adds nothing.
  const TrainOptions o = half(1, false);
  const double P = double(model::count_params(o.model));
  const Kernel k = tally(o).kernels["grad_accum"];
  EXPECT_EQ(k.count, 3 * 7);
  EXPECT_EQ(k.bytes, 3 * 6 * P);
}

TEST(HalfGrads, OptimizerRunsMegatronsFp16Passes) {
  const TrainOptions o = half(1, false);
  const double P = double(model::count_params(o.model));
  Tally t = tally(o);
  EXPECT_EQ(t.kernels["main_grad_copy"].bytes, 6 * P);
  EXPECT_EQ(t.kernels["unscale_check"].bytes, 8 * P);
  EXPECT_EQ(t.kernels["adamw"].bytes, 28 * P);
  EXPECT_EQ(t.kernels["param_copy"].bytes, 6 * P);
  EXPECT_EQ(t.kernels["grad_norm"].bytes, 4 * P);  // over the fp32 main gradients, as before
  EXPECT_EQ(t.kernels.count("ddp.flatten"), 0u);   // no data parallelism, no DDP copies

}

// AdamW's state is fp32 in every precision. bf16 with fp32 main gradients
// (Megatron's bf16 runs): no copy into main gradients and no unscale, but
// the same update over the fp32 master weights and moments, reading the fp32
// gradient (read p, m, v, g and write p, m, v: 7 x 4 = 28 B/P), and the
// master weights copied into the bf16 weights (read 4, write 2 = 6 B/P).
// fp32: the weights are the master weights, AdamW alone at 28 B/P.
TEST(HalfGrads, AdamWStateIsFp32InEveryPrecision) {
  TrainOptions o = half(1, false);
  o.parallel.half_grads = false;
  const double P = double(model::count_params(o.model));
  Tally t = tally(o);
  EXPECT_EQ(t.kernels.count("main_grad_copy") + t.kernels.count("unscale_check"), 0u);
  EXPECT_EQ(t.kernels["adamw"].count, 1);
  EXPECT_EQ(t.kernels["adamw"].bytes, 28 * P);
  EXPECT_EQ(t.kernels["param_copy"].bytes, 6 * P);
  t = tally(o, 0, Precision::kFp32);
  EXPECT_EQ(t.kernels["adamw"].bytes, 28 * P);
  EXPECT_EQ(t.kernels.count("param_copy"), 0u);
}

TEST(HalfGrads, LocalDdpFlattensDividesAndUnflattens) {
  const TrainOptions o = half(2, /*overlap=*/false);
  const double P = double(model::count_params(o.model));
  Tally t = tally(o);
  for (const char* name : {"ddp.flatten", "ddp.scale", "ddp.unflatten"}) {
    EXPECT_EQ(t.kernels[name].count, 1) << name;
    EXPECT_EQ(t.kernels[name].bytes, 4 * P) << name;
  }
  EXPECT_EQ(t.kernels.count("ddp.bucket_copy"), 0u);
}

TEST(HalfGrads, TorchDdpCopiesIntoItsBucketsAndBack) {
  const TrainOptions o = half(2, /*overlap=*/true);
  const double P = double(model::count_params(o.model));
  Tally t = tally(o);
  EXPECT_EQ(t.kernels["ddp.bucket_copy"].bytes, 4 * P);  // every bucket once
  EXPECT_EQ(t.kernels["ddp.unflatten"].bytes, 4 * P);
  EXPECT_EQ(t.kernels.count("ddp.flatten"), 0u);
}

TEST(HalfGrads, AllReduceMovesHalfTheBytes) {
  // The comm stream also carries the step's 3-float loss all-reduce, the
  // same in both runs: tolerance 1e-3 of the ratio (it adds ~1e-5 here).
  const TrainOptions o = half(2, false);
  TrainOptions full = o;
  full.parallel.half_grads = false;
  const double h = tally(o).comm_bytes, f = tally(full).comm_bytes;
  ASSERT_GT(f, 0);
  std::printf("half / fp32 gradient bytes on the wire: %.6f\n", h / f);
  EXPECT_NEAR(h / f, 0.5, 1e-3);
}

// Megatron-LM's unfused fp32 cross-entropy (ParallelOptions::fusions.cross_entropy off,
// set for every published run): with batch 8 x seq 32 = 256 rows of vocab 64
// on tp 2 (32 logits per row per rank): 64 rows and 2048 logits per rank per
// micro-batch.
// bf16, by hand: forward 38 B per logit + 4 per row, backward 14 + 4; the
// fused kernel 2 + 2 B per logit + 6 per row and 2 + 2 + 2 B + 4 per row.
// 4 micro-batches.
TEST(HalfGrads, UnfusedCrossEntropyMovesMegatronsBytes) {
  TrainOptions o = testing::small_options();
  o.steps = 1;
  o.micro_batches = 4;
  o.parallel.tp = 2;
  const double logits = 256.0 / 4 * 32, rows = 256.0 / 4;
  Tally fused = tally(o);
  o.parallel.fusions.cross_entropy = false;
  Tally unfused = tally(o);
  EXPECT_EQ(fused.kernels["cross_entropy.fwd"].count, 4);
  EXPECT_EQ(fused.kernels["cross_entropy.fwd"].bytes, 4 * (4 * logits + 2 * rows + 4 * rows));
  EXPECT_EQ(fused.kernels["cross_entropy.bwd"].bytes, 4 * (6 * logits + 4 * rows));
  EXPECT_EQ(unfused.kernels["cross_entropy.fwd"].count, 4);
  EXPECT_EQ(unfused.kernels["cross_entropy.fwd"].bytes, 4 * (38 * logits + 4 * rows));
  EXPECT_EQ(unfused.kernels["cross_entropy.bwd"].bytes, 4 * (14 * logits + 4 * rows));
  EXPECT_EQ(unfused.comm_bytes, fused.comm_bytes);  // the same collectives
}

// The report's config echoes both switches (as they were set, not defaults).
TEST(HalfGrads, ReportConfigEchoesTheGradientSwitches) {
  TrainOptions o = half(2, false);
  nlohmann::json j = o.to_json()["parallel"];
  EXPECT_EQ(j["grad_accum_fusion"], false);
  EXPECT_EQ(j["half_grads"], true);
  o.parallel.grad_accum_fusion = true;
  o.parallel.half_grads = false;
  j = o.to_json()["parallel"];
  EXPECT_EQ(j["grad_accum_fusion"], true);
  EXPECT_EQ(j["half_grads"], false);
  EXPECT_EQ(j["fusions"], "norm,swiglu,softmax,cross-entropy");
  o.parallel.fusions.cross_entropy = false;
  EXPECT_EQ(o.to_json()["parallel"]["fusions"], "norm,swiglu,softmax");
}

}  // namespace
}  // namespace shardlab::train
