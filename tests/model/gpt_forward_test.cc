// The model's forward against the independent naive loops of naive_gpt.cc,
// for the dense and the MoE model, in float (training precision) and double.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "model/gpt.h"
#include "naive_gpt.h"
#include "runtime/errors.h"
#include "test_models.h"

namespace shardlab::model {
namespace {

constexpr double kFloatTol = 1e-5;
constexpr double kDoubleTol = 1e-11;

GPTConfig forward_config() {
  GPTConfig c;
  c.n_layer = 2, c.n_head = 4, c.n_embd = 32, c.block_size = 16, c.vocab_size = 64;
  return c;
}

// Returns {loss relative diff, logits max abs diff / max |logit|}.
template <typename Real>
std::pair<double, double> compare(GPT<Real>& model, const testing::NaiveResult& ref,
                                  const std::vector<Token>& x, const std::vector<Token>& y, int B,
                                  int T) {
  const double loss = model.forward(x.data(), y.data(), B, T);
  double max_diff = 0, max_logit = 0;
  for (size_t i = 0; i < ref.logits.size(); ++i) {
    max_diff = std::max(max_diff, std::abs(model.logits()[i] - ref.logits[i]));
    max_logit = std::max(max_logit, std::abs(ref.logits[i]));
  }
  return {std::abs(loss - ref.loss) / std::abs(ref.loss), max_diff / max_logit};
}

void check_forward(const GPTConfig& config, const char* what, int B, int T) {
  GPT<double> dm(config, 1);
  testing::randomize_params(dm, 2, 0.15);
  // Round to float so both models hold exactly the same weights.
  GPT<float> fm(config, 1);
  for (size_t i = 0; i < dm.params().size(); ++i) {
    fm.params()[i] = static_cast<float>(dm.params()[i]);
    dm.params()[i] = fm.params()[i];
  }
  const auto x = testing::random_tokens(3, B * T, config.vocab_size);
  const auto y = testing::random_tokens(4, B * T, config.vocab_size);
  auto lookup = [&](const std::string& name) { return dm.param(name).data(); };
  const testing::NaiveResult ref = testing::naive_gpt_forward(config, lookup, x, y, B, T);
  const auto [fl, flog] = compare(fm, ref, x, y, B, T);
  const auto [dl, dlog] = compare(dm, ref, x, y, B, T);
  std::printf(
      "[forward] %-26s naive loss %.6f (aux %.4f): float rel diff loss %.2e logits %.2e "
      "(tol %.0e); double %.2e / %.2e (tol %.0e)\n",
      what, ref.loss, ref.aux, fl, flog, kFloatTol, dl, dlog, kDoubleTol);
  EXPECT_LE(fl, kFloatTol);
  EXPECT_LE(flog, kFloatTol);
  EXPECT_LE(dl, kDoubleTol);
  EXPECT_LE(dlog, kDoubleTol);
  if (config.is_moe()) {
    EXPECT_NEAR(dm.aux_loss(), ref.aux, 1e-12);
  }
}

TEST(ModelForward, DenseMatchesNaiveLoops) { check_forward(forward_config(), "dense", 3, 16); }

TEST(ModelForward, ShorterSequenceMatchesNaiveLoops) {
  check_forward(forward_config(), "dense, T < block_size", 2, 11);
}

TEST(ModelForward, MoEMatchesNaiveLoops) {
  GPTConfig c = forward_config();
  c.n_expert = 4, c.top_k = 2, c.moe_every = 2, c.aux_coef = 0.01;
  check_forward(c, "moe E4 K2", 3, 16);
}

TEST(ModelForward, MoEWithCapacityMatchesNaiveLoops) {
  GPTConfig c = forward_config();
  c.n_expert = 4, c.top_k = 1, c.capacity_factor = 1.0, c.aux_coef = 0.05;
  check_forward(c, "moe E4 K1 cap 1.0", 3, 16);
}

TEST(ModelForward, InitialLossIsNearLogVocab) {
  GPT<float> model(preset("tiny"), 1337);
  const auto x = testing::random_tokens(5, 8 * 64, 512), y = testing::random_tokens(6, 8 * 64, 512);
  const float loss = model.forward(x.data(), y.data(), 8, 64);
  std::printf("[forward] tiny initial loss %.4f, log(512) = %.4f\n", loss, std::log(512.0));
  EXPECT_NEAR(loss, std::log(512.0), 0.05);
}

TEST(ModelForward, BadInputsAreClearErrors) {
  GPT<float> model(preset("nano"), 1);
  std::vector<Token> x(40, 1);
  EXPECT_THROW(model.forward(x.data(), x.data(), 1, 33), ConfigError);  // T > block_size
  x[3] = 256;
  EXPECT_THROW(model.forward(x.data(), x.data(), 1, 8), ConfigError);  // token >= vocab
  try {
    model.forward(x.data(), nullptr, 1, 8);
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("vocabulary"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace shardlab::model
