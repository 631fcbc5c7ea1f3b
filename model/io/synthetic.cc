#include "model/io/synthetic.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "model/io/token_rng.h"
#include "runtime/errors.h"

namespace shardlab::model {
namespace {

constexpr uint64_t kMarkovTableSeed = 0x5eed'4d41'524b'4f56ULL;  // fixed: the table is the task
constexpr int kMarkovBurnIn = 4096;
constexpr uint64_t kCountingRestart = 8;  // restart with probability 1/8
constexpr int kBos = 0, kSep = 1;         // copy / reverse markers
constexpr int kMinSegment = 4, kMaxSegment = 12;
constexpr int kSegmentAlphabet = 16;  // content tokens 2..17: learnable in a minute

double entropy_term(double p) { return p > 0 ? -p * std::log(p) : 0.0; }

std::optional<double> markov_best_loss(int vocab) { return markov_table(vocab).entropy_rate(); }

std::vector<uint16_t> markov_generate(int vocab, int64_t n, uint64_t seed) {
  const MarkovTable table = markov_table(vocab);
  SplitMix64 rng(seed);
  auto step = [&](int s) {
    const size_t row = size_t(s) * MarkovTable::kFanout;
    uint64_t r = rng.uniform(table.total[size_t(s)]);
    int k = 0;
    while (r >= table.weight[row + k]) r -= table.weight[row + k++];
    return table.next[row + k];
  };
  int s = static_cast<int>(rng.uniform(uint64_t(vocab)));
  for (int i = 0; i < kMarkovBurnIn; ++i) s = step(s);  // start near the stationary law
  std::vector<uint16_t> out(static_cast<size_t>(n));
  for (auto& t : out) {
    t = static_cast<uint16_t>(s);
    s = step(s);
  }
  return out;
}

std::optional<double> counting_best_loss(int vocab) {
  // Every row has the same entropy, so the stationary law does not matter.
  double h = entropy_term(counting_prob(vocab, 0, 1));
  h += (vocab - 1) * entropy_term(counting_prob(vocab, 0, 2));
  return h;
}

std::vector<uint16_t> counting_generate(int vocab, int64_t n, uint64_t seed) {
  SplitMix64 rng(seed);
  std::vector<uint16_t> out(static_cast<size_t>(n));
  uint64_t s = rng.uniform(uint64_t(vocab));
  for (auto& t : out) {
    t = static_cast<uint16_t>(s);
    s = rng.uniform(kCountingRestart) == 0 ? rng.uniform(uint64_t(vocab)) : (s + 1) % vocab;
  }
  return out;
}

// BOS c1..ck SEP then the k tokens again, forward or reversed.
std::vector<uint16_t> segments_generate(int vocab, int64_t n, uint64_t seed, bool reversed) {
  SplitMix64 rng(seed);
  std::vector<uint16_t> out;
  out.reserve(static_cast<size_t>(n) + 2 * kMaxSegment + 2);
  std::vector<uint16_t> seg;
  while (static_cast<int64_t>(out.size()) < n) {
    seg.resize(kMinSegment + rng.uniform(kMaxSegment - kMinSegment + 1));
    const uint64_t alphabet = std::min(vocab - 2, kSegmentAlphabet);
    for (auto& c : seg) c = static_cast<uint16_t>(2 + rng.uniform(alphabet));
    out.push_back(kBos);
    out.insert(out.end(), seg.begin(), seg.end());
    out.push_back(kSep);
    if (reversed) {
      out.insert(out.end(), seg.rbegin(), seg.rend());
    } else {
      out.insert(out.end(), seg.begin(), seg.end());
    }
  }
  out.resize(static_cast<size_t>(n));
  return out;
}

std::optional<double> unknown_loss(int) { return std::nullopt; }
std::vector<uint16_t> copy_generate(int v, int64_t n, uint64_t seed) {
  return segments_generate(v, n, seed, false);
}
std::vector<uint16_t> reverse_generate(int v, int64_t n, uint64_t seed) {
  return segments_generate(v, n, seed, true);
}

}  // namespace

double counting_prob(int vocab, int prev, int next) {
  const double restart = 1.0 / kCountingRestart;
  double p = restart / vocab;
  if (next == (prev + 1) % vocab) p += 1.0 - restart;
  return p;
}

MarkovTable markov_table(int vocab) {
  constexpr int K = MarkovTable::kFanout;
  MarkovTable t;
  t.vocab = vocab;
  t.next.resize(size_t(vocab) * K);
  t.weight.resize(size_t(vocab) * K);
  t.total.assign(size_t(vocab), 0);
  SplitMix64 rng(kMarkovTableSeed ^ uint64_t(vocab));
  // A random cyclic order of all tokens gives every row one successor on the
  // cycle, so the chain is irreducible and pi is unique.
  std::vector<int32_t> order(static_cast<size_t>(vocab));
  for (int i = 0; i < vocab; ++i) order[size_t(i)] = i;
  for (int i = vocab - 1; i > 0; --i)
    std::swap(order[size_t(i)], order[rng.uniform(uint64_t(i) + 1)]);
  std::vector<int32_t> cycle_next(static_cast<size_t>(vocab));
  for (int i = 0; i < vocab; ++i)
    cycle_next[size_t(order[size_t(i)])] = order[size_t((i + 1) % vocab)];
  for (int s = 0; s < vocab; ++s) {
    int32_t* next = &t.next[size_t(s) * K];
    next[0] = cycle_next[size_t(s)];
    for (int k = 1; k < K; ++k) {
      bool fresh;
      do {  // distinct successors; vocab >= min_vocab > K guarantees termination
        next[k] = static_cast<int32_t>(rng.uniform(uint64_t(vocab)));
        fresh = true;
        for (int j = 0; j < k; ++j) fresh = fresh && next[j] != next[k];
      } while (!fresh);
    }
    for (int k = 0; k < K; ++k) {
      t.weight[size_t(s) * K + k] = static_cast<uint32_t>(1 + rng.uniform(8));
      t.total[size_t(s)] += t.weight[size_t(s) * K + k];
    }
  }
  return t;
}

std::vector<double> MarkovTable::stationary() const {
  // Power iteration on the lazy chain (P + I) / 2: same pi, always aperiodic.
  std::vector<double> pi(static_cast<size_t>(vocab), 1.0 / vocab);
  std::vector<double> nxt(pi.size());
  for (int iter = 0; iter < 100000; ++iter) {
    for (int s = 0; s < vocab; ++s) nxt[size_t(s)] = 0.5 * pi[size_t(s)];
    for (int s = 0; s < vocab; ++s)
      for (int k = 0; k < kFanout; ++k)
        nxt[size_t(next[size_t(s) * kFanout + k])] += 0.5 * pi[size_t(s)] * prob(s, k);
    double change = 0;
    for (int s = 0; s < vocab; ++s) change += std::abs(nxt[size_t(s)] - pi[size_t(s)]);
    pi.swap(nxt);
    if (change < 1e-15) break;
  }
  return pi;
}

double MarkovTable::entropy_rate() const {
  const std::vector<double> pi = stationary();
  double h = 0;
  for (int s = 0; s < vocab; ++s) {
    double row = 0;
    for (int k = 0; k < kFanout; ++k) row += entropy_term(prob(s, k));
    h += pi[size_t(s)] * row;
  }
  return h;
}

const std::vector<SyntheticTask>& synthetic_tasks() {
  static const std::vector<SyntheticTask> tasks = {
      {"markov", "order-1 Markov chain, 4 weighted successors per token (best loss known)", 8,
       markov_best_loss, markov_generate},
      {"counting", "runs t, t+1, t+2, ... restarting at a random token w.p. 1/8 (best loss known)",
       8, counting_best_loss, counting_generate},
      {"copy", "BOS, 4-12 tokens of a 16-token alphabet, SEP, the same tokens again", 8,
       unknown_loss, copy_generate},
      {"reverse", "BOS, 4-12 tokens of a 16-token alphabet, SEP, the same tokens reversed", 8,
       unknown_loss, reverse_generate},
  };
  return tasks;
}

std::string synthetic_task_list() {
  std::string out;
  for (const SyntheticTask& t : synthetic_tasks())
    out += fmt::format("{}synthetic:{}", out.empty() ? "" : ", ", t.name);
  return out;
}

const SyntheticTask& find_synthetic_task(const std::string& name) {
  for (const SyntheticTask& t : synthetic_tasks())
    if (name == t.name) return t;
  throw ConfigError(fmt::format("`data`: unknown synthetic task \"{}\" (known: {})", name,
                                synthetic_task_list()));
}

}  // namespace shardlab::model
