// Phantom execution (--phantom): the same device programs on shapes only
// give the same virtual times and memory peaks as the real run; what a
// phantom run assumes (MoE routing) and refuses (loading, saving, comparing
// values). Folding symmetric ranks onto one thread: fold_test.cc.
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/model/train/phantom_util.h"

namespace shardlab::train {
namespace {

using namespace phantom_testing;

std::vector<Config> dense_configs() {
  auto none = [](Config&) {};
  return {
      make("tp2_sp_dp2_zero1", 2, 1, 2, 1, [](Config& c) {
        c.options.parallel.sp = true;
        c.options.parallel.zero = 1;
      }),
      make("tp2_pp2_dp2_zero2_bf16", 2, 2, 2, 2, [](Config& c) {
        c.options.parallel.zero = 2;
        c.options.parallel.bucket_mb = 0.02;
        c.precision = Precision::kBf16;
      }),
      make("pp4_interleaved_selective", 1, 2, 1, 4, [](Config& c) {
        c.options.parallel.schedule = parallel::ScheduleKind::kInterleaved;
        c.options.parallel.vpp = 2;
        c.options.parallel.recompute = parallel::Recompute::kSelective;
      }),
      make("tp4_full_recompute_no_clip", 4, 1, 1, 1, [](Config& c) {
        c.options.parallel.recompute = parallel::Recompute::kFull;
        c.options.grad_clip = 0;
      }),
      // A clip so small that the real run clips every step (as phantom assumes).
      make("tp2_pp2_gpipe_clipped", 2, 2, 1, 4, [](Config& c) {
        c.options.parallel.schedule = parallel::ScheduleKind::kGPipe;
        c.options.grad_clip = 1e-6;
      }),
      make("tp2_ffn_dp3", 2, 1, 3, 1, [](Config& c) {
        c.options.model.n_ffn = 96;
        c.options.model.batch_size = 12;
      }),
      make("tp2_pp2_dp2", 2, 2, 2, 2, none),
      make("tp2_pp2_scatter_gather", 2, 2, 1, 2, [](Config& c) { c.options.parallel.scatter_gather = true; }),
      make("cp2_tp2_sp_dp2", 2, 1, 2, 1, [](Config& c) {  // the K/V ring moves modeled bytes only
        c.options.parallel.cp = 2;
        c.options.parallel.sp = true;
      }),
  };
}

class PhantomEqualsReal : public ::testing::TestWithParam<Config> {};

TEST_P(PhantomEqualsReal, VirtualTimesAndMemoryPeaksAreBitIdentical) {
  const Config& c = GetParam();
  const TrainResult real = run_on(c, /*phantom=*/false);
  const TrainResult phantom = run_on(c, /*phantom=*/true, /*fold=*/false);
  expect_same_devices(real, phantom);
  EXPECT_GT(real.run.devices[0].compute_flops, 0);
  for (const StepRecord& s : phantom.steps) EXPECT_EQ(s.loss, 0.0);  // nothing computed
  EXPECT_TRUE(phantom.final_params.empty());
}

INSTANTIATE_TEST_SUITE_P(Dense, PhantomEqualsReal, ::testing::ValuesIn(dense_configs()),
                         [](const auto& info) { return info.param.name; });

// Megatron's scatter/gather between stages: each TP rank sends 1/tp of the
// boundary and the TP group all-gathers it, so a real run computes the same
// bits as without it and sends half the pipeline bytes at tp 2.
TEST(ScatterGather, SameBitsHalfThePipelineBytes) {
  Config c = make("tp2_pp2", 2, 2, 1, 2, [](Config&) {});
  const TrainResult whole = run_on(c, /*phantom=*/false);
  c.options.parallel.scatter_gather = true;
  const TrainResult split = run_on(c, /*phantom=*/false);
  ASSERT_EQ(whole.steps.size(), split.steps.size());
  for (size_t s = 0; s < whole.steps.size(); ++s) EXPECT_EQ(whole.steps[s].loss, split.steps[s].loss);
  EXPECT_EQ(whole.final_params, split.final_params);
  ASSERT_EQ(whole.phases.size(), split.phases.size());
  for (size_t r = 0; r < whole.phases.size(); ++r)
    for (size_t s = 0; s < whole.phases[r].size(); ++s)
      EXPECT_EQ(split.phases[r][s].p2p_bytes * 2, whole.phases[r][s].p2p_bytes) << "rank " << r;
}

// A single-device run (tp = pp = dp = 1, no phantom) charges the kernels
// its report names: FP8 GEMMs at the FP8 peak under --precision fp8 and the
// fused attention kernel under --attention fused, exactly as the sharded
// model at tp = 1 (a phantom run, which always runs the sharded model, and
// which PhantomEqualsReal shows to equal a real sharded run) charges them.
// Before, the single device ran the unsharded reference whatever the flags,
// with BF16 linears and the unfused core: its fp8 and fused times were the
// bf16 unfused run's. (BF16 unfused still runs the reference, whose program
// is not the sharded model's: 0.750 ms against 1.088 ms a step here.) The four runs must also differ among themselves
// (fp8 charges other kernels than bf16, on the H100, which has an FP8 peak;
// fused keeps B·NH·T log-sum-exp rows, not the B·NH·T² probabilities).
TEST(SingleDevice, ChargesTheKernelsItsReportNames) {
  std::map<std::string, TrainResult> real;
  for (const Precision precision : {Precision::kBf16, Precision::kFp8})
    for (const auto attention : {parallel::AttentionKernel::kUnfused, parallel::AttentionKernel::kFused}) {
      const std::string name = std::string(precision_name(precision)) + "_" + parallel::attention_kernel_name(attention);
      Config c = make(name, 1, 1, 1, 1, [&](Config& c) {
        c.options.parallel.attention = attention;
        c.precision = precision;
        c.profile = "h100-nvlink";
      });
      SCOPED_TRACE(name);
      const TrainResult r = run_on(c, /*phantom=*/false);
      // BF16 with the unfused core stays the unsharded reference's program
      // (model/gpt.h, its own kernels and buffers); the three others run
      // the sharded model at tp 1.
      const bool reference = precision == Precision::kBf16 && attention == parallel::AttentionKernel::kUnfused;
      EXPECT_EQ(runs_sharded(c.options, precision), !reference);
      if (!reference) expect_same_devices(r, run_on(c, /*phantom=*/true, /*fold=*/false));
      EXPECT_GT(r.steps.back().loss, 0.0);  // the real run computed
      real.emplace(name, r);
    }
  const auto end = [&](const std::string& name) { return real.at(name).run.devices[0].compute_end; };
  const auto peak = [&](const std::string& name) {
    return real.at(name).run.devices[0].peak_by_kind[int(MemKind::kActivation)];
  };
  EXPECT_NE(end("fp8_unfused"), end("bf16_unfused"));
  EXPECT_NE(end("fp8_fused"), end("bf16_fused"));
  EXPECT_LT(peak("bf16_fused"), peak("bf16_unfused"));
  EXPECT_LT(peak("fp8_fused"), peak("fp8_unfused"));
}

// Dropout is charged, not computed: a real run refuses it.
TEST(Dropout, NeedsAPhantomRun) {
  Config c = make("tp2", 2, 1, 1, 1, [](Config& c) { c.options.model.dropout = 0.1; });
  EXPECT_THROW(run_on(c, /*phantom=*/false), ConfigError);
  EXPECT_NO_THROW(run_on(c, /*phantom=*/true));
}

// MoE in a phantom run: uniform routing, an assumption stated in the report.
TEST(PhantomMoe, UniformRoutingGivesEveryExpertTheSameTokens) {
  TrainOptions o = small_options(/*experts=*/4);
  o.steps = 1;
  o.phantom = true;
  o.parallel.tp = 2;
  o.parallel.dp = 2;
  o.parallel.ep = 2;
  const TrainResult r = testing::run(o);
  ASSERT_FALSE(r.moe_layers.empty());
  // N·K/E assignments per expert over the global batch: 8 x 32 tokens, top-2, 4 experts.
  const int64_t expected = int64_t{8} * 32 * 2 / 4;
  for (const auto& layer : r.moe_layers)
    for (int64_t tokens : layer.tokens.back()) EXPECT_EQ(tokens, expected) << "layer " << layer.layer;
  for (const auto& layer : r.moe_layers) EXPECT_EQ(layer.imbalance.back(), 1.0);
}

// Zipf-skewed routing: first choices by quantile of p(e) ~ 1/(e+1)^s, the
// k-th (first + k) mod E. With s = 1 over 4 experts, p = (12, 6, 4, 3)/25:
// of 256 tokens the first choices fall 123, 61, 41, 31 (quantiles
// (n+0.5)/256 against the cumulative shares 0.48, 0.72, 0.88, 1), and the
// second choices are those shifted by one expert.
TEST(PhantomMoe, ZipfRoutingSkewsTheLoadAsAPowerLaw) {
  TrainOptions o = small_options(/*experts=*/4);
  o.steps = 1;
  o.phantom = true;
  o.phantom_zipf = 1.0;
  o.model.batch_size = 8;  // 8 x 32 = 256 tokens, one replica
  const TrainResult r = testing::run(o);
  ASSERT_FALSE(r.moe_layers.empty());
  const std::vector<int64_t> first = {123, 61, 41, 31};
  for (const auto& layer : r.moe_layers) {
    const auto& t = layer.tokens.back();
    ASSERT_EQ(t.size(), 4u);
    for (size_t e = 0; e < 4; ++e) EXPECT_EQ(t[e], first[e] + first[(e + 3) % 4]) << "expert " << e;
  }
}

TEST(PhantomOptions, ValuesCannotBeLoadedSavedOrCompared) {
  TrainOptions o = small_options();
  o.phantom = true;
  o.save_path = "/tmp/x.safetensors";
  EXPECT_THROW(o.validate(), ConfigError);
  o.save_path.clear();
  o.init_path = "/tmp/x.safetensors";
  EXPECT_THROW(o.validate(), ConfigError);
  o.init_path.clear();
  o.keep_step0_grads = true;
  EXPECT_THROW(o.validate(), ConfigError);
  o.keep_step0_grads = false;
  o.phantom_zipf = -1;
  EXPECT_THROW(o.validate(), ConfigError);
  o.phantom_zipf = 1;
  o.phantom = false;  // a routing assumption needs a phantom run
  EXPECT_THROW(o.validate(), ConfigError);
}

}  // namespace
}  // namespace shardlab::train
