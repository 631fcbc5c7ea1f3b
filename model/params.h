// The parameter table: names, shapes, init and layout in one flat buffer
// (llm.c style). Linear weights are (out, in) as torch.nn.Linear stores them.
//
// Family gpt: nanoGPT's names and state_dict order: wte, wpe, then each block
// (ln_1, attn.c_attn, attn.c_proj, ln_2, mlp...), then ln_f. The LM head is
// tied to wte and not stored (untied: lm_head.weight last).
// Family llama: Hugging Face's LlamaForCausalLM names, no biases and no
// position table: model.embed_tokens, then each block model.layers.{i}.
// (input_layernorm, self_attn.{q,k,v,o}_proj, post_attention_layernorm,
// mlp.{gate,up,down}_proj; MoE blocks DeepSeek-V3's mlp.gate (router),
// mlp.experts.{e}.{gate,up,down}_proj, mlp.shared_experts.{gate,up,down}_proj),
// then model.norm and, untied, lm_head. q, k, v
// and gate, up are adjacent in the flat buffer, so that a rank's local
// [q | k | v] and [gate | up] rows are one fused GEMM each (layers.h views).
//
// Thread safety: a ParamTable is immutable once built and may be shared
// between device threads; the buffers it lays out belong to one device.
//
// Init (nanoGPT): Linear and Embedding weights N(0, 0.02); every c_proj
// weight (attention, MLP, experts) N(0, 0.02/sqrt(2·n_layer)); biases 0;
// LayerNorm weight 1, bias 0. Llama (Hugging Face's _init_weights): every
// Linear and the embedding N(0, 0.02), RMSNorm weights 1. Normal draws come from the counter-based RNG
// keyed by (seed, name, element index), so init_slice gives exactly the same
// values as the corresponding part of init_all.
//
// Size letters: C n_embd, T block_size, V vocab, E experts, F the MLP width
// (GPTConfig::ffn_hidden(), 4C by default).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "model/config.h"
#include "runtime/errors.h"
#include "runtime/range.h"
#include "runtime/tensor.h"

namespace shardlab::model {

enum class InitKind { kNormal, kZeros, kOnes };

// What a tensor is in the model, so that code that shards, orders or counts
// parameters asks the table instead of matching names.
enum class ParamRole : uint8_t {
  kTokenEmbedding,     // transformer.wte.weight, model.embed_tokens.weight
  kPositionEmbedding,  // transformer.wpe.weight
  kLayerNorm,          // ln_1, ln_2 (layer >= 0) and ln_f (layer -1), weight and bias; RMSNorms
  kQkvWeight,          // attn.c_attn.weight; llama q_proj
  kQkvBias,            // attn.c_attn.bias
  kAttnProjWeight,     // attn.c_proj.weight; llama o_proj
  kAttnProjBias,       // attn.c_proj.bias
  kFcWeight,           // mlp.c_fc.weight, mlp.experts.e.c_fc.weight; llama gate_proj, up_proj
  kFcBias,             // mlp.c_fc.bias, mlp.experts.e.c_fc.bias
  kMlpProjWeight,      // mlp.c_proj.weight, mlp.experts.e.c_proj.weight; llama down_proj
  kMlpProjBias,        // mlp.c_proj.bias, mlp.experts.e.c_proj.bias
  kRouter,             // mlp.router.weight; llama mlp.gate.weight
  kKvWeight,           // llama self_attn.k_proj.weight, v_proj.weight (q_proj: kQkvWeight)
  kLmHead,             // lm_head.weight: the untied LM head (V, C)
  kRouterBias,         // mlp.{router,gate}.e_score_correction_bias (E): aux-loss-free balancing
  kQkNorm,             // llama self_attn.q_norm.weight, k_norm.weight (HS): QK-norm (GPTConfig::qk_norm)
  // Multi-head latent attention (GPTConfig::is_mla):
  kMlaDown,  // self_attn.q_a_proj.weight (Lq, C), kv_a_proj_with_mqa.weight (Lkv + Dr, C): whole on every TP rank
  kMlaNorm,  // self_attn.q_a_layernorm.weight (Lq), kv_a_layernorm.weight (Lkv): the latents' RMSNorms
  kMlaUp,    // self_attn.q_b_proj.weight (NH·Dqk, Lq) or q_proj (NH·Dqk, C), kv_b_proj (NH·(Dn + Dv), Lkv): by heads
};

struct ParamSpec {
  std::string name;    // e.g. "transformer.h.0.attn.c_attn.weight"
  Shape shape;         // e.g. [3C, C]
  int64_t offset = 0;  // first element in the flat buffer
  int64_t numel = 0;
  InitKind init = InitKind::kZeros;
  double std = 0;  // for kNormal
  int layer = -1;  // block index, -1 outside the blocks
  int expert = -1;  // expert index inside an MoE block, -1 for every other tensor
  ParamRole role = ParamRole::kLayerNorm;
  bool is_expert() const { return expert >= 0; }
  bool is_final_norm() const { return role == ParamRole::kLayerNorm && layer < 0; }
  // nanoGPT's optimizer groups: weight decay only on tensors of 2+ dims.
  bool decay() const { return shape.size() >= 2; }
};

// The table's numel() in closed form, without building it (a model too large
// to lay out is still counted exactly; doubles keep absurd sizes finite).
double count_params(const GPTConfig& config);
// Parameters one token runs through: every tensor but the routed experts it
// is not sent to (the whole router, top_k routed experts, the shared ones).
double count_active_params(const GPTConfig& config);

class ParamTable {
 public:
  explicit ParamTable(const GPTConfig& config);  // validates config

