// The block composing the parallelisms: attention, MLP or MoE, forward and
// backward side by side; its buffers' sizes. Shapes use the letters of dims.h.
#include "model/parallel/block.h"

#include <algorithm>

#include "collectives/collectives.h"
#include "model/kernels.h"
#include "model/parallel/expert/ep_dispatch.h"
#include "model/parallel/expert/ep_node_dispatch.h"
#include "model/parallel/tensor/attention.h"

namespace shardlab::parallel {

using model::BlockView;
using model::Exec;
using model::GPTConfig;

namespace {

// Dropout's cost when the model has dropout (its arithmetic is not run: phantom runs only).
void dropout_forward(int64_t n, const char* name, const BlockContext& c) {
  if (c.dropout) c.ex().op(name, model::dropout_forward_cost(n, c.ex().elem));
}
void dropout_backward(int64_t n, const char* name, const BlockContext& c) {
  if (c.dropout) c.ex().op(name, model::dropout_backward_cost(n, c.ex().elem));
}

// After each projection: out (rows,C) = residual + dropout(x + bias), no
// bias in llama and MoE layers (`bias` is null in phantom runs too: `biased` says). Unfused (KernelFusions::bias_dropout_add
// off): the bias add, the dropout and the residual add, three kernels, the
// first two writing x in place; fused, Megatron-LM's
// bias_dropout_add_fused_train: one kernel reads x, the residual and the
// bias and writes the sum and the dropout mask (its backward is the
// dropout's: the bias' gradient is the wgrad GEMM's, the residual's passes
// through, as unfused).
struct BdaNames {
  const char *bias, *dropout, *fused;
};
void bias_dropout_add(float* out, const float* residual, float* x, bool biased, const float* bias, int64_t rows,
                      int C, const BdaNames& names, const BlockContext& c) {
  const Exec& ex = c.ex();
  const int64_t n = rows * C;
  if (!ex.fusions.bias_dropout_add) {
    if (biased) add_bias_rows(x, bias, rows, C, names.bias, ex);
    dropout_forward(n, names.dropout, c);
    model::residual_forward(ex, "residual.fwd", out, residual, x, n);
    return;
  }
  const Exec quiet = ex.part_of_fused();
  if (biased) add_bias_rows(x, bias, rows, C, names.bias, quiet);
  model::residual_forward(quiet, "residual.fwd", out, residual, x, n);
  ex.op(names.fused, model::bias_dropout_add_cost(n, biased ? C : 0, c.dropout, ex.elem));
}

// The attention probabilities: B·(NH/tp)·T·T (this rank's heads).
int64_t attention_probs(const ShardDims& d) { return int64_t{d.B} * d.NHl() * d.T * d.T; }

}  // namespace

void attention_dropout_forward(const ShardDims& d, const BlockContext& c) {
  if (!d.flash) dropout_forward(attention_probs(d), "attn.dropout.fwd", c);  // else inside the fused kernel
}
void attention_dropout_backward(const ShardDims& d, const BlockContext& c) {
  if (!d.flash) dropout_backward(attention_probs(d), "attn.dropout.bwd", c);
}

const AttentionCore& BlockContext::attention_core() const {
  return attention ? *attention : LocalAttention::instance();
}

// GQA's K/V heads repeated for the core. The unfused core runs the copy
// (Megatron-core's local DotProductAttention repeat_interleaves K and V);
// the fused one takes the K/V heads as they are (Transformer Engine's
// DotProductAttention gets num_gqa_groups, and cuDNN's and FlashAttention's
// kernels read each query head's group K/V head in place, forward and
// backward): the host still copies for its math, charged nothing.
const model::Exec& repeat_kv_exec(const BlockContext& c, model::Exec& quiet) {
  if (!c.attention_core().fused()) return c.ex();
  quiet = c.ex().part_of_fused();
  return quiet;
}

const float* core_qkv(const BlockActs& a, BlockScratch& s, const ShardDims& d, const GPTConfig& config,
                      const BlockContext& c) {
  if (!config.is_llama() || !d.kv_repeated()) return a.qkv.data();
  const model::GqaHeads g = d.gqa(c.tp.rank());
  model::Exec quiet;
  model::repeat_kv_forward(repeat_kv_exec(c, quiet), "attn.repeat_kv.fwd", s.qkv_rep.data(), a.qkv.data(), d.N(),
                           g);
  return s.qkv_rep.data();
}

// ---- Buffers --------------------------------------------------------------------

void BlockActs::resize(const ShardDims& d, const model::GPTConfig& config, bool moe_block) {
  const int64_t N = d.N(), Nr = d.rows(), C = d.C, Cl = d.Cl(), Fl = d.Fl();
  for (auto* v : {&ln1, &ln2, &attproj, &res1, &mlp_out, &res2}) v->assign(Nr * C, 0);
  // RMSNorm keeps one statistic per row.
  for (auto* v : {&ln1_rstd, &ln2_rstd}) v->assign(Nr, 0);
  for (auto* v : {&ln1_mean, &ln2_mean}) v->assign(config.is_llama() ? 0 : Nr, 0);
  qkv.assign(N * d.qkv_width(), 0);
  att.assign(d.att_elements(), 0);
  atty.assign(N * d.Cv(), 0);
  mla.resize(config.is_mla() ? Nr : 0, config);
  v_pad = config.is_mla() ? N * (Cl - d.Cv()) : 0;
  const int64_t qk_heads = config.qk_norm ? d.NHl() + d.KVl() : 0;
  qk_pre.assign(N * qk_heads * d.HS(), 0);
  qk_rstd.assign(N * qk_heads, 0);
  fc.clear();
  fc_gelu.clear();
  if (!moe_block) {
    fc.assign(N * Fl * (config.is_llama() ? 2 : 1), 0);
    fc_gelu.assign(N * Fl, 0);
    return;
  }
  moe.resize(d, config);
}

int64_t BlockActs::saved_elements(bool fp8) const {
  int64_t n = 0;
  for (const Buf<float>* b : {&ln1_mean, &ln1_rstd, &ln2_mean, &ln2_rstd, &qkv, &att, &attproj, &res1,
                              &fc, &mlp_out, &res2, &qk_pre, &qk_rstd}) {
    n += static_cast<int64_t>(b->size());
  }
  for (const Buf<float>* b : {&ln1, &ln2, &atty, &fc_gelu}) {
    const auto size = static_cast<int64_t>(b->size());
    n += fp8 ? (size + 1) / 2 : size;
  }
  // MLA: v is Dv wide on a GPU, its host padding to HS is not kept.
  n += mla.saved_elements(fp8) - v_pad;
  return n + moe.saved_elements(fp8);
}

void BlockScratch::resize(const ShardDims& d, const model::GPTConfig& config) {
  const int64_t N = d.N(), Nr = d.rows(), C = d.C, Cl = d.Cl(), Fl = d.Fl();
  for (auto* v : {&full_in, &full_dout, &partial, &rep, &moe_out}) v->assign(N * C, 0);
  for (auto* v : {&dres1, &dln}) v->assign(Nr * C, 0);
  datty.assign(N * d.Cv(), 0);
  dqkv.assign(N * 3 * Cl, 0);
  if (config.is_mla()) mla.resize(d, config);
  const bool repeat = config.is_llama() && d.kv_repeated();
  qkv_rep.assign(repeat ? N * 3 * Cl : 0, 0);
  dqkv_c.assign(repeat ? N * d.qkv_width() : 0, 0);
  positions.resize(size_t(d.T));
  for (int t = 0; t < d.T; ++t) positions[size_t(t)] = d.position(t);
  dfc.assign(N * Fl * (config.is_llama() ? 2 : 1), 0);
  dfc_gelu.assign(N * Fl, 0);
  if (config.is_moe()) moe.resize(d, config);
}

namespace {

// ---- Attention: c_attn column-parallel by heads, c_proj row-parallel ----------
// Llama: c_attn is the fused [q | k | v] of q_proj (this rank's query heads),
// k_proj and v_proj (its K/V heads, or all of them); q and k are rotated
// (RoPE at the tokens' global positions: ShardDims::position) and the K/V heads
// repeated for the core (repeat_kv); no biases.

// out (Nr,C) = exit(c_proj_partial(attention(c_attn(inp_full)))) + bias.
void tp_attention_forward(float* out, BlockActs& a, const BlockView<float>& p,
                          const float* inp_full, const ShardDims& d, const GPTConfig& config,
                          BlockScratch& s, const BlockContext& c) {
  const Exec& ex = c.ex();
  const int64_t N = d.N();
  const int C = d.C, Cl = d.Cl(), W = d.qkv_width();
  const bool llama = config.is_llama();
  const Exec te = ex.te_linear();  // the projections: FP8 under --precision fp8
  if (llama) {
    model::linear_forward(te, "attn.c_attn.fwd", a.qkv.data(), inp_full, p.c_attn.weight, N, C, W);
    const model::GqaHeads g = d.gqa(c.tp.rank());
    if (p.q_norm)  // this rank's heads: the norms' weights whole, their gradients summed over TP (ShardedGPT)
      model::qk_norm_forward(ex, a.qkv.data(), a.qk_pre.data(), a.qk_rstd.data(), p.q_norm, p.k_norm, N, g,
                             config.norm_eps);
    model::rope_forward(ex, "attn.rope.fwd", a.qkv.data(), a.qkv.data(), s.positions.data(), d.B, d.T,
                        g.NHq + g.KVl, g.HS, W, config.rope_theta);
  } else {
    model::linear_forward(te, "attn.c_attn.fwd", a.qkv.data(), inp_full, p.c_attn.weight, p.c_attn.bias, N, C,
                          W);
  }
  c.attention_core().forward(a.atty.data(), a.att.data(), core_qkv(a, s, d, config, c), d, c.tp);
  attention_dropout_forward(d, c);
  model::linear_forward(te, "attn.c_proj.fwd", s.partial.data(), a.atty.data(), p.attn_proj.weight,
                        N, Cl, C);  // its bias after the reduction
  reduce_scatter_after_gemm(c.tp, s.partial.data(), out, d.rows(), C);  // proj_fprop
}  // its bias, the hidden dropout and the residual add: bias_dropout_add

// dinp_partial (N,C) += this rank's share of d/d inp_full; dout_full (N,C) complete.
void tp_attention_backward(float* dinp_partial, const BlockView<float>& g, BlockScratch& s,
                           const float* dout_full, const float* inp_full, const BlockActs& a,
                           const BlockView<float>& p, const ShardDims& d, const GPTConfig& config,
                           WeightGrads& wg, const BlockContext& c) {
  const Exec& ex = c.ex();
  const int64_t N = d.N();
  const int C = d.C, Cl = d.Cl(), W = d.qkv_width();
  const bool llama = config.is_llama();
  zero(s.datty.data(), N * Cl);
  linear_backward_split(s.datty.data(), g.attn_proj.weight, g.attn_proj.bias, dout_full,
                        a.atty.data(), p.attn_proj.weight, N, Cl, C,
                        {"attn.c_proj.dgrad", "attn.c_proj.wgrad", !llama}, wg, ex.te_linear());
  attention_dropout_backward(d, c);
  zero(s.dqkv.data(), N * 3 * Cl);
  c.attention_core().backward(s.dqkv.data(), s.datty.data(), core_qkv(a, s, d, config, c), a.atty.data(),
                              a.att.data(), d, c.tp);
  float* dqkv = s.dqkv.data();  // (N,W): the compact rows of the projection
  if (llama) {
    const model::GqaHeads h = d.gqa(c.tp.rank());
    if (d.kv_repeated()) {  // each K/V head sums the gradients of its G query heads
      zero(s.dqkv_c.data(), N * W);
      model::Exec quiet;
      model::repeat_kv_backward(repeat_kv_exec(c, quiet), "attn.repeat_kv.bwd", s.dqkv_c.data(), s.dqkv.data(), N,
                                h);
      dqkv = s.dqkv_c.data();
    }
    model::rope_backward(ex, "attn.rope.bwd", dqkv, dqkv, s.positions.data(), d.B, d.T, h.NHq + h.KVl, h.HS, W,
                         config.rope_theta);
    if (p.q_norm)
      model::qk_norm_backward(ex, dqkv, g.q_norm, g.k_norm, a.qk_pre.data(), p.q_norm, p.k_norm, a.qk_rstd.data(), N,
                              h);
  }
  linear_backward_split(dinp_partial, g.c_attn.weight, g.c_attn.bias, dqkv, inp_full,
                        p.c_attn.weight, N, C, W, {"attn.c_attn.dgrad", "attn.c_attn.wgrad", !llama},
                        wg, ex.te_linear());
}

// With whole experts and a load-balancing loss each TP rank's aux loss has
// its own rows' P_i: the batch's is their mean.
bool aux_over_tp(const GPTConfig& config, const BlockContext& c) {
  return config.aux_coef != 0 && c.moe.global_routing();
}

// With whole experts the shared experts stay split over TP like the dense
// MLP (Megatron's SharedExpertMLP): all-gather ln_2's rows, column- and
// row-parallel GEMMs, reduce-scatter; out (Nr,C) += this rank's rows.
void whole_shared_experts_forward(float* out, BlockActs& a, const BlockView<float>& p, const ShardDims& d,
                                  const GPTConfig& config, BlockScratch& s, const BlockContext& c) {
  if (config.n_shared_expert == 0) return;
  const Exec& ex = c.ex();
  const int64_t Nr = d.rows();
  const int C = d.C;
  TpMoeActs& m = a.moe;
  const float* full = enter_column_parallel(c.tp, a.ln2.data(), s.full_in.data(), Nr, C);
  tp_mlp_partial_forward(s.partial.data(), m.shared_fc.data(), m.shared_fc_gelu.data(), p.shared,
                         full, d.N(), C, shared_fl(d, config), ex, config.is_llama());
  exit_row_parallel(c.tp, s.partial.data(), m.shared_out.data(), Nr,
                    C);  // this rank's rows of their sum
  if (!config.is_llama())
    add_bias_rows(m.shared_out.data(), p.shared.c_proj.bias, Nr, C, "moe.shared.c_proj.bias.fwd",
                  ex);
  model::residual_forward(ex, "moe.shared.add", out, out, m.shared_out.data(), Nr * C);
}

// Expert tensor parallelism 1 (ShardDims::experts_whole, sp): this rank's Nr
// rows are routed and go to their whole experts through the EP group (drawn
// from tp x dp) and back, with no TP collective around them (Megatron-core's
// MoE layer with expert_tensor_parallel_size 1). The shared experts stay
// split over TP like the dense MLP (Megatron's SharedExpertMLP): all-gather
// the rows, column- and row-parallel GEMMs, reduce-scatter, added to the
// routed output.
float whole_experts_forward(float* out, BlockActs& a, const BlockView<float>& p, const ShardDims& d,
                            const GPTConfig& config, BlockScratch& s, const BlockContext& c) {
  float aux = c.moe.node_dispatch()
                  ? ep_node_moe_forward(out, a.moe, s.moe, p, a.ln2.data(), d, config, c.moe)
                  : ep_moe_forward(out, a.moe, s.moe, p, a.ln2.data(), d, config, c.moe);
  if (aux_over_tp(config, c)) {
    // f_i is the global batch's (the capacity group's counts), P_i this
    // rank's rows': the batch's loss is the TP ranks' mean (one float).
    collectives::all_reduce(*c.moe.dev, *c.moe.tp, collectives::ConstBuffer(&aux, 1),
                            collectives::Buffer(&aux, 1), collectives::ReduceOp::kSum,
                            c.moe.on_compute());
    aux /= float(c.moe.tp->size());
  }
  whole_shared_experts_forward(out, a, p, d, config, s, c);
  return aux;
}

// s.dln (Nr,C) = the gradient of ln_2's output through the MoE layer above.
void whole_experts_backward(const BlockView<float>& g, BlockScratch& s, const float* dout,
                            float daux, const BlockActs& a, const BlockView<float>& p,
                            const ShardDims& d, const GPTConfig& config, WeightGrads& wg,
                            const BlockContext& c) {
  const Exec& ex = c.ex();
  const int64_t Nr = d.rows();
  const int C = d.C;
  zero(s.dln.data(), Nr * C);
  zero(s.rep.data(), Nr * C);
  auto moe_backward = c.moe.node_dispatch() ? ep_node_moe_backward : ep_moe_backward;
  // the experts' input gradient is complete (whole experts), the router's too (its own rows)
  const float my_daux =
      aux_over_tp(config, c) ? daux / float(c.moe.tp->size()) : daux;  // the mean's share
  moe_backward(s.dln.data(), s.rep.data(), g, s.moe, dout, my_daux, a.moe, a.ln2.data(), p, d,
               config, wg, c.moe);
  const auto add = [&](const char* name) {
    ex.run(name, model::residual_forward_cost(Nr * C, ex.elem), [&] {
      for (int64_t i = 0; i < Nr * C; ++i) s.dln[i] += s.rep[i];
    });
  };
  add("moe.router.dinp.add");
  if (config.n_shared_expert == 0) return;
  const float* dout_full = exit_row_parallel_bwd(c.tp, dout, s.full_dout.data(), Nr, C);
  const float* ln2_full = enter_column_parallel(c.tp, a.ln2.data(), s.full_in.data(), Nr, C);
  zero(s.partial.data(), d.N() * C);
  tp_mlp_backward(s.partial.data(), g.shared, s.moe.dfc.data(), s.moe.dfc_gelu.data(), dout_full,
                  ln2_full, a.moe.shared_fc.data(), a.moe.shared_fc_gelu.data(), p.shared, d.N(), C,
                  shared_fl(d, config), wg, ex, config.is_llama());
  enter_column_parallel_bwd(c.tp, s.partial.data(), s.rep.data(), Nr,
                            C);  // reduce-scatter: this rank's rows
  add("moe.shared.dinp.add");
}

// ln_2's output (a.ln2) -> out (Nr,C) through the MoE layer; its aux loss.
// (The MoE layers' collectives stay blocking: no TE userbuffers there.)
float moe_layer_forward(float* out, BlockActs& a, const BlockView<float>& p, const ShardDims& d,
                        const GPTConfig& config, BlockScratch& s, const BlockContext& c) {
  if (d.experts_whole) return whole_experts_forward(out, a, p, d, config, s, c);
  const int64_t Nr = d.rows();
  const int C = d.C;
  const float* ln2_full = enter_column_parallel(c.tp, a.ln2.data(), s.full_in.data(), Nr, C);
  float* out_full = c.tp.sp ? s.moe_out.data() : out;
  const float aux = c.moe.node_dispatch()    ? ep_node_moe_forward(out_full, a.moe, s.moe, p, ln2_full, d, config, c.moe)
                    : c.moe.expert_parallel() ? ep_moe_forward(out_full, a.moe, s.moe, p, ln2_full, d, config, c.moe)
                                              : tp_moe_forward(out_full, a.moe, p, ln2_full, d, config, c.moe);
  if (c.tp.sp) scatter_to_sequence_parallel_fwd(c.tp, out_full, out, Nr * C);
  return aux;
}

// ln_2's output (a.ln2) -> out (Nr,C) through the dense MLP (fc1_fprop, fc2_fprop).
void dense_mlp_forward(float* out, BlockActs& a, const BlockView<float>& p, const ShardDims& d,
                       const GPTConfig& config, BlockScratch& s, const BlockContext& c) {
  const int64_t Nr = d.rows();
  const int C = d.C;
  const float* ln2_full = gather_into_gemm(c.tp, a.ln2.data(), s.full_in.data(), Nr, C);
  tp_mlp_partial_forward(s.partial.data(), a.fc.data(), a.fc_gelu.data(), p.mlp, ln2_full, d.N(), C, d.Fl(),
                         c.ex(), config.is_llama());
  reduce_scatter_after_gemm(c.tp, s.partial.data(), out, Nr, C);
}

}  // namespace

// ---- Block ----------------------------------------------------------------------

float block_forward(BlockActs& a, const BlockView<float>& p, const float* x, const ShardDims& d,
                    const GPTConfig& config, BlockScratch& s, const BlockContext& c) {
  const Exec& ex = c.ex();
  const int64_t Nr = d.rows();
  const int C = d.C;
  model::norm_forward(a.ln1.data(), a.ln1_mean.data(), a.ln1_rstd.data(), x, p.ln_1, Nr, C, config, "ln_1.fwd", ex);
  if (config.is_mla()) {
    mla_attention_forward(a.attproj.data(), a, p, a.ln1.data(), d, config, s, c);
  } else {
    const float* ln1_full = gather_into_gemm(c.tp, a.ln1.data(), s.full_in.data(), Nr, C);  // qkv_fprop
    tp_attention_forward(a.attproj.data(), a, p, ln1_full, d, config, s, c);
  }
  bias_dropout_add(a.res1.data(), x, a.attproj.data(), !config.is_llama(), p.attn_proj.bias, Nr, C,
                   {"attn.c_proj.bias.fwd", "attn.hidden_dropout.fwd", "attn.bias_dropout_add.fwd"}, c);
  model::norm_forward(a.ln2.data(), a.ln2_mean.data(), a.ln2_rstd.data(), a.res1.data(), p.ln_2, Nr, C, config,
                      "ln_2.fwd", ex);
  float aux = 0;
  if (p.moe)
    aux = moe_layer_forward(a.mlp_out.data(), a, p, d, config, s, c);
  else
    dense_mlp_forward(a.mlp_out.data(), a, p, d, config, s, c);
  bias_dropout_add(a.res2.data(), a.res1.data(), a.mlp_out.data(), !p.moe && !config.is_llama(),
                   p.mlp.c_proj.bias, Nr, C,
                   {"mlp.c_proj.bias.fwd", "mlp.hidden_dropout.fwd", "mlp.bias_dropout_add.fwd"}, c);
  return aux;
}

int64_t selective_kept_elements(const BlockActs& a, const ShardDims& d, const GPTConfig& config, bool moe_block,
                                unsigned modules, bool fp8) {
  const auto size = [](const auto& b) { return static_cast<int64_t>(b.size()); };
  const auto fp8_half = [&](int64_t n) { return fp8 ? (n + 1) / 2 : n; };  // as saved_elements counts them
  const auto gemm_input = [&](const Buf<float>& b) { return fp8_half(size(b)); };
  int64_t n = a.saved_elements(fp8);
  if (modules & kRecomputeCoreAttn) n -= size(a.att);
  if (modules & kRecomputeMlaUpProj) n -= size(a.qkv) - a.v_pad;  // the core's q, k and v (v Dv wide)
  if (!moe_block) {
    if (modules & kRecomputeMlp) n -= size(a.fc) + gemm_input(a.fc_gelu);
    return n;
  }
  if (modules & kRecomputeLayerNorm) n -= gemm_input(a.ln2);
  if (modules & kRecomputeMoe) return n - a.moe.saved_elements(fp8);  // its input, ln_2's output, stays
  if (modules & kRecomputeMoeAct) n -= fp8_half(experts_activation_elements(a.moe, d, config));
  if (modules & kRecomputeSharedExperts) n -= size(a.moe.shared_fc) + gemm_input(a.moe.shared_fc_gelu);
  return n;
}

void block_recompute(BlockActs& a, const BlockView<float>& p, const ShardDims& d, const GPTConfig& config,
                     BlockScratch& s, const BlockContext& c, unsigned modules) {
  const Exec& ex = c.ex();
  const int64_t Nr = d.rows();
  const int C = d.C;
  if (modules & kRecomputeMlaUpProj) mla_up_forward(a, p, a.ln1.data(), d, config, s, c);
  if (modules & kRecomputeCoreAttn) {
    if (config.is_mla())
      mla_core_forward(a, d, config, s, c);
    else
      c.attention_core().forward(a.atty.data(), a.att.data(), core_qkv(a, s, d, config, c), d, c.tp);
    // The recomputed core ends with the dropout on its probabilities, as
    // Megatron-LM's checkpointed CoreAttention does (the forward charges it
    // in the attention's forward): B·(NH/tp)·T·T elements.
    attention_dropout_forward(d, c);
  }
  // A re-run module's output is the forward's: it lands in scratch that the
  // block's backward overwrites (s.dres1, (Nr,C); s.moe_out, (N,C)).
  if (!p.moe) {
    if (modules & kRecomputeMlp) dense_mlp_forward(s.dres1.data(), a, p, d, config, s, c);
    return;
  }
  if (modules & kRecomputeLayerNorm)
    model::norm_forward(a.ln2.data(), a.ln2_mean.data(), a.ln2_rstd.data(), a.res1.data(), p.ln_2, Nr, C, config,
                        "ln_2.fwd", ex);
  if (modules & kRecomputeMoe) {  // its aux loss was counted in the forward
    moe_layer_forward(s.dres1.data(), a, p, d, config, s, c);
    return;
  }
  if (modules & kRecomputeMoeAct) tp_experts_activation_forward(a.moe, d, config, ex);
  if ((modules & kRecomputeSharedExperts) && config.n_shared_expert > 0) {
    if (d.experts_whole) {
      whole_shared_experts_forward(s.dres1.data(), a, p, d, config, s, c);
    } else {
      const float* ln2_full = enter_column_parallel(c.tp, a.ln2.data(), s.full_in.data(), Nr, C);
      tp_shared_experts_forward(s.moe_out.data(), a.moe, p, ln2_full, d, config, c.moe);
    }
  }
}

void block_backward(float* dinp, const BlockView<float>& g, BlockScratch& s, const float* dout,
                    float daux, const BlockActs& a, const float* inp, const BlockView<float>& p,
                    const ShardDims& d, const GPTConfig& config, WeightGrads& wg,
                    const BlockContext& c) {
  const Exec& ex = c.ex();
  const int64_t N = d.N(), Nr = d.rows();
  const int C = d.C;
  // res2 = res1 + mlp_out: both receive dout
  if (ex.math()) std::copy(dout, dout + Nr * C, s.dres1.begin());  // a handover, not a kernel (sink.h)
  dropout_backward(Nr * C, "mlp.hidden_dropout.bwd", c);
  if (p.moe && d.experts_whole) {
    whole_experts_backward(g, s, dout, daux, a, p, d, config, wg, c);
  } else {
    // fc2_dgrad and fc1_dgrad (NeMo's 70B TP4 userbuffers: 2 SMs for the bulk gather)
    const float* dout_full = p.moe ? exit_row_parallel_bwd(c.tp, dout, s.full_dout.data(), Nr, C)
                                   : gather_into_gemm_bwd(c.tp, dout, s.full_dout.data(), Nr, C);
    const float* ln2_full = p.moe
                                ? enter_column_parallel(c.tp, a.ln2.data(), s.full_in.data(), Nr, C)
                                : gather_for_wgrad(c.tp, a.ln2.data(), s.full_in.data(), Nr, C, 2);
    zero(s.partial.data(), N * C);
    if (p.moe) {
      zero(s.rep.data(), N * C);
      auto moe_backward = c.moe.node_dispatch()     ? ep_node_moe_backward
                          : c.moe.expert_parallel() ? ep_moe_backward
                                                    : tp_moe_backward;
      moe_backward(s.partial.data(), s.rep.data(), g, s.moe, dout_full, daux, a.moe, ln2_full, p, d,
                   config, wg, c.moe);
      enter_column_parallel_bwd(c.tp, s.partial.data(), s.dln.data(), Nr, C);
      // The router's gradient is complete on every rank: take this rank's rows.
      const float* rep = model::shifted(s.rep.data(), d.row0(c.tp.rank()) * C);
      ex.run("moe.router.dinp.add", model::residual_forward_cost(Nr * C, ex.elem), [&] {
        for (int64_t i = 0; i < Nr * C; ++i) s.dln[i] += rep[i];
      });
    } else {
      tp_mlp_backward(s.partial.data(), g.mlp, s.dfc.data(), s.dfc_gelu.data(), dout_full, ln2_full,
                      a.fc.data(), a.fc_gelu.data(), p.mlp, N, C, d.Fl(), wg, ex,
                      config.is_llama());
      reduce_scatter_beside_wgrad(c.tp, s.partial.data(), s.dln.data(), Nr, C,
                                  4);  // fc1_wgrad: 4 SMs
    }
  }
  model::norm_backward(s.dres1.data(), g.ln_2, s.dln.data(), a.res1.data(), p.ln_2, a.ln2_mean.data(),
                       a.ln2_rstd.data(), Nr, C, config, "ln_2.bwd", ex);
  // res1 = inp + attproj: dinp += dres1, dattproj = dres1
  ex.run("residual.bwd", model::residual_backward_cost(Nr * C, ex.elem), [&] {
    for (int64_t i = 0; i < Nr * C; ++i) dinp[i] += s.dres1[i];
  });
  dropout_backward(Nr * C, "attn.hidden_dropout.bwd", c);
  // proj_dgrad, qkv_dgrad (4 SMs) and qkv_wgrad (24 SMs)
  const float* dres1_full = gather_into_gemm_bwd(c.tp, s.dres1.data(), s.full_dout.data(), Nr, C);
  if (config.is_mla()) {
    mla_attention_backward(s.dln.data(), g, s, dres1_full, a.ln1.data(), a, p, d, config, wg, c);
  } else {
    const float* ln1_full = gather_for_wgrad(c.tp, a.ln1.data(), s.full_in.data(), Nr, C, 4);
    zero(s.partial.data(), N * C);
    tp_attention_backward(s.partial.data(), g, s, dres1_full, ln1_full, a, p, d, config, wg, c);
    reduce_scatter_beside_wgrad(c.tp, s.partial.data(), s.dln.data(), Nr, C, 24);
  }
  model::norm_backward(dinp, g.ln_1, s.dln.data(), inp, p.ln_1, a.ln1_mean.data(), a.ln1_rstd.data(), Nr, C,
                       config, "ln_1.bwd", ex);
}

}  // namespace shardlab::parallel
