// InferEngine's transformer block: training's tensor-parallel layers
// (model/parallel/tensor, expert/) forward only, with attention over the KV
// cache. Shapes use the letters of engine_acts.h.
#include <algorithm>

#include "model/infer/cached_attention.h"
#include "model/infer/engine_acts.h"
#include "model/kernels_mla.h"
#include "model/parallel/expert/ep_dispatch.h"

namespace shardlab::infer {

namespace par = parallel;

void InferEngine::block_forward(int layer, const std::vector<SeqInput>& batch,
                                const std::vector<int>& pos0) {
  const model::Exec& ex = ctx_.ex;
  const model::Exec te = ex.te_linear();  // the projections: FP8 GEMMs under --precision fp8
  const model::BlockView<float>& p = w_.blocks[layer];
  const int64_t N = dims_.N();
  const int C = dims_.C, W = dims_.qkv_width();
  const bool llama = config_.is_llama();
  Acts& a = *acts_;
  model::norm_forward(a.ln.data(), a.mean.data(), a.rstd.data(), a.x.data(), p.ln_1, N, C, config_, "ln_1.fwd", ex);
  if (config_.is_mla()) {
    mla_attend(layer, batch, pos0);
  } else {
    if (llama) {
      model::linear_forward(te, "attn.c_attn.fwd", a.qkv.data(), a.ln.data(), p.c_attn.weight, N, C, W);
      if (p.q_norm)  // before RoPE, as in training (the cache keeps normalized, rotated keys)
        model::qk_norm_forward(ex, a.qkv.data(), a.qk_pre.data(), a.qk_rstd.data(), p.q_norm, p.k_norm, N,
                               dims_.gqa(groups_.tp->rank()), config_.norm_eps);
      rotate();
    } else {
      model::linear_forward(te, "attn.c_attn.fwd", a.qkv.data(), a.ln.data(), p.c_attn.weight, p.c_attn.bias, N,
                            C, W);
    }
    attend(layer - place_.first_layer(0), batch, pos0);
  }
  model::linear_forward(te, "attn.c_proj.fwd", a.partial.data(), a.atty.data(), p.attn_proj.weight,
                        N, dims_.Cv(), C);  // its bias after the reduction; Cv = Cl but under MLA
  par::exit_row_parallel(ctx_, a.partial.data(), a.out.data(), N, C);
  if (!llama) par::add_bias_rows(a.out.data(), p.attn_proj.bias, N, C, "attn.c_proj.bias.fwd", ex);
  model::residual_forward(ex, "residual.fwd", a.res1.data(), a.x.data(), a.out.data(), N * C);
  model::norm_forward(a.ln.data(), a.mean.data(), a.rstd.data(), a.res1.data(), p.ln_2, N, C, config_, "ln_2.fwd",
                      ex);
  ffn_forward(layer);
  model::residual_forward(ex, "residual.fwd", a.x.data(), a.res1.data(), a.out.data(), N * C);
}

// Llama: RoPE on every new row's q and k heads at its position in its sequence.
void InferEngine::rotate() {
  const model::Exec& ex = ctx_.ex;
  const model::GqaHeads g = dims_.gqa(groups_.tp->rank());
  const int W = dims_.qkv_width();
  Acts& a = *acts_;
  const int N = int(dims_.N());
  ex.run("attn.rope.fwd", model::rope_cost(N, g.NHq + g.KVl, g.HS, ex.elem), [&] {
    model::rope_forward(a.qkv.data(), a.qkv.data(), a.positions.data(), 1, N, g.NHq + g.KVl, g.HS, W,
                        config_.rope_theta);
  });
}

// Appends every sequence's new K, V rows to the cache, then attends.
void InferEngine::attend(int local_layer, const std::vector<SeqInput>& batch,
                         const std::vector<int>& pos0) {
  const model::Exec& ex = ctx_.ex;
  const int Cl = dims_.Cl(), NHl = dims_.NHl(), HS = dims_.HS(), W = dims_.qkv_width();
  const model::GqaHeads held = dims_.gqa(groups_.tp->rank()), g = cached_kv_heads(held);
  const int64_t KVC = int64_t{g.KVl} * HS;  // a cached row: the K/V heads this rank's queries read
  // Where they start in the projection's [q | k | v] row.
  const int64_t k0 = Cl + int64_t{g.kv0 - held.kv0} * HS, v0 = k0 + int64_t{held.KVl} * HS;
  Acts& a = *acts_;
  std::vector<AttendShape> shapes;
  int64_t row = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    const int seq = batch[i].seq, n = int(batch[i].tokens.size()), p0 = pos0[i];
    shapes.push_back({n, p0 + n});
    if (ex.math()) {  // the KV cache append: a handover, charged with attention (sink.h)
      float* k = cache_->keys(seq, local_layer);
      float* v = cache_->values(seq, local_layer);
      for (int j = 0; j < n; ++j) {
        const float* r = a.qkv.data() + (row + j) * W;
        std::copy_n(r + k0, KVC, k + int64_t(p0 + j) * KVC);
        std::copy_n(r + v0, KVC, v + int64_t(p0 + j) * KVC);
      }
      cached_attention_forward(a.atty.data() + row * Cl, Cl, a.qkv.data() + row * W, W, k, v, p0, n, g);
    }
    row += n;
  }
  // The append reads the new k, v rows and writes them into the cache (an
  // FP8 cache: quantized on the way, as vLLM's reshape_and_cache).
  ex.op("attn.kv_append", OpCost{0, 2.0 * double(row) * double(KVC) * double(ex.elem + cache_->element_bytes())});
  const model::AttentionCosts c = cached_attention_costs(shapes, NHl, HS, ex.elem, cache_->element_bytes());
  ex.op("attn.scores.fwd", c.scores);
  ex.op("attn.softmax.fwd", c.softmax);
  ex.op("attn.context.fwd", c.context);
}

