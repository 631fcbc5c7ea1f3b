// GPTConfig: the model's shape, nanoGPT's GPTConfig plus MoE fields, the MLP
// width and Megatron's vocabulary padding, and the built-in presets: the toy
// models nano / tiny / small and published shapes (GPT-3, Megatron-LM).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace shardlab::model {

// The block's architecture. kGpt: GPT-2/GPT-3 (LayerNorm with bias, GELU MLP
// c_fc/c_proj, learned positions, biases on every Linear, LM head tied to
// wte). kLlama: Llama 2/3, Mistral (RMSNorm weight only, SwiGLU MLP
// gate/up/down, rotary positions, no biases, untied LM head by default).
enum class Family : uint8_t { kGpt, kLlama };
const char* family_name(Family f);  // "gpt", "llama"

// MoE router scores (kernels_moe.h): kSoftmax over the E experts
// (Switch/Mixtral), kSigmoid per expert (DeepSeek-V3).
enum class Router : uint8_t { kSoftmax, kSigmoid };
const char* router_name(Router r);  // "softmax", "sigmoid"
// "softmax" or "sigmoid"; ConfigError naming `GPTConfig::router` otherwise.
Router parse_router(std::string_view name);

struct GPTConfig {
  int n_layer = 4;
  int n_head = 4;
  int n_embd = 128;
  int block_size = 64;  // position table size = longest sequence (--seq)
  int vocab_size = 512;
  int batch_size = 8;  // default global batch in sequences (--batch); not a model shape
  int n_ffn = 0;       // MLP hidden width F (--ffn); 0: 4·n_embd, nanoGPT's
  // Megatron's vocabulary padding (with_padded_vocab): vocab_size is then the
  // padded table (rows no token uses), vocab_unpadded the tokenizer's size
  // and vocab_multiple the --make-vocab-size-divisible-by it was padded with.
  int vocab_unpadded = 0;  // 0: not padded
  int vocab_multiple = 0;
  // Mixture of Experts: experts == 0 means a dense model.
  int n_expert = 0;            // E
  int top_k = 2;               // K
  int moe_every = 1;           // blocks with layer % moe_every == 0 are MoE
  double aux_coef = 0.01;      // loss = CE + aux_coef * Σ_layers aux
  double capacity_factor = 0;  // <= 0: no capacity limit
  // Modern MoE (DeepSeek-V3, Mixtral; kernels_moe.h "Routers"), see moe_* below.
  int n_moe_ffn = 0;           // each routed expert's MLP width (--moe-ffn); 0: ffn_hidden()
  int n_shared_expert = 0;     // shared experts: every token, output added to the routed
  Router router = Router::kSoftmax;  // scores: softmax over E, or per-expert sigmoid
  bool moe_norm_topk = true;   // gates = the top-K scores renormalised to sum 1 (Mixtral's)
  int moe_first_dense = 0;     // the first N blocks are dense, width ffn_hidden() (DeepSeek-V3: 3)
  // Group-limited routing (kernels_moe.h RouterSpec; DeepSeek-V3's node-limited
  // routing: 8 groups, 4 kept): each token's K experts come from the
  // moe_group_top_k best of moe_groups groups of consecutive experts. 1: off.
  int moe_groups = 1;
  int moe_group_top_k = 1;
  // The groups suit the experts: G | E, 1 <= M <= G, M | K and K <= M·E/G.
  bool moe_groups_fit() const {
    return moe_groups >= 1 && n_expert % moe_groups == 0 && moe_group_top_k >= 1 && moe_group_top_k <= moe_groups &&
           top_k % moe_group_top_k == 0 && top_k <= int64_t{moe_group_top_k} * (n_expert / moe_groups);
  }
  // DeepSeek-V3's aux-loss-free balancing: > 0 gives every MoE block a
  // per-expert selection bias b (mlp.gate.e_score_correction_bias, zeros at
  // init) added to the scores for the top-K choice only, and after each step
  // b_i += rate · sign(mean load − load_i) over the global batch (kernels_moe.h).
  double router_bias_rate = 0;
  bool router_bias() const { return n_expert > 0 && router_bias_rate > 0; }
  // Attention and hidden dropout probability (Megatron's, both the same). > 0
  // charges the dropout kernels (kernels.h dropout_*_cost) and is modeled in
  // time only: phantom runs (the arithmetic has no dropout).
  double dropout = 0;
  // Architecture (Family) and the knobs the llama family exposes.
  Family family = Family::kGpt;
  int n_kv_head = 0;          // K/V heads (GQA; 1 = MQA); 0: n_head
  // The attention heads' size (Megatron's --kv-channels, Hugging Face's
  // head_dim); 0: n_embd / n_head. Set apart from it (Qwen3: 32 heads of 128
  // on n_embd 2048), q_proj is (n_head·head_dim, n_embd) and o_proj its
  // transpose: the llama family only.
  int head_dim = 0;
  // QK-norm (Qwen3): an RMSNorm over each head of q and of k after their
  // projections, before RoPE, with weights self_attn.q_norm and k_norm
  // (head_size() each, shared by the heads): the llama family only.
  bool qk_norm = false;
  // Multi-head latent attention (DeepSeek-V2/V3, Hugging Face's names; the
  // llama family only): kv_lora_rank > 0 turns it on. q comes from a
  // compressed latent of q_lora_rank (0: projected from the hidden state
  // directly), k's and v's per-head parts from one of kv_lora_rank, each
  // latent RMS-normalized; every head's query and key are head_size()
  // features without position (qk_nope_head_dim) and qk_rope_head_dim
  // rotated ones, the keys' rotated part shared by the heads; the values
  // have v_head_dim features (0: head_size()).
  int q_lora_rank = 0;
  int kv_lora_rank = 0;
  int qk_rope_head_dim = 0;
  int v_head_dim = 0;
  double rope_theta = 10000;  // rotary base (llama family)
  double norm_eps = 1e-5;     // LayerNorm / RMSNorm epsilon
  std::optional<bool> tie_embeddings;  // unset: the family's default (gpt tied, llama untied)

