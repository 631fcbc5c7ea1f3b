// One scheduler over its requests and KV blocks (scheduler.h): a replica's,
// or one of its virtual engines'. Internal to model/serve (scheduler.cc
// defines it, replica_scheduler.cc composes the engines of a replica).
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "model/serve/kv_blocks.h"
#include "model/serve/scheduler.h"

namespace shardlab::serve::detail {

struct Seq {
  const Request* r = nullptr;
  int64_t cached = 0;   // tokens whose K and V are in the cache
  int64_t target = 0;   // tokens the (re)prefill must put there
  int generated = 0;
  int preemptions = 0;
  double first_token_s = -1, finish_s = -1;
  std::vector<model::Token> ids;  // the prompt, then every token produced; empty: lengths only
  std::vector<uint64_t> hashes;   // prefix caching: the names of the prompt's full blocks
  int64_t named = 0;              // of its blocks, those named or shared (prefix caching)
  int cached_tokens = -1;         // found in the prefix cache at the first admission
  bool handed = false;            // to admit with its prompt's K and V handed over (not since preempted)
  bool prefilled() const { return cached >= target; }
  int64_t final_tokens() const { return r->prompt_len + r->output_len - 1; }
};

// One scheduler over its requests and KV blocks: a replica's, or one of its
// virtual engines' (engine `offset` of `stride`). The executor sees sequence
// and block ids unique over the engines: local id i is i · stride + offset.
// ConfigError when `r` can never run on an engine of options `o`.
void check_fits(const Request& r, const SchedulerOptions& o);

class EngineScheduler {
 public:
  EngineScheduler(const SchedulerOptions& o, StepExecutor& ex, int offset = 0, int stride = 1)
      : o_(o), ex_(ex), kv_(o.kv_blocks, o.kv_block), offset_(offset), stride_(stride) {}
  // The next request, in arrival order (checked to fit).
  void add(const Request& r) {
    const Request& q = requests_.emplace_back(r);
    seqs_.push_back({&q, 0, q.prompt_len, 0, 0, -1, -1, q.prompt});
    if (q.handed) {  // its prompt's K and V and its first token come from a prefill replica
      Seq& h = seqs_.back();
      h.handed = true;
      h.generated = 1;
      h.first_token_s = q.arrival_s;
      if (!h.ids.empty()) h.ids.push_back(q.first);
    }
    if (o_.prefix_caching) seqs_.back().hashes = block_hashes(content_keys(q), o_.kv_block);
    check_fits(q, o_);
  }
  bool finished() const { return done_ == seqs_.size(); }
  int unfinished() const { return int(seqs_.size() - done_); }
  // When its next step starts: now, or the next arrival when idle.
  double ready() const {
    return running_.empty() && waiting_.empty() && next_ < seqs_.size() ? std::max(now_, seqs_[next_].r->arrival_s)
                                                                         : now_;
  }
  void step(int replica);
  ReplicaResult result(int replica);
  const KvBlocks& kv() const { return kv_; }
  const UsageSample& usage_back() const { return out_.usage.back(); }
  int queued() const { return int(waiting_.size()); }
  int running() const { return int(running_.size()); }

 private:
  void arrive();
  std::vector<BatchEntry> continuous_batch();
  std::vector<BatchEntry> static_batch();
  void admit(std::vector<BatchEntry>& batch, int64_t& tokens, bool reserve_all);
  void preempt(int s);
  int64_t cached_blocks(const Seq& q) const;
  bool reserve(int s, int64_t hit, int64_t tokens);
  void name_blocks(int s);
  BatchEntry entry(int s, int64_t n) const;
  void book(const std::vector<BatchEntry>& batch, const StepOutcome& step);
  int global(int s) const { return s * stride_ + offset_; }
  int local(int g) const { return (g - offset_) / stride_; }

  const SchedulerOptions& o_;
  StepExecutor& ex_;
  KvBlocks kv_;
  std::deque<Request> requests_;  // added, in arrival order (Seq::r points here)
  std::vector<uint64_t> keys_;  // a block's content keys, while naming it
  std::vector<Seq> seqs_;      // by request index, the KV cache's sequence id
  std::deque<int> waiting_;    // arrived, not running (preempted ones in front)
  std::vector<int> running_;   // in admission order
  size_t next_ = 0;            // the next request to arrive
  double now_ = 0;
  size_t done_ = 0;            // requests finished
  int offset_, stride_;
  ReplicaResult out_;
};

}  // namespace shardlab::serve::detail
