// InferEngine::step with a batch of sequences of different cached lengths
// and different numbers of new tokens (what a serving scheduler runs): each
// sequence's logits equal the unsharded full forward over that sequence,
// within the tolerance of generate_test.cc, at tp 1 and tp 2, dense and MoE
// (tp 2 × ep 2 for MoE).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <mutex>

#include "collectives/mesh.h"
#include "model/infer/engine.h"
#include "model/parallel/parallel_context.h"
#include "support/compare.h"
#include "tests/model/infer/infer_test_util.h"

namespace shardlab::infer {
namespace {

using model::Token;

constexpr double kLogitTol = 1e-4;

struct Case {
  bool moe;
  int tp, ep;
  bool mla = false;  // multi-head latent attention: a prefill and a decode in one step (cached_attention.h)
};

TEST(InferEngine, BatchedStepsOfMixedLengthsMatchTheFullForward) {
  for (const Case& k : {Case{false, 1, 1}, Case{false, 2, 1}, Case{true, 1, 1}, Case{true, 2, 2}, Case{false, 1, 1, true},
                        Case{false, 2, 1, true}}) {
    const model::GPTConfig c = k.mla ? testing::mla_config() : testing::small_config(k.moe);
    model::GPT<float> ref(c, 7);
    testing::perturb(ref);
    const model::SafetensorsFile init = testing::as_checkpoint(ref);
    const std::vector<Token> a = {5, 9, 1, 44, 7, 3}, b = {100, 2, 8, 61};
    // Step 1: prefill a[0..4) and b[0..1); step 2: a[4..6) and b[1..4) over the cache.
    std::vector<float> step1, step2;
    ClusterOptions co;
    co.world_size = k.tp * k.ep;
    Cluster cluster(load_profile("a100-nvlink"), co);
    std::mutex mu;
    const collectives::DeviceMesh mesh(collectives::MeshShape{k.tp, 1, k.ep, k.ep, 1});
    cluster.run([&](Device& dev) {
      parallel::ParallelContext ctx(mesh, dev.rank());
      InferEngine engine(c, 1, dev, {&ctx.group("tp"), k.ep > 1 ? &ctx.group("ep") : nullptr, {}, {}}, &init);
      const int sa = engine.cache().add_sequence(8), sb = engine.cache().add_sequence(8);
      const StepOutput o1 = engine.step({{sa, {a.begin(), a.begin() + 4}}, {sb, {b.begin(), b.begin() + 1}}});
      const StepOutput o2 = engine.step({{sa, {a.begin() + 4, a.end()}}, {sb, {b.begin() + 1, b.end()}}});
      EXPECT_GT(o2.end, o2.begin);
      EXPECT_EQ(o2.begin, o1.end);
      if (dev.rank() != 0) return;
      std::lock_guard<std::mutex> lock(mu);
      step1 = o1.logits;
      step2 = o2.logits;
    });
    const size_t V = size_t(c.vocab_size);
    ASSERT_EQ(step1.size(), 2 * V);
    ASSERT_EQ(step2.size(), 2 * V);
    const std::vector<std::pair<const float*, std::vector<Token>>> checks = {
        {step1.data(), {a.begin(), a.begin() + 4}},
        {step1.data() + V, {b.begin(), b.begin() + 1}},
        {step2.data(), a},
        {step2.data() + V, b}};
    std::vector<float> got_all, want_all;  // every checked row, end to end
    for (const auto& [got, seq] : checks) {
      const std::vector<float> want = testing::full_forward_last(ref, seq);
      got_all.insert(got_all.end(), got, got + want.size());
      want_all.insert(want_all.end(), want.begin(), want.end());
    }
    const auto close = shardlab::testing::all_close(got_all, want_all, kLogitTol);
    std::printf("%s tp %d ep %d: batched step logits, %s\n", k.mla ? "mla" : k.moe ? "moe" : "dense", k.tp, k.ep,
                close.message());
    EXPECT_TRUE(close);
  }
}

}  // namespace
}  // namespace shardlab::infer
