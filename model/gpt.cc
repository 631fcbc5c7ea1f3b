#include "model/gpt.h"

#include <algorithm>
#include <string>

#include "model/host_split.h"
#include "runtime/errors.h"

namespace shardlab::model {

template <typename Real>
GPT<Real>::GPT(const GPTConfig& config, uint64_t seed) : config_(config), table_(config) {
  params_.assign(table_.numel(), Real(0));
  grads_.assign(table_.numel(), Real(0));
  table_.init_all(seed, params_.data());
  weights_ = make_view(table_, params_.data());
  weight_grads_ = make_view(table_, grads_.data());
  for (int l = 0; l < config_.n_layer; ++l)
    block_ranges_.push_back(prefix_range(table_.specs(), block_prefix(config_, l)));
  wte_range_ = prefix_range(table_.specs(), embedding_name(config_));
  wpe_range_ = prefix_range(table_.specs(), "transformer.wpe.");  // empty for llama
  lnf_range_ = prefix_range(table_.specs(), final_norm_prefix(config_));
  head_range_ = prefix_range(table_.specs(), kLmHeadName);  // empty when tied
}

template <typename Real>
std::span<Real> GPT<Real>::param(std::string_view name) {
  const ParamSpec& s = table_.at(name);
  return {params_.data() + s.offset, static_cast<size_t>(s.numel)};
}

template <typename Real>
std::span<Real> GPT<Real>::grad(std::string_view name) {
  const ParamSpec& s = table_.at(name);
  return {grads_.data() + s.offset, static_cast<size_t>(s.numel)};
}

void check_batch(const GPTConfig& config, const Token* inputs, const Token* targets, int B, int T) {
  if (B < 1) throw ConfigError("batch must be at least 1 (got " + std::to_string(B) + ")");
  if (T < 1 || T > config.block_size) {
    throw ConfigError("sequence length " + std::to_string(T) + " must be in 1.." +
                      std::to_string(config.block_size) + " (the position table, `block_size`)");
  }
  const int64_t N = static_cast<int64_t>(B) * T;
  for (const Token* tokens : {inputs, targets}) {
    if (tokens == nullptr) continue;
    for (int64_t i = 0; i < N; ++i) {
      if (tokens[i] < 0 || tokens[i] >= config.vocab_size) {
        throw ConfigError("token " + std::to_string(tokens[i]) + " at position " +
                          std::to_string(i) + " is outside the vocabulary (`vocab_size` " +
                          std::to_string(config.vocab_size) + ")");
      }
    }
  }
}

template <typename Real>
void GPT<Real>::resize_activations(int B, int T) {
  if (dims_.B == B && dims_.T == T) return;
  dims_ = dims_of(config_, B, T);
  const int64_t N = dims_.N(), C = dims_.C, V = config_.vocab_size;
  encoded_.assign(N * C, 0);
  blocks_.resize(config_.n_layer);
  for (int l = 0; l < config_.n_layer; ++l) {
    blocks_[l].resize(dims_, config_, config_.is_moe_layer(l));
  }
  lnf_mean_.assign(N, 0);
  lnf_rstd_.assign(N, 0);
  logits_.assign(N * V, 0);
  losses_.assign(N, 0);
  scratch_.resize(dims_, config_);
  block_elems_.assign(config_.n_layer, 0);
  for (int l = 0; l < config_.n_layer; ++l) block_elems_[l] = blocks_[l].modeled;
  head_elems_ = N * C + 2 * N + 2 * N * V + N;  // the modeled program saves the probs too
  dlnf_.assign(N * C, 0);
  dx_.assign(N * C, 0);
  dx_next_.assign(N * C, 0);
}

template <typename Real>
Real GPT<Real>::forward(const Token* inputs, const Token* targets, int B, int T) {
  check_batch(config_, inputs, targets, B, T);
  if (acts_live_) release_activations();  // a forward that had no backward
  resize_activations(B, T);
  acts_live_ = true;
  const int64_t N = dims_.N();
  const int C = dims_.C, V = config_.vocab_size;
  inputs_.assign(inputs, inputs + N);
  have_targets_ = targets != nullptr;
  if (have_targets_) targets_.assign(targets, targets + N);

  embedding_forward(ex_, "embedding.fwd", encoded_.data(), inputs, weights_.wte, weights_.wpe, B, T,
                    C);
  saved(N * C);
  const Real* x = encoded_.data();
  aux_loss_ = 0;
  for (int l = 0; l < config_.n_layer; ++l) {
    aux_loss_ += block_forward(blocks_[l], scratch_, weights_.blocks[l], x, dims_, config_, ex_);
    saved(block_elems_[l]);
    x = blocks_[l].res2.data();
  }
  Real* lnf = dx_.data();  // not kept: backward recomputes it (model/layers.h, BlockActs)
  norm_forward(lnf, lnf_mean_.data(), lnf_rstd_.data(), x, weights_.ln_f, N, C, config_, "ln_f.fwd",
               ex_);
  linear_forward(ex_, "lm_head.fwd", logits_.data(), lnf, weights_.head(), N, C, V);
  saved(head_elems_);
  logits_n_ = static_cast<size_t>(N * V);
  if (!have_targets_) {
    release_activations();
    return ce_loss_ = 0;
  }
  // The probs are not kept: backward recomputes them over the logits.
  ce_loss_ = crossentropy_forward(ex_, "cross_entropy.fwd", static_cast<Real*>(nullptr), losses_.data(),
                                  logits_.data(), targets, N, V);
  return ce_loss_ + static_cast<Real>(config_.aux_coef) * aux_loss_;
}

template <typename Real>
void GPT<Real>::release_activations() {
  int64_t n = dims_.N() * dims_.C + head_elems_;
  for (int64_t e : block_elems_) n += e;
  freed(n);
  acts_live_ = false;
}

template <typename Real>
void GPT<Real>::free_buffers() {
  if (acts_live_) release_activations();
  dims_ = Dims{};  // resize_activations allocates them again
  encoded_ = {};
  blocks_ = {};
  lnf_mean_ = {};
  lnf_rstd_ = {};
  logits_ = {};
  losses_ = {};
  logits_n_ = 0;
  scratch_ = {};
  dlnf_ = {};
  dx_ = {};
  dx_next_ = {};
}

template <typename Real>
void GPT<Real>::zero_grad() {
  fill_split(grads_.data(), static_cast<int64_t>(grads_.size()), Real(0));
  ex_.op("zero_grad", {0, static_cast<double>(grads_.size()) * ex_.elem});
}

template <typename Real>
void GPT<Real>::backward(Real dloss) {
  SHARDLAB_CHECK(have_targets_, "backward() needs a forward() with targets");
  const int64_t N = dims_.N();
  const int C = dims_.C, V = config_.vocab_size;
  const GPTView<Real>& p = weights_;
  const GPTView<Real>& g = weight_grads_;
  // loss = mean CE(logits)
  saved(N * V);  // dlogits, alive until the head's backward is done (modeled; here over the logits)
  Real* dlogits = logits_.data();
  crossentropy_backward_in_place(ex_, "cross_entropy.bwd", dlogits, targets_.data(), dloss, N, V);
  // logits = lnf · wteᵀ, lnf = ln_f(x_L) recomputed into dx_ as the forward computed it (host only)
  const Real* x_last = config_.n_layer > 0 ? blocks_.back().res2.data() : encoded_.data();
  Exec host = ex_;
  host.sink = nullptr;
  norm_forward(dx_.data(), scratch_.ln_mean.data(), scratch_.ln_rstd.data(), x_last, weights_.ln_f, N, C, config_,
               "ln_f.fwd", host);
  fill_split(dlnf_.data(), N * C, Real(0));
  linear_backward(ex_, "lm_head.bwd", false, dlnf_.data(), g.head(), static_cast<Real*>(nullptr), dlogits,
                  dx_.data(), p.head(), N, C, V);
  freed(N * V);
  fill_split(dx_.data(), N * C, Real(0));
  norm_backward(dx_.data(), g.ln_f, dlnf_.data(), x_last, p.ln_f, lnf_mean_.data(), lnf_rstd_.data(), N, C,
                config_, "ln_f.bwd", ex_);
  freed(head_elems_);
  grads_ready(lnf_range_);
  grads_ready(head_range_);
  // x_{l+1} = block_l(x_l)
  const Real daux = static_cast<Real>(config_.aux_coef) * dloss;
  for (int l = config_.n_layer - 1; l >= 0; --l) {
    const Real* x_in = l > 0 ? blocks_[l - 1].res2.data() : encoded_.data();
    fill_split(dx_next_.data(), N * C, Real(0));
    block_backward(dx_next_.data(), g.blocks[l], scratch_, dx_.data(), daux, blocks_[l], x_in,
                   p.blocks[l], dims_, config_, ex_);
    freed(block_elems_[l]);
    grads_ready(block_ranges_[l]);
    std::swap(dx_, dx_next_);
  }
  // x_0 = wte[idx] + wpe
  embedding_backward(ex_, "embedding.bwd", g.wte, g.wpe, dx_.data(), inputs_.data(), dims_.B,
                     dims_.T, C);
  freed(N * C);
  grads_ready(wte_range_);
  grads_ready(wpe_range_);
  acts_live_ = false;
}

template class GPT<float>;
template class GPT<double>;

}  // namespace shardlab::model