  bool is_llama() const { return family == Family::kLlama; }
  int kv_heads() const { return n_kv_head > 0 ? n_kv_head : n_head; }
  bool tied() const { return tie_embeddings.value_or(family == Family::kGpt); }

  int head_size() const { return head_dim > 0 ? head_dim : n_embd / n_head; }
  // The attention's width: the query heads' features, n_head · head_size()
  // (n_embd unless head_dim sets the heads apart).
  // Under MLA, the values' heads: n_head · v_head_size() (o_proj's input).
  int attn_width() const { return n_head * v_head_size(); }
  bool is_mla() const { return kv_lora_rank > 0; }
  // The scores' features per head: head_size(), plus the rotated ones under MLA.
  int qk_head_size() const { return head_size() + (is_mla() ? qk_rope_head_dim : 0); }
  int v_head_size() const { return is_mla() && v_head_dim > 0 ? v_head_dim : head_size(); }
  int ffn_hidden() const { return n_ffn > 0 ? n_ffn : 4 * n_embd; }
  // The tokens the data may use: [0, token_vocab()).
  int token_vocab() const { return vocab_unpadded > 0 ? vocab_unpadded : vocab_size; }
  bool vocab_padded() const { return vocab_unpadded > 0; }
  bool is_moe() const { return n_expert > 0; }
  bool is_moe_layer(int layer) const {
    return is_moe() && layer >= moe_first_dense && layer % moe_every == 0;
  }
  int moe_layers() const;  // blocks that are MoE
  bool has_dense_layer() const { return moe_layers() < n_layer; }
  int moe_ffn_hidden() const { return n_moe_ffn > 0 ? n_moe_ffn : ffn_hidden(); }
  // The shared experts run as one MLP of n_shared_expert · moe_ffn_hidden()
  // columns (DeepSeek's implementation); 0 without shared experts.
  int shared_ffn_hidden() const { return n_shared_expert * moe_ffn_hidden(); }

  // Throws shardlab::ConfigError with one line naming the flag and constraint.
  void validate() const;
  std::string to_string() const;  // "layers=4 heads=4 embd=128 ..."

 private:
  void validate_family() const;
  void validate_mla() const;
};

// A built-in shape and where it comes from (model/presets.cc).
struct PresetInfo {
  std::string name;
  GPTConfig config;  // vocab_size unpadded: the tokenizer's
  double published_params = 0;      // the paper's parameter count (0: the toy presets)
  double published_resolution = 0;  // one unit of its last printed digit (0.1e9 for "1.7B")
  bool pads_vocab = false;          // Megatron's padding (multiple 128) applies by default
  std::string source;               // "Brown et al. 2020, Table 2.1", ...
  double published_active = 0;      // MoE: the parameters a token runs through, as published
};

// Every preset in the order --help lists them.
const std::vector<PresetInfo>& presets();
// Throws ConfigError for an unknown name, listing the known ones.
const PresetInfo& preset_info(std::string_view name);
// "nano" (2 layers, 2 heads, embd 64, seq 32, vocab 256, batch 4),
// "tiny" (4, 4, 128, 64, 512, batch 8), "small" (6, 6, 384, 256, 4096, batch 16),
// and the published shapes (presets()).
GPTConfig preset(std::string_view name);
std::vector<std::string> preset_names();

// Megatron's _vocab_size_with_padding: the smallest multiple of multiple·tp
// that holds `vocab` tokens.
int padded_vocab(int vocab, int multiple, int tp);
// `c` with vocab_size padded from its token_vocab() (ConfigError for
// multiple or tp below 1); vocab_unpadded and vocab_multiple record it.
GPTConfig with_padded_vocab(GPTConfig c, int multiple, int tp);
// "vocab 50257 padded to 51200 (Megatron: multiple of 128 x tp 8)"; "" when not padded.
std::string vocab_padding_note(const GPTConfig& c, int tp);

}  // namespace shardlab::model