// MLA: a.ln (N,C) -> a.atty (N, NHl·Dv), as the training block computes it
// (block_mla.cc without SP: every rank runs the down-projections and the
// latents' norms on all rows, its heads' q_b_proj), then the new tokens'
// rows [c | k_pe] into the latent cache and the absorbed attention
// (cached_attention.h).
void InferEngine::mla_attend(int layer, const std::vector<SeqInput>& batch, const std::vector<int>& pos0) {
  const model::Exec& ex = ctx_.ex;
  const model::Exec te = ex.te_linear();
  const model::BlockView<float>& p = w_.blocks[layer];
  const int64_t N = dims_.N();
  const int C = dims_.C, Lq = config_.q_lora_rank, Lkv = config_.kv_lora_rank, Dr = config_.qk_rope_head_dim;
  const model::MlaHeads h{dims_.NHl(), config_.head_size(), Dr, dims_.HV()};
  const int64_t Wq = h.q_width(), R = Lkv + Dr, Cv = dims_.Cv();
  const double eps = config_.norm_eps;
  Acts& a = *acts_;
  const float* q_in = a.ln.data();  // q_b_proj's input: q's normalized latent, or the hidden state (q_proj)
  if (Lq > 0) {
    model::linear_forward(te, "attn.q_down.fwd", a.mla_cq.data(), a.ln.data(), p.mla.q_down.weight, N, C, Lq);
    model::rmsnorm_forward(ex, "attn.q_norm.fwd", a.mla_cq_n.data(), a.rstd.data(), a.mla_cq.data(), p.mla.q_norm, N,
                           Lq, eps);
    q_in = a.mla_cq_n.data();
  }
  model::linear_forward(te, "attn.q_up.fwd", a.qkv.data(), q_in, p.c_attn.weight, N, Lq > 0 ? Lq : C, int(Wq));
  model::linear_forward(te, "attn.kv_down.fwd", a.mla_down.data(), a.ln.data(), p.mla.kv_down.weight, N, C,
                        int(R));
  if (ex.math()) model::split_columns(a.mla_ckv.data(), a.mla_kpe.data(), a.mla_down.data(), N, Lkv, Dr);
  model::rmsnorm_forward(ex, "attn.kv_norm.fwd", a.mla_ckv_n.data(), a.rstd.data(), a.mla_ckv.data(), p.mla.kv_norm,
                         N, Lkv, eps);
  ex.run("attn.mla_rope.fwd", model::mla_rope_inplace_cost(N, h, ex.elem), [&] {
    model::mla_rope_inplace(a.qkv.data(), Wq, a.mla_kpe.data(), Dr, a.positions.data(), int(N), h, config_.rope_theta);
  });
  const int local_layer = layer - place_.first_layer(0);
  std::vector<AttendShape> shapes;
  int64_t row = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    const int seq = batch[i].seq, n = int(batch[i].tokens.size()), p0 = pos0[i];
    shapes.push_back({n, p0 + n});
    if (ex.math()) {  // the cache append: a handover, charged below
      float* lat = cache_->plane(seq, local_layer, 0);
      for (int j = 0; j < n; ++j) {
        float* to = lat + int64_t(p0 + j) * R;
        std::copy_n(a.mla_ckv_n.data() + (row + j) * Lkv, Lkv, to);
        std::copy_n(a.mla_kpe.data() + (row + j) * Dr, Dr, to + Lkv);
      }
      mla_cached_attention_forward(a.atty.data() + row * Cv, Cv, a.qkv.data() + row * Wq, Wq, lat,
                                   p.mla.kv_up.weight, p0, n, h, Lkv);
    }
    row += n;
  }
  // The append reads the new rows and writes them into the cache (an FP8
  // cache: quantized on the way).
  ex.op("attn.kv_append", OpCost{0, double(row) * double(R) * double(ex.elem + cache_->element_bytes())});
  const MlaAttendCosts c = mla_cached_attention_costs(shapes, h, Lkv, ex.elem, cache_->element_bytes());
  const std::pair<const char*, const OpCost*> ops[] = {{"attn.kv_up.fwd", &c.kv_up},   {"attn.q_absorb.fwd", &c.q_absorb},
                                                       {"attn.scores.fwd", &c.scores}, {"attn.softmax.fwd", &c.softmax},
                                                       {"attn.context.fwd", &c.context}, {"attn.v_up.fwd", &c.v_up}};
  for (const auto& [name, cost] : ops)
    if (cost->flops > 0 || cost->bytes > 0) ex.op(name, *cost);
}

// a.ln (N,C) -> a.out (N,C): the block's MLP or MoE, complete on every rank.
void InferEngine::ffn_forward(int layer) {
  const model::Exec& ex = ctx_.ex;
  const model::BlockView<float>& p = w_.blocks[layer];
  const int64_t N = dims_.N();
  const int C = dims_.C;
  Acts& a = *acts_;
  if (!p.moe) {
    par::tp_mlp_partial_forward(a.partial.data(), a.fc.data(), a.fc_gelu.data(), p.mlp, a.ln.data(), N, C,
                                dims_.Fl(), ex, config_.is_llama());
    par::exit_row_parallel(ctx_, a.partial.data(), a.out.data(), N, C);
    if (!config_.is_llama()) par::add_bias_rows(a.out.data(), p.mlp.c_proj.bias, N, C, "mlp.c_proj.bias.fwd", ex);
    return;
  }
  if (moe_ctx_.expert_parallel())
    par::ep_moe_forward(a.out.data(), a.moe, a.scratch, p, a.ln.data(), dims_, config_, moe_ctx_);
  else
    par::tp_moe_forward(a.out.data(), a.moe, p, a.ln.data(), dims_, config_, moe_ctx_);
}

}  // namespace shardlab::infer
