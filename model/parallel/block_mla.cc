// Multi-head latent attention on one TP rank (block.h mla_attention_*):
// Megatron-core's MLASelfAttention with duplicated down-projections. Each
// rank runs q_a_proj and kv_a_proj_with_mqa on its own Nr rows of ln_1
// (every row without SP, its N/tp with SP), normalizes the latents there,
// and enters the column-parallel up-projections with each latent gathered
// (SP) -- q's, k/v's and the rotated key apart, as Megatron gathers them --
// so the hidden state itself is never gathered unless q has no latent
// (q_proj, as Megatron's linear_q_proj). Backward reduces the latents'
// partial gradients over TP (all-reduce, or reduce-scatter with SP) before
// their norms, so ln_1's gradient comes out complete on this rank's rows.
// With SP the down-projections' and norms' weight gradients are sums over
// this rank's rows, staged and summed over TP by ShardedGPT like the
// LayerNorms'. The latents' collectives stay blocking under
// --tp-comm-overlap (only o_proj's reduce-scatter is overlapped).
#include <algorithm>

#include "model/kernels.h"
#include "model/kernels_llama.h"
#include "model/kernels_mla.h"
#include "model/parallel/block.h"

namespace shardlab::parallel {

using model::Exec;
using model::GPTConfig;

namespace {

model::MlaHeads heads_of(const ShardDims& d, const GPTConfig& c) {
  return {d.NHl(), c.head_size(), c.qk_rope_head_dim, d.HV()};
}

}  // namespace

void MlaShardActs::resize(int64_t Nr, const GPTConfig& c) {
  for (auto* v : {&cq, &cq_n}) v->assign(Nr * c.q_lora_rank, 0);
  cq_rstd.assign(c.q_lora_rank > 0 ? Nr : 0, 0);
  for (auto* v : {&ckv, &ckv_n}) v->assign(Nr * c.kv_lora_rank, 0);
  ckv_rstd.assign(Nr, 0);
  kpe.assign(Nr * c.qk_rope_head_dim, 0);
}

// The normalized latents are the up-projections' GEMM inputs: FP8 in an FP8 run.
int64_t MlaShardActs::saved_elements(bool fp8) const {
  int64_t n = 0;
  for (const Buf<float>* b : {&cq, &cq_rstd, &ckv, &ckv_rstd, &kpe}) n += static_cast<int64_t>(b->size());
  for (const Buf<float>* b : {&cq_n, &ckv_n}) {
    const auto size = static_cast<int64_t>(b->size());
    n += fp8 ? (size + 1) / 2 : size;
  }
  return n;
}

void MlaShardScratch::resize(const ShardDims& d, const GPTConfig& c) {
  const int64_t N = d.N(), Nr = d.rows(), Lq = c.q_lora_rank, Lkv = c.kv_lora_rank, Dr = c.qk_rope_head_dim;
  const model::MlaHeads h = heads_of(d, c);
  const int64_t lat = std::max(Lq, Lkv);
  cq_full.assign(d.sp ? N * Lq : 0, 0);
  ckv_full.assign(d.sp ? N * Lkv : 0, 0);
  kpe_full.assign(d.sp ? N * Dr : 0, 0);
  q.assign(N * h.q_width(), 0);
  kv.assign(N * h.kv_width(), 0);
  down.assign(Nr * (Lkv + Dr), 0);
  for (auto* v : {&atty_pad, &datty_pad}) v->assign(N * d.Cl(), 0);
  dlat_full.assign(N * lat, 0);
  dkpe_full.assign(N * Dr, 0);
  for (auto* v : {&dlat, &dlat_in}) v->assign(Nr * lat, 0);
  dkpe.assign(Nr * Dr, 0);
  dhidden.assign(Lq == 0 ? N * d.C : 0, 0);
}

void mla_core_forward(BlockActs& a, const ShardDims& d, const GPTConfig& config, BlockScratch& s,
                      const BlockContext& c) {
  c.attention_core().forward(s.mla.atty_pad.data(), a.att.data(), a.qkv.data(), d, c.tp);
  if (c.ex().math()) model::mla_unpad(a.atty.data(), s.mla.atty_pad.data(), d.N(), heads_of(d, config));
}

void mla_up_forward(BlockActs& a, const model::BlockView<float>& p, const float* ln1, const ShardDims& d,
                    const GPTConfig& config, BlockScratch& s, const BlockContext& c) {
  const Exec& ex = c.ex();
  const Exec te = ex.te_linear();
  const int64_t N = d.N(), Nr = d.rows();
  const int C = d.C, Lq = config.q_lora_rank, Lkv = config.kv_lora_rank, Dr = config.qk_rope_head_dim;
  const model::MlaHeads h = heads_of(d, config);
  MlaShardActs& m = a.mla;
  MlaShardScratch& x = s.mla;
  // q_b_proj's input (N rows): q's normalized latent, or ln_1's output (q_proj).
  const float* q_in = Lq > 0 ? enter_column_parallel(c.tp, m.cq_n.data(), x.cq_full.data(), Nr, Lq)
                             : gather_into_gemm(c.tp, ln1, s.full_in.data(), Nr, C);
  model::linear_forward(te, "attn.q_up.fwd", x.q.data(), q_in, p.c_attn.weight, N, Lq > 0 ? Lq : C,
                        int(h.q_width()));
  const float* ckv_full = enter_column_parallel(c.tp, m.ckv_n.data(), x.ckv_full.data(), Nr, Lkv);
  const float* kpe_full = enter_column_parallel(c.tp, m.kpe.data(), x.kpe_full.data(), Nr, Dr);
  model::linear_forward(te, "attn.kv_up.fwd", x.kv.data(), ckv_full, p.mla.kv_up.weight, N, Lkv, int(h.kv_width()));
  model::mla_rope_forward(ex, "attn.mla_rope.fwd", a.qkv.data(), x.q.data(), x.kv.data(), kpe_full,
                          s.positions.data(), d.B, d.T, h, config.rope_theta);
}

void mla_attention_forward(float* out, BlockActs& a, const model::BlockView<float>& p, const float* ln1,
                           const ShardDims& d, const GPTConfig& config, BlockScratch& s, const BlockContext& c) {
  const Exec& ex = c.ex();
  const Exec te = ex.te_linear();  // the projections: FP8 under --precision fp8
  const int64_t N = d.N(), Nr = d.rows();
  const int C = d.C, Lq = config.q_lora_rank, Lkv = config.kv_lora_rank, Dr = config.qk_rope_head_dim;
  const double eps = config.norm_eps;
  MlaShardActs& m = a.mla;
  MlaShardScratch& x = s.mla;
  if (Lq > 0) {
    model::linear_forward(te, "attn.q_down.fwd", m.cq.data(), ln1, p.mla.q_down.weight, Nr, C, Lq);
    model::rmsnorm_forward(ex, "attn.q_norm.fwd", m.cq_n.data(), m.cq_rstd.data(), m.cq.data(), p.mla.q_norm, Nr,
                           Lq, eps);
  }
  model::linear_forward(te, "attn.kv_down.fwd", x.down.data(), ln1, p.mla.kv_down.weight, Nr, C, Lkv + Dr);
  if (ex.math()) model::split_columns(m.ckv.data(), m.kpe.data(), x.down.data(), Nr, Lkv, Dr);
  model::rmsnorm_forward(ex, "attn.kv_norm.fwd", m.ckv_n.data(), m.ckv_rstd.data(), m.ckv.data(), p.mla.kv_norm, Nr,
                         Lkv, eps);
  mla_up_forward(a, p, ln1, d, config, s, c);
  mla_core_forward(a, d, config, s, c);
  attention_dropout_forward(d, c);
  model::linear_forward(te, "attn.c_proj.fwd", s.partial.data(), a.atty.data(), p.attn_proj.weight, N, d.Cv(), C);
  reduce_scatter_after_gemm(c.tp, s.partial.data(), out, Nr, C);  // proj_fprop
}

void mla_attention_backward(float* dln, const model::BlockView<float>& g, BlockScratch& s, const float* dout_full,
                            const float* ln1, const BlockActs& a, const model::BlockView<float>& p,
                            const ShardDims& d, const GPTConfig& config, WeightGrads& wg, const BlockContext& c) {
  const Exec& ex = c.ex();
  const Exec te = ex.te_linear();
  const int64_t N = d.N(), Nr = d.rows();
  const int C = d.C, Lq = config.q_lora_rank, Lkv = config.kv_lora_rank, Dr = config.qk_rope_head_dim;
  const model::MlaHeads h = heads_of(d, config);
  const MlaShardActs& m = a.mla;
  MlaShardScratch& x = s.mla;
  zero(s.datty.data(), N * d.Cv());
  linear_backward_split(s.datty.data(), g.attn_proj.weight, nullptr, dout_full, a.atty.data(), p.attn_proj.weight, N,
                        d.Cv(), C, {"attn.c_proj.dgrad", "attn.c_proj.wgrad", false}, wg, te);
  attention_dropout_backward(d, c);
  if (ex.math()) {  // the core's rows are padded to HS: its output gradient, and its output (context parallelism's D)
    model::mla_pad(x.datty_pad.data(), s.datty.data(), N, h);
    model::mla_pad(x.atty_pad.data(), a.atty.data(), N, h);
  }
  zero(s.dqkv.data(), N * h.core_width());
  c.attention_core().backward(s.dqkv.data(), x.datty_pad.data(), a.qkv.data(), x.atty_pad.data(), a.att.data(), d,
                              c.tp);
  model::mla_rope_backward(ex, "attn.mla_rope.bwd", x.q.data(), x.kv.data(), x.dkpe_full.data(), s.dqkv.data(),
                           s.positions.data(), d.B, d.T, h, config.rope_theta);
  // k and v: kv_b_proj (its input gathered again with SP), the latent's
  // reduction over TP, kv_a_layernorm, then kv_a_proj_with_mqa from
  // [the latent's gradient | the rotated key's].
  const float* ckv_full = enter_column_parallel(c.tp, m.ckv_n.data(), x.ckv_full.data(), Nr, Lkv);
  zero(x.dlat_full.data(), N * Lkv);
  linear_backward_split(x.dlat_full.data(), g.mla.kv_up.weight, nullptr, x.kv.data(), ckv_full, p.mla.kv_up.weight, N,
                        Lkv, int(h.kv_width()), {"attn.kv_up.dgrad", "attn.kv_up.wgrad", false}, wg, te);
  enter_column_parallel_bwd(c.tp, x.dlat_full.data(), x.dlat.data(), Nr, Lkv);
  enter_column_parallel_bwd(c.tp, x.dkpe_full.data(), x.dkpe.data(), Nr, Dr);
  zero(x.dlat_in.data(), Nr * Lkv);
  model::rmsnorm_backward(ex, "attn.kv_norm.bwd", x.dlat_in.data(), g.mla.kv_norm, x.dlat.data(), m.ckv.data(),
                          p.mla.kv_norm, m.ckv_rstd.data(), Nr, Lkv);
  if (ex.math()) model::join_columns(x.down.data(), x.dlat_in.data(), x.dkpe.data(), Nr, Lkv, Dr);
  zero(dln, Nr * C);
  linear_backward_split(dln, g.mla.kv_down.weight, nullptr, x.down.data(), ln1, p.mla.kv_down.weight, Nr, C, Lkv + Dr,
                        {"attn.kv_down.dgrad", "attn.kv_down.wgrad", false}, wg, te);
  // q: q_b_proj, the latent's reduction, q_a_layernorm, q_a_proj; or q_proj
  // from the gathered hidden state, its partial gradient reduced over TP.
  if (Lq == 0) {
    const float* ln1_full = enter_column_parallel(c.tp, ln1, s.full_in.data(), Nr, C);
    zero(x.dhidden.data(), N * C);
    linear_backward_split(x.dhidden.data(), g.c_attn.weight, nullptr, x.q.data(), ln1_full, p.c_attn.weight, N, C,
                          int(h.q_width()), {"attn.q_up.dgrad", "attn.q_up.wgrad", false}, wg, te);
    enter_column_parallel_bwd(c.tp, x.dhidden.data(), s.partial.data(), Nr, C);
    ex.run("attn.q_up.dinp.add", model::residual_forward_cost(Nr * C, ex.elem), [&] {
      for (int64_t i = 0; i < Nr * C; ++i) dln[i] += s.partial[i];
    });
    return;
  }
  const float* cq_full = enter_column_parallel(c.tp, m.cq_n.data(), x.cq_full.data(), Nr, Lq);
  zero(x.dlat_full.data(), N * Lq);
  linear_backward_split(x.dlat_full.data(), g.c_attn.weight, nullptr, x.q.data(), cq_full, p.c_attn.weight, N, Lq,
                        int(h.q_width()), {"attn.q_up.dgrad", "attn.q_up.wgrad", false}, wg, te);
  enter_column_parallel_bwd(c.tp, x.dlat_full.data(), x.dlat.data(), Nr, Lq);
  zero(x.dlat_in.data(), Nr * Lq);
  model::rmsnorm_backward(ex, "attn.q_norm.bwd", x.dlat_in.data(), g.mla.q_norm, x.dlat.data(), m.cq.data(),
                          p.mla.q_norm, m.cq_rstd.data(), Nr, Lq);
  linear_backward_split(dln, g.mla.q_down.weight, nullptr, x.dlat_in.data(), ln1, p.mla.q_down.weight, Nr, C, Lq,
                        {"attn.q_down.dgrad", "attn.q_down.wgrad", false}, wg, te);
}

}  // namespace shardlab::parallel