  const GPTConfig& config() const { return config_; }
  const std::vector<ParamSpec>& specs() const { return specs_; }
  int64_t numel() const { return numel_; }
  // nullptr if there is no such tensor.
  const ParamSpec* find(std::string_view name) const;
  // Throws ConfigError naming the tensor if there is no such tensor.
  const ParamSpec& at(std::string_view name) const;

  // Elements [offset, offset + count) of tensor `name`, as init_all would
  // produce them. Throws ConfigError if the range is outside the tensor.
  template <typename Real>
  void init_slice(std::string_view name, uint64_t seed, int64_t offset, int64_t count,
                  Real* out) const;
  // Every tensor into the flat buffer params (numel()).
  template <typename Real>
  void init_all(uint64_t seed, Real* params) const;

 private:
  void add(std::string name, ParamRole role, Shape shape, InitKind init, double std, int layer,
           int expert = -1);
  // prefix.weight (out, in) with `role`, prefix.bias (out) with the next role.
  void add_linear(const std::string& prefix, ParamRole role, int64_t out, int64_t in, bool bias,
                  double std, int layer, int expert = -1);
  void add_layernorm(const std::string& prefix, int64_t C, int layer);
  void add_moe_mlp(int layer, double proj_std);
  void add_router_bias(int layer);
  void add_llama_moe_mlp(int layer);
  void add_gpt_blocks();
  void add_llama_blocks();
  void add_mla(int layer);

  GPTConfig config_;
  std::vector<ParamSpec> specs_;
  std::unordered_map<std::string, size_t> index_;
  int64_t numel_ = 0;
};

// Tensor parallelism slices c_attn by heads: heads [h0, h1) own three
// contiguous row ranges of c_attn.weight (3C, C) and c_attn.bias (3C), one in
// each of q, k and v. Rows [begin, end()); for the weight, elements
// [begin·C, end()·C) (ready for init_slice).
std::array<Range, 3> c_attn_head_rows(int C, int n_head, int h0, int h1);

// Name helpers: block_name(2, "attn.c_attn.weight") = "transformer.h.2.attn.c_attn.weight";
// expert_name(2, 5, "c_fc.bias") = "transformer.h.2.mlp.experts.5.c_fc.bias".
std::string block_name(int layer, std::string_view suffix);
// The flat range of every spec (ParamSpec or a shard spec: name, offset,
// numel) whose name starts with `prefix`; they must be contiguous.
template <class Spec>
Range prefix_range(const std::vector<Spec>& specs, std::string_view prefix) {
  int64_t begin = -1, end = -1;
  for (const Spec& s : specs) {
    if (std::string_view(s.name).substr(0, prefix.size()) != prefix) continue;
    if (begin < 0) begin = s.offset;
    SHARDLAB_CHECK(end < 0 || s.offset == end, "tensors of one prefix are not contiguous");
    end = s.offset + s.numel;
  }
  return begin < 0 ? Range{} : Range{begin, end - begin};
}
std::string expert_name(int layer, int expert, std::string_view suffix);
// shared_expert_name(2, "c_fc.weight") = "transformer.h.2.mlp.shared_experts.c_fc.weight".
std::string shared_expert_name(int layer, std::string_view suffix);

// Names that depend on the family (gpt: nanoGPT's, llama: Hugging Face's).
// block_prefix(c, 2): "transformer.h.2." or "model.layers.2.".
std::string block_prefix(const GPTConfig& c, int layer);
std::string embedding_name(const GPTConfig& c);     // transformer.wte.weight, model.embed_tokens.weight
std::string final_norm_prefix(const GPTConfig& c);  // "transformer.ln_f.", "model.norm."
inline constexpr std::string_view kLmHeadName = "lm_head.weight";  // untied head, both families
// Llama tensors of block `layer`: llama_name(3, "mlp.up_proj") = "model.layers.3.mlp.up_proj.weight".
std::string llama_name(int layer, std::string_view module);
// The selection bias of block `layer`'s router (config.router_bias()):
// "model.layers.3.mlp.gate.e_score_correction_bias" (DeepSeek-V3's name),
// "transformer.h.3.mlp.router.e_score_correction_bias".
std::string router_bias_name(const GPTConfig& c, int layer);

}  // namespace shardlab::model
