#include "model/params.h"

#include <algorithm>
#include <cmath>

#include "model/rng.h"
#include "runtime/errors.h"

namespace shardlab::model {

namespace {
constexpr double kInitStd = 0.02;
}  // namespace

std::string block_name(int layer, std::string_view suffix) {
  return "transformer.h." + std::to_string(layer) + "." + std::string(suffix);
}

std::string expert_name(int layer, int expert, std::string_view suffix) {
  return block_name(layer, "mlp.experts." + std::to_string(expert) + "." + std::string(suffix));
}

std::string shared_expert_name(int layer, std::string_view suffix) {
  return block_name(layer, "mlp.shared_experts." + std::string(suffix));
}

std::array<Range, 3> c_attn_head_rows(int C, int n_head, int h0, int h1) {
  SHARDLAB_CHECK(n_head > 0 && C % n_head == 0 && 0 <= h0 && h0 <= h1 && h1 <= n_head,
                 "bad head range");
  const int64_t HS = C / n_head;
  std::array<Range, 3> rows;
  for (int part = 0; part < 3; ++part) {  // q, k, v
    rows[part] = {part * int64_t{C} + h0 * HS, (h1 - h0) * HS};
  }
  return rows;
}

std::string block_prefix(const GPTConfig& c, int layer) {
  return (c.is_llama() ? "model.layers." : "transformer.h.") + std::to_string(layer) + ".";
}

std::string embedding_name(const GPTConfig& c) {
  return c.is_llama() ? "model.embed_tokens.weight" : "transformer.wte.weight";
}

std::string final_norm_prefix(const GPTConfig& c) {
  return c.is_llama() ? "model.norm." : "transformer.ln_f.";
}

std::string llama_name(int layer, std::string_view module) {
  return "model.layers." + std::to_string(layer) + "." + std::string(module) + ".weight";
}

std::string router_bias_name(const GPTConfig& c, int layer) {
  return block_prefix(c, layer) + (c.is_llama() ? "mlp.gate" : "mlp.router") + ".e_score_correction_bias";
}

namespace {

// An MLP of width F: c_fc (F, C) and c_proj (C, F) with biases.
double mlp_params(double C, double F) { return 2 * F * C + F + C; }

// The router of an MoE block: its (E, C) weight and, with aux-loss-free
// balancing, the (E) selection bias.
double router_params(const GPTConfig& c) { return double(c.n_expert) * (c.n_embd + (c.router_bias() ? 1 : 0)); }

// One MoE block's MLP part: router, E experts of width moe_ffn_hidden()
// and the shared experts' MLP of width shared_ffn_hidden().
double moe_mlp_params(const GPTConfig& c) {
  const double C = c.n_embd, E = c.n_expert;
  const double shared = c.n_shared_expert > 0 ? mlp_params(C, c.shared_ffn_hidden()) : 0;
  return router_params(c) + E * mlp_params(C, c.moe_ffn_hidden()) + shared;
}

// Llama: embed_tokens (+ lm_head untied) + model.norm + per block the q, k,
// v, o projections (q and o C·A, A = NH·HS; k and v C·KV·HS each), two RMSNorm weights
// and the MLP: gate, up, down (3·C·F) dense; in an MoE block the router
// (E·C), E SwiGLU experts (3·C·Fe each) and the shared experts' (3·C·Fs).
// MLA's projections: q from its latent (q_a_proj, q_a_layernorm, q_b_proj)
// or from the hidden state (q_proj), the latent of k and v with the shared
// rotated key (kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj) and o_proj.
double mla_params(const GPTConfig& c) {
  const double C = c.n_embd, NH = c.n_head, Lq = c.q_lora_rank, Lkv = c.kv_lora_rank;
  const double q_out = NH * c.qk_head_size(), kv_out = NH * (c.head_size() + c.v_head_size());
  const double q = Lq > 0 ? C * Lq + Lq + Lq * q_out : C * q_out;
  return q + C * (Lkv + c.qk_rope_head_dim) + Lkv + Lkv * kv_out + double(c.attn_width()) * C;
}

double count_llama(const GPTConfig& c) {
  const double C = c.n_embd, F = c.ffn_hidden(), KVC = double(c.kv_heads()) * c.head_size();
  const double attn = c.is_mla() ? mla_params(c) + 2 * C
                                 : 2 * C * c.attn_width() + 2 * C * KVC + 2 * C + (c.qk_norm ? 2.0 * c.head_size() : 0.0),
               moe = c.moe_layers();
  const double moe_mlp = router_params(c) + 3 * C * (double(c.n_expert) * c.moe_ffn_hidden() + c.shared_ffn_hidden());
  return double(c.vocab_size) * C * (c.tied() ? 1 : 2) + C + c.n_layer * attn + moe * moe_mlp +
         (c.n_layer - moe) * 3 * C * F;
}

}  // namespace

double count_active_params(const GPTConfig& c) {
  if (!c.is_moe()) return count_params(c);
  GPTConfig active = c;
  active.n_expert = c.top_k;  // the top-k experts a token runs, plus the whole router
  return count_params(active) + (router_params(c) - router_params(active)) * c.moe_layers();
}

namespace {

}  // namespace

double count_params(const GPTConfig& c) {
  if (c.is_llama()) return count_llama(c);
  const double C = c.n_embd;
  const double attn = 3 * C * C + 3 * C + C * C + C + 4 * C;     // c_attn, c_proj, ln_1, ln_2
  double total = double(c.vocab_size) * C + double(c.block_size) * C + 2 * C;  // wte, wpe, ln_f
  total += c.tied() ? 0 : double(c.vocab_size) * C;                // lm_head
  const double moe = c.moe_layers();  // is_moe_layer: past moe_first_dense, l % moe_every == 0
  return total + c.n_layer * attn + moe * moe_mlp_params(c) + (c.n_layer - moe) * mlp_params(C, c.ffn_hidden());
}

ParamTable::ParamTable(const GPTConfig& config) : config_(config) {
  config.validate();
  if (config.is_llama()) {
    add_llama_blocks();
  } else {
    add_gpt_blocks();
  }
  if (!config.tied()) {
    const int64_t V = config.vocab_size, C = config.n_embd;
    add(std::string(kLmHeadName), ParamRole::kLmHead, {V, C}, InitKind::kNormal, kInitStd, -1);
  }
}

void ParamTable::add_llama_blocks() {
  const GPTConfig& c = config_;
  const int64_t C = c.n_embd, V = c.vocab_size, F = c.ffn_hidden();
  const int64_t KVC = int64_t{c.kv_heads()} * c.head_size(), A = c.attn_width();
  using R = ParamRole;
  auto norm = [&](std::string name, int layer) {
    add(std::move(name), R::kLayerNorm, {C}, InitKind::kOnes, 0, layer);
  };
  auto linear = [&](int l, const char* module, R role, int64_t out, int64_t in) {
    add(llama_name(l, module), role, {out, in}, InitKind::kNormal, kInitStd, l);
  };
  add("model.embed_tokens.weight", R::kTokenEmbedding, {V, C}, InitKind::kNormal, kInitStd, -1);
  for (int l = 0; l < c.n_layer; ++l) {
    norm(llama_name(l, "input_layernorm"), l);
    if (c.is_mla()) {
      add_mla(l);
    } else {
      linear(l, "self_attn.q_proj", R::kQkvWeight, A, C);
      linear(l, "self_attn.k_proj", R::kKvWeight, KVC, C);
      linear(l, "self_attn.v_proj", R::kKvWeight, KVC, C);
    }
    linear(l, "self_attn.o_proj", R::kAttnProjWeight, C, A);
    if (c.qk_norm)
      for (const char* m : {"self_attn.q_norm", "self_attn.k_norm"})
        add(llama_name(l, m), R::kQkNorm, {c.head_size()}, InitKind::kOnes, 0, l);
    norm(llama_name(l, "post_attention_layernorm"), l);
    if (c.is_moe_layer(l)) {
      add_llama_moe_mlp(l);
      continue;
    }
    linear(l, "mlp.gate_proj", R::kFcWeight, F, C);
    linear(l, "mlp.up_proj", R::kFcWeight, F, C);
    linear(l, "mlp.down_proj", R::kMlpProjWeight, C, F);
  }
  norm("model.norm.weight", -1);
}

// MLA (DeepSeek-V3's Hugging Face names): the tensors every TP rank holds
// whole first (q_a_proj, q_a_layernorm, kv_a_proj_with_mqa,
// kv_a_layernorm: one run of the flat buffer), then the up-projections
// split by heads (q_b_proj or q_proj, kv_b_proj); o_proj follows. Linears
// N(0, 0.02), the latents' norms 1.
void ParamTable::add_mla(int l) {
  using R = ParamRole;
  const GPTConfig& c = config_;
  const int64_t C = c.n_embd, NH = c.n_head, Lq = c.q_lora_rank, Lkv = c.kv_lora_rank;
  auto linear = [&](const char* module, R role, int64_t out, int64_t in) {
    add(llama_name(l, module), role, {out, in}, InitKind::kNormal, kInitStd, l);
  };
  auto norm = [&](const char* module, int64_t n) { add(llama_name(l, module), R::kMlaNorm, {n}, InitKind::kOnes, 0, l); };
  if (Lq > 0) {
    linear("self_attn.q_a_proj", R::kMlaDown, Lq, C);
    norm("self_attn.q_a_layernorm", Lq);
  }
  linear("self_attn.kv_a_proj_with_mqa", R::kMlaDown, Lkv + c.qk_rope_head_dim, C);
  norm("self_attn.kv_a_layernorm", Lkv);
  const int64_t q_out = NH * c.qk_head_size();
  if (Lq > 0)
    linear("self_attn.q_b_proj", R::kMlaUp, q_out, Lq);
  else
    linear("self_attn.q_proj", R::kMlaUp, q_out, C);
  linear("self_attn.kv_b_proj", R::kMlaUp, NH * (c.head_size() + c.v_head_size()), Lkv);
}

// DeepSeek-V3's Hugging Face names: mlp.gate (the router, E x C), the
// routed experts mlp.experts.{e}.{gate,up,down}_proj and the shared experts
// as one SwiGLU MLP mlp.shared_experts.{gate,up,down}_proj of width
// shared_ffn_hidden(). Every Linear N(0, 0.02) as the dense llama MLP's.
void ParamTable::add_llama_moe_mlp(int l) {
  using R = ParamRole;
  const int64_t C = config_.n_embd, Fe = config_.moe_ffn_hidden(), Fs = config_.shared_ffn_hidden();
  auto swiglu = [&](const std::string& prefix, int64_t F, int expert) {
    for (const char* m : {"gate_proj", "up_proj"})
      add(llama_name(l, prefix + m), R::kFcWeight, {F, C}, InitKind::kNormal, kInitStd, l, expert);
    add(llama_name(l, prefix + "down_proj"), R::kMlpProjWeight, {C, F}, InitKind::kNormal, kInitStd, l, expert);
  };
  add(llama_name(l, "mlp.gate"), R::kRouter, {config_.n_expert, C}, InitKind::kNormal, kInitStd, l);
  add_router_bias(l);
  for (int e = 0; e < config_.n_expert; ++e) swiglu("mlp.experts." + std::to_string(e) + ".", Fe, e);
  if (Fs > 0) swiglu("mlp.shared_experts.", Fs, -1);
}

void ParamTable::add_gpt_blocks() {
  const GPTConfig& config = config_;
  const int64_t C = config.n_embd, V = config.vocab_size, T = config.block_size;
  const int64_t F = config.ffn_hidden();
  const double proj_std = kInitStd / std::sqrt(2.0 * config.n_layer);
  using R = ParamRole;
  add("transformer.wte.weight", R::kTokenEmbedding, {V, C}, InitKind::kNormal, kInitStd, -1);
  add("transformer.wpe.weight", R::kPositionEmbedding, {T, C}, InitKind::kNormal, kInitStd, -1);
  for (int l = 0; l < config.n_layer; ++l) {
    add_layernorm(block_name(l, "ln_1"), C, l);
    add_linear(block_name(l, "attn.c_attn"), R::kQkvWeight, 3 * C, C, true, kInitStd, l);
    add_linear(block_name(l, "attn.c_proj"), R::kAttnProjWeight, C, C, true, proj_std, l);
    add_layernorm(block_name(l, "ln_2"), C, l);
    if (config.is_moe_layer(l)) {
      add_moe_mlp(l, proj_std);
    } else {
      add_linear(block_name(l, "mlp.c_fc"), R::kFcWeight, F, C, true, kInitStd, l);
      add_linear(block_name(l, "mlp.c_proj"), R::kMlpProjWeight, C, F, true, proj_std, l);
    }
  }
  add_layernorm("transformer.ln_f", C, -1);
}

// The router, the routed experts (width moe_ffn_hidden()) and the shared
// experts as one MLP of width shared_ffn_hidden() (DeepSeek's layout), which
// is not an expert: split over TP and reduced over DP like the dense MLP.
void ParamTable::add_moe_mlp(int l, double proj_std) {
  using R = ParamRole;
  const int64_t C = config_.n_embd, Fe = config_.moe_ffn_hidden();
  add_linear(block_name(l, "mlp.router"), R::kRouter, config_.n_expert, C, false, kInitStd, l);
  add_router_bias(l);
  for (int e = 0; e < config_.n_expert; ++e) {
    add_linear(expert_name(l, e, "c_fc"), R::kFcWeight, Fe, C, true, kInitStd, l, e);
    add_linear(expert_name(l, e, "c_proj"), R::kMlpProjWeight, C, Fe, true, proj_std, l, e);
  }
  if (config_.n_shared_expert == 0) return;
  const int64_t Fs = config_.shared_ffn_hidden();
  add_linear(shared_expert_name(l, "c_fc"), R::kFcWeight, Fs, C, true, kInitStd, l);
  add_linear(shared_expert_name(l, "c_proj"), R::kMlpProjWeight, C, Fs, true, proj_std, l);
}

void ParamTable::add(std::string name, ParamRole role, Shape shape, InitKind init, double std,
                     int layer, int expert) {
  ParamSpec spec;
  spec.numel = shape_numel(shape);
  spec.name = std::move(name);
  spec.shape = std::move(shape);
  spec.offset = numel_;
  spec.init = init;
  spec.std = std;
  spec.layer = layer;
  spec.expert = expert;
  spec.role = role;
  numel_ += spec.numel;
  index_.emplace(spec.name, specs_.size());
  specs_.push_back(std::move(spec));
}

void ParamTable::add_linear(const std::string& prefix, ParamRole role, int64_t out, int64_t in,
                            bool bias, double std, int layer, int expert) {
  add(prefix + ".weight", role, {out, in}, InitKind::kNormal, std, layer, expert);
  const auto bias_role = static_cast<ParamRole>(static_cast<uint8_t>(role) + 1);
  if (bias) add(prefix + ".bias", bias_role, {out}, InitKind::kZeros, 0, layer, expert);
}

// Aux-loss-free balancing's selection bias (E), zeros at init; no gradient:
// ShardedAdamW moves it by the load counts (kernels_moe.h).
void ParamTable::add_router_bias(int l) {
  if (config_.router_bias())
    add(router_bias_name(config_, l), ParamRole::kRouterBias, {config_.n_expert}, InitKind::kZeros, 0, l);
}

void ParamTable::add_layernorm(const std::string& prefix, int64_t C, int layer) {
  add(prefix + ".weight", ParamRole::kLayerNorm, {C}, InitKind::kOnes, 0, layer);
  add(prefix + ".bias", ParamRole::kLayerNorm, {C}, InitKind::kZeros, 0, layer);
}

const ParamSpec* ParamTable::find(std::string_view name) const {
  auto it = index_.find(std::string(name));
  return it == index_.end() ? nullptr : &specs_[it->second];
}

const ParamSpec& ParamTable::at(std::string_view name) const {
  const ParamSpec* spec = find(name);
  if (spec == nullptr) throw ConfigError("unknown parameter '" + std::string(name) + "'");
  return *spec;
}

template <typename Real>
void ParamTable::init_slice(std::string_view name, uint64_t seed, int64_t offset, int64_t count,
                            Real* out) const {
  const ParamSpec& spec = at(name);
  if (offset < 0 || count < 0 || offset + count > spec.numel) {
    throw ConfigError("init_slice: range [" + std::to_string(offset) + ", " +
                      std::to_string(offset + count) + ") is outside '" + spec.name + "' " +
                      shape_string(spec.shape));
  }
  switch (spec.init) {
    case InitKind::kZeros:
      std::fill(out, out + count, Real(0));
      return;
    case InitKind::kOnes:
      std::fill(out, out + count, Real(1));
      return;
    case InitKind::kNormal: {
      const uint64_t key = stream_key(seed, spec.name);
      constexpr int64_t kChunk = 256;  // normal_at's values, a vectorised chunk at a time
      double z[kChunk];
      for (int64_t i0 = 0; i0 < count; i0 += kChunk) {
        const int64_t n = std::min(kChunk, count - i0);
        normals_at(key, static_cast<uint64_t>(offset + i0), n, z);
        for (int64_t i = 0; i < n; ++i) out[i0 + i] = static_cast<Real>(spec.std * z[i]);
      }
      return;
    }
  }
}

template <typename Real>
void ParamTable::init_all(uint64_t seed, Real* params) const {
  for (const ParamSpec& spec : specs_) {
    init_slice(spec.name, seed, 0, spec.numel, params + spec.offset);
  }
}

template void ParamTable::init_slice(std::string_view, uint64_t, int64_t, int64_t, float*) const;
template void ParamTable::init_slice(std::string_view, uint64_t, int64_t, int64_t, double*) const;
template void ParamTable::init_all(uint64_t, float*) const;
template void ParamTable::init_all(uint64_t, double*) const;

}  // namespace shardlab::model
