// InferEngine's transformer block: training's tensor-parallel layers
// (model/parallel/tensor, expert/) forward only, with attention over the KV
// cache. Shapes use the letters of engine_acts.h.
#include <algorithm>

#include "model/infer/cached_attention.h"
#include "model/infer/engine_acts.h"
#include "model/parallel/expert/ep_dispatch.h"

namespace shardlab::infer {

namespace par = parallel;

void InferEngine::block_forward(int layer, const std::vector<SeqInput>& batch,
                                const std::vector<int>& pos0) {
  const model::Exec& ex = ctx_.ex;
  const model::BlockView<float>& p = w_.blocks[layer];
  const int64_t N = dims_.N();
  const int C = dims_.C, Cl = dims_.Cl(), W = dims_.qkv_width();
  const bool llama = config_.is_llama();
  Acts& a = *acts_;
  model::norm_forward(a.ln.data(), a.mean.data(), a.rstd.data(), a.x.data(), p.ln_1, N, C, config_, "ln_1.fwd", ex);
  if (llama) {
    model::linear_forward(ex, "attn.c_attn.fwd", a.qkv.data(), a.ln.data(), p.c_attn.weight, N, C, W);
    if (p.q_norm)  // before RoPE, as in training (the cache keeps normalized, rotated keys)
      model::qk_norm_forward(ex, a.qkv.data(), a.qk_pre.data(), a.qk_rstd.data(), p.q_norm, p.k_norm, N,
                             dims_.gqa(groups_.tp->rank()), config_.norm_eps);
    rotate(batch, pos0);
  } else {
    model::linear_forward(ex, "attn.c_attn.fwd", a.qkv.data(), a.ln.data(), p.c_attn.weight, p.c_attn.bias, N, C,
                          W);
  }
  attend(layer - place_.first_layer(0), batch, pos0);
  model::linear_forward(ex, "attn.c_proj.fwd", a.partial.data(), a.atty.data(), p.attn_proj.weight,
                        N, Cl, C);  // its bias after the reduction
  par::exit_row_parallel(ctx_, a.partial.data(), a.out.data(), N, C);
  if (!llama) par::add_bias_rows(a.out.data(), p.attn_proj.bias, N, C, "attn.c_proj.bias.fwd", ex);
  model::residual_forward(ex, "residual.fwd", a.res1.data(), a.x.data(), a.out.data(), N * C);
  model::norm_forward(a.ln.data(), a.mean.data(), a.rstd.data(), a.res1.data(), p.ln_2, N, C, config_, "ln_2.fwd",
                      ex);
  ffn_forward(layer);
  model::residual_forward(ex, "residual.fwd", a.x.data(), a.res1.data(), a.out.data(), N * C);
}

// Llama: RoPE on every new row's q and k heads at its position in its sequence.
void InferEngine::rotate(const std::vector<SeqInput>& batch, const std::vector<int>& pos0) {
  const model::Exec& ex = ctx_.ex;
  const model::GqaHeads g = dims_.gqa(groups_.tp->rank());
  const int W = dims_.qkv_width();
  Acts& a = *acts_;
  ex.run("attn.rope.fwd", model::rope_cost(dims_.N(), g.NHq + g.KVl, g.HS, ex.elem), [&] {
    int64_t row = 0;
    for (size_t i = 0; i < batch.size(); ++i) {
      const int n = int(batch[i].tokens.size());
      std::vector<int64_t> positions(static_cast<size_t>(n));
      for (int j = 0; j < n; ++j) positions[size_t(j)] = pos0[i] + j;
      float* rows = a.qkv.data() + row * W;
      model::rope_forward(rows, rows, positions.data(), 1, n, g.NHq + g.KVl, g.HS, W, config_.rope_theta);
      row += n;
    }
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
  // The append reads the new k, v rows and writes them into the cache.
  ex.op("attn.kv_append", OpCost{0, 4.0 * double(row) * double(KVC) * ex.elem});
  const model::AttentionCosts c = cached_attention_costs(shapes, NHl, HS, ex.elem);
  ex.op("attn.scores.fwd", c.scores);
  ex.op("attn.softmax.fwd", c.softmax);
  ex.op("attn.context.fwd", c.context);
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
