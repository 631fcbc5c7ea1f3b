// One replica's serving loop in virtual time: requests queue as they arrive,
// a scheduler forms each step's batch, the replica runs the step (a
// StepExecutor says how long it takes on the modeled devices), and the
// tokens it produces are booked to their requests.
//
//   static       request-level batching (HF generate, FasterTransformer): an
//                idle replica takes the requests waiting, up to max_seqs and
//                max_batch_tokens of prompt, reserves each one's whole KV
//                (prompt + output), prefills them in one step and decodes
//                until the last one finishes; nothing joins a running batch.
//   continuous   iteration-level batching (Orca, vLLM): every step decodes
//                one token of every running sequence and fills the rest of
//                the token budget with prefills of waiting requests, first
//                come first served, admitted while KV blocks are free. A
//                sequence whose next token finds no free block preempts the
//                latest admitted one, which frees its blocks and is later
//                recomputed (prefill of its prompt and the tokens it had
//                produced), as vLLM's recompute preemption does. With
//                chunked prefill C a step prefills at most C tokens, a long
//                prompt over several steps (Sarathi, vLLM's chunked prefill).
//
// A prefill step produces the request's first token (TTFT ends with it); a
// decode step puts the previous token in the cache and produces the next.
// So a request of prompt P and output O holds P + O - 1 tokens at the end.
// When the requests carry prompt tokens, each step's entries carry their
// ids and the executor's tokens are fed back: a decode's input is the token
// produced before, a recomputation's the prompt and every token produced.
//
// Prefix caching (continuous batching): a request admitted (or readmitted
// after a preemption) whose prompt starts with blocks named in the cache
// (kv_blocks.h) shares them and prefills only the rest; at least its last
// prompt token is computed (it gives the first token's logits), so a hit
// covers at most (P - 1) / block whole blocks, as in vLLM. A prompt's full
// blocks are named when the step that computes them ends, so a request
// admitted in the same step shares nothing with it.
//
// Speculative decoding (k): every decode of a sequence with r tokens left
// to produce proposes min(k, r - 1) draft tokens and verifies them with the
// last token in one target step (new_tokens 1 + that): the executor says
// how many tokens it produced (the accepted drafts and the target's own
// next one), and as many join the cache. The blocks are grown for all
// 1 + k first (vLLM's lookahead slots).
//
// Virtual engines (a pipeline-parallel replica, as vLLM runs one): V
// schedulers share the replica's devices, each with its requests (a request
// goes to the engine with the fewest unfinished when it arrives, as vLLM
// gives it) and 1/V of the KV blocks. The engine ready first
// runs its next step, starting when its own previous step ended (its
// tokens are back), not when the replica's last one did: the devices take
// the steps in that order, so while one batch is in a later stage the next
// runs the earlier ones. One engine per stage keeps every stage busy.
//
// Disaggregated serving (serving.h): a request marked hand_off finishes
// with its prefill (output 1) and its K and V leave for a decode replica
// (StepExecutor::hand_off); one marked handed arrives there with its
// prompt's K and V and first token: it is admitted (first come first
// served, when its prompt's blocks and the next token's are free) with no
// prefill and decodes in the step that admits it. Preempted, it is
// recomputed as any other.
//
// Thread safety: simulate_replica is a pure function of its arguments and
// the executor's answers.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "model/serve/workload.h"

