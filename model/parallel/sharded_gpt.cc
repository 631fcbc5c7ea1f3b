// ShardedGPT: construction, parameter layout, micro-batch slots and buffers,
// the whole-batch LocalModel calls. The passes are in sharded_gpt_passes.cc.
#include "model/parallel/sharded_gpt.h"

#include <algorithm>

#include <fmt/format.h>

#include "model/gpt.h"
#include "model/parallel/config_check.h"
#include "runtime/errors.h"

namespace shardlab::parallel {

using model::Token;

namespace {

StagePlacement checked(const model::GPTConfig& config, const ModelGroups& g, const ShardedOptions& o) {
  SHARDLAB_CHECK(g.tp != nullptr, "ShardedGPT needs a tensor-parallel group");
  const StagePlacement& p = o.placement;
  const int ep = g.ep ? g.ep->size() : 1, tp = g.tp->size();
  // With whole experts the EP group is drawn from tp x dp (and the capacity group is tp x dp).
  const int over = o.experts_whole ? tp : 1;
  check_parallel_shape(config,
                       {tp, o.sequence_parallel, p.pp, p.vpp, p.stage_layers, ep,
                        (g.capacity ? g.capacity->size() : ep) / over, o.experts_whole ? 1 : 0});
  return p.resolved(config);
}

Range range_of(const ShardSpec& s) { return {s.offset, s.numel}; }

}  // namespace

LayoutFilter rank_filter(const model::GPTConfig& config, const StagePlacement& p, int ep,
                         int ep_rank, bool experts_whole) {
  LayoutFilter f;
  f.experts_whole = experts_whole;
  if (ep > 1) {  // experts [r·E/ep, (r+1)·E/ep)
    const int El = config.n_expert / ep;
    f.expert_begin = ep_rank * El;
    f.expert_end = f.expert_begin + El;
  }
  f.layers.assign(size_t(config.n_layer), false);
  for (int c = 0; c < p.vpp; ++c)
    for (int l = p.first_layer(c); l < p.end_layer(c); ++l) f.layers[size_t(l)] = true;
  f.wpe = p.holds_first();
  f.ln_f = p.holds_last();
  f.wte = f.wpe || (f.ln_f && config.tied());  // untied: lm_head on the last stage instead
  return f;
}

std::vector<HookChunk> hook_chunks(const StagePlacement& p) {
  std::vector<HookChunk> chunks;
  for (int c = 0; c < p.vpp; ++c) chunks.push_back({p.first(c), p.first_layer(c), p.end_layer(c), p.last(c)});
  return chunks;
}

ShardedGPT::ShardedGPT(const model::GPTConfig& config, uint64_t seed, Device& dev,
                       const ModelGroups& groups, const ShardedOptions& options)
    : config_(config),
      place_(checked(config, groups, options)),
      tp_group_(*groups.tp),
      hooks_(options.hooks),
      recompute_(options.recompute),
      recompute_modules_(options.recompute_modules),
      recompute_method_(options.recompute_method),
      recompute_layers_(std::max(1, options.recompute_num_layers)),
      cp_(options.cp),
      cp_rank_(options.cp_rank),
      layout_(
          options.table
              ? ShardLayout(*options.table, config_, groups.tp->size(), groups.tp->rank(),
                            rank_filter(config_, place_, groups.ep ? groups.ep->size() : 1,
                                        groups.ep ? groups.ep->rank() : 0, options.experts_whole))
              : ShardLayout(
                    config_, groups.tp->size(), groups.tp->rank(),
                    rank_filter(config_, place_, groups.ep ? groups.ep->size() : 1,
                                groups.ep ? groups.ep->rank() : 0, options.experts_whole))) {
  ctx_.tp.dev = ctx_.moe.dev = &dev;
  ctx_.tp.group = ctx_.moe.tp = &tp_group_;
  ctx_.tp.sp = options.sequence_parallel;
  if (options.tp_comm_overlap && ctx_.tp.sp && tp_group_.size() > 1) {
    tp_overlap_ = std::make_unique<Stream>(&dev, StreamKind::kTpComm);
    ctx_.tp.overlap = tp_overlap_.get();
  }
  if (options.ep_comm_overlap) {
    ep_overlap_ = std::make_unique<Stream>(&dev, StreamKind::kEpComm);
    ctx_.moe.a2a_stream = ep_overlap_.get();
    bwd_scratch_ = std::make_unique<BlockScratch>();
    if (options.delay_wgrad) {
      delayed_wgrad_ = std::make_unique<WeightGrads>();
      delayed_wgrad_->set_deferred(true);
      ctx_.moe.delayed_wgrad = delayed_wgrad_.get();
    }
  }
  ctx_.dropout = config_.dropout > 0;
  scatter_gather_ = options.scatter_gather && !ctx_.tp.sp;
  ctx_.attention = options.attention;
  flash_ = options.flash;
  SHARDLAB_CHECK(cp_ == 1 || ctx_.attention, "context parallelism needs its attention core");
  ctx_.moe.phantom_zipf = options.phantom_zipf;
  experts_whole_ = options.experts_whole && tp_group_.size() > 1;
  ctx_.moe.a2a_time = &a2a_time_;
  if (config_.is_moe()) moe_step_.resize(size_t(config_.n_layer));
  if (groups.capacity) {
    capacity_group_ = *groups.capacity;
    ctx_.moe.capacity_group = &*capacity_group_;
  }
  if (groups.ep && groups.ep->size() > 1) {
    // With ep = dp the two groups have the same members: one sequence counter.
    const bool same = groups.capacity && groups.capacity->members() == groups.ep->members();
    ep_group_ = same ? *groups.capacity : *groups.ep;
    ctx_.moe.ep = &*ep_group_;
    if (groups.ep_node && groups.ep_rail) {
      ep_node_ = *groups.ep_node;
      ep_rail_ = *groups.ep_rail;
      ctx_.moe.ep_node = &*ep_node_;
      ctx_.moe.ep_rail = &*ep_rail_;
    }
  }
  Vl_ = config_.vocab_size / tp_group_.size();
  v0_ = int64_t{tp_group_.rank()} * Vl_;
  params_.assign(layout_.numel(), 0.0f);
  if (!options.no_grads) grads_.assign(layout_.numel(), 0.0f);
  if (!params_.phantom()) {
    if (options.table)
      layout_.init(*options.table, seed, params_.data());
    else
      layout_.init(model::ParamTable(config_), seed, params_.data());
  }
  SHARDLAB_CHECK(!ctx_.dropout || params_.phantom(),
                 "dropout is modeled in time only: phantom runs (`phantom`)");
  w_ = layout_.view(params_.data());
  g_ = layout_.view(grads_.data());
  pools_.resize(size_t(place_.vpp));
  block_staged_.resize(size_t(config_.n_layer));
  block_kv_.resize(size_t(config_.n_layer));
  block_qk_norm_.resize(size_t(config_.n_layer));
  for (const ShardSpec& sh : layout_.shards()) {
    // QK-norm: each TP rank normalizes its own heads with the shared weights.
    if (sh.role == model::ParamRole::kQkNorm && tp_group_.size() > 1) {
      Range& r = block_qk_norm_[size_t(sh.layer)];
      if (r.size == 0) r.begin = sh.offset;
      SHARDLAB_CHECK(r.begin + r.size == sh.offset, "q_norm and k_norm are not adjacent");
      r.size += sh.numel;
      continue;
    }
    // Llama K/V held whole by every TP rank: each computes their gradient
    // from its own query heads only, summed over TP when final.
    if (sh.role != model::ParamRole::kKvWeight || !sh.tp_replicated || tp_group_.size() == 1) continue;
    Range& r = block_kv_[size_t(sh.layer)];
    if (r.size == 0) r.begin = sh.offset;
    SHARDLAB_CHECK(r.begin + r.size == sh.offset, "k_proj and v_proj are not adjacent");
    r.size += sh.numel;
  }
  for (const std::vector<Range>* v : {&block_kv_, &block_qk_norm_})
    for (const Range& r : *v)
      if (r.size > 0) tp_summed_.push_back(r);
  if (!ctx_.tp.sp) return;
  // With SP the norm and wpe gradients are sums over this rank's rows.
  stage_.assign(layout_.numel(), 0.0f);
  const model::GPTView<float> s = layout_.view(stage_.data());
  const LayoutFilter& f = layout_.filter();
  if (f.wpe) g_.wpe = s.wpe;
  if (f.ln_f) g_.ln_f = s.ln_f;
  for (int l = 0; l < config_.n_layer; ++l) {
    if (!f.holds_layer(l)) continue;
    g_.blocks[l].ln_1 = s.blocks[l].ln_1;
    g_.blocks[l].ln_2 = s.blocks[l].ln_2;
    if (config_.is_mla()) {  // the down-projections and latent norms ran on this rank's rows
      model::MlaView<float>& m = g_.blocks[l].mla;
      const model::MlaView<float>& staged = s.blocks[l].mla;
      m.q_down = staged.q_down, m.q_norm = staged.q_norm, m.kv_down = staged.kv_down, m.kv_norm = staged.kv_norm;
    }
    if (experts_whole_ && g_.blocks[l].moe) {  // each TP rank routed its own rows
      g_.blocks[l].router = s.blocks[l].router;
      g_.blocks[l].router_bias = s.blocks[l].router_bias;
    }
  }
  for (const ShardSpec& sh : layout_.shards()) {
    if (sh.role == model::ParamRole::kPositionEmbedding) wpe_staged_.push_back(range_of(sh));
    const bool router =
        sh.role == model::ParamRole::kRouter || sh.role == model::ParamRole::kRouterBias;
    const bool mla_rows = sh.role == model::ParamRole::kMlaDown || sh.role == model::ParamRole::kMlaNorm;
    if (sh.role != model::ParamRole::kLayerNorm && !(experts_whole_ && router) && !mla_rows) continue;
    (sh.layer < 0 ? lnf_staged_ : block_staged_[size_t(sh.layer)]).push_back(range_of(sh));
  }
}

void ShardedGPT::set_micro_batch(int B, int T) {
  if (dims_.B == B && dims_.T == T) return;
  for (const Pool& pool : pools_)
    for (const Slot& s : pool.slots) SHARDLAB_CHECK(!s.busy(), "micro-batch shape changed with activations in flight");
  model::check_batch(config_, nullptr, nullptr, B, T);
  const int tp = tp_group_.size();
  if (ctx_.tp.sp && T % tp != 0)
    throw ConfigError(fmt::format("sequence length {} must be divisible by `tp` {} with `sp`", T, tp));
  SHARDLAB_CHECK(cp_ == 1 || T % 2 == 0, "context parallelism: two chunks of every sequence");
  const model::Dims unsharded = model::dims_of(config_, B, T);
  dims_ = ShardDims{unsharded, tp, ctx_.tp.sp, ep_group_ ? ep_group_->size() : 1};
  dims_.ep_nodes = ctx_.moe.node_dispatch() ? ep_rail_->size() : 0;
  dims_.experts_whole = experts_whole_;
  dims_.kv = config_.kv_heads();
  dims_.rope = config_.is_llama();
  dims_.cp = cp_;
  dims_.cp_rank = cp_rank_;
  dims_.flash = flash_;
  const int64_t N = dims_.N(), Nr = dims_.rows(), C = dims_.C;
  for (Pool& pool : pools_) pool = Pool{};
  scratch_.resize(dims_, config_);
  if (bwd_scratch_) bwd_scratch_->resize(dims_, config_);
  const bool head = layout_.filter().ln_f;
  // Real even in a phantom run: the loss statistics go through collectives
  // at offsets inside the buffer (3N floats).
  ce_stats_.assign_real(head ? 3 * N : 0, 0.0f);
  dlogits_.assign(head ? N * Vl_ : 0, 0.0f);
  for (auto* b : {&dlnf_, &dx_, &dx_next_}) b->assign(Nr * C, 0.0f);
}

void ShardedGPT::size_slot(int chunk, Slot& s) const {
  const int64_t N = dims_.N(), Nr = dims_.rows(), C = dims_.C;
  if (place_.first(chunk)) s.inputs.assign(N, 0);
  s.x.assign(Nr * C, 0.0f);
  if (!place_.first(chunk)) s.dx.assign(Nr * C, 0.0f);
  const int l0 = place_.first_layer(chunk), l1 = place_.end_layer(chunk);
  s.blocks.resize(size_t(l1 - l0));
  for (int l = l0; l < l1; ++l) {
    BlockActs& a = s.blocks[size_t(l - l0)];
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

ShardedGPT::Slot* ShardedGPT::find(int chunk, int mb) {
  for (Slot& s : pools_[size_t(chunk)].slots)
    if (s.mb == mb) return &s;
  return nullptr;
}

ShardedGPT::Slot& ShardedGPT::slot(int chunk, int mb, bool create) {
  SHARDLAB_CHECK(dims_.B > 0, "set_micro_batch() before the first forward");
  if (Slot* s = find(chunk, mb)) return *s;
  SHARDLAB_CHECK(create, fmt::format("no activations of micro-batch {} chunk {}", mb, chunk));
  auto& slots = pools_[size_t(chunk)].slots;
  auto free = std::find_if(slots.begin(), slots.end(), [](const Slot& s) { return s.mb < 0; });
  if (free == slots.end()) {
    slots.emplace_back();
    size_slot(chunk, slots.back());
    free = slots.end() - 1;
  }
  free->mb = mb;
  free->elems = 0;
  return *free;
}

void ShardedGPT::free_if_done(Slot& s) {
  if (!s.busy()) s.mb = -1;
}

float* ShardedGPT::receive_buffer(std::vector<Buf<float>>& pool, int buffer) {
  SHARDLAB_CHECK(dims_.B > 0 && buffer >= 0, "set_micro_batch() before the first receive");
  if (pool.size() <= size_t(buffer)) pool.resize(size_t(buffer) + 1);
  Buf<float>& b = pool[size_t(buffer)];
  if (b.empty()) b.assign(boundary_elements(), 0.0f);
  return b.data();
}

int ShardedGPT::boundary_parts() const {
  const int tp = tp_group_.size();
  return scatter_gather_ && tp > 1 && boundary_elements() % tp == 0 ? tp : 1;
}

void ShardedGPT::gather_boundary(float* buffer) {
  const int parts = boundary_parts();
  if (parts == 1) return;
  const int64_t n = boundary_elements() / parts;
  std::vector<float> mine;  // the received part, gathered back into the whole buffer
  if (buffer) mine.assign(buffer + boundary_part() * n, buffer + (boundary_part() + 1) * n);
  gather_from_sequence_parallel_fwd(ctx_.tp, buffer ? mine.data() : nullptr, buffer, n);
}

float* ShardedGPT::activation_buffer(int chunk, int buffer) {
  SHARDLAB_CHECK(!place_.first(chunk), "the first stage embeds its input");
  return receive_buffer(pools_[size_t(chunk)].act_in, buffer);
}

float* ShardedGPT::gradient_buffer(int chunk, int buffer) {
  SHARDLAB_CHECK(!place_.last(chunk), "the last stage starts backward from the loss");
  return receive_buffer(pools_[size_t(chunk)].grad_in, buffer);
}

const float* ShardedGPT::output(int chunk, int mb) {
  Slot* s = find(chunk, mb);
  SHARDLAB_CHECK(s && s->activations, fmt::format("no output of micro-batch {} chunk {}", mb, chunk));
  return s->blocks.empty() ? s->x.data() : s->blocks.back().res2.data();
}

const float* ShardedGPT::input_grad(int chunk, int mb) {
  Slot* s = find(chunk, mb);
  SHARDLAB_CHECK(s && s->unsent, fmt::format("no input gradient of micro-batch {} chunk {}", mb, chunk));
  return s->dx.data();
}

void ShardedGPT::release_input_grad(int chunk, int mb) {
  Slot& s = slot(chunk, mb, false);
  s.unsent = false;
  free_if_done(s);
}

float ShardedGPT::forward(const Token* inputs, const Token* targets, int B, int T) {
  SHARDLAB_CHECK(place_.stages() == 1, "a whole-batch forward needs every stage on this rank");
  model::check_batch(config_, inputs, targets, B, T);
  set_micro_batch(B, T);
  if (Slot* s = find(0, 0); s && s->activations) {  // a forward that had no backward
    if (ctx_.ex().sink && s->elems > 0) ctx_.ex().sink->freed(s->elems);
    s->activations = false;
    free_if_done(*s);
  }
  reset_losses();
  forward(0, 0, 0, {inputs, targets});
  if (!targets) {  // no backward will follow
    Slot& s = slot(0, 0, false);
    if (ctx_.ex().sink) ctx_.ex().sink->freed(s.elems);
    s.activations = false;
    free_if_done(s);
    return 0;
  }
  return last_ce_ + static_cast<float>(config_.aux_coef) * last_aux_;
}

void ShardedGPT::backward() { backward_input(0, 0, 0, 1.0f, false, true); }

std::span<const float> ShardedGPT::local_logits() const {
  const auto& slots = pools_[0].slots;
  SHARDLAB_CHECK(place_.stages() == 1 && !slots.empty(), "local_logits() needs a whole-batch forward");
  return {slots.front().logits.data(), slots.front().logits.size()};
}

const MoeStats* ShardedGPT::moe_stats(int layer) const {
  const auto& slots = pools_[0].slots;
  if (place_.stages() != 1 || slots.empty() || !config_.is_moe_layer(layer)) return nullptr;
  return &slots.front().blocks[size_t(layer)].moe.stats;
}

void ShardedGPT::zero_grad() {
  std::fill(grads_.begin(), grads_.end(), 0.0f);
  ctx_.ex().op("zero_grad", {0, static_cast<double>(grads_.size()) * ctx_.ex().elem});
}

void sp_reduce_staged(const TpContext& c, const std::vector<Range>& ranges, float* stage,
                      float* grads, Buf<float>& pack) {
  int64_t total = 0;
  for (const Range& r : ranges) total += r.size;
  if (total == 0) return;
  if (!c.ex.math()) {  // phantom: the same all-reduce and add, no data (math() picks a collective's data: sink.h)
    copy_to_tp_region_bwd(c, nullptr, nullptr, total);
    c.ex.op("sp.grad_reduce.add", model::residual_forward_cost(total, c.ex.elem));
    return;
  }
  pack.resize(static_cast<size_t>(total));
  float* p = pack.data();
  for (const Range& r : ranges) p = std::copy_n(stage + r.begin, r.size, p);
  copy_to_tp_region_bwd(c, pack.data(), pack.data(), total);
  p = pack.data();
  for (const Range& r : ranges) {
    float* g = grads + r.begin;
    for (int64_t i = 0; i < r.size; ++i) g[i] += p[i];
    std::fill_n(stage + r.begin, r.size, 0.0f);
    p += r.size;
  }
  c.ex.op("sp.grad_reduce.add", model::residual_forward_cost(total, c.ex.elem));
}

void ShardedGPT::reduce_staged(const std::vector<Range>& ranges) {
  sp_reduce_staged(ctx_.tp, ranges, stage_.data(), grads_.data(), pack_);
}

}  // namespace shardlab::parallel
