// Speculative decoding in a serving replica (Leviathan et al. 2023, Chen et
// al. 2023; vLLM's draft-model speculation): a small draft model on the same
// devices proposes k tokens one decode at a time, and the target scores the
// last token and the k proposals in one step (their k + 1 rows of logits).
// Greedy verification keeps the longest run of proposals equal to the
// target's own greedy tokens and adds the target's token after it (its
// correction, or a bonus when all k were right): 1 to k + 1 tokens a step,
// exactly the tokens greedy decoding without a draft gives. Sampled
// verification (Leviathan et al. 2023, Algorithm 1) draws the proposals
// from the draft's distribution q and keeps proposal x while u < p(x)/q(x)
// (p the target's, after the same temperature, top-k and top-p); the first
// rejected one is replaced by a draw from max(0, p - q) normalised, and
// when all are kept a last token is drawn from p: the tokens follow the
// target's distribution, not a non-speculative run's draws. A phantom run
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
#include <utility>
#include <string>
#include <unordered_map>
#include <vector>

#include "model/config.h"
#include "model/infer/infer_device.h"
#include "model/infer/infer_plan.h"
#include "model/infer/sampler.h"
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

// The token a uniform v in [0, 1) picks from distribution p (inverse CDF,
// in id order).
model::Token pick(std::span<const double> p, double v);
// Sampled verification at one position: the draft's token x (drawn from q)
// is kept when u < p(x) / q(x); otherwise the token is pick(max(0, p - q)
// normalised, v). Returns the token and whether x was kept.
std::pair<model::Token, bool> verify_sampled(std::span<const double> p, std::span<const double> q, model::Token x,
                                             double u, double v);

// A phantom run's accepted proposals of `drafts`: leading successes of
// draws at probability `rate` (stream seed + request, draw `draw`).
int accept_at_rate(double rate, int drafts, uint64_t seed, int request, int draw);

// The draft model's part on one device.
class Speculator {
 public:
  // `plan`: the draft's split; `sampling`: the target's (request i draws
  // from seed + i).
  Speculator(Device& dev, const infer::InferPlan& plan, const SpeculativeShape& s, bool values,
             const infer::SamplingOptions& sampling);

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

  // Entry `e`'s draw of stream `name` at position j of its step.
  double uniform(const BatchEntry& e, const char* name, int j) const;
  model::Token verify_at(const model::GPTConfig& target, const infer::StepOutput& o, size_t row, const BatchEntry& e,
                         int j, std::span<const model::Token> proposed, const std::vector<std::vector<double>>& q,
                         bool& kept);

  const SpeculativeShape& s_;
  infer::SamplingOptions sampling_;
  infer::Sampler sampler_;
  infer::InferDevice d_;
  std::vector<std::vector<std::vector<double>>> q_;  // sampled: per entry, each proposal's draft distribution
  std::vector<double> p_;                            // scratch: a target distribution
  std::unordered_map<int, int> ids_;                       // scheduler sequence -> draft cache id
  std::unordered_map<int, std::vector<model::Token>> owed_;  // accepted tokens the draft has not read
};

}  // namespace shardlab::serve
