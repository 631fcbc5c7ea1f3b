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
  const int C = dims_.C, Cl = dims_.Cl();
  Acts& a = *acts_;
  model::layernorm_forward(ex, "ln_1.fwd", a.ln.data(), a.mean.data(), a.rstd.data(), a.x.data(),
                           p.ln_1.weight, p.ln_1.bias, N, C);
  model::linear_forward(ex, "attn.c_attn.fwd", a.qkv.data(), a.ln.data(), p.c_attn.weight,
                        p.c_attn.bias, N, C, 3 * Cl);
  attend(layer - place_.first_layer(0), batch, pos0);
  model::linear_forward(ex, "attn.c_proj.fwd", a.partial.data(), a.atty.data(), p.attn_proj.weight,
                        N, Cl, C);  // its bias after the reduction
  par::exit_row_parallel(ctx_, a.partial.data(), a.out.data(), N, C);
  par::add_bias_rows(a.out.data(), p.attn_proj.bias, N, C, "attn.c_proj.bias.fwd", ex);
  model::residual_forward(ex, "residual.fwd", a.res1.data(), a.x.data(), a.out.data(), N * C);
  model::layernorm_forward(ex, "ln_2.fwd", a.ln.data(), a.mean.data(), a.rstd.data(), a.res1.data(),
                           p.ln_2.weight, p.ln_2.bias, N, C);
  ffn_forward(layer);
  model::residual_forward(ex, "residual.fwd", a.x.data(), a.res1.data(), a.out.data(), N * C);
}

// Appends every sequence's new K, V rows to the cache, then attends.
void InferEngine::attend(int local_layer, const std::vector<SeqInput>& batch,
                         const std::vector<int>& pos0) {
  const model::Exec& ex = ctx_.ex;
  const int Cl = dims_.Cl(), NHl = dims_.NHl(), HS = dims_.HS();
  Acts& a = *acts_;
  std::vector<AttendShape> shapes;
  int64_t row = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    const int seq = batch[i].seq, n = int(batch[i].tokens.size()), p0 = pos0[i];
    shapes.push_back({n, p0 + n});
    if (ex.math()) {
      float* k = cache_->keys(seq, local_layer);
      float* v = cache_->values(seq, local_layer);
      for (int j = 0; j < n; ++j) {
        const float* r = a.qkv.data() + (row + j) * 3 * Cl;
        std::copy_n(r + Cl, Cl, k + int64_t(p0 + j) * Cl);
        std::copy_n(r + 2 * Cl, Cl, v + int64_t(p0 + j) * Cl);
      }
      cached_attention_forward(a.atty.data() + row * Cl, Cl, a.qkv.data() + row * 3 * Cl, k, v, p0, n,
                               NHl, HS);
    }
    row += n;
  }
  // The append reads the new k, v rows and writes them into the cache.
  ex.op("attn.kv_append", OpCost{0, 4.0 * double(row) * Cl * ex.elem});
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
                                dims_.Fl(), ex);
    par::exit_row_parallel(ctx_, a.partial.data(), a.out.data(), N, C);
    par::add_bias_rows(a.out.data(), p.mlp.c_proj.bias, N, C, "mlp.c_proj.bias.fwd", ex);
    return;
  }
  if (moe_ctx_.expert_parallel())
    par::ep_moe_forward(a.out.data(), a.moe, a.scratch, p, a.ln.data(), dims_, config_, moe_ctx_);
  else
    par::tp_moe_forward(a.out.data(), a.moe, p, a.ln.data(), dims_, config_, moe_ctx_);
}

}  // namespace shardlab::infer
