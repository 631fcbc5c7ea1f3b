// ShardedGPT (one stage, tensor parallel) against the unsharded GPT<float> from the same seed and
// batch (picotron's test_tensor_parallel): init gathered bit for bit, loss
// within 1e-5 relative, every gradient gathered from its shards within a
// stated tolerance; dense and MoE, tp 1/2/4, with and without SP.
#include "model/parallel/config_check.h"
#include "model/parallel/sharded_gpt.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>

#include "model/gpt.h"
#include "model/parallel/layout.h"
#include "model/parallel/tensor/embedding.h"
#include "runtime/cluster.h"
#include "runtime/errors.h"
#include "support/compare.h"
#include "tests/model/test_models.h"
#include "tests/model/parallel/tensor/tp_test_util.h"

namespace shardlab::parallel {
namespace {

using testing::Batch;
using testing::RankResult;
using testing::RunSpec;

constexpr double kLossRelTol = 1e-5;
// Per tensor: max |tp - ref| / max |ref|. fp32 partial sums reduced in a
// different order differ by a few ulps per op; through 2 blocks this stays
// around 1e-6 (printed by each test).
constexpr double kGradRelTol = 5e-5;
constexpr int kB = 4, kT = 16;

struct Case {
  int tp;
  bool sp;
  bool moe;
  int dp = 1;
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return (info.param.dp > 1 ? "dp" + std::to_string(info.param.dp) + "_" : "") + "tp" +
         std::to_string(info.param.tp) + (info.param.sp ? "_sp" : "") +
         (info.param.moe ? "_moe" : "_dense");
}

class TensorParallelMatch : public ::testing::TestWithParam<Case> {};

TEST_P(TensorParallelMatch, LossAndGradientsMatchUnsharded) {
  const Case c = GetParam();
  const model::GPTConfig config = testing::small_config(c.moe);
  const Batch batch = testing::make_batch(config, kB, kT, 7);
  RunSpec spec = testing::run_spec(c.tp, c.sp);
  spec.dp = c.dp;
  const testing::Match m = testing::match_reference(config, batch, spec);
  const std::vector<RankResult>& ranks = m.holders;
  for (const RankResult& r : ranks) {
    EXPECT_EQ(std::memcmp(&r.losses[0], &ranks[0].losses[0], sizeof(float)), 0)
        << "loss differs across TP ranks";
  }
  EXPECT_EQ(m.mismatch, "") << "replicated gradients must be bit-identical across TP ranks";
  const testing::Diff& d = m.grad;
  std::printf(
      "  dp=%d tp=%d sp=%d moe=%d: loss %.7f vs %.7f (rel %.2e), worst grad %s rel %.2e (abs "
      "%.2e)\n",
      c.dp, c.tp, c.sp, c.moe, ranks[0].losses[0], m.ref_loss, m.loss_rel, d.tensor.c_str(), d.rel,
      d.abs);
  EXPECT_LE(m.loss_rel, kLossRelTol);
  EXPECT_LE(d.rel, kGradRelTol) << "worst tensor " << d.tensor;
  if (c.dp == 1) {  // with dp > 1 each replica's aux uses its own P_i (only the mean matches)
    EXPECT_NEAR(ranks[0].aux, m.ref_aux, 1e-5 * std::max(1.0f, std::abs(m.ref_aux)));
  }
}

INSTANTIATE_TEST_SUITE_P(Grid, TensorParallelMatch,
                         ::testing::Values(Case{1, false, false}, Case{2, false, false},
                                           Case{4, false, false}, Case{2, true, false},
                                           Case{4, true, false}, Case{1, false, true},
                                           Case{2, false, true}, Case{4, false, true},
                                           Case{2, true, true}, Case{4, true, true},
                                           Case{1, false, true, 2}, Case{2, false, true, 2},
                                           Case{2, true, true, 2}),
                         case_name);

class TensorParallelInit : public ::testing::TestWithParam<Case> {};

TEST_P(TensorParallelInit, GatheredInitIsBitIdentical) {
  const Case c = GetParam();
  const model::GPTConfig config = testing::small_config(c.moe);
  const model::GPT<float> ref(config, 1234);
  const std::vector<RankResult> ranks = testing::run_tp(
      config, testing::make_batch(config, kB, kT, 7), testing::run_spec(c.tp, c.sp, 0));
  std::string mismatch;
  const std::vector<float> params = testing::gather(ref.table(), ranks, false, &mismatch);
  EXPECT_EQ(mismatch, "");
  ASSERT_EQ(params.size(), ref.params().size());
  EXPECT_EQ(std::memcmp(params.data(), ref.params().data(), params.size() * sizeof(float)), 0);
  for (const RankResult& r : ranks) {
    for (const ShardSpec& s : r.shards) {
      EXPECT_EQ(s.tp_replicated, s.split_dim < 0) << s.name;
      EXPECT_EQ(s.numel, shape_numel(s.local_shape)) << s.name;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Grid, TensorParallelInit,
                         ::testing::Values(Case{2, false, false}, Case{4, false, true},
                                           Case{4, true, true}),
                         case_name);

// Two runs give the same bits: losses, gradients and virtual end time.
TEST(TensorParallel, BitIdenticalRunToRun) {
  for (bool sp : {false, true}) {
    const model::GPTConfig config = testing::small_config(true);
    const Batch batch = testing::make_batch(config, kB, kT, 3);
    const RunSpec spec = testing::run_spec(4, sp);
    const auto a = testing::run_tp(config, batch, spec);
    const auto b = testing::run_tp(config, batch, spec);
    for (size_t r = 0; r < a.size(); ++r) {
      EXPECT_EQ(std::memcmp(&a[r].losses[0], &b[r].losses[0], sizeof(float)), 0) << "sp=" << sp;
      ASSERT_EQ(a[r].grads.size(), b[r].grads.size());
      EXPECT_EQ(
          std::memcmp(a[r].grads.data(), b[r].grads.data(), a[r].grads.size() * sizeof(float)), 0)
          << "sp=" << sp << " rank " << r;
      EXPECT_EQ(a[r].end_time, b[r].end_time) << "virtual time differs, sp=" << sp;
    }
  }
}

// Gradient accumulation: two forward/backward passes without zero_grad give
// twice the gradients (with SP this checks the staged replicated gradients).
TEST(TensorParallel, AccumulatesOverBackwards) {
  const model::GPTConfig config = testing::small_config(true);
  const Batch batch = testing::make_batch(config, kB, kT, 5);
  const auto once = testing::run_tp(config, batch, testing::run_spec(2, true, 1));
  const auto twice = testing::run_tp(config, batch, testing::run_spec(2, true, 2));
  ASSERT_EQ(once.size(), twice.size());
  for (size_t r = 0; r < once.size(); ++r) {
    std::vector<float> doubled(once[r].grads.size());
    for (size_t i = 0; i < doubled.size(); ++i) doubled[i] = 2.0f * once[r].grads[i];  // exact in fp32
    // Tolerance: 1e-6 of the largest |2 g1| (fp32 accumulation order).
    const double scale = shardlab::testing::max_abs_finite(doubled);
    const ::testing::AssertionResult close = shardlab::testing::all_close(twice[r].grads, doubled, 1e-6 * scale);
    std::printf("  accumulate rank %zu: g2 vs 2 g1: %s (max |2 g1| %.2e)\n", r, close.message(), scale);
    EXPECT_TRUE(close) << "rank " << r;
  }
}

// Saved activations per rank shrink with TP (sharded qkv, attention, MLP)
// and again with SP (LayerNorm / residual rows split); printed for the record.
TEST(TensorParallel, ActivationsShrinkWithTpAndSp) {
  const model::GPTConfig config = testing::small_config(false);
  const Batch batch = testing::make_batch(config, kB, kT, 9);
  const int64_t tp1 =
      testing::run_tp(config, batch, testing::run_spec(1, false))[0].peak_activations;
  const int64_t tp4 =
      testing::run_tp(config, batch, testing::run_spec(4, false))[0].peak_activations;
  const int64_t tp4_sp =
      testing::run_tp(config, batch, testing::run_spec(4, true))[0].peak_activations;
  std::printf(
      "  peak saved activation elements per rank: tp1 %lld, tp4 %lld (%.2f), tp4+sp %lld (%.2f)\n",
      static_cast<long long>(tp1), static_cast<long long>(tp4), double(tp4) / tp1,
      static_cast<long long>(tp4_sp), double(tp4_sp) / tp1);
  EXPECT_LT(tp4, tp1);
  EXPECT_LT(tp4_sp, tp4);
}

// Megatron-LM's vocab_parallel_cross_entropy as it ran, by hand (embedding.h):
// over N rows of Vl bf16 logits, the cast to fp32 (2 + 4 B per logit), max
// (4), subtract in place (4 + 4), exp in place (4 + 4), sum (4), divide in
// place (4 + 4): 38 B per logit; backward, the softmax times dloss in place
// (4 + 4) and the cast back (4 + 2): 14 B. 4 B per row each way. In fp32 the
// casts are gone: 32 and 8 B. N = 6, Vl = 7: 42 logits.
TEST(TensorParallel, CrossEntropyIsChargedAsMegatronsFp32Kernels) {
  const OpCost f16 = vocab_parallel_cross_entropy_forward_cost(6, 7, 2);
  const OpCost b16 = vocab_parallel_cross_entropy_backward_cost(6, 7, 2);
  EXPECT_EQ(f16.bytes, 38.0 * 42 + 4 * 6);  // 1620
  EXPECT_EQ(b16.bytes, 14.0 * 42 + 4 * 6);  // 612
  EXPECT_EQ(f16.bytes + b16.bytes - 8 * 6, 52.0 * 42);
  EXPECT_EQ(vocab_parallel_cross_entropy_forward_cost(6, 7, 4).bytes, 32.0 * 42 + 4 * 6);
  EXPECT_EQ(vocab_parallel_cross_entropy_backward_cost(6, 7, 4).bytes, 8.0 * 42 + 4 * 6);
  EXPECT_EQ(f16.flops, 4.0 * 42);
  EXPECT_EQ(b16.flops, 2.0 * 42);
  EXPECT_EQ(f16.op_class, OpClass::kElementwise);
}

TEST(TensorParallel, ConstraintErrors) {
  auto message = [](const model::GPTConfig& c, int tp, bool sp) -> std::string {
    try {
      check_tensor_parallel(c, tp, sp);
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "";
  };
  model::GPTConfig c = testing::small_config(false);
  EXPECT_EQ(message(c, 4, true), "");
  EXPECT_EQ(message(c, 3, false),
            "`tp` 3: must divide `n_head` 4 (attention heads are split over TP ranks)");
  c.vocab_size = 66;
  EXPECT_EQ(message(c, 4, false),
            "`tp` 4: must divide `vocab_size` 66 (the vocabulary is split over TP ranks; "
            "`make_vocab_size_divisible_by` N pads it)");
  c = testing::small_config(false);
  c.n_head = 8;
  c.block_size = 12;
  EXPECT_EQ(message(c, 8, false), "");
  EXPECT_EQ(message(c, 8, true),
            "`tp` 8: must divide `block_size` 12 with `sp` (sequences are split over TP ranks)");
  EXPECT_NE(message(c, 0, false), "");
  // The constructor checks before any work; a run reports it as the user's error.
  ClusterOptions opts;
  opts.world_size = 2;
  HardwareProfile p = load_profile("a100-nvlink");
  Cluster cluster(p, opts);
  model::GPTConfig bad = testing::small_config(false);
  bad.n_head = 3;
  bad.n_embd = 33;
  try {
    cluster.run([&](Device& dev) {
      const collectives::ProcessGroup world = collectives::ProcessGroup::world(dev);
      ShardedGPT m(bad, 1, dev, {&world});
    });
    ADD_FAILURE() << "expected a ConfigError";
  } catch (const RunError& e) {
    EXPECT_TRUE(e.input_error());
    EXPECT_NE(std::string(e.what()).find("must divide `n_head` 3"), std::string::npos) << e.what();
  }
}

// A sequence length that SP cannot split is a ConfigError at forward().
TEST(TensorParallel, SequenceParallelRejectsIndivisibleT) {
  const model::GPTConfig config = testing::small_config(false);
  const Batch batch = testing::make_batch(config, 1, 6, 1);
  ClusterOptions opts;
  opts.world_size = 4;
  Cluster cluster(load_profile("a100-nvlink"), opts);
  try {
    cluster.run([&](Device& dev) {
      const collectives::ProcessGroup world = collectives::ProcessGroup::world(dev);
      ShardedGPT m(config, 1, dev, {&world}, {.sequence_parallel = true});
      m.forward(batch.inputs.data(), batch.targets.data(), 1, 6);
    });
    ADD_FAILURE() << "expected a ConfigError";
  } catch (const RunError& e) {
    EXPECT_TRUE(e.input_error());
    EXPECT_NE(std::string(e.what()).find("must be divisible by `tp` 4 with `sp`"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace shardlab::parallel
