// Shared pieces of the inference tests: a small model whose weights are
// perturbed away from the init (so the logits are peaked and greedy choices
// are far from ties), held as an in-memory checkpoint, and the unsharded
// reference: GPT<float> re-running the whole sequence for every token (no
// cache).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "model/gpt.h"
#include "model/infer/generate.h"
#include "model/infer/sampler.h"
#include "model/io/safetensors.h"
#include "runtime/cluster.h"
#include "runtime/profile.h"
#include "tests/model/test_models.h"

namespace shardlab::infer::testing {

inline model::GPTConfig small_config(bool moe) {
  model::GPTConfig c;
  c.n_layer = 4;
  c.n_head = 4;
  c.n_embd = 64;
  c.block_size = 32;
  c.vocab_size = 128;
  if (moe) {
    c.n_expert = 4;
    c.top_k = 2;
  }
  return c;
}

// small_config's size as a llama model with DeepSeek-V3's attention
// (multi-head latent attention) at a small width: q's latent 24 (none with
// `q_latent` false: q_proj), k/v's 16, scores over 16 + 8 features a head,
// values 12.
inline model::GPTConfig mla_config(bool q_latent = true) {
  model::GPTConfig c = small_config(false);
  c.family = model::Family::kLlama, c.n_ffn = 96;
  c.head_dim = 16, c.q_lora_rank = q_latent ? 24 : 0, c.kv_lora_rank = 16, c.qk_rope_head_dim = 8, c.v_head_dim = 12;
  return c;
}

inline void perturb(model::GPT<float>& m, uint64_t seed = 7) { model::testing::randomize_params(m, seed, 0.15); }

inline model::SafetensorsFile as_checkpoint(const model::GPT<float>& m) {
  std::map<std::string, model::LoadedTensor> tensors;
  for (const model::ParamSpec& s : m.table().specs()) {
    const float* p = m.params().data() + s.offset;
    tensors[s.name] = {s.shape, std::vector<float>(p, p + s.numel)};
  }
  return model::SafetensorsFile("test-checkpoint", std::move(tensors), {});
}

// The reference's logits of the last position of `seq` (token_vocab entries).
inline std::vector<float> full_forward_last(model::GPT<float>& m, const std::vector<model::Token>& seq) {
  m.forward(seq.data(), nullptr, 1, int(seq.size()));
  const int V = m.config().vocab_size, n = m.config().token_vocab();
  const float* last = m.logits().data() + (seq.size() - 1) * size_t(V);
  return {last, last + n};
}

// Tokens the unsharded model chooses without a cache.
inline std::vector<model::Token> reference_tokens(model::GPT<float>& m, std::vector<model::Token> seq, int n,
                                                  const SamplingOptions& s) {
  Sampler sampler(s);
  std::vector<model::Token> out;
  for (int i = 0; i < n; ++i) {
    const std::vector<float> logits = full_forward_last(m, seq);
    out.push_back(sampler.next(logits));
    seq.push_back(out.back());
  }
  return out;
}

inline GenerateResult run_generate(const GenerateOptions& o, Precision p = Precision::kFp32,
                                   const char* profile = "a100-nvlink") {
  ClusterOptions co;
  co.world_size = o.world();
  co.precision = p;
  Cluster cluster(load_profile(profile), co);
  return generate(cluster, o);
}

}  // namespace shardlab::infer::testing
