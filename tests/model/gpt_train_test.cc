// The pieces compose: a few AdamW steps (nanoGPT decay groups) overfit one
// batch, bit-identically across two independent runs.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>

#include "model/gpt.h"
#include "model/kernels.h"
#include "test_models.h"

namespace shardlab::model {
namespace {

struct Run {
  std::vector<float> losses;
  std::vector<float> params;
};

Run train(const GPTConfig& config, int steps) {
  GPT<float> model(config, 1337);
  Buffer<float> m(model.table().numel(), 0), v(model.table().numel(), 0);
  const int B = 4, T = config.block_size;
  const auto x = testing::random_tokens(10, B * T, config.vocab_size);
  const auto y = testing::random_tokens(11, B * T, config.vocab_size);
  AdamWHyper hyper;
  hyper.lr = 3e-3;
  Run run;
  for (int step = 1; step <= steps; ++step) {
    model.zero_grad();
    run.losses.push_back(model.forward(x.data(), y.data(), B, T));
    model.backward();
    for (const ParamSpec& s : model.table().specs()) {
      adamw_update(model.params().data() + s.offset, m.data() + s.offset, v.data() + s.offset,
                   model.grads().data() + s.offset, s.numel, hyper,
                   s.decay() ? hyper.weight_decay : 0.0, step);
    }
  }
  run.params.assign(model.params().begin(), model.params().end());
  return run;
}

void check_training(const GPTConfig& config, const char* what) {
  const Run a = train(config, 30);
  std::vector<char> churn(12345);  // different heap history for the second run
  const Run b = train(config, 30);
  std::printf(
      "[train] %-10s loss %.4f -> %.4f over 30 AdamW steps on one batch; rerun bit-identical: %s\n",
      what, a.losses.front(), a.losses.back(),
      a.losses == b.losses && a.params == b.params ? "yes" : "NO");
  EXPECT_LT(a.losses.back(), 0.5f * a.losses.front());
  EXPECT_EQ(0, std::memcmp(a.losses.data(), b.losses.data(), a.losses.size() * sizeof(float)));
  EXPECT_EQ(a.params, b.params);
}

TEST(ModelTrain, DenseOverfitsOneBatchDeterministically) {
  GPTConfig c = preset("nano");
  c.block_size = 16;
  check_training(c, "dense");
}

TEST(ModelTrain, MoEOverfitsOneBatchDeterministically) {
  GPTConfig c = preset("nano");
  c.block_size = 16, c.n_expert = 4, c.top_k = 2, c.capacity_factor = 1.25;
  check_training(c, "moe");
}

}  // namespace
}  // namespace shardlab::model
