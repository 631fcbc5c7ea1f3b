// Synthetic token tasks for `--data synthetic:NAME`: generated in memory from
// a seed, no download, small enough structure that a tiny GPT's loss falls
// visibly within a minute.
//
//   markov    order-1 Markov chain over the vocab, 4 successors per token with
//             integer weights; best loss = its entropy rate (exact).
//   counting  runs of consecutive tokens (t, t+1, ... mod V) restarting at a
//             random token with probability 1/8; best loss exact.
//   copy      BOS, k tokens (k in 4..12) from a 16-token alphabet, SEP, the
//             same k tokens again.
//   reverse   the same, with the second half reversed.
//             A tiny run falls from ln V (6.24 for V=512) to about 2.7 (the
//             alphabet's entropy) within 100 steps; the copy itself (floor
//             about 1.3) is much harder: not learned in 2,000 steps of tiny.
//
// "Best loss" is the lowest mean cross-entropy (nats/token) any predictor can
// reach on windows drawn from the stream: for an order-1 chain it is the
// entropy rate sum_s pi(s) H(P(s, .)), since every target has at least its
// predecessor in context. The structure of a task depends only on the vocab;
// the seed picks the sample.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace shardlab::model {

struct SyntheticTask {
  const char* name;         // "markov"; used as --data synthetic:markov
  const char* description;  // one line for --help
  int min_vocab;
  // Best achievable mean cross-entropy in nats, when it is known exactly.
  std::optional<double> (*best_loss)(int vocab);
  // n_tokens tokens, each in [0, vocab), a pure function of (vocab, n_tokens, seed).
  std::vector<uint16_t> (*generate)(int vocab, int64_t n_tokens, uint64_t seed);
};

// The registry, in the order --help lists it.
const std::vector<SyntheticTask>& synthetic_tasks();

// "synthetic:markov, synthetic:counting, ..." for --help and error messages.
std::string synthetic_task_list();

// Throws ConfigError("`data`: unknown synthetic task ... (known: ...)").
const SyntheticTask& find_synthetic_task(const std::string& name);

// The fixed transition table of `markov` for a vocab: V rows of kFanout
// successors with integer weights. Exposed so tests can check the entropy.
struct MarkovTable {
  static constexpr int kFanout = 4;
  int vocab = 0;
  std::vector<int32_t> next;     // (V, kFanout) successor tokens, distinct per row
  std::vector<uint32_t> weight;  // (V, kFanout) in 1..8
  std::vector<uint32_t> total;   // (V) row sums of weight

  double prob(int from, int k) const {
    return double(weight[size_t(from) * kFanout + k]) / total[size_t(from)];
  }
  std::vector<double> stationary() const;  // pi, by power iteration
  double entropy_rate() const;             // sum_s pi(s) H(row s), nats
};
MarkovTable markov_table(int vocab);

// P(next | prev) of `counting`: prev+1 (mod V) with 7/8 + 1/(8V), any other
// token 1/(8V).
double counting_prob(int vocab, int prev, int next);

}  // namespace shardlab::model
