// Speculative decoding in a serving replica (Leviathan et al. 2023, Chen et
// al. 2023; vLLM's draft-model speculation): a small draft model on the same
// devices proposes k tokens one decode at a time, and the target scores the
// last token and the k proposals in one step (their k + 1 rows of logits).
// Greedy verification keeps the longest run of proposals equal to the
// target's own greedy tokens and adds the target's token after it (its
// correction, or a bonus when all k were right): 1 to k + 1 tokens a step,
// exactly the tokens greedy decoding without a draft gives. A phantom run
// computes no token: each proposal is accepted with the stated probability
// (independent draws of a seeded stream per request), until the first
// rejection.
//
// The draft model runs the replica's split (tp; no pp or ep) and keeps its
// own KV cache beside the target's: it reads every token the target reads
// (prompts included), so after a step it holds the accepted tokens; a
// proposal it never read (the k-th, when all were accepted) it reads first
// in the next step.
//
// Thread safety: one Speculator per device thread.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "model/config.h"
#include "model/infer/infer_device.h"
#include "model/infer/infer_plan.h"
#include "model/io/safetensors.h"
#include "model/serve/scheduler.h"

namespace shardlab::serve {

struct SpeculativeShape {
  model::GPTConfig draft;                              // its vocabulary and context the target's
  const model::SafetensorsFile* draft_init = nullptr;  // checked with infer::check_generate_init; null: seeded
  uint64_t draft_seed = 1337;
  int k = 1;
  double accept = -1;  // a phantom run's acceptance rate in [0, 1]; -1: measured (values)
};

// --speculative draft=PRESET,k=N[,accept=P]: ConfigError naming
// `speculative` for anything else (k in [1, 64], P in [0, 1]).
struct SpeculativeSpec {
  std::string draft;
  int k = 0;
  double accept = -1;  // not given
};
SpeculativeSpec parse_speculative(const std::string& text);

// How many of `drafts` proposals the target's greedy tokens `target` (one
// per proposal and one more) confirm: the length of the common run.
int accept_greedy(std::span<const model::Token> drafts, std::span<const model::Token> target);

// A phantom run's accepted proposals of `drafts`: leading successes of
// draws at probability `rate` (stream seed + request, draw `draw`).
int accept_at_rate(double rate, int drafts, uint64_t seed, int request, int draw);

// The draft model's part on one device.
class Speculator {
 public:
  // `plan`: the draft's split; `seed`: the phantom acceptance draws'.
  Speculator(Device& dev, const infer::InferPlan& plan, const SpeculativeShape& s, bool values, uint64_t seed);

  // Runs the draft over every entry's new tokens (entries with `draft` > 0
  // read only their last token after what they still owe), then proposes
  // each one's `draft` tokens; per entry, its proposals (zeros on shapes).
  std::vector<std::vector<model::Token>> propose(std::span<const BatchEntry> batch);
  // Verification on the target's step `o` (every_logit rows for the
  // entries with drafts, `target_ids` their target cache ids): the tokens
  // of every sampling entry and how many each produced; the target's and the
  // draft's caches keep the accepted tokens. Greedy; on shapes the stated rate.
  struct Verified {
    std::vector<float> tokens;
    std::vector<int> counts;
  };
  Verified verify(infer::InferDevice& target, const infer::StepOutput& o, std::span<const BatchEntry> batch,
                  const std::vector<std::vector<model::Token>>& proposed, std::span<const int> target_ids);
  void release(int seq);
  infer::KvCache& cache() { return d_.engine().cache(); }

 private:
  int id_of(int seq, int max_tokens);
  model::Token greedy(const std::vector<float>& logits, size_t row) const;

  // After verification: `seq` kept `accepted` of its `drafts` proposals.
  void settle(int seq, int drafts, int accepted, const std::vector<model::Token>& proposed);

  const SpeculativeShape& s_;
  uint64_t seed_;  // the acceptance draws' (phantom)
  infer::InferDevice d_;
  std::unordered_map<int, int> ids_;                       // scheduler sequence -> draft cache id
  std::unordered_map<int, std::vector<model::Token>> owed_;  // accepted tokens the draft has not read
};

}  // namespace shardlab::serve
