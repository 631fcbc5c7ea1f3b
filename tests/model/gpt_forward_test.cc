// The model's forward against the independent naive loops of naive_gpt.cc,
// for the dense and the MoE model, in float (training precision) and double.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>

#include "model/gpt.h"
#include "naive_gpt.h"
#include "runtime/errors.h"
#include "support/compare.h"
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

// Loss and logits of `model` against the naive loops: |loss - ref| / |ref| <= tol
// and max |logit - ref| <= tol · max |ref logit| (every logit finite). Prints both.
template <typename Real>
void expect_matches(GPT<Real>& model, const testing::NaiveResult& ref, const std::vector<Token>& x,
                    const std::vector<Token>& y, int B, int T, double tol, const std::string& what) {
  const double loss = model.forward(x.data(), y.data(), B, T);
  const double loss_rel = std::abs(loss - ref.loss) / std::abs(ref.loss);
  const double logit_tol = tol * shardlab::testing::max_abs_finite(ref.logits);
  const auto close = shardlab::testing::all_close(model.logits(), ref.logits, logit_tol);
  std::printf("[forward] %-34s loss %.6f vs naive %.6f: rel diff %.2e (tol %.0e); logits %s\n",
              what.c_str(), loss, ref.loss, loss_rel, tol, close.message());
  EXPECT_LE(loss_rel, tol) << what << ": loss " << loss << " vs naive " << ref.loss;  // NaN fails
  EXPECT_TRUE(close) << what << " logits";
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
  const testing::NaiveResult ref = config.is_llama() ? testing::naive_llama_forward(config, lookup, x, y, B, T)
                                                     : testing::naive_gpt_forward(config, lookup, x, y, B, T);
  ASSERT_EQ(ref.logits.size(), static_cast<size_t>(B) * T * config.vocab_size);
  expect_matches(fm, ref, x, y, B, T, kFloatTol, std::string(what) + " (float)");
  expect_matches(dm, ref, x, y, B, T, kDoubleTol, std::string(what) + " (double)");
  if (config.is_moe()) {
    std::printf("[forward] %-34s aux %.15f vs naive %.15f (tol 1e-12)\n", what, dm.aux_loss(), ref.aux);
    EXPECT_NEAR(dm.aux_loss(), ref.aux, 1e-12);
    EXPECT_GT(ref.aux, 0);
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

// The llama family against Hugging Face's forward in plain loops
// (naive_llama_forward): multi-head, GQA (4 query heads on 2 K/V heads) and
// heads of their own size (head_dim 12 on n_embd 32: q_proj 48 x 32,
// o_proj 32 x 48, as Qwen3's 32 heads of 128 on 2048), tied and untied.
GPTConfig llama_forward_config() {
  GPTConfig c = forward_config();
  c.family = Family::kLlama;
  c.rope_theta = 500;  // a base that turns the short positions visibly
  c.n_ffn = 40;
  return c;
}

TEST(ModelForward, LlamaMatchesNaiveLoops) { check_forward(llama_forward_config(), "llama", 3, 16); }

TEST(ModelForward, LlamaGqaMatchesNaiveLoops) {
  GPTConfig c = llama_forward_config();
  c.n_kv_head = 2;
  c.tie_embeddings = true;
  check_forward(c, "llama gqa 4/2, tied", 2, 16);
}

TEST(ModelForward, LlamaHeadDimApartFromEmbdMatchesNaiveLoops) {
  GPTConfig c = llama_forward_config();
  c.n_kv_head = 2;
  c.head_dim = 12;
  check_forward(c, "llama head_dim 12 (4 x 12 on 32)", 3, 16);
  c.head_dim = 4;  // narrower than n_embd / n_head
  check_forward(c, "llama head_dim 4 (4 x 4 on 32)", 2, 11);
}

// Qwen3's attention: QK-norm (an RMSNorm of head_dim features over each
// head of q and of k, its own weights, before RoPE) on heads of their own size.
TEST(ModelForward, LlamaQkNormMatchesNaiveLoops) {
  GPTConfig c = llama_forward_config();
  c.n_kv_head = 2;
  c.head_dim = 12;
  c.qk_norm = true;
  c.norm_eps = 1e-6;
  check_forward(c, "llama qk_norm, head_dim 12", 3, 16);
}

// DeepSeek-V3's multi-head latent attention (naive_llama_forward's MLA:
// Hugging Face's DeepseekV3Attention): q's latent of 12 and k/v's of 10, 4
// heads whose scores have 6 + 4 features (4 rotated, the key's shared) and
// values 8 -- narrower than the scores', as DeepSeek-V3's 128 of 192; then
// q projected straight from the hidden state (q_lora_rank 0, DeepSeek-V2-Lite).
TEST(ModelForward, LlamaMlaMatchesNaiveLoops) {
  GPTConfig c = llama_forward_config();
  c.head_dim = 6;
  c.q_lora_rank = 12, c.kv_lora_rank = 10, c.qk_rope_head_dim = 4, c.v_head_dim = 8;
  check_forward(c, "llama mla (q 12, kv 10, 6+4, v 8)", 3, 16);
  c.q_lora_rank = 0, c.v_head_dim = 0;  // v as wide as the unrotated part (6)
  check_forward(c, "llama mla (q_proj, v 6)", 2, 11);
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
    FAIL() << "a token >= vocab_size without targets was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("vocabulary"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace shardlab::model
