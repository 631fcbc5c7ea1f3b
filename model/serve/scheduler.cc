#include "model/serve/scheduler.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <memory>
#include <numeric>

#include <fmt/format.h>

#include "model/serve/engine_scheduler.h"
#include "runtime/errors.h"

namespace shardlab::serve {

Batching parse_batching(const std::string& text) {
  if (text == "static") return Batching::kStatic;
  if (text == "continuous") return Batching::kContinuous;
  throw ConfigError(fmt::format("`batching` {}: expected static or continuous", text));
}

RunCounts& RunCounts::operator+=(const RunCounts& o) {
  steps += o.steps;
  preemptions += o.preemptions;
  prefix_query_tokens += o.prefix_query_tokens;
  prefix_hit_tokens += o.prefix_hit_tokens;
  drafts_proposed += o.drafts_proposed;
  drafts_accepted += o.drafts_accepted;
  return *this;
}

namespace detail {

void check_fits(const Request& r, const SchedulerOptions& o) {
  SHARDLAB_CHECK(r.prompt.empty() || r.prompt.size() == size_t(r.prompt_len),
                 fmt::format("request {}: {} prompt ids for a prompt of {}", r.id, r.prompt.size(), r.prompt_len));
  const int64_t tokens = int64_t{r.prompt_len} + r.output_len - 1;
  if ((tokens + o.kv_block - 1) / o.kv_block > o.kv_blocks)
    throw ConfigError(fmt::format(
        "request {} needs {} tokens of KV cache (prompt {} + output {} - 1), the replica holds {} "
        "({} blocks of {}): raise the memory or `kv_fraction`, or shorten the requests",
        r.id, tokens, r.prompt_len, r.output_len, o.kv_blocks * o.kv_block, o.kv_blocks, o.kv_block));
  if (o.chunked_prefill == 0 && r.prompt_len > o.max_batch_tokens)
    throw ConfigError(fmt::format(
        "request {}: prompt of {} tokens exceeds `max_batch_tokens` {} (use `chunked_prefill`)",
        r.id, r.prompt_len, o.max_batch_tokens));
}

void EngineScheduler::arrive() {
  if (running_.empty() && waiting_.empty() && next_ < seqs_.size())
    now_ = std::max(now_, seqs_[next_].r->arrival_s);  // idle until the next arrival
  for (; next_ < seqs_.size() && seqs_[next_].r->arrival_s <= now_; ++next_)
    waiting_.push_back(static_cast<int>(next_));
}

void EngineScheduler::preempt(int s) {
  Seq& q = seqs_[size_t(s)];
  kv_.release(s);
  ex_.release(global(s));
  running_.erase(std::find(running_.begin(), running_.end(), s));
  q.cached = 0;
  q.target = q.r->prompt_len + q.generated;  // recomputed: the prompt and what it produced
  q.handed = false;
  ++q.preemptions;
  ++out_.preemptions;
  waiting_.push_front(s);
}

// The blocks of q's prompt found in the prefix cache; at least one token is
// left to compute (the last one's logits give the next token).
int64_t EngineScheduler::cached_blocks(const Seq& q) const {
  if (!o_.prefix_caching) return 0;
  const auto most = std::min<size_t>(q.hashes.size(), size_t((q.target - 1) / o_.kv_block));
  return kv_.cached_prefix(std::span(q.hashes).first(most));
}

// Admits s with the first `hit` blocks shared and room for `tokens`.
bool EngineScheduler::reserve(int s, int64_t hit, int64_t tokens) {
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
void EngineScheduler::name_blocks(int s) {
  Seq& q = seqs_[size_t(s)];
  // Past the prompt's full blocks, those its produced tokens fill are named
  // too (vLLM caches them): a recomputation, or a later prompt that repeats
  // the conversation, shares them. Not without their ids (shapes only).
  const int B = o_.kv_block;
  for (int64_t first = int64_t(q.hashes.size()) * B; first + B <= q.cached; first += B) {
    if (!q.r->prompt.empty() && int64_t(q.ids.size()) < first + B) break;
    keys_.resize(size_t(B));
    for (int t = 0; t < B; ++t) keys_[size_t(t)] = content_key(*q.r, q.ids, first + t);
    q.hashes.push_back(chain_hash(q.hashes.empty() ? 0 : q.hashes.back(), keys_));
  }
  const int64_t full = std::min<int64_t>(q.cached / o_.kv_block, int64_t(q.hashes.size()));
  for (; q.named < full; ++q.named)
    if (kv_.name(s, q.named, q.hashes[size_t(q.named)]))
      ex_.cache_block(global(s), q.named * o_.kv_block, o_.kv_block, global(kv_.table(s)[size_t(q.named)]));
}

// First come first served: the head of the queue waits for room rather than
// letting later requests pass it. `reserve_all`: the whole request's KV at
// once (static); otherwise the prefill's, then a block at a time.
void EngineScheduler::admit(std::vector<BatchEntry>& batch, int64_t& tokens, bool reserve_all) {
  int64_t prefill_budget = o_.chunked_prefill > 0 ? o_.chunked_prefill : std::numeric_limits<int64_t>::max();
  for (const BatchEntry& e : batch)
    if (!seqs_[size_t(local(e.seq))].prefilled()) prefill_budget -= e.new_tokens;
  while (!waiting_.empty() && static_cast<int>(running_.size()) < o_.max_seqs) {
    const int s = waiting_.front();
    Seq& q = seqs_[size_t(s)];
    if (q.handed) {  // its prompt's blocks filled by the transfer; its first decode in this step
      if (tokens >= o_.max_batch_tokens || !reserve(s, 0, q.target + 1)) break;
      q.cached = q.target;
      q.handed = false;
      waiting_.pop_front();
      running_.push_back(s);
      batch.push_back(entry(s, 1));
      batch.back().handed = true;
      tokens += 1;
      continue;
    }
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

std::vector<BatchEntry> EngineScheduler::continuous_batch() {
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

std::vector<BatchEntry> EngineScheduler::static_batch() {
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
BatchEntry EngineScheduler::entry(int s, int64_t n) const {
  const Seq& q = seqs_[size_t(s)];
  BatchEntry e{global(s), static_cast<int>(n), q.cached, q.cached + n >= q.target, {}, q.r->id, q.generated};
  if (!q.ids.empty()) e.tokens.assign(q.ids.begin() + q.cached, q.ids.begin() + q.cached + n);
  return e;
}

// `step`: the executor's tokens, `counts` of each sampling entry (or none).
void EngineScheduler::book(const std::vector<BatchEntry>& batch, const StepOutcome& step) {
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
      if (q.r->hand_off) ex_.hand_off(e.seq, q.r->id);
      kv_.release(s);
      ex_.release(e.seq);
      running_.erase(std::find(running_.begin(), running_.end(), s));
      ++done_;
    }
  }
}

void EngineScheduler::step(int replica) {
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

ReplicaResult EngineScheduler::result(int replica) {
  for (const Seq& q : seqs_) {
    const auto produced = q.ids.size() > size_t(q.r->prompt_len) ? q.ids.begin() + q.r->prompt_len : q.ids.end();
    out_.requests.push_back({q.r->id, replica, q.r->arrival_s, q.first_token_s, q.finish_s, q.r->prompt_len,
                             q.r->output_len, q.preemptions, std::max(q.cached_tokens, 0), {produced, q.ids.end()}});
  }
  return std::move(out_);
}

}  // namespace detail
}  // namespace shardlab::serve
