// The built-in model shapes: nanoGPT-sized toys and three published families.
//
// GPT-3 (Brown et al. 2020, "Language Models are Few-Shot Learners",
// Table 2.1): n_layers, d_model, n_heads (d_head = d_model / n_heads), context
// 2048, GPT-2's BPE vocabulary of 50257 tokens, padded the Megatron way by
// default (50304 at tp 1, 51200 at tp 8: the 51200 of Megatron's GPT-3 runs).
// Batch sizes are published in tokens: 0.5M = 256 x 2048 = 524,288, 1M = 512
// sequences, 2M = 1024, 3.2M = 1536 (3,145,728 tokens). Two rows of the
// table do not multiply out: 13B prints d_model 5140, which 40 heads of 128
// do not give (40 x 128 = 5120 is used), and 1.3B prints 24 heads of 128 for
// d_model 2048 (16 x 128 = 2048 is used; heads do not change the parameter
// count, which rounds to the published figure either way). The sparse
// (locally banded) attention layers of GPT-3 are not modeled: they change no
// parameter.
//
// Megatron-LM (Narayanan et al. 2021, "Efficient Large-Scale Language Model
// Training on GPU Clusters Using Megatron-LM", Table 1): heads, hidden size,
// layers and batch size (sequences) of its ten weak-scaling runs on Selene,
// vocab 51200 (already a multiple of 128 x tp for the tp up to 8 it uses),
// seq 2048.
//
// Llama 2 (Touvron et al. 2023, "Llama 2: Open Foundation and Fine-Tuned
// Chat Models", Table 1: sizes, context 4k, GQA for 70B; the dimensions,
// FFN widths and vocabulary of 32000 as in Meta's released configs) and
// Llama 3 (Dubey et al. 2024, "The Llama 3 Herd of Models", Table 3: layers,
// model and FFN dimension, heads, KV heads, RoPE theta 500,000; vocabulary
// 128,256 = the 128K tokenizer plus its 256 special tokens, as released).
// Every released Llama 2/3 model has its own lm_head (untied).
// Batches: Llama 2 trained on 4M-token batches (1024 x 4096); Llama 3 405B
// started at 4M tokens of 4096 and grew to 16M of 8192 (sec. 3.4.1): the
// presets keep 8192 and 4M tokens (512 sequences), a shape, not a schedule.
// Vocabularies are not padded (32000 and 128256 are multiples of 128).
//
// Mixtral 8x7B (Jiang et al. 2024, "Mixtral of Experts", Table 1 and the
// released config): Mistral 7B's blocks (32 x 4096, 32 heads over 8 K/V
// heads, vocab 32000, theta 1e6) with 8 SwiGLU experts of 14336, top-2,
// gates = softmax over the top-2 logits (softmax + norm_topk here). 46.7B
// parameters, 12.9B active per token (the paper's 47B / 13B; the model card's
// 46.7B / 12.9B, embedding and head included).
//
// DeepSeek-V3 (DeepSeek-AI 2024, "DeepSeek-V3 Technical Report", sec. 4.2
// and the released config): 61 blocks of 7168, the first 3 dense (FFN
// 18432), then 256 routed experts of 2048 and 1 shared, top-8, sigmoid
// scores, gates normalized over the top-8, vocab 129280, RMSNorm eps 1e-6.
// Multi-head latent attention (sec. 2.1.1): q's latent of rank 1536, k/v's
// of 512, 128 heads whose queries and keys have 128 + 64 rotated features
// (the key's rotated ones shared by the heads) and values 128 (187.1M
// parameters a block; tests/model/moe_presets_test.cc by hand). 671B
// parameters (the MTP module's 14B excluded), 37B active. NOT modeled: the
// routed scaling factor 2.5, YaRN's softmax scale (pre-training runs at 4K
// with plain RoPE) and the auxiliary sequence-wise balance loss.
// Node-limited routing is modeled: 8 groups of 32 experts, 4 kept
// (GPTConfig::moe_groups).
#include <string>

#include "model/config.h"
#include "runtime/errors.h"

