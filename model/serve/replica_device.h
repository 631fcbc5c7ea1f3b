// A serving replica's device (cluster_step.h): its inference engine, the
// scheduler's sequences in its cache, the prefix cache's kept rows and a
// disaggregated run's handed K and V. Internal to model/serve.
//
// Thread safety: one instance per device thread; the HandoffStore is shared.
#pragma once

#include <algorithm>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

#include "model/infer/infer_device.h"
#include "model/serve/cluster_step.h"
#include "runtime/errors.h"

namespace shardlab::serve::detail {

// What the scheduler asked between steps, in its order: a sequence left
// the cache, a named block's rows to keep, a kept block to drop, a
// sequence's K and V handed on with request `block` (disaggregated).
struct CacheOp {
  enum class Kind { kRelease, kCache, kEvict, kHandOff } kind = Kind::kRelease;
  int seq = 0;
  int64_t first = 0;
  int tokens = 0;
  int32_t block = 0;
};

struct DeviceStep {
  Time begin = 0, end = 0;
  std::vector<float> tokens;  // of the sampling entries (zeros in a phantom run)
  std::vector<int> counts;    // speculating: tokens of each sampling entry
};

// One device of the replica: its engine (infer::InferDevice), and the
// scheduler's sequences in its cache (scheduler id -> cache id). `values`:
// the weights are loaded or initialised (false in a phantom run).
class ReplicaDevice {
 public:
  ReplicaDevice(Device& dev, const infer::InferPlan& plan, const infer::InferPlan* draft_plan, const ReplicaShape& s,
                bool values)
      : dev_(dev), s_(s), d_(dev, plan, s.model, s.seed, values ? s.init : nullptr), sampler_(s.sampling) {
    if (draft_plan) spec_ = std::make_unique<Speculator>(dev, *draft_plan, *s.speculative, values, s.sampling);
  }

  void apply(const CacheOp& op) {
    using Kind = CacheOp::Kind;
    if (op.kind == Kind::kEvict) {
      kept_.erase(op.block);
      return;
    }
    const auto it = ids_.find(op.seq);
    if (it == ids_.end()) return;
    infer::KvCache& cache = d_.engine().cache();
    if (op.kind == Kind::kRelease) {
      if (spec_) spec_->release(op.seq);
      cache.release(it->second);
      ids_.erase(it);
    } else if (op.kind == Kind::kHandOff) {
      if (cache.keys(it->second, 0) == nullptr) return;  // shapes only: nothing to carry
      const int n = cache.length(it->second);
      std::vector<float> rows(size_t(cache.shape().layers * n * cache.shape().token_elements()));
      copy_rows(cache, it->second, 0, n, rows.data(), true);
      std::lock_guard<std::mutex> g(s_.handoffs->m);
      s_.handoffs->rows[{dev_.rank(), op.block}] = std::move(rows);
    } else if (cache.keys(it->second, 0) != nullptr) {  // values: keep a copy of the block's rows
      std::vector<float>& rows = kept_[op.block];
      rows.resize(size_t(cache.shape().layers * op.tokens * cache.shape().token_elements()));
      copy_rows(cache, it->second, op.first, op.tokens, rows.data(), true);
    }
  }

  // The step starts at `start` (the scheduler's clock) or when this device
  // is free, whichever is later. Without the entries' token ids (shapes
  // only, or a probe) the new tokens are 0.
  DeviceStep step(std::span<const BatchEntry> batch, Time start) {
    dev_.compute().wait({start});
    dev_.comm().wait({start});
    infer::KvCache& cache = d_.engine().cache();
    std::vector<infer::SeqInput> inputs;
    std::vector<bool> samples;
    std::vector<infer::DrawKey> keys;
    std::vector<int> ids;
    const std::vector<std::vector<model::Token>> proposed = spec_ ? spec_->propose(batch) : std::vector<std::vector<model::Token>>{};
    for (const BatchEntry& e : batch) {
      if (e.samples) keys.push_back({s_.sampling.seed + uint64_t(e.request), uint64_t(e.draw)});
      auto it = ids_.find(e.seq);
      if (it == ids_.end()) {
        it = ids_.emplace(e.seq, cache.add_sequence(s_.model.block_size)).first;
        e.handed ? take_handed(it->second, e) : adopt(it->second, e);
      }
      SHARDLAB_CHECK(cache.length(it->second) == e.context,
                     fmt::format("serving: sequence {} has {} cached tokens, the scheduler says {}", e.seq,
                                 cache.length(it->second), e.context));
      SHARDLAB_CHECK(e.tokens.empty() || e.tokens.size() == size_t(e.new_tokens - e.draft),
                     "serving: token ids per new token");
      inputs.push_back({it->second, e.tokens.empty() ? std::vector<model::Token>(size_t(e.new_tokens - e.draft), 0) : e.tokens,
                        e.draft > 0});
      if (e.draft > 0) {  // the last token, then the proposals to verify
        std::vector<model::Token>& t = inputs.back().tokens;
        t.insert(t.end(), proposed[ids.size()].begin(), proposed[ids.size()].end());
      }
      ids.push_back(it->second);
      samples.push_back(e.samples);
    }
    DeviceStep out{dev_.compute().now(), 0, {}, {}};
    const infer::StepOutput o = d_.engine().step(inputs);
    if (spec_) {
      Speculator::Verified v = spec_->verify(d_, o, batch, proposed, ids);
      out.tokens = std::move(v.tokens);
      out.counts = std::move(v.counts);
    } else {
      out.tokens = d_.choose(o, samples, sampler_, keys);
      d_.share(out.tokens, s_.virtual_engines == 1);
    }
    out.end = dev_.compute().now();
    return out;
  }

