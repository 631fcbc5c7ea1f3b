#include "model/parallel/tensor_parallel.h"

#include "model/gpt.h"

#include <algorithm>
#include <string>

#include "model/parallel/ep_moe.h"
#include "model/parallel/tp_embedding.h"
#include "runtime/errors.h"

namespace shardlab::parallel {

using model::Token;

namespace {

const model::GPTConfig& checked(const model::GPTConfig& config, int tp, bool sp,
                                const MoeGroups& moe) {
  config.validate();
  check_tensor_parallel_config(config, tp, sp);
  const int ep = moe.ep ? moe.ep->size() : 1;
  check_expert_parallel_config(config, ep, moe.capacity ? moe.capacity->size() : ep);
  return config;
}

// The experts an EP rank holds: [r·E/ep, (r+1)·E/ep).
LayoutFilter expert_filter(const model::GPTConfig& config, const MoeGroups& moe) {
  LayoutFilter f;
  if (!moe.ep || moe.ep->size() == 1) return f;
  const int El = config.n_expert / moe.ep->size();
  f.expert_begin = moe.ep->rank() * El;
  f.expert_end = f.expert_begin + El;
  return f;
}

FlatRange range_of(const ShardSpec& s) { return {s.offset, s.numel}; }

}  // namespace

TensorParallelGPT::TensorParallelGPT(const model::GPTConfig& config, uint64_t seed, Device& dev,
                                     const collectives::ProcessGroup& tp_group, bool sp,
                                     const MoeGroups& moe)
    : config_(checked(config, tp_group.size(), sp, moe)),
      group_(tp_group),
      layout_(config_, group_.size(), group_.rank(), expert_filter(config_, moe)) {
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
  v0_ = static_cast<int64_t>(group_.rank()) * Vl_;
  params_.assign(layout_.numel(), 0.0f);
  grads_.assign(layout_.numel(), 0.0f);
  layout_.init(model::ParamTable(config_), seed, params_.data());
  w_ = layout_.view(params_.data());
  g_ = layout_.view(grads_.data());
  wte_range_ = layout_.prefix("transformer.wte.");
  wpe_range_ = layout_.prefix("transformer.wpe.");
  lnf_range_ = layout_.prefix("transformer.ln_f.");
  if (!sp) return;
  // With SP the LayerNorm and wpe gradients are sums over this rank's rows:
  // backward writes them to stage_ and reduce_staged() sums them over TP.
  stage_.assign(layout_.numel(), 0.0f);
  const model::GPTView<float> s = layout_.view(stage_.data());
  g_.wpe = s.wpe;
  g_.ln_f = s.ln_f;
  block_staged_.resize(config_.n_layer);
  for (int l = 0; l < config_.n_layer; ++l) {
    g_.blocks[l].ln_1 = s.blocks[l].ln_1;
    g_.blocks[l].ln_2 = s.blocks[l].ln_2;
    for (const char* t : {"ln_1.weight", "ln_1.bias", "ln_2.weight", "ln_2.bias"})
      block_staged_[l].push_back(range_of(layout_.at(model::block_name(l, t))));
  }
  lnf_staged_ = {range_of(layout_.at("transformer.ln_f.weight")),
                 range_of(layout_.at("transformer.ln_f.bias"))};
  wpe_staged_ = {range_of(layout_.at("transformer.wpe.weight"))};
}

void TensorParallelGPT::check_inputs(const Token* inputs, const Token* targets, int B,
                                     int T) const {
  model::check_batch(config_, inputs, targets, B, T);
  if (ctx_.sp && T % group_.size() != 0) {
    throw ConfigError("sequence length " + std::to_string(T) + " must be divisible by --tp " +
                      std::to_string(group_.size()) + " with --sp");
  }
}

void TensorParallelGPT::resize_activations(int B, int T) {
  if (dims_.B == B && dims_.T == T) return;
  dims_ = TpDims{B, T, config_.n_embd, config_.n_head, group_.size(), ctx_.sp, ep_size()};
  const int64_t N = dims_.N(), Nr = dims_.rows(), C = dims_.C;
  encoded_.assign(Nr * C, 0);
  blocks_.resize(config_.n_layer);
  block_elems_.assign(config_.n_layer, 0);
  for (int l = 0; l < config_.n_layer; ++l) {
    blocks_[l].resize(dims_, config_, config_.is_moe_layer(l));
    blocks_[l].moe.stats.expert_begin = layout_.filter().expert_begin;
    block_elems_[l] = blocks_[l].saved_elements();
  }
  lnf_.assign(Nr * C, 0);
  lnf_mean_.assign(Nr, 0);
  lnf_rstd_.assign(Nr, 0);
  logits_.assign(N * Vl_, 0);
  probs_.assign(N * Vl_, 0);
  losses_.assign(N, 0);
  ce_stats_.assign(3 * N, 0);
  head_elems_ = Nr * C + 2 * Nr + 2 * N * Vl_ + N;
  scratch_.resize(dims_, config_);
  dlogits_.assign(N * Vl_, 0);
  for (auto* v : {&dlnf_, &dx_, &dx_next_}) v->assign(Nr * C, 0);
}

float TensorParallelGPT::forward(const Token* inputs, const Token* targets, int B, int T) {
  check_inputs(inputs, targets, B, T);
  if (acts_live_) release_activations();  // a forward that had no backward
  resize_activations(B, T);
  acts_live_ = true;
  const int64_t N = dims_.N(), Nr = dims_.rows();
  const int C = dims_.C;
  const model::Exec& ex = ctx_.ex;
  inputs_.assign(inputs, inputs + N);
  have_targets_ = targets != nullptr;
  if (have_targets_) targets_.assign(targets, targets + N);

  vocab_parallel_embedding_forward(encoded_.data(), scratch_.partial.data(), inputs, w_.wte, w_.wpe,
                                   v0_, Vl_, dims_, ctx_);
  saved(Nr * C);
  const float* x = encoded_.data();
  aux_loss_ = 0;
  for (int l = 0; l < config_.n_layer; ++l) {
    aux_loss_ += tp_block_forward(blocks_[l], w_.blocks[l], x, dims_, config_, scratch_, ctx_);
    block_elems_[l] = blocks_[l].saved_elements();  // EP: the rows received this time
    if (config_.is_moe_layer(l)) add_moe_stats(moe_step_[size_t(l)], l, blocks_[l].moe.stats);
    saved(block_elems_[l]);
    x = blocks_[l].res2.data();
  }
  model::layernorm_forward(lnf_.data(), lnf_mean_.data(), lnf_rstd_.data(), x, w_.ln_f.weight,
                           w_.ln_f.bias, Nr, C);
  ex.op("ln_f.fwd", model::layernorm_forward_cost(Nr, C, ex.elem));
  // Tied head, column-parallel over the vocabulary: logits (N,Vl).
  const float* lnf_full = enter_column_parallel(ctx_, lnf_.data(), scratch_.full_in.data(), Nr, C);
  model::linear_forward(logits_.data(), lnf_full, w_.wte, static_cast<const float*>(nullptr), N, C,
                        Vl_);
  ex.op("lm_head.fwd", model::linear_forward_cost(N, C, Vl_, false, ex.elem));
  saved(head_elems_);
  if (!have_targets_) {
    release_activations();
    return ce_loss_ = 0;
  }
  ce_loss_ = vocab_parallel_cross_entropy_forward(probs_.data(), losses_.data(), ce_stats_.data(),
                                                  logits_.data(), targets, N, Vl_, v0_, ctx_);
  return ce_loss_ + static_cast<float>(config_.aux_coef) * aux_loss_;
}

const MoeStats* TensorParallelGPT::moe_stats(int layer) const {
  if (layer < 0 || layer >= static_cast<int>(blocks_.size()) || !config_.is_moe_layer(layer))
    return nullptr;
  return &blocks_[static_cast<size_t>(layer)].moe.stats;
}

void TensorParallelGPT::release_activations() {
  int64_t n = dims_.rows() * dims_.C + head_elems_;
  for (int64_t e : block_elems_) n += e;
  freed(n);
  acts_live_ = false;
}

void TensorParallelGPT::zero_grad() {
  std::fill(grads_.begin(), grads_.end(), 0.0f);
  ctx_.ex.op("zero_grad", {0, static_cast<double>(grads_.size()) * ctx_.ex.elem});
}

void TensorParallelGPT::reduce_staged(const std::vector<FlatRange>& ranges) {
  int64_t total = 0;
  for (const FlatRange& r : ranges) total += r.count;
  pack_.resize(static_cast<size_t>(total));
  float* p = pack_.data();
  for (const FlatRange& r : ranges) p = std::copy_n(stage_.data() + r.offset, r.count, p);
  copy_to_tp_region_bwd(ctx_, pack_.data(), pack_.data(), total);
  p = pack_.data();
  for (const FlatRange& r : ranges) {
    float* g = grads_.data() + r.offset;
    for (int64_t i = 0; i < r.count; ++i) g[i] += p[i];
    std::fill_n(stage_.data() + r.offset, r.count, 0.0f);
    p += r.count;
  }
  ctx_.ex.op("sp.grad_reduce.add", model::residual_forward_cost(total, ctx_.ex.elem));
}

void TensorParallelGPT::backward() {
  SHARDLAB_CHECK(have_targets_ && acts_live_, "backward() needs a forward() with targets");
  const int64_t N = dims_.N(), Nr = dims_.rows();
  const int C = dims_.C;
  const model::Exec& ex = ctx_.ex;
  const model::GPTView<float>& p = w_;
  const model::GPTView<float>& g = g_;
  // loss = mean CE over the vocabulary shards
  saved(N * Vl_);  // dlogits, alive until the head's backward is done
  std::fill(dlogits_.begin(), dlogits_.end(), 0.0f);
  vocab_parallel_cross_entropy_backward(dlogits_.data(), probs_.data(), targets_.data(), 1.0f, N,
                                        Vl_, v0_, ex);
  // logits = lnf_full · wte_localᵀ
  const float* lnf_full = enter_column_parallel(ctx_, lnf_.data(), scratch_.full_in.data(), Nr, C);
  std::fill(scratch_.partial.begin(), scratch_.partial.begin() + N * C, 0.0f);
  model::linear_backward(scratch_.partial.data(), g.wte, static_cast<float*>(nullptr),
                         dlogits_.data(), lnf_full, p.wte, N, C, Vl_);
  ex.op("lm_head.bwd", model::linear_backward_cost(N, C, Vl_, false, ex.elem));
  freed(N * Vl_);
  enter_column_parallel_bwd(ctx_, scratch_.partial.data(), dlnf_.data(), Nr, C);
  // lnf = ln_f(x_L)
  const float* x_last = config_.n_layer > 0 ? blocks_.back().res2.data() : encoded_.data();
  std::fill(dx_.begin(), dx_.end(), 0.0f);
  model::layernorm_backward(dx_.data(), g.ln_f.weight, g.ln_f.bias, dlnf_.data(), x_last,
                            p.ln_f.weight, lnf_mean_.data(), lnf_rstd_.data(), Nr, C);
  ex.op("ln_f.bwd", model::layernorm_backward_cost(Nr, C, ex.elem));
  freed(head_elems_);
  if (ctx_.sp) reduce_staged(lnf_staged_);
  grads_ready(lnf_range_);
  // x_{l+1} = block_l(x_l)
  const float daux = static_cast<float>(config_.aux_coef);
  for (int l = config_.n_layer - 1; l >= 0; --l) {
    const float* x_in = l > 0 ? blocks_[l - 1].res2.data() : encoded_.data();
    std::fill(dx_next_.begin(), dx_next_.end(), 0.0f);
    tp_block_backward(dx_next_.data(), g.blocks[l], scratch_, dx_.data(), daux, blocks_[l], x_in,
                      p.blocks[l], dims_, config_, ctx_);
    freed(block_elems_[l]);
    if (ctx_.sp) reduce_staged(block_staged_[l]);
    grads_ready(layout_.block(l));
    std::swap(dx_, dx_next_);
  }
  // x_0 = wte[idx] (vocab-parallel) + wpe
  vocab_parallel_embedding_backward(g.wte, g.wpe, scratch_.full_dout.data(), dx_.data(),
                                    inputs_.data(), v0_, Vl_, dims_, ctx_);
  freed(Nr * C);
  if (ctx_.sp) reduce_staged(wpe_staged_);
  grads_ready(wte_range_);
  grads_ready(wpe_range_);
  acts_live_ = false;
}

}  // namespace shardlab::parallel
