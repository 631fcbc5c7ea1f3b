// Reference single-device GPT (nanoGPT math) on plain host buffers.
//
// Parameters and gradients each live in one flat buffer laid out by the
// ParamTable, with per-tensor views (llm.c style). forward() keeps every
// activation for backward(); backward() is written by hand, layer by layer,
// mirroring forward, and ACCUMULATES into grads (call zero_grad() first).
//
//   x      = wte[idx] + wpe[0..T-1]         (llama: wte[idx]; RoPE in attention)
//   x      = block_l(x) for each layer (block_forward in layers.h)
//   logits = ln_f(x) · wteᵀ                 (tied head, no bias; untied: lm_head)
//   loss   = mean CE over B·T + aux_coef · Σ_moe layers aux
//
// Size letters: B batch, T time (<= block_size), N = B*T, C n_embd, V vocab.
// Not thread-safe: one instance per device thread.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "model/config.h"
#include "model/layers.h"
#include "model/params.h"
#include "model/sink.h"

namespace shardlab::model {

// Checks a batch against the model: B >= 1, 1 <= T <= block_size, every token
// (of inputs and, if not null, targets) below the vocabulary. ConfigError otherwise.
void check_batch(const GPTConfig& config, const Token* inputs, const Token* targets, int B, int T);

template <typename Real>
class GPT {
 public:
  // Validates config and initialises the parameters from `seed`.
  GPT(const GPTConfig& config, uint64_t seed);
  GPT(const GPT&) = delete;
  GPT& operator=(const GPT&) = delete;

  const GPTConfig& config() const { return config_; }
  const ParamTable& table() const { return table_; }
  std::span<Real> params() { return params_; }
  std::span<const Real> params() const { return params_; }
  std::span<Real> grads() { return grads_; }
  std::span<const Real> grads() const { return grads_; }
  // One tensor of params / grads by nanoGPT name (throws ConfigError if unknown).
  std::span<Real> param(std::string_view name);
  std::span<Real> grad(std::string_view name);
  const GPTView<Real>& weights() const { return weights_; }
  const GPTView<Real>& weight_grads() const { return weight_grads_; }

  // inputs, targets: (B,T) tokens < vocab, T <= block_size. Returns the loss
  // (CE + aux_coef·Σ aux). targets may be null: logits only, returns 0.
  // Throws ConfigError for a bad B, T or token.
  Real forward(const Token* inputs, const Token* targets, int B, int T);
  void zero_grad();
  // Frees the activation and backward scratch buffers (the next forward
  // sizes them again): a run's end needs them no more, and its final
  // parameters' copy (train/publish.cc) then takes their place, not more.
  void free_buffers();
  // Gradient of the last forward's loss (which needs targets), scaled by dloss.
  void backward(Real dloss = Real(1));

  // Where kernels report their cost and activations their lifetime (null: math only).
  void set_sink(OpSink* sink) { ex_ = Exec::with(sink); }

  Real ce_loss() const { return ce_loss_; }
  Real aux_loss() const { return aux_loss_; }  // Σ over MoE layers, before aux_coef
  // (B,T,V) of the last forward, until backward() (which writes dlogits over them).
  std::span<const Real> logits() const { return {logits_.data(), logits_n_}; }
  const BlockActs<Real>& block_acts(int layer) const { return blocks_[layer]; }

 private:
  void resize_activations(int B, int T);
  // Frees the accounted activations of a forward that will have no backward.
  void release_activations();
  void saved(int64_t elements) const {
    if (ex_.sink) ex_.sink->saved(elements);
  }
  void freed(int64_t elements) const {
    if (ex_.sink) ex_.sink->freed(elements);
  }
  void grads_ready(Range r) const {
    if (ex_.sink && r.size > 0) ex_.sink->grads_ready(r.begin, r.size);
  }

  GPTConfig config_;
  ParamTable table_;
  Exec ex_;
  Buffer<Real> params_;  // (P)
  Buffer<Real> grads_;   // (P)
  GPTView<Real> weights_;
  GPTView<Real> weight_grads_;
  std::vector<Range> block_ranges_;     // (n_layer)
  Range wte_range_, wpe_range_, lnf_range_, head_range_;

  // Activations of the last forward.
  Dims dims_;
  Buffer<Token> inputs_, targets_;          // (N)
  Buffer<Real> encoded_;                    // (N,C)
  std::vector<BlockActs<Real>> blocks_;     // (n_layer)
  Buffer<Real> lnf_mean_, lnf_rstd_;        // (N), (N); ln_f's output lives in dx_ (gpt.cc)
  Buffer<Real> logits_;                     // (N,V); dlogits in backward (probs recomputed)
  Buffer<Real> losses_;                     // (N)
  size_t logits_n_ = 0;
  std::vector<int64_t> block_elems_;   // (n_layer) saved activation elements per block
  int64_t head_elems_ = 0;             // lnf + logits + probs + losses
  bool acts_live_ = false;             // a forward's activations are accounted
  bool have_targets_ = false;
  Real ce_loss_ = 0;
  Real aux_loss_ = 0;

  // Backward scratch.
  BlockScratch<Real> scratch_;
  Buffer<Real> dlnf_;          // (N,C)
  Buffer<Real> dx_, dx_next_;  // (N,C) gradient of the residual stream
};

extern template class GPT<float>;
extern template class GPT<double>;

}  // namespace shardlab::model
