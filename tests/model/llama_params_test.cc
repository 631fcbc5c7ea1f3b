// The llama family's parameter table: Hugging Face's names and [out, in]
// layouts, the closed-form count against a hand count and against the
// published sizes of the Llama 2 / Llama 3 presets, and validate()'s errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>

#include "model/config.h"
#include "model/params.h"
#include "runtime/errors.h"

namespace shardlab::model {
namespace {

GPTConfig small_llama() {
  GPTConfig c;
  c.family = Family::kLlama;
  c.n_layer = 2, c.n_head = 2, c.n_kv_head = 1, c.n_embd = 8, c.n_ffn = 12, c.vocab_size = 10;
  c.block_size = 4;
  return c;
}

// 2 blocks, C 8, 2 heads of 4, 1 K/V head (4 features), F 12, vocab 10, by hand:
//   embed_tokens 10x8 = 80, lm_head 10x8 = 80, model.norm 8
//   per block: input_layernorm 8, q 8x8 = 64, k 4x8 = 32, v 4x8 = 32, o 8x8 = 64,
//              post_attention_layernorm 8, gate 12x8 = 96, up 12x8 = 96, down 8x12 = 96 -> 496
//   total 80 + 80 + 8 + 2 x 496 = 1160; tied (no lm_head) 1080. No seq-sized table.
TEST(LlamaParams, HandCountNamesAndLayouts) {
  GPTConfig c = small_llama();
  EXPECT_DOUBLE_EQ(count_params(c), 1160.0);
  const ParamTable t(c);
  EXPECT_EQ(t.numel(), 1160);
  EXPECT_EQ(t.at("model.embed_tokens.weight").shape, (Shape{10, 8}));
  EXPECT_EQ(t.at("lm_head.weight").shape, (Shape{10, 8}));
  EXPECT_EQ(t.at("model.norm.weight").shape, (Shape{8}));
  EXPECT_EQ(t.at("model.layers.1.input_layernorm.weight").shape, (Shape{8}));
  EXPECT_EQ(t.at("model.layers.1.post_attention_layernorm.weight").shape, (Shape{8}));
  EXPECT_EQ(t.at("model.layers.0.self_attn.q_proj.weight").shape, (Shape{8, 8}));
  EXPECT_EQ(t.at("model.layers.0.self_attn.k_proj.weight").shape, (Shape{4, 8}));
  EXPECT_EQ(t.at("model.layers.0.self_attn.v_proj.weight").shape, (Shape{4, 8}));
  EXPECT_EQ(t.at("model.layers.0.self_attn.o_proj.weight").shape, (Shape{8, 8}));
  EXPECT_EQ(t.at("model.layers.1.mlp.gate_proj.weight").shape, (Shape{12, 8}));
  EXPECT_EQ(t.at("model.layers.1.mlp.up_proj.weight").shape, (Shape{12, 8}));
  EXPECT_EQ(t.at("model.layers.1.mlp.down_proj.weight").shape, (Shape{8, 12}));
  // No biases, no position table.
  for (const ParamSpec& s : t.specs()) {
    EXPECT_EQ(s.name.find("bias"), std::string::npos) << s.name;
    EXPECT_NE(s.role, ParamRole::kPositionEmbedding) << s.name;
  }
  // q, k, v and gate, up are adjacent: one fused GEMM each.
  const ParamSpec &q = t.at("model.layers.1.self_attn.q_proj.weight"),
                  &k = t.at("model.layers.1.self_attn.k_proj.weight"),
                  &v = t.at("model.layers.1.self_attn.v_proj.weight");
  EXPECT_EQ(k.offset, q.offset + q.numel);
  EXPECT_EQ(v.offset, k.offset + k.numel);
  EXPECT_EQ(t.at("model.layers.1.mlp.up_proj.weight").offset,
            t.at("model.layers.1.mlp.gate_proj.weight").offset + 96);
  EXPECT_EQ(k.role, ParamRole::kKvWeight);
  EXPECT_EQ(t.at("lm_head.weight").role, ParamRole::kLmHead);
  EXPECT_TRUE(t.at("model.norm.weight").is_final_norm());
  c.tie_embeddings = true;
  EXPECT_DOUBLE_EQ(count_params(c), 1080.0);
  EXPECT_EQ(ParamTable(c).numel(), 1080);
  EXPECT_EQ(ParamTable(c).find("lm_head.weight"), nullptr);
  // The gpt family untied gets its own lm_head too: one more V x C.
  GPTConfig g;
  g.tie_embeddings = false;
  EXPECT_DOUBLE_EQ(count_params(g), count_params(GPTConfig{}) + 512.0 * 128);
  EXPECT_EQ(ParamTable(g).numel(), static_cast<int64_t>(count_params(g)));
}

TEST(LlamaParams, InitFollowsHuggingFace) {
  const ParamTable t(small_llama());
  std::vector<double> p(t.numel());
  t.init_all(7, p.data());
  const ParamSpec& norm = t.at("model.layers.0.input_layernorm.weight");
  for (int64_t i = 0; i < norm.numel; ++i) EXPECT_EQ(p[norm.offset + i], 1.0);
  for (const char* name : {"model.layers.0.self_attn.o_proj.weight", "model.layers.0.mlp.down_proj.weight"})
    EXPECT_EQ(t.at(name).std, 0.02) << name;  // not nanoGPT's scaled c_proj
}

void expect_error(GPTConfig c, const std::string& needle) {
  try {
    c.validate();
    ADD_FAILURE() << "expected ConfigError naming " << needle;
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(LlamaParams, ValidateNamesTheField) {
  GPTConfig c = small_llama();
  EXPECT_NO_THROW(c.validate());
  c.n_head = 4, c.n_kv_head = 3;
  expect_error(c, "`n_kv_head` 3 must divide `n_head` 4");
  c = small_llama();
  c.n_embd = 6, c.n_head = 2;  // head size 3
  expect_error(c, "odd head size");
  c = small_llama();
  c.rope_theta = 0.5;
  expect_error(c, "`rope_theta`");
  c = small_llama();
  c.norm_eps = 0;
  expect_error(c, "`norm_eps`");
  GPTConfig g;
  g.n_kv_head = 2;
  expect_error(g, "needs `family` llama");
}

// Each preset's count (count_params, at its unpadded released vocabulary)
// rounds to the published figure at its printed precision: |diff| <= half a
// unit of the last printed digit (6.74B holds [6.735, 6.745) B).
TEST(LlamaPresets, ParameterCountsMatchThePublishedFigures) {
  int checked = 0;
  for (const PresetInfo& p : presets()) {
    if (!p.config.is_llama() || p.published_params == 0 || p.config.is_moe()) continue;  // MoE: moe_presets_test
    ++checked;
    const GPTConfig& c = p.config;
    ASSERT_NO_THROW(c.validate()) << p.name;
    EXPECT_FALSE(c.tied()) << p.name;
    const double n = count_params(c), diff = n - p.published_params, tol = p.published_resolution / 2;
    std::printf("%-12s %-58s computed %.5e, published %.4e, diff %+.3e, tolerance %.2e\n", p.name.c_str(),
                p.source.c_str(), n, p.published_params, diff, tol);
    EXPECT_LE(std::abs(diff), tol) << p.name;
  }
  EXPECT_EQ(checked, 6);
}

TEST(LlamaPresets, ShapesAsPublished) {
  // Llama 3 405B: 126 layers, d 16384, FFN 53248, 128 heads, 8 KV heads, theta 500,000.
  const GPTConfig g = preset("llama3-405b");
  EXPECT_TRUE(g.is_llama());
  EXPECT_EQ(g.n_layer, 126);
  EXPECT_EQ(g.n_embd, 16384);
  EXPECT_EQ(g.ffn_hidden(), 53248);
  EXPECT_EQ(g.n_head, 128);
  EXPECT_EQ(g.kv_heads(), 8);
  EXPECT_EQ(g.vocab_size, 128256);
  EXPECT_EQ(g.rope_theta, 500000);
  EXPECT_EQ(preset("llama2-7b").kv_heads(), 32);  // multi-head
  EXPECT_EQ(preset("llama2-70b").kv_heads(), 8);
  EXPECT_EQ(preset("llama2-13b").block_size, 4096);
  // tiny-llama: tiny's size class, kv heads 2 < 4 (tp 4 replicates K/V).
  const GPTConfig t = preset("tiny-llama"), tiny = preset("tiny");
  EXPECT_EQ(t.n_layer, tiny.n_layer);
  EXPECT_EQ(t.n_embd, tiny.n_embd);
  EXPECT_EQ(t.n_head, 4);
  EXPECT_EQ(t.kv_heads(), 2);
  EXPECT_EQ(t.vocab_size, tiny.vocab_size);
  EXPECT_EQ(t.block_size, tiny.block_size);
  EXPECT_EQ(t.ffn_hidden() % 32, 0);
  EXPECT_GE(t.ffn_hidden(), 2 * 4 * 128 / 3);
}

}  // namespace
}  // namespace shardlab::model
