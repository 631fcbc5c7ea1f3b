#include "model/serve/scheduler.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>

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
  bool prefilled() const { return cached >= target; }
  int64_t final_tokens() const { return r->prompt_len + r->output_len - 1; }
};

class Replica {
 public:
  Replica(const std::vector<Request>& requests, const SchedulerOptions& o, StepExecutor& ex)
      : o_(o), ex_(ex), kv_(o.kv_blocks, o.kv_block) {
    seqs_.resize(requests.size());
    for (size_t i = 0; i < requests.size(); ++i)
      seqs_[i] = {&requests[i], 0, requests[i].prompt_len, 0, 0, -1, -1, requests[i].prompt};
  }
  ReplicaResult run(int replica);

 private:
  void check_fits() const;
  void arrive();
  std::vector<BatchEntry> continuous_batch();
  std::vector<BatchEntry> static_batch();
  void admit(std::vector<BatchEntry>& batch, int64_t& tokens, bool reserve_all);
  void preempt(int s);
  BatchEntry entry(int s, int64_t n) const;
  void book(const std::vector<BatchEntry>& batch, const std::vector<model::Token>& tokens);

  const SchedulerOptions& o_;
  StepExecutor& ex_;
  KvBlocks kv_;
  std::vector<Seq> seqs_;      // by request index, the KV cache's sequence id
  std::deque<int> waiting_;    // arrived, not running (preempted ones in front)
  std::vector<int> running_;   // in admission order
  size_t next_ = 0;            // the next request to arrive
  double now_ = 0;
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
  ex_.release(s);
  running_.erase(std::find(running_.begin(), running_.end(), s));
  q.cached = 0;
  q.target = q.r->prompt_len + q.generated;  // recomputed: the prompt and what it produced
  ++q.preemptions;
  ++out_.preemptions;
  waiting_.push_front(s);
}

// First come first served: the head of the queue waits for room rather than
// letting later requests pass it. `reserve_all`: the whole request's KV at
// once (static); otherwise the prefill's, then a block at a time.
void Replica::admit(std::vector<BatchEntry>& batch, int64_t& tokens, bool reserve_all) {
  int64_t prefill_budget = o_.chunked_prefill > 0 ? o_.chunked_prefill : std::numeric_limits<int64_t>::max();
  for (const BatchEntry& e : batch)
    if (!seqs_[size_t(e.seq)].prefilled()) prefill_budget -= e.new_tokens;
  while (!waiting_.empty() && static_cast<int>(running_.size()) < o_.max_seqs) {
    const int s = waiting_.front();
    Seq& q = seqs_[size_t(s)];
    const int64_t need = q.target - q.cached;
    const int64_t room = std::min(prefill_budget, o_.max_batch_tokens - tokens);
    // A whole prefill longer than the budget (a recomputation) runs alone.
    const bool alone = o_.chunked_prefill == 0 && batch.empty() && running_.empty();
    const int64_t chunk = o_.chunked_prefill > 0 ? std::min(need, room) : (need <= room || alone ? need : 0);
    if (chunk <= 0) break;
    if (!kv_.grow(s, reserve_all ? q.final_tokens() : q.target)) break;
    waiting_.pop_front();
    running_.push_back(s);
    batch.push_back(entry(s, chunk));
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
    bool preempted = false;
    while (!preempted && !kv_.grow(s, q.cached + 1)) {
      const int victim = running_.back();
      preempt(victim);
      preempted = victim == s;
    }
    if (preempted) break;  // s was the last one running
    batch.push_back(entry(s, 1));
    ++tokens;
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
  BatchEntry e{s, static_cast<int>(n), q.cached, q.cached + n >= q.target, {}, q.r->id, q.generated};
  if (!q.ids.empty()) e.tokens.assign(q.ids.begin() + q.cached, q.ids.begin() + q.cached + n);
  return e;
}

// `tokens`: the executor's, one per sampling entry (or none).
void Replica::book(const std::vector<BatchEntry>& batch, const std::vector<model::Token>& tokens) {
  size_t next = 0;
  for (const BatchEntry& e : batch) {
    Seq& q = seqs_[size_t(e.seq)];
    q.cached += e.new_tokens;
    if (!e.samples) continue;  // a chunk short of the prompt's end
    if (!tokens.empty()) q.ids.push_back(tokens[next++]);
    ++q.generated;
    if (q.first_token_s < 0) q.first_token_s = now_;
    if (q.generated == q.r->output_len) {
      q.finish_s = now_;
      kv_.release(e.seq);
      ex_.release(e.seq);
      running_.erase(std::find(running_.begin(), running_.end(), e.seq));
    }
  }
}

ReplicaResult Replica::run(int replica) {
  check_fits();
  size_t done = 0;
  while (done < seqs_.size()) {
    arrive();
    std::vector<BatchEntry> batch =
        o_.batching == Batching::kStatic ? static_batch() : continuous_batch();
    SHARDLAB_CHECK(!batch.empty(), "serving scheduler formed an empty step");
    ex_.begin_step(replica, now_);
    const StepOutcome step = ex_.run_step(batch);
    const double dt = step.seconds;
    SHARDLAB_CHECK(std::isfinite(dt) && dt > 0, "a step must take a positive, finite time");
    const auto sampling = std::count_if(batch.begin(), batch.end(), [](const BatchEntry& e) { return e.samples; });
    SHARDLAB_CHECK(step.tokens.empty() || int64_t(step.tokens.size()) == sampling,
                   "the executor must return one token per sampling entry, or none");
    now_ += dt;
    int batch_tokens = 0;
    for (const BatchEntry& e : batch) batch_tokens += e.new_tokens;
    out_.usage.push_back({now_, dt, kv_.used_blocks(), int(running_.size()), int(waiting_.size()), batch_tokens});
    const size_t before = running_.size() + waiting_.size();
    book(batch, step.tokens);
    done += before - running_.size() - waiting_.size();
    ++out_.steps;
  }
  for (const Seq& q : seqs_) {
    const auto produced = q.ids.size() > size_t(q.r->prompt_len) ? q.ids.begin() + q.r->prompt_len : q.ids.end();
    out_.requests.push_back({q.r->id, replica, q.r->arrival_s, q.first_token_s, q.finish_s, q.r->prompt_len,
                             q.r->output_len, q.preemptions, {produced, q.ids.end()}});
  }
  return std::move(out_);
}

}  // namespace

ReplicaResult simulate_replica(const std::vector<Request>& requests, const SchedulerOptions& o,
                               StepExecutor& executor, int replica) {
  SHARDLAB_CHECK(o.max_seqs > 0 && o.max_batch_tokens > 0 && o.chunked_prefill >= 0,
                 "scheduler limits must be positive");
  if (o.batching == Batching::kStatic && o.chunked_prefill > 0)
    throw ConfigError("`chunked_prefill` needs `batching` continuous");
  Replica r(requests, o, executor);
  return r.run(replica);
}

}  // namespace shardlab::serve
