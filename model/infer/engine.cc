// InferEngine: construction, the step, the embedding, the head and the
// pipeline hand-over. The blocks are in engine_block.cc.
#include "model/infer/engine.h"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "model/infer/cached_attention.h"
#include "model/infer/engine_acts.h"
#include "model/engine/shard_io.h"
#include "runtime/errors.h"

namespace shardlab::infer {

namespace coll = collectives;
using model::Token;

namespace {

// Point-to-point tag of the activations between stages (user range).
constexpr Tag kStageTag = 0x494e'4641'0000'0000ull;  // "INFA"

}  // namespace

InferEngine::InferEngine(const model::GPTConfig& config, uint64_t seed, Device& dev,
                         const EngineGroups& groups, const model::SafetensorsFile* init)
    : config_(config), dev_(dev), groups_(groups), sink_(dev) {
  SHARDLAB_CHECK(groups.tp != nullptr, "InferEngine needs a tensor-parallel group");
  parallel::ShardedOptions so;
  so.placement = groups.placement;
  so.no_grads = true;  // forward only
  model_ = std::make_unique<parallel::ShardedGPT>(config_, seed, dev, parallel::ModelGroups{groups.tp, groups.ep, nullptr},
                                                  so);
  place_ = model_->placement();
  if (init) engine::load_shards(*model_, *init);
  w_ = model_->layout().view(model_->params().data());
  ctx_.dev = &dev;
  ctx_.group = groups.tp;
  ctx_.ex = model::Exec::with(&sink_);
  ctx_.ex.fp8_inference = ctx_.ex.fp8_run;
  // FP8 inference keeps the FP8 linears' weights at 1 B (an FP8 checkpoint's
  // weights; their per-tensor scales, 4 B each, are not counted), the rest
  // at the activations' 2 B.
  const int64_t all = int64_t(model_->params().size());
  const int64_t fp8 = ctx_.ex.fp8_run ? parallel::fp8_weight_elements(model_->shards()) : 0;
  weights_ = dev.alloc("parameters", {all - fp8}, MemKind::kParam, /*phantom=*/true);
  if (fp8 > 0)  // elements of 2 B at Precision::kFp8 (its activations' size): two FP8 weights each
    fp8_weights_ = dev.alloc("fp8 weights", {(fp8 + 1) / 2}, MemKind::kParam, /*phantom=*/true);
  moe_ctx_.dev = &dev;
  moe_ctx_.tp = groups.tp;
  moe_ctx_.ex = ctx_.ex;
  moe_ctx_.ep = groups.ep && groups.ep->size() > 1 ? groups.ep : nullptr;
  Vl_ = config_.vocab_size / groups.tp->size();
  v0_ = int64_t{groups.tp->rank()} * Vl_;
  parallel::ShardDims heads{model::dims_of(config_, 1, 1),
                            groups.tp->size(), false, 1};
  heads.kv = config_.kv_heads();
  const int local_layers = place_.end_layer(0) - place_.first_layer(0);
  const KvShape kv = config_.is_mla()  // the latent rows, whole on every tp rank
                         ? KvShape{local_layers, 1, config_.kv_lora_rank + config_.qk_rope_head_dim, 1}
                         : KvShape{local_layers, cached_kv_heads(heads.gqa(groups.tp->rank())).KVl,
                                   config_.head_size()};
  KvShape shape = kv;
  if (groups.kv_fp8) shape.elem = kFp8Bytes;
  cache_ = std::make_unique<KvCache>(dev, shape);
  acts_ = std::make_unique<Acts>();
}

InferEngine::~InferEngine() = default;

void InferEngine::size_step(int64_t N) {
  if (dims_.N() == N) return;
  const int tp = groups_.tp->size();
  const model::Dims unsharded = model::dims_of(config_, 1, int(N));
  dims_ = parallel::ShardDims{unsharded, tp, false, moe_ctx_.ep ? moe_ctx_.ep->size() : 1};
  dims_.kv = config_.kv_heads();
  dims_.rope = config_.is_llama();
  const int64_t C = dims_.C, Cl = dims_.Cl(), Fl = dims_.Fl();
  Acts& a = *acts_;
  for (auto* b : {&a.x, &a.ln, &a.res1, &a.partial, &a.out}) b->assign(size_t(N * C), 0.0f);
  for (auto* b : {&a.mean, &a.rstd}) b->assign(size_t(N), 0.0f);
  a.qkv.assign(size_t(N * dims_.qkv_width()), 0.0f);
  a.atty.assign(size_t(N * Cl), 0.0f);
  if (config_.is_mla()) {
    const int64_t Lq = config_.q_lora_rank, Lkv = config_.kv_lora_rank;
    a.mla_cq.assign(size_t(N * Lq), 0.0f);
    a.mla_cq_n.assign(size_t(N * Lq), 0.0f);
    a.mla_down.assign(size_t(N * (Lkv + config_.qk_rope_head_dim)), 0.0f);
    a.mla_ckv.assign(size_t(N * Lkv), 0.0f);
    a.mla_ckv_n.assign(size_t(N * Lkv), 0.0f);
    a.mla_kpe.assign(size_t(N * config_.qk_rope_head_dim), 0.0f);
  }
  const int64_t qk_heads = config_.qk_norm ? dims_.NHl() + dims_.KVl() : 0;
  a.qk_pre.assign(size_t(N * qk_heads * dims_.HS()), 0.0f);
  a.qk_rstd.assign(size_t(N * qk_heads), 0.0f);
  const bool dense = config_.has_dense_layer();
  a.fc.assign(dense ? size_t(N * Fl * (config_.is_llama() ? 2 : 1)) : 0, 0.0f);  // SwiGLU: [gate | up]
  a.fc_gelu.assign(dense ? size_t(N * Fl) : 0, 0.0f);
  if (!config_.is_moe()) return;
  a.moe.resize(dims_, config_);
  a.moe.stats.expert_begin = model_->layout_filter().expert_begin;
  if (moe_ctx_.ep) a.scratch.resize(dims_, config_);
}

StepOutput InferEngine::step(const std::vector<SeqInput>& batch) {
  SHARDLAB_CHECK(!batch.empty(), "an inference step needs a sequence");
  StepOutput out;
  out.begin = dev_.compute().now();
  int64_t N = 0;
  std::vector<int> pos0;
  for (const SeqInput& s : batch) {
    SHARDLAB_CHECK(!s.tokens.empty(), fmt::format("sequence {} has no new token", s.seq));
    const int n = int(s.tokens.size());
    SHARDLAB_CHECK(cache_->length(s.seq) + n <= config_.block_size,
                   fmt::format("sequence {}: {} tokens exceed the block size {}", s.seq,
                               cache_->length(s.seq) + n, config_.block_size));
    pos0.push_back(cache_->append(s.seq, n));
    N += n;
  }
  size_step(N);
  std::vector<int64_t>& positions = acts_->positions;  // host indices, reused step to step
  positions.clear();
  for (size_t i = 0; i < batch.size(); ++i)
    for (int j = 0; j < int(batch[i].tokens.size()); ++j) positions.push_back(pos0[i] + j);
  if (ctx_.ex.math() && !packed_) pack_weights();
  const model::PackedWeightsScope packed(&packs_);
  const int64_t held = acts_->elements();  // the step's working activations
  sink_.saved(held);
  if (first_stage()) embed(batch);
  else pipe_recv();
  for (int l = place_.first_layer(0); l < place_.end_layer(0); ++l) block_forward(l, batch, pos0);
  if (last_stage()) out.logits = head(batch);
  else pipe_send();
  sink_.freed(held);
  out.end = dev_.compute().now();
  return out;
}

void InferEngine::pack_weights() {
  const int C = dims_.C, Cl = dims_.Cl(), Fl = dims_.Fl();
  for (int l = place_.first_layer(0); l < place_.end_layer(0); ++l) {
    const model::BlockView<float>& p = w_.blocks[size_t(l)];
    if (!config_.is_mla()) {  // MLA's projections take the usual path
      packs_.add(p.c_attn.weight, dims_.qkv_width(), C, C);
      packs_.add(p.attn_proj.weight, C, Cl, Cl);
    }
    if (p.moe) continue;  // the experts' GEMMs pack as they go
    packs_.add(p.mlp.c_fc.weight, config_.is_llama() ? 2 * Fl : Fl, C, C);  // SwiGLU: [gate | up]
    packs_.add(p.mlp.c_proj.weight, C, Fl, Fl);
  }
  if (last_stage()) packs_.add(w_.head(), Vl_, C, C);
  packed_ = true;
}

void InferEngine::embed(const std::vector<SeqInput>& batch) {
  const model::Exec& ex = ctx_.ex;
  const int64_t N = dims_.N();
  const int C = dims_.C;
  Acts& a = *acts_;
  ex.run("embedding.fwd", model::embedding_forward_cost(1, N, C, ex.elem), [&] {
    int64_t row = 0;
    for (const SeqInput& s : batch) {
      const int p0 = cache_->length(s.seq) - int(s.tokens.size());
      for (size_t j = 0; j < s.tokens.size(); ++j, ++row) {
        const Token tok = s.tokens[j];
        float* o = a.partial.data() + row * C;
        if (tok >= v0_ && tok < v0_ + Vl_)
          std::copy_n(w_.wte + (tok - v0_) * C, C, o);
        else
          std::fill_n(o, C, 0.0f);
        if (dims_.rope) continue;  // rotary positions (llama): in attention
        const float* pe = w_.wpe + (p0 + int64_t(j)) * C;
        float* x = a.ln.data() + row * C;  // the position embedding, added after the sum
        std::copy_n(pe, C, x);
      }
    }
  });
  parallel::exit_row_parallel(ctx_, a.partial.data(), a.x.data(), N, C);
  if (dims_.rope) return;
  ex.run("embedding.wpe.fwd", model::residual_forward_cost(N * C, ex.elem), [&] {
    for (int64_t i = 0; i < N * C; ++i) a.x[size_t(i)] += a.ln[size_t(i)];
  });
}

std::vector<float> InferEngine::head(const std::vector<SeqInput>& batch) {
  const model::Exec& ex = ctx_.ex;
  const int C = dims_.C, tp = groups_.tp->size();
  Acts& a = *acts_;
  // The last new row of every sequence (every one of an every_logit
  // sequence), into res1's first S rows.
  int64_t row = 0, S = 0;
  for (const SeqInput& q : batch) {
    const int64_t n = int64_t(q.tokens.size()), from = q.every_logit ? 0 : n - 1;
    for (int64_t j = from; j < n; ++j, ++S)
      if (ex.math()) std::copy_n(a.x.data() + (row + j) * C, C, a.res1.data() + S * C);  // a handover (sink.h)
    row += n;
  }
  model::norm_forward(a.ln.data(), a.mean.data(), a.rstd.data(), a.res1.data(), w_.ln_f, S, C, config_, "ln_f.fwd",
                      ex);
  parallel::Buf<float> local(size_t(S * Vl_), 0.0f), gathered(size_t(S * Vl_ * tp), 0.0f);
  model::linear_forward(ex, "lm_head.fwd", local.data(), a.ln.data(), w_.head(), S, C, Vl_);
  if (tp > 1)
    coll::all_gather(dev_, *groups_.tp, coll::ConstBuffer(local.data(), local.size()),
                     coll::Buffer(gathered.data(), gathered.size()), ctx_.on_compute());
  if (!ex.math()) return {};  // the logits' layout is a handover (sink.h); phantom has none
  if (tp == 1) return {local.begin(), local.end()};
  // gathered is (tp, S, Vl): rank r's slice is the vocabulary [r·Vl, (r+1)·Vl).
  std::vector<float> logits(size_t(S) * config_.vocab_size);
  for (int r = 0; r < tp; ++r)
    for (int64_t i = 0; i < S; ++i)
      std::copy_n(gathered.data() + (r * S + i) * Vl_, Vl_, logits.data() + i * config_.vocab_size + r * Vl_);
  return logits;
}

void InferEngine::pipe_send() {
  const int64_t n = dims_.N() * dims_.C;
  const int dst = groups_.pp_ranks[size_t(groups_.placement.rank + 1)];
  const float* data = acts_->x.data();
  dev_.send(dev_.compute(), dst, kStageTag,
            {reinterpret_cast<const std::byte*>(data), data ? size_t(n) * sizeof(float) : 0},
            uint64_t(n) * uint64_t(element_size(dev_.precision())));
}

void InferEngine::pipe_recv() {
  const int64_t n = dims_.N() * dims_.C;
  const int src = groups_.pp_ranks[size_t(groups_.placement.rank - 1)];
  Message m = dev_.recv(dev_.compute(), src, kStageTag);
  float* into = acts_->x.data();
  const size_t expected = into ? size_t(n) * sizeof(float) : 0;
  SHARDLAB_CHECK(m.payload.size() == expected,
                 fmt::format("inference: stage device {} sent {} bytes, expected {}", src, m.payload.size(), expected));
  if (into) std::memcpy(into, m.payload.data(), expected);
}

}  // namespace shardlab::infer
