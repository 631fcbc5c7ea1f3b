// The llama family's MoE: DeepSeek-V3's Hugging Face names and [out, in]
// layouts, the closed-form total and active counts against a hand count,
// and the MoE presets against their published parameter counts.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>

#include "model/config.h"
#include "model/params.h"

namespace shardlab::model {
namespace {

// 2 blocks of C 8 (2 heads, 1 K/V head of 4), vocab 10, untied; block 0
// dense (F 12), block 1 with 3 routed experts of 5 (top-2) and 1 shared of 5.
GPTConfig small_llama_moe() {
  GPTConfig c;
  c.family = Family::kLlama;
  c.n_layer = 2, c.n_head = 2, c.n_kv_head = 1, c.n_embd = 8, c.n_ffn = 12, c.vocab_size = 10;
  c.block_size = 4;
  c.n_expert = 3, c.top_k = 2, c.n_moe_ffn = 5, c.n_shared_expert = 1, c.moe_first_dense = 1;
  return c;
}

// By hand: embed 80 + lm_head 80 + model.norm 8 = 168;
//   block 0: norms 16 + q 64 + k 32 + v 32 + o 64 + gate/up/down 3 x 96 = 496;
//   block 1: norms and attention 208 + router 3x8 = 24 + 3 experts x 3 x 40 = 360
//            + shared 3 x 40 = 120 -> 712.   Total 168 + 496 + 712 = 1376.
// Active: one routed expert fewer (120): 1256.
TEST(LlamaMoeParams, HandCountNamesAndLayouts) {
  const GPTConfig c = small_llama_moe();
  EXPECT_DOUBLE_EQ(count_params(c), 1376.0);
  EXPECT_DOUBLE_EQ(count_active_params(c), 1256.0);
  const ParamTable t(c);
  EXPECT_EQ(t.numel(), 1376);
  EXPECT_EQ(t.at("model.layers.0.mlp.gate_proj.weight").shape, (Shape{12, 8}));
  EXPECT_EQ(t.find("model.layers.0.mlp.gate.weight"), nullptr);
  const ParamSpec& router = t.at("model.layers.1.mlp.gate.weight");
  EXPECT_EQ(router.shape, (Shape{3, 8}));
  EXPECT_EQ(router.role, ParamRole::kRouter);
  EXPECT_FALSE(router.is_expert());
  EXPECT_EQ(t.find("model.layers.1.mlp.gate_proj.weight"), nullptr);
  for (int e = 0; e < 3; ++e) {
    const std::string p = "model.layers.1.mlp.experts." + std::to_string(e) + ".";
    const ParamSpec &gate = t.at(p + "gate_proj.weight"), &up = t.at(p + "up_proj.weight"),
                    &down = t.at(p + "down_proj.weight");
    EXPECT_EQ(gate.shape, (Shape{5, 8}));
    EXPECT_EQ(down.shape, (Shape{8, 5}));
    EXPECT_EQ(up.offset, gate.offset + 40) << "gate and up adjacent: one fused GEMM";
    for (const ParamSpec* s : {&gate, &up, &down}) EXPECT_EQ(s->expert, e) << s->name;
  }
  const ParamSpec& shared = t.at("model.layers.1.mlp.shared_experts.up_proj.weight");
  EXPECT_EQ(shared.shape, (Shape{5, 8}));
  EXPECT_FALSE(shared.is_expert()) << "shared experts are reduced like the dense MLP";
  for (const ParamSpec& s : t.specs()) EXPECT_EQ(s.name.find("bias"), std::string::npos) << s.name;
}

// Aux-loss-free balancing adds one (E) bias per MoE block, after the router,
// zeros at init, 1-D (no weight decay): 1376 + 3 = 1379; a token sees the
// whole router, so active gains the same 3 (1259). Dense block 0 has none.
TEST(LlamaMoeParams, RouterBiasIsOneVectorPerMoeBlock) {
  GPTConfig c = small_llama_moe();
  c.router_bias_rate = 0.001;
  EXPECT_DOUBLE_EQ(count_params(c), 1379.0);
  EXPECT_DOUBLE_EQ(count_active_params(c), 1259.0);
  const ParamTable t(c);
  EXPECT_EQ(t.numel(), 1379);
  const ParamSpec& b = t.at("model.layers.1.mlp.gate.e_score_correction_bias");
  EXPECT_EQ(b.shape, (Shape{3}));
  EXPECT_EQ(b.role, ParamRole::kRouterBias);
  EXPECT_EQ(b.offset, t.at("model.layers.1.mlp.gate.weight").offset + 24);
  EXPECT_EQ(b.init, InitKind::kZeros);
  EXPECT_FALSE(b.decay());
  EXPECT_EQ(t.find("model.layers.0.mlp.gate.e_score_correction_bias"), nullptr);
  c.family = Family::kGpt, c.n_kv_head = 0;
  EXPECT_NE(ParamTable(c).find("transformer.h.1.mlp.router.e_score_correction_bias"), nullptr);
}

// Published counts: |computed - published| <= half a unit of the last printed digit.
void expect_published(const char* name, double computed, double published, double resolution) {
  const double diff = computed - published;
  std::printf("%-13s computed %.5e, published %.4e, diff %+.3e, tolerance %.2e\n", name, computed, published, diff,
              resolution / 2);
  EXPECT_LE(std::abs(diff), resolution / 2) << name;
}

// Mixtral 8x7B (model card: 46.7B total, 12.9B active, embedding and head included).
TEST(LlamaMoePresets, MixtralMatchesItsPublishedCounts) {
  const PresetInfo& p = preset_info("mixtral-8x7b");
  const GPTConfig& c = p.config;
  EXPECT_EQ(c.n_layer, 32);
  EXPECT_EQ(c.n_embd, 4096);
  EXPECT_EQ(c.kv_heads(), 8);
  EXPECT_EQ(c.moe_ffn_hidden(), 14336);
  EXPECT_EQ(c.n_expert, 8);
  EXPECT_EQ(c.top_k, 2);
  EXPECT_EQ(c.moe_layers(), 32);
  EXPECT_EQ(c.rope_theta, 1e6);
  EXPECT_EQ(p.published_params, 46.7e9);
  EXPECT_EQ(p.published_active, 12.9e9);
  expect_published("mixtral total", count_params(c), 46.7e9, 0.1e9);
  expect_published("mixtral active", count_active_params(c), 12.9e9, 0.1e9);
}

// DeepSeek-V3's MLA attention per block from its published shapes (C 7168,
// 128 heads): q_a 7168x1536 + its norm 1536 + q_b 1536 x 128·(128+64)
// + kv_a (with the shared rope key) 7168 x (512+64) + its norm 512
// + kv_b 512 x 128·(128+128) + o 128·128 x 7168 = 187,107,328.
double mla_per_block() {
  const double C = 7168, H = 128;
  return C * 1536 + 1536 + 1536 * H * 192 + C * 576 + 512 + 512 * H * 256 + H * 128 * C;
}

// 671B total (MTP excluded) and 37B active as published. DeepSeek's active
// count leaves out the input embedding (a lookup: 129280 x 7168 = 0.93B);
// with it the model's is 37.55B, not 37B.
TEST(LlamaMoePresets, DeepSeekV3MatchesWhatItModels) {
  const PresetInfo& p = preset_info("deepseek-v3");
  const GPTConfig& c = p.config;
  EXPECT_EQ(c.n_layer, 61);
  EXPECT_EQ(c.moe_first_dense, 3);
  EXPECT_EQ(c.ffn_hidden(), 18432);
  EXPECT_EQ(c.n_expert, 256);
  EXPECT_EQ(c.moe_ffn_hidden(), 2048);
  EXPECT_EQ(c.n_shared_expert, 1);
  EXPECT_EQ(c.top_k, 8);
  EXPECT_EQ(c.router, Router::kSigmoid);
  EXPECT_TRUE(c.moe_norm_topk);
  EXPECT_EQ(c.aux_coef, 0.0) << "aux-loss-free: no batch-wise balance loss";
  EXPECT_EQ(c.router_bias_rate, 0.001) << "the bias update speed of sec. 4.2";
  EXPECT_EQ(c.moe_groups, 8) << "node-limited routing: the released config's n_group";
  EXPECT_EQ(c.moe_group_top_k, 4) << "at most 4 nodes a token (sec. 2.1.2), topk_group";
  EXPECT_EQ(c.vocab_size, 129280);
  EXPECT_EQ(c.n_head, 128);
  EXPECT_EQ(c.kv_heads(), 128);
  EXPECT_TRUE(c.is_mla());
  EXPECT_EQ(c.q_lora_rank, 1536);
  EXPECT_EQ(c.kv_lora_rank, 512);
  EXPECT_EQ(c.qk_head_size(), 128 + 64);
  EXPECT_EQ(c.v_head_size(), 128);
  const double C = 7168;
  // One block's attention in the table, by hand: the MLA tensors and the two norms.
  const ParamTable t(c);
  double attn = 0;
  for (const ParamSpec& s : t.specs())
    if (s.layer == 5 && s.name.find("self_attn.") != std::string::npos) attn += double(s.numel);
  std::printf("MLA %.0f parameters per block (by hand %.0f)\n", attn, mla_per_block());
  EXPECT_EQ(attn, mla_per_block());
  expect_published("deepseek total", count_params(c), p.published_params, 1e9);
  expect_published("deepseek active", count_active_params(c) - 129280 * C, p.published_active, 1e9);
}

// tiny-moe: tiny-llama's size class and attention, shared and routed experts.
TEST(LlamaMoePresets, TinyMoeIsTinyLlamaWithExperts) {
  const GPTConfig t = preset("tiny-moe"), l = preset("tiny-llama");
  EXPECT_TRUE(t.is_llama());
  EXPECT_EQ(t.n_layer, l.n_layer);
  EXPECT_EQ(t.n_embd, l.n_embd);
  EXPECT_EQ(t.kv_heads(), 2);
  EXPECT_LT(t.kv_heads(), 4);
  EXPECT_GT(t.n_expert, 0);
  EXPECT_GT(t.n_shared_expert, 0);
  EXPECT_NO_THROW(t.validate());
  // By hand (C 128, V 512, untied): embed + lm_head + norm 131,200; 4 blocks
  // of attention (q, o 128², k, v 64 x 128) and norms 49,408 each; block 0's
  // SwiGLU 3 x 128 x 352 = 135,168; blocks 1-3: router 1,024 + 8 experts x
  // 3 x 128 x 64 = 196,608 + shared 24,576 each (active: 2 experts, 49,152).
  const double common = 131200 + 4 * 49408 + 135168;
  EXPECT_DOUBLE_EQ(count_params(t), common + 3 * (1024 + 196608 + 24576));
  EXPECT_DOUBLE_EQ(count_active_params(t), common + 3 * (1024 + 49152 + 24576));
  EXPECT_EQ(ParamTable(t).numel(), 1130624);
}

// Qwen3's MoE models: 30.5B total, 3.3B active; 235B and 22B (the technical
// report's Table 2, to its printed precision). By hand: per block q and o
// 2·C·(NH·128), k and v 2·C·(4·128), q_norm and k_norm 2·128, two RMSNorms
// 2·C, the router 128·C and 128 (active: 8) SwiGLU experts of 3·C·Fe; plus
// embed_tokens and lm_head 2·151936·C and the final norm C.
double qwen3(double L, double C, double NH, double Fe, double experts) {
  const double block = 2 * C * NH * 128 + 2 * C * 4 * 128 + 2 * 128 + 2 * C + 128 * C + experts * 3 * C * Fe;
  return L * block + 2 * 151936 * C + C;
}

TEST(LlamaMoePresets, Qwen3MatchesItsPublishedCounts) {
  const PresetInfo& small = preset_info("qwen3-30b-a3b");
  const GPTConfig& c = small.config;
  EXPECT_EQ(c.head_size(), 128);
  EXPECT_EQ(c.attn_width(), 4096);  // 32 heads of 128 on n_embd 2048
  EXPECT_TRUE(c.qk_norm);
  EXPECT_EQ(c.moe_layers(), 48);
  EXPECT_DOUBLE_EQ(count_params(c), qwen3(48, 2048, 32, 768, 128));
  EXPECT_DOUBLE_EQ(count_active_params(c), qwen3(48, 2048, 32, 768, 8));
  expect_published("qwen3-30b-a3b total", count_params(c), 30.5e9, 0.1e9);
  // 3.353B active, which the report prints as 3.3B: truncated, not rounded
  // (every tensor a token runs, embedding and head included, as Mixtral's 12.9B).
  const double active = count_active_params(c);
  std::printf("qwen3-30b-a3b active computed %.5e, published 3.3e9 (truncated: [3.3e9, 3.4e9))\n", active);
  EXPECT_GE(active, 3.3e9);
  EXPECT_LT(active, 3.4e9);
  const GPTConfig& big = preset("qwen3-235b-a22b");
  EXPECT_EQ(big.attn_width(), 8192);  // 64 heads of 128 on 4096
  EXPECT_DOUBLE_EQ(count_params(big), qwen3(94, 4096, 64, 1536, 128));
  EXPECT_DOUBLE_EQ(count_active_params(big), qwen3(94, 4096, 64, 1536, 8));
  expect_published("qwen3-235b-a22b total", count_params(big), 235e9, 1e9);
  expect_published("qwen3-235b-a22b active", count_active_params(big), 22e9, 1e9);
  EXPECT_EQ(ParamTable(c).numel(), int64_t(count_params(c)));
}

// The README's exact figures, from a hand formula (Python): Mixtral per
// block 2·4096² + 2·4096·1024 + 2·4096 norms + 8·4096 router + 8·3·4096·14336,
// plus 2·32000·4096 + 4096; DeepSeek-V3 likewise (MLA: mla_per_block).
TEST(LlamaMoePresets, ExactCountsAsTheReadmePrintsThem) {
  EXPECT_DOUBLE_EQ(count_params(preset("mixtral-8x7b")), 46702792704.0);
  EXPECT_DOUBLE_EQ(count_active_params(preset("mixtral-8x7b")), 12879925248.0);
  // + the aux-loss-free selection bias: 58 MoE blocks x 256 = 14,848 (active too).
  EXPECT_DOUBLE_EQ(count_params(preset("deepseek-v3")), 671026404352.0 + 14848.0);
  EXPECT_DOUBLE_EQ(count_active_params(preset("deepseek-v3")), 37552282624.0 + 14848.0);
}

}  // namespace
}  // namespace shardlab::model
