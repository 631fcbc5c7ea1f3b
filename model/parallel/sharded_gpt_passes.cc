// ShardedGPT's passes: forward, the input-gradient pass (B) and the
// weight-gradient pass (W) of one (chunk, micro-batch), and the moments the
// chunk's gradients become final. Shapes use the letters of dims.h.
#include <algorithm>

#include <fmt/format.h>

#include "model/kernels.h"
#include "model/parallel/expert/moe.h"
#include "model/parallel/sharded_gpt.h"
#include "model/parallel/tensor/embedding.h"
#include "runtime/errors.h"

namespace shardlab::parallel {

using model::Token;

void ShardedGPT::embed(Slot& s, const Token* inputs) {
  SHARDLAB_CHECK(inputs, "the first stage needs the input tokens");
  std::copy_n(inputs, dims_.N(), s.inputs.data());  // tokens are real even in a phantom run
  vocab_parallel_embedding_forward(s.x.data(), scratch_.partial.data(), inputs, w_.wte, w_.wpe, v0_,
                                   Vl_, dims_, ctx_.tp);
}

void ShardedGPT::forward(int chunk, int mb, int buffer, const MicroBatchTokens& tokens) {
  Slot& s = slot(chunk, mb, true);
  SHARDLAB_CHECK(!s.activations, fmt::format("repeated forward of micro-batch {} chunk {}", mb, chunk));
  const int64_t Nr = dims_.rows();
  const int C = dims_.C;
  if (place_.first(chunk)) {
    if (hooks_) hooks_->before_forward(BlockHooks::kEmbeddings);
    embed(s, tokens.inputs);
    if (hooks_) hooks_->after_forward(BlockHooks::kEmbeddings);
  } else {
    const float* in = activation_buffer(chunk, buffer);
    if (ctx_.ex().math()) std::copy_n(in, Nr * C, s.x.data());  // a handover (sink.h)
  }
  const float* x = s.x.data();
  const int l0 = place_.first_layer(chunk);
  float aux = 0;
  for (size_t i = 0; i < s.blocks.size(); ++i) {
    const int l = l0 + int(i);
    if (hooks_) hooks_->before_forward(l);
    aux += block_forward(s.blocks[i], w_.blocks[l], x, dims_, config_, scratch_, ctx_);
    if (config_.is_moe_layer(l)) add_moe_stats(moe_step_[size_t(l)], l, s.blocks[i].moe.stats);
    if (hooks_) hooks_->after_forward(l);
    x = s.blocks[i].res2.data();
  }
  aux_sum_ += aux;
  last_aux_ = aux;
  // Saved for backward: the input, each block's activations (with EP the rows
  // its experts received this time) and, on the last stage, the head's.
  s.elems = static_cast<int64_t>(s.x.size()) + head_elements(s);
  const int n = int(s.blocks.size());
  for (int i = 0; i < n; ++i) s.elems += kept_elements(s.blocks[size_t(i)], l0 + i, i, n);
  if (ctx_.ex().sink) ctx_.ex().sink->saved(s.elems);
  s.activations = true;
  if (place_.last(chunk)) {
    if (hooks_) hooks_->before_forward(head_id());
    head_forward(s, x, tokens.targets);
    if (hooks_) hooks_->after_forward(head_id());
  }
}

float ShardedGPT::head_forward(Slot& s, const float* x, const Token* targets) {
  const int64_t N = dims_.N(), Nr = dims_.rows();
  const int C = dims_.C;
  const model::Exec& ex = ctx_.ex();
  if (targets) std::copy_n(targets, N, s.targets.data());
  model::norm_forward(s.lnf.data(), s.lnf_mean.data(), s.lnf_rstd.data(), x, w_.ln_f, Nr, C, config_, "ln_f.fwd",
                      ex);
  const float* lnf_full = enter_column_parallel(ctx_.tp, s.lnf.data(), scratch_.full_in.data(), Nr, C);
  model::linear_forward(ex, "lm_head.fwd", s.logits.data(), lnf_full, w_.head(), N, C, Vl_);
  if (!targets) return last_ce_ = 0;  // logits only
  const float ce = vocab_parallel_cross_entropy_forward(s.probs.data(), s.losses.data(), ce_stats_.data(),
                                                        s.logits.data(), targets, N, Vl_, v0_, ctx_.tp,
                                                        !ctx_.ex().fusions.cross_entropy);
  ce_sum_ += ce;
  last_ce_ = ce;
  return ce;
}

void ShardedGPT::head_backward(Slot& s, float dloss, bool final) {
  const int64_t N = dims_.N(), Nr = dims_.rows();
  const int C = dims_.C;
  const model::Exec& ex = ctx_.ex();
  const auto dlogits = static_cast<int64_t>(dlogits_.size());
  if (ex.sink) ex.sink->saved(dlogits);  // alive until the head's backward is done
  std::fill(dlogits_.begin(), dlogits_.end(), 0.0f);
  vocab_parallel_cross_entropy_backward(dlogits_.data(), s.probs.data(), s.targets.data(), dloss, N,
                                        Vl_, v0_, ex, !ex.fusions.cross_entropy);
  const float* lnf_full = enter_column_parallel(ctx_.tp, s.lnf.data(), bwd_scratch().full_in.data(), Nr, C);
  if (ex.math()) std::fill(bwd_scratch().partial.begin(), bwd_scratch().partial.begin() + N * C, 0.0f);  // a handover (sink.h)
  linear_backward_split(bwd_scratch().partial.data(), g_.head(), nullptr, dlogits_.data(), lnf_full, w_.head(),
                        N, C, Vl_, {"lm_head.dgrad", "lm_head.wgrad", false}, s.wgrad, ex);
  s.wgrad.end_block(head_id());
  if (!s.wgrad.deferred()) accumulated(head_id());
  if (ex.sink) ex.sink->freed(dlogits);
  enter_column_parallel_bwd(ctx_.tp, bwd_scratch().partial.data(), dlnf_.data(), Nr, C);
  const float* x_last = s.blocks.empty() ? s.x.data() : s.blocks.back().res2.data();
  std::fill(dx_.begin(), dx_.end(), 0.0f);
  model::norm_backward(dx_.data(), g_.ln_f, dlnf_.data(), x_last, w_.ln_f, s.lnf_mean.data(), s.lnf_rstd.data(),
                       Nr, C, config_, "ln_f.bwd", ex);
  release_activations(s, head_elements(s));
  if (!s.wgrad.deferred()) finish_block(head_id(), final);
}

int64_t ShardedGPT::head_elements(const Slot& s) {
  int64_t n = 0;
  for (const Buf<float>* b : {&s.lnf, &s.lnf_mean, &s.lnf_rstd, &s.logits, &s.probs, &s.losses})
    n += static_cast<int64_t>(b->size());  // empty unless this is the last stage
  return n;
}

// As autograd frees a node's saved tensors once its backward ran: the
// activations of a block (or the head) go as soon as its B is done, and the
// layer inputs a deferred W still needs stay, now counted as its stash.
void ShardedGPT::release_activations(Slot& s, int64_t elements) {
  if (ctx_.ex().sink && elements > 0) ctx_.ex().sink->freed(elements);
  s.elems -= elements;
  s.wgrad.charge_inputs(ctx_.ex());
}

void ShardedGPT::blocks_backward(int chunk, Slot& s, float dloss, bool final) {
  const float daux = static_cast<float>(config_.aux_coef) * dloss;
  const int l0 = place_.first_layer(chunk);
  for (int i = int(s.blocks.size()) - 1; i >= 0; --i) {
    const int l = l0 + i;
    if (hooks_) hooks_->before_backward(l);
    const float* x_in = i > 0 ? s.blocks[size_t(i - 1)].res2.data() : s.x.data();
    const int64_t rebuilt = recompute_block(s, i, l0);
    std::fill(dx_next_.begin(), dx_next_.end(), 0.0f);
    block_backward(dx_next_.data(), g_.blocks[l], bwd_scratch(), dx_.data(), daux, s.blocks[size_t(i)],
                      x_in, w_.blocks[l], dims_, config_, s.wgrad, ctx_);
    s.wgrad.end_block(l);
    if (!s.wgrad.deferred()) accumulated(l);
    if (ctx_.ex().sink && rebuilt > 0) ctx_.ex().sink->freed(rebuilt);
    release_activations(s, kept_elements(s.blocks[size_t(i)], l, i, int(s.blocks.size())));
    if (!s.wgrad.deferred()) finish_block(l, final);
    if (hooks_) hooks_->after_backward(l);
    std::swap(dx_, dx_next_);
  }
}

bool ShardedGPT::full_recompute(int i) const {
  return recompute_ == Recompute::kFull && (recompute_method_ == RecomputeMethod::kUniform || i < recompute_layers_);
}

int ShardedGPT::group_last(int i, int n) const {
  if (recompute_method_ == RecomputeMethod::kBlock) return i;
  return std::min((i / recompute_layers_ + 1) * recompute_layers_, n) - 1;
}

int64_t ShardedGPT::kept_elements(const BlockActs& a, int layer, int i, int n) const {
  const bool fp8 = ctx_.ex().fp8_run;
  switch (recompute_) {
    case Recompute::kNone: return a.saved_elements(fp8);
    case Recompute::kSelective:
      return selective_kept_elements(a, dims_, config_, config_.is_moe_layer(layer), recompute_modules_, fp8);
    case Recompute::kFull:
      if (!full_recompute(i)) return a.saved_elements(fp8);
      // The group's output, the next block's input; the rest of the group keeps nothing.
      return i == group_last(i, n) ? static_cast<int64_t>(a.res2.size()) : 0;
  }
  return a.saved_elements(fp8);
}

int64_t ShardedGPT::recompute_block(Slot& s, int i, int l0) {
  if (recompute_ == Recompute::kNone || (recompute_ == Recompute::kFull && !full_recompute(i))) return 0;
  const int n = int(s.blocks.size());
  BlockContext again = ctx_;
  model::Exec ex = ctx_.ex();
  ex.recompute = true;
  again.set_exec(ex);
  const bool fp8 = ctx_.ex().fp8_run;
  const auto rebuilt_of = [&](int j) { return s.blocks[size_t(j)].saved_elements(fp8) - kept_elements(s.blocks[size_t(j)], l0 + j, j, n); };
  if (recompute_ == Recompute::kSelective) {
    BlockActs& a = s.blocks[size_t(i)];
    block_recompute(a, w_.blocks[l0 + i], dims_, config_, bwd_scratch(), again, recompute_modules_);
    const int64_t rebuilt = rebuilt_of(i);
    if (ctx_.ex().sink) ctx_.ex().sink->saved(rebuilt);
    return rebuilt;
  }
  if (i != group_last(i, n)) return rebuilt_[size_t(i)];  // re-run with its group's last block
  // The whole group, from its kept input, in forward order; its aux losses were counted in forward.
  const int first = recompute_method_ == RecomputeMethod::kBlock ? i : i / recompute_layers_ * recompute_layers_;
  rebuilt_.resize(size_t(n));
  int64_t group = 0;
  for (int j = first; j <= i; ++j) {
    const float* x = j > 0 ? s.blocks[size_t(j - 1)].res2.data() : s.x.data();
    block_forward(s.blocks[size_t(j)], w_.blocks[l0 + j], x, dims_, config_, bwd_scratch(), again);
    rebuilt_[size_t(j)] = rebuilt_of(j);
    group += rebuilt_[size_t(j)];
  }
  if (ctx_.ex().sink) ctx_.ex().sink->saved(group);
  return rebuilt_[size_t(i)];
}

void ShardedGPT::embedding_backward(Slot& s) {
  vocab_parallel_embedding_backward(g_.wte, g_.wpe, bwd_scratch().full_dout.data(), dx_.data(),
                                    s.inputs.data(), v0_, Vl_, dims_, ctx_.tp);
}

void ShardedGPT::backward_input(int chunk, int mb, int buffer, float dloss, bool defer_weight,
                                bool final) {
  Slot& s = slot(chunk, mb, false);
  SHARDLAB_CHECK(s.activations, fmt::format("backward of micro-batch {} chunk {} without its forward", mb, chunk));
  const int64_t Nr = dims_.rows();
  const int C = dims_.C;
  s.wgrad.set_deferred(defer_weight);
  // Gradients are announced here (final when this is the chunk's last
  // backward, else partial) unless a weight gradient waits for a W action.
  if (place_.last(chunk)) {
    if (hooks_) hooks_->before_backward(head_id());
    head_backward(s, dloss, final);
    if (hooks_) hooks_->after_backward(head_id());
  } else {
    const float* dout = gradient_buffer(chunk, buffer);
    if (ctx_.ex().math()) std::copy_n(dout, Nr * C, dx_.data());  // a handover (sink.h)
  }
  blocks_backward(chunk, s, dloss, final);
  if (place_.first(chunk)) {
    if (hooks_) hooks_->before_backward(BlockHooks::kEmbeddings);
    embedding_backward(s);
    accumulated(BlockHooks::kEmbeddings);
    if (!defer_weight) finish_embeddings(layout_.filter().ln_f, final);
    if (hooks_) hooks_->after_backward(BlockHooks::kEmbeddings);
  } else {
    if (ctx_.ex().math()) std::copy_n(dx_.data(), Nr * C, s.dx.data());  // a handover (sink.h)
    s.unsent = true;
  }
  release_activations(s, s.elems);  // the chunk's input
  s.activations = false;
  free_if_done(s);
}

void ShardedGPT::backward_weight(int chunk, int mb, bool final) {
  Slot& s = slot(chunk, mb, false);
  SHARDLAB_CHECK(s.wgrad.deferred() && !s.activations,
                 fmt::format("weight gradient of micro-batch {} chunk {} before its input gradient", mb, chunk));
  s.wgrad.flush(ctx_.ex(), [&](int layer) {
    accumulated(layer);
    finish_block(layer, final);
  });
  if (place_.first(chunk)) finish_embeddings(layout_.filter().ln_f, final);
  s.wgrad.set_deferred(false);
  free_if_done(s);
}

void ShardedGPT::accumulated(int layer) const {
  model::OpSink* sink = ctx_.ex().sink;
  if (!sink) return;
  int64_t n = 0;
  if (layer == BlockHooks::kEmbeddings) {
    n = wte_range().size + layout_.prefix("transformer.wpe.").size;
  } else if (layer == head_id()) {
    // ln_f and the untied head, or the head's copy of the tied wte when the
    // embeddings are on another pipeline rank (else the embeddings' backward adds it once).
    n = layout_.prefix(model::final_norm_prefix(config_)).size + head_range().size +
        (layout_.filter().wpe || !config_.tied() ? 0 : wte_range().size);
  } else {
    n = layout_.block(layer).size;
  }
  sink->grads_accumulated(layer, n);
}

// Before a partial announcement nothing is reduced over TP: the SP row sums
// stay staged (zero in the gradients until final) and the replicated K/V
// ranges are left to the final reduction (data parallelism reduces their
// buckets only then: DataParallel::set_final_only).
void ShardedGPT::finish_block(int layer, bool final) {
  if (layer == head_id()) {
    if (final && ctx_.tp.sp) reduce_staged(lnf_staged_);
    announce(layout_.prefix(model::final_norm_prefix(config_)), final);
    announce(head_range(), final);
    return;
  }
  if (final && ctx_.tp.sp) reduce_staged(block_staged_[size_t(layer)]);
  for (const Range r : {block_kv_[size_t(layer)], block_qk_norm_[size_t(layer)]}) {
    if (!final || r.size == 0) continue;
    float* g = ctx_.ex().math() ? grads_.data() + r.begin : nullptr;  // a collective's data (sink.h)
    copy_to_tp_region_bwd(ctx_.tp, g, g, r.size);  // the all-reduce of replicated K/V or QK-norm gradients
  }
  announce(layout_.block(layer), final);
}

void ShardedGPT::finish_embeddings(bool tied_here, bool final) {
  if (final && ctx_.tp.sp) reduce_staged(wpe_staged_);
  // The tied wte is final here when this rank also holds the head (one
  // pipeline rank); otherwise the trainer sums the two copies first (and it
  // is never announced partial).
  if (tied_here || !config_.tied()) announce(wte_range(), final);
  announce(layout_.prefix("transformer.wpe."), final);
}

}  // namespace shardlab::parallel
