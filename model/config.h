// GPTConfig: the model's shape, nanoGPT's GPTConfig plus MoE fields, and the
// built-in presets nano / tiny / small.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace shardlab::model {

struct GPTConfig {
  int n_layer = 4;
  int n_head = 4;
  int n_embd = 128;
  int block_size = 64;  // position table size = longest sequence (--seq)
  int vocab_size = 512;
  int batch_size = 8;  // default global batch in sequences (--batch); not a model shape
  // Mixture of Experts: experts == 0 means a dense model.
  int n_expert = 0;            // E
  int top_k = 2;               // K
  int moe_every = 1;           // blocks with layer % moe_every == 0 are MoE
  double aux_coef = 0.01;      // loss = CE + aux_coef * Σ_layers aux
  double capacity_factor = 0;  // <= 0: no capacity limit

  int head_size() const { return n_embd / n_head; }
  bool is_moe() const { return n_expert > 0; }
  bool is_moe_layer(int layer) const { return is_moe() && layer % moe_every == 0; }

  // Throws shardlab::ConfigError with one line naming the flag and constraint.
  void validate() const;
  std::string to_string() const;  // "layers=4 heads=4 embd=128 ..."
};

// "nano" (2 layers, 2 heads, embd 64, seq 32, vocab 256, batch 4),
// "tiny" (4, 4, 128, 64, 512, batch 8), "small" (6, 6, 384, 256, 4096, batch 16).
// Throws ConfigError for an unknown name.
GPTConfig preset(std::string_view name);
std::vector<std::string> preset_names();

}  // namespace shardlab::model
