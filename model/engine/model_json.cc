#include "model/engine/model_json.h"

#include <fmt/format.h>

#include "runtime/errors.h"

namespace shardlab::engine {

nlohmann::json model_json(const model::GPTConfig& m) {
  nlohmann::json j = {{"layers", m.n_layer},
          {"heads", m.n_head},
          {"embd", m.n_embd},
          {"seq", m.block_size},
          {"vocab", m.vocab_size},
          {"vocab_unpadded", m.token_vocab()},
          {"make_vocab_size_divisible_by", m.vocab_multiple},
          {"ffn", m.ffn_hidden()},
          {"experts", m.n_expert},
          {"top_k", m.top_k},
          {"moe_every", m.moe_every},
          {"aux_coef", m.aux_coef},
          {"capacity_factor", m.capacity_factor},
          {"family", model::family_name(m.family)},
          {"kv_heads", m.kv_heads()},
          {"head_dim", m.head_size()},
          {"norm_eps", m.norm_eps},
          {"tie_embeddings", m.tied()}};
  if (m.is_llama()) j["rope_theta"] = m.rope_theta;
  if (m.qk_norm) j["qk_norm"] = true;
  if (m.is_mla()) {
    j["q_lora_rank"] = m.q_lora_rank;
    j["kv_lora_rank"] = m.kv_lora_rank;
    j["qk_rope_head_dim"] = m.qk_rope_head_dim;
    j["v_head_dim"] = m.v_head_size();
  }
  if (m.is_moe()) {  // modern MoE (config.h)
    j["moe_ffn"] = m.moe_ffn_hidden();
    j["shared_experts"] = m.n_shared_expert;
    j["router"] = model::router_name(m.router);
    j["moe_norm_topk"] = m.moe_norm_topk;
    j["moe_first_dense"] = m.moe_first_dense;
    j["moe_groups"] = m.moe_groups;
    j["moe_group_top_k"] = m.moe_group_top_k;
    if (m.router_bias()) j["router_bias_rate"] = m.router_bias_rate;
  }
  return j;
}

void check_model_json(const nlohmann::json& saved, const model::GPTConfig& config, const std::string& what) {
  const nlohmann::json run = model_json(config);
  auto saved_int = [&](const char* key, int fallback) {
    return saved.contains(key) && saved[key].is_number_integer() ? saved[key].get<int>() : fallback;
  };
  const int embd = saved_int("embd", config.n_embd);
  const std::pair<const char*, const char*> shape_keys[] = {
      {"layers", "`n_layer`"},   {"heads", "`n_head`"},       {"embd", "`n_embd`"},
      {"seq", "`block_size`"},   {"vocab", "`vocab_size`"},   {"ffn", "`n_ffn`"},
      {"experts", "`n_expert`"}, {"moe_every", "`moe_every`"}, {"kv_heads", "`n_kv_head`"},
      {"head_dim", "`head_dim`"}};
  // A key the checkpoint lacks (written before it was recorded) is taken as this run's.
  for (const auto& [key, field] : shape_keys) {
    const int fallback = std::string_view(key) == "ffn"        ? 4 * embd
                         : std::string_view(key) == "head_dim" ? embd / saved_int("heads", config.n_head)
                                                                : run[key].get<int>();
    const int had = saved_int(key, fallback), want = run[key].get<int>();
    if (had != want)
      throw ConfigError(fmt::format("{}: the checkpoint has {} {}, this run {}", what, field, had, want));
  }
  // MLA's ranks and head sizes (absent: not MLA).
  const std::pair<const char*, int> mla_keys[] = {{"q_lora_rank", config.q_lora_rank},
                                                  {"kv_lora_rank", config.kv_lora_rank},
                                                  {"qk_rope_head_dim", config.qk_rope_head_dim},
                                                  {"v_head_dim", config.is_mla() ? config.v_head_size() : 0}};
  for (const auto& [key, want] : mla_keys) {
    const int had = saved_int(key, 0);
    if (had != want)
      throw ConfigError(fmt::format("{}: the checkpoint has `{}` {}, this run {}", what, key, had, want));
  }
  // The family decides what the tensors mean (LayerNorm or RMSNorm, GELU MLP
  // or SwiGLU, learned or rotary positions) where their names may not differ.
  if (saved.contains("family") && saved["family"].is_string() && saved["family"] != run["family"])
    throw ConfigError(fmt::format("{}: the checkpoint has `family` {}, this run {}", what,
                                  saved["family"].get<std::string>(), run["family"].get<std::string>()));
}

void check_checkpoint_model(const model::SafetensorsFile& file, const model::GPTConfig& config,
                            std::string_view field) {
  const auto it = file.metadata().find(model::kShardlabConfigKey);
  if (it == file.metadata().end()) return;
  const nlohmann::json stored =
      nlohmann::json::parse(it->second, nullptr, /*allow_exceptions=*/false);
  if (!stored.is_object() || !stored.contains("model") || !stored["model"].is_object()) return;
  check_model_json(stored["model"], config, fmt::format("{} {}", field, file.origin()));
}

}  // namespace shardlab::engine
