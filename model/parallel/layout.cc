#include "model/parallel/layout.h"

#include <string>

#include "model/buffer.h"
#include "runtime/errors.h"

namespace shardlab::parallel {

using model::GPTConfig;
using model::ParamSpec;
using model::ParamTable;

ShardLayout::ShardLayout(const GPTConfig& cfg, int tp, int rank, LayoutFilter filter)
    : ShardLayout(ParamTable(cfg), cfg, tp, rank, std::move(filter)) {}

ShardLayout::ShardLayout(const ParamTable& table, const GPTConfig& cfg, int tp, int rank, LayoutFilter filter)
    : config_(cfg), tp_(tp), rank_(rank), filter_(std::move(filter)) {
  SHARDLAB_CHECK(tp >= 1 && rank >= 0 && rank < tp, "bad tp rank");
  SHARDLAB_CHECK(filter_.layers.empty() || int(filter_.layers.size()) == cfg.n_layer,
                 "layout filter: one entry per layer");
  const int64_t C = cfg.n_embd, V = cfg.vocab_size;
  const int64_t Vl = V / tp, Cl = cfg.attn_width() / tp;  // this rank's heads' features
  const int NHl = cfg.n_head / tp;
  const auto qkv = model::c_attn_head_rows(cfg.n_embd, cfg.n_head, rank * NHl, (rank + 1) * NHl);
  const std::vector<Range> qkv_rows(qkv.begin(), qkv.end());
  const std::vector<Range> head_cols{{rank * Cl, Cl}};
  blocks_.assign(static_cast<size_t>(cfg.n_layer), Range{});

  // Llama: q_proj by this rank's query heads; k_proj and v_proj by its K/V
  // heads, or whole on every rank (kv_split false, Megatron's rule).
  const int64_t HS = cfg.head_size(), KVl = kv_split(cfg, tp) ? cfg.kv_heads() / tp : 0;
  const std::vector<Range> q_rows{{rank * Cl, Cl}}, kv_rows{{rank * KVl * HS, KVl * HS}};
  using model::ParamRole;
  for (const ParamSpec& p : table.specs()) {
    if (!holds_spec(p)) continue;
    if (filter_.experts_whole && p.is_expert()) {  // expert TP 1: this rank's own, whole
      add(p, p.shape, -1, {}, false);
      note_block(shards_.back());
      continue;
    }
    // The MLP's width: the dense MLP's, a routed expert's or the shared experts'.
    const int64_t Fl = (p.role == ParamRole::kMlpProjWeight ? p.shape[1] : p.shape[0]) / tp;
    const std::vector<Range> fc_rows{{rank * Fl, Fl}};
    switch (p.role) {
      case ParamRole::kTokenEmbedding:
      case ParamRole::kLmHead: add(p, {Vl, C}, 0, {{rank * Vl, Vl}}, false); break;
      case ParamRole::kQkvWeight:
        if (cfg.is_llama()) add(p, {Cl, C}, 0, q_rows, false);
        else add(p, {3 * Cl, C}, 0, qkv_rows, false);
        break;
      case ParamRole::kKvWeight:
        if (KVl > 0) add(p, {KVl * HS, C}, 0, kv_rows, false);
        else add(p, p.shape, -1, {}, true);
        break;
      case ParamRole::kQkvBias: add(p, {3 * Cl}, 0, qkv_rows, false); break;
      case ParamRole::kAttnProjWeight: add(p, {C, Cl}, 1, head_cols, false); break;
      case ParamRole::kFcWeight: add(p, {Fl, C}, 0, fc_rows, false); break;
      case ParamRole::kFcBias: add(p, {Fl}, 0, fc_rows, false); break;
      case ParamRole::kMlpProjWeight: add(p, {C, Fl}, 1, fc_rows, false); break;
      case ParamRole::kMlaUp: {  // MLA's up-projections: this rank's heads' rows, each head's contiguous
        const int64_t rows = p.shape[0] / tp;
        add(p, {rows, p.shape[1]}, 0, {{rank * rows, rows}}, false);
        break;
      }
      default: add(p, p.shape, -1, {}, true); break;  // LayerNorms, wpe, row-parallel biases, router, MLA's down
                                                      // projections and latent norms
    }
    note_block(shards_.back());
  }
}

void ShardLayout::note_block(const ShardSpec& s) {
  if (s.layer < 0) return;
  Range& b = blocks_[static_cast<size_t>(s.layer)];
  if (b.size == 0) b.begin = s.offset;
  b.size = s.offset + s.numel - b.begin;
}

bool ShardLayout::holds_spec(const ParamSpec& p) const {
  using model::ParamRole;
  if (p.role == ParamRole::kTokenEmbedding) return filter_.wte;
  if (p.role == ParamRole::kLmHead) return filter_.ln_f;
  if (p.role == ParamRole::kPositionEmbedding) return filter_.wpe;
  if (p.is_final_norm()) return filter_.ln_f;
  if (!filter_.holds_layer(p.layer)) return false;
  return !p.is_expert() || filter_.holds_expert(p.expert);
}

void ShardLayout::add(const ParamSpec& p, Shape local, int split_dim,
                   std::vector<Range> ranges, bool replicated) {
  ShardSpec s;
  s.name = p.name;
  s.global_shape = p.shape;
  s.numel = shape_numel(local);
  s.local_shape = std::move(local);
  s.split_dim = split_dim;
  s.ranges = std::move(ranges);
  s.offset = numel_;
  s.decay = p.decay();
  s.tp_replicated = replicated;
  s.layer = p.layer;
  s.expert = p.is_expert();
  s.role = p.role;
  numel_ += s.numel;
  index_.emplace(s.name, shards_.size());
  shards_.push_back(std::move(s));
}

const ShardSpec& ShardLayout::at(std::string_view name) const {
  auto it = index_.find(std::string(name));
  SHARDLAB_CHECK(it != index_.end(), "no local tensor " + std::string(name));
  return shards_[it->second];
}

void ShardLayout::init(const ParamTable& table, uint64_t seed, float* params) const {
  for (const ShardSpec& s : shards_) {
    float* out = params + s.offset;
    if (s.split_dim < 0) {
      table.init_slice(s.name, seed, 0, s.numel, out);
      continue;
    }
    const int64_t gcols = s.global_shape.size() > 1 ? s.global_shape[1] : 1;
    if (s.split_dim == 0) {  // whole rows: one contiguous slice per range
      for (const auto& r : s.ranges) {
        table.init_slice(s.name, seed, r.begin * gcols, r.size * gcols, out);
        out += r.size * gcols;
      }
    } else {  // columns: one slice per row and range
      for (int64_t row = 0; row < s.global_shape[0]; ++row) {
        for (const auto& r : s.ranges) {
          table.init_slice(s.name, seed, row * gcols + r.begin, r.size, out);
          out += r.size;
        }
      }
    }
  }
}

namespace {

model::LinearView<float> linear(const ShardLayout& l, float* base, const std::string& prefix,
                                bool bias) {
  const ShardSpec& w = l.at(prefix + ".weight");
  model::LinearView<float> v;
  v.weight = model::shifted(base, w.offset);
  v.bias = bias ? model::shifted(base, l.at(prefix + ".bias").offset) : nullptr;
  v.out = static_cast<int>(w.local_shape[0]);
  v.in = static_cast<int>(w.local_shape[1]);
  return v;
}

model::LayerNormView<float> layernorm(const ShardLayout& l, float* base, const std::string& prefix) {
  return {model::shifted(base, l.at(prefix + ".weight").offset),
          model::shifted(base, l.at(prefix + ".bias").offset)};
}

model::MlpView<float> mlp(const ShardLayout& l, float* base, const std::string& prefix) {
  return {linear(l, base, prefix + ".c_fc", true), linear(l, base, prefix + ".c_proj", true)};
}

}  // namespace

model::GPTView<float> ShardLayout::llama_view(float* base) const {
  auto place = [&](const std::string& name) {
    const ShardSpec& s = at(name);
    return model::TensorPlace{s.offset, s.local_shape[0], s.local_shape.size() > 1 ? s.local_shape[1] : 1};
  };
  model::GPTView<float> v;
  if (filter_.wte) v.wte = model::shifted(base, at(model::embedding_name(config_)).offset);
  v.blocks.resize(size_t(config_.n_layer));
  for (int l = 0; l < config_.n_layer; ++l)
    if (filter_.holds_layer(l))
      v.blocks[size_t(l)] = model::llama_block_view(place, base, l, config_, [&](int e) { return filter_.holds_expert(e); });
  if (filter_.ln_f) v.ln_f.weight = model::shifted(base, at(model::final_norm_prefix(config_) + "weight").offset);
  return v;
}

model::GPTView<float> ShardLayout::view(float* base) const {
  model::GPTView<float> v = config_.is_llama() ? llama_view(base) : gpt_view(base);
  if (holds(model::kLmHeadName)) v.lm_head = model::shifted(base, at(model::kLmHeadName).offset);
  return v;
}

model::GPTView<float> ShardLayout::gpt_view(float* base) const {
  using model::block_name;
  model::GPTView<float> v;
  if (filter_.wte) v.wte = model::shifted(base, at("transformer.wte.weight").offset);
  if (filter_.wpe) v.wpe = model::shifted(base, at("transformer.wpe.weight").offset);
  for (int l = 0; l < config_.n_layer; ++l) {
    model::BlockView<float> b;
    if (!filter_.holds_layer(l)) {
      v.blocks.push_back(std::move(b));
      continue;
    }
    b.ln_1 = layernorm(*this, base, block_name(l, "ln_1"));
    b.c_attn = linear(*this, base, block_name(l, "attn.c_attn"), true);
    b.attn_proj = linear(*this, base, block_name(l, "attn.c_proj"), true);
    b.ln_2 = layernorm(*this, base, block_name(l, "ln_2"));
    b.moe = config_.is_moe_layer(l);
    if (b.moe) {
      b.router = model::shifted(base, at(block_name(l, "mlp.router.weight")).offset);
      if (config_.router_bias())
        b.router_bias = model::shifted(base, at(model::router_bias_name(config_, l)).offset);
      for (int e = 0; e < config_.n_expert; ++e)
        if (filter_.holds_expert(e)) b.experts.push_back(mlp(*this, base, block_name(l, "mlp.experts." + std::to_string(e))));
      if (config_.n_shared_expert > 0) b.shared = mlp(*this, base, block_name(l, "mlp.shared_experts"));
    } else {
      b.mlp = mlp(*this, base, block_name(l, "mlp"));
    }
    v.blocks.push_back(std::move(b));
  }
  if (filter_.ln_f) v.ln_f = layernorm(*this, base, "transformer.ln_f");
  return v;
}

}  // namespace shardlab::parallel
