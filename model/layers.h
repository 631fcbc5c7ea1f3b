// Layers of the GPT built from the kernels: views of the flat parameter (or
// gradient) buffer per tensor, activation buffers, and the attention / MLP /
// MoE / block forward and backward functions. Tensor, pipeline and expert
// parallelism reuse these pieces on their own slices.
//
// Size letters: B batch, T time, N = B*T rows, C channels, NH heads, HS head
// size, E experts, K top-k, M kept MoE assignments (<= N*K).
// Backward functions accumulate (+=) into d-prefixed outputs and into the
// gradient view `g`; scratch buffers are overwritten.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "model/buffer.h"
#include "model/config.h"
#include "model/kernels.h"
#include "model/kernels_llama.h"
#include "model/params.h"
#include "model/sink.h"

namespace shardlab::model {

// ---- Views into a flat buffer laid out by a ParamTable ----------------------

template <typename Real>
struct LinearView {
  Real* weight = nullptr;  // (OC, IC)
  Real* bias = nullptr;    // (OC) or null
  int in = 0;              // IC
  int out = 0;             // OC
};

template <typename Real>
struct LayerNormView {
  Real* weight = nullptr;  // (C)
  Real* bias = nullptr;    // (C)
};

template <typename Real>
struct MlpView {
  LinearView<Real> c_fc;    // (4C, C)
  LinearView<Real> c_proj;  // (C, 4C)
};

// Multi-head latent attention's tensors (GPTConfig::is_mla); BlockView's
// c_attn is then q's up-projection (q_b_proj, or q_proj without a q latent).
template <typename Real>
struct MlaView {
  LinearView<Real> q_down;     // q_a_proj (Lq, C); null weight without a q latent
  Real* q_norm = nullptr;      // q_a_layernorm (Lq)
  LinearView<Real> kv_down;    // kv_a_proj_with_mqa (Lkv + Dr, C): rows [latent | rotated key]
  Real* kv_norm = nullptr;     // kv_a_layernorm (Lkv)
  LinearView<Real> kv_up;      // kv_b_proj (NH·(Dn + Dv), Lkv): per head [k without position | v]
};

template <typename Real>
struct BlockView {
  LayerNormView<Real> ln_1;
  LinearView<Real> c_attn;     // (3C, C), rows [q | k | v]
  LinearView<Real> attn_proj;  // (C, C)
  LayerNormView<Real> ln_2;
  bool moe = false;
  MlpView<Real> mlp;                   // dense blocks
  Real* router = nullptr;              // (E, C), MoE blocks
  Real* router_bias = nullptr;         // (E) selection bias (config.router_bias()), else null
  std::vector<MlpView<Real>> experts;  // (E) MoE blocks
  MlpView<Real> shared;                // MoE blocks' shared experts (null weights: none)
  Real* q_norm = nullptr;              // (HS) llama QK-norm (GPTConfig::qk_norm), else null
  Real* k_norm = nullptr;
  MlaView<Real> mla;                   // llama MLA (GPTConfig::is_mla), else null
};

template <typename Real>
struct GPTView {
  Real* wte = nullptr;  // (V, C), also the tied LM head
  Real* wpe = nullptr;  // (T, C); null for the llama family (rotary positions)
  std::vector<BlockView<Real>> blocks;
  LayerNormView<Real> ln_f;  // llama: model.norm (RMSNorm, bias null)
  Real* lm_head = nullptr;   // (V, C) the untied head; null: tied to wte
  Real* head() const { return lm_head ? lm_head : wte; }
};

// Llama views (layers_llama.cc): weight only norms; c_attn the fused rows
// [q | k | v] of q_proj, k_proj, v_proj (adjacent in the layout), out =
// (NH + 2·KV)·HS; mlp.c_fc the fused [gate | up] (out 2F), mlp.c_proj
// down_proj; no biases. `at(name)` gives a held tensor's place in `base`.
struct TensorPlace {
  int64_t offset = 0, rows = 0, cols = 0;
};
// In an MoE block: router = mlp.gate, experts (those `held(e)`) and shared
// the fused [gate | up] and down_proj of mlp.experts.{e} / mlp.shared_experts.
template <typename Real, class At, class Held>
BlockView<Real> llama_block_view(const At& at, Real* base, int layer, const GPTConfig& config, const Held& held);

// Views of every tensor of `table` inside the flat buffer `base` (params or grads).
template <typename Real>
GPTView<Real> make_view(const ParamTable& table, Real* base);

struct Dims {
  int B = 0, T = 0, C = 0, NH = 0;
  int F = 0;   // MLP width (GPTConfig::ffn_hidden()); 0: 4C
  int hs = 0;  // head size (GPTConfig::head_size()); 0: C / NH. MLA: the scores' (qk_head_size())
  int hv = 0;  // MLA: the values' head size (GPTConfig::v_head_size()), at most HS(); 0: HS()
  int64_t N() const { return static_cast<int64_t>(B) * T; }
  int HS() const { return hs > 0 ? hs : C / NH; }
  int HV() const { return hv > 0 ? hv : HS(); }
  int A() const { return NH * HV(); }  // the attention's output width (GPTConfig::attn_width())
  int ffn() const { return F > 0 ? F : 4 * C; }
};

// A (B, T) batch of `c`'s shapes.
inline Dims dims_of(const GPTConfig& c, int B, int T) {
  return {B, T, c.n_embd, c.n_head, c.ffn_hidden(), c.qk_head_size(), c.v_head_size()};
}

// ---- Activations --------------------------------------------------------------

template <typename Real>
struct MoeActs {
  Buffer<Real> logits, probs;    // (N,E)
  Buffer<int32_t> expert, slot;  // (N,K)
  Buffer<Real> gates;            // (N,K)
  Buffer<Real> frac;             // (E)
  Buffer<int64_t> src;           // (N*K), first M used
  Buffer<int64_t> offsets;       // (E+1)
  int64_t M = 0;
  Buffer<Real> xe, ye;       // (N*K, C), first M rows used
  Buffer<Real> fc, fc_gelu;  // (N*K, F); SwiGLU fc (N*K, 2F)
  Buffer<Real> shared_fc, shared_fc_gelu;  // (N, Fs) shared experts (GPTConfig::shared_ffn_hidden())
  Buffer<Real> shared_out;                 // (N, C)
  Real aux = 0;
  // F: an expert's MLP width, 0: 4C; Fs: the shared experts' (0: none);
  // swiglu: fc and shared_fc hold [gate | up] (2F, 2Fs per row).
  void resize(int64_t N, int C, int E, int K, int F = 0, int Fs = 0, bool swiglu = false);
};

// MLA's saved activations (GPTConfig::is_mla; layers_mla.cc; size letters
// Lq, Lkv the latents' ranks, Dr the rotated features, Dn, Dv, HS = Dn + Dr).
template <typename Real>
struct MlaActs {
  Buffer<Real> cq, cq_n, cq_rstd;     // q's latent (N,Lq) before and after its norm, rstd (N); none without it
  Buffer<Real> ckv, ckv_n, ckv_rstd;  // k/v's latent (N,Lkv) before and after its norm, rstd (N)
  Buffer<Real> kpe;                   // the shared key features before RoPE (N,Dr)
  void resize(int64_t N, const GPTConfig& config);
};
// MLA's temporaries: the up-projections' outputs (forward) and their
// gradients (backward), the down-projection's rows, the padded core output.
template <typename Real>
struct MlaScratch {
  Buffer<Real> q, kv;      // (N, NH·HS), (N, NH·(Dn + Dv))
  Buffer<Real> down;       // (N, Lkv + Dr): kv_a_proj_with_mqa's output; its gradient
  Buffer<Real> atty_pad;   // (N, NH·HS): the core's output, v padded; its gradient
  Buffer<Real> dlat;       // (N, max(Lq, Lkv)): a latent's gradient after its norm
  Buffer<Real> dlat_in;    // (N, max(Lq, Lkv)): before it
  Buffer<Real> dkpe;       // (N, Dr)
  void resize(int64_t N, const GPTConfig& config);
};

// What a block keeps for its backward on the host. The modeled program (a
// GPU run without recomputation, llm.c's layout) saves more: ln1 and ln2
// (N,C), att (B,NH,T,T), attproj and mlp_out (N,C), and the GPT's atty
// (N,C) and dense fc_gelu (N,4C); `modeled` counts them all, and is what the
// sink is told. The host recomputes them instead, bit for bit, in
// block_backward (the norms from their saved inputs; GELU(fc) in the same
// pass as GELU's backward, gelu_forward_backward; atty and att in the same
// pass as the attention backward, attention_forward_backward) or
// never reads them (attproj and mlp_out are summed in place into res1 and
// res2), which takes `small`'s resident memory from 1.39 GB to about 0.7 GB.
template <typename Real>
struct BlockActs {
  Buffer<Real> ln1_mean, ln1_rstd;  // (N)
  Buffer<Real> ln2_mean, ln2_rstd;  // (N)
  Buffer<Real> qkv;                 // (N,3C); llama (N,(NH+2KV)·HS), q and k rotated
  Buffer<Real> qkv_rep;             // llama: (N,3C) K/V repeated for the core (layers_llama.cc)
  Buffer<Real> atty;                // llama: (N,C) attention output before c_proj (GPT: recomputed)
  Buffer<Real> qk_pre, qk_rstd;     // llama QK-norm: q's and k's heads before it (N,(NH+KV)·HS), rstd (N,NH+KV)
  Buffer<Real> res1;                // (N,C) x + attn
  Buffer<Real> fc;                  // (N,4C) dense MLP; llama [gate | up] (N,2F)
  Buffer<Real> fc_gelu;             // llama's silu·up (N,F); empty for the GPT (recomputed)
  Buffer<Real> res2;                // (N,C) block output
  MoeActs<Real> moe;                // MoE blocks only
  MlaActs<Real> mla;                // MLA (GPTConfig::is_mla) only; qkv then holds the core's [q | k | v] (N,3·NH·HS)
  int64_t modeled = 0;              // elements the modeled program saves (above)
  void resize(const Dims& d, const GPTConfig& config, bool moe_block);
};

// Backward scratch shared by all blocks (overwritten by each call).
template <typename Real>
struct BlockScratch {
  Buffer<Real> ln;                        // (N,C) ln_1 / ln_2's output, forward and recomputed
  Buffer<Real> ln_mean, ln_rstd;          // (N) the recomputation's (equal to the saved ones)
  Buffer<Real> dres1, dln1, dln2, datty;  // (N,C)
  Buffer<Real> dqkv;                      // (N,3C)
  Buffer<Real> dqkv_c;                    // llama (N,(NH+2KV)·HS)
  Buffer<Real> dfc, dfc_gelu;             // the widest of (N, F) (llama's dfc: (N, 2F)), (N*K, Fe), (N, Fs);
                                          // dfc_gelu only for llama and MoE (the GPT's dense GELU: dfc, fc)
  Buffer<Real> dlogits;                   // (N,E)
  Buffer<Real> dgates;                    // (N,K)
  Buffer<Real> dxe, dye;                  // (N*K, C)
  MlaScratch<Real> mla;                   // MLA only
  void resize(const Dims& d, const GPTConfig& config);
};

// ---- Layers -------------------------------------------------------------------

// out = c_proj(attention(c_attn(inp))); saves qkv, atty, and att unless it is
// null (attention_forward: the backward then recomputes it).
template <typename Real>
void attention_layer_forward(Real* out, Real* qkv, Real* att, Real* atty, const BlockView<Real>& p,
                             const Real* inp, const Dims& d, const Exec& ex);
template <typename Real>
void attention_layer_backward(Real* dinp, const BlockView<Real>& g, Real* dqkv, Real* datty,
                              const Real* dout, const Real* inp, const Real* qkv, const Real* att,
                              const Real* atty, const BlockView<Real>& p, const Dims& d, const Exec& ex);

// out = c_proj(gelu(c_fc(inp))) over N rows; saves fc and fc_gelu (N,4C).
template <typename Real>
void mlp_forward(Real* out, Real* fc, Real* fc_gelu, const MlpView<Real>& p, const Real* inp,
                 int64_t N, int C, const Exec& ex);
template <typename Real>
void mlp_backward(Real* dinp, const MlpView<Real>& g, Real* dfc, Real* dfc_gelu, const Real* dout,
                  const Real* inp, const Real* fc, const Real* fc_gelu, const MlpView<Real>& p,
                  int64_t N, int C, const Exec& ex);

// MoE MLP: route -> dispatch -> experts -> combine. Returns this layer's aux.
template <typename Real>
Real moe_forward(Real* out, MoeActs<Real>& a, const BlockView<Real>& p, const Real* inp, int64_t N,
                 const GPTConfig& config, const Exec& ex);
// daux: gradient of the loss w.r.t. this layer's aux (aux_coef · dloss).
template <typename Real>
void moe_backward(Real* dinp, const BlockView<Real>& g, BlockScratch<Real>& s, const Real* dout,
                  Real daux, const MoeActs<Real>& a, const Real* inp, const BlockView<Real>& p,
                  int64_t N, const GPTConfig& config, const Exec& ex);

// The block's norm: LayerNorm (gpt) or RMSNorm (llama: weight only, eps
// GPTConfig::norm_eps, `mean` unused), charged as `name`; skipped in a
// phantom run. Backward accumulates into dinp and g.
template <typename Real>
void norm_forward(Real* out, Real* mean, Real* rstd, const Real* inp, const LayerNormView<Real>& p, int64_t N,
                  int C, const GPTConfig& config, const char* name, const Exec& ex);
template <typename Real>
void norm_backward(Real* dinp, const LayerNormView<Real>& g, const Real* dout, const Real* inp,
                   const LayerNormView<Real>& p, const Real* mean, const Real* rstd, int64_t N, int C,
                   const GPTConfig& config, const char* name, const Exec& ex);

// Llama attention: o_proj(attention(repeat_kv(rope(qkv_proj(inp))))), no
// biases; saves a.qkv (rotated), a.qkv_rep, a.att, a.atty. Positions 0..T-1.
template <typename Real>
void llama_attention_forward(Real* out, BlockActs<Real>& a, const BlockView<Real>& p, const Real* inp,
                             const Dims& d, const GPTConfig& config, const Exec& ex);
template <typename Real>
void llama_attention_backward(Real* dinp, const BlockView<Real>& g, BlockScratch<Real>& s, const Real* dout,
                              const Real* inp, const BlockActs<Real>& a, const BlockView<Real>& p,
                              const Dims& d, const GPTConfig& config, const Exec& ex);
// Multi-head latent attention (layers_mla.cc): out = o_proj(attention(
// mla_rope(q_up(norm(q_down(inp))), kv_up(norm(kv_down(inp)))))); saves a.mla,
// a.qkv (the core's input) and a.atty (N, NH·Dv). Positions 0..T-1.
template <typename Real>
void mla_attention_forward(Real* out, BlockActs<Real>& a, MlaScratch<Real>& s, const BlockView<Real>& p,
                           const Real* inp, const Dims& d, const GPTConfig& config, const Exec& ex);
template <typename Real>
void mla_attention_backward(Real* dinp, const BlockView<Real>& g, BlockScratch<Real>& s, const Real* dout,
                            const Real* inp, const BlockActs<Real>& a, const BlockView<Real>& p, const Dims& d,
                            const GPTConfig& config, const Exec& ex);
// SwiGLU MLP: out = down(silu(gate(inp)) · up(inp)); saves gate_up (N,2F)
// and h (N,F). F = p.c_proj.in.
template <typename Real>
void swiglu_mlp_forward(Real* out, Real* gate_up, Real* h, const MlpView<Real>& p, const Real* inp, int64_t N,
                        int C, const Exec& ex);
template <typename Real>
void swiglu_mlp_backward(Real* dinp, const MlpView<Real>& g, Real* dgate_up, Real* dh, const Real* dout,
                         const Real* inp, const Real* gate_up, const Real* h, const MlpView<Real>& p,
                         int64_t N, int C, const Exec& ex);

// x + attn(ln_1(x)), then + mlp(ln_2(.)); output in a.res2. Returns aux (0 if dense).
// s: the norms' outputs and the GPT's GELU output live in its scratch.
template <typename Real>
Real block_forward(BlockActs<Real>& a, BlockScratch<Real>& s, const BlockView<Real>& p, const Real* inp,
                   const Dims& d, const GPTConfig& config, const Exec& ex);
// The GPT's dense a.fc holds GELU(fc) afterwards (recomputed in place: dead).
template <typename Real>
void block_backward(Real* dinp, const BlockView<Real>& g, BlockScratch<Real>& s, const Real* dout,
                    Real daux, BlockActs<Real>& a, const Real* inp, const BlockView<Real>& p,
                    const Dims& d, const GPTConfig& config, const Exec& ex);

// ---- Llama views (template: At is the caller's lookup) ----------------------

template <typename Real, class At, class Held>
BlockView<Real> llama_block_view(const At& at, Real* base, int layer, const GPTConfig& config, const Held& held) {
  // One LinearView over adjacent tensors (their rows stacked).
  auto fused = [&](std::initializer_list<std::string> modules) {
    LinearView<Real> v;
    int64_t next = -1;
    for (const std::string& m : modules) {
      const TensorPlace t = at(llama_name(layer, m));
      SHARDLAB_CHECK(next < 0 || t.offset == next, "llama: fused tensors are not adjacent");
      if (next < 0) v.weight = base + t.offset;
      next = t.offset + t.rows * t.cols;
      v.out += static_cast<int>(t.rows);
      v.in = static_cast<int>(t.cols);
    }
    return v;
  };
  BlockView<Real> b;
  b.ln_1.weight = base + at(llama_name(layer, "input_layernorm")).offset;
  if (config.is_mla()) {
    if (config.q_lora_rank > 0) {
      b.mla.q_down = fused({"self_attn.q_a_proj"});
      b.mla.q_norm = base + at(llama_name(layer, "self_attn.q_a_layernorm")).offset;
      b.c_attn = fused({"self_attn.q_b_proj"});
    } else {
      b.c_attn = fused({"self_attn.q_proj"});
    }
    b.mla.kv_down = fused({"self_attn.kv_a_proj_with_mqa"});
    b.mla.kv_norm = base + at(llama_name(layer, "self_attn.kv_a_layernorm")).offset;
    b.mla.kv_up = fused({"self_attn.kv_b_proj"});
  } else {
    b.c_attn = fused({"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"});
  }
  b.attn_proj = fused({"self_attn.o_proj"});
  if (config.qk_norm) {
    b.q_norm = base + at(llama_name(layer, "self_attn.q_norm")).offset;
    b.k_norm = base + at(llama_name(layer, "self_attn.k_norm")).offset;
  }
  b.ln_2.weight = base + at(llama_name(layer, "post_attention_layernorm")).offset;
  auto swiglu = [&](const std::string& prefix) {
    return MlpView<Real>{fused({prefix + "gate_proj", prefix + "up_proj"}), fused({prefix + "down_proj"})};
  };
  b.moe = config.is_moe_layer(layer);
  if (!b.moe) {
    b.mlp = swiglu("mlp.");
    return b;
  }
  b.router = base + at(llama_name(layer, "mlp.gate")).offset;
  if (config.router_bias()) b.router_bias = base + at(router_bias_name(config, layer)).offset;
  for (int e = 0; e < config.n_expert; ++e)
    if (held(e)) b.experts.push_back(swiglu("mlp.experts." + std::to_string(e) + "."));
  if (config.n_shared_expert > 0) b.shared = swiglu("mlp.shared_experts.");
  return b;
}

}  // namespace shardlab::model
