#include "model/serve/scheduler.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <memory>
#include <numeric>

#include <fmt/format.h>

#include "model/serve/kv_blocks.h"
#include "runtime/errors.h"

namespace shardlab::serve {

Batching parse_batching(const std::string& text) {
  if (text == "static") return Batching::kStatic;
  if (text == "continuous") return Batching::kContinuous;
  throw ConfigError(fmt::format("`batching` {}: expected static or continuous", text));
}

namespace {

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
  bool prefilled() const { return cached >= target; }
  int64_t final_tokens() const { return r->prompt_len + r->output_len - 1; }
};

// One scheduler over its requests and KV blocks: a replica's, or one of its
// virtual engines' (engine `offset` of `stride`). The executor sees sequence
// and block ids unique over the engines: local id i is i · stride + offset.
class Replica {
 public:
  Replica(const std::vector<Request>& requests, const SchedulerOptions& o, StepExecutor& ex, int offset = 0,
          int stride = 1)
      : o_(o), ex_(ex), kv_(o.kv_blocks, o.kv_block), offset_(offset), stride_(stride) {
    seqs_.resize(requests.size());
    for (size_t i = 0; i < requests.size(); ++i) {
      seqs_[i] = {&requests[i], 0, requests[i].prompt_len, 0, 0, -1, -1, requests[i].prompt};
      if (o.prefix_caching) seqs_[i].hashes = block_hashes(content_keys(requests[i]), o.kv_block);
    }
  }
  ReplicaResult run(int replica);
  void check_fits() const;
  bool finished() const { return done_ == seqs_.size(); }
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
  std::vector<Seq> seqs_;      // by request index, the KV cache's sequence id
  std::deque<int> waiting_;    // arrived, not running (preempted ones in front)
  std::vector<int> running_;   // in admission order
  size_t next_ = 0;            // the next request to arrive
  double now_ = 0;
  size_t done_ = 0;            // requests finished
  int offset_, stride_;
  ReplicaResult out_;
};

void Replica::check_fits() const {
  for (const Seq& q : seqs_) {
    const Request& r = *q.r;
    SHARDLAB_CHECK(r.prompt.empty() || r.prompt.size() == size_t(r.prompt_len),
                   fmt::format("request {}: {} prompt ids for a prompt of {}", r.id, r.prompt.size(), r.prompt_len));
    if (kv_.blocks_for(q.final_tokens()) > kv_.total_blocks())
      throw ConfigError(fmt::format(
          "request {} needs {} tokens of KV cache (prompt {} + output {} - 1), the replica holds {} "
          "({} blocks of {}): raise the memory or `kv_fraction`, or shorten the requests",
          r.id, q.final_tokens(), r.prompt_len, r.output_len, kv_.total_blocks() * o_.kv_block,
          kv_.total_blocks(), o_.kv_block));
    if (o_.chunked_prefill == 0 && r.prompt_len > o_.max_batch_tokens)
      throw ConfigError(fmt::format(
          "request {}: prompt of {} tokens exceeds `max_batch_tokens` {} (use `chunked_prefill`)",
          r.id, r.prompt_len, o_.max_batch_tokens));
  }
}

void Replica::arrive() {
  if (running_.empty() && waiting_.empty() && next_ < seqs_.size())
    now_ = std::max(now_, seqs_[next_].r->arrival_s);  // idle until the next arrival
  for (; next_ < seqs_.size() && seqs_[next_].r->arrival_s <= now_; ++next_)
    waiting_.push_back(static_cast<int>(next_));
}

void Replica::preempt(int s) {
  Seq& q = seqs_[size_t(s)];
  kv_.release(s);
  ex_.release(global(s));
  running_.erase(std::find(running_.begin(), running_.end(), s));
  q.cached = 0;
  q.target = q.r->prompt_len + q.generated;  // recomputed: the prompt and what it produced
  ++q.preemptions;
  ++out_.preemptions;
  waiting_.push_front(s);
}

// The blocks of q's prompt found in the prefix cache; at least one token is
// left to compute (the last one's logits give the next token).
int64_t Replica::cached_blocks(const Seq& q) const {
  if (!o_.prefix_caching) return 0;
  const auto most = std::min<size_t>(q.hashes.size(), size_t((q.target - 1) / o_.kv_block));
  return kv_.cached_prefix(std::span(q.hashes).first(most));
}

// Admits s with the first `hit` blocks shared and room for `tokens`.
bool Replica::reserve(int s, int64_t hit, int64_t tokens) {
  Seq& q = seqs_[size_t(s)];
  if (!(hit > 0 ? kv_.grow_shared(s, q.hashes, hit, tokens) : kv_.grow(s, tokens))) return false;
  q.named = hit;
  q.cached = hit * o_.kv_block;
  if (q.cached_tokens < 0) q.cached_tokens = int(q.cached);
  if (o_.prefix_caching) {
    out_.prefix_query_tokens += q.target;
    out_.prefix_hit_tokens += q.cached;
  }
  return true;
}

// Names s's prompt blocks its steps have filled, and hands them to the executor.
void Replica::name_blocks(int s) {
  Seq& q = seqs_[size_t(s)];
  const int64_t full = std::min<int64_t>(q.cached / o_.kv_block, int64_t(q.hashes.size()));
  for (; q.named < full; ++q.named)
    if (kv_.name(s, q.named, q.hashes[size_t(q.named)]))
      ex_.cache_block(global(s), q.named * o_.kv_block, o_.kv_block, global(kv_.table(s)[size_t(q.named)]));
}

// First come first served: the head of the queue waits for room rather than
// letting later requests pass it. `reserve_all`: the whole request's KV at
// once (static); otherwise the prefill's, then a block at a time.
void Replica::admit(std::vector<BatchEntry>& batch, int64_t& tokens, bool reserve_all) {
  int64_t prefill_budget = o_.chunked_prefill > 0 ? o_.chunked_prefill : std::numeric_limits<int64_t>::max();
  for (const BatchEntry& e : batch)
    if (!seqs_[size_t(local(e.seq))].prefilled()) prefill_budget -= e.new_tokens;
  while (!waiting_.empty() && static_cast<int>(running_.size()) < o_.max_seqs) {
    const int s = waiting_.front();
    Seq& q = seqs_[size_t(s)];
    const int64_t hit = cached_blocks(q);
    const int64_t need = q.target - hit * o_.kv_block;
    const int64_t room = std::min(prefill_budget, o_.max_batch_tokens - tokens);
    // A whole prefill longer than the budget (a recomputation) runs alone.
    const bool alone = o_.chunked_prefill == 0 && batch.empty() && running_.empty();
    const int64_t chunk = o_.chunked_prefill > 0 ? std::min(need, room) : (need <= room || alone ? need : 0);
    if (chunk <= 0) break;
    if (!reserve(s, hit, reserve_all ? q.final_tokens() : q.target)) break;
    waiting_.pop_front();
    running_.push_back(s);
    batch.push_back(entry(s, chunk));
    const std::vector<int32_t>& table = kv_.table(s);
    for (int64_t b = 0; b < hit; ++b) batch.back().prefix_blocks.push_back(global(table[size_t(b)]));
    tokens += chunk;
    prefill_budget -= chunk;
  }
}

std::vector<BatchEntry> Replica::continuous_batch() {
  std::vector<BatchEntry> batch;
  int64_t tokens = 0;
  // Every running sequence's next token; a full cache preempts the latest
  // admitted sequence (possibly this one) until its block is found.
  for (size_t i = 0; i < running_.size(); ++i) {
    const int s = running_[i];
    Seq& q = seqs_[size_t(s)];
    if (!q.prefilled()) continue;
    const int drafts = std::min(o_.speculative, q.r->output_len - q.generated - 1);  // to verify with its token
    bool preempted = false;
    while (!preempted && !kv_.grow(s, q.cached + 1 + drafts)) {
      const int victim = running_.back();
      preempt(victim);
      preempted = victim == s;
    }
    if (preempted) break;  // s was the last one running
    batch.push_back(entry(s, 1));
    batch.back().new_tokens += drafts;
    batch.back().draft = drafts;
    tokens += 1 + drafts;
  }
  // Chunked prefills under way, then new ones.
  int64_t budget = o_.chunked_prefill > 0 ? o_.chunked_prefill : std::numeric_limits<int64_t>::max();
  for (const int s : running_) {
    Seq& q = seqs_[size_t(s)];
    const int64_t chunk = std::min({q.target - q.cached, budget, o_.max_batch_tokens - tokens});
    if (q.prefilled() || chunk <= 0) continue;
    batch.push_back(entry(s, chunk));
    tokens += chunk;
    budget -= chunk;
  }
  admit(batch, tokens, false);
  return batch;
}

std::vector<BatchEntry> Replica::static_batch() {
  std::vector<BatchEntry> batch;
  int64_t tokens = 0;
  if (running_.empty()) {
    admit(batch, tokens, true);
    return batch;
  }
  for (const int s : running_) batch.push_back(entry(s, 1));
  return batch;
}

// The next n tokens of sequence s: a decode's or a prefill's (or a chunk of
// it); it produces a token when it reaches the end of what must be cached.
BatchEntry Replica::entry(int s, int64_t n) const {
  const Seq& q = seqs_[size_t(s)];
  BatchEntry e{global(s), static_cast<int>(n), q.cached, q.cached + n >= q.target, {}, q.r->id, q.generated};
  if (!q.ids.empty()) e.tokens.assign(q.ids.begin() + q.cached, q.ids.begin() + q.cached + n);
  return e;
}

// `step`: the executor's tokens, `counts` of each sampling entry (or none).
void Replica::book(const std::vector<BatchEntry>& batch, const StepOutcome& step) {
  size_t next = 0, k = 0;
  for (const BatchEntry& e : batch) {
    const int s = local(e.seq);
    Seq& q = seqs_[size_t(s)];
    const int count = e.samples && !step.counts.empty() ? step.counts[k++] : 1;
    SHARDLAB_CHECK(count >= 1 && count <= e.draft + 1, "the executor produced more tokens than it verified");
    q.cached += e.draft > 0 ? count : e.new_tokens;  // the last token and the accepted drafts
    out_.drafts_proposed += e.draft;
    out_.drafts_accepted += e.draft > 0 ? count - 1 : 0;
    if (o_.prefix_caching) name_blocks(s);
    if (!e.samples) continue;  // a chunk short of the prompt's end
    if (!step.tokens.empty()) q.ids.insert(q.ids.end(), step.tokens.begin() + next, step.tokens.begin() + next + count);
    next += size_t(count);
    q.generated += count;
    if (q.first_token_s < 0) q.first_token_s = now_;
    if (q.generated == q.r->output_len) {
      q.finish_s = now_;
      kv_.release(s);
      ex_.release(e.seq);
      running_.erase(std::find(running_.begin(), running_.end(), s));
      ++done_;
    }
  }
}

void Replica::step(int replica) {
  arrive();
  std::vector<BatchEntry> batch = o_.batching == Batching::kStatic ? static_batch() : continuous_batch();
  SHARDLAB_CHECK(!batch.empty(), "serving scheduler formed an empty step");
  for (const int32_t b : kv_.take_evicted()) ex_.evict_block(global(b));
  ex_.begin_step(replica, now_);
  const StepOutcome step = ex_.run_step(batch);
  const double dt = step.seconds;
  SHARDLAB_CHECK(std::isfinite(dt) && dt > 0, "a step must take a positive, finite time");
  const auto sampling = std::count_if(batch.begin(), batch.end(), [](const BatchEntry& e) { return e.samples; });
  SHARDLAB_CHECK(step.counts.empty() || int64_t(step.counts.size()) == sampling,
                 "the executor must count the tokens of every sampling entry, or none");
  const int64_t produced = step.counts.empty() ? sampling : std::accumulate(step.counts.begin(), step.counts.end(), 0);
  SHARDLAB_CHECK(step.tokens.empty() || int64_t(step.tokens.size()) == produced,
                 "the executor must return every token it produced, or none");
  now_ += dt;
  int batch_tokens = 0;
  for (const BatchEntry& e : batch) batch_tokens += e.new_tokens;
  out_.usage.push_back({now_, dt, kv_.used_blocks(), int(running_.size()), int(waiting_.size()), batch_tokens});
  book(batch, step);
  ++out_.steps;
}

ReplicaResult Replica::result(int replica) {
  for (const Seq& q : seqs_) {
    const auto produced = q.ids.size() > size_t(q.r->prompt_len) ? q.ids.begin() + q.r->prompt_len : q.ids.end();
    out_.requests.push_back({q.r->id, replica, q.r->arrival_s, q.first_token_s, q.finish_s, q.r->prompt_len,
                             q.r->output_len, q.preemptions, std::max(q.cached_tokens, 0), {produced, q.ids.end()}});
  }
  return std::move(out_);
}

ReplicaResult Replica::run(int replica) {
  check_fits();
  while (!finished()) step(replica);
  return result(replica);
}

// V virtual engines share the replica's devices: requests go round-robin
// in arrival order, each engine has 1/V of the KV blocks, and the engine
// whose next step is ready first runs it (ties: the lowest), so the device
// threads take the steps in virtual-time order of their start.
ReplicaResult run_virtual_engines(const std::vector<Request>& requests, const SchedulerOptions& o,
                                  StepExecutor& executor, int replica) {
  const int V = o.virtual_engines;
  std::vector<std::vector<Request>> share{size_t(V)};
  for (size_t i = 0; i < requests.size(); ++i) share[i % size_t(V)].push_back(requests[i]);
  SchedulerOptions each = o;
  each.kv_blocks = o.kv_blocks / V;
  std::vector<std::unique_ptr<Replica>> engines;
  for (int v = 0; v < V; ++v) {
    engines.push_back(std::make_unique<Replica>(share[size_t(v)], each, executor, v, V));
    engines.back()->check_fits();
  }
  ReplicaResult out;
  for (;;) {
    Replica* next = nullptr;
    for (const auto& e : engines)
      if (!e->finished() && (!next || e->ready() < next->ready())) next = e.get();
    if (!next) break;
    next->step(replica);
    UsageSample u = next->usage_back();  // the replica's: every engine's blocks and sequences
    u.used_blocks = u.running = u.waiting = 0;
    for (const auto& e : engines) {
      u.used_blocks += e->kv().used_blocks();
      u.running += e->running();
      u.waiting += e->queued();
    }
    out.usage.push_back(u);
  }
  for (auto& e : engines) {
    const ReplicaResult r = e->result(replica);
    out.requests.insert(out.requests.end(), r.requests.begin(), r.requests.end());
    out.steps += r.steps;
    out.preemptions += r.preemptions;
    out.prefix_query_tokens += r.prefix_query_tokens;
    out.prefix_hit_tokens += r.prefix_hit_tokens;
    out.drafts_proposed += r.drafts_proposed;
    out.drafts_accepted += r.drafts_accepted;
  }
  std::sort(out.requests.begin(), out.requests.end(), [](const auto& a, const auto& b) { return a.id < b.id; });
  return out;
}

}  // namespace

ReplicaResult simulate_replica(const std::vector<Request>& requests, const SchedulerOptions& o,
                               StepExecutor& executor, int replica) {
  SHARDLAB_CHECK(o.max_seqs > 0 && o.max_batch_tokens > 0 && o.chunked_prefill >= 0,
                 "scheduler limits must be positive");
  if (o.batching == Batching::kStatic && o.chunked_prefill > 0)
    throw ConfigError("`chunked_prefill` needs `batching` continuous");
  if (o.batching == Batching::kStatic && o.prefix_caching)
    throw ConfigError("`prefix_caching` needs `batching` continuous");
  if (o.batching == Batching::kStatic && o.speculative > 0)
    throw ConfigError("`speculative` needs `batching` continuous");
  SHARDLAB_CHECK(o.virtual_engines > 0, "a replica needs a virtual engine");
  if (o.virtual_engines == 1) {
    Replica r(requests, o, executor);
    return r.run(replica);
  }
  return run_virtual_engines(requests, o, executor, replica);
}

}  // namespace shardlab::serve