namespace shardlab::serve {

// One sequence's share of a step: `new_tokens` appended to a cache that
// already holds `context` tokens of it (prefill: its prompt, or a chunk of
// it; decode: 1). `samples`: the step ends the sequence's prefill or decodes
// it, so it produces its next token; a chunk short of the prompt's end does
// not. `tokens`: the ids of the new tokens (the prompt's, then the tokens
// produced), when the requests carry prompts; empty otherwise. `request`
// and `draw`: the request's id and how many tokens it has produced before
// this one, which fix a sampled token's draw (seed + request, index draw)
// whatever the batching, preemptions included. `prefix_blocks`: a sequence
// admitted on a cached prefix starts from these blocks (its `context`
// tokens, in order).
struct BatchEntry {
  int seq = 0;
  int new_tokens = 0;
  int64_t context = 0;
  bool samples = true;
  std::vector<model::Token> tokens;
  int request = 0;
  int draw = 0;
  std::vector<int32_t> prefix_blocks;
  int draft = 0;  // speculative decoding: the draft tokens to propose (tokens: the last one only)
  // Disaggregated serving: the sequence's first entry on a decode replica,
  // its `context` tokens' K and V those request `request` was handed with.
  bool handed = false;
};

struct StepOutcome {
  double seconds = 0;  // virtual, of the step on the replica
  // The token of every sampling entry, in batch order; empty when the
  // executor computes no values (shapes only).
  std::vector<model::Token> tokens;
  // Tokens produced by each sampling entry (1 + accepted drafts, for a
  // speculative one), in batch order; empty: one each.
  std::vector<int> counts;
};

class StepExecutor {
 public:
  virtual ~StepExecutor() = default;
  // Runs one forward step over `batch` on the replica.
  virtual StepOutcome run_step(std::span<const BatchEntry> batch) = 0;
  // Called before each run_step: which replica runs it, from when.
  virtual void begin_step(int replica, double now_s) {}
  // `seq` left the replica's cache (finished, or preempted to be recomputed).
  virtual void release(int seq) {}
  // Prefix caching: tokens [first, first + tokens) of `seq` are block
  // `block`, named: keep them for sequences that will share it; a block
  // evicted (its tokens no longer needed). Called in the scheduler's order,
  // before the next run_step.
  virtual void cache_block(int seq, int64_t first, int tokens, int32_t block) {}
  virtual void evict_block(int32_t block) {}
  // Disaggregated serving: `seq` finished its prefill on a prefill replica;
  // its K and V leave with request `request` for a decode replica (before
  // release(seq)).
  virtual void hand_off(int seq, int request) {}
  // The replica runs no more steps (its last operations are to be done).
  virtual void drain() {}
};

enum class Batching { kStatic, kContinuous };
Batching parse_batching(const std::string& text);  // --batching

struct SchedulerOptions {
  Batching batching = Batching::kContinuous;
  int64_t kv_blocks = 0;          // the replica's KV cache, in blocks
  int kv_block = 16;              // tokens per block
  int max_seqs = 256;             // sequences per step (vLLM max_num_seqs)
  int64_t max_batch_tokens = 8192;  // tokens per step (vLLM max_num_batched_tokens)
  int chunked_prefill = 0;        // 0: whole prompts; C: at most C prefill tokens per step
  bool prefix_caching = false;    // share cached prompt blocks (continuous batching)
  // Batches in flight (vLLM's virtual engines, pipeline_parallel_size of
  // them): V schedulers, each over its own requests and 1/V of the blocks.
  int virtual_engines = 1;
  int speculative = 0;  // draft tokens per decode (0: none)
};

struct RequestRecord {
  int id = 0;
  int replica = 0;
  double arrival_s = 0, first_token_s = 0, finish_s = 0;
  int prompt_len = 0, output_len = 0;
  int preemptions = 0;
  int cached_tokens = 0;  // prompt tokens found in the prefix cache at its first admission
  std::vector<model::Token> tokens;  // produced, when the executor computes values
};

// One step of the replica: when it ended, how long it took, the KV blocks in
// use while it ran, the sequences in it and still queued, its tokens.
struct UsageSample {
  double t = 0, step_s = 0;
  int64_t used_blocks = 0;
  int running = 0, waiting = 0;
  int batch_tokens = 0;
};

// What a run counts, summed over a replica's engines and over replicas.
struct RunCounts {
  int64_t steps = 0;
  int64_t preemptions = 0;
  // Prefix caching, over every admission (readmissions too): the tokens
  // admitted sequences had to have cached, and those found in the cache.
  int64_t prefix_query_tokens = 0, prefix_hit_tokens = 0;
  // Speculative decoding: draft tokens verified, and accepted.
  int64_t drafts_proposed = 0, drafts_accepted = 0;
  RunCounts& operator+=(const RunCounts& o);
};

struct ReplicaResult : RunCounts {
  std::vector<RequestRecord> requests;  // in id order
  std::vector<UsageSample> usage;       // one per step
};

// One replica's scheduling, a step at a time, with requests added as they
// arrive (in arrival order): its virtual engines and their KV blocks. A
// serving run over several replicas (serving.h) steps the one ready first
// and routes each request when it arrives.
class ReplicaScheduler {
 public:
  // ConfigError for options that contradict each other.
  ReplicaScheduler(const SchedulerOptions& o, StepExecutor& executor, int replica);
  ~ReplicaScheduler();
  // ConfigError when `r` can never run (more tokens than an engine's cache
  // holds, or a prompt over the step's token budget without chunking).
  void check(const Request& r) const;
  // To the engine with the fewest unfinished requests (ties: the lowest).
  void add(const Request& r);
  bool finished() const;  // every request added has finished
  double ready() const;   // when the next step starts (infinity when finished)
  void step();            // runs the next step
  int unfinished() const;  // added, not finished
  // Prefix caching: the most leading tokens of `r`'s prompt an engine holds cached.
  int64_t cached_prefix_tokens(const Request& r) const;
  ReplicaResult result();  // once finished

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Throws ConfigError when a request can never run (more tokens than the
// cache holds, or a prompt over the step's token budget without chunking).
ReplicaResult simulate_replica(const std::vector<Request>& requests, const SchedulerOptions& o,
                               StepExecutor& executor, int replica = 0);

}  // namespace shardlab::serve
