#include "model/config.h"

#include <climits>
#include <cstdint>
#include <sstream>

#include "runtime/errors.h"
#include "runtime/require.h"

namespace shardlab::model {
namespace {

std::string num(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

}  // namespace

const char* family_name(Family f) { return f == Family::kLlama ? "llama" : "gpt"; }

const char* router_name(Router r) { return r == Router::kSigmoid ? "sigmoid" : "softmax"; }

Router parse_router(std::string_view name) {
  if (name == "softmax") return Router::kSoftmax;
  if (name == "sigmoid") return Router::kSigmoid;
  throw ConfigError("`GPTConfig::router` must be softmax or sigmoid (got \"" + std::string(name) + "\")");
}

namespace {

// The modern-MoE fields (config.h "Modern MoE"); n_expert > 0.
void validate_modern_moe(const GPTConfig& c) {
  require(c.n_moe_ffn >= 0, "`n_moe_ffn` must be positive, or 0 for the MLP width (got " + num(c.n_moe_ffn) + ")");
  require(c.moe_first_dense >= 0 && c.moe_first_dense <= c.n_layer,
          "`moe_first_dense` " + num(c.moe_first_dense) + " must be between 0 and `n_layer` " + num(c.n_layer));
  require(c.n_shared_expert >= 0, "`n_shared_expert` must be 0 or more (got " + num(c.n_shared_expert) + ")");
  require(double(c.n_shared_expert) * c.moe_ffn_hidden() <= INT32_MAX,
          "`n_shared_expert` " + num(c.n_shared_expert) + " x the expert width " + num(c.moe_ffn_hidden()) +
              " exceeds 2^31 columns");
  require(c.moe_groups >= 1 && c.n_expert % c.moe_groups == 0,
          "`moe_groups` " + num(c.moe_groups) + " must divide `n_expert` " + num(c.n_expert) +
              " (groups of consecutive experts; 1: no group limit)");
  require(c.moe_group_top_k >= 1 && c.moe_group_top_k <= c.moe_groups,
          "`moe_group_top_k` " + num(c.moe_group_top_k) + " must be between 1 and `moe_groups` " + num(c.moe_groups));
  if (c.moe_groups > 1) {
    require(c.top_k % c.moe_group_top_k == 0,
            "`moe_group_top_k` " + num(c.moe_group_top_k) + " must divide `GPTConfig::top_k` " + num(c.top_k) +
                " (a group's key sums its top_k / moe_group_top_k best scores)");
    require(c.top_k <= int64_t{c.moe_group_top_k} * (c.n_expert / c.moe_groups),
            "`GPTConfig::top_k` " + num(c.top_k) + " exceeds the experts of the kept groups: `moe_group_top_k` " +
                num(c.moe_group_top_k) + " x " + num(c.n_expert / c.moe_groups) + " per group");
  }
  require(c.router_bias_rate >= 0 && c.router_bias_rate < 1,
          "`router_bias_rate` must be in [0, 1) (got " + num(c.router_bias_rate) + ")");
  require(c.router_bias_rate == 0 || c.top_k < c.n_expert,
          "`router_bias_rate` needs `GPTConfig::top_k` below `n_expert` (with " + num(c.top_k) + " of " +
              num(c.n_expert) + " every expert is chosen: a selection bias changes nothing)");
}

}  // namespace

int GPTConfig::moe_layers() const {
  int n = 0;
  for (int l = 0; l < n_layer; ++l) n += is_moe_layer(l);
  return n;
}

void GPTConfig::validate() const {
  require(n_layer >= 1, "`n_layer` must be at least 1 (got " + num(n_layer) + ")");
  require(n_head >= 1, "`n_head` must be at least 1 (got " + num(n_head) + ")");
  require(n_embd >= 1, "`n_embd` must be at least 1 (got " + num(n_embd) + ")");
  require(head_dim >= 0, "`head_dim` must be 0 (= `n_embd` / `n_head`) or more (got " + num(head_dim) + ")");
  // The attention's width n_head x head_size() is an int in the kernels' arithmetic (Llama 3 405B's: 16384).
  constexpr int64_t kMaxAttnWidth = int64_t{1} << 24;
  require(int64_t{n_head} * (head_dim > 0 ? head_dim : n_embd / n_head) <= kMaxAttnWidth,
          "`n_head` " + num(n_head) + " x `head_dim` " + std::to_string(head_dim) + " = " +
              std::to_string(int64_t{n_head} * head_dim) + ": the attention width must be at most " +
              std::to_string(kMaxAttnWidth));
  require(head_dim > 0 || n_embd % n_head == 0, "`n_head` " + num(n_head) + " must divide `n_embd` " + num(n_embd) +
                                                    " (head size = embd / heads)");
  require(block_size >= 1, "`block_size` must be at least 1 (got " + num(block_size) + ")");
  require(vocab_size >= 2, "`vocab_size` must be at least 2 (got " + num(vocab_size) + ")");
  require(batch_size >= 1, "`batch_size` must be at least 1 (got " + num(batch_size) + ")");
  require(n_ffn >= 0, "`n_ffn` must be positive (got " + num(n_ffn) + ")");
  require(vocab_unpadded == 0 || (vocab_unpadded >= 2 && vocab_unpadded <= vocab_size),
          "the unpadded vocabulary " + num(vocab_unpadded) + " must be between 2 and `vocab_size` " +
              num(vocab_size));
  require(n_expert >= 0, "`n_expert` must be 0 (dense) or more (got " + num(n_expert) + ")");
  require(n_expert > 0 || (n_shared_expert == 0 && n_moe_ffn == 0 && moe_first_dense == 0),
          "`n_shared_expert`, `n_moe_ffn` and `moe_first_dense` need routed experts (`n_expert` above 0)");
  require(n_expert > 0 || router_bias_rate == 0,
          "`router_bias_rate` balances routed experts: it needs `n_expert` above 0");
  require(n_expert > 0 || (moe_groups == 1 && moe_group_top_k == 1),
          "`moe_groups` and `moe_group_top_k` limit the routing of routed experts: they need `n_expert` above 0");
  validate_family();
  if (n_expert == 0) return;
  require(top_k >= 1 && top_k <= n_expert,
          "`GPTConfig::top_k` " + num(top_k) + " must be between 1 and `n_expert` " + num(n_expert));
  require(moe_every >= 1, "`moe_every` must be at least 1 (got " + num(moe_every) + ")");
  require(aux_coef >= 0, "`aux_coef` must be >= 0 (got " + num(aux_coef) + ")");
  require(capacity_factor >= 0,
          "`capacity_factor` must be >= 0, 0 = off (got " + num(capacity_factor) + ")");
  validate_modern_moe(*this);
}

// The attention and normalization knobs: GQA (kv heads dividing the query
// heads; the gpt family's fused c_attn is multi-head only), RoPE (pairs of
// features: an even head size), a positive epsilon and theta.
void GPTConfig::validate_family() const {
  require(n_kv_head >= 0, "`n_kv_head` must be 0 (= `n_head`) or more (got " + num(n_kv_head) + ")");
  require(n_head % kv_heads() == 0, "`n_kv_head` " + num(kv_heads()) + " must divide `n_head` " + num(n_head) +
                                        " (each K/V head serves n_head / n_kv_head query heads)");
  require(norm_eps > 0 && norm_eps < 1, "`norm_eps` must be in (0, 1) (got " + num(norm_eps) + ")");
  if (!is_llama()) {
    require(norm_eps == 1e-5, "`norm_eps` " + num(norm_eps) +
                                  " applies to the llama family's RMSNorm (gpt's LayerNorm keeps nanoGPT's 1e-5)");
    require(kv_heads() == n_head, "`n_kv_head` " + num(kv_heads()) +
                                      " below `n_head` (grouped-query attention) needs `family` llama");
    require(!qk_norm, "`qk_norm` (RMSNorms over q's and k's heads) needs `family` llama");
    require(kv_lora_rank == 0 && q_lora_rank == 0 && qk_rope_head_dim == 0 && v_head_dim == 0,
            "multi-head latent attention (`kv_lora_rank`) needs `family` llama");
    require(head_dim == 0 || head_dim * n_head == n_embd,
            "`head_dim` " + num(head_dim) + " apart from `n_embd` / `n_head` needs `family` llama (the gpt "
            "family's fused c_attn is 3 x n_embd wide)");
    return;
  }
  require(is_mla() || head_size() % 2 == 0, (head_dim > 0 ? "`head_dim` " + num(head_dim) + " is odd"
                                                : "`n_head` " + num(n_head) + " gives an odd head size " +
                                                      num(head_size())) +
                                    ": rotary embeddings rotate pairs of features");
  require(rope_theta > 1, "`rope_theta` must be above 1 (got " + num(rope_theta) + ")");
  validate_mla();
}

// MLA's ranks and head sizes (config.h); the llama family (validate_family).
void GPTConfig::validate_mla() const {
  require(q_lora_rank >= 0 && kv_lora_rank >= 0 && qk_rope_head_dim >= 0 && v_head_dim >= 0,
          "`q_lora_rank`, `kv_lora_rank`, `qk_rope_head_dim` and `v_head_dim` must be 0 or more");
  if (!is_mla()) {
    require(q_lora_rank == 0 && qk_rope_head_dim == 0 && v_head_dim == 0,
            "`q_lora_rank`, `qk_rope_head_dim` and `v_head_dim` shape multi-head latent attention: they need "
            "`kv_lora_rank` above 0");
    return;
  }
  require(qk_rope_head_dim > 0 && qk_rope_head_dim % 2 == 0,
          "`qk_rope_head_dim` " + num(qk_rope_head_dim) +
              " must be a positive even number under MLA (rotary embeddings rotate pairs of features)");
  require(kv_heads() == n_head, "`n_kv_head` " + num(kv_heads()) +
                                    " below `n_head`: MLA gives every head its own keys and values (no GQA)");
  require(!qk_norm, "`qk_norm` and MLA (`kv_lora_rank`) exclude each other: MLA normalizes its latents");
  require(v_head_size() <= qk_head_size(),
          "`v_head_dim` " + num(v_head_size()) + " above the scores' head size " + num(qk_head_size()) +
              " (`head_dim` + `qk_rope_head_dim`) is not modeled");
  require(int64_t{n_head} * (qk_head_size() + v_head_size()) <= (int64_t{1} << 24),
          "`n_head` x (`head_dim` + `qk_rope_head_dim` + `v_head_dim`) must be at most 2^24");
}

std::string GPTConfig::to_string() const {
  std::ostringstream os;
  os << "layers=" << n_layer << " heads=" << n_head << " embd=" << n_embd << " seq=" << block_size
     << " vocab=" << vocab_size << " batch=" << batch_size;
  if (n_ffn > 0) os << " ffn=" << n_ffn;
  if (is_llama()) os << " family=llama kv_heads=" << kv_heads() << " rope_theta=" << rope_theta;
  if (head_dim > 0) os << " head_dim=" << head_dim;
  if (qk_norm) os << " qk_norm";
  if (is_mla())
    os << " mla q_lora_rank=" << q_lora_rank << " kv_lora_rank=" << kv_lora_rank
       << " qk_rope_head_dim=" << qk_rope_head_dim << " v_head_dim=" << v_head_size();
  if (tied() != (family == Family::kGpt)) os << (tied() ? " tied" : " untied");
  if (is_moe()) {
    os << " experts=" << n_expert << " top_k=" << top_k << " moe_every=" << moe_every
       << " aux_coef=" << aux_coef << " capacity_factor=" << capacity_factor;
    if (n_moe_ffn > 0) os << " moe_ffn=" << n_moe_ffn;
    if (n_shared_expert > 0) os << " shared_experts=" << n_shared_expert;
    if (router != Router::kSoftmax) os << " router=" << router_name(router);
    if (!moe_norm_topk) os << " moe_norm_topk=0";
    if (moe_first_dense > 0) os << " moe_first_dense=" << moe_first_dense;
    if (moe_groups > 1) os << " moe_groups=" << moe_groups << " moe_group_top_k=" << moe_group_top_k;
    if (router_bias()) os << " router_bias_rate=" << router_bias_rate;
  }
  return os.str();
}

int padded_vocab(int vocab, int multiple, int tp) {
  require(multiple >= 1, "`make_vocab_size_divisible_by` must be at least 1 (got " + std::to_string(multiple) + ")");
  require(tp >= 1, "`tp` must be at least 1 (got " + std::to_string(tp) + ")");
  const int64_t m = int64_t{multiple} * tp;
  const int64_t padded = (int64_t{vocab} + m - 1) / m * m;
  require(padded <= INT32_MAX, "`make_vocab_size_divisible_by` " + std::to_string(multiple) + " x `tp` " + std::to_string(tp) +
                                   " pads the vocabulary beyond 2^31 tokens");
  return static_cast<int>(padded);
}

GPTConfig with_padded_vocab(GPTConfig c, int multiple, int tp) {
  const int vocab = c.token_vocab();
  c.vocab_size = padded_vocab(vocab, multiple, tp);
  c.vocab_unpadded = c.vocab_size == vocab ? 0 : vocab;
  c.vocab_multiple = multiple;
  return c;
}

std::string vocab_padding_note(const GPTConfig& c, int tp) {
  if (!c.vocab_padded()) return "";
  return "vocab " + std::to_string(c.vocab_unpadded) + " padded to " + std::to_string(c.vocab_size) + " (Megatron: multiple of " +
         std::to_string(c.vocab_multiple) + " x tp " + std::to_string(tp) + ")";
}

}  // namespace shardlab::model
