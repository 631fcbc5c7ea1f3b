// Parameter views and activation / scratch buffer sizing for layers.h.
#include <algorithm>

#include "model/layers.h"

namespace shardlab::model {
namespace {

template <typename Real>
Real* at(const ParamTable& table, Real* base, const std::string& name) {
  return base + table.at(name).offset;
}

template <typename Real>
LinearView<Real> linear(const ParamTable& table, Real* base, const std::string& prefix, bool bias) {
  const ParamSpec& w = table.at(prefix + ".weight");
  LinearView<Real> v;
  v.weight = base + w.offset;
  v.bias = bias ? at(table, base, prefix + ".bias") : nullptr;
  v.out = static_cast<int>(w.shape[0]);
  v.in = static_cast<int>(w.shape[1]);
  return v;
}

template <typename Real>
LayerNormView<Real> layernorm(const ParamTable& table, Real* base, const std::string& prefix) {
  return {at(table, base, prefix + ".weight"), at(table, base, prefix + ".bias")};
}

template <typename Real>
MlpView<Real> mlp(const ParamTable& table, Real* base, const std::string& prefix) {
  return {linear(table, base, prefix + ".c_fc", true),
          linear(table, base, prefix + ".c_proj", true)};
}

template <typename Real>
GPTView<Real> llama_view(const ParamTable& table, Real* base) {
  const GPTConfig& config = table.config();
  auto place = [&](const std::string& name) {
    const ParamSpec& s = table.at(name);
    return TensorPlace{s.offset, s.shape[0], s.shape.size() > 1 ? s.shape[1] : 1};
  };
  GPTView<Real> v;
  v.wte = at(table, base, embedding_name(config));
  auto all = [](int) { return true; };
  for (int l = 0; l < config.n_layer; ++l) v.blocks.push_back(llama_block_view(place, base, l, config, all));
  v.ln_f.weight = at(table, base, final_norm_prefix(config) + "weight");
  return v;
}

template <typename Real>
GPTView<Real> gpt_view(const ParamTable& table, Real* base) {
  const GPTConfig& config = table.config();
  GPTView<Real> v;
  v.wte = at(table, base, "transformer.wte.weight");
  v.wpe = at(table, base, "transformer.wpe.weight");
  for (int l = 0; l < config.n_layer; ++l) {
    BlockView<Real> b;
    b.ln_1 = layernorm(table, base, block_name(l, "ln_1"));
    b.c_attn = linear(table, base, block_name(l, "attn.c_attn"), true);
    b.attn_proj = linear(table, base, block_name(l, "attn.c_proj"), true);
    b.ln_2 = layernorm(table, base, block_name(l, "ln_2"));
    b.moe = config.is_moe_layer(l);
    if (b.moe) {
      b.router = at(table, base, block_name(l, "mlp.router.weight"));
      if (config.router_bias()) b.router_bias = at(table, base, router_bias_name(config, l));
      for (int e = 0; e < config.n_expert; ++e) {
        b.experts.push_back(mlp(table, base, block_name(l, "mlp.experts." + std::to_string(e))));
      }
      if (config.n_shared_expert > 0) b.shared = mlp(table, base, block_name(l, "mlp.shared_experts"));
    } else {
      b.mlp = mlp(table, base, block_name(l, "mlp"));
    }
    v.blocks.push_back(std::move(b));
  }
  v.ln_f = layernorm(table, base, "transformer.ln_f");
  return v;
}

}  // namespace

template <typename Real>
GPTView<Real> make_view(const ParamTable& table, Real* base) {
  const GPTConfig& config = table.config();
  GPTView<Real> v = config.is_llama() ? llama_view(table, base) : gpt_view(table, base);
  if (!config.tied()) v.lm_head = at(table, base, std::string(kLmHeadName));
  return v;
}


template <typename Real>
void MoeActs<Real>::resize(int64_t N, int C, int E, int K, int F, int Fs, bool swiglu) {
  logits.assign(N * E, 0);
  probs.assign(N * E, 0);
  expert.assign(N * K, 0);
  slot.assign(N * K, 0);
  gates.assign(N * K, 0);
  frac.assign(E, 0);
  src.assign(N * K, 0);
  offsets.assign(E + 1, 0);
  xe.assign(N * K * C, 0);
  ye.assign(N * K * C, 0);
  const int64_t width = F > 0 ? F : 4 * int64_t{C}, fc_rows = swiglu ? 2 : 1;  // SwiGLU: [gate | up]
  fc.assign(N * K * width * fc_rows, 0);
  fc_gelu.assign(N * K * width, 0);
  shared_fc.assign(N * Fs * fc_rows, 0);
  shared_fc_gelu.assign(N * Fs, 0);
  shared_out.assign(Fs > 0 ? N * C : 0, 0);
}

template <typename Real>
void BlockActs<Real>::resize(const Dims& d, const GPTConfig& config, bool moe_block) {
  const int64_t N = d.N(), C = d.C, F = config.ffn_hidden();
  for (auto* v : {&res1, &res2}) v->assign(N * C, 0);
  for (auto* v : {&ln1_mean, &ln1_rstd, &ln2_mean, &ln2_rstd}) v->assign(N, 0);
  const bool llama = config.is_llama();
  const int64_t A = d.A();  // the attention's width (C unless head_dim sets it apart)
  const bool mla = config.is_mla();
  qkv.assign(N * (mla ? 3 * int64_t{d.NH} * d.HS() : llama ? A + 2 * int64_t{config.kv_heads()} * d.HS() : 3 * C), 0);
  if (llama) qkv_rep.assign(mla ? 0 : N * 3 * A, 0), atty.assign(N * A, 0);
  if (mla) this->mla.resize(N, config);
  const int64_t qk_heads = config.qk_norm ? d.NH + config.kv_heads() : 0;
  qk_pre.assign(N * qk_heads * d.HS(), 0);
  qk_rstd.assign(N * qk_heads, 0);
  if (moe_block) {
    moe.resize(N, d.C, config.n_expert, config.top_k, config.moe_ffn_hidden(), config.shared_ffn_hidden(), llama);
  } else {
    fc.assign(N * F * (llama ? 2 : 1), 0);  // SwiGLU: [gate | up]
    if (llama) fc_gelu.assign(N * F, 0);
  }
  // The modeled saves (layers.h): the kept buffers, MoE's at their N*K capacity, and the dropped ones.
  modeled = 0;
  for (const Buffer<Real>* b : {&ln1_mean, &ln1_rstd, &ln2_mean, &ln2_rstd, &qkv, &qkv_rep, &atty, &qk_pre,
                                &qk_rstd, &res1, &fc,
                                &fc_gelu, &res2, &moe.logits, &moe.probs, &moe.gates, &moe.xe, &moe.ye, &moe.fc,
                                &moe.fc_gelu, &this->mla.cq, &this->mla.cq_n, &this->mla.cq_rstd, &this->mla.ckv,
                                &this->mla.ckv_n, &this->mla.ckv_rstd, &this->mla.kpe})
    modeled += static_cast<int64_t>(b->size());
  if (mla) modeled -= N * d.NH * (d.HS() - d.HV());  // v is Dv wide on a GPU: its host padding is not saved
  modeled += 4 * N * C + int64_t{d.B} * d.NH * d.T * d.T;  // ln1, ln2, attproj, mlp_out; att
  if (!llama) modeled += N * C;                             // the GPT's atty
  if (!moe_block && !llama) modeled += N * F;               // fc_gelu
}

template <typename Real>
void BlockScratch<Real>::resize(const Dims& d, const GPTConfig& config) {
  const int64_t N = d.N(), C = d.C, F = config.ffn_hidden();
  const int64_t K = config.is_moe() ? config.top_k : 0;
  const int64_t A = d.A();
  for (auto* v : {&ln, &dres1, &dln1, &dln2}) v->assign(N * C, 0);
  datty.assign(N * A, 0);
  for (auto* v : {&ln_mean, &ln_rstd}) v->assign(N, 0);
  dqkv.assign(N * 3 * int64_t{d.NH} * d.HS(), 0);  // the core's [q | k | v] (MLA: v padded to HS)
  if (config.is_mla()) mla.resize(N, config);
  if (config.is_llama()) dqkv_c.assign(N * (A + 2 * int64_t{config.kv_heads()} * d.HS()), 0);
  const int64_t Fe = config.is_moe() ? config.moe_ffn_hidden() : 0;
  const int64_t widest = std::max({N * F, N * K * Fe, N * int64_t{config.shared_ffn_hidden()}});
  dfc.assign(widest * (config.is_llama() ? 2 : 1), 0);  // SwiGLU: [gate | up]
  // The GPT's dense MLP needs no dfc_gelu: its forward's GELU goes into dfc,
  // its backward's into the saved fc (layers.cc, block_forward).
  dfc_gelu.assign(config.is_llama() || config.is_moe() ? widest : 0, 0);
  dlogits.assign(N * config.n_expert, 0);
  dgates.assign(N * K, 0);
  dxe.assign(N * K * C, 0);
  dye.assign(N * K * C, 0);
}

template <typename Real>
void MlaActs<Real>::resize(int64_t N, const GPTConfig& c) {
  for (auto* v : {&cq, &cq_n}) v->assign(N * c.q_lora_rank, 0);
  cq_rstd.assign(c.q_lora_rank > 0 ? N : 0, 0);
  for (auto* v : {&ckv, &ckv_n}) v->assign(N * c.kv_lora_rank, 0);
  ckv_rstd.assign(N, 0);
  kpe.assign(N * c.qk_rope_head_dim, 0);
}

template <typename Real>
void MlaScratch<Real>::resize(int64_t N, const GPTConfig& c) {
  const int64_t NH = c.n_head, HS = c.qk_head_size(), lat = std::max(c.q_lora_rank, c.kv_lora_rank);
  q.assign(N * NH * HS, 0);
  kv.assign(N * NH * (c.head_size() + c.v_head_size()), 0);
  down.assign(N * (c.kv_lora_rank + c.qk_rope_head_dim), 0);
  atty_pad.assign(N * NH * HS, 0);
  for (auto* v : {&dlat, &dlat_in}) v->assign(N * lat, 0);
  dkpe.assign(N * c.qk_rope_head_dim, 0);
}

template GPTView<float> make_view(const ParamTable&, float*);
template GPTView<double> make_view(const ParamTable&, double*);
template struct MoeActs<float>;
template struct MoeActs<double>;
template struct BlockActs<float>;
template struct BlockActs<double>;
template struct BlockScratch<float>;
template struct BlockScratch<double>;
template struct MlaActs<float>;
template struct MlaActs<double>;
template struct MlaScratch<float>;
template struct MlaScratch<double>;

}  // namespace shardlab::model
