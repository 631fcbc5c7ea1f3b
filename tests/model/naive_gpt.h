// An independent, deliberately naive GPT (and llama) forward (plain loops,
// double), used to check the model's forward. It shares nothing with model/ but the config
// and the parameter names.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/kernels.h"

namespace shardlab::model::testing {

// Returns a tensor's values by nanoGPT name.
using ParamLookup = std::function<const double*(const std::string& name)>;

struct NaiveResult {
  double loss = 0;  // CE + aux_coef · Σ aux
  double ce = 0;
  double aux = 0;              // Σ over MoE layers
  std::vector<double> logits;  // (B,T,V)
};

NaiveResult naive_gpt_forward(const GPTConfig& config, const ParamLookup& param,
                              const std::vector<Token>& inputs, const std::vector<Token>& targets,
                              int B, int T);

// The llama family's dense forward (Hugging Face's LlamaForCausalLM in plain
// loops, double): RMSNorm, q/k/v projections of n_head and n_kv_head heads
// of head_size() features (n_head·head_size() apart from n_embd with
// head_dim), rotate-half RoPE at base rope_theta, causal attention of each
// query head on its K/V head (with qk_norm an RMSNorm over each head of q
// and k before RoPE, Qwen3's), o_proj, SwiGLU MLP, the final norm and the
// head (lm_head, or embed_tokens when tied); with kv_lora_rank, DeepSeek-V3's
// multi-head latent attention. Dense models only.
NaiveResult naive_llama_forward(const GPTConfig& config, const ParamLookup& param,
                                const std::vector<Token>& inputs, const std::vector<Token>& targets,
                                int B, int T);

}  // namespace shardlab::model::testing
