#include "model/parallel/sharded_gpt.h"

#include <algorithm>
#include <numeric>
#include <string>

#include <fmt/format.h>

#include "model/gpt.h"
#include "model/parallel/expert/ep_dispatch.h"
#include "model/parallel/tensor/embedding.h"
#include "runtime/errors.h"

namespace shardlab::parallel {

using model::Token;

std::vector<int> balanced_stage_layers(int n_layer, int stages) {
  std::vector<int> out(size_t(std::max(stages, 0)), stages > 0 ? n_layer / stages : 0);
  for (int s = 0; s < stages && s < n_layer % stages; ++s) ++out[size_t(s)];
  return out;
}

std::vector<int> parse_stage_layers(const std::string& text) {
  std::vector<int> out;
  size_t at = 0;
  while (at <= text.size()) {
    const size_t comma = std::min(text.find(',', at), text.size());
    const std::string item = text.substr(at, comma - at);
    size_t used = 0;
    int value = 0;
    try {
      value = std::stoi(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (item.empty() || used != item.size())
      throw ConfigError(fmt::format("--pp-layers \"{}\": expected comma-separated layer counts like 3,3,2", text));
    out.push_back(value);
    at = comma + 1;
  }
  return out;
}

void check_stage_layers(const model::GPTConfig& config, int pp, int vpp,
                        const std::vector<int>& stage_layers) {
  const int stages = pp * vpp;
  if (stages > config.n_layer) {
    throw ConfigError(vpp > 1 ? fmt::format("--pp {} x --vpp {} = {} stages is more than --layers {} "
                                            "(every stage needs a block)", pp, vpp, stages, config.n_layer)
                              : fmt::format("--pp {} is more than --layers {} (every stage needs a block)",
                                            pp, config.n_layer));
  }
  if (stage_layers.empty()) return;
  if (int(stage_layers.size()) != stages)
    throw ConfigError(fmt::format("--pp-layers has {} entries but there are {} stages (--pp x --vpp)",
                                  stage_layers.size(), stages));
  if (*std::min_element(stage_layers.begin(), stage_layers.end()) < 1)
    throw ConfigError("--pp-layers: every stage needs at least one block");
  const int sum = std::accumulate(stage_layers.begin(), stage_layers.end(), 0);
  if (sum != config.n_layer)
    throw ConfigError(fmt::format("--pp-layers sums to {} but the model has --layers {}", sum, config.n_layer));
}

int StagePlacement::first_layer(int chunk) const {
  return std::accumulate(stage_layers.begin(), stage_layers.begin() + stage(chunk), 0);
}

int StagePlacement::end_layer(int chunk) const {
  return first_layer(chunk) + stage_layers[size_t(stage(chunk))];
}

namespace {

StagePlacement checked(const model::GPTConfig& config, int tp, bool sp, StagePlacement p,
                       const MoeGroups& moe) {
  config.validate();
  check_tensor_parallel_config(config, tp, sp);
  const int ep = moe.ep ? moe.ep->size() : 1;
  check_expert_parallel_config(config, ep, moe.capacity ? moe.capacity->size() : ep);
  check_stage_layers(config, p.pp, p.vpp, p.stage_layers);
  SHARDLAB_CHECK(p.rank >= 0 && p.rank < p.pp, "pipeline rank out of range");
  if (p.stage_layers.empty()) p.stage_layers = balanced_stage_layers(config.n_layer, p.stages());
  return p;
}

LayoutFilter stage_filter(const model::GPTConfig& config, const StagePlacement& p,
                          const MoeGroups& moe) {
  LayoutFilter f;
  if (moe.ep && moe.ep->size() > 1) {  // experts [r·E/ep, (r+1)·E/ep)
    const int El = config.n_expert / moe.ep->size();
    f.expert_begin = moe.ep->rank() * El;
    f.expert_end = f.expert_begin + El;
  }
  f.layers.assign(size_t(config.n_layer), false);
  f.wte = f.wpe = f.ln_f = false;
  for (int c = 0; c < p.vpp; ++c) {
    for (int l = p.first_layer(c); l < p.end_layer(c); ++l) f.layers[size_t(l)] = true;
    f.wpe = f.wpe || p.first(c);
    f.ln_f = f.ln_f || p.last(c);
  }
  f.wte = f.wpe || f.ln_f;
  return f;
}

FlatRange range_of(const ShardSpec& s) { return {s.offset, s.numel}; }

}  // namespace

PipelineModel::PipelineModel(const model::GPTConfig& config, uint64_t seed, Device& dev,
                             const collectives::ProcessGroup& tp_group, bool sp,
                             StagePlacement placement, const MoeGroups& moe)
    : config_(config),
      place_(checked(config, tp_group.size(), sp, std::move(placement), moe)),
      group_(tp_group),
      layout_(config_, group_.size(), group_.rank(), stage_filter(config_, place_, moe)) {
  ctx_.dev = &dev;
  ctx_.group = &group_;
  ctx_.sp = sp;
  ctx_.a2a_time = &a2a_time_;
  if (config_.is_moe()) moe_step_.resize(size_t(config_.n_layer));
  if (moe.capacity) {
    capacity_group_ = *moe.capacity;
    ctx_.capacity_group = &*capacity_group_;
  }
  if (moe.ep && moe.ep->size() > 1) {
    // With ep = dp the two groups have the same members: one sequence counter.
    const bool same = moe.capacity && moe.capacity->members() == moe.ep->members();
    ep_group_ = same ? *moe.capacity : *moe.ep;
    ctx_.ep = &*ep_group_;
  }
  Vl_ = config_.vocab_size / group_.size();
  v0_ = int64_t{group_.rank()} * Vl_;
  params_.assign(layout_.numel(), 0.0f);
  grads_.assign(layout_.numel(), 0.0f);
  layout_.init(model::ParamTable(config_), seed, params_.data());
  w_ = layout_.view(params_.data());
  g_ = layout_.view(grads_.data());
  slots_.resize(size_t(place_.vpp));
  if (!sp) return;
  // With SP the LayerNorm and wpe gradients are sums over this rank's rows.
  stage_.assign(layout_.numel(), 0.0f);
  const model::GPTView<float> s = layout_.view(stage_.data());
  const LayoutFilter& f = layout_.filter();
  if (f.wpe) {
    g_.wpe = s.wpe;
    wpe_staged_ = {range_of(layout_.at("transformer.wpe.weight"))};
  }
  if (f.ln_f) {
    g_.ln_f = s.ln_f;
    lnf_staged_ = {range_of(layout_.at("transformer.ln_f.weight")),
                   range_of(layout_.at("transformer.ln_f.bias"))};
  }
  block_staged_.resize(size_t(config_.n_layer));
  for (int l = 0; l < config_.n_layer; ++l) {
    if (!f.holds_layer(l)) continue;
    g_.blocks[l].ln_1 = s.blocks[l].ln_1;
    g_.blocks[l].ln_2 = s.blocks[l].ln_2;
    for (const char* t : {"ln_1.weight", "ln_1.bias", "ln_2.weight", "ln_2.bias"})
      block_staged_[l].push_back(range_of(layout_.at(model::block_name(l, t))));
  }
}

void PipelineModel::set_micro_batch(int B, int T) {
  if (dims_.B == B && dims_.T == T) return;
  for (const auto& pool : slots_)
    for (const Slot& s : pool) SHARDLAB_CHECK(s.mb < 0, "micro-batch shape changed with activations in flight");
  model::check_batch(config_, nullptr, nullptr, B, T);
  if (ctx_.sp && T % group_.size() != 0)
    throw ConfigError(fmt::format("sequence length {} must be divisible by --tp {} with --sp", T, group_.size()));
  dims_ = TpDims{B, T, config_.n_embd, config_.n_head, group_.size(), ctx_.sp, ep_group_ ? ep_group_->size() : 1};
  const int64_t N = dims_.N(), Nr = dims_.rows(), C = dims_.C;
  for (auto& pool : slots_) pool.clear();
  scratch_.resize(dims_, config_);
  const bool head = layout_.filter().ln_f;
  ce_stats_.assign(head ? 3 * N : 0, 0.0f);
  dlogits_.assign(head ? N * Vl_ : 0, 0.0f);
  for (auto* b : {&dlnf_, &dx_, &dx_next_}) b->assign(Nr * C, 0.0f);
}

void PipelineModel::size_slot(int chunk, Slot& s) const {
  const int64_t N = dims_.N(), Nr = dims_.rows(), C = dims_.C;
  if (place_.first(chunk)) s.inputs.assign(N, 0);
  s.x.assign(Nr * C, 0.0f);
  const int l0 = place_.first_layer(chunk), l1 = place_.end_layer(chunk);
  s.blocks.resize(size_t(l1 - l0));
  for (int l = l0; l < l1; ++l) {
    TpBlockActs& a = s.blocks[size_t(l - l0)];
    a.resize(dims_, config_, config_.is_moe_layer(l));
    a.moe.stats.expert_begin = layout_.filter().expert_begin;
  }
  if (!place_.last(chunk)) return;
  s.targets.assign(N, 0);
  s.lnf.assign(Nr * C, 0.0f);
  s.lnf_mean.assign(Nr, 0.0f);
  s.lnf_rstd.assign(Nr, 0.0f);
  s.logits.assign(N * Vl_, 0.0f);
  s.probs.assign(N * Vl_, 0.0f);
  s.losses.assign(N, 0.0f);
}

PipelineModel::Slot& PipelineModel::slot(int chunk, int mb, bool create) {
  SHARDLAB_CHECK(dims_.B > 0, "set_micro_batch() before the first forward");
  auto& pool = slots_[size_t(chunk)];
  for (Slot& s : pool)
    if (s.mb == mb) return s;
  SHARDLAB_CHECK(create, fmt::format("no activations of micro-batch {} chunk {}", mb, chunk));
  auto free = std::find_if(pool.begin(), pool.end(), [](const Slot& s) { return s.mb < 0; });
  if (free == pool.end()) {
    pool.emplace_back();
    size_slot(chunk, pool.back());
    free = pool.end() - 1;
  }
  free->mb = mb;
  free->elems = 0;
  return *free;
}

float* PipelineModel::input(int chunk, int mb) {
  SHARDLAB_CHECK(!place_.first(chunk), "the first stage embeds its input");
  return slot(chunk, mb, true).x.data();
}

const float* PipelineModel::output(int chunk, int mb) const {
  const Slot& s = const_cast<PipelineModel*>(this)->slot(chunk, mb, false);
  return s.blocks.empty() ? s.x.data() : s.blocks.back().res2.data();
}

float PipelineModel::forward(int chunk, int mb, const Token* inputs, const Token* targets) {
  const bool first = place_.first(chunk), last = place_.last(chunk);
  SHARDLAB_CHECK(!first || inputs, "the first stage needs the input tokens");
  Slot& s = slot(chunk, mb, true);
  const int64_t N = dims_.N(), Nr = dims_.rows();
  const int C = dims_.C;
  const model::Exec& ex = ctx_.ex;
  if (first) {
    std::copy_n(inputs, N, s.inputs.data());
    vocab_parallel_embedding_forward(s.x.data(), scratch_.partial.data(), inputs, w_.wte, w_.wpe,
                                     v0_, Vl_, dims_, ctx_);
  }
  const float* x = s.x.data();
  const int l0 = place_.first_layer(chunk);
  float aux = 0;
  for (size_t i = 0; i < s.blocks.size(); ++i) {
    const int l = l0 + int(i);
    aux += tp_block_forward(s.blocks[i], w_.blocks[l], x, dims_, config_, scratch_, ctx_);
    if (config_.is_moe_layer(l)) add_moe_stats(moe_step_[size_t(l)], l, s.blocks[i].moe.stats);
    x = s.blocks[i].res2.data();
  }
  aux_sum_ += aux;
  last_aux_ = aux;
  // Saved for backward: the input, each block's activations (with EP the rows
  // its experts received this time) and, on the last stage, the head's.
  s.elems = Nr * C;
  for (const TpBlockActs& a : s.blocks) s.elems += a.saved_elements();
  if (last) s.elems += Nr * C + 2 * Nr + 2 * N * Vl_ + N;
  if (ex.sink) ex.sink->saved(s.elems);
  if (!last) return 0;
  if (targets) std::copy_n(targets, N, s.targets.data());
  model::layernorm_forward(s.lnf.data(), s.lnf_mean.data(), s.lnf_rstd.data(), x, w_.ln_f.weight,
                           w_.ln_f.bias, Nr, C);
  ex.op("ln_f.fwd", model::layernorm_forward_cost(Nr, C, ex.elem));
  const float* lnf_full = enter_column_parallel(ctx_, s.lnf.data(), scratch_.full_in.data(), Nr, C);
  model::linear_forward(s.logits.data(), lnf_full, w_.wte, static_cast<const float*>(nullptr), N, C, Vl_);
  ex.op("lm_head.fwd", model::linear_forward_cost(N, C, Vl_, false, ex.elem));
  if (!targets) return last_ce_ = 0;  // logits only
  const float ce = vocab_parallel_cross_entropy_forward(s.probs.data(), s.losses.data(), ce_stats_.data(),
                                                        s.logits.data(), targets, N, Vl_, v0_, ctx_);
  ce_sum_ += ce;
  last_ce_ = ce;
  return ce;
}

void sp_reduce_staged(const TpContext& c, const std::vector<FlatRange>& ranges, float* stage,
                      float* grads, Buf<float>& pack) {
  int64_t total = 0;
  for (const FlatRange& r : ranges) total += r.count;
  if (total == 0) return;
  pack.resize(static_cast<size_t>(total));
  float* p = pack.data();
  for (const FlatRange& r : ranges) p = std::copy_n(stage + r.offset, r.count, p);
  copy_to_tp_region_bwd(c, pack.data(), pack.data(), total);
  p = pack.data();
  for (const FlatRange& r : ranges) {
    float* g = grads + r.offset;
    for (int64_t i = 0; i < r.count; ++i) g[i] += p[i];
    std::fill_n(stage + r.offset, r.count, 0.0f);
    p += r.count;
  }
  c.ex.op("sp.grad_reduce.add", model::residual_forward_cost(total, c.ex.elem));
}

void PipelineModel::reduce_staged(const std::vector<FlatRange>& ranges) {
  sp_reduce_staged(ctx_, ranges, stage_.data(), grads_.data(), pack_);
}

void PipelineModel::backward(int chunk, int mb, float dloss, bool last_micro_batch) {
  Slot& s = slot(chunk, mb, false);
  const bool first = place_.first(chunk), last = place_.last(chunk);
  const int64_t N = dims_.N(), Nr = dims_.rows();
  const int C = dims_.C;
  const model::Exec& ex = ctx_.ex;
  const bool sp = ctx_.sp, fin = last_micro_batch;
  if (last) {
    if (ex.sink) ex.sink->saved(N * Vl_);  // dlogits, alive until the head's backward is done
    std::fill(dlogits_.begin(), dlogits_.end(), 0.0f);
    vocab_parallel_cross_entropy_backward(dlogits_.data(), s.probs.data(), s.targets.data(), dloss, N,
                                          Vl_, v0_, ex);
    const float* lnf_full = enter_column_parallel(ctx_, s.lnf.data(), scratch_.full_in.data(), Nr, C);
    std::fill(scratch_.partial.begin(), scratch_.partial.begin() + N * C, 0.0f);
    model::linear_backward(scratch_.partial.data(), g_.wte, static_cast<float*>(nullptr), dlogits_.data(),
                           lnf_full, w_.wte, N, C, Vl_);
    ex.op("lm_head.bwd", model::linear_backward_cost(N, C, Vl_, false, ex.elem));
    if (ex.sink) ex.sink->freed(N * Vl_);
    enter_column_parallel_bwd(ctx_, scratch_.partial.data(), dlnf_.data(), Nr, C);
    const float* x_last = s.blocks.empty() ? s.x.data() : s.blocks.back().res2.data();
    std::fill(dx_.begin(), dx_.end(), 0.0f);
    model::layernorm_backward(dx_.data(), g_.ln_f.weight, g_.ln_f.bias, dlnf_.data(), x_last,
                              w_.ln_f.weight, s.lnf_mean.data(), s.lnf_rstd.data(), Nr, C);
    ex.op("ln_f.bwd", model::layernorm_backward_cost(Nr, C, ex.elem));
    if (fin && sp) reduce_staged(lnf_staged_);
    if (fin) grads_ready(layout_.prefix("transformer.ln_f."));
  }
  // Otherwise dx_ holds the output gradient received from the next stage.
  const float daux = static_cast<float>(config_.aux_coef) * dloss;
  const int l0 = place_.first_layer(chunk);
  for (int i = int(s.blocks.size()) - 1; i >= 0; --i) {
    const int l = l0 + i;
    const float* x_in = i > 0 ? s.blocks[size_t(i - 1)].res2.data() : s.x.data();
    std::fill(dx_next_.begin(), dx_next_.end(), 0.0f);
    tp_block_backward(dx_next_.data(), g_.blocks[l], scratch_, dx_.data(), daux, s.blocks[size_t(i)], x_in,
                      w_.blocks[l], dims_, config_, ctx_);
    if (fin && sp) reduce_staged(block_staged_[size_t(l)]);
    if (fin) grads_ready(layout_.block(l));
    std::swap(dx_, dx_next_);
  }
  if (first) {
    vocab_parallel_embedding_backward(g_.wte, g_.wpe, scratch_.full_dout.data(), dx_.data(),
                                      s.inputs.data(), v0_, Vl_, dims_, ctx_);
    if (fin && sp) reduce_staged(wpe_staged_);
    // The tied wte is final here when this rank also holds the head (one
    // pipeline rank); otherwise the trainer sums the two copies first.
    if (fin && layout_.filter().ln_f) grads_ready(wte_range());
    if (fin) grads_ready(layout_.prefix("transformer.wpe."));
  }
  if (ex.sink) ex.sink->freed(s.elems);
  s.mb = -1;
}

float PipelineModel::forward(const Token* inputs, const Token* targets, int B, int T) {
  SHARDLAB_CHECK(place_.stages() == 1, "a whole-batch forward needs every stage on this rank");
  model::check_batch(config_, inputs, targets, B, T);
  set_micro_batch(B, T);
  for (auto& pool : slots_)
    for (Slot& s : pool)
      if (s.mb >= 0) {  // a forward that had no backward
        if (ctx_.ex.sink && s.elems > 0) ctx_.ex.sink->freed(s.elems);
        s.mb = -1;
      }
  reset_losses();
  const float ce = forward(0, 0, inputs, targets);
  if (!targets) {  // no backward will follow
    Slot& s = slot(0, 0, false);
    if (ctx_.ex.sink) ctx_.ex.sink->freed(s.elems);
    s.mb = -1;
    return 0;
  }
  return ce + static_cast<float>(config_.aux_coef) * last_aux_;
}

std::span<const float> PipelineModel::local_logits() const {
  SHARDLAB_CHECK(place_.stages() == 1 && !slots_[0].empty(), "local_logits() needs a whole-batch forward");
  return {slots_[0].front().logits.data(), slots_[0].front().logits.size()};
}

const MoeStats* PipelineModel::moe_stats(int layer) const {
  if (place_.stages() != 1 || slots_[0].empty() || !config_.is_moe_layer(layer)) return nullptr;
  return &slots_[0].front().blocks[size_t(layer)].moe.stats;
}

void PipelineModel::backward() { backward(0, 0, 1.0f, true); }

void PipelineModel::zero_grad() {
  std::fill(grads_.begin(), grads_.end(), 0.0f);
  ctx_.ex.op("zero_grad", {0, static_cast<double>(grads_.size()) * ctx_.ex.elem});
}

}  // namespace shardlab::parallel