  // A sequence admitted on cached blocks starts with their rows.
  void adopt(int id, const BatchEntry& e) {
    infer::KvCache& cache = d_.engine().cache();
    const int block = e.prefix_blocks.empty() ? 0 : int(e.context / int64_t(e.prefix_blocks.size()));
    for (const int32_t b : e.prefix_blocks) {
      const int first = cache.adopt(id, block);
      if (cache.keys(id, 0) == nullptr) continue;  // shapes only
      const auto kept = kept_.find(b);
      SHARDLAB_CHECK(kept != kept_.end(), fmt::format("serving: block {} is not in the prefix cache", b));
      copy_rows(cache, id, first, block, kept->second.data(), false);
    }
  }

  // A sequence handed from a prefill replica starts with the K and V it
  // was handed (held here, charged to this device).
  void take_handed(int id, const BatchEntry& e) {
    infer::KvCache& cache = d_.engine().cache();
    cache.append(id, int(e.context));
    if (cache.keys(id, 0) == nullptr) return;  // shapes only
    std::vector<float> rows;
    {
      std::lock_guard<std::mutex> g(s_.handoffs->m);
      const auto it = s_.handoffs->rows.find({dev_.rank(), e.request});
      SHARDLAB_CHECK(it != s_.handoffs->rows.end(), fmt::format("serving: request {}'s K and V were not handed", e.request));
      rows = std::move(it->second);
      s_.handoffs->rows.erase(it);
    }
    SHARDLAB_CHECK(rows.size() == size_t(cache.shape().layers * e.context * cache.shape().token_elements()),
                   "serving: the handed K and V are not the sequence's");
    copy_rows(cache, id, 0, int(e.context), rows.data(), false);
  }

  // Rows [first, first + n) of every local layer's K and V (MLA: latents)
  // of `id`, to (`out`) or from `rows`, laid out (layer, plane, n, Cl).
  static void copy_rows(infer::KvCache& cache, int id, int64_t first, int n, float* rows, bool out) {
    const int64_t row = cache.shape().row(), span = n * row;
    const int planes = cache.shape().planes;
    for (int l = 0; l < cache.shape().layers; ++l)
      for (int kv = 0; kv < planes; ++kv) {
        float* at = cache.plane(id, l, kv) + first * row;
        float* kept = rows + (planes * l + kv) * span;
        out ? std::copy(at, at + span, kept) : std::copy(kept, kept + span, at);
      }
  }

  // The target's and the draft's K and V of a token.
  double kv_bytes_per_token() {
    double b = 0;
    for (const infer::KvCache* c : {&d_.engine().cache(), spec_ ? &spec_->cache() : nullptr})
      if (c && c->tokens() > 0) b += double(c->bytes()) / double(c->tokens());
    return b;
  }

 private:
  Device& dev_;
  const ReplicaShape& s_;
  infer::InferDevice d_;
  infer::Sampler sampler_;  // draws by request (ReplicaShape::sampling)
  std::unordered_map<int, int> ids_;
  std::unordered_map<int32_t, std::vector<float>> kept_;  // named blocks' rows (prefix caching, values)
  std::unique_ptr<Speculator> spec_;                      // the draft model, when speculating
};

}  // namespace shardlab::serve::detail