namespace shardlab::model {
namespace {

GPTConfig shape(int layers, int heads, int embd, int seq, int vocab, int batch) {
  GPTConfig c;
  c.n_layer = layers, c.n_head = heads, c.n_embd = embd, c.block_size = seq, c.vocab_size = vocab;
  c.batch_size = batch;
  return c;
}

PresetInfo toy(std::string name, GPTConfig c) {
  return {std::move(name), c, 0, 0, false, "shardlab (nanoGPT-sized)"};
}

PresetInfo gpt3(std::string name, int layers, int embd, int heads, int batch, double params,
                double resolution) {
  return {std::move(name),
          shape(layers, heads, embd, 2048, 50257, batch),
          params,
          resolution,
          true,
          "Brown et al. 2020, Table 2.1"};
}

// Table 1 prints parameters in billions with one decimal.
PresetInfo megatron(std::string name, double billions, int heads, int hidden, int layers,
                    int batch) {
  return {std::move(name),
          shape(layers, heads, hidden, 2048, 51200, batch),
          billions * 1e9,
          0.1e9,
          true,
          "Narayanan et al. 2021, Table 1"};
}

// Parameter counts as the released checkpoints print them (Hugging Face's
// model cards: 6.74B, 13.0B, 69.0B; 8.03B, 70.6B, 405.9B), the papers round
// them to 7B ... 405B.
const char* const kLlama2 = "Touvron et al. 2023 (Llama 2), Table 1 + released config";
const char* const kLlama3 = "Dubey et al. 2024 (Llama 3 Herd), Table 3 + released config";

// Llama: family llama with its knobs; `billions` is the paper's count,
// `resolution` one unit of its last printed digit (billions).
PresetInfo llama(std::string name, int layers, int embd, int heads, int kv_heads, int ffn, int vocab,
                 double theta, double billions, double resolution, std::string source) {
  const bool v2 = vocab == 32000;
  GPTConfig c = shape(layers, heads, embd, v2 ? 4096 : 8192, vocab, v2 ? 1024 : 512);
  c.family = Family::kLlama;
  c.n_kv_head = kv_heads;
  c.n_ffn = ffn;
  c.rope_theta = theta;
  c.norm_eps = 1e-5;  // Llama 2's released configs say 1e-5 (Llama 1: 1e-6), Llama 3's too
  return {std::move(name), c, billions * 1e9, resolution * 1e9, false, std::move(source)};
}

// tiny's size class (4 blocks of 128, seq 64, vocab 512) as a Llama: 4 query
// heads sharing 2 K/V heads (tp 4 replicates K/V), F = 352 (Llama's rule
// 2/3 · 4C rounded up to a multiple of 32), theta 10^4.
PresetInfo tiny_llama() {
  GPTConfig c;
  c.family = Family::kLlama;
  c.n_kv_head = 2;
  c.n_ffn = 352;
  return {"tiny-llama", c, 0, 0, false, "shardlab (tiny with GQA, SwiGLU, RoPE, RMSNorm)"};
}

// tiny's size class as a llama MoE, for real math: tiny-llama's attention
// (4 query heads over 2 K/V heads, so tp 4 replicates K/V), block 0 dense
// (F 352), blocks 1-3 with 8 routed SwiGLU experts of 64 (top-2, softmax
// with normalized gates) and 1 shared expert of 64.
PresetInfo tiny_moe() {
  PresetInfo p = tiny_llama();
  p.name = "tiny-moe";
  p.source = "shardlab (tiny-llama with 8 routed + 1 shared SwiGLU experts)";
  GPTConfig& c = p.config;
  c.n_expert = 8, c.top_k = 2, c.n_moe_ffn = 64, c.n_shared_expert = 1, c.moe_first_dense = 1;
  return p;
}

PresetInfo mixtral_8x7b() {
  PresetInfo p = llama("mixtral-8x7b", 32, 4096, 32, 8, 14336, 32000, 1e6, 46.7, 0.1,
                       "Jiang et al. 2024 (Mixtral of Experts), Table 1 + released config");
  p.config.n_expert = 8, p.config.top_k = 2;
  p.published_active = 12.9e9;
  return p;
}

PresetInfo deepseek_v3() {
  PresetInfo p = llama("deepseek-v3", 61, 7168, 128, 0, 18432, 129280, 1e4, 671, 1,
                       "DeepSeek-AI 2024 (DeepSeek-V3), sec. 4.2 + released config");
  GPTConfig& c = p.config;
  c.head_dim = 128;  // the unrotated query/key features (qk_nope_head_dim)
  c.q_lora_rank = 1536, c.kv_lora_rank = 512, c.qk_rope_head_dim = 64, c.v_head_dim = 128;
  c.block_size = 4096, c.batch_size = 15360;  // 4K pre-training sequences; batch ramps to 15360
  c.norm_eps = 1e-6;
  c.n_expert = 256, c.top_k = 8, c.n_moe_ffn = 2048, c.n_shared_expert = 1, c.moe_first_dense = 3;
  c.router = Router::kSigmoid, c.moe_norm_topk = true;
  // Node-limited routing (sec. 2.1.2, the released config's n_group 8,
  // topk_group 4): a token's 8 experts from the 4 best of 8 groups of 32.
  c.moe_groups = 8, c.moe_group_top_k = 4;
  // Aux-loss-free balancing (sec. 2.1.2): a selection bias per expert moved by
  // the bias update speed 0.001 after each step, no batch-wise balance loss
  // (the sequence-wise one, alpha 0.0001, is not modeled). So the routing
  // needs no counts from other replicas within a step (train/parallel_plan.cc).
  c.aux_coef = 0, c.router_bias_rate = 0.001;
  p.published_active = 37e9;
  return p;
}

// Qwen3's MoE models (Qwen Team 2025, Qwen3 Technical Report, Table 2, and
// the released configs): 4 K/V heads, heads of 128 apart from n_embd
// (head_dim), QK-norm, every block MoE with 128 routed SwiGLU experts, top-8
// renormalized (norm_topk_prob), no shared expert, untied head, theta 10^6,
// RMSNorm eps 10^-6, the load-balancing loss at 0.001, 4K pre-training
// sequences (the first stages). `ffn` is the released intermediate_size (no
// dense block uses it).
PresetInfo qwen3_moe(std::string name, int layers, int embd, int heads, int ffn, int moe_ffn, double billions,
                     double resolution, double active) {
  PresetInfo p = llama(std::move(name), layers, embd, heads, 4, ffn, 151936, 1e6, billions, resolution,
                       "Qwen Team 2025 (Qwen3 Technical Report), Table 2 + released config");
  GPTConfig& c = p.config;
  c.block_size = 4096, c.batch_size = 1024;
  c.head_dim = 128, c.qk_norm = true, c.norm_eps = 1e-6;
  c.n_expert = 128, c.top_k = 8, c.n_moe_ffn = moe_ffn, c.moe_norm_topk = true;
  c.aux_coef = 0.001;
  p.published_active = active;
  return p;
}

std::vector<PresetInfo> make_presets() {
  return {
      toy("nano", shape(2, 2, 64, 32, 256, 4)),
      toy("tiny", GPTConfig{}),  // the defaults are tiny
      toy("small", shape(6, 6, 384, 256, 4096, 16)),
      gpt3("gpt3-125m", 12, 768, 12, 256, 125e6, 1e6),
      gpt3("gpt3-350m", 24, 1024, 16, 256, 350e6, 10e6),
      gpt3("gpt3-760m", 24, 1536, 16, 256, 760e6, 10e6),
      gpt3("gpt3-1.3b", 24, 2048, 16, 512, 1.3e9, 0.1e9),  // the table: 24 heads (of 128)
      gpt3("gpt3-2.7b", 32, 2560, 32, 512, 2.7e9, 0.1e9),
      gpt3("gpt3-6.7b", 32, 4096, 32, 1024, 6.7e9, 0.1e9),
      gpt3("gpt3-13b", 40, 5120, 40, 1024, 13e9, 1e9),
      gpt3("gpt3-175b", 96, 12288, 96, 1536, 175e9, 1e9),
      megatron("megatron-1.7b", 1.7, 24, 2304, 24, 512),
      megatron("megatron-3.6b", 3.6, 32, 3072, 30, 512),
      megatron("megatron-7.5b", 7.5, 32, 4096, 36, 512),
      megatron("megatron-18.4b", 18.4, 48, 6144, 40, 1024),
      megatron("megatron-39.1b", 39.1, 64, 8192, 48, 1536),
      megatron("megatron-76.1b", 76.1, 80, 10240, 60, 1792),
      megatron("megatron-145.6b", 145.6, 96, 12288, 80, 2304),
      megatron("megatron-310.1b", 310.1, 128, 16384, 96, 2160),
      megatron("megatron-529.6b", 529.6, 128, 20480, 105, 2520),
      megatron("megatron-1t", 1008.0, 160, 25600, 128, 3072),
      tiny_llama(),
      llama("llama2-7b", 32, 4096, 32, 32, 11008, 32000, 1e4, 6.74, 0.01, kLlama2),
      llama("llama2-13b", 40, 5120, 40, 40, 13824, 32000, 1e4, 13.0, 0.1, kLlama2),
      llama("llama2-70b", 80, 8192, 64, 8, 28672, 32000, 1e4, 69.0, 0.1, kLlama2),
      llama("llama3-8b", 32, 4096, 32, 8, 14336, 128256, 5e5, 8.03, 0.01, kLlama3),
      llama("llama3-70b", 80, 8192, 64, 8, 28672, 128256, 5e5, 70.6, 0.1, kLlama3),
      llama("llama3-405b", 126, 16384, 128, 8, 53248, 128256, 5e5, 405.9, 0.1, kLlama3),
      tiny_moe(),
      mixtral_8x7b(),
      deepseek_v3(),
      qwen3_moe("qwen3-30b-a3b", 48, 2048, 32, 6144, 768, 30.5, 0.1, 3.3e9),
      qwen3_moe("qwen3-235b-a22b", 94, 4096, 64, 12288, 1536, 235, 1, 22e9),
  };
}

}  // namespace

const std::vector<PresetInfo>& presets() {
  static const std::vector<PresetInfo> all = make_presets();
  return all;
}

const PresetInfo& preset_info(std::string_view name) {
  for (const PresetInfo& p : presets())
    if (p.name == name) return p;
  std::string known;
  for (const PresetInfo& p : presets()) known += (known.empty() ? "" : ", ") + p.name;
  throw ConfigError("`preset`: unknown preset '" + std::string(name) + "' (choose " + known + ")");
}

GPTConfig preset(std::string_view name) { return preset_info(name).config; }

std::vector<std::string> preset_names() {
  std::vector<std::string> names;
  for (const PresetInfo& p : presets()) names.push_back(p.name);
  return names;
}

}  // namespace shardlab::model
